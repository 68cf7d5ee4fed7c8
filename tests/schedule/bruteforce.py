"""A second, deliberately simple checker for the differential test: it shares only the front end
(`ir.Schedule`) with tiledsl's own checker. Every extent, index map, region and order key is
evaluated with sympy's `subs` (sympy's `floor` and `Mod` are the mathematical meaning), every
instance on every rank is enumerated, and races, deadlocks, accesses out of bounds, waits no
NVSHMEM signal reaches and families that wait on each other are found by brute force over the
instance graph. `confirm` checks a witness (tiledsl/schedule/witness.py) against the same graph.

The rules are the ones of the issue "One meaning for a schedule": a family has instances on the ranks
its `if` holds on (every rank without one); an edge to an index or rank outside the producer's
instances means no wait; a family may wait on its own instances on other ranks (a ring); each rank runs the families one after another in
the family sequence (producer first, ties in source order), each family's instances sorted by its
order keys and then the index; a deadlock is a cycle in waits plus that serial order; a race is two
overlapping accesses to one rank's copy, one a write, with no path of waits between them."""
from __future__ import annotations

import functools
import itertools
from collections import defaultdict
from dataclasses import dataclass, field

import sympy

from tiledsl.grammar import ast
from tiledsl.schedule import ir
from tiledsl.schedule.witness import (At, Deadlock, FamilyCycle, NoSuchRank, OutOfBounds, Point, Race, Step, Unsignalled,
                                      Witness)


@functools.lru_cache(maxsize=None)
def _value(expr: sympy.Expr, values: tuple) -> int:
    """`expr` with its symbols replaced by the integers in `values` ((name, value) pairs)."""
    by_name = dict(values)
    result = expr.subs({s: by_name[s.name] for s in expr.free_symbols})
    if not result.is_Integer:
        raise ValueError(f"{expr} is {result}, not an integer, at {by_name}")
    return int(result)


def _holds(condition, env: dict[str, int]) -> bool:
    """A condition over sizes and rank (a family's `if`) with every symbol replaced by its value."""
    condition = sympy.sympify(condition)
    if condition in (sympy.true, sympy.false):
        return bool(condition)
    return bool(condition.subs({s: env[s.name] for s in condition.free_symbols}))


def evaluate(expr, env: dict[str, int]) -> int:
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return int(expr)
    return _value(expr, tuple(sorted((s.name, env[s.name]) for s in expr.free_symbols)))


@dataclass(frozen=True)
class Access:
    point: Point
    tensor: str
    copy: int                   # the rank whose copy is accessed
    lo: tuple[int, ...]         # the elements [lo, hi) after clipping at the tensor's end
    hi: tuple[int, ...]
    write: bool
    accumulates: bool           # the target of a `reduce add` chunk: commutes with other accumulations
    staged: bool                # a peer read of an `in`/`inout` tensor: reads the copy staged at call start

    @property
    def empty(self) -> bool:
        return any(a >= b for a, b in zip(self.lo, self.hi))


@dataclass
class Graph:
    """Every instance of a schedule at one world and set of sizes, with its accesses and waits."""
    schedule: ir.Schedule
    at: At
    points: list[Point] = field(default_factory=list)
    extents: dict[tuple[str, int], tuple[int, ...]] = field(default_factory=dict)  # (family, rank) -> extents
    accesses: list[Access] = field(default_factory=list)
    out_of_bounds: list[OutOfBounds] = field(default_factory=list)
    no_such_rank: list[NoSuchRank] = field(default_factory=list)  # a peer copy outside 0..world - 1
    space: dict[str, tuple[int, ...]] = field(default_factory=dict)  # family -> its index extents, every rank's
    waits: dict[Point, list[tuple[Point, int]]] = field(default_factory=dict)  # consumer -> (producer, edge)
    # (consumer, edge, producer) where an edge names an instance or rank that does not exist: no wait
    skipped: list[tuple[Point, int, Point]] = field(default_factory=list)
    sequence: list[str] | None = None          # the family sequence; None when families wait on each other
    family_cycle: FamilyCycle | None = None
    ordered: dict[tuple[str, int], list[Point]] = field(default_factory=dict)  # (family, rank) -> run order
    serial: dict[int, list[Point]] = field(default_factory=dict)  # rank -> its instances in run order

    def exists(self, point: Point) -> bool:
        extents = self.extents.get((point.family, point.rank))
        return extents is not None and len(point.index) == len(extents) and all(
            0 <= i < n for i, n in zip(point.index, extents))


