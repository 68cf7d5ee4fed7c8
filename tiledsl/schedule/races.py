"""Deadlocks and races, proved on the graph of concrete instances: an arc from each producer to each
instance that waits on it, and for deadlocks also each rank's serial order (`meaning.py`). A cycle is
a deadlock; two accesses to one region, one a write, with no path of waits between them are a race."""
from __future__ import annotations

from collections import defaultdict

import networkx
import numpy

from tiledsl.diagnostics import Diagnostic, Note, error
from tiledsl.schedule import ir
from tiledsl.schedule.meaning import Access, Concrete
from tiledsl.schedule.witness import Deadlock, Race, Step
from tiledsl.schedule.wording import family_text, point, sizes_text, where

# ---- the instance graph --------------------------------------------------------------------------

def graph(concrete: Concrete) -> tuple[list[list[int]], list[int]]:
    """Successor lists, producer before consumer, over the instances (0..n-1) and one node per distinct
    waited-on producer set (so that `push[*] @ every rank` costs one node, not consumers x producers arcs),
    and the edge of each such node."""
    count = len(concrete.instances)
    successors: list[list[int]] = [[] for _ in range(count)]
    via: list[int] = []
    nodes: dict[tuple, int] = {}
    for wait in concrete.waits:
        key = (wait.edge, id(wait.producers))
        node = nodes.get(key)
        if node is None:
            node = nodes[key] = len(successors)
            successors.append([])
            via.append(wait.edge)
            for producer in wait.producers:
                successors[producer].append(node)
        successors[node].append(wait.consumer)
    return successors, via


def add_serial_order(concrete: Concrete, successors: list[list[int]]) -> None:
    """Arcs from each instance to the next in its rank's serial order: with them a cycle is a deadlock
    even where the waits alone have none (an instance waiting on one that its rank runs later)."""
    for rank in range(concrete.world):
        serial = concrete.serial(rank)
        for first, then in zip(serial, serial[1:]):
            successors[first].append(then)


def topological(successors: list[list[int]]) -> list[int]:
    """Kahn's order; shorter than the graph when there is a cycle."""
    waiting = [0] * len(successors)
    for nexts in successors:
        for n in nexts:
            waiting[n] += 1
    order = [v for v, w in enumerate(waiting) if w == 0]
    for v in order:
        for n in successors[v]:
            waiting[n] -= 1
            if waiting[n] == 0:
                order.append(n)
    return order


def cycle(concrete: Concrete, successors, via, left: set[int]):
    """One cycle, read off the nodes that Kahn's order could not reach. Every edge map is a total
    function of the consumer's instance, so a cycle between families always shows up here. Arcs
    between two instances are serial order (the later instance runs after the earlier)."""
    count, instances = len(concrete.instances), concrete.instances
    graph = networkx.DiGraph((v, n) for v in left for n in successors[v] if n in left)
    arcs = networkx.find_cycle(graph)
    start = next(n for n, (source, _) in enumerate(arcs) if source < count)
    steps = []  # (later, earlier, edge number or None), in happens-before order
    for source, target in arcs[start:] + arcs[:start]:
        if source < count and target < count:
            steps.append((target, source, None))
        elif source < count:  # a producer, then its producer-set node, then the consumer
            producer = source
        else:
            steps.append((target, producer, via[source - count]))
    steps.reverse()  # read as "waits for"
    families = list(concrete.schedule.families)
    first = min(range(len(steps)), key=lambda n: (families.index(instances[steps[n][0]].family),
                                                  instances[steps[n][0]].rank, instances[steps[n][0]].index))
    steps = steps[first:] + steps[:first]
    path = steps_text(instances, steps)
    edges = concrete.schedule.edges
    notes = []
    for waiter, waited, edge in steps:
        if edge is None:
            family = concrete.schedule.families[instances[waiter].family]
            notes.append(Note(f"{instances[waiter]} runs after {instances[waited]} on its rank", family.span))
        else:
            notes.append(Note(f"{instances[waiter]} waits for {instances[waited]} here", edges[edge].span))
    first_edge = next(edge for _, _, edge in steps if edge is not None)
    witness = Deadlock(where(concrete), tuple(Step(point(instances[a]), point(instances[b]), e) for a, b, e in steps))
    yield ("cycle", frozenset(edge for _, _, edge in steps)), error(
        f"deadlock: a cycle of waits: {path} (at {sizes_text(concrete)})", edges[first_edge].span,
        notes=notes, hint="each instance waits for the next one, so none of them can start",
        witness=witness)


def steps_text(instances, steps) -> str:
    """`a -> b -> a` for waits alone; `a -> b (runs after) -> a` where a step is serial order."""
    out = str(instances[steps[0][0]])
    for _, waited, edge in steps:
        out += f" -> {instances[waited]}" + (" (runs first on its rank)" if edge is None else "")
    return out


def ancestors(concrete: Concrete, successors, order) -> list[int]:
    """Per instance, the bitset of the instances that happen before it through edges."""
    count = len(concrete.instances)
    before = [0] * len(successors)
    for v in order:
        reach = before[v] | (1 << v if v < count else 0)
        for n in successors[v]:
            before[n] |= reach
    return before[:count]


# ---- races ---------------------------------------------------------------------------------------

