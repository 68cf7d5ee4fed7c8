"""A schedule at concrete sizes: every instance of every family on every rank, the integer boxes it
reads and writes, and the producer instances each of its edges waits on. The checker proves its
properties on these, and the emulator runs them.

Expressions are compiled once to Python lambdas with integer semantics (`//`, `%`): exact divisions
stay exact and `floor`/`cdiv` of indices floor, as they will on the GPU."""
from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sympy

from tiledsl.schedule import ir
from tiledsl.schedule.intcode import code

MAX_INSTANCES = 5000  # default_sizes keeps the instances of all ranks together under this
MAX_MULTIPLE = 64     # default_sizes tries params = world * L * k for k up to this


@functools.lru_cache(maxsize=4096)
def compile_exprs(exprs: tuple, symbols: tuple) -> Callable[..., tuple]:
    """A function of `symbols` (positionally) that returns the integer values of `exprs` as a tuple.
    The role of `sympy.lambdify`, with `//` and `%` where lambdify would divide floats."""
    names = {sym.name: f"_a{n}" for n, sym in enumerate(symbols)}
    body = "".join(code(e, kernel=False, names=names, strict=True) + ", " for e in exprs)
    return eval(f"lambda {', '.join(names.values())}: ({body})", {"min": min, "max": max})


def size_symbols(schedule: ir.Schedule) -> tuple[sympy.Symbol, ...]:
    """Params, consts and world: the leading arguments of every compiled expression, in this order."""
    return tuple(ir.size_symbol(n) for n in (*schedule.params, *schedule.consts)) + (ir.WORLD,)


# ---- sizes ---------------------------------------------------------------------------------------

def default_sizes(schedule: ir.Schedule, world: int, max_instances: int = MAX_INSTANCES) -> dict[str, int]:
    """Small values for the program's params at `world` ranks, for checking and emulation.

    Every param is set to world * L * k, with L the lcm of the consts and of the numbers in the launch
    conditions, and k = 1, 2, ... the smallest multiple for which every `schedule.conditions` holds with
    the consts at their values, every index extent that depends on a param is at least 2, and all ranks
    together have at most `max_instances` instances. Where no k up to MAX_MULTIPLE gives that, L is cut
    to what the conditions alone need, and then two instances per index are no longer insisted on.
    Raises ValueError when nothing meets the conditions within the bound (a condition on consts and
    world alone that fails at this world, say, or an index space that is large at any valid size)."""
    consts = {ir.size_symbol(name): value for name, value in schedule.consts.items()}
    needed = math.lcm(1, *(int(a) for c in schedule.conditions for a in c.holds.subs(consts).atoms(sympy.Integer)
                            if a > 0))
    bases = dict.fromkeys([world * math.lcm(needed, *schedule.consts.values()), world * needed])
    params, fallback = set(schedule.params), None
    for base in bases if params else [0]:
        for k in range(1, MAX_MULTIPLE + 1 if params else 2):
            sizes = {p: base * k for p in schedule.params}
            if not _conditions_hold(schedule, world, sizes):
                continue
            total, too_few = 0, False
            for family in schedule.families.values():
                for rank in range(world):
                    extents = _extents(schedule, family, world, sizes, rank)
                    total += math.prod(extents)
                    too_few |= any(n < 2 and {str(s) for s in e.free_symbols} & params
                                   for n, (_, e) in zip(extents, family.indices))
            if total > max_instances:
                break  # larger multiples only have more instances
            if not too_few:
                return sizes
            if fallback is None:
                fallback = sizes
    if fallback is None:
        raise ValueError(f"no params meet the launch conditions at world {world} with at most "
                         f"{max_instances} instances")
    return fallback


def _size_values(schedule: ir.Schedule, world: int, sizes: dict[str, int]) -> tuple[int, ...]:
    missing = [p for p in schedule.params if p not in sizes]
    if missing:
        raise ValueError(f"no value for param {', '.join(missing)}")
    return (*(sizes[p] for p in schedule.params), *(sizes.get(c, v) for c, v in schedule.consts.items()), world)


def _conditions_hold(schedule: ir.Schedule, world: int, sizes: dict[str, int]) -> bool:
    if not schedule.conditions:
        return True
    holds = compile_exprs(tuple(c.holds for c in schedule.conditions), size_symbols(schedule))
    return all(holds(*_size_values(schedule, world, sizes)))


