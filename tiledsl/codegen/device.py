"""Device values in the plan. A tensor element that a size or an index reads on the device (a count,
or one index per gathered row) becomes a Fetch into a kernel symbol before its first use, and the
expressions that read it use the symbol; nothing about it reaches the host. The bounds a value may
break become Reports at guard sites, which the launcher turns into CapacityExceeded or IndexOutOfRange
after the call (runtime/guards.py): the kernel never writes or reads where a broken value points."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import sympy

from tiledsl.codegen.body import (Dim, Fetch, LoweringError, Place, Report, Scalar, Scan, TileBody, _copy_place,
                                  _covers)
from tiledsl.runtime import guards
from tiledsl.schedule import ir
from tiledsl.schedule.wording import declared


@dataclass(frozen=True)
class GuardSite:
    """What a kernel reports at one site: the kind of bound, the tensor whose element broke it, what
    the bound belongs to, and the declaration that gave it (`file:line` and its text)."""
    kind: str       # guards.CAPACITY or guards.INDEX
    tensor: str
    target: str
    declared: str


class Sites:
    """The program's guard sites, numbered in the order code generation meets them."""

    def __init__(self, schedule: ir.Schedule):
        self.schedule = schedule
        self.sites: list[GuardSite] = []

    def add(self, kind: str, tensor: str, target: str) -> int:
        site = GuardSite(kind, tensor, target, declared(self.schedule, tensor))
        if site not in self.sites:
            self.sites.append(site)
        return self.sites.index(site)


class DeviceValues:
    """The device values of one family's instance, each fetched once per statement list it is used in
    (a fetch inside a loop over k is fetched there, since its index depends on k)."""

    def __init__(self, schedule: ir.Schedule, kernel: Callable, sites: Sites, fresh: Callable[[str], str],
                 consts: dict[str, int]):
        self.schedule, self.k, self.sites, self.fresh, self.consts = schedule, kernel, sites, fresh, consts
        self.fetched: dict[tuple, tuple[sympy.Symbol, Place, sympy.Symbol | None]] = {}
        # the aranges of the block that gathered values are fetched along (a block tile's values each have
        # their own: `_Block.place` sets them); None: the tile's one block (printer.AXES)
        self.names: tuple[str, ...] | None = None

    def read(self, expr, out: list, axes: int = 0, axis: int | None = None, block=None, rows=None) -> sympy.Expr:
        """`expr` with each device value replaced by the symbol a Fetch (appended to `out`) loads it
        into; a gathered one (over ROW) along block axis `axis` of `block` elements, `rows` of them real."""
        expr = sympy.sympify(expr)
        replaced = {}
        for value in sorted(ir.device_values(expr), key=str):
            replaced[value] = self.fetch(value, out, axes, axis, block, rows)[0]
        return expr.xreplace(replaced) if replaced else expr

    def fetch(self, value, out: list, axes: int = 0, axis: int | None = None, block=None, rows=None):
        """(symbol, place, exists) of one device value, fetched into `out` the first time."""
        key = (id(out), value, self.names)
        if key in self.fetched:
            return self.fetched[key]
        name = ir.value_tensor(value)
        tensor = self.schedule.tensors[name]
        gathered = ir.ROW in value.free_symbols
        if gathered and axis is None:
            raise LoweringError(f"'{name}' is read once per row here, outside a tile's block")
        place = self.element_place(value, axes, axis, block, rows)
        # no sign assumed: a negative index from a broken input must fail its bounds check, not lose it
        symbol = sympy.Symbol(self.fresh(name), integer=True)
        exists = sympy.Symbol(f"{symbol.name}_ok") if gathered else None
        cap = site = None
        if tensor.cap is not None and not gathered:
            cap, site = self.k(tensor.cap), self.sites.add(guards.CAPACITY, name, name)
        out.append(Fetch(symbol, place, exists, cap, site))
        self.fetched[key] = (symbol, place, exists)
        return self.fetched[key]

    def element_place(self, value, axes: int, axis, block, rows) -> Place:
        """Where a device value lives: its tensor at its index, the gathered index along `axis`."""
        name = ir.value_tensor(value)
        tensor = self.schedule.tensors[name]
        owner = ir.value_owner(value)
        dims = []
        for n, arg in enumerate(ir.value_index(value)):
            stride = self.k(sympy.Mul(*tensor.shape[n + 1:]))
            bound = self.k(tensor.shape[n])
            if ir.ROW in arg.free_symbols:
                start = sympy.expand(arg - ir.ROW)
                if ir.ROW in start.free_symbols:
                    raise LoweringError(f"a gathered read of '{name}' must step one element per row")
                clip = None if _covers(block, rows, self.consts) else self.k(rows)
                dims.append(Dim(self.k(start), stride, bound, axis, block, clip))
            else:
                dims.append(Dim(self.k(arg), stride, bound))
        return Place(name, None if owner == ir.RANK else self.k(owner), tuple(dims), axes, self.names)

    def index(self, start, extent, target: str, out: list, axes: int, axis=None, block=None,
              rows=None) -> tuple[sympy.Expr, tuple]:
        """A point index (or a rank) read through device values: the index in kernel symbols, and the
        conditions for a row to be there (its elements exist, the index lies in 0..extent-1); a row
        whose index lies outside is reported."""
        values = sorted(ir.device_values(start), key=str)
        index = self.read(start, out, axes, axis, block, rows)
        exists = [self.fetch(v, out, axes, axis, block, rows)[2] for v in values]
        exists = [e for e in exists if e is not None]
        inside = sympy.And(sympy.Ge(index, 0), sympy.Lt(index, self.k(extent)))
        first, place, _ = self.fetch(values[0], out, axes, axis, block, rows)
        site = self.sites.add(guards.INDEX, ir.value_tensor(values[0]), target)
        out.append(Report(site, sympy.And(*exists, sympy.Not(inside)), place, index, self.k(extent)))
        return index, (*exists, inside)


