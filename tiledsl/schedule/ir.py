"""The schedule graph: families of tiles and chunks over index spaces, the regions each instance
reads and writes, and the edges between them. Sizes and index maps are sympy expressions over the
program's symbols (params, consts, `rank`, `world`, the topology's `node`, `nodes`, `local_rank` and
`local_world`, family indices); `let` names are expanded."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Union

import sympy

from tiledsl.grammar import ast


class Role(enum.Enum):
    IN = "in"        # the caller's tensor, read only
    OUT = "out"      # the caller's tensor, written by the program
    INOUT = "inout"  # the caller's tensor, read and then overwritten
    SYMM = "symm"    # on the symmetric heap: one copy per rank, `X@r` reaches rank r's
    LOCAL = "local"  # rank-local scratch owned by the compiled program


class EngineKind(enum.Enum):
    COPY_ENGINE = "copy_engine"  # DMA copies on the communication stream; a stream write signals
    SMS = "sms"                  # Triton programs doing loads and stores (peer stores over NVLink)
    NVSHMEM = "nvshmem"          # from Triton programs: nvshmemx_putmem_signal_block, or getmem_block


class Kind(enum.Enum):
    TILE = "tile"    # compute over blocks
    CHUNK = "chunk"  # a copy of one region to another, possibly across ranks, possibly reducing


@dataclass(frozen=True)
class Tensor:
    name: str
    role: Role
    dtype: str                      # a name in tiledsl.tables.DTYPES: bfloat16, float32, ...
    shape: tuple[sympy.Expr, ...]
    span: ast.Span = field(compare=False)


@dataclass(frozen=True)
class Dim:
    """One dimension of a region: elements start .. start+size-1, clipped at the tensor's bound."""
    start: sympy.Expr
    size: sympy.Expr
    kept: bool  # False for a point index (`X[s, ...]`): the value loses this dimension


@dataclass(frozen=True)
class Region:
    tensor: str
    owner: sympy.Expr | None  # the rank whose copy is accessed; None is this rank
    dims: tuple[Dim, ...]
    span: ast.Span = field(compare=False)

    @property
    def shape(self) -> tuple[sympy.Expr, ...]:
        return tuple(d.size for d in self.dims if d.kept)


# ---- values computed by tiles ------------------------------------------------------------------

@dataclass(frozen=True)
class Load:
    region: Region


@dataclass(frozen=True)
class Scalar:
    value: Union[int, float]


@dataclass(frozen=True)
class Map:
    """An elementwise function of its arguments (+ - * / max min, casts, activations, rmsnorm)."""
    func: str
    args: tuple["Value", ...]


@dataclass(frozen=True)
class MatMul:
    left: "Value"   # [m, k]
    right: "Value"  # [k, n]


@dataclass(frozen=True)
class Reduce:
    """sum(body for var in range(extent)), the body loaded once per value of var."""
    var: sympy.Symbol
    extent: sympy.Expr
    body: "Value"


Value = Union[Load, Scalar, Map, MatMul, Reduce]


@dataclass(frozen=True)
class Store:
    target: Region
    value: Value
    dtype: str  # of the value before it is cast to the target's dtype
    shape: tuple[sympy.Expr, ...]


@dataclass(frozen=True)
class Engine:
    kind: EngineKind
    # SM programs for SMS / NVSHMEM roles: a number, or an expression of consts (`sms(RED_SMS)`), fixed
    # when the program is built with its consts; None: all programs left over
    programs: int | sympy.Expr | None
    span: ast.Span = field(compare=False)

    def count(self, consts: dict[str, int]) -> int | None:
        """The program count with these const values."""
        if self.programs is None or isinstance(self.programs, int):
            return self.programs
        return int(self.programs.subs({size_symbol(k): v for k, v in consts.items()}))


