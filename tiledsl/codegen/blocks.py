"""Lowering of a tile written as a block (tile_body.py): values of several shapes, each a block of
its own ([BM, D] queries, [BN, D] keys, [BM, BN] scores, [BM, 1] row statistics), matrix products as
plain `tl.dot` on loaded blocks, the program's names kept as the kernel's, one loop whose carried
state is a Triton loop-carried value, and the waits of each step at the top of the step.

A value's block has a power of two per axis of at least 16 (what tl.dot takes), launch-time where
the size is known only at launch; where a block is larger than its size, the padding is masked out
of the two things that mix elements across an axis: a row reduction and a product's contraction."""
from __future__ import annotations

import dataclasses
import math

import sympy

from tiledsl.codegen import body as b
from tiledsl.runtime.specs import pow2_at_least
from tiledsl.schedule import ir
from tiledsl.schedule.values import value_shape
from tiledsl.tables import COMPARISONS, FLOAT_ONLY, FUNCTIONS, INTEGER_CLOSED, smallest_dot_k

MIN_BLOCK = 16  # tl.dot needs every dimension of its operands to be at least 16 (K 32 for 8-bit ones)
# fp32 elements of a tile's largest block that one warp holds: 64 registers a thread, which leaves
# the rest of the 255 for the other blocks of a step. More, and ptxas spills (seen: a [128, 128]
# accumulator on 4 warps, 255 registers and a 512-byte stack).
ELEMENTS_PER_WARP = 64 * 32
MIN_WARPS, MAX_WARPS = 4, 8
# A program's consts that choose how its block tiles are built (each 0 where the program does not say):
# TMA = 1 reads and writes every block a descriptor reaches through one (tds_desc_* kernel arguments,
# made by the launcher over the whole tensor); WS = 1 has Triton warp-specialize the loops that hold
# matrix products; WARPS sets the warps a program (else the largest block decides, see `warps`).
# TMA = 2 makes the descriptors on the device instead (tl.make_tensor_descriptor, once a program), as
# Triton's warp specialization on Hopper needs (with 4 warps: it adds the producer warps itself).
# A program may declare them (`const TMA = 1`) or be built with them (`tiledsl.compile(path, WS=1)`, TMA=0).
TMA, WS, WARPS = "TMA", "WS", "WARPS"
BUILD_OPTIONS = (TMA, WS, WARPS)
TMA_BOX = 256  # the most elements a TMA box takes along one dimension
# names the kernel template gives itself around a family's statements: never a statement's
TEMPLATE_NAMES = {"tds_t", "tds_inst", "tds_part", "tds_k", "tds_a", "tds_b", "tds_first", "tds_last", "tds_step",
                  "tds_r", "tds_c", "tds_r0", "tds_c0", "tds_block", "tds_inside", "tds_peer", "tds_pid",
                  "tds_epoch", "tds_program", "tds_programs", "tds_rank", "tds_wpart"}


def lower_block(schedule: ir.Schedule, family: ir.Family, consts: dict[str, int], kernel, step_waits,
                sites=None) -> b.TileBody:
    return _Block(schedule, family, consts, kernel, tuple(step_waits), sites).lower()


def exotic(value) -> bool:
    """A value only this lowering handles (the one-block tile lowering does not)."""
    if isinstance(value, (ir.Local, ir.Iota, ir.Transpose)):
        return True
    if isinstance(value, ir.MatMul):
        return not (isinstance(value.left, ir.Load) and isinstance(value.right, ir.Load))
    if isinstance(value, ir.Reduce):
        return value.op != "sum" or exotic(value.body)
    if isinstance(value, ir.Map):
        function = FUNCTIONS.get(value.func)
        return (function is not None and function.reduces) or value.func == "where" or \
            any(exotic(a) for a in value.args)
    return False