def capacity_report(tile, place: Place, value, cap) -> Report:
    """A tile's store into a capped tensor: the elements above the cap, reported."""
    stored = sympy.Symbol(value) if isinstance(value, str) else sympy.sympify(value.value)
    site = tile.sites.add(guards.CAPACITY, place.tensor, place.tensor)
    return Report(site, sympy.Gt(stored, tile.k(cap)), place, stored, tile.k(cap), within=place)


# ids an arrival numbers at a time: a [STEP, STEP] comparison per step (earlier equal ids in the step).
# A step's work does not grow with the groups: the one-hot [64, 128] running sum it replaced took ~5 us
# a step on an H200, twice at 256 experts (13 us a route tile at 128 tokens, bench/NOTES.md session 19)
STEP = 64
COUNT_STEP = 4096  # ids a scan only counts at a time (a histogram, the ids before a part): tl.histogram
MAX_GROUPS = 1024  # groups one pass of a scan counts (a tl.histogram's bins); more take more passes


def route_body(tile) -> TileBody:
    """A tile of histogram() and arrival() stores: one scan per region of ids, giving both."""
    family, k = tile.family, tile.k
    by_source: dict = {}
    for store in family.stores:
        if not isinstance(store.value, ir.Route):
            raise LoweringError(f"tile '{family.name}': a tile that routes ids does nothing else")
        by_source.setdefault(store.value.source, {})[store.value.func] = store
    out = []
    for n, (source, stores) in enumerate(by_source.items()):
        bins = {str(s.value.bins): s.value.bins for s in stores.values()}
        if len(bins) != 1:
            raise LoweringError(f"tile '{family.name}': histogram() and arrival() of one region use one number "
                                "of groups")
        bins = next(iter(bins.values()))
        kept = [d.size for d in source.dims if d.kept]
        if not 1 <= len(kept) <= 2:
            raise LoweringError(f"tile '{family.name}': ids to route are a 1-D or 2-D region")
        groups = f"tds_BLOCK_{family.name}_groups" + (str(n) if n else "")
        tile.blocks.append((groups, sympy.Min(bins, MAX_GROUPS)))
        arrival, histogram = stores.get("arrival"), stores.get("histogram")
        cap = cap_site = None
        if histogram is not None and tile.schedule.tensors[histogram.target.tensor].cap is not None:
            cap = k(tile.schedule.tensors[histogram.target.tensor].cap)
            cap_site = tile.sites.add(guards.CAPACITY, histogram.target.tensor, histogram.target.tensor)
        site = tile.sites.add(guards.INDEX, source.tensor, f"{'histogram' if histogram else 'arrival'}()")
        first, size = _part(family.name, arrival.value.part if arrival else None, kept)
        if first is not None and histogram is not None:
            raise LoweringError(f"tile '{family.name}': a part of an arrival is stored without a histogram of the "
                                "same ids (each part's tile would store it whole)")
        out.append(Scan(_copy_place(tile.schedule, source, k), k(sympy.Mul(*kept)),
                        k(kept[1]) if len(kept) == 2 else None, k(bins), groups, STEP,
                        None if arrival is None else _copy_place(tile.schedule, _from_region(arrival), k),
                        None if histogram is None else _clipped(_copy_place(tile.schedule, histogram.target, k), k(bins)),
                        site, cap, cap_site, None if first is None else k(first),
                        None if size is None else k(sympy.Min(first + size, sympy.Mul(*kept))), COUNT_STEP))
    return TileBody(tuple(out), None, None, tuple(tile.blocks))


def _from_region(store) -> ir.Region:
    """An arrival's target, placed by the element's position in the whole region (the scan's rows and
    columns): a part's target starts where the part does."""
    part = store.value.part
    if part is None:
        return store.target
    shift = iter(part)
    dims = tuple(dataclasses.replace(d, start=d.start - next(shift).start) if d.kept else d for d in store.target.dims)
    return dataclasses.replace(store.target, dims=dims)


def _part(name: str, part, kept: list) -> tuple:
    """(first element, elements) of a part of an arrival, row-major over the region: a block of whole
    rows (or of a 1-D region), so that its elements are consecutive."""
    if part is None:
        return None, None
    if len(part) == 2 and not (part[1].start == 0 and sympy.simplify(part[1].size - kept[1]) == 0):
        raise LoweringError(f"tile '{name}': a part of an arrival takes whole rows of the ids: `[a : +m, :]`")
    cols = kept[1] if len(part) == 2 else 1
    return part[0].start * cols, part[0].size * cols


def _clipped(place: Place, size: sympy.Expr) -> Place:
    """A one-axis place masked past `size` elements along its axis (a block of groups past the bins)."""
    return dataclasses.replace(place, dims=tuple(dataclasses.replace(d, clip=size) if d.axis is not None else d
                                                 for d in place.dims))
