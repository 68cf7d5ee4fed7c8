"""Tile bodies to Triton statements: the blocks a tile loads, the math it does and what it stores.

A tile instance works on one block whose axes are the kept dimensions of its target region. Loads
broadcast from the trailing axes (a bias row [BN] against a [BM, BN] block). Values are computed in
float32 and cast to the target's dtype only when stored. The statements are plain text lines that the
kernel template places inside the family's loop; every choice about them is made here."""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from tiledsl.schedule.intcode import code
# the launcher's own rules, so that generated code and launcher agree on block sizes and shared memory
from tiledsl.runtime.specs import pipeline_stages, pow2_at_least
from tiledsl.schedule import ir

ACTIVATIONS = {
    "relu": "tl.maximum({0}, 0.0)",
    "sigmoid": "tl.sigmoid({0})",
    "silu": "({0} * tl.sigmoid({0}))",
    # torch's default (erf) gelu, so that results match torch.nn.functional.gelu
    "gelu": "(0.5 * {0} * (1.0 + tl.math.erf({0} * 0.7071067811865476)))",
    "tanh": "(2.0 * tl.sigmoid(2.0 * {0}) - 1.0)",
    "exp": "tl.exp({0})",
    "abs": "tl.abs({0})",
    "sqrt": "tl.sqrt({0})",
    "rsqrt": "tl.rsqrt({0})",
    "neg": "(-{0})",
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "div": "({0} / {1})",
    "max": "tl.maximum({0}, {1})",
    "min": "tl.minimum({0}, {1})",
}
TL_DTYPES = {"bfloat16": "tl.bfloat16", "float16": "tl.float16", "float32": "tl.float32",
             "float64": "tl.float64", "int32": "tl.int32", "int64": "tl.int64", "int8": "tl.int8",
             "uint8": "tl.uint8"}


class LoweringError(Exception):
    """The schedule is valid but uses something code generation does not support yet."""


@dataclass
class Axis:
    """One axis of a tile's block: its size in elements and the power-of-two block that covers it."""
    size: sympy.Expr
    block: str  # a constexpr name or a literal power of two


@dataclass
class TileCode:
    lines: list[str] = field(default_factory=list)
    matmul: dict | None = None         # descriptor loads for the product, filled when the tile has one
    constexpr_blocks: dict[str, sympy.Expr] = field(default_factory=dict)  # launch-time block sizes


