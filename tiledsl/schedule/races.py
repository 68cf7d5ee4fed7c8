"""Deadlocks and races, proved on the graph of concrete instances: an arc from each producer to each
instance (or step of one) that waits on it, the program order of an instance's own steps, and for
deadlocks also each rank's serial order (`meaning.py`). A cycle is a deadlock; two accesses to one
region, one a write, with no path of waits between them are a race."""
from __future__ import annotations

import functools
from collections import defaultdict

import networkx
import numpy
import sympy

from tiledsl.diagnostics import Diagnostic, Note, error
from tiledsl.schedule import ir
from tiledsl.schedule.meaning import Access, Concrete, per_schedule
from tiledsl.schedule.witness import Deadlock, Point, Race, Step
from tiledsl.schedule.wording import family_text, point, sizes_text, where

# ---- the instance graph --------------------------------------------------------------------------

def graph(concrete: Concrete) -> tuple[list[list[int]], list[int]]:
    """Successor lists, producer before consumer, over the nodes (instances 0..n-1, then the entries and
    steps of instances with a loop, each chained in its program order) and one node per distinct
    waited-on producer set (so that `push[*] @ every rank` costs one node, not consumers x producers arcs),
    and the edge of each such node."""
    successors: list[list[int]] = [[] for _ in range(concrete.node_count)]
    for first, then in concrete.chain():
        successors[first].append(then)
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
        successors[node].append(concrete.node_of(wait))
    return successors, via