@dataclass(frozen=True)
class Family:
    name: str
    kind: Kind
    indices: tuple[tuple[sympy.Symbol, sympy.Expr], ...]  # (index, extent): instances 0..extent-1
    engine: Engine
    reads: tuple[Region, ...]
    writes: tuple[Region, ...]
    stores: tuple[Store, ...] = ()           # tiles: what each instance computes
    reduce: str | None = None                # chunks: "add" accumulates into the target
    split: int = 1                           # chunks: parts of one instance, signalled separately
    order: tuple[sympy.Expr, ...] = ()       # sort keys over the indices, rank and world
    # variables other than the indices that regions mention (`s` in sum(... for s in world)), with extents
    loops: tuple[tuple[sympy.Symbol, sympy.Expr], ...] = ()
    span: ast.Span = field(compare=False, default_factory=ast.Span.none)

    @property
    def index_names(self) -> tuple[str, ...]:
        return tuple(str(s) for s, _ in self.indices)

    @property
    def puts(self) -> bool:
        """An NVSHMEM put: it writes another rank's copy and signals there, with its data. (An NVSHMEM
        chunk that reads another rank's copy into this rank's is a get: it notifies as SMs do.)"""
        return self.engine.kind is EngineKind.NVSHMEM and self.writes[0].owner is not None


class RankSet(enum.Enum):
    LOCAL = "local"  # the producer instance on the consumer's own rank
    EVERY = "every"  # the producer instance on every rank
    AT = "at"        # the producer instance on the rank given by `rank_expr`
    SET = "set"      # on each rank `rank_expr` gives for `rank_var` in 0 .. `rank_extent`-1


@dataclass(frozen=True)
class Edge:
    consumer: str
    producer: str
    # one entry per producer index, over the consumer's indices, rank and world; None is `*`
    index_map: tuple[sympy.Expr | None, ...]
    ranks: RankSet
    rank_expr: sympy.Expr | None
    span: ast.Span = field(compare=False)
    # RankSet.SET, `@ (s*local_world + local_rank for s in nodes)`: the variable and its extent
    rank_var: sympy.Symbol | None = None
    rank_extent: sympy.Expr | None = None


@dataclass(frozen=True)
class Condition:
    """A fact the program needs that only the launch sizes decide (divisibility, bounds)."""
    holds: sympy.Expr  # a sympy relation or `Eq(Mod(a, b), 0)` over params, consts and world
    message: str
    span: ast.Span = field(compare=False)


@dataclass(frozen=True)
class Schedule:
    program: ast.Program
    params: tuple[str, ...]
    consts: dict[str, int]                  # compile-time sizes, tunables at their default
    tunables: dict[str, tuple[int, ...]]
    tensors: dict[str, Tensor]
    families: dict[str, Family]             # in source order
    edges: tuple[Edge, ...]
    conditions: tuple[Condition, ...]
    # `let` names in declaration order, each with its value over params, consts and world: sizes above
    # are expanded, and code generation names them again so that generated kernels read like the program
    lets: tuple[tuple[str, sympy.Expr], ...] = ()
    # the program names the topology (`node`, `nodes`, `local_rank`, `local_world`): it is written for
    # several nodes, and proved at several; a program that does not runs within one node
    spans_nodes: bool = False

    @property
    def name(self) -> str:
        return self.program.name.id

    def staged_inputs(self) -> tuple[str, ...]:
        """Caller tensors that some family reads on a peer (`X@s`): copied to the heap at each call."""
        peers = {r.tensor for f in self.families.values() for r in f.reads if r.owner is not None}
        return tuple(n for n, t in self.tensors.items() if n in peers and t.role in (Role.IN, Role.INOUT))



def size_symbol(name: str) -> sympy.Symbol:
    """Params, consts and `world`: positive integers."""
    return sympy.Symbol(name, integer=True, positive=True)


def index_symbol(name: str) -> sympy.Symbol:
    """`rank`, family indices and reduction variables: nonnegative integers."""
    return sympy.Symbol(name, integer=True, nonnegative=True)


RANK = index_symbol("rank")
WORLD = size_symbol("world")

# The two-level topology (tiledsl/topology.py): ranks numbered node by node, as torchrun numbers them.
# `node` and `local_rank` are symbols so that expressions and plans read as written; this is what they
# stand for, the one definition the checker, the kernels, the host code and the reference all use.
NODE = index_symbol("node")
LOCAL_RANK = index_symbol("local_rank")
NODES = size_symbol("nodes")
LOCAL_WORLD = size_symbol("local_world")
RANK_PARTS = {NODE: sympy.floor(RANK / LOCAL_WORLD), LOCAL_RANK: sympy.Mod(RANK, LOCAL_WORLD)}
TOPOLOGY_NAMES = ("node", "nodes", "local_rank", "local_world")