class _Block(b.Lowering):
    def __init__(self, schedule, family, consts, kernel, step_waits, sites=None):
        # the block's own names too (the user's, or products.py's accumulators): no value is named like them
        super().__init__(schedule, family, consts, kernel, sites, set(TEMPLATE_NAMES) |
                         {s.name for s in _all_lets(family.body)} | {s.var.name for s in _all_loops(family.body)})
        self.step_waits = step_waits
        # generated bodies, seed 172 (an fp8 product of K = 8): only the sm_90 compile refused a 16-wide K
        self.min_block = max(MIN_BLOCK, smallest_dot_k(schedule.tensors[t].dtype
                                                       for t in _product_operand_tensors(family)))
        self.block_of: dict = {}
        self.aranges: dict[tuple, str] = {}
        self.head: list = []                            # the aranges, first in the body
        self.dot_only = _dot_only_names(family)
        self.shapes: dict[str, tuple] = {}              # each name's shape where it was last bound
        self.dtypes: dict[str, str] = {}                # and its dtype
        self.descriptors: dict[tuple, str] = {}        # (tensor, block) -> its descriptor argument's name
        self.tma_loads = False                          # whether a load goes through a descriptor
        self.made: list = []                            # device-made descriptors for the next load or store
        self.notified = {e.producer for e in schedule.edges}  # families that signal their waiters

    # ---- names and blocks ---------------------------------------------------------------------------
    def block(self, size) -> int | str:
        """The block covering `size`: 1 for 1, else a power of two of at least `min_block`."""
        size = sympy.sympify(size)
        if size in self.block_of:
            return self.block_of[size]
        value = size.subs({ir.size_symbol(k): v for k, v in self.consts.items()})
        if value.is_Integer:
            found = 1 if int(value) == 1 else max(self.min_block, pow2_at_least(int(value)))
        else:
            found = f"tds_BLOCK_{self.family.name}_{len(self.blocks)}"
            self.blocks.append((found, sympy.Max(self.min_block, size)))
        self.block_of[size] = found
        return found

    def covers(self, size) -> bool:
        block = self.block(size)
        value = sympy.sympify(size).subs({ir.size_symbol(k): v for k, v in self.consts.items()})
        return isinstance(block, int) and value.is_Integer and int(value) == block

    def arange(self, size, axis: int, rank: int) -> str:
        """The arange along one axis of a block of `rank` axes, made once per tile."""
        if rank > 2:  # as the one-block lowering (body.py); seed 1626's where() over X[i*BN : +BN, j*4 : +4, :]
            # was lowered with a 2-D block's aranges, and only the sm_90 compile refused it
            raise b.LoweringError(f"tile '{self.family.name}': blocks of {rank} dimensions are not supported",
                                  hint="keep at most two ranges in each region; take points (`X[b, i*BM : +BM, :]`) "
                                       "in the others")
        block = self.block(size)
        key = (block, axis, rank)
        if key not in self.aranges:
            tag = str(block).removeprefix(f"tds_BLOCK_{self.family.name}_")
            kind = "e" if rank == 1 else "r" if axis == 0 else "c"
            name = f"tds_{kind}{tag}" if isinstance(block, int) else f"tds_{kind}_b{tag}"
            self.names.add(name)
            self.aranges[key] = name
            self.head.append(b.Arange(name, block, axis, rank))
        return self.aranges[key]

    # ---- statements ---------------------------------------------------------------------------------
    def lower(self) -> b.TileBody:
        out: list = []
        self.statements(self.family.body or self.family.stores, out)
        out = _hoisted(out)
        return b.TileBody(tuple(out), None, None, tuple(self.blocks), tuple(self.head), self.warps())

    def warps(self) -> int:
        """Enough warps that the largest named block known at build (an accumulator, say) takes at most
        ELEMENTS_PER_WARP elements a warp; blocks sized at launch do not count."""
        largest = 0
        for shape in self.shapes.values():
            sizes = [sympy.sympify(d).subs({ir.size_symbol(k): v for k, v in self.consts.items()}) for d in shape]
            if all(n.is_Integer for n in sizes):
                largest = max(largest, math.prod(1 if n == 1 else max(MIN_BLOCK, pow2_at_least(int(n))) for n in sizes))
        if self.consts.get(WARPS):
            return int(self.consts[WARPS])
        return min(MAX_WARPS, max(MIN_WARPS, pow2_at_least(math.ceil(largest / ELEMENTS_PER_WARP))))

    def shape(self, value) -> tuple:
        return value_shape(value, self.shapes)

    def statements(self, statements, out: list, depth: int = 0) -> None:
        """`depth` 0: the tile's own statements; 1: a step of its loop, whose waits it gets first."""
        for statement in statements:
            if isinstance(statement, ir.SizeLet):
                out.append(b.Assign(statement.symbol.name, b.Scalar(self.k(statement.value), integer=True)))
            elif isinstance(statement, ir.Let):
                self.value(statement.value, out, into=statement.name)
                self.shapes[statement.name] = statement.shape
                self.dtypes[statement.name] = statement.dtype
            elif isinstance(statement, ir.Loop):
                for carried in statement.carried:
                    # a scalar start broadcast to the loop's blocks, or a float carried from an integer
                    # start (`d = 0` or an i64 block, then `d = d * 0.5`): Triton keeps a carried value's
                    # first type, so it starts as float32 (generated bodies, seeds 242 and 134)
                    if (len(self.shapes.get(carried.name, ())) != len(carried.shape)
                            or (carried.start_dtype and carried.dtype.startswith(("float", "bfloat")))):
                        blocks = tuple(self.block(d) for d in carried.shape)
                        out.append(_started(out, carried.name, blocks))
                    self.shapes[carried.name] = carried.shape
                steps: list = []
                self.statements(statement.body, steps, depth + 1)
                waits = tuple(dataclasses.replace(w, inline=True) for w in self.step_waits) if depth == 0 else ()
                if waits:  # traced, the time a step spends in its waits is added to the instance's waiting
                    waits = (b.Record(b.STEP_WAIT_BEGINS),) + waits + (b.Record(b.STEP_WAIT_ENDS),)
                # a step's waits come after the size names its waits use, before anything it reads
                sizes = next((n for n, s in enumerate(statement.body) if not isinstance(s, ir.SizeLet)),
                             len(statement.body))
                if waits and self.tma_loads:  # the TMA loads below read what the waits acquired: another proxy
                    waits = waits + (b.Fence(),)
                steps[sizes:sizes] = waits
                extent = self.k(statement.extent)
                if extent == 1 and not waits:  # one step (a tile's one loop holding two): its statements
                    out.append(b.Assign(statement.var.name, b.Scalar(sympy.Integer(0), integer=True)))
                    out.extend(steps)
                else:
                    specialize = bool(self.consts.get(WS)) and not waits and _holds_dot(steps)
                    out.append(b.Loop(statement.var, extent, tuple(steps), 1 if waits else None, specialize))
                for carried in statement.carried:
                    self.shapes[carried.name] = carried.shape
                    self.dtypes[carried.name] = carried.dtype
            else:
                value = self.value(statement.value, out)
                shape = self.shape(statement.value)
                if isinstance(value, b.Scalar):  # a constant stored: a block of it, the region's shape
                    shape = statement.target.shape
                    value = b.full(value, tuple(self.block(d) for d in shape), out, self.fresh)
                described = self.descriptor(statement.target, shape, store=True)
                if described is not None:
                    name, at, block, _ = described
                    out.extend(self.made)
                    self.made.clear()
                    value = b.rounded(self.schedule, statement.target.tensor, value, out, self.fresh)
                    out.append(b.DescStore(name, statement.target.tensor, at, block, value))
                    continue
                place = self.place(statement.target, shape, out)
                cap = self.schedule.tensors[statement.target.tensor].cap
                if cap is not None:  # counts stored above their cap are reported (and stored as they are)
                    from tiledsl.codegen.device import capacity_report
                    out.append(capacity_report(self, place, value, cap))
                out.append(b.Store(place, b.rounded(self.schedule, statement.target.tensor, value, out, self.fresh)))

    # ---- values -------------------------------------------------------------------------------------
    def value(self, value: ir.Value, out: list, into: str | None = None) -> b.Operand:
        """Lower `value` into statements; its operand (a name, or a scalar). With `into`, the value ends
        up under that name."""
        operand = self._value(value, out, into)
        if into is not None and operand != into:
            out.append(b.Assign(into, operand))
            return into
        return operand

    def _value(self, value, out, into):
        folded = self.fold(value)
        if folded is not None:
            return b.Scalar(folded)
        if isinstance(value, ir.Scalar):
            if isinstance(value.value, float):
                return b.Scalar(value.value)
            return b.Scalar(self.k(sympy.sympify(value.value)), integer=True)
        if isinstance(value, ir.Local):
            return value.name
        if isinstance(value, ir.Iota):
            return self.arange(value.size, value.axis, 2)
        if isinstance(value, ir.Load):
            native = into in self.dot_only or not self.floating(value.region.tensor)
            return self.load(value, native, out, into)
        if isinstance(value, ir.Transpose):
            inner = self.value(value.value, out)
            name = into or self.fresh("trans")
            out.append(b.Trans(name, inner))
            return name
        if isinstance(value, ir.MatMul):
            return self.dot(value, out, into)
        if isinstance(value, ir.Reduce):
            return self.reduce(value, out, into)
        return self.apply(value, out, into)

    def floating(self, tensor: str) -> bool:
        return self.schedule.tensors[tensor].dtype.startswith(("float", "bfloat"))

    def load(self, value: ir.Load, native: bool, out: list, into: str | None) -> str:
        shape = value.region.shape
        name = into or self.fresh(value.region.tensor)
        described = self.descriptor(value.region, shape)
        if described is not None:
            descriptor, at, block, blocks = described
            self.tma_loads = True
            out.extend(self.made)
            self.made.clear()
            out.append(b.DescLoad(name, descriptor, value.region.tensor, at, block, blocks, native))
            return name
        out.append(b.Load(name, self.place(value.region, shape, out), native))
        return name

    def descriptor(self, region: ir.Region, shape, store: bool = False):
        """Where the program asks for TMA (const TMA) and a descriptor reaches the region: the
        descriptor's name, the block's start in each dimension, the block (1 at a point) and the
        value's blocks; else None. A descriptor reaches a local region without gathered rows or
        device values whose kept dimensions are exactly their blocks (a block larger than its
        region would read the next elements, not zeros), its last dimension kept and at least 16
        bytes, every block within a TMA box; a store also needs no notify after it (a TMA store
        completes asynchronously) and no cap to check."""
        if not self.consts.get(TMA) or region.owner is not None or region.rows is not None:
            return None
        tensor = self.schedule.tensors[region.tensor]
        if not 2 <= len(region.dims) <= 5 or not self.floating(region.tensor) or not region.dims[-1].kept:
            return None
        if store and (tensor.cap is not None or self.family.name in self.notified):
            return None
        if any(ir.device_values(e) for d in region.dims for e in (d.start, d.size)):
            return None
        block = []
        for dim in region.dims:
            if not dim.kept:
                block.append(1)
                continue
            if not self.covers(dim.size):
                return None
            size = self.block(dim.size)
            if size > TMA_BOX:
                return None
            block.append(size)
        from tiledsl.tables import DTYPES
        if block[-1] * DTYPES[tensor.dtype].torch.itemsize < 16:
            return None
        blocks = tuple(self.block(d) for d in (shape or ()))
        if math.prod(blocks) != math.prod(block):
            return None
        strides = tuple(self.k(sympy.Mul(*tensor.shape[n + 1:])) for n in range(len(tensor.shape)))
        kept = [n for n, d in enumerate(region.dims) if d.kept]
        if int(self.consts[TMA]) == 2 and len(kept) == 2:
            # made on the device, 2-D over the kept dimensions at the region's points: a descriptor of more
            # dimensions, its block reshaped, fails Triton 3.6's warp specialization on Hopper (its data
            # partition meets the reshape). Made where its points are known (hoisted out of the loops later).
            offset = sum((self.k(d.start) * strides[n] for n, d in enumerate(region.dims) if not d.kept),
                         sympy.Integer(0))
            key = (region.tensor, tuple(block), offset)
            if key not in self.descriptors:
                name = f"tds_desc_{self.family.name}_{region.tensor}{len(self.descriptors) + 1}"
                self.descriptors[key] = name
            name = self.descriptors[key]
            self.made.append(b.MakeDescriptor(name, region.tensor, tuple(self.k(tensor.shape[n]) for n in kept),
                                              tuple(strides[n] for n in kept), tuple(block[n] for n in kept),
                                              offset))
            return name, tuple(self.k(region.dims[n].start) for n in kept), tuple(block[n] for n in kept), blocks
        key = (region.tensor, tuple(block))
        if key not in self.descriptors:
            taken = sum(1 for k in self.descriptors if k[0] == region.tensor)
            name = f"tds_desc_{self.family.name}_{region.tensor}" + (f"_{taken + 1}" if taken else "")
            self.descriptors[key] = name
            if int(self.consts[TMA]) == 2:  # made on the device, once a program
                self.head.append(b.MakeDescriptor(name, region.tensor, tuple(self.k(d) for d in tensor.shape),
                                                  strides, tuple(block)))
        at = tuple(self.k(d.start) for d in region.dims)
        return self.descriptors[key], at, tuple(block), blocks

    def integral(self, value) -> bool:
        """Whether the kernel holds `value` as integers: a load of an integer tensor (loaded as it is), a
        name bound to one, integer-closed arithmetic or a where() of such."""
        if isinstance(value, ir.Load):
            return not self.floating(value.region.tensor)
        if isinstance(value, ir.Local):
            return self.dtypes.get(value.name, "float32").startswith(("int", "uint"))
        if isinstance(value, ir.Map) and (value.func in INTEGER_CLOSED or value.func == "where"):
            args = value.args[1:] if value.func == "where" else value.args
            return all(self.integral(a) or isinstance(a, ir.Scalar) and isinstance(a.value, int) for a in args) \
                and any(not isinstance(a, ir.Scalar) for a in args)
        return False

    def apply(self, value: ir.Map, out: list, into: str | None) -> b.Operand:
        args = [self.value(a, out) for a in value.args]
        if value.func.startswith("cast:"):
            name = into or self.fresh("cast")
            out.append(b.Cast(name, value.func[5:], args[0]))
            return name
        function = FUNCTIONS[value.func]
        if value.func not in INTEGER_CLOSED + COMPARISONS + ("where",):
            # a size kept an integer (for index arithmetic) enters float32 math here: tl.math.sqrt_rn and
            # div_rn take fp32 operands only (`x / sqrt(D)`, `rowsum(x) / D`)
            args = [b.Scalar(a.value) if isinstance(a, b.Scalar) and a.integer else a for a in args]
        if value.func in FLOAT_ONLY:  # generated bodies, seeds 209 and 211: `i8 / f32` failed the sm_90 compile
            for n, arg in enumerate(value.args):
                if self.integral(arg) and not isinstance(args[n], b.Scalar):
                    name = self.fresh("float")
                    out.append(b.Cast(name, "float32", args[n]))
                    args[n] = name
        row = None
        if function.rows:  # the length of the row it normalises over: the operand's last axis
            width = self.shape(value.args[0])[1]
            row = self.k(width)
            if not self.covers(width):  # padding past the row must add nothing to the sum of squares
                masked = self.fresh("masked")
                out.append(b.Mask(masked, args[0], self.arange(width, 1, 2), self.k(width), 0.0))
                args = [masked, *args[1:]]
        if function.reduces:
            width = self.shape(value.args[0])[1]
            if not self.covers(width):
                masked = self.fresh("masked")
                out.append(b.Mask(masked, args[0], self.arange(width, 1, 2), self.k(width), function.identity))
                args = [masked]
        name = into or self.fresh(value.func)
        out.append(b.Apply(name, value.func, tuple(args), row))
        return name

    def dot(self, value: ir.MatMul, out: list, into: str | None) -> str:
        sides = []
        for side in (value.left, value.right):
            operand, cast = self.dot_operand(side, out)
            sides.append((operand, cast))
        (left, left_cast), (right, right_cast) = sides
        like = _tensor_of(value.left) or _tensor_of(value.right)
        convert_left = like if left_cast and like else None
        convert_right = like if right_cast and like else None
        contraction = self.shape(value.left)[1]
        if not self.covers(contraction):
            masked = self.fresh("masked")
            out.append(b.Mask(masked, left, self.arange(contraction, 1, 2), self.k(contraction), 0.0))
            left = masked
        name = into or self.fresh("dot")
        ieee = self.operand_dtype(value.left, left_cast, convert_left) == "float32" == \
            self.operand_dtype(value.right, right_cast, convert_right)
        out.append(b.Dot(name, left, right, convert_left, convert_right, ieee))
        return name

    def operand_dtype(self, side, computed: bool, converted_to: str | None) -> str:
        """The element type of a product's operand in the kernel: a loaded one's tensor's, a computed block
        float32 unless it is converted to a tensor's type (`dot_operand`)."""
        tensors = self.schedule.tensors
        if computed:
            return tensors[converted_to].dtype if converted_to else "float32"
        if isinstance(side, ir.Local):  # a dot-only name: bound to loads only
            loaded = {tensors[s.value.region.tensor].dtype for s in _all_lets(self.family.body)
                      if s.name == side.name and isinstance(s.value, ir.Load)}
            return loaded.pop() if len(loaded) == 1 else ""
        return tensors[_tensor_of(side)].dtype

    def dot_operand(self, value, out: list) -> tuple[b.Operand, bool]:
        """A product's operand, and whether it is computed (to be converted to the loaded operand's type)."""
        if isinstance(value, ir.Load):
            return self.load(value, True, out, None), False
        if isinstance(value, ir.Transpose) and isinstance(value.value, ir.Load):
            inner = self.load(value.value, True, out, None)
            name = self.fresh("trans")
            out.append(b.Trans(name, inner))
            return name, False
        if isinstance(value, ir.Local) and value.name in self.dot_only:
            return value.name, False
        return self.value(value, out), True

    def reduce(self, value: ir.Reduce, out: list, into: str | None) -> str:
        name = self.fresh("max" if value.op == "max" else "sum")
        blocks = tuple(self.block(d) for d in self.shape(value))
        if value.op == "max":
            out.append(b.Full(name, blocks, b.Scalar(float("-inf"))))
        else:
            out.append(b.Zeros(name, blocks))
        inner: list = []
        term = self.value(value.body, inner)
        inner.append(b.Accumulate(name, term, value.op))
        out.append(b.Loop(value.var, self.k(value.extent), tuple(inner)))
        if into is not None:
            out.append(b.Assign(into, name))
            return into
        return name

    def fold(self, value) -> float | None:
        """A value of numbers and const sizes only, computed now: `1.4426950408889634 / sqrt(D)`."""
        if isinstance(value, ir.Scalar):
            number = sympy.sympify(value.value).subs({ir.size_symbol(k): v for k, v in self.consts.items()})
            return float(number) if number.is_number and not isinstance(value.value, float) and \
                not number.is_Integer else None
        if not isinstance(value, ir.Map) or value.func.startswith("cast:") or value.func not in FUNCTIONS:
            return None
        if FUNCTIONS[value.func].reduces or value.func in ("where", "rmsnorm"):
            return None
        numbers = []
        for arg in value.args:
            if isinstance(arg, ir.Scalar):
                number = sympy.sympify(arg.value).subs({ir.size_symbol(k): v for k, v in self.consts.items()})
                if not number.is_number:
                    return None
                numbers.append(float(number))
            else:
                inner = self.fold(arg)
                if inner is None:
                    return None
                numbers.append(inner)
        import torch
        result = FUNCTIONS[value.func].torch(*(torch.tensor(n, dtype=torch.float64) for n in numbers))
        number = float(result)
        return number if math.isfinite(number) or math.isinf(number) else None

    # ---- places -------------------------------------------------------------------------------------
    def place(self, region: ir.Region, shape, out: list) -> b.Place:
        """A region as a block of `shape`: each kept dimension of size other than 1 along the next axis
        of the value not of size 1 (a [BM, 1] statistic stores into a region of shape [BM]). A gathered
        region's rows are the block's first axis; its point indices and owner are device values, fetched
        into `out` one per row, and a row whose index is missing or out of range is no row."""
        tensor = self.schedule.tensors[region.tensor]
        shape = tuple(shape or ())
        rank = len(shape)
        names = tuple("" if self.block(size) == 1 else self.arange(size, axis, rank) for axis, size in enumerate(shape))
        rows: tuple = (rank,)
        if region.rows is not None:
            rows = (rank, 0, self.block(shape[0]), region.rows)
        values = self.values
        values.names = names
        dims, axis, valid = [], len(rows) > 1, []
        for n, dim in enumerate(region.dims):
            if dim.kept and any(ir.device_values(e) for e in (dim.start, dim.size)):
                raise b.LoweringError(f"tile '{self.family.name}': a block's rows and columns are fixed; a tensor "
                                      "element may give a point index or a rank (clip rows with `upto`)")
            stride = self.k(sympy.Mul(*tensor.shape[n + 1:]))
            bound = self.k(tensor.shape[n])
            start = dim.start
            if not dim.kept and ir.device_values(start):
                start, conditions = values.index(start, tensor.shape[n], region.tensor, out, *rows)
                valid += conditions
            if not dim.kept or dim.size == 1:
                if dim.kept and axis < rank and shape[axis] == 1:
                    axis += 1
                dims.append(b.Dim(self.k(start), stride, bound))
                continue
            while axis < rank and shape[axis] == 1:
                axis += 1
            block = self.block(shape[axis])
            clip = None if self.covers(dim.size) and self.block(dim.size) == block else self.k(dim.size)
            dims.append(b.Dim(self.k(start), stride, bound, axis, block, clip))
            axis += 1
        owner = None if region.owner is None else self.k(region.owner)
        if owner is not None and ir.device_values(owner):
            owner, conditions = values.index(region.owner, ir.WORLD, f"{region.tensor}@rank", out, *rows)
            valid += conditions
        return b.Place(region.tensor, owner, tuple(dims), rank, names, tuple(valid))