def build(schedule: ir.Schedule, at: At) -> Graph:
    graph = Graph(schedule, at)
    env = {**schedule.consts, **at.values(), "world": at.world}
    shapes = {name: tuple(evaluate(d, env) for d in t.shape) for name, t in schedule.tensors.items()}
    ranged = _ranged_slices(schedule.program)
    for family in schedule.families.values():
        graph.space[family.name] = tuple(max(0, evaluate(e, {**env, "rank": 0})) for _, e in family.indices)
        for rank in range(at.world):
            # `if rank == 0`: instances on the ranks where the condition holds, none elsewhere
            runs = _holds(family.runs_on, {**env, "rank": rank})
            extents = tuple(max(0, evaluate(e, {**env, "rank": rank})) if runs else 0 for _, e in family.indices)
            graph.extents[family.name, rank] = extents
            for index in itertools.product(*map(range, extents)):
                point = Point(family.name, index, rank)
                graph.points.append(point)
                names = {**env, "rank": rank, **dict(zip(family.index_names, index))}
                _accesses(graph, family, point, names, shapes, ranged)
    for number, edge in enumerate(schedule.edges):
        _waits(graph, number, edge)
    _sequence(graph)
    for name in schedule.families:
        for rank in range(at.world):
            graph.ordered[name, rank] = _ordered(graph, name, rank, env)
    if graph.sequence is not None:
        for rank in range(at.world):
            graph.serial[rank] = [p for name in graph.sequence for p in graph.ordered[name, rank]]
    return graph


def runs_before(graph: Graph, earlier: Point, later: Point) -> bool | None:
    """Whether `earlier` runs before `later` in their rank's serial order; None where that order does
    not exist (two families that wait on each other have no sequence; one family's order still holds)."""
    if earlier.rank != later.rank:
        return False
    if earlier.family == later.family:
        order = graph.ordered[earlier.family, earlier.rank]
        return order.index(earlier) < order.index(later)
    if graph.sequence is None:
        return None
    order = graph.serial[earlier.rank]
    return order.index(earlier) < order.index(later)


def _ranged_slices(program: ast.Program) -> dict[ast.Span, tuple]:
    """The slices of every subscript in the families, by the span the IR's regions keep: whether a
    range was written `a : b` (must fit) or `a : +n` (clipped) is only in the syntax tree."""
    found = {}

    def walk(node):
        if isinstance(node, ast.Subscript):
            found[node.span] = node.slices
        if isinstance(node, (tuple, list)):
            for item in node:
                walk(item)
        elif hasattr(node, "__dataclass_fields__") and not isinstance(node, ast.Span):
            for name in node.__dataclass_fields__:
                walk(getattr(node, name))

    walk([d for d in program.decls if isinstance(d, (ast.TileDecl, ast.ChunkDecl))])
    return found


def _accesses(graph, family: ir.Family, point: Point, names: dict, shapes, ranged) -> None:
    schedule = graph.schedule
    accumulated = family.writes[0] if family.reduce == "add" else None
    regions = [(r, False) for r in family.reads] + [(r, True) for r in family.writes]
    for region, write in regions:
        tensor = schedule.tensors[region.tensor]
        slices = ranged.get(region.span, ())
        mentioned = set().union(*(sympy.sympify(e).free_symbols for d in region.dims for e in (d.start, d.size)),
                                sympy.sympify(region.owner).free_symbols if region.owner is not None else set())
        loops = [(s, e) for s, e in family.loops if s.name in {m.name for m in mentioned}]
        loop_ranges = [range(evaluate(e, names)) for _, e in loops]
        for values in itertools.product(*loop_ranges):
            here = {**names, **{s.name: v for (s, _), v in zip(loops, values)}}
            copy = point.rank if region.owner is None else evaluate(region.owner, here)
            if not 0 <= copy < graph.at.world:
                graph.no_such_rank.append(NoSuchRank(graph.at, point, region.tensor, copy, write))
            lo, hi = [], []
            for dim, (d, extent) in enumerate(zip(region.dims, shapes[region.tensor])):
                start, size = evaluate(d.start, here), evaluate(d.size, here)
                piece = slices[dim] if dim < len(slices) else None
                if not 0 <= start < extent:
                    graph.out_of_bounds.append(OutOfBounds(graph.at, point, region.tensor, dim, start, extent, False))
                elif isinstance(piece, ast.Range) and piece.stop is not None and start + size > extent:
                    graph.out_of_bounds.append(OutOfBounds(graph.at, point, region.tensor, dim, start + size,
                                                           extent, True))
                lo.append(max(0, start))
                hi.append(min(extent, start + size))
            graph.accesses.append(Access(
                point, region.tensor, copy, tuple(lo), tuple(hi), write,
                accumulates=region is accumulated,
                staged=not write and region.owner is not None and tensor.role in (ir.Role.IN, ir.Role.INOUT)))


