"""Tiles that hold several matrix products (`H = silu(X @ Wg) * (X @ Wu)`, SwiGLU's gate and up).

The one-block lowering's pipeline (body.py) streams one product's K through TMA; a tile with more is
lowered as a block (blocks.py). Written as it stands, a block loads each operand whole along K, which
for a model's K (4096) is more than a program's registers and shared memory hold. So such a tile is
rewritten here into the block a user would write, one K loop carrying an accumulator per product:

    acc0 = 0; acc1 = 0
    for k in cdiv(K, BK):
        acc0 = acc0 + X[rows, k*BK : +BK] @ Wg[k*BK : +BK, cols]
        acc1 = acc1 + X[rows, k*BK : +BK] @ Wu[k*BK : +BK, cols]
    H[...] = silu(acc0) * acc1

Only products that contract a whole dimension of both operands (`X[.., :] @ W[:, ..]`) are split: the
loads past K are masked to zero at the tensor's bound, so the last, partial step adds nothing extra.
The rewrite is code generation's alone: the checker and the reference read the tile as written, the
same sums in another order. Products the rewrite does not reach are lowered as written.
"""
from __future__ import annotations

import dataclasses

import sympy

from tiledsl.codegen.names import value_name
from tiledsl.schedule import ir

DEFAULT_BLOCK_K = 64  # as the one-block lowering's K step (body.py) where the program names no BK


def products(value) -> int:
    """How many matrix products a value holds."""
    if isinstance(value, ir.MatMul):
        return 1 + products(value.left) + products(value.right)
    if isinstance(value, ir.Reduce):
        return products(value.body)
    if isinstance(value, ir.Map):
        return sum(products(a) for a in value.args)
    if isinstance(value, ir.Transpose):
        return products(value.value)
    return 0


def split_k(schedule: ir.Schedule, family: ir.Family, consts: dict[str, int], taken: set[str]) -> ir.Family:
    """`family` (a tile of stores only) with its whole-K products accumulated over one loop of K steps,
    as a block; unchanged where no product contracts a whole dimension of plain loads. `taken`: the
    names the block may not use; the accumulators' and the loop's are added to it."""
    if family.body or family.loop is not None:
        return family
    block_k = int(consts.get("BK", DEFAULT_BLOCK_K))
    found: list[tuple[ir.MatMul, sympy.Expr]] = []

    def collect(value):
        if isinstance(value, ir.MatMul):
            extent = _whole_k(schedule, value)
            if extent is not None:
                found.append((value, extent))
                return
        for inner in _children(value):
            if not isinstance(value, ir.Reduce):  # a product under sum(... for s in ...) depends on s
                collect(inner)

    for store in family.stores:
        collect(store.value)
    extents = {sympy.simplify(e) for _, e in found}
    if not found or len(extents) != 1:  # one product too: a block loads an operand whole along K
        return family
    (extent,) = extents
    var = ir.index_symbol(value_name("kstep", taken))
    accumulators = {}
    statements: list = []
    steps: list = []
    carried = []
    operands: dict[ir.Region, ir.Local] = {}  # an operand two products share (SwiGLU's X) is loaded once a step

    def operand(region: ir.Region, axis: int) -> ir.Local:
        region = _k_step(region, axis, var, block_k)
        if region not in operands:
            operands[region] = ir.Local(value_name("kop", taken))
            steps.append(ir.Let(operands[region].name, ir.Load(region), region.shape,
                                schedule.tensors[region.tensor].dtype))
        return operands[region]

    for product, _ in found:
        if product in accumulators:  # the same product twice in the tile: one accumulator
            continue
        name = value_name("kacc", taken)
        accumulators[product] = name
        left, left_axis, left_t = _operand(product.left, -1)
        right, right_axis, right_t = _operand(product.right, -2)
        shape = (left.shape[-1 if left_t else -2], right.shape[-2 if right_t else -1])
        statements.append(ir.Let(name, ir.Scalar(0.0), (), "float32"))
        # a transposed operand (`W[j*BN : +BN, :].T`) steps along its own last axis, loaded as the
        # product reads it (the block lowering loads `Load.T` natively, for the dot)
        step = ir.MatMul(ir.Transpose(ir.Load(_k_step(left, left_axis, var, block_k))) if left_t else
                         operand(left, left_axis),
                         ir.Transpose(ir.Load(_k_step(right, right_axis, var, block_k))) if right_t else
                         operand(right, right_axis))
        steps.append(ir.Let(name, ir.Map("add", (ir.Local(name), step)), shape, "float32"))
        carried.append(ir.Carried(name, shape, "float32"))
    statements.append(ir.Loop(var, _cdiv(extent, block_k), tuple(steps), tuple(carried), family.span))
    stores = tuple(dataclasses.replace(s, value=_replaced(s.value, accumulators)) for s in family.stores)
    statements.extend(stores)
    phases = tuple(ir.Phase.ENTRY for _ in family.reads) + tuple(ir.Phase.EXIT for _ in family.writes)
    return dataclasses.replace(family, body=tuple(statements), stores=stores, phases=phases)


