"""The two-level topology: ranks grouped in nodes of GPUs. Ranks are numbered node by node, as torchrun
numbers them (`rank = node * local_world + local_rank`); the IR states the same numbering symbolically
(`ir.RANK_PARTS`), and a test holds the two together. Within a node a rank reaches its peers' memory
through pointers (NVLink); across nodes only NVSHMEM's puts, gets and signals do.

The topology is fixed at launch: `TILEDSL_NODES=N` declares it (one machine then poses as N nodes, for
tests), else torchrun's LOCAL_WORLD_SIZE gives the ranks per node, else everything is one node."""
from __future__ import annotations

import os
from dataclasses import dataclass

NODES_VARIABLE = "TILEDSL_NODES"


@dataclass(frozen=True)
class Topology:
    nodes: int
    local_world: int  # ranks per node

    def __post_init__(self):
        if self.nodes < 1 or self.local_world < 1:
            raise ValueError(f"a topology needs at least one node of one rank, not {self.nodes} x {self.local_world}")

    @classmethod
    def one_node(cls, world: int) -> "Topology":
        return cls(1, world)

    @classmethod
    def of(cls, world: int, nodes: int) -> "Topology":
        """`world` ranks over `nodes` nodes of equal size."""
        if nodes < 1 or world % nodes:
            raise ValueError(f"{world} ranks do not split into {nodes} nodes of equal size")
        return cls(nodes, world // nodes)

    @property
    def world(self) -> int:
        return self.nodes * self.local_world

    def node(self, rank: int) -> int:
        return rank // self.local_world

    def local_rank(self, rank: int) -> int:
        return rank % self.local_world

    def same_node(self, a: int, b: int) -> bool:
        return self.node(a) == self.node(b)

    def __str__(self) -> str:
        return f"{self.nodes} node{'s' if self.nodes > 1 else ''} x {self.local_world}"


def declared(world: int, environ=None) -> Topology:
    """The topology of this launch: TILEDSL_NODES if set, else torchrun's LOCAL_WORLD_SIZE, else one node."""
    environ = os.environ if environ is None else environ
    text = environ.get(NODES_VARIABLE)
    if text:
        try:
            nodes = int(text)
        except ValueError:
            raise ValueError(f"{NODES_VARIABLE}={text!r} is not a number of nodes") from None
        try:
            return Topology.of(world, nodes)
        except ValueError as why:
            raise ValueError(f"{NODES_VARIABLE}={nodes}: {why}") from None
    local = environ.get("LOCAL_WORLD_SIZE")
    if local and int(local) > 0 and world % int(local) == 0:
        return Topology.of(world, world // int(local))
    return Topology.one_node(world)


def launched(world: int, rank: int, environ=None) -> Topology:
    """`declared`, checked against where torchrun placed this rank (LOCAL_RANK of LOCAL_WORLD_SIZE on its
    machine): tiledsl numbers ranks node by node, and a node whose ranks it reaches through pointers must
    lie within one machine (a pretend node of TILEDSL_NODES too), or a pointer would cross the network."""
    environ = os.environ if environ is None else environ
    topology = declared(world, environ)
    machine = _machine(environ)
    if machine is None:
        return topology
    local_rank, per_machine = machine
    if rank % per_machine != local_rank:
        raise ValueError(f"rank {rank} is local rank {local_rank} of {per_machine} on its machine: tiledsl needs "
                         f"the ranks numbered machine by machine (rank = node * local_world + local_rank), as "
                         f"torchrun numbers them")
    if per_machine % topology.local_world:
        raise ValueError(f"{NODES_VARIABLE}={topology.nodes} makes nodes of {topology.local_world} ranks, but a "
                         f"machine holds {per_machine}: a node tiledsl reaches through pointers must lie within "
                         f"one machine (declare a multiple of {max(1, world // per_machine)} nodes)")
    return topology


def within_one_machine(ranks: list[int], environ=None) -> None:
    """A process group other than the world's is taken for one node: its ranks must share a machine."""
    machine = _machine(os.environ if environ is None else environ)
    if machine is not None and len({r // machine[1] for r in ranks}) > 1:
        raise ValueError(f"a process group of ranks {sorted(ranks)} spans machines of {machine[1]} ranks: a "
                         f"symmetric heap on a group other than the world's reaches its ranks through pointers, "
                         f"within one machine only")


def _machine(environ) -> tuple[int, int] | None:
    """(LOCAL_RANK, LOCAL_WORLD_SIZE) where torchrun set them."""
    local_rank, per_machine = environ.get("LOCAL_RANK"), environ.get("LOCAL_WORLD_SIZE")
    if not local_rank or not per_machine or int(per_machine) < 1:
        return None
    return int(local_rank), int(per_machine)