def producers(graph: Graph, edge: ir.Edge, consumer: Point, skipped: list | None = None) -> list[Point]:
    """The producer instances `consumer` waits for through `edge`: those that exist (the others, in
    `skipped`)."""
    env = {**graph.schedule.consts, **graph.at.values(), "world": graph.at.world, "rank": consumer.rank,
           **dict(zip(graph.schedule.families[edge.consumer].index_names, consumer.index))}
    if edge.ranks is ir.RankSet.EVERY:
        ranks = range(graph.at.world)
    elif edge.ranks is ir.RankSet.AT:
        ranks = [evaluate(edge.rank_expr, env)]
    else:
        ranks = [consumer.rank]
    found = []
    for rank in ranks:
        extents = graph.space[edge.producer]  # index extents do not depend on the rank (instances may)
        choices = [range(n) if m is None else [evaluate(m, env)] for m, n in zip(edge.index_map, extents)]
        for index in itertools.product(*choices):
            point = Point(edge.producer, tuple(index), rank)
            if graph.exists(point):
                found.append(point)
            elif skipped is not None:  # an index or rank outside the producer's instances: no wait
                skipped.append(point)
    return found


def _waits(graph: Graph, number: int, edge: ir.Edge) -> None:
    for point in graph.points:
        if point.family == edge.consumer:
            skipped = []
            for producer in producers(graph, edge, point, skipped):
                graph.waits.setdefault(point, []).append((producer, number))
            graph.skipped += [(point, number, producer) for producer in skipped]


def _sequence(graph: Graph) -> None:
    """Families in a topological order, producer first, ties in source order; or a cycle."""
    names = list(graph.schedule.families)
    waits_on = {n: {e.producer for e in graph.schedule.edges if e.consumer == n and e.producer != n} for n in names}
    sequence = []
    while len(sequence) < len(names):
        ready = [n for n in names if n not in sequence and waits_on[n] <= set(sequence)]
        if not ready:
            graph.family_cycle = _family_cycle(graph, [n for n in names if n not in sequence])
            return
        sequence.append(ready[0])
    graph.sequence = sequence


def _family_cycle(graph: Graph, left: list[str]) -> FamilyCycle:
    """Walk backwards along waits among the families left: every one of them waits on another."""
    edges = graph.schedule.edges
    path, at = [], left[0]
    while at not in path:
        path.append(at)
        at = next(e.producer for e in edges if e.consumer == at and e.producer != at and e.producer in left)
    cycle = path[path.index(at):]
    numbers = tuple(next(k for k, e in enumerate(edges) if e.consumer == a and e.producer == b)
                    for a, b in zip(cycle, cycle[1:] + cycle[:1]))
    return FamilyCycle(tuple(cycle), numbers)


def _ordered(graph: Graph, name: str, rank: int, env) -> list[Point]:
    family = graph.schedule.families[name]
    points = [p for p in graph.points if p.family == name and p.rank == rank]

    def key(point):
        names = {**env, "rank": rank, **dict(zip(family.index_names, point.index))}
        return tuple(evaluate(k, names) for k in family.order) + point.index

    return sorted(points, key=key)


# ---- findings ------------------------------------------------------------------------------------

def _closure(graph: Graph) -> dict[Point, set[Point]]:
    """Per instance, every instance that a path of waits leads from (what happens before it)."""
    before: dict[Point, set[Point]] = {}

    def visit(point, seen):
        stack = [p for p, _ in graph.waits.get(point, ())]
        while stack:
            p = stack.pop()
            if p not in seen:
                seen.add(p)
                stack.extend(q for q, _ in graph.waits.get(p, ()))
        return seen

    for point in graph.points:
        before[point] = visit(point, set())
    return before