def _operand(value, axis: int) -> tuple[ir.Region, int, bool] | None:
    """A product's operand as (the region loaded, the axis of it contracted, whether transposed): a plain
    load contracts `axis` (-1 on the left, -2 on the right), a transposed one (`X.T`) the other."""
    if isinstance(value, ir.Load):
        return value.region, axis, False
    if isinstance(value, ir.Transpose) and isinstance(value.value, ir.Load):
        return value.value.region, -3 - axis, True
    return None


def _whole_k(schedule: ir.Schedule, product: ir.MatMul) -> sympy.Expr | None:
    """K where both operands are plain local loads (or their transposes) taking the whole of their
    contracted dimension."""
    operands = (_operand(product.left, -1), _operand(product.right, -2))
    if None in operands:
        return None
    extents = []
    for region, axis, _ in operands:
        if region.owner is not None or region.rows is not None or len(region.dims) < 2:
            return None
        dim = region.dims[axis]
        shape = schedule.tensors[region.tensor].shape[len(region.dims) + axis]
        if not dim.kept or dim.start != 0 or sympy.simplify(dim.size - shape) != 0:
            return None
        if not all(d.kept for d in region.dims[-2:]):
            return None
        extents.append(shape)
    if sympy.simplify(extents[0] - extents[1]) != 0:
        return None
    return extents[0]


def _k_step(region: ir.Region, axis: int, var: sympy.Symbol, block_k: int) -> ir.Region:
    dims = list(region.dims)
    dims[axis] = ir.Dim(var * block_k, sympy.Integer(block_k), True)
    return dataclasses.replace(region, dims=tuple(dims))


def _cdiv(extent: sympy.Expr, block: int) -> sympy.Expr:
    return sympy.ceiling(extent / block)  # as the language's cdiv (schedule/build.py)


def _children(value) -> tuple:
    if isinstance(value, ir.MatMul):
        return (value.left, value.right)
    if isinstance(value, ir.Map):
        return value.args
    if isinstance(value, (ir.Reduce,)):
        return (value.body,)
    if isinstance(value, ir.Transpose):
        return (value.value,)
    return ()


def _replaced(value, accumulators: dict):
    if isinstance(value, ir.MatMul) and value in accumulators:
        return ir.Local(accumulators[value])
    if isinstance(value, ir.Map):
        return dataclasses.replace(value, args=tuple(_replaced(a, accumulators) for a in value.args))
    if isinstance(value, ir.MatMul):
        return ir.MatMul(_replaced(value.left, accumulators), _replaced(value.right, accumulators))
    if isinstance(value, ir.Transpose):
        return ir.Transpose(_replaced(value.value, accumulators))
    return value
