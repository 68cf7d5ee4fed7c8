"""What may cross nodes. Within a node a rank reaches its peers' memory through pointers (NVLink);
across nodes nothing does: only NVSHMEM moves data (a put writes another node's copy and signals it,
in one call) and signals. So, on concrete instances at topologies of several nodes:

- a tile, an SM chunk or a copy-engine chunk that loads or stores a copy on another node is refused:
  that load or store does not exist there;
- an NVSHMEM put reads its source on its own node (it writes the target, wherever that is), and a get
  writes its target there (it reads the source, wherever that is);
- a wait on an instance of another node is signalled through NVSHMEM: a put signals with its data,
  a tile, an SM chunk or a get has its notify lowered to an NVSHMEM signal by the plan
  (`meaning.notify_reach`),
  and a copy-engine chunk, whose signals are copies through peer pointers, is refused; so is a
  copy-engine chunk waiting on a tile of another node, whose count of instances done the tile keeps in
  the waiter's memory through a peer pointer (codegen/plan.py, `counts_peers`)."""
from __future__ import annotations

from tiledsl.diagnostics import Note, error
from tiledsl.schedule import ir
from tiledsl.schedule.meaning import Concrete
from tiledsl.schedule.witness import AcrossNodes, SignalAcross
from tiledsl.schedule.wording import at, family_text, on_node, point, sizes_text, where

PUT_HINT = "run it on nvshmem(N): a put writes another node's copy and signals the rank it writes, in one call"
TILE_HINT = ("across nodes only NVSHMEM moves data: put it into a `symm` buffer here with a chunk on nvshmem(N), "
             "wait on that put, and read the local copy; within the node, name peers as "
             "X@(node*local_world + s)")


def findings(concrete: Concrete):
    """Every transport refusal at this concrete topology (none at one node)."""
    if concrete.nodes == 1:
        return
    yield from _direct_accesses(concrete)
    yield from _signals(concrete)


def _direct_accesses(concrete: Concrete):
    schedule, topology = concrete.schedule, concrete.topology
    for access in concrete.accesses:
        instance = concrete.instances[access.instance]
        if access.empty or topology.same_node(instance.rank, access.copy):
            continue  # a region clipped away whole is never loaded or stored (its accesses are masked)
        family = schedule.families[instance.family]
        nvshmem = family.engine.kind is ir.EngineKind.NVSHMEM
        if nvshmem and (family.puts and access.write and access.region == family.writes[0] or
                        not family.puts and not access.write and access.region == family.reads[0]):
            continue  # a put's target, a get's source: NVSHMEM carries them
        verb = "stores into" if access.write else "loads"
        if nvshmem:
            what, hint = f"nvshmem chunk '{family.name}' {verb}", \
                "a put reads its source on its own node, a get writes its target there"
        elif family.kind is ir.Kind.TILE:
            what, hint = f"{family_text(schedule, family.name)} {verb}", TILE_HINT
        else:
            engine = "the copy engine" if family.engine.kind is ir.EngineKind.COPY_ENGINE else "SMs"
            what, hint = f"chunk '{family.name}' on {engine} {verb}", PUT_HINT
        yield ("across", family.name, access.region.span), error(
            f"across nodes: {what} {access.region.tensor} on {on_node(concrete, access.copy)} through a peer "
            f"pointer, at {at(instance)} (node {topology.node(instance.rank)}); pointers reach only the ranks of "
            f"a node (at {sizes_text(concrete)})", access.region.span, hint=hint,
            notes=[Note(f"'{family.name}' is declared here", family.span)],
            witness=AcrossNodes(where(concrete), point(instance), access.region.tensor, access.copy, access.write))


def _signals(concrete: Concrete):
    schedule, topology = concrete.schedule, concrete.topology
    for wait in concrete.waits:
        edge = schedule.edges[wait.edge]
        producer = schedule.families[edge.producer]
        counted = schedule.families[edge.consumer].engine.kind is ir.EngineKind.COPY_ENGINE
        if producer.engine.kind is not ir.EngineKind.COPY_ENGINE and not counted:
            continue  # a put signals with its data; the others' notify is an NVSHMEM signal there (the plan)
        consumer = concrete.instances[wait.consumer]
        for p in wait.producers:
            other = concrete.instances[p]
            if topology.same_node(consumer.rank, other.rank):
                continue
            if producer.engine.kind is not ir.EngineKind.COPY_ENGINE:
                yield ("signal-across", wait.edge), error(
                    f"across nodes: {at(consumer)} (node {topology.node(consumer.rank)}), a copy-engine chunk, "
                    f"waits on {at(other)} (node {topology.node(other.rank)}), whose count of instances done "
                    f"reaches the stream's memory only through peer pointers (at {sizes_text(concrete)})",
                    edge.span, notes=[Note(f"'{edge.consumer}' is declared here",
                                           schedule.families[edge.consumer].span)],
                    hint=f"run '{edge.consumer}' on sms(N) or nvshmem(N), whose waits reach other nodes, or "
                         "wait only on tiles of its own node",
                    witness=SignalAcross(where(concrete), point(consumer), point(other), wait.edge))
                break
            yield ("signal-across", wait.edge), error(
                f"across nodes: {at(consumer)} (node {topology.node(consumer.rank)}) waits on {at(other)} (node "
                f"{topology.node(other.rank)}), a copy-engine chunk, which signals through peer pointers; only "
                f"NVSHMEM signals cross nodes (at {sizes_text(concrete)})", edge.span,
                notes=[Note(f"'{producer.name}' is declared here", producer.span)],
                hint=f"run '{producer.name}' on nvshmem(N), whose put signals the rank it writes to, or wait on "
                     "it only from its own node",
                witness=SignalAcross(where(concrete), point(consumer), point(other), wait.edge))
            break
