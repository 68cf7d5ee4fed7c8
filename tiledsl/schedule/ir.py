"""The schedule graph: families of tiles and chunks over index spaces, the regions each instance
reads and writes, and the edges between them. Sizes and index maps are sympy expressions over the
program's symbols (params, consts, `rank`, `world`, the topology's `node`, `nodes`, `local_rank` and
`local_world`, family indices); `let` names are expanded."""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field
from typing import Union

import sympy
from sympy.core.function import AppliedUndef

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
    # counts: every element is 0..cap. A size that reads one is proved at cap; a store above it stores
    # cap and raises CapacityExceeded (runtime/issue.py); a copy into it must come from the same cap.
    cap: sympy.Expr | None = None
    # ragged: the dimension after this int tensor's dimensions (a prefix of ours) is valid below
    # upto[i, ...]; elements past it are unspecified (not compared; an instance writing only there is skipped)
    upto: str | None = None


@dataclass(frozen=True)
class Dim:
    """One dimension of a region: elements start .. start+size-1, clipped at the tensor's bound."""
    start: sympy.Expr
    size: sympy.Expr
    kept: bool  # False for a point index (`X[s, ...]`): the value loses this dimension


@dataclass(frozen=True)
class Region:
    """A box of a tensor. Where `rows` is set the region is gathered: row r of its first axis (ROW in the
    expressions, 0..rows-1) is the element its point dimensions and owner name for that r, each of
    them an expression of device values (`send[ids[t*BT : +BT, k], slot[t*BT : +BT, k], :]`)."""
    tensor: str
    owner: sympy.Expr | None  # the rank whose copy is accessed; None is this rank
    dims: tuple[Dim, ...]
    span: ast.Span = field(compare=False)
    rows: sympy.Expr | None = None

    @property
    def shape(self) -> tuple[sympy.Expr, ...]:
        return ((self.rows,) if self.rows is not None else ()) + tuple(d.size for d in self.dims if d.kept)


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
    # where a row reduction is written (rowsum(...)), for the warning on its padding (schedule/padding.py)
    span: ast.Span = field(compare=False, repr=False, default_factory=ast.Span.none)


@dataclass(frozen=True)
class MatMul:
    left: "Value"   # [m, k]
    right: "Value"  # [k, n]


@dataclass(frozen=True)
class Reduce:
    """sum(body for var in range(extent)) (or max), the body loaded once per value of var."""
    var: sympy.Symbol
    extent: sympy.Expr
    body: "Value"
    op: str = "sum"  # sum or max


@dataclass(frozen=True)
class Route:
    """Routing of a region of integer ids to `bins` groups (a tile's whole store): `histogram` is the
    number of elements holding each value 0..bins-1, shape [bins]; `arrival` is, for each element, the
    number of elements before it (row-major) holding the same value, the region's shape. Together, an
    id and its arrival name each element once: a write through both never writes one place twice.
    `arrival(ids, n)[a : +m, :]` (`part`, a box of the region's shape) is that box of the arrival of
    the whole region: instances that store parts of one arrival still number each element once, and
    each computes its part from the counts of the elements before it, so the parts run in parallel."""
    func: str  # "histogram" or "arrival"
    source: Region
    bins: sympy.Expr
    part: tuple[Dim, ...] | None = None  # over the source's kept dimensions; None: the whole arrival

    @property
    def shape(self) -> tuple[sympy.Expr, ...]:
        if self.func == "histogram":
            return (self.bins,)
        return tuple(d.size for d in self.part) if self.part is not None else self.source.shape


ROUTES = ("histogram", "arrival")


@dataclass(frozen=True)
class Local:
    """A name bound in a tile's block (`p = exp2(s - m)`): where it is read, its latest binding."""
    name: str


@dataclass(frozen=True)
class Iota:
    """The element indices 0 .. size-1 along one axis: `rows(n)` is a column [n, 1] (axis 0), `cols(n)` a
    row [1, n] (axis 1). Masks compare them: `where(c*BN + cols(BN) <= i*BM + rows(BM), s, -inf)`."""
    size: sympy.Expr
    axis: int


@dataclass(frozen=True)
class Transpose:
    """`x.T`: a 2-D value with its axes swapped."""
    value: "Value"


Value = Union[Load, Scalar, Map, MatMul, Reduce, Route, Local, Iota, Transpose]


@dataclass(frozen=True)
class Store:
    target: Region
    value: Value
    dtype: str  # of the value before it is cast to the target's dtype
    shape: tuple[sympy.Expr, ...]


# ---- the statements of a tile written as a block --------------------------------------------------

@dataclass(frozen=True)
class Let:
    """`name = value` in a tile's block: a value of this shape and dtype, read by name below."""
    name: str
    value: Value
    shape: tuple[sympy.Expr, ...]
    dtype: str


@dataclass(frozen=True)
class SizeLet:
    """`pk = (n - 1 - t) / NK` in a tile's block: a size that depends on the instance (or the step),
    named. Regions, waits and extents after it use `symbol`; what they mean is the expression with
    every such symbol replaced by its value (`Family.expand`), and the kernel computes it once, here."""
    symbol: sympy.Symbol
    value: sympy.Expr  # over sizes, rank, the family's indices, the loop's variable and earlier SizeLets


@dataclass(frozen=True)
class Carried:
    """A name a loop carries from each step to the next: bound before the loop (its initial value,
    broadcast to `shape`), rebound in it (the update), read after it (the last step's value)."""
    name: str
    shape: tuple[sympy.Expr, ...]
    dtype: str
    start_dtype: str = ""  # the initial value's, where it differs (an integer start of a float sum)