def _extents(schedule, family: ir.Family, world: int, sizes: dict[str, int], rank: int) -> tuple[int, ...]:
    extents = compile_exprs(tuple(e for _, e in family.indices), (*size_symbols(schedule), ir.RANK))
    return tuple(max(0, n) for n in extents(*_size_values(schedule, world, sizes), rank))


# ---- instances -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Instance:
    """One instance of a family, run by one rank."""
    family: str
    index: tuple[int, ...]
    rank: int

    def __str__(self) -> str:
        return f"{self.family}[{', '.join(map(str, self.index))}]@rank{self.rank}"


@dataclass(frozen=True)
class Access:
    """A region one instance reads or writes, as a box [lo, hi) per dimension of one rank's copy."""
    instance: int                          # position in Concrete.instances
    region: ir.Region
    write: bool
    copy: int                              # the rank whose copy of the tensor is accessed
    lo: tuple[int, ...]                    # clipped to the tensor's shape; empty where any lo >= hi
    hi: tuple[int, ...]
    # before clipping, per dimension: (smallest start, largest start, largest stop) over the loop variables
    reach: tuple[tuple[int, int, int], ...]

    @property
    def empty(self) -> bool:
        return any(a >= b for a, b in zip(self.lo, self.hi))


@dataclass(frozen=True)
class Wait:
    """One edge of one consumer instance: it starts after every producer instance is complete."""
    consumer: int
    edge: int                   # position in schedule.edges
    producers: tuple[int, ...]  # the same tuple object for every wait on the same producer set


@dataclass(frozen=True)
class Orphan:
    """A wait on an instance that does not exist: no one will ever signal it."""
    consumer: int
    edge: int
    index: tuple[int | None, ...]  # the producer index the map gave (None: `*`)
    rank: int                      # the producer rank it asked for


@dataclass
class Concrete:
    schedule: ir.Schedule
    world: int
    sizes: dict[str, int]                               # params and consts
    instances: list[Instance]
    order: list[tuple[int, ...]]                        # per instance: its family's order keys, then its index
    ranges: dict[str, list[range]]                      # family -> per rank, its instances' positions
    extents: dict[str, list[tuple[int, ...]]]           # family -> per rank, its index extents
    shapes: dict[str, tuple[int, ...]]
    accesses: list[Access]
    waits: list[Wait]
    orphans: list[Orphan]

    def position(self, family: str, rank: int, index: Sequence[int]) -> int | None:
        """The position of an instance in `instances`, or None outside the family's index space."""
        extents = self.extents[family][rank]
        flat = 0
        for i, n in zip(index, extents):
            if not 0 <= i < n:
                return None
            flat = flat * n + i
        return self.ranges[family][rank].start + flat


def instantiate(schedule: ir.Schedule, world: int, sizes: dict[str, int]) -> Concrete:
    """Every instance of `schedule` at `world` ranks and these param values (consts may be overridden
    too), with its accesses as integer boxes and its waits as producer instances. `split` is ignored:
    an instance is signalled once, when all of it is complete."""
    values = _size_values(schedule, world, sizes)
    all_sizes = dict(zip((*schedule.params, *schedule.consts), values))
    shapes = {name: tuple(compile_exprs(t.shape, size_symbols(schedule))(*values))
              for name, t in schedule.tensors.items()}
    done = Concrete(schedule, world, all_sizes, [], [], {}, {}, shapes, [], [], [])
    for family in schedule.families.values():
        _family_instances(done, family, values)
    for family in schedule.families.values():
        _family_accesses(done, family, values)
    for number, edge in enumerate(schedule.edges):
        _edge_waits(done, number, edge, values)
    return done


def _family_instances(done: Concrete, family: ir.Family, values: tuple) -> None:
    symbols = (*size_symbols(done.schedule), ir.RANK, *(s for s, _ in family.indices))
    keys = functools.partial(compile_exprs(family.order, symbols), *values)
    done.ranges[family.name], done.extents[family.name] = [], []
    for rank in range(done.world):
        extents = _extents(done.schedule, family, done.world, done.sizes, rank)
        start = len(done.instances)
        for index in itertools.product(*map(range, extents)):
            done.instances.append(Instance(family.name, index, rank))
            done.order.append(keys(rank, *index) + index)
        done.ranges[family.name].append(range(start, len(done.instances)))
        done.extents[family.name].append(extents)