def _started(out: list, name: str, blocks: tuple) -> b.Statement:
    """A carried value's block from its scalar start. Where the start is a number bound just above
    (`l = 0`, among other starts), that binding is the block itself: `l = tl.zeros(...)`, not `l = 0`
    and then `l = tl.zeros(...) + l`."""
    for n in range(len(out) - 1, -1, -1):
        s = out[n]
        if isinstance(s, b.Assign) and s.name == name and isinstance(s.value, b.Scalar) \
                and isinstance(s.value.value, (int, float, sympy.Number)):
            del out[n]
            return b.Zeros(name, blocks) if s.value.value == 0 else b.Full(name, blocks, s.value)
        if not (isinstance(s, (b.Assign, b.Full, b.Zeros)) and s.name != name
                and (isinstance(s, b.Zeros) or isinstance(s.value, b.Scalar))):
            break  # a statement that might read the scalar start: the block is made after it
    return b.Full(name, blocks, name)


def _hoisted(statements: list) -> list:
    """Device-made descriptors moved out of every loop whose steps they do not depend on (its variable,
    the names its steps bind), so that each is made once where its points are known; one made twice in
    a statement list (the same tensor at the same points, read by two loops) is made once."""
    out: list = []
    for s in statements:
        if isinstance(s, b.Loop):
            body = _hoisted(list(s.body))
            bound = {s.var.name} | {x.name for x in body if isinstance(x, b.Assign)}
            inner, lifted = [], []
            for x in body:
                free = set()
                if isinstance(x, b.MakeDescriptor):
                    free = {sym.name for e in (x.offset, *x.shape, *x.strides)
                            for sym in sympy.sympify(e).free_symbols}
                (lifted if isinstance(x, b.MakeDescriptor) and not free & bound else inner).append(x)
            out += [x for n, x in enumerate(lifted) if x not in out and x not in lifted[:n]]
            s = dataclasses.replace(s, body=tuple(inner))
        if isinstance(s, b.MakeDescriptor) and any(isinstance(x, b.MakeDescriptor) and x == s for x in out):
            continue
        out.append(s)
    return out


