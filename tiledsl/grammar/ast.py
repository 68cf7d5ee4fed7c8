"""The syntax tree of a .tds program: frozen dataclasses that mirror the grammar's rules.

Every node keeps its `span`, so that any later stage can point at the source. The tree holds
what was written and nothing derived; meaning (shapes, regions, signals) comes in `tiledsl.schedule`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from tiledsl.diagnostics import Span  # noqa: F401 - every node's position; ast.Span as ever


# ---- expressions -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Num:
    value: Union[int, float]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Name:
    id: str
    span: Span = field(compare=False)


@dataclass(frozen=True)
class BinOp:
    op: str  # one of + - * / mod @   (`/` on indices floors; on sizes it must divide exactly)
    left: "Expr"
    right: "Expr"
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Neg:
    operand: "Expr"
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Call:
    func: str  # a size function (cdiv, min, max), a dtype cast (f32, bf16) or an elementwise map (gelu, ...)
    args: tuple["Expr", ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Peer:
    """`X@r`: rank r's copy of a symmetric tensor."""
    base: "Expr"
    rank: "Expr"
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Index:
    """`i` in `X[i, :]`: one element along a dimension (the dimension is dropped)."""
    at: "Expr"
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Range:
    """`a : b` (stop given) or `a : +n` (size given) along a dimension; `:` is the whole dimension."""
    start: "Expr | None"
    stop: "Expr | None"
    size: "Expr | None"
    span: Span = field(compare=False)


Slice = Union[Index, Range]


@dataclass(frozen=True)
class Subscript:
    """`X[slices]`: a region of a tensor (or of a peer's copy)."""
    base: "Expr"
    slices: tuple[Slice, ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class RankSum:
    """`sum(body for var in extent)`, `max(...)`: a reduction over ranks (or any small index range)."""
    body: "Expr"
    var: Name
    extent: "Expr"
    span: Span = field(compare=False)
    op: str = "sum"  # sum or max


@dataclass(frozen=True)
class Compare:
    """`a <= b` as a function's argument: a block of booleans (`where(k <= q, s, -inf)`)."""
    op: str  # < <= > >= == !=
    left: "Expr"
    right: "Expr"
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Transpose:
    """`x.T`: a 2-D block with its axes swapped."""
    operand: "Expr"
    span: Span = field(compare=False)


Expr = Union[Num, Name, BinOp, Neg, Call, Peer, Subscript, RankSum, Compare, Transpose]


# ---- declarations ------------------------------------------------------------------------------

@dataclass(frozen=True)
class IndexVar:
    """`i in M/BM`: an index of a family and its extent (instances 0 .. extent-1). A family declared
    without indices has one instance."""
    name: Name
    extent: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Engine:
    """`on copy_engine`, `on sms(4)`, `on nvshmem`: who carries out a family."""
    kind: Name
    amount: Expr | None
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Guard:
    """`if rank == root` after a family's index list: the ranks it has instances on."""
    left: Expr
    op: str  # == != <= >= < >
    right: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True)
class ParamDecl:
    names: tuple[Name, ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class ConstDecl:
    name: Name
    value: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True)
class TuneDecl:
    """`tune BK in [64, 128]`: a compile-time size with its choices; the first is the default."""
    name: Name
    choices: tuple[Expr, ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class LetDecl:
    name: Name
    value: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True)
class RequireDecl:
    """`require left op right`: a launch condition on sizes."""
    left: Expr
    op: str  # == != <= >= < >
    right: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True)
class TensorDecl:
    role: str  # in, out, inout, symm, local
    name: Name
    dtype: Name
    shape: tuple[Expr, ...]
    span: Span = field(compare=False)
    cap: Expr | None = None    # `cap C`: every element is a count from 0 to C
    upto: Name | None = None   # `upto count`: the dimension after count's is valid below count[...]


@dataclass(frozen=True)
class ChunkDecl:
    name: Name
    indices: tuple[IndexVar, ...]
    engine: Engine | None
    split: Expr | None
    source: Expr
    target: Expr
    reduce: Name | None
    span: Span = field(compare=False)
    guard: Guard | None = None  # `if rank == root`: instances on those ranks only


@dataclass(frozen=True)
class Assign:
    target: Expr
    value: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Wait:
    """`wait gather[c]` in a loop of a tile's body: each step waits for what its deps name, then runs."""
    deps: tuple["Dep", ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class For:
    """`for c in n:` and its block: n steps; a name bound before the loop and rebound in it is carried
    from each step to the next, and holds its last value after the loop."""
    var: Name
    extent: Expr
    body: tuple["Statement", ...]
    span: Span = field(compare=False)


Statement = Union[Assign, Wait, For]


@dataclass(frozen=True)
class TileDecl:
    name: Name
    indices: tuple[IndexVar, ...]
    engine: Engine | None
    body: tuple[Statement, ...]  # an inline body holds assignments only
    span: Span = field(compare=False)
    guard: Guard | None = None  # `if rank == root`: instances on those ranks only


@dataclass(frozen=True)
class AllInstances:
    """`*` in `gather[*]`: every instance along that index."""
    span: Span = field(compare=False)


@dataclass(frozen=True)
class EveryRank:
    """`@ every rank`: the producer instance on every rank."""
    span: Span = field(compare=False)


@dataclass(frozen=True)
class RanksFor:
    """`@ (s*local_world + local_rank for s in nodes)`: the producer instance on each rank `rank`
    gives for `var` in 0 .. extent-1."""
    rank: "Expr"
    var: Name
    extent: "Expr"
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Dep:
    """One producer side of an edge: `gather[(i*BM)/Ms]`, optionally `@ every rank`, `@ r` or
    `@ (r for s in n)`."""
    family: Name
    index: tuple[Expr | AllInstances, ...]
    ranks: EveryRank | RanksFor | Expr | None  # None: the consumer's own rank
    span: Span = field(compare=False)


@dataclass(frozen=True)
class EdgeDecl:
    consumer: Name
    bound: tuple[Name, ...]  # the names the consumer's indices take in the index maps (none: one instance)
    deps: tuple[Dep, ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class OrderDecl:
    family: Name
    keys: tuple[Expr, ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class PlaceDecl:
    family: Name
    engine: Engine
    span: Span = field(compare=False)


Decl = Union[ParamDecl, ConstDecl, TuneDecl, LetDecl, RequireDecl, TensorDecl, ChunkDecl, TileDecl, EdgeDecl,
             OrderDecl, PlaceDecl]


@dataclass(frozen=True)
class Program:
    name: Name
    decls: tuple[Decl, ...]
    path: str
    source: str = field(repr=False, compare=False)
    span: Span = field(compare=False)

    def of(self, kind: type) -> list:
        """The declarations of one kind, in source order."""
        return [d for d in self.decls if isinstance(d, kind)]