def find_races(concrete: Concrete, before: list[int]):
    """Two overlapping accesses to one copy of a tensor, at least one a write, by instances that no path
    of edges orders. Accumulations of `reduce add` chunks into one target commute, so they do not race."""
    schedule = concrete.schedule
    names = list(schedule.families)
    reported = numpy.zeros((len(names), len(names)), dtype=bool)
    number = {name: n for n, name in enumerate(names)}
    family_of = [number[i.family] for i in concrete.instances]
    # the targets of `reduce add` chunks: read and written by one atomic accumulation
    adding = [schedule.families[name].writes if schedule.families[name].reduce == "add" else () for name in names]
    groups: dict[tuple[str, int], list[Access]] = defaultdict(list)
    for access in concrete.accesses:
        staged = access.region.owner is not None and schedule.tensors[access.region.tensor].role in (
            ir.Role.IN, ir.Role.INOUT)  # a peer's caller tensor is read from its copy staged at call start
        if not access.empty and not staged:
            groups[access.region.tensor, access.copy].append(access)
    for accesses in groups.values():
        if not any(a.write for a in accesses):
            continue
        lo = numpy.array([a.lo for a in accesses]).T
        hi = numpy.array([a.hi for a in accesses]).T
        who = numpy.array([a.instance for a in accesses])
        family = numpy.array([family_of[a.instance] for a in accesses])
        write = numpy.array([a.write for a in accesses])
        adds = numpy.array([a.region in adding[family_of[a.instance]] for a in accesses])
        key, key_lo, key_hi = _through(accesses)
        writes = numpy.flatnonzero(write)
        step = max(1, (1 << 20) // len(accesses))  # bounds the pair matrices to about a million cells
        for at in range(0, len(writes), step):
            w = writes[at:at + step, None]
            clash = who[None] != who[w]
            for dim_lo, dim_hi in zip(lo, hi):
                clash &= (dim_lo[None] < dim_hi[w]) & (dim_lo[w] < dim_hi[None])
            clash &= ~write[None] | (numpy.arange(len(accesses))[None] > w)  # each pair of writes once
            clash &= ~(adds[None] & adds[w])
            # writes through one arrival's ids and slots at different elements never meet (meaning.py)
            apart = numpy.zeros_like(clash)
            for dim_lo, dim_hi in zip(key_lo, key_hi):
                apart |= (dim_lo[None] >= dim_hi[w]) | (dim_lo[w] >= dim_hi[None])
            clash &= ~((key[None] >= 0) & (key[None] == key[w]) & apart)
            for row, other in zip(*numpy.nonzero(clash)):
                first = int(w[row, 0])
                a, b = int(who[first]), int(who[other])
                if reported[family[first], family[other]] or (before[b] >> a) & 1 or (before[a] >> b) & 1:
                    continue
                reported[family[first], family[other]] = reported[family[other], family[first]] = True
                yield ("race", frozenset((names[family[first]], names[family[other]]))), _race(
                    concrete, accesses[first], accesses[other])


def _through(accesses: list[Access]):
    """Per access: the arrival instance its write goes through (-1: none), and the box of index
    elements it reads, as arrays per dimension (padded with one element that every box holds)."""
    dims = max((len(a.through[1]) for a in accesses if a.through), default=0)
    key = numpy.array([a.through[0] if a.through else -1 for a in accesses])
    lo = numpy.array([list(a.through[1]) + [0] * (dims - len(a.through[1])) if a.through else [0] * dims
                      for a in accesses]).reshape(len(accesses), dims).T
    hi = numpy.array([list(a.through[2]) + [1] * (dims - len(a.through[2])) if a.through else [1] * dims
                      for a in accesses]).reshape(len(accesses), dims).T
    return key, lo, hi


def _race(concrete: Concrete, write: Access, other: Access) -> Diagnostic:
    """The race between two accesses, told from the side that should wait."""
    schedule = concrete.schedule
    tensor = write.region.tensor
    if other.write:
        # Two writers: the one declared later should wait for the other.
        waited, waiter = sorted((write, other), key=lambda access: list(schedule.families).index(
            concrete.instances[access.instance].family))
        does, may = "writes", "write"
    elif schedule.tensors[tensor].role is ir.Role.INOUT:
        # The reader wants the caller's value: the writer must wait until it has been read.
        waiter, waited, does, may = write, other, "writes", "read"
    else:
        waiter, waited, does, may = other, write, "reads", "write"
    a, b = concrete.instances[waiter.instance], concrete.instances[waited.instance]
    witness = Race(where(concrete), tensor, write.copy, point(concrete.instances[write.instance]),
                   point(concrete.instances[other.instance]), other.write,
                   tuple(map(max, write.lo, other.lo)), tuple(map(min, write.hi, other.hi)))
    message = f"{family_text(schedule, a.family)} {does} {tensor} while {family_text(schedule, b.family)} " \
              f"may still {may} it"
    indices = schedule.families[a.family].index_names
    consumer = f"{a.family}[{', '.join(indices)}]" if indices else a.family  # `keep after ...`: no indices
    hint = f"add an edge: {consumer} after {b.family}[...]"
    if a.family == b.family:
        message = (f"instances of {family_text(schedule, a.family)} "
                   f"{'both write' if other.write else 'read and write'} the same elements of {tensor}")
        hint = ("give each instance its own region" if a.rank != b.rank else
                f"give each instance its own region, or chain them: {hint}")
    elif a.rank != b.rank:
        hint += " @ every rank"
    return error(f"race: {message}", waiter.region.span, hint=hint,
                 notes=[Note(f"'{b.family}' {may}s {tensor} here: {a} and {b} touch the same elements, "
                             f"ordered by no edge (at {sizes_text(concrete)})", waited.region.span)],
                 witness=witness)