def _overlap(*boxes) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The elements common to boxes (accesses, or (lo, hi) pairs), or None."""
    pairs = [(b.lo, b.hi) if isinstance(b, Access) else b for b in boxes]
    lo = tuple(map(max, *(p[0] for p in pairs)))
    hi = tuple(map(min, *(p[1] for p in pairs)))
    return None if any(x >= y for x, y in zip(lo, hi)) else (lo, hi)


def _may_race(a: Access, b: Access) -> bool:
    return (a.point != b.point and (a.write or b.write) and not (a.accumulates and b.accumulates)
            and not a.staged and not b.staged and a.tensor == b.tensor and a.copy == b.copy)


def races(graph: Graph, first_only: bool = False) -> list[Race]:
    before = _closure(graph)
    groups = defaultdict(list)
    for access in graph.accesses:
        if not access.empty and not access.staged:
            groups[access.tensor, access.copy].append(access)
    found = []
    for accesses in groups.values():
        for a, b in itertools.combinations(accesses, 2):
            if not _may_race(a, b):
                continue
            box = _overlap(a, b)
            if box is None or a.point in before[b.point] or b.point in before[a.point]:
                continue
            first, second = (a, b) if a.write else (b, a)
            found.append(Race(graph.at, a.tensor, a.copy, first.point, second.point, second.write, *box))
            if first_only:
                return found
    return found


def deadlock(graph: Graph) -> Deadlock | None:
    """A cycle in waits plus each rank's serial order (where families wait on each other there is no
    serial order across families, only each family's own), as steps, or None."""
    after: dict[Point, list[tuple[Point, int | None]]] = defaultdict(list)  # waited -> (waiter, edge)
    for waiter, waited in graph.waits.items():
        for producer, number in waited:
            after[producer].append((waiter, number))
    orders = graph.serial.values() if graph.sequence is not None else graph.ordered.values()
    for order in orders:
        for earlier, later in zip(order, order[1:]):
            after[earlier].append((later, None))
    # depth-first search for a back arc
    state: dict[Point, int] = {}
    for root in graph.points:
        if root in state:
            continue
        stack = [(root, iter(after[root]))]
        path = [root]
        via: list[int | None] = []
        state[root] = 1
        while stack:
            node, arcs = stack[-1]
            step = next(arcs, None)
            if step is None:
                state[node] = 2
                stack.pop()
                path.pop()
                if via:
                    via.pop()
                continue
            nxt, number = step
            if state.get(nxt) == 1:  # nxt ... node -> nxt: a cycle, read backwards as waits
                cycle = path[path.index(nxt):] + [nxt]
                numbers = via[path.index(nxt):] + [number]
                steps = tuple(Step(waiter=b, waited=a, edge=n) for a, b, n in zip(cycle, cycle[1:], numbers))
                return Deadlock(graph.at, tuple(reversed(steps)))
            if nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(after[nxt])))
                path.append(nxt)
                via.append(number)
    return None


def _written_copies(graph: Graph, point: Point) -> set[int]:
    return {a.copy for a in graph.accesses if a.point == point and a.write}


def unsignalled(graph: Graph) -> list[Unsignalled]:
    found = []
    for waiter, waited in graph.waits.items():
        for producer, number in waited:
            family = graph.schedule.families[producer.family]
            if family.engine.kind is ir.EngineKind.NVSHMEM and waiter.rank not in _written_copies(graph, producer):
                found.append(Unsignalled(graph.at, waiter, producer, number))
    return found


def at(schedule: ir.Schedule, world: int, sizes: dict[str, int]) -> At:
    """Where a finding holds: `sizes` (params, maybe consts) with the other consts at their values."""
    return At(world, tuple(sorted({**schedule.consts, **sizes}.items())))


def skipped_waits(schedule: ir.Schedule, world: int, sizes: dict[str, int]) -> list[str]:
    """The waits that name an instance or rank that does not exist (no wait, under the rules), as text."""
    graph = build(schedule, at(schedule, world, sizes))
    return [f"{consumer} -> {producer} (edge {number})" for consumer, number, producer in graph.skipped]


def problems(schedule: ir.Schedule, world: int, sizes: dict[str, int]) -> list[Witness]:
    """Every kind of problem the schedule has at this world and these param (and const) values: all
    bounds violations and unsignalled waits, one family cycle or deadlock, and every racing pair."""
    graph = build(schedule, at(schedule, world, sizes))
    found: list[Witness] = [*graph.out_of_bounds, *graph.no_such_rank, *unsignalled(graph)]
    if graph.family_cycle is not None:
        found.append(graph.family_cycle)
    cycle = deadlock(graph)
    if cycle is not None:
        found.append(cycle)
    return found + races(graph)


# ---- confirming a witness ------------------------------------------------------------------------

def confirm(schedule: ir.Schedule, witness: Witness) -> str | None:
    """None if the witness holds in the instance graph, else why it does not."""
    if isinstance(witness, FamilyCycle):
        return _confirm_family_cycle(schedule, witness)
    graph = build(schedule, witness.at)
    check = {Race: _confirm_race, Deadlock: _confirm_deadlock, Unsignalled: _confirm_unsignalled,
             OutOfBounds: _confirm_bounds, NoSuchRank: _confirm_no_such_rank}[type(witness)]
    return check(graph, witness)