def _holds_dot(statements) -> bool:
    """Whether a loop's step holds a matrix product of its own (not only in a loop inside it)."""
    return any(isinstance(s, b.Dot) for s in statements)


def _dot_only_names(family: ir.Family) -> set[str]:
    """Names bound to a loaded slice that only products read (directly or transposed): loaded in the
    tensor's own dtype, as tl.dot wants them; anything else reads float32."""
    loaded, uses = set(), {}

    def walk(value, in_dot: bool):
        if isinstance(value, ir.Local):
            uses.setdefault(value.name, []).append(in_dot)
        elif isinstance(value, ir.MatMul):
            walk(value.left, True)
            walk(value.right, True)
        elif isinstance(value, ir.Transpose):
            walk(value.value, in_dot)
        elif isinstance(value, ir.Map):
            for a in value.args:
                walk(a, False)
        elif isinstance(value, ir.Reduce):
            walk(value.body, False)

    def statements(items):
        for s in items:
            if isinstance(s, ir.Let):
                if isinstance(s.value, ir.Load):
                    loaded.add(s.name)
                walk(s.value, False)
            elif isinstance(s, ir.Loop):
                statements(s.body)
            else:
                walk(s.value, False)
    statements(family.body)
    rebound = {s.name for s in _all_lets(family.body) if not isinstance(s.value, ir.Load)}
    return {n for n in loaded - rebound if uses.get(n) and all(uses[n])}