class TileLowering:
    """Lowers one tile family's stores to kernel statements."""

    def __init__(self, schedule: ir.Schedule, family: ir.Family, consts: dict[str, int]):
        self.schedule = schedule
        self.family = family
        self.consts = consts
        self.out = TileCode()
        self.counter = 0
        self.axes: list[Axis] = []

    def fresh(self) -> str:
        self.counter += 1
        return f"tds_v{self.counter}"

    def lower(self) -> TileCode:
        shapes = {tuple(s.shape) for s in self.family.stores}
        if len(shapes) != 1:
            raise LoweringError(f"tile '{self.family.name}': every store of a tile must have the same shape")
        shape = self.family.stores[0].shape
        if not 1 <= len(shape) <= 2:
            raise LoweringError(f"tile '{self.family.name}': blocks of {len(shape)} dimensions are not supported")
        self.axes = [self.axis(size, n) for n, size in enumerate(shape)]
        for n, store in enumerate(self.family.stores):
            if n:
                # the next store may read what this instance just stored: make it visible to every thread
                self.out.lines.append("tl.debug_barrier()")
            value = self.value(store.value, self.out.lines, "")
            target = self.tensor_base(store.target)
            if self.out.matmul is not None and self.tma_store(store.target):
                # a TMA store clips at the tensor's edge by itself and frees the registers that a
                # [BM, BN] block of pointers would take
                dims = store.target.dims
                self.out.matmul["target"] = target
                self.out.lines.append(f"tds_desc_{self.family.name}_c.store([{code(dims[0].start)}, {code(dims[1].start)}], "
                                      f"{value}.to({target}.dtype.element_ty))")
                continue
            ptr, mask = self.pointer(store.target, len(self.axes), "")
            self.out.lines.append(f"tl.store({ptr}, {value}.to({target}.dtype.element_ty), mask={mask})")
        return self.out

    def tma_store(self, target: ir.Region) -> bool:
        """A product's block goes out through a TMA descriptor when it is a local 2-D block of the whole
        tile and shared memory holds both the pipeline (2 stages at least) and the staging of the block."""
        tensor = self.schedule.tensors[target.tensor]
        matmul = self.out.matmul
        if target.owner is not None or len(tensor.shape) != 2 or not all(d.kept for d in target.dims) \
                or len(self.family.stores) != 1:
            return False
        bm, bn = int(matmul["block_m"]), int(matmul["block_n"])
        bk = self.consts.get("BK", 64)
        return pipeline_stages(bm, bn, bk, tma_store=True) >= 2

    def axis(self, size: sympy.Expr, n: int) -> Axis:
        value = size.subs({sympy.Symbol(k, integer=True, positive=True): v for k, v in self.consts.items()})
        if value.is_Integer:
            return Axis(size, str(pow2_at_least(int(value))))
        name = f"tds_BLOCK_{self.family.name}_{n}"
        self.out.constexpr_blocks[name] = size
        return Axis(size, name)

    # ---- addressing -----------------------------------------------------------------------------
    def tensor_base(self, region: ir.Region) -> str:
        return region.tensor

    def pointer(self, region: ir.Region, naxes: int, loopvar: str) -> tuple[str, str]:
        """(pointer block, mask block) for a region whose kept dims sit on the trailing block axes."""
        tensor = self.schedule.tensors[region.tensor]
        kept = [d for d in region.dims if d.kept]
        first_axis = naxes - len(kept)
        if first_axis < 0:
            raise LoweringError(f"'{region.tensor}' has more dimensions than the tile's block")
        base = region.tensor
        if region.owner is not None:
            base = f"({region.tensor} + tl.load(tds_peers_{region.tensor} + {code(region.owner)}))"
        offsets, masks = [], []
        axis = first_axis
        for n, dim in enumerate(region.dims):
            stride = code(sympy.Mul(*tensor.shape[n + 1:])) if n + 1 < len(tensor.shape) else "1"
            if not dim.kept:
                offsets.append(f"({code(dim.start)}) * {stride}")
                continue
            block = self.axes[axis].block
            arange = f"tl.arange(0, {block})" + _expand(axis, naxes)
            index = f"({code(dim.start)} + {arange})"
            offsets.append(f"{index} * {stride}")
            masks.append(f"({arange} < {code(dim.size)}) & ({index} < {code(tensor.shape[n])})")
            axis += 1
        return f"{base} + " + " + ".join(offsets), " & ".join(masks) if masks else "True"

    # ---- values ---------------------------------------------------------------------------------
    def value(self, value: ir.Value, lines: list[str], indent: str) -> str:
        if isinstance(value, ir.Scalar):
            return repr(float(value.value)) if isinstance(value.value, (int, float)) else \
                f"({code(value.value)}).to(tl.float32)"
        if isinstance(value, ir.Load):
            ptr, mask = self.pointer(value.region, len(self.axes), "")
            name = self.fresh()
            lines.append(f"{indent}{name} = tl.load({ptr}, mask={mask}, other=0.0).to(tl.float32)")
            return name
        if isinstance(value, ir.MatMul):
            return self.matmul(value, lines, indent)
        if isinstance(value, ir.Reduce):
            name = self.fresh()
            shape = ", ".join(a.block for a in self.axes)
            lines.append(f"{indent}{name} = tl.zeros([{shape}], tl.float32)")
            lines.append(f"{indent}for {value.var.name} in range(0, {code(value.extent)}):")
            body = self.value(value.body, lines, indent + "    ")
            lines.append(f"{indent}    {name} += {body}")
            return name
        if isinstance(value, ir.Map):
            args = [self.value(a, lines, indent) for a in value.args]
            if value.func.startswith("cast:"):
                dtype = TL_DTYPES[value.func[5:]]
                return f"{args[0]}.to({dtype}).to(tl.float32)"
            if value.func == "rmsnorm":
                return self.rmsnorm(args, lines, indent)
            name = self.fresh()
            lines.append(f"{indent}{name} = {ACTIVATIONS[value.func].format(*args)}")
            return name
        raise LoweringError(f"cannot lower {value!r}")

    def rmsnorm(self, args, lines, indent) -> str:
        if len(self.axes) != 2:
            raise LoweringError("rmsnorm needs a 2-D block (rows, the whole row)")
        x, w = args[0], args[1]
        eps = args[2] if len(args) > 2 else "1e-6"
        size = code(self.axes[1].size)
        name = self.fresh()
        lines.append(f"{indent}{name} = tl.sum({x} * {x}, axis=1) / {size}")
        lines.append(f"{indent}{name} = {x} * tl.rsqrt({name} + {eps})[:, None] * {w}")
        return name

    def matmul(self, product: ir.MatMul, lines, indent) -> str:
        if self.out.matmul is not None:
            raise LoweringError("a tile may hold one matrix product")
        left, right = product.left.region, product.right.region
        for region in (left, right):
            tensor = self.schedule.tensors[region.tensor]
            if region.owner is not None or len(tensor.shape) != 2:
                raise LoweringError(f"'@' reads '{region.tensor}' through a TMA descriptor: it must be a local "
                                    "2-D tensor")
        k_left, k_right = left.dims[1], right.dims[0]
        for dim, tensor in ((k_left, left.tensor), (k_right, right.tensor)):
            extent = self.schedule.tensors[tensor].shape[1 if tensor == left.tensor else 0]
            if dim.start != 0 or dim.size != extent:
                raise LoweringError(f"'@' must contract over the whole of '{tensor}' (sub-ranges of K are not "
                                    "supported yet)")
        block_k = self.consts.get("BK", 64)
        self.out.matmul = {
            "left": left.tensor, "right": right.tensor,
            "row": code(left.dims[0].start), "col": code(right.dims[1].start),
            "k": code(k_left.size), "block_m": self.axes[0].block, "block_n": self.axes[1].block,
            "block_k": "BK" if "BK" in self.consts else str(block_k), "target": None,
        }
        return "tds_acc"


def _expand(axis: int, naxes: int) -> str:
    if naxes == 1:
        return ""
    return "[:, None]" if axis == 0 else "[None, :]"