def add_serial_order(concrete: Concrete, successors: list[list[int]]) -> None:
    """Arcs from each instance to the next in its rank's serial order: with them a cycle is a deadlock
    even where the waits alone have none (an instance waiting on one that its rank runs later)."""
    for rank in range(concrete.world):
        serial = concrete.serial(rank)
        for first, then in zip(serial, serial[1:]):
            successors[first].append(concrete.entry(then))


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
    between two nodes are serial or program order (the later one runs after the earlier)."""
    count = concrete.node_count
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
    # program order within an instance (entry, steps, exit) is no finding of its own: fold it away
    steps = [s for s in steps if not (s[2] is None and _same_instance(concrete, s[0], s[1]))]
    steps = _serial_runs_folded(steps)
    steps.reverse()  # read as "waits for"
    families = list(concrete.schedule.families)

    def key(n):
        instance = concrete.instances[concrete.instance_of(steps[n][0])[0]]
        return families.index(instance.family), instance.rank, instance.index
    first = min(range(len(steps)), key=key)
    steps = steps[first:] + steps[:first]
    text = functools.partial(node_text, concrete)
    path = text(steps[0][0]) + "".join(f" -> {text(b)}" + (" (runs first on its rank)" if e is None else "")
                                      for _, b, e in steps)
    edges = concrete.schedule.edges
    notes = []
    for waiter, waited, edge in steps:
        if edge is None:
            family = concrete.schedule.families[concrete.instances[concrete.instance_of(waiter)[0]].family]
            notes.append(Note(f"{text(waiter)} runs after {text(waited)} on its rank", family.span))
        else:
            notes.append(Note(f"{text(waiter)} waits for {text(waited)} here", edges[edge].span))
    first_edge = next(edge for _, _, edge in steps if edge is not None)
    witness = Deadlock(where(concrete), tuple(Step(node_point(concrete, a), node_point(concrete, b), e)
                                              for a, b, e in steps))
    yield ("cycle", frozenset(edge for _, _, edge in steps)), error(
        f"deadlock: a cycle of waits: {path} (at {sizes_text(concrete)})", edges[first_edge].span,
        notes=notes, hint="each instance waits for the next one, so none of them can start",
        witness=witness)


def _serial_runs_folded(steps: list) -> list:
    """Steps (later, earlier, edge) in happens-before order, each run of serial-order steps (edge None,
    all on one rank: a rank's serial order is one chain) made one step from its first to its last
    instance. A ring's cycle passes through every instance a rank runs between the two it waits on:
    the witness names the two, as a rank's serial order is transitive."""
    folded: list = []
    for later, earlier, edge in steps:
        if edge is None and folded and folded[-1][2] is None:
            folded[-1] = (later, folded[-1][1], None)
        else:
            folded.append((later, earlier, edge))
    if len(folded) > 2 and folded[0][2] is None and folded[-1][2] is None:  # a run across the cycle's start
        folded = [(folded[0][0], folded[-1][1], None)] + folded[1:-1]
    return folded


def _same_instance(concrete: Concrete, a: int, b: int) -> bool:
    return concrete.instance_of(a)[0] == concrete.instance_of(b)[0]


def node_text(concrete: Concrete, node: int) -> str:
    """`attn[0, 1]@rank0`, with `step 2` or `entry` for a node of an instance's loop."""
    position, step = concrete.instance_of(node)
    text = str(concrete.instances[position])
    if step is None:
        return text
    return f"{text} {'before its loop' if step < 0 else f'at step {step}'}"


def node_point(concrete: Concrete, node: int) -> Point:
    position, step = concrete.instance_of(node)
    instance = concrete.instances[position]
    return Point(instance.family, tuple(instance.index), instance.rank, step)


def ancestors(concrete: Concrete, successors, order) -> list[int]:
    """Per node (instance, or entry or step of one), the bitset of the nodes that happen before it
    through edges and program order."""
    count = concrete.node_count
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
    found: dict[frozenset, tuple[Access, Access, bool]] = {}  # per pair of families: a race, across ranks
    rank = [i.rank for i in concrete.instances]
    number = {name: n for n, name in enumerate(names)}
    family_of = [number[i.family] for i in concrete.instances]
    # the targets of `reduce add` chunks: read and written by one atomic accumulation
    # (regions by identity: comparing them as dataclasses compares their sympy expressions)
    adding = {id(r) for f in schedule.families.values() if f.reduce == "add" for r in f.writes}
    # a peer's caller tensor is read from its copy staged at call start
    staged = {id(r) for f in schedule.families.values() for r in f.reads + f.writes
              if r.owner is not None and schedule.tensors[r.tensor].role in (ir.Role.IN, ir.Role.INOUT)}
    groups: dict[tuple[str, int], list[Access]] = defaultdict(list)
    for access in concrete.accesses:
        if id(access.region) not in staged and not access.empty:
            groups[access.region.tensor, access.copy].append(access)
    for accesses in groups.values():
        if not any(a.write for a in accesses):
            continue
        lo = numpy.array([a.lo for a in accesses]).T
        hi = numpy.array([a.hi for a in accesses]).T
        who = numpy.array([a.instance for a in accesses])
        node = [concrete.node_of(a) for a in accesses]
        family = numpy.array([family_of[a.instance] for a in accesses])
        write = numpy.array([a.write for a in accesses])
        adds = numpy.array([id(a.region) in adding for a in accesses])
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
                pair = frozenset((names[family[first]], names[family[other]]))
                across = rank[who[first]] != rank[who[other]]
                held = found.get(pair)
                # one race per pair of families; between two families, one across ranks if there is one,
                # so that the hint's edge reaches every rank it must (`@ every rank`)
                if held is not None and (held[2] or not across or len(pair) == 1):
                    continue
                na, nb = node[first], node[other]
                if (before[nb] >> na) & 1 or (before[na] >> nb) & 1:
                    continue
                found[pair] = (accesses[first], accesses[other], across)
    for pair, (write, other, _) in found.items():
        yield ("race", pair), _race(concrete, write, other)


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
    elif _reads_first(concrete, reader=other, writer=write):
        # The reader wants the value from before the write: the writer must wait until it has been read.
        waiter, waited = write, other
    else:
        waiter, waited = other, write
    if _edge_closes_cycle(concrete, waiter, waited):
        # `a after b` where b already waits on a deadlocks: the other order is the one an edge can give
        waiter, waited = waited, waiter
    does = "writes" if waiter.write else "reads"
    may = "write" if waited.write else "read"
    a, b = concrete.instances[waiter.instance], concrete.instances[waited.instance]
    witness = Race(where(concrete), tensor, write.copy, node_point(concrete, concrete.node_of(write)),
                   node_point(concrete, concrete.node_of(other)), other.write,
                   tuple(map(max, write.lo, other.lo)), tuple(map(min, write.hi, other.hi)))
    message = f"{family_text(schedule, a.family)} {does} {tensor} while {family_text(schedule, b.family)} " \
              f"may still {may} it"
    indices = schedule.families[a.family].index_names
    consumer = f"{a.family}[{', '.join(indices)}]" if indices else a.family  # `keep after ...`: no indices
    dep = _producer_dep(concrete, waiter, waited) if a.family != b.family else None
    hint = f"add an edge: {consumer} after {dep or b.family + '[...]'}"
    if a.family == b.family:
        message = (f"instances of {family_text(schedule, a.family)} "
                   f"{'both write' if other.write else 'read and write'} the same elements of {tensor}")
        # a read of what another rank's instance writes: the wait a ring or a chain forgot
        flow = not other.write and schedule.tensors[tensor].role is not ir.Role.INOUT
        chain = _ring_edge(concrete, waiter, waited) if a.rank != b.rank and flow else None
        hint = ("give each instance its own region" if a.rank != b.rank and chain is None else
                f"add an edge: {chain} (a chain across ranks), or give each instance its own region"
                if chain is not None else f"give each instance its own region, or chain them: {hint}")
    elif _edge_closes_cycle(concrete, waiter, waited):
        # each family already waits on the other one: no edge between the two can order them
        hint = f"'{a.family}' and '{b.family}' each wait on the other already: give each its own region"
    elif a.rank != b.rank and dep is None:
        hint += " @ every rank"
    step = concrete.instance_of(concrete.node_of(waiter))[1]
    if step is not None and step >= 0:
        # the read happens in a step of a loop: that step's `wait` is what orders it
        hint = f"wait for it in the loop, before the step reads it: `wait {b.family}[...]`"
    at_a, at_b = node_text(concrete, concrete.node_of(waiter)), node_text(concrete, concrete.node_of(waited))
    return error(f"race: {message}", waiter.region.span, hint=hint,
                 notes=[Note(f"'{b.family}' {may}s {tensor} here: {at_a} and {at_b} touch the same elements, "
                             f"ordered by no edge (at {sizes_text(concrete)})", waited.region.span)],
                 witness=witness)


def _producer_dep(concrete: Concrete, waiter: Access, waited: Access) -> str | None:
    """The producer side of the edge a race needs, by the indices and rank that its region names from
    the consumer's (`take[s, i]` reads `S@s[i*BLOCK : +BLOCK]`, which `stage[i]` on rank s writes:
    `stage[i] @ s`), checked against the racing pair of instances. None where the regions do not name
    one instance (starts that are not an integer map of the consumer's indices, a write into a peer's
    copy): the hint then writes `[...]`."""
    schedule = concrete.schedule
    a, b = concrete.instances[waiter.instance], concrete.instances[waited.instance]
    consumer, producer = schedule.families[a.family], schedule.families[b.family]
    regions = (waiter.region, waited.region)
    if waited.region.owner is not None or any(r.rows is not None or ir.device_values(r.owner) or
                                              any(ir.device_values(d.start) for d in r.dims) for r in regions):
        return None  # a write into a peer's copy, or indices read from tensors: the user fills `[...]`
    owner = waiter.region.owner if waiter.region.owner is not None else ir.RANK
    unknowns = [sympy.Dummy(name) for name in producer.index_names]
    theirs = {ir.index_symbol(n): u for n, u in zip(producer.index_names, unknowns)} | {ir.RANK: owner}
    equations = [sympy.expand(dw.start.xreplace(theirs) - dc.start)
                 for dw, dc in zip(waited.region.dims, waiter.region.dims)]
    equations = [e for e in equations if e.free_symbols & set(unknowns)]
    solved = sympy.solve(equations, unknowns, dict=True) if equations else []
    if len(solved) != 1 or set(solved[0]) != set(unknowns):
        return None
    index = [solved[0][u] for u in unknowns]
    mine = {ir.index_symbol(n): v for n, v in zip(consumer.index_names, a.index)} | {ir.RANK: a.rank,
                                                                                     ir.WORLD: concrete.world}
    sizes = {ir.size_symbol(k): v for k, v in concrete.sizes.items()}
    # where the read spans more than one instance's block along an index (a copy of a whole tensor
    # that tiles write block by block: `gather[s] after mm[*, *] @ s`), the edge names all of them
    wider = {n for n, u in enumerate(unknowns)
             for dw, dc in zip(waited.region.dims, waiter.region.dims)
             if u in dw.start.xreplace(theirs).free_symbols
             and sympy.sympify(dc.size - dw.size).subs(mine | sizes).is_positive}
    named = [e for n, e in enumerate(index) if n not in wider]
    at = [sympy.sympify(e).subs(mine | sizes) for e in (*named, owner)]
    if any(e.is_integer is not True or e.free_symbols & set(unknowns) for e in named) or \
            [int(v) if v.is_Integer else None for v in at] != [*(v for n, v in enumerate(b.index) if n not in wider),
                                                                b.rank]:
        return None
    texts = ["*" if n in wider else _tds_text(e) for n, e in enumerate(index)] + [_tds_text(owner)]
    if None in texts:
        return None
    *index_text, rank_text = texts
    dep = f"{b.family}[{', '.join(index_text)}]" if index_text else b.family
    return dep if owner == ir.RANK else f"{dep} @ {rank_text if owner.is_Atom else f'({rank_text})'}"


def _tds_text(expr: sympy.Expr) -> str | None:
    """An index or rank as a program writes it (`i + 1`, `(rank + 1) mod world`); None for anything
    else (a fraction, a floor)."""
    if isinstance(expr, sympy.Mod):
        inner = [_tds_text(e) for e in expr.args]
        return None if None in inner else f"({inner[0]}) mod {inner[1]}"
    plain = (sympy.Symbol, sympy.Integer, sympy.Add, sympy.Mul)
    return str(expr) if all(isinstance(e, plain) for e in sympy.preorder_traversal(expr)) else None


def _reads_first(concrete: Concrete, reader: Access, writer: Access) -> bool:
    """Whether a read that races with a write means the value from before it (the writer should wait
    for the reader): the caller's value of an `inout` tensor, or one that another family writes and the
    reader already waits on (a buffer reused: read what `first` wrote, then overwritten by `then`)."""
    schedule = concrete.schedule
    tensor = reader.region.tensor
    if schedule.tensors[tensor].role is ir.Role.INOUT:
        return True
    reading, writing = (concrete.instances[a.instance].family for a in (reader, writer))
    if reading == writing:
        return False  # within one family, the order of its instances decides (`_ring_edge`)
    feeds = networkx.ancestors(_families(schedule), reading) - {writing}
    return any(r.tensor == tensor for f in feeds for r in schedule.families[f].writes)


def _edge_closes_cycle(concrete: Concrete, waiter: Access, waited: Access) -> bool:
    """Whether `waiter's family after waited's family` would close a cycle of families (the waited
    family already waits, through edges, on the waiter's): a deadlock, whatever the index map."""
    a, b = (concrete.instances[x.instance].family for x in (waiter, waited))
    return a != b and networkx.has_path(_families(concrete.schedule), a, b)


@per_schedule
def _families(schedule: ir.Schedule) -> networkx.DiGraph:
    """The families, with an arc from each producer to each family that waits on it."""
    families = networkx.DiGraph()
    families.add_nodes_from(schedule.families)
    families.add_edges_from((e.producer, e.consumer) for e in schedule.edges if e.producer != e.consumer)
    return families


def _ring_edge(concrete: Concrete, waiter: Access, waited: Access) -> str | None:
    """The edge that chains two instances of one family on different ranks, by their index and rank
    offsets: what a ring or a chain whose forwarding wait is missing needs (`step[t, i] after step[t - 1,
    i] @ ((rank - 1) mod world)`; `hop[i] after hop[i] @ (rank - 1)`). `waiter` is the access that must
    reads what `waited` writes. None where no edge between the two can be right: the waiter comes
    earlier in the family's order, or each writes what the other reads (no order of the two is race
    free)."""
    a, b = concrete.instances[waiter.instance], concrete.instances[waited.instance]
    first, then = concrete.order[waited.instance], concrete.order[waiter.instance]
    if then < first or _writes_what_it_reads(concrete, waiter.instance, waited.instance):
        return None
    by = a.rank - b.rank
    if then > first:  # later in the order: a ring, every rank waiting on the one `by` before it
        by %= concrete.world
        rank = f"((rank - {by}) mod world)" if 2 * by <= concrete.world else \
            f"((rank + {concrete.world - by}) mod world)"
    else:  # the same place in the order: a chain that starts at the first ranks (around a ring it would wait on itself)
        rank = f"(rank - {by})" if by > 0 else f"(rank + {-by})"
    names = concrete.schedule.families[a.family].index_names

    def shifted(name: str, offset: int) -> str:
        return name if offset == 0 else f"{name} - {offset}" if offset > 0 else f"{name} + {-offset}"
    index = ", ".join(shifted(n, x - y) for n, x, y in zip(names, a.index, b.index))
    return f"{a.family}[{', '.join(names)}] after {a.family}[{index}] @ {rank}"


def _writes_what_it_reads(concrete: Concrete, writer: int, reader: int) -> bool:
    """Whether instance `writer` writes elements that instance `reader` reads (peers' staged copies of
    caller tensors aside: those are read before anything is written)."""
    tensors = concrete.schedule.tensors
    mine = [a for a in concrete.accesses if a.instance == writer and a.write and not a.empty]
    for read in (a for a in concrete.accesses if a.instance == reader and not a.write and not a.empty):
        if read.region.owner is not None and tensors[read.region.tensor].role in (ir.Role.IN, ir.Role.INOUT):
            continue
        if any(w.region.tensor == read.region.tensor and w.copy == read.copy
               and all(p < y and q < x for p, x, q, y in zip(w.lo, w.hi, read.lo, read.hi)) for w in mine):
            return True
    return False