def _all_lets(items):
    for s in items:
        if isinstance(s, ir.Let):
            yield s
        elif isinstance(s, ir.Loop):
            yield from _all_lets(s.body)


def _all_loops(items):
    for s in items:
        if isinstance(s, ir.Loop):
            yield s
            yield from _all_loops(s.body)


def _product_operand_tensors(family: ir.Family) -> set[str]:
    """The tensors a family's products read their operands from (loaded directly, transposed, or
    through a name bound to a load)."""
    loads = {}
    for s in _all_lets(family.body):
        if isinstance(s.value, ir.Load):
            loads.setdefault(s.name, set()).add(s.value.region.tensor)
    found: set[str] = set()

    def walk(node):
        if isinstance(node, ir.MatMul):
            for side in (node.left, node.right):
                tensor = _tensor_of(side)
                found.update({tensor} if tensor else loads.get(getattr(side, "name", None), set()))
        if dataclasses.is_dataclass(node):
            for f in dataclasses.fields(node):
                child = getattr(node, f.name)
                for item in child if isinstance(child, tuple) else (child,):
                    if dataclasses.is_dataclass(item):
                        walk(item)
    for statement in family.body:
        walk(statement)
    return found


def _tensor_of(value) -> str | None:
    """The tensor a product's operand was loaded from, if it was."""
    if isinstance(value, ir.Transpose):
        return _tensor_of(value.value)
    if isinstance(value, ir.Load):
        return value.region.tensor
    return None