def _family_accesses(done: Concrete, family: ir.Family, values: tuple) -> None:
    loops = [s for s, _ in family.loops]
    symbols = (*size_symbols(done.schedule), ir.RANK, *(s for s, _ in family.indices), *loops)
    loop_extents = compile_exprs(tuple(e for _, e in family.loops), (*size_symbols(done.schedule), ir.RANK))
    regions = [(r, False) for r in family.reads] + [(r, True) for r in family.writes]
    for region, write in regions:
        exprs = (region.owner if region.owner is not None else ir.RANK,
                 *(e for d in region.dims for e in (d.start, d.size)))
        evaluate = functools.partial(compile_exprs(exprs, symbols), *values)
        mentioned = set().union(*(sympy.sympify(e).free_symbols for e in exprs))
        shape = done.shapes[region.tensor]
        for rank in range(done.world):
            looped = [range(n) if s in mentioned else range(1)
                      for s, n in zip(loops, loop_extents(*values, rank))]
            for position in done.ranges[family.name][rank]:
                index = done.instances[position].index
                by_copy: dict[int, list[tuple]] = {}
                for loop_values in itertools.product(*looped):
                    owner, *dims = evaluate(rank, *index, *loop_values)
                    by_copy.setdefault(owner, []).append(dims)
                for copy, points in by_copy.items():
                    done.accesses.append(_box(position, region, write, copy, points, shape))


def _box(position, region, write, copy, points, shape) -> Access:
    """The hull of a region over its loop variables' values, on one copy."""
    if len(points) == 1:
        starts = points[0][0::2]
        stops = [a + n for a, n in zip(starts, points[0][1::2])]
        return Access(position, region, write, copy, tuple(max(0, a) for a in starts),
                      tuple(map(min, shape, stops)), tuple(zip(starts, starts, stops)))
    reach, lo, hi = [], [], []
    for n, extent in enumerate(shape):
        starts = [p[2 * n] for p in points]
        stops = [p[2 * n] + p[2 * n + 1] for p in points]
        reach.append((min(starts), max(starts), max(stops)))
        lo.append(max(0, min(starts)))
        hi.append(min(extent, max(stops)))
    return Access(position, region, write, copy, tuple(lo), tuple(hi), tuple(reach))


def _edge_waits(done: Concrete, number: int, edge: ir.Edge, values: tuple) -> None:
    consumer = done.schedule.families[edge.consumer]
    mapped = [e for e in edge.index_map if e is not None]
    exprs = (*mapped, edge.rank_expr if edge.ranks is ir.RankSet.AT else ir.RANK)
    symbols = (*size_symbols(done.schedule), ir.RANK, *(s for s, _ in consumer.indices))
    evaluate = functools.partial(compile_exprs(exprs, symbols), *values)
    shared: dict[tuple, tuple[int, ...]] = {}
    chain = edge.producer == edge.consumer
    for rank in range(done.world):
        for position in done.ranges[edge.consumer][rank]:
            *found, at = evaluate(rank, *done.instances[position].index)
            it = iter(found)
            index = tuple(None if e is None else next(it) for e in edge.index_map)
            ranks = range(done.world) if edge.ranks is ir.RankSet.EVERY else (at,)
            key = (index, tuple(ranks))
            if key not in shared:
                producers, missing = _producers(done, edge.producer, index, ranks)
                if missing is not None and not chain:
                    # A chain's first instance (`mm[i] after mm[i-1]` at i = 0) waits on nothing.
                    done.orphans.append(Orphan(position, number, index, missing))
                shared[key] = producers
            if shared[key]:
                done.waits.append(Wait(position, number, shared[key]))


def _producers(done: Concrete, family: str, index, ranks) -> tuple[tuple[int, ...], int | None]:
    """The positions of the named producer instances, and a rank where one named instance is missing."""
    found, missing = [], None
    for rank in ranks:
        if not 0 <= rank < done.world:
            missing = rank
            continue
        extents = done.extents[family][rank]
        if any(i is not None and not 0 <= i < n for i, n in zip(index, extents)):
            missing = rank
            continue
        choices = [range(n) if i is None else (i,) for i, n in zip(index, extents)]
        found.extend(done.position(family, rank, chosen) for chosen in itertools.product(*choices))
    return tuple(found), missing
