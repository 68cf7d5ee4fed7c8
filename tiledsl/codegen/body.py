"""What one instance of a tile or of an SM chunk does, as typed statements: the blocks it loads, the
math it does, what it stores or copies. Every choice is made here (block sizes, which masks are
needed, a TMA or a pointer store); each statement's printer (printer.py) prints it and decides nothing.

A tile works on one block whose axes are the kept dimensions of its target region. Loads broadcast
from the trailing axes (a bias row [BN] against a [BM, BN] block). Values are computed in float32
and cast to the target's dtype only when stored."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

import sympy

from tiledsl.codegen.names import EPOCH, value_name
# the launcher's own rules, so that generated code and launcher agree on block sizes and shared memory
from tiledsl.runtime.specs import pipeline_stages, pow2_at_least
from tiledsl.schedule import ir
from tiledsl.tables import DTYPES, FUNCTIONS, smallest_dot_k

BLOCK_1D = 8192          # elements per step of a 1-D chunk copy
FP8 = "float8_e4m3fn"
BLOCK_2D = (64, 256)     # rows x columns per step of a 2-D chunk copy: 32 KB of bf16 in flight
# a step of a copy of whole rows, run as one flat range: 32 KB, and at most 16 K elements (128 a thread
# on 4 warps; 32 K of fp8 took moe_dispatch_fp8 past 255 registers)
BLOCK_FLAT_BYTES, BLOCK_FLAT_MOST = 32768, 16384


class LoweringError(Exception):
    """The schedule is valid but uses something code generation does not support yet. The checker
    reports it at `span` (the family's, where the raise names none) with `hint` (codegen/emittable.py),
    so that a user meets it as a positioned error of `tiledsl check`, never from a later stage."""

    def __init__(self, message: str, span=None, hint: str | None = None):
        super().__init__(message)
        self.span, self.hint = span, hint


# ---- where a block lives -------------------------------------------------------------------------

@dataclass(frozen=True)
class Dim:
    """One dimension of a tensor as a block reaches it: elements start + 0 .. block-1 along `axis`
    (a single element at `start` where `axis` is None), masked past `bound` and, where the block is
    larger than the region, past `clip` elements."""
    start: sympy.Expr
    stride: sympy.Expr
    bound: sympy.Expr
    axis: int | None = None
    block: int | str | None = None   # a power of two, or a launch-time constexpr's name
    clip: sympy.Expr | None = None


@dataclass(frozen=True)
class Place:
    """A block of a tensor, on this rank's copy or, through its peer offsets, on `owner`'s. A gathered
    place's owner and point starts are expressions of fetched device values, one per row of the block's
    gathered axis; `valid` are the conditions (over those values) under which a row is there at all."""
    tensor: str
    owner: sympy.Expr | None
    dims: tuple[Dim, ...]
    axes: int  # axes of the block it sits in: its own axes are the trailing ones
    # the aranges its axes run along (Arange names): a block tile's values have shapes of their own,
    # so each place names its own; None: the tile's one block (printer.AXES)
    names: tuple[str, ...] | None = None
    valid: tuple[sympy.Expr, ...] = ()

    def needs(self) -> set[str]:
        """The tensor, its peer offsets where the block is on another rank, its launch-time blocks."""
        peers = {f"tds_peers_{self.tensor}"} if self.owner is not None else set()
        return {self.tensor} | peers | {d.block for d in self.dims if isinstance(d.block, str)}


# ---- statements ------------------------------------------------------------------------------------

class Statement:
    """A statement of an instance's body: each kind is a frozen dataclass below, printed by its one printer
    (printer.py, keyed by the class) and walked by the one walk (`nested`). What it declares here is what
    the family around it derives from it: `needs`, the kernel arguments its printed code reads (besides the
    sizes its expressions name, which interface.symbols_of finds); a compound statement (a Loop, an If)
    holds its statements in a field named `body`."""

    def needs(self, family: str) -> set[str]:
        return set()


def nested(statements, depth: int = 0):
    """(depth, statement) for every statement, in order, those a compound one holds right after it one
    deeper: the one walk over statements that printing, the interface and the plan's description take,
    so that none of them can skip a kind (describe once skipped an If's)."""
    for s in statements:
        yield depth, s
        yield from nested(getattr(s, "body", ()), depth + 1)


def walk(statements):
    """Every statement, those inside loops and ifs too, in order."""
    return (s for _, s in nested(statements))


def _blocks(blocks) -> set[str]:
    return {b for b in blocks if isinstance(b, str)}


@dataclass(frozen=True)
class Scalar:
    """A number, or a size expression, as a float32 operand (`integer`: as the integer it is)."""
    value: float | sympy.Expr
    integer: bool = False


@dataclass(frozen=True)
class Computed:
    """A value printed where it is read instead of under a name of its own: the statement that computes
    it (an Apply, Cast, Trans, Dot or Mask). Only printing makes these (codegen/inline.py)."""
    statement: "Statement"


Operand = Union[str, Scalar, Computed]  # a block named by an earlier statement, a scalar, or one computed in place


@dataclass(frozen=True)
class Load(Statement):
    name: str
    place: Place   # elements outside the masks read as 0
    native: bool = False  # in the tensor's own dtype (a matrix product's operand, an integer), not float32

    def needs(self, family: str) -> set[str]:
        return self.place.needs()


@dataclass(frozen=True)
class Apply(Statement):
    name: str
    function: str                 # a key of tables.FUNCTIONS
    args: tuple[Operand, ...]
    row: sympy.Expr | None = None  # row functions: the length of the row


@dataclass(frozen=True)
class Cast(Statement):
    """Round `arg` to `dtype` and continue in float32, as torch does with an explicit cast."""
    name: str
    dtype: str
    arg: Operand


@dataclass(frozen=True)
class Zeros(Statement):
    name: str
    blocks: tuple[int | str, ...]

    def needs(self, family: str) -> set[str]:
        return _blocks(self.blocks)


@dataclass(frozen=True)
class Accumulate(Statement):
    name: str
    term: Operand
    op: str = "sum"  # or "max"


@dataclass(frozen=True)
class Loop(Statement):
    var: sympy.Symbol
    extent: sympy.Expr
    body: tuple["Statement", ...]
    # a loop whose steps wait is not software-pipelined (1 stage): the pipeliner would issue a step's
    # loads in the step before, ahead of that step's wait (as flattening did with TMA loads on H200)
    stages: int | None = None
    # Triton's automatic warp specialization of this loop (a program's const WS: the loops of a block
    # tile that hold its matrix products; on Hopper, producer warps issue the TMA loads)
    specialize: bool = False


@dataclass(frozen=True)
class Arange(Statement):
    """`name` = 0 .. block-1 along axis `axis` of a block of `rank` axes (expanded to broadcast)."""
    name: str
    block: int | str
    axis: int
    rank: int

    def needs(self, family: str) -> set[str]:
        return _blocks([self.block])


@dataclass(frozen=True)
class Assign(Statement):
    """`name = value`: a block named in the program's tile bound to another, or to a scalar."""
    name: str
    value: Operand


@dataclass(frozen=True)
class Full(Statement):
    """A float32 block of these blocks, every element `value` (a carried value's start)."""
    name: str
    blocks: tuple[int | str, ...]
    value: Operand

    def needs(self, family: str) -> set[str]:
        return _blocks(self.blocks)


@dataclass(frozen=True)
class Trans(Statement):
    name: str
    arg: Operand


@dataclass(frozen=True)
class Dot(Statement):
    """name = left @ right with tl.dot, accumulated in float32. Each operand is converted to the
    element type of tensor `like` where it is a computed block (a float32 rounded to bf16 by the
    program, say), so that both have one type: on a GPU the tensor's own, emulated its float32."""
    name: str
    left: Operand
    right: Operand
    convert_left: str | None = None    # a tensor whose element type the left operand is converted to
    convert_right: str | None = None
    ieee: bool = False  # both operands float32: multiplied in IEEE fp32, as torch does (Triton's default is TF32)

    def needs(self, family: str) -> set[str]:
        return {t for t in (self.convert_left, self.convert_right) if t is not None}  # their dtypes


@dataclass(frozen=True)
class Mask(Statement):
    """name = arg where `along` < bound, else `fill`: a block's padding (its block is larger than its
    size) made harmless before a reduction or a product sums across it."""
    name: str
    arg: Operand
    along: str
    bound: sympy.Expr
    fill: float


@dataclass(frozen=True)
class Product(Statement):
    """name = A[row : +block_m, :] @ B[:, col : +block_n] through the family's TMA descriptors, the
    contraction dimension `k` in steps of block_k, accumulated in float32."""
    name: str
    family: str
    left: str
    right: str
    row: sympy.Expr
    col: sympy.Expr
    k: sympy.Expr
    block_m: int
    block_n: int
    block_k: int | str
    # points of the leading dimensions of N-D operands (expert e of B[E, K, N]): the descriptors' blocks
    # are 1 there, so TMA zero-fills past the operand's own rows and columns, never the next expert's
    left_at: tuple[sympy.Expr, ...] = ()
    right_at: tuple[sympy.Expr, ...] = ()
    # a sub-range of the contraction dimension (a split of K): from `k_start`, `k` long. Its last TMA
    # block may reach into the next range, so A's columns past it are zeroed in registers.
    k_start: sympy.Expr = sympy.Integer(0)
    k_masked: bool = False
    ieee: bool = False  # both operands float32: multiplied in IEEE fp32, as torch does (Triton's default is TF32)

    def needs(self, family: str) -> set[str]:
        return {f"tds_desc_{self.family}_a", f"tds_desc_{self.family}_b"} | _blocks([self.block_k])


@dataclass(frozen=True)
class Store(Statement):
    place: Place
    value: Operand

    def needs(self, family: str) -> set[str]:
        return self.place.needs()


@dataclass(frozen=True)
class DescLoad(Statement):
    """A block tile's load through a TMA descriptor (`descriptor`, a kernel argument over the whole
    tensor): the block at `at` (one start a dimension), of `block` elements a dimension (1 at a
    point), reshaped to `shape`. TMA reads elements past a dimension's end as 0, as a masked load
    does, and frees the registers and instructions a block of pointers takes."""
    name: str
    descriptor: str
    tensor: str
    at: tuple[sympy.Expr, ...]
    block: tuple[int, ...]
    shape: tuple[int, ...]
    native: bool = False

    def needs(self, family: str) -> set[str]:
        return {self.descriptor}  # an argument the launcher makes, unless the family makes it (interface.py)


@dataclass(frozen=True)
class MakeDescriptor(Statement):
    """`name` = a TMA descriptor over the whole of `tensor` made on the device (once a program, before
    its instances): what Triton's warp specialization on Hopper reads its loads through. Its global
    scratch comes from the allocator the launcher sets (triton.set_allocator)."""
    name: str
    tensor: str
    shape: tuple[sympy.Expr, ...]
    strides: tuple[sympy.Expr, ...]
    block: tuple[int, ...]
    offset: sympy.Expr = sympy.Integer(0)  # elements from the tensor's start (its points, for a 2-D one)

    def needs(self, family: str) -> set[str]:
        return {self.tensor}


@dataclass(frozen=True)
class DescStore(Statement):
    """A block tile's store through a TMA descriptor: the elements past a dimension's end are not
    written (TMA clips them)."""
    descriptor: str
    tensor: str
    at: tuple[sympy.Expr, ...]
    block: tuple[int, ...]
    value: Operand

    def needs(self, family: str) -> set[str]:
        return {self.descriptor, self.tensor}  # the tensor's dtype is the stored block's


@dataclass(frozen=True)
class TmaStore(Statement):
    """A product's block out through the family's target descriptor: it clips at the tensor's edge by
    itself and frees the registers a block of pointers would take."""
    family: str
    tensor: str
    row: sympy.Expr
    col: sympy.Expr
    value: str
    at: tuple[sympy.Expr, ...] = ()  # points of the leading dimensions of an N-D target
    block: tuple[int, int] = ()      # the stored block's rows and columns (an N-D target's store reshapes)

    def needs(self, family: str) -> set[str]:
        return {f"tds_desc_{self.family}_c", self.tensor}


@dataclass(frozen=True)
class Barrier(Statement):
    """Every thread's stores are visible before the next statement reads them back."""


@dataclass(frozen=True)
class Wait(Statement):
    """Until the producer's slot `slot` holds this call's epoch, for every value of `loops` (`*`
    indices, every rank, the producer's parts), where `exists` holds. A statement like any other, so
    that a wait can sit inside a loop of the body (one per step of a loop over chunks)."""
    edge: int
    where: str                                          # `file:line` and the edge's text
    producer: str
    loops: tuple[tuple[sympy.Symbol, sympy.Expr], ...]
    slot: sympy.Expr
    exists: sympy.Expr                                  # sympy.true where the instance always exists
    shmem: bool = False                                 # NVSHMEM writes the slot: its own wait follows
    # a `split` producer's parts: slots slot .. slot + parts - 1, all waited on in one vector read
    parts: int = 1
    # `*` over a run of the producer's indices: slots slot + j * stride for j in 0 .. span - 1 (over the
    # last indices: stride 1, parts included), waited on a vector at a time (sync.wait_span); None where
    # the wait names one instance's slots
    span: sympy.Expr | None = None
    stride: sympy.Expr = sympy.Integer(1)
    # a wait in a step of the tile's loop spins in line: through the noinline slow path (kept for
    # waits before a tile's body) sp_ag_attention at BM=128 came out wrong on the GPU (sync.wait_inline)
    inline: bool = False

    @property
    def guard_in_loop(self) -> bool:
        """The existence test depends on a loop's variable (`@ (r for s in n)`): it goes inside."""
        return bool(sympy.sympify(self.exists).free_symbols & {var for var, _ in self.loops})

    def needs(self, family: str) -> set[str]:
        return {f"tds_sig_{self.producer}", EPOCH, "tds_diag", "tds_max_spins", "rank"}


STEP_WAIT_BEGINS, STEP_WAIT_ENDS = 3, 4  # Record points around the waits of a loop's step


@dataclass(frozen=True)
class Record(Statement):
    """A timeline stamp of this instance (runtime/timeline.py: 0 start, 1 waits over, 2 end), compiled
    out unless the program is built with trace=True. Around a loop step's waits, STEP_WAIT_BEGINS and
    STEP_WAIT_ENDS add the time spent in them to the instance's waiting (its stamp 1)."""
    point: int

    def needs(self, family: str) -> set[str]:
        return {f"tds_trace_{family}", "tds_TRACE"}


@dataclass(frozen=True)
class Fence(Statement):
    """Between waits and the TMA loads that read what they acquired (sync.fence_async)."""


@dataclass(frozen=True)
class Copy(Statement):
    """An SM chunk: part `tds_part` of `split` of the region, in blocks of `block` (rows, or rows and
    columns), loaded from `source` and stored (added, with `reduce`) into `target`. The places' kept
    dimensions run along the copy's row and column loops."""
    source: Place
    target: Place
    rows: sympy.Expr
    cols: sympy.Expr | None
    block: tuple[int, ...]
    split: int
    reduce: bool

    def needs(self, family: str) -> set[str]:
        return self.source.needs() | self.target.needs()


@dataclass(frozen=True)
class Put(Statement):
    """An NVSHMEM chunk: part `tds_part` of `split` of whole rows, one putmem_signal to `owner`, which
    signals the family's slot there with the epoch."""
    family: str
    source: str
    source_owner: sympy.Expr | None   # a peer's copy of the source, read through its peer offsets
    source_start: sympy.Expr
    target: str
    target_start: sympy.Expr
    owner: sympy.Expr
    rows: sympy.Expr
    cols: sympy.Expr
    split: int

    def needs(self, family: str) -> set[str]:
        peers = {f"tds_peers_{self.source}"} if self.source_owner is not None else set()
        return {self.source, self.target, f"tds_shmem_{self.target}", f"tds_sig_{self.family}",
                f"tds_sigshmem_{self.family}", EPOCH} | peers


@dataclass(frozen=True)
class Get(Statement):
    """An NVSHMEM get: part `tds_part` of `split` of whole rows of `owner`'s copy of `source` into this
    rank's `target` (getmem_block: the rows are here when it returns); the family notifies after it."""
    family: str
    source: str
    source_start: sympy.Expr
    owner: sympy.Expr
    target: str
    target_start: sympy.Expr
    rows: sympy.Expr
    cols: sympy.Expr
    split: int

    def needs(self, family: str) -> set[str]:
        return {self.source, self.target, f"tds_shmem_{self.source}", "rank"}


@dataclass(frozen=True)
class Fetch(Statement):
    """Device values into `name`: the integers at `place` (one per row of the block where the place has
    an axis, `exists` naming the rows whose element is inside its tensor; one value otherwise). A count
    of a capped tensor above its cap is reported at guard `site` and read as the cap."""
    name: sympy.Symbol
    place: Place
    exists: sympy.Symbol | None = None
    cap: sympy.Expr | None = None
    site: int | None = None

    def needs(self, family: str) -> set[str]:
        return self.place.needs() | ({"tds_diag", "rank"} if self.cap is not None else set())


@dataclass(frozen=True)
class Report(Statement):
    """Where `bad` holds (within `within`'s mask, if given), guard `site` records its first case: the flat
    offset of `element` in its tensor, the `value` found and the `bound` it broke. The call goes on;
    the launcher raises afterwards (runtime/guards.py)."""
    site: int
    bad: sympy.Expr
    element: Place
    value: sympy.Expr
    bound: sympy.Expr
    within: Place | None = None

    def needs(self, family: str) -> set[str]:
        return self.element.needs() | {"tds_diag", "rank"}


@dataclass(frozen=True)
class Scan(Statement):
    """histogram() and arrival() of a region of ids (`count` elements, `cols` to a row where it has two
    axes) into `bins` groups, `step` elements at a time, `groups` of them a pass (a launch-time power of
    two: one pass where the bins are few). Ids outside 0..bins-1 are reported at `site` and counted
    nowhere; counts above the histogram's cap at `cap_site`."""
    source: Place
    count: sympy.Expr
    cols: sympy.Expr | None
    bins: sympy.Expr
    groups: str
    step: int
    arrival: Place | None
    histogram: Place | None
    site: int
    cap: sympy.Expr | None = None
    cap_site: int | None = None
    # a part of the arrival (`arrival(ids, n)[b*BR : +BR, :]`): its elements are first .. stop-1 of the
    # region in row-major order; the elements before it are only counted (a histogram per pass)
    first: sympy.Expr | None = None
    stop: sympy.Expr | None = None
    count_step: int = 1024  # elements a pass only counts at a time (tl.histogram)

    def needs(self, family: str) -> set[str]:
        places = (p for p in (self.source, self.arrival, self.histogram) if p is not None)
        return set().union(*(p.needs() for p in places)) | {self.groups, "tds_diag", "rank"}


@dataclass(frozen=True)
class If(Statement):
    """The statements run only where `condition` holds (a tile whose rows all lie past the valid ones
    does nothing)."""
    condition: sympy.Expr
    body: tuple["Statement", ...]


# ---- tiles -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TileBody:
    statements: tuple[Statement, ...]
    product: Product | None                      # the family's one matrix product, if it has one
    tma_target: str | None                        # the tensor a TmaStore writes
    blocks: tuple[tuple[str, sympy.Expr], ...]   # launch-time constexpr blocks: name, the size it covers
    head: tuple[Statement, ...] = ()             # what every instance shares (aranges): once, before them
    warps: int = 4                               # warps a program needs to hold its largest block in registers


def tile_body(schedule: ir.Schedule, family: ir.Family, consts: dict[str, int],
              kernel: Callable[[sympy.Expr], sympy.Expr], step_waits: tuple = (), sites=None) -> TileBody:
    """The statements of one tile instance; `kernel` rewrites an expression for the kernel (let names);
    `sites` collects the program's guard sites (codegen/device.py). A tile written as a block (names, a
    loop, blocks of several shapes) has a lowering of its own, which puts `step_waits` at the top of each
    step of its loop; its regions may gather rows and take point indices from device values, its sizes
    may not read them yet."""
    from tiledsl.codegen.blocks import lower_block
    if written_as_block(family):
        if any(isinstance(s.value, ir.Route) for s in family.stores) or _device_sized(family.body):
            raise LoweringError(f"tile '{family.name}': a tile written as a block (names, a loop, where, row "
                                "reductions) does not read tensor elements as sizes yet (a loop's extent, a "
                                "named size), nor route")
        if not family.body:  # several products in one tile: one K loop for them all
            from tiledsl.codegen.blocks import TEMPLATE_NAMES
            from tiledsl.codegen.products import split_k
            family = split_k(schedule, family, consts, set(TEMPLATE_NAMES))
        return lower_block(schedule, family, consts, kernel, step_waits, sites)
    return _Tile(schedule, family, consts, kernel, sites).lower()


def written_as_block(family: ir.Family) -> bool:
    """Whether a tile takes the block lowering (codegen/blocks.py) rather than the one-block one."""
    from tiledsl.codegen.blocks import exotic
    from tiledsl.codegen.products import products
    # the one-block lowering's TMA pipeline takes one product; a tile with more is a block (products.py)
    return bool(family.body) or any(exotic(s.value) for s in family.stores) or \
        sum(products(s.value) for s in family.stores) > 1


def _device_sized(statements) -> bool:
    """Whether a block's loop extent or named size reads a device value."""
    for s in statements:
        if isinstance(s, ir.SizeLet) and ir.device_values(s.value):
            return True
        if isinstance(s, ir.Loop) and (ir.device_values(s.extent) or _device_sized(s.body)):
            return True
    return False


class Lowering:
    """What the two lowerings of a tile to statements share (the one block here, a block tile's in
    blocks.py): the family and its consts, the names its values take (`fresh`, never one of `taken`),
    its launch-time blocks and the device values its regions read."""

    def __init__(self, schedule, family, consts, kernel, sites=None, taken: set[str] = frozenset()):
        from tiledsl.codegen.device import DeviceValues, Sites
        self.schedule, self.family, self.consts, self.k = schedule, family, consts, kernel
        self.names: set[str] = set(taken)
        self.blocks: list[tuple[str, sympy.Expr]] = []  # launch-time constexpr blocks: name, the size it covers
        self.sites = sites if sites is not None else Sites(schedule)
        self.values = DeviceValues(schedule, kernel, self.sites, self.fresh, consts)

    def fresh(self, hint: str) -> str:
        return value_name(hint, self.names)


class _Tile(Lowering):
    def __init__(self, schedule, family, consts, kernel, sites=None):
        super().__init__(schedule, family, consts, kernel, sites)
        self.axes: list[tuple[sympy.Expr, int | str]] = []
        self.product: Product | None = None

    def lower(self) -> TileBody:
        stores = self.family.stores
        if any(isinstance(s.value, ir.Route) for s in stores):
            from tiledsl.codegen.device import route_body
            return route_body(self)
        if len({tuple(s.shape) for s in stores}) != 1:
            raise LoweringError(f"tile '{self.family.name}': every store of a tile must have the same shape",
                                hint="one tile a shape: split the stores into tiles of their own")
        shape = stores[0].shape
        if len(shape) > 2:  # (none: a tile of one element, its loads and store scalars)
            raise LoweringError(f"tile '{self.family.name}': blocks of {len(shape)} dimensions are not supported",
                                hint="keep at most two ranges in the target; take points (`X[b, i*BM : +BM, :]`) "
                                     "in the others")
        self.axes = [self.axis(size, n) for n, size in enumerate(shape)]
        out: list[Statement] = []
        tma_target = None
        for n, store in enumerate(stores):
            if n:
                out.append(Barrier())  # the next store may read what this one just stored
            if self.copied_as_is(store):
                # a block stored as it was loaded: no float32 in between (half the registers for bf16:
                # the MoE pack tile's 8 x 2048 block in 64 of them, not 128), and nothing to round
                place = self.place(store.value.region, out)
                value = self.fresh(store.value.region.tensor)
                out.append(Load(value, place, native=True))
                out.append(Store(self.place(store.target, out), value))
                continue
            if self.copied_as_is(store, capped=True):
                # integers into a capped tensor of their type (MoE's counts): loaded as integers, not
                # through float32, which rounds above 2**24; the report below compares them with the cap
                place = self.place(store.value.region, out)
                value = self.fresh(store.value.region.tensor)
                out.append(Load(value, place, native=True))
            else:
                value = self.value(store.value, out)
            if self.product is not None and self.tma_store(store.target):
                *points, rows, cols = store.target.dims
                out.append(TmaStore(self.family.name, store.target.tensor, self.k(rows.start),
                                    self.k(cols.start), value, tuple(self.k(d.start) for d in points),
                                    (self.product.block_m, self.product.block_n)))
                tma_target = store.target.tensor
                continue
            place = self.place(store.target, out)
            if isinstance(value, Scalar):  # a constant stored: a block of it, the tile's shape
                value = full(value, tuple(block for _, block in self.axes), out, self.fresh)
            cap = self.schedule.tensors[store.target.tensor].cap
            if cap is not None:  # counts stored above their cap are reported (and stored as they are)
                from tiledsl.codegen.device import capacity_report
                out.append(capacity_report(self, place, value, cap))
            out.append(Store(place, rounded(self.schedule, store.target.tensor, value, out, self.fresh)))
        return TileBody(tuple(out), self.product, tma_target, tuple(self.blocks))

    def copied_as_is(self, store: ir.Store, capped: bool = False) -> bool:
        """A store of a plain load of a tensor of the target's own dtype, into a tensor without a cap; with
        `capped`, into an integer tensor with one (the load kept as integers, the cap still reported)."""
        value, tensors = store.value, self.schedule.tensors
        target = tensors[store.target.tensor]
        if not (isinstance(value, ir.Load) and self.product is None and
                tensors[value.region.tensor].dtype == target.dtype):
            return False
        if capped:
            return target.cap is not None and target.dtype.startswith(("int", "uint"))
        return target.cap is None

    def axis(self, size: sympy.Expr, n: int) -> tuple[sympy.Expr, int | str]:
        value = size.subs({ir.size_symbol(k): v for k, v in self.consts.items()})
        if value.is_Integer:
            return size, pow2_at_least(int(value))
        name = f"tds_BLOCK_{self.family.name}_{n}"
        self.blocks.append((name, size))
        return size, name

    def tma_store(self, target: ir.Region) -> bool:
        """A product's block goes out through a TMA descriptor when it is a local 2-D block of the whole
        tile and shared memory holds both the pipeline (2 stages at least) and the staging of the block."""
        if target.owner is not None or target.rows is not None or len(self.family.stores) != 1 \
                or not _points_then_block(target) or self.schedule.tensors[target.tensor].cap is not None:
            return False
        block_k = self.consts.get("BK", 64)
        return pipeline_stages(self.product.block_m, self.product.block_n, block_k, tma_store=True) >= 2

    def place(self, region: ir.Region, out: list | None = None) -> Place:
        """A region whose kept dimensions sit on the trailing axes of the tile's block (a dimension of
        size 1 against a longer axis broadcasts along it). A gathered region's rows take the axis before
        them; its point indices and owner are read from device values fetched into `out`."""
        tensor = self.schedule.tensors[region.tensor]
        kept = [d for d in region.dims if d.kept]
        gathered = region.rows is not None
        first = len(self.axes) - len(kept) - gathered
        if first < 0:
            raise LoweringError(f"'{region.tensor}' has more dimensions than the tile's block")
        rows = (len(self.axes), first, self.axes[first][1], region.rows) if gathered else (len(self.axes),)
        valid: list = []
        dims, axis = [], first + gathered
        for n, dim in enumerate(region.dims):
            if any(ir.device_values(e) for e in (dim.start, dim.size) if dim.kept):
                raise LoweringError(f"tile '{self.family.name}': a block's rows and columns are fixed; a tensor "
                                    "element may give a point index or a rank (clip rows with `upto`)")
            stride = self.k(sympy.Mul(*tensor.shape[n + 1:]))
            start = dim.start
            if not dim.kept and ir.device_values(start):
                start, conditions = self.values.index(start, tensor.shape[n], region.tensor, out, *rows)
                valid += conditions
            if not dim.kept or (dim.size == 1 and self.axes[axis][1] != 1):
                dims.append(Dim(self.k(start), stride, self.k(tensor.shape[n])))
                axis += dim.kept
                continue
            block = self.axes[axis][1]
            clip = None if _covers(block, dim.size, self.consts) else self.k(dim.size)
            dims.append(Dim(self.k(start), stride, self.k(tensor.shape[n]), axis, block, clip))
            axis += 1
        owner = None if region.owner is None else self.k(region.owner)
        if owner is not None and ir.device_values(owner):
            owner, conditions = self.values.index(region.owner, ir.WORLD, f"{region.tensor}@rank", out, *rows)
            valid += conditions
        return Place(region.tensor, owner, tuple(dims), len(self.axes), valid=tuple(valid))

    def value(self, value: ir.Value, out: list) -> Operand:
        if isinstance(value, ir.Scalar):
            number = value.value
            return Scalar(float(number) if isinstance(number, (int, float)) else self.k(number))
        if isinstance(value, ir.Load):
            place = self.place(value.region, out)
            name = self.fresh(value.region.tensor)
            out.append(Load(name, place))
            return name
        if isinstance(value, ir.MatMul):
            return self.matmul(value, out)
        if isinstance(value, ir.Reduce):
            name = self.fresh("sum")
            out.append(Zeros(name, tuple(block for _, block in self.axes)))
            body: list[Statement] = []
            term = self.value(value.body, body)
            body.append(Accumulate(name, term))
            out.append(Loop(value.var, self.k(value.extent), tuple(body)))
            return name
        args = tuple(self.value(a, out) for a in value.args)
        if value.func.startswith("cast:"):
            name = self.fresh("cast")
            out.append(Cast(name, value.func[5:], args[0]))
            return name
        function = FUNCTIONS[value.func]
        row = None
        if function.rows:
            if len(self.axes) != 2:
                raise LoweringError(f"{value.func} needs a 2-D block (rows, the whole row)")
            row = self.k(self.axes[1][0])
        name = self.fresh(value.func)
        out.append(Apply(name, value.func, args, row))
        return name

    def matmul(self, product: ir.MatMul, out: list) -> str:
        """The tile's one product: a tile with more is a block (`written_as_block`, codegen/products.py)."""
        left, right = product.left.region, product.right.region
        for region in (left, right):
            if region.owner is not None or region.rows is not None or not _points_then_block(region):
                raise LoweringError(f"'@' reads '{region.tensor}' through a TMA descriptor: it must be a local "
                                    "tensor, a block of its last two dimensions at points of the others",
                                    region.span, "write the tile as a block, which reads any region with pointers: "
                                    "`tile mm[...]:`, then on its own lines `a = A@owner[...]` and "
                                    "`C[...] = a @ B[...]`")
        k_left, k_right = left.dims[-1], right.dims[-2]
        whole = all(dim.start == 0 and dim.size == self.schedule.tensors[region.tensor].shape[n]
                    for dim, region, n in ((k_left, left, -1), (k_right, right, -2)))
        if not whole and (sympy.simplify(k_left.start - k_right.start) != 0 or
                          sympy.simplify(k_left.size - k_right.size) != 0):
            raise LoweringError(f"'@' contracts '{left.tensor}' and '{right.tensor}' over different ranges of K "
                                "(a split of K must take the same range from both)", product.left.region.span,
                                "slice K the same way in both operands: `A[.., k0 : +n] @ B[k0 : +n, ..]`")
        (_, block_m), (_, block_n) = self.axes
        if not isinstance(block_m, int) or not isinstance(block_n, int):
            raise LoweringError(f"tile '{self.family.name}': a product's block must be a const size (TMA)",
                                hint="give the target's ranges const sizes (`const BM = 128` and `+BM`)")
        # the K step: the program's BK, but never below what tl.dot takes on a GPU (seed 105: a
        # `const BK = 8` of another tile)
        smallest = smallest_dot_k(self.schedule.tensors[r.tensor].dtype for r in (left, right))
        block_k = 64 if "BK" not in self.consts else "BK" if int(self.consts["BK"]) >= smallest else smallest
        name = self.fresh("acc")
        self.product = Product(name, self.family.name, left.tensor, right.tensor, self.k(left.dims[-2].start),
                               self.k(right.dims[-1].start), self.k(left.dims[-1].size), block_m, block_n, block_k,
                               tuple(self.k(d.start) for d in left.dims[:-2]),
                               tuple(self.k(d.start) for d in right.dims[:-2]),
                               sympy.Integer(0) if whole else self.k(k_left.start), not whole,
                               ieee=all(self.schedule.tensors[r.tensor].dtype == "float32" for r in (left, right)))
        out.append(self.product)
        return name


def _points_then_block(region: ir.Region) -> bool:
    """Points in every dimension but the last two, ranges there, and no device value anywhere: a region
    a TMA descriptor reaches."""
    *points, rows, cols = region.dims if len(region.dims) >= 2 else (None, None)
    return rows is not None and rows.kept and cols.kept and not any(d.kept for d in points) and \
        not any(ir.device_values(e) for d in region.dims for e in (d.start, d.size))


def _covers(block: int | str, size: sympy.Expr, consts: dict[str, int]) -> bool:
    """Whether a block of `block` elements is exactly the region's size (no mask needed for it)."""
    value = size.subs({ir.size_symbol(k): v for k, v in consts.items()})
    return isinstance(block, int) and value.is_Integer and int(value) == block


# ---- chunks on SMs ---------------------------------------------------------------------------------

def chunk_body(schedule: ir.Schedule, family: ir.Family, kernel: Callable[[sympy.Expr], sympy.Expr],
               sites=None) -> tuple[Statement, ...]:
    """The copy (or put or get) of one chunk instance's part, after fetching the counts its sizes read."""
    from tiledsl.codegen.device import DeviceValues, Sites
    source, target = family.reads[0], family.writes[0]
    kept = [d for d in source.dims if d.kept]
    if not 1 <= len(kept) <= 2:
        raise LoweringError(f"chunk '{family.name}': regions of {len(kept)} kept dimensions are not supported")
    if any(ir.device_values(e) for r in (source, target) for e in (r.owner, *(d.start for d in r.dims))):
        raise LoweringError(f"chunk '{family.name}': only a chunk's sizes may read tensor elements")
    fetches: list[Statement] = []
    names: list[str] = []
    values = DeviceValues(schedule, kernel, sites if sites is not None else Sites(schedule),
                          lambda hint: names.append(f"tds_{hint}") or names[-1] + ("" if names.count(names[-1]) == 1
                                                                                   else str(names.count(names[-1]))),
                          {})
    rows = values.read(kernel(kept[0].size), fetches)
    cols = values.read(kernel(kept[1].size), fetches) if len(kept) == 2 else None
    return (*fetches, _chunk_statement(schedule, family, kernel, source, target, rows, cols))


def _chunk_statement(schedule, family, kernel, source, target, rows, cols) -> Statement:
    if family.engine.kind is ir.EngineKind.NVSHMEM:
        # a put or get moves whole rows of a size known at launch (`_rows_put` reads the region's sizes)
        if any(ir.device_values(d.size) for r in (source, target) for d in r.dims):
            raise LoweringError(f"chunk '{family.name}': an nvshmem put or get moves a fixed size")
        moved = kernel(_rows_put(schedule, family, source, target))
        width = cols if cols is not None else sympy.Integer(1)
        if not family.puts:
            return Get(family.name, source.tensor, kernel(_row_start(schedule, family, source)),
                       kernel(source.owner), target.tensor, kernel(_row_start(schedule, family, target)), moved,
                       width, family.split)
        owner = None if source.owner is None else kernel(source.owner)
        return Put(family.name, source.tensor, owner, kernel(_row_start(schedule, family, source)), target.tensor,
                   kernel(_row_start(schedule, family, target)), kernel(target.owner), moved, width, family.split)
    if cols is not None and _whole_rows(schedule, source) and _whole_rows(schedule, target):
        # Whole rows lie one after another in memory, in both places: one flat range of rows x cols
        # elements. In 64 x 256 blocks a copy of a few rows of 7168 (an MoE expert's rows at decode)
        # took 28 steps of mostly masked lanes, each a round trip to memory; flat, it takes 2.
        itemsize = max(DTYPES[schedule.tensors[r.tensor].dtype].torch.itemsize for r in (source, target))
        return Copy(_flat_place(schedule, source, kernel), _flat_place(schedule, target, kernel), rows * cols,
                    None, (min(BLOCK_FLAT_MOST, BLOCK_FLAT_BYTES // itemsize),), family.split,
                    family.reduce == "add")
    block = BLOCK_2D if cols is not None else (BLOCK_1D,)
    return Copy(_copy_place(schedule, source, kernel), _copy_place(schedule, target, kernel), rows, cols, block,
                family.split, family.reduce == "add")


def _whole_rows(schedule: ir.Schedule, region: ir.Region) -> bool:
    """The region's two kept dimensions are its tensor's last two and it takes every column: its rows
    are one contiguous range of the row-major tensor."""
    shape = schedule.tensors[region.tensor].shape
    kept = [n for n, d in enumerate(region.dims) if d.kept]
    if kept != [len(shape) - 2, len(shape) - 1]:
        return False
    cols = region.dims[-1]
    return cols.start == 0 and sympy.simplify(cols.size - shape[-1]) == 0


def _flat_place(schedule: ir.Schedule, region: ir.Region, kernel) -> Place:
    """A `_whole_rows` region as one axis: its rows x columns elements from the first row's start."""
    tensor = schedule.tensors[region.tensor]
    *points, rows = _copy_place(schedule, region, kernel).dims[:-1]
    width = kernel(tensor.shape[-1])
    flat = Dim(kernel(region.dims[-2].start) * width, sympy.Integer(1), kernel(tensor.shape[-2]) * width, 0)
    return Place(region.tensor, None if region.owner is None else kernel(region.owner), (*points, flat), 1)


def full(value: Scalar, blocks: tuple, out: list, fresh) -> str:
    """A constant about to be stored: a block of it (a Full), named."""
    name = fresh("full")
    out.append(Full(name, blocks, value))
    return name


def rounded(schedule: ir.Schedule, tensor: str, value: Operand, out: list, fresh) -> Operand:
    """A value about to be stored into `tensor`: into an fp8 tensor, rounded first (a Cast), since the
    store's own conversion rounds wrongly in Triton's interpreter (runtime/floatmath.py); a value the
    tile already cast to fp8 (`fp8(x / s)`) is not rounded twice."""
    if schedule.tensors[tensor].dtype != FP8 or isinstance(value, Scalar):
        return value
    if any(isinstance(s, Cast) and s.name == value and s.dtype == FP8 for s in out):
        return value
    name = fresh("fp8")
    out.append(Cast(name, FP8, value))
    return name


def _copy_place(schedule: ir.Schedule, region: ir.Region, kernel) -> Place:
    tensor = schedule.tensors[region.tensor]
    dims, axis = [], 0
    for n, dim in enumerate(region.dims):
        stride = kernel(sympy.Mul(*tensor.shape[n + 1:]))
        if dim.kept:
            dims.append(Dim(kernel(dim.start), stride, kernel(tensor.shape[n]), axis))
            axis += 1
        else:
            dims.append(Dim(kernel(dim.start), stride, kernel(tensor.shape[n])))
    return Place(region.tensor, None if region.owner is None else kernel(region.owner), tuple(dims), axis)


def _rows_put(schedule: ir.Schedule, family: ir.Family, source: ir.Region, target: ir.Region) -> sympy.Expr:
    """The rows a put or get moves: those of its first kept dimension that exist in both regions (a `+n` slice
    is clipped at the end of its dimension, as a copy's mask clips it), none where both lie past the end.
    Unclipped where the region provably ends inside the tensor at every instance."""
    from tiledsl.schedule.meaning import largest_value
    known = {**dict(family.indices), ir.RANK: ir.WORLD, ir.NODE: ir.NODES, ir.LOCAL_RANK: ir.LOCAL_WORLD}
    size = next(d.size for d in source.dims if d.kept)
    rows = size
    for region in (source, target):
        n, dim = next((n, d) for n, d in enumerate(region.dims) if d.kept)
        extent = schedule.tensors[region.tensor].shape[n]
        last = largest_value(dim.start, known) if dim.start.free_symbols & set(known) else dim.start
        if last is None or not sympy.simplify(extent - last - size).is_nonnegative:
            rows = sympy.Min(rows, sympy.Max(0, extent - dim.start))
    return rows


def _row_start(schedule: ir.Schedule, family: ir.Family, region: ir.Region) -> sympy.Expr:
    """An nvshmem put or get moves one contiguous range: whole rows of a row-major tensor, from here."""
    tensor = schedule.tensors[region.tensor]
    kept = [n for n, d in enumerate(region.dims) if d.kept]
    for n in kept[1:] + list(range(kept[-1] + 1, len(region.dims))):
        dim = region.dims[n]
        if dim.start != 0 or dim.size != tensor.shape[n]:
            raise LoweringError(f"chunk '{family.name}' on nvshmem must move whole rows of '{region.tensor}' "
                                "(a contiguous range)")
    return sum((d.start * sympy.Mul(*tensor.shape[n + 1:]) for n, d in enumerate(region.dims)), sympy.Integer(0))
