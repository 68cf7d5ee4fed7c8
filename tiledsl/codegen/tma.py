"""Which tensors TMA reaches, and its row rule as launch conditions. A tensor read or written through a TMA descriptor needs rows (its last
dimension) of a multiple of 16 bytes and a 16-byte aligned start: cuTensorMapEncodeTiled refuses anything
else, and Triton asserts "strides must be 16-byte aligned". Which tensors go through descriptors is code
generation's choice (a product's operands and TMA-stored target, a block tile's loads and stores under
`const TMA`): `described` asks the lowering itself, and the sizes the checker and `tiledsl run` choose or
accept (`row_conditions`) judge by this module. The schedule layer never asks it: the pipeline hands the
conditions down on the schedule (`with_row_conditions`), so the import graph stays a DAG. The rule itself
(`ROW_BYTES`, `row_multiple`, `rows_fit`) and the launcher's refusal (`row_refusal`) are runtime/specs.py,
which generated modules import."""
from __future__ import annotations

import dataclasses

import sympy

from tiledsl.codegen.body import DescLoad, DescStore, LoweringError, MakeDescriptor, Product, TmaStore, walk
from tiledsl.runtime.specs import ROW_BYTES, row_multiple
from tiledsl.schedule import ir
from tiledsl.tables import DTYPES

# `described` by program text and consts: a schedule is a function of them, and the checker builds a
# new one per run (lowering sp_ag_attention's tiles is a quarter of its check)
_DESCRIBED: dict[tuple, dict[str, str]] = {}
_DESCRIBED_KEPT = 256


def statement_tensors(statements, product: Product | None = None, tma_target: str | None = None) -> set[str]:
    """The tensors that lowered statements reach through a TMA descriptor: the plan's and the
    launcher's view (`interface_of` makes the descriptor arguments from the same statements)."""
    found = {product.left, product.right} if product is not None else set()
    found |= {tma_target} if tma_target is not None else set()
    for s in walk(statements):
        if isinstance(s, (DescLoad, DescStore, MakeDescriptor, TmaStore)):
            found.add(s.tensor)
    return found


def described(schedule: ir.Schedule, consts: dict | None = None) -> dict[str, str]:
    """Each tensor the kernel reaches through a TMA descriptor, with its declared dtype: the tile
    families that may hold one lowered as `lower` lowers them (a product of the one-block lowering
    always reads through descriptors, a block tile only under `const TMA`). A family the lowering
    refuses reaches none (building the program reports why)."""
    consts = {**schedule.consts, **(consts or {})}
    key = (schedule.program.source, schedule.program.path, tuple(sorted(consts.items())))
    if not schedule.program.source:  # a schedule built without a program's text: nothing to key by
        return _lowered_descriptors(schedule, consts)
    if key not in _DESCRIBED:
        if len(_DESCRIBED) >= _DESCRIBED_KEPT:
            del _DESCRIBED[next(iter(_DESCRIBED))]
        _DESCRIBED[key] = _lowered_descriptors(schedule, consts)
    return dict(_DESCRIBED[key])


def _lowered_descriptors(schedule: ir.Schedule, consts: dict) -> dict[str, str]:
    from tiledsl.codegen.blocks import TMA
    from tiledsl.codegen.body import tile_body, written_as_block
    from tiledsl.codegen.plan import _resolve_splits, let_names
    candidates = [f for f in schedule.families.values() if f.kind is ir.Kind.TILE
                  and f.engine.kind is not ir.EngineKind.COPY_ENGINE
                  and (consts.get(TMA) if written_as_block(f) else _holds_product(f))]
    if not candidates:
        return {}
    resolved = _resolve_splits(schedule, consts)
    kernel = let_names(resolved)
    found: set[str] = set()
    for family in candidates:
        try:
            tile = tile_body(resolved, resolved.families[family.name], consts, kernel)
        except LoweringError:
            continue
        found |= statement_tensors(tile.statements + tuple(tile.head), tile.product, tile.tma_target)
    return {name: schedule.tensors[name].dtype for name in schedule.tensors if name in found}


def row_conditions(schedule: ir.Schedule, consts: dict | None = None) -> tuple[ir.Condition, ...]:
    """The row rule as launch conditions on the declared dtypes: the last dimension of every tensor a
    descriptor reaches a multiple of `row_multiple`, reported at the tensor's declaration."""
    conditions = []
    values = {ir.size_symbol(k): v for k, v in {**schedule.consts, **(consts or {})}.items()}
    for name, dtype in described(schedule, consts).items():
        tensor, itemsize = schedule.tensors[name], DTYPES[dtype].torch.itemsize
        multiple, last = row_multiple(itemsize), tensor.shape[-1]
        holds = sympy.Eq(sympy.Mod(last, multiple), 0)
        if holds.subs(values) is sympy.true:  # H * D with D = 128: at every size
            continue
        conditions.append(ir.Condition(
            holds,
            f"'{name}' is read or written through a TMA descriptor, whose rows must be a multiple of "
            f"{ROW_BYTES} bytes: its last dimension {last} must be a multiple of {multiple} ({dtype})",
            tensor.span, hint=f"pad the last dimension of '{name}' to a multiple of {multiple} "
                              f"({ROW_BYTES} bytes / {itemsize}); tiledsl.ops pads"))
    return tuple(conditions)


def with_row_conditions(schedule: ir.Schedule) -> ir.Schedule:
    """The schedule carrying the row rule at its own consts as `kernel_conditions`, which the sizes the
    checker, emulation and GPU runs choose meet (schedule/meaning.py `launch_conditions`)."""
    return dataclasses.replace(schedule, kernel_conditions=row_conditions(schedule))


def _holds_product(family: ir.Family) -> bool:
    def visit(value) -> bool:
        if isinstance(value, ir.MatMul):
            return True
        if isinstance(value, (tuple, list)):
            return any(visit(v) for v in value)
        if dataclasses.is_dataclass(value) and not isinstance(value, (type, ir.Region)):
            return any(visit(getattr(value, f.name)) for f in dataclasses.fields(value))
        return False
    return visit(family.stores) or visit(family.body)