@dataclass(frozen=True)
class Loop:
    """`for var in extent:` in a tile's block: `extent` steps, one after another, in one instance. A
    step's waits (the edges whose `loop` is `var`) come before anything the step reads."""
    var: sympy.Symbol
    extent: sympy.Expr              # over sizes, rank and the family's indices
    body: tuple["Statement", ...]
    carried: tuple[Carried, ...]
    span: ast.Span = field(compare=False)


Statement = Union[Let, Loop, Store, SizeLet]


class Phase(enum.Enum):
    """When an instance of a tile with a loop makes an access (or waits)."""
    ENTRY = "entry"  # before the loop (the family's own edges wait here)
    STEP = "step"    # in a step of the loop, over its variable
    EXIT = "exit"    # after the loop; what the instance signals comes after this


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
    # chunks: parts of one instance, signalled separately; an expression of consts (`split PIECES`) until
    # the plan resolves it with the consts built (`parts`)
    split: int | sympy.Expr = 1
    order: tuple[sympy.Expr, ...] = ()       # sort keys over the indices, rank and world
    # variables other than the indices that regions mention (`s` in sum(... for s in world)), with extents
    loops: tuple[tuple[sympy.Symbol, sympy.Expr], ...] = ()
    span: ast.Span = field(compare=False, default_factory=ast.Span.none)
    # a tile written as statements with local names or a loop: all of them, in order (`stores` lists its
    # stores too); empty for a tile that is only stores
    body: tuple[Statement, ...] = ()
    # with a loop: when each of `reads + writes` happens; empty without one
    phases: tuple[Phase, ...] = ()
    # `if rank == root`: the ranks it has instances on, a condition over sizes and rank (and the topology's
    # names); elsewhere it has none. Its index space, and so its signal slots, are the same everywhere
    runs_on: sympy.Basic = sympy.true

    def parts(self, consts: dict[str, int]) -> int:
        """The parts of one instance (`split`) with these const values."""
        if isinstance(self.split, int):
            return self.split
        return int(self.split.subs({size_symbol(k): v for k, v in consts.items()}))

    @property
    def index_names(self) -> tuple[str, ...]:
        return tuple(str(s) for s, _ in self.indices)

    @property
    def puts(self) -> bool:
        """An NVSHMEM put: it writes another rank's copy and signals there, with its data. (An NVSHMEM
        chunk that reads another rank's copy into this rank's is a get: it notifies as SMs do.)"""
        return self.engine.kind is EngineKind.NVSHMEM and self.writes[0].owner is not None

    @property
    def loop(self) -> Loop | None:
        """The tile's loop (one at most)."""
        return next((s for s in self.body if isinstance(s, Loop)), None)

    def expand(self, expr):
        """`expr` with the tile's size names replaced by their values: over sizes, rank, indices and
        the loop's variable only. What a region, a wait or an extent means; the kernel keeps the names."""
        if not self._size_values:
            return expr
        expr = sympy.sympify(expr)
        if expr not in self._expanded:  # the checker asks for the same ones at every world and size
            self._expanded[expr] = expr.xreplace(self._size_values)
        return self._expanded[expr]

    @functools.cached_property
    def _size_values(self) -> dict:
        values = {}
        for statement in _size_lets(self.body):
            values[statement.symbol] = sympy.sympify(statement.value).xreplace(values)
        return values

    @functools.cached_property
    def _expanded(self) -> dict:
        return {}


def _size_lets(statements):
    for statement in statements:
        if isinstance(statement, SizeLet):
            yield statement
        elif isinstance(statement, Loop):
            yield from _size_lets(statement.body)


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
    # `wait` in the consumer's loop: the loop's variable, which the index map and rank may use; the wait
    # is made at every step, each naming the producer at that step. None: the instance waits at its start
    loop: sympy.Symbol | None = None


@dataclass(frozen=True)
class Condition:
    """A fact the program needs that only the launch sizes decide (divisibility, bounds)."""
    holds: sympy.Expr  # a sympy relation or `Eq(Mod(a, b), 0)` over params, consts and world
    message: str
    span: ast.Span = field(compare=False)
    hint: str | None = field(default=None, compare=False)  # what to change, where the message alone does not say


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
    # what the generated kernel needs of the sizes beside the program's `require`s: TMA's rows of whole
    # 16 bytes on the tensors code generation reads through descriptors. The lowering decides which, so
    # the pipeline's schedule stage sets these (codegen/tma.py `with_row_conditions`), at the schedule's
    # consts; the schedule layer only reads them (meaning.py `launch_conditions`)
    kernel_conditions: tuple[Condition, ...] = ()

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

ROW = index_symbol("tds_row")  # the row of a gathered region's first axis


# ---- device values: a tensor's element read on the device ----------------------------------------
# `got[e, s]` in a size or an index is the application got(owner, e, s) of a sympy function named for
# the tensor, the owner first (RANK: this rank's copy); the ARCHITECTURE sketch's DeviceValue(tensor,
# index, cap), the cap being the tensor's. Sizes and indices stay sympy expressions that the checker
# evaluates at capacity, the reference with the values it holds, and code generation after a load.

def element(tensor: str):
    """The function whose applications read `tensor`'s elements: integers, never negative (a count, or an
    index the kernel and the reference check before use)."""
    return sympy.Function(tensor, integer=True, nonnegative=True)


def device_values(expr) -> set:
    """The tensor elements an expression reads."""
    return {a for a in sympy.sympify(expr).atoms(AppliedUndef)} if expr is not None else set()


def value_tensor(application) -> str:
    return application.func.__name__


def value_owner(application) -> sympy.Expr:
    return application.args[0]


def value_index(application) -> tuple[sympy.Expr, ...]:
    return application.args[1:]