def _missing(graph: Graph, *points: Point) -> str | None:
    for point in points:
        if not graph.exists(point):
            return f"{point} is not an instance at world {graph.at.world}, {graph.at.values()}"
    return None


def _confirm_race(graph: Graph, race: Race) -> str | None:
    if _missing(graph, race.first, race.second):
        return _missing(graph, race.first, race.second)
    if len(race.lo) != len(race.hi) or any(a >= b for a, b in zip(race.lo, race.hi)):
        return f"the elements [{race.lo}, {race.hi}) are none"
    conflicts = [(a, b) for a in graph.accesses if a.point == race.first and a.write
                 for b in graph.accesses if b.point == race.second and b.write == race.second_writes
                 and a.tensor == b.tensor == race.tensor and a.copy == b.copy == race.copy
                 and _may_race(a, b) and len(a.lo) == len(race.lo) and _overlap(a, b, (race.lo, race.hi))]
    if not conflicts:
        return (f"{race.first} writing and {race.second} {'writing' if race.second_writes else 'reading'} "
                f"[{race.lo}, {race.hi}) of {race.tensor} on rank {race.copy} do not conflict")
    before = _closure(graph)
    if race.first in before[race.second] or race.second in before[race.first]:
        return f"a path of waits orders {race.first} and {race.second}"
    return None


def _confirm_deadlock(graph: Graph, cycle: Deadlock) -> str | None:
    if not cycle.steps:
        return "a cycle of no steps"
    for step, following in zip(cycle.steps, cycle.steps[1:] + cycle.steps[:1]):
        if _missing(graph, step.waiter, step.waited):
            return _missing(graph, step.waiter, step.waited)
        if step.waited != following.waiter:
            return f"the cycle breaks between {step.waited} and {following.waiter}"
        if step.edge is None:
            before = runs_before(graph, step.waited, step.waiter)
            if before is None:
                return f"the families wait on each other: {step.waited} and {step.waiter} have no serial order"
            if not before:
                return f"{step.waited} does not run before {step.waiter} on one rank"
        elif (step.waited, step.edge) not in graph.waits.get(step.waiter, []):
            return f"{step.waiter} does not wait for {step.waited} through edge {step.edge}"
    return None


def _confirm_unsignalled(graph: Graph, wait: Unsignalled) -> str | None:
    if _missing(graph, wait.waiter, wait.producer):
        return _missing(graph, wait.waiter, wait.producer)
    if graph.schedule.families[wait.producer.family].engine.kind is not ir.EngineKind.NVSHMEM:
        return f"{wait.producer.family} is not an nvshmem chunk"
    if (wait.producer, wait.edge) not in graph.waits.get(wait.waiter, []):
        return f"{wait.waiter} does not wait for {wait.producer} through edge {wait.edge}"
    if wait.waiter.rank in _written_copies(graph, wait.producer):
        return f"{wait.producer} writes rank {wait.waiter.rank}'s copy, so its signal reaches it"
    return None


def _confirm_bounds(graph: Graph, bounds: OutOfBounds) -> str | None:
    if _missing(graph, bounds.instance):
        return _missing(graph, bounds.instance)
    if bounds in graph.out_of_bounds:
        return None
    return (f"{bounds.instance} reaches no {'slice end' if bounds.stop else 'index or start'} {bounds.value} "
            f"out of dimension {bounds.dim} of {bounds.tensor} (size {bounds.extent})")


def _confirm_no_such_rank(graph: Graph, peer: NoSuchRank) -> str | None:
    if _missing(graph, peer.instance):
        return _missing(graph, peer.instance)
    if 0 <= peer.copy < graph.at.world:
        return f"rank {peer.copy} exists at world {graph.at.world}"
    if peer in graph.no_such_rank:
        return None
    return f"{peer.instance} does not {'write' if peer.write else 'read'} {peer.tensor}@{peer.copy}"


def _confirm_family_cycle(schedule: ir.Schedule, cycle: FamilyCycle) -> str | None:
    families, edges = cycle.families, cycle.edges
    if not families or len(families) != len(edges):
        return "a family cycle needs one edge per family"
    pairs = list(zip(families, families[1:] + families[:1]))
    for direction in (0, 1):  # edge k from family k to family k+1, read either way round
        ends = [(schedule.edges[n].consumer, schedule.edges[n].producer)[::1 - 2 * direction] if 0 <= n < len(
            schedule.edges) else None for n in edges]
        if all(end == pair for end, pair in zip(ends, pairs)) and all(a != b for a, b in pairs):
            return None
    return f"edges {list(edges)} do not lead around {' -> '.join(families)}"
