"""A warning on a trap of ragged last tiles: a `+n` load reads 0 past the end of its dimension, which
a row reduction counts unless 0 is what changes nothing there. `rowsum(x)` of a clipped load is right
(0 adds nothing); `rowsum(exp(x - m))` counts exp(-m) for every element past the end, and `rowmax(x)`
takes 0 for the maximum of a row whose values are all below it. The kernel and the reference agree on
this (both read 0 there): only what the author meant differs, so the checker says it."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tiledsl.diagnostics import warning
from tiledsl.schedule import ir
from tiledsl.tables import FUNCTIONS

# of a value never negative: a 0 past the end is no larger than its row's maximum
NONNEGATIVE = ("abs", "relu", "exp", "exp2", "sqrt", "rsqrt", "sigmoid")


@dataclass(frozen=True)
class Padded:
    """What a block holds past the end of a clipped load: the axes it has such elements along (-1 the
    last, -2 the one before), and their value there (None: it depends on other values); `const`, for
    a value with no such axis, its value where it is a number."""
    axes: frozenset = frozenset()
    value: float | None = None
    const: float | None = None
    nonnegative: bool = False
    # for the message: along each padded axis, a clipped load it comes from (axis, region, dimension)
    origins: tuple[tuple[int, ir.Region, int], ...] = ()

    def origin(self, axis: int) -> tuple[ir.Region, int]:
        return next((region, n) for a, region, n in self.origins if a == axis)


WHOLE = Padded()


def clipped_regions(concrete) -> set[tuple[ir.Region, int]]:
    """The (region, dimension) pairs some access at these sizes clips at the end of the dimension."""
    found = set()
    for access in concrete.accesses:
        region = access.region
        if access.write or region.rows is not None or access.empty:
            continue
        for n, dim in enumerate(region.dims):
            if dim.kept and access.reach[n][2] > access.hi[n]:
                found.add((region, n))
    return found


def padded_reductions(schedule: ir.Schedule, clipped: set[tuple[ir.Region, int]]):
    """A warning at each row reduction that counts the 0s a clipped load reads past the end, as
    something other than what its reduction ignores."""
    found = {}
    for family in schedule.families.values():
        if family.kind is not ir.Kind.TILE:
            continue
        walk = _Walk(clipped, found)
        walk.statements(family.body or family.stores)
    for span, (func, (region, n), value) in found.items():
        identity = FUNCTIONS[func].identity
        shown = "a value other than that" if value is None else f"{value:g}"
        dim, extent = region.dims[n], schedule.tensors[region.tensor].shape[n]
        fill = "0.0" if identity == 0 else "-inf"
        column = f"cols({dim.size})" if dim.start == 0 else f"{dim.start} + cols({dim.size})"
        yield ("padding", span), warning(
            f"{func}() counts the padding of a ragged last tile: its load of '{region.tensor}' reads 0 past "
            f"the end of the dimension, where only {identity:g} would change nothing, and {func}() gets {shown} "
            f"there", span,
            hint=f"mask the padding before reducing: where({column} < {extent}, ..., {fill})")


class _Walk:
    def __init__(self, clipped, found):
        self.clipped, self.found, self.names = clipped, found, {}

    def statements(self, statements) -> None:
        for statement in statements:
            if isinstance(statement, ir.Loop):
                self.statements(statement.body)
                self.statements(statement.body)  # a carried name's update reads the previous step's
            elif isinstance(statement, ir.Let):
                self.names[statement.name] = self.value(statement.value)
            elif isinstance(statement, ir.Store):
                self.value(statement.value)

    def value(self, value) -> Padded:
        if isinstance(value, ir.Load):
            return self.load(value.region)
        if isinstance(value, ir.Scalar):
            return Padded(const=float(value.value)) if isinstance(value.value, (int, float)) else WHOLE
        if isinstance(value, ir.Local):
            return self.names.get(value.name, WHOLE)
        if isinstance(value, ir.Transpose):
            inner = self.value(value.value)
            return Padded(frozenset(-3 - a for a in inner.axes), inner.value, inner.const, inner.nonnegative,
                          tuple((-3 - a, region, n) for a, region, n in inner.origins))
        if isinstance(value, ir.MatMul):
            left, right = self.value(value.left), self.value(value.right)
            sides = [s for s, axis in ((left, -2), (right, -1)) if axis in s.axes]
            axes = frozenset(axis for s, axis in ((left, -2), (right, -1)) if axis in s.axes)
            return Padded(axes, 0.0 if all(s.value == 0 for s in sides) else None,
                          origins=tuple(o for s, axis in ((left, -2), (right, -1)) for o in s.origins if o[0] == axis))
        if isinstance(value, ir.Reduce):  # over ranks or a loop's values, not along a block's axis
            body = self.value(value.body)
            kept = body.value if value.op == "max" or body.value == 0 else None
            return Padded(body.axes, kept, nonnegative=body.nonnegative, origins=body.origins)
        if isinstance(value, ir.Map):
            return self.map(value)
        return WHOLE  # iota, routes: no padding

    def load(self, region: ir.Region) -> Padded:
        kept = [n for n, d in enumerate(region.dims) if d.kept]
        origins = tuple((k - len(kept), region, n) for k, n in enumerate(kept) if (region, n) in self.clipped)
        if region.rows is not None or not origins:
            return WHOLE
        return Padded(frozenset(a for a, _, _ in origins), 0.0, origins=origins)

    def map(self, value: ir.Map) -> Padded:
        args = [self.value(a) for a in value.args]
        function = FUNCTIONS.get(value.func)
        if function is not None and function.reduces:
            return self.reduction(value, args[0])
        axes = frozenset().union(*(a.axes for a in args))
        # each argument past the end: one padded along fewer axes holds its own values at some of those places
        there = [a.value if a.axes == axes else a.const for a in args]
        nonnegative = value.func in NONNEGATIVE
        if value.func == "where" and not args[0].axes:
            # a condition on indices, not on what was loaded: the author's mask, trusted
            return Padded(nonnegative=args[1].nonnegative and args[2].nonnegative)
        if value.func == "mul" and 0.0 in there or value.func == "div" and there[0] == 0.0 and not args[1].axes:
            result = 0.0  # 0 times (or over) what is there: 0
        elif any(v is None for v in there):
            result = None
        elif value.func.startswith("cast:"):
            result = there[0]
        elif value.func == "where":  # a condition on what was loaded, known there
            result = there[1] if there[0] else there[2]
        elif function.rows:  # rmsnorm: a row's 0 stays 0
            result = 0.0 if there[0] == 0 else None
        else:
            with torch.no_grad():
                result = float(function.torch(*(torch.tensor(v, dtype=torch.float64) for v in there)))
            result = None if math.isnan(result) else result
        return Padded(axes, result, None if axes else result, nonnegative, tuple(o for a in args for o in a.origins))

    def reduction(self, value: ir.Map, operand: Padded) -> Padded:
        func, identity = value.func, FUNCTIONS[value.func].identity
        if -1 in operand.axes:
            harmless = operand.value == identity or (
                func == "rowmax" and operand.nonnegative and operand.value is not None and operand.value <= 0)
            if not harmless:
                self.found.setdefault(value.span, (func, operand.origin(-1), operand.value))
        rows = operand.axes - {-1}  # a row all padding reduces to its padding (sum: of 0s, 0)
        kept = operand.value if func == "rowmax" or operand.value == 0 else None
        return Padded(rows, kept if rows else None, nonnegative=operand.nonnegative,
                      origins=tuple(o for o in operand.origins if o[0] != -1))
