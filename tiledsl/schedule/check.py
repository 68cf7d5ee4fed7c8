"""The checks that prove a schedule safe before any code is emitted: no race, no deadlock (cycle of
waits, wait on an instance no one runs, more spinning programs than SMs), no region out of bounds.

Races, cycles, orphan waits and bounds are decided on concrete instances at a few world sizes
(`instances.default_sizes`), where every index map and region is an integer: exact, and fast enough
to run on every build. Each finding is reported once, with its `.tds` sites."""
from __future__ import annotations

import dataclasses
from collections import defaultdict

import networkx
import numpy

from tiledsl.diagnostics import Diagnostic, Note, error, warning
from tiledsl.grammar import ast
from tiledsl.schedule import ir
from tiledsl.schedule.instances import Access, Concrete, default_sizes, instantiate

SM_COUNT = 132        # SMs of an H100 / H200: programs that spin on signals must all be resident at once
WORLDS = (2, 3, 4)    # world sizes the schedule is instantiated at


def check(schedule: ir.Schedule) -> list[Diagnostic]:
    """Every error and warning the schedule has, sorted by source position."""
    found: dict[object, Diagnostic] = {}  # keyed so that a finding made at several worlds is reported once
    for key, diagnostic in [*_resident_programs(schedule), *_unused(schedule), *_constant_conditions(schedule)]:
        found.setdefault(key, diagnostic)
    unchecked = []
    for world in WORLDS:
        try:
            concrete = instantiate(schedule, world, default_sizes(schedule, world))
        except ValueError as why:
            unchecked.append(str(why))  # the launch conditions exclude this world, say
            continue
        except ArithmeticError as why:
            unchecked.append(f"{why} at world {world}")  # a size divides by `rank`, say
            continue
        for key, diagnostic in _concrete_findings(concrete):
            found.setdefault(key, diagnostic)
    if len(unchecked) == len(WORLDS) and not any(key[0] == "condition" for key in found):
        found["unchecked"] = warning(f"races, deadlocks and bounds were not checked: {unchecked[0]}",
                                     schedule.program.name.span)
    return sorted(found.values(), key=lambda d: (d.span.line, d.span.column, d.message))


def _concrete_findings(concrete: Concrete):
    yield from _bounds(concrete)
    yield from _orphans(concrete)
    yield from _self_waits(concrete)
    yield from _unsignalled(concrete)
    yield from _order_mismatch(concrete)
    successors, via = _graph(concrete)
    order = _topological(successors)
    if len(order) < len(successors):
        yield from _cycle(concrete, successors, via, set(range(len(successors))) - set(order))
    else:
        yield from _races(concrete, _ancestors(concrete, successors, order))


# ---- text ----------------------------------------------------------------------------------------

def _family_text(schedule: ir.Schedule, name: str) -> str:
    return f"{schedule.families[name].kind.value} '{name}'"


def _sizes_text(concrete: Concrete) -> str:
    return ", ".join([f"{p}={concrete.sizes[p]}" for p in concrete.schedule.params] + [f"world={concrete.world}"])


def _at(instance) -> str:
    return f"{instance.family}[{', '.join(map(str, instance.index))}] on rank {instance.rank}"


def _index_text(index) -> str:
    return "[" + ", ".join("*" if i is None else str(i) for i in index) + "]"


def _site(family: ir.Family, span: ast.Span) -> ast.Span:
    return span if span.line > 0 else family.span


# ---- sizes ---------------------------------------------------------------------------------------

def _constant_conditions(schedule: ir.Schedule):
    """A launch condition on consts alone that fails would refuse every launch: refuse the build."""
    consts = {ir.size_symbol(name): value for name, value in schedule.consts.items()}
    for condition in schedule.conditions:
        if condition.holds.free_symbols <= set(consts) and not bool(condition.holds.subs(consts)):
            values = ", ".join(f"{s} = {consts[s]}" for s in sorted(condition.holds.free_symbols, key=str))
            yield ("condition", condition.message), error(
                f"{condition.message}, and it is not" + (f" ({values})" if values else ""), condition.span)


# ---- programs per rank ---------------------------------------------------------------------------

def _resident_programs(schedule: ir.Schedule):
    on_sms = [f for f in schedule.families.values() if f.engine.kind is not ir.EngineKind.COPY_ENGINE]
    fixed = [f for f in on_sms if f.engine.programs is not None]
    rest = [f for f in on_sms if f.engine.programs is None]
    total = sum(f.engine.programs for f in fixed)
    if total <= SM_COUNT - (1 if rest else 0):
        return
    largest = max(fixed, key=lambda f: f.engine.programs)
    notes = [Note(f"'{f.name}' asks for {f.engine.programs}", _site(f, f.engine.span)) for f in fixed
             if f is not largest]
    if total > SM_COUNT:
        message = f"the families ask for {total} resident SM programs, but the GPU has {SM_COUNT} SMs"
    else:
        message = f"the families ask for all {SM_COUNT} SMs, leaving none for '{rest[0].name}' (sms(rest))"
    yield "programs", error(message, _site(largest, largest.engine.span), notes=notes,
                            hint="programs that spin on signals must all be resident at once, or they deadlock; "
                                 "ask for fewer")


# ---- warnings ------------------------------------------------------------------------------------

def _unused(schedule: ir.Schedule):
    families = schedule.families.values()
    readers, writers = defaultdict(set), defaultdict(set)
    for f in families:
        for r in f.reads:
            readers[r.tensor].add(f.name)
        for r in f.writes:
            writers[r.tensor].add(f.name)
    for name, tensor in schedule.tensors.items():
        if not readers[name] and not writers[name]:
            yield ("unused", name), warning(f"'{name}' is never read or written", tensor.span)
        elif tensor.role is ir.Role.OUT and not writers[name]:
            yield ("unwritten", name), warning(f"'{name}' is `out` but nothing writes it", tensor.span)
    for f in families:
        for r in f.reads:
            role = schedule.tensors[r.tensor].role
            if role in (ir.Role.SYMM, ir.Role.LOCAL) and not writers[r.tensor]:
                yield ("unwritten", r.tensor), warning(
                    f"{_family_text(schedule, f.name)} reads '{r.tensor}', but nothing in the program writes it",
                    r.span, hint=f"`{role.value}` tensors start with whatever the last call left there")
    waited = {e.producer for e in schedule.edges if e.producer != e.consumer}
    for f in families:
        written = {r.tensor for r in f.writes}
        scratch = all(schedule.tensors[t].role in (ir.Role.SYMM, ir.Role.LOCAL) for t in written)
        if f.name not in waited and written and scratch and not any(readers[t] - {f.name} for t in written):
            yield ("lost", f.name), warning(
                f"nothing waits on {_family_text(schedule, f.name)} and nothing reads what it writes "
                f"({', '.join(sorted(written))}): its work is lost", f.span)


# ---- bounds --------------------------------------------------------------------------------------

def _slices(program: ast.Program) -> dict[ast.Span, tuple]:
    """The slices of every subscript in the families, by span: the IR does not keep whether a range
    was written `a : b` (must fit) or `a : +n` (clipped at the end of the dimension)."""
    found = {}

    def walk(node):
        if isinstance(node, ast.Subscript):
            found[node.span] = node.slices
        if isinstance(node, tuple):
            for item in node:
                walk(item)
        elif dataclasses.is_dataclass(node) and not isinstance(node, ast.Span):
            for f in dataclasses.fields(node):
                walk(getattr(node, f.name))

    for decl in program.decls:
        if isinstance(decl, (ast.ChunkDecl, ast.TileDecl)):
            walk(decl)
    return found


def _bounds(concrete: Concrete):
    schedule = concrete.schedule
    slices = _slices(schedule.program)
    for access in concrete.accesses:
        pieces = slices.get(access.region.span, ())
        shape = concrete.shapes[access.region.tensor]
        for dim, ((first, last, stop), extent) in enumerate(zip(access.reach, shape)):
            piece = pieces[dim] if dim < len(pieces) else None
            if isinstance(piece, ast.Range) and piece.start is None and piece.stop is None and piece.size is None:
                continue  # `:` is the whole dimension
            problem = None
            if first < 0:
                problem = f"from {first}"
            elif last >= extent:
                problem = f"from {last}"
            elif isinstance(piece, ast.Range) and piece.stop is not None and stop > extent:
                problem = f"up to {stop}"
            if problem is None:
                continue
            instance = concrete.instances[access.instance]
            verb = "writes" if access.write else "reads"
            yield ("bounds", access.region.span, dim), error(
                f"out of bounds: dimension {dim} of '{access.region.tensor}' has size {extent}, but "
                f"{_at(instance)} {verb} it {problem} (at {_sizes_text(concrete)})",
                piece.span if piece is not None else access.region.span,
                hint="`a : +n` may run past the end of a dimension (a ragged last tile is clipped); "
                     "`a : b` and indices may not")


# ---- waits ---------------------------------------------------------------------------------------

def _orphans(concrete: Concrete):
    schedule = concrete.schedule
    for orphan in concrete.orphans:
        edge = schedule.edges[orphan.edge]
        consumer = concrete.instances[orphan.consumer]
        wanted = f"{edge.producer}{_index_text(orphan.index)}"
        if orphan.rank != consumer.rank or edge.ranks is not ir.RankSet.LOCAL:
            wanted += f" on rank {orphan.rank}"
        if not 0 <= orphan.rank < concrete.world:
            why = f"ranks are 0..{concrete.world - 1}"
        else:
            extents = concrete.extents[edge.producer][orphan.rank]
            spans = [f"0..{n - 1}" for n in extents]
            has = ("no instances" if 0 in extents else
                   f"instances {spans[0]}" if len(spans) == 1 else f"instances [{', '.join(spans)}]")
            why = f"{edge.producer} has {has}"
        producer = schedule.families[edge.producer]
        yield ("orphan", orphan.edge), error(
            f"orphan wait: {_at(consumer)} waits for {wanted}, but {why} (at {_sizes_text(concrete)})",
            edge.span, notes=[Note(f"'{producer.name}' is declared here", producer.span)],
            hint="no one will ever signal this wait; check the index map")


def _self_waits(concrete: Concrete):
    """`mm[i] after mm[i-1]`: a family runs its instances in order, so it may only wait on earlier ones."""
    schedule = concrete.schedule
    for wait in concrete.waits:
        edge = schedule.edges[wait.edge]
        if edge.producer != edge.consumer:
            continue
        late = [p for p in wait.producers if concrete.order[p] >= concrete.order[wait.consumer]]
        if late:
            consumer, producer = concrete.instances[wait.consumer], concrete.instances[late[0]]
            what = "itself" if late[0] == wait.consumer else f"{_at(producer)}, which comes after it"
            yield ("self", wait.edge), error(
                f"deadlock: {_at(consumer)} waits for {what} in the order of '{edge.consumer}' "
                f"(at {_sizes_text(concrete)})", edge.span,
                hint="a family runs its instances in order: it may only wait on its earlier instances")


def _unsignalled(concrete: Concrete):
    """An NVSHMEM put signals only the rank it writes to (the signal travels with the data, as one
    putmem_signal): a wait on it from any other rank would never see the signal and time out."""
    schedule = concrete.schedule
    targets: dict[int, set[int]] = {}
    for access in concrete.accesses:
        if access.write:
            targets.setdefault(access.instance, set()).add(access.copy)
    for wait in concrete.waits:
        edge = schedule.edges[wait.edge]
        producer = schedule.families[edge.producer]
        if producer.engine.kind is not ir.EngineKind.NVSHMEM:
            continue
        rank = concrete.instances[wait.consumer].rank
        for p in wait.producers:
            if rank not in targets.get(p, {rank}):
                put, consumer = concrete.instances[p], concrete.instances[wait.consumer]
                to = ", ".join(f"rank {r}" for r in sorted(targets[p]))
                yield ("unsignalled", wait.edge), error(
                    f"deadlock: {_at(consumer)} waits for {_at(put)}, an nvshmem put that signals only the "
                    f"rank it writes to ({to}) (at {_sizes_text(concrete)})", edge.span,
                    notes=[Note(f"'{producer.name}' is declared here", producer.span)],
                    hint="wait on the put from the rank it writes to, or run the chunk on sms(N), "
                         "which signals every rank")
                break


def _order_mismatch(concrete: Concrete):
    """A tile that waits on a chunk of its own rank should find first what it needs first: if the chunk
    runs its instances in another order, the tile's first instances wait behind transfers they do not
    need (seen on H200: ag_gemm gathering in index order left rank 3 waiting for every copy, and the
    entry barrier made every rank pay it). A warning, since the schedule is still correct."""
    schedule = concrete.schedule
    for wait in concrete.waits:
        edge = schedule.edges[wait.edge]
        consumer, producer = schedule.families[edge.consumer], schedule.families[edge.producer]
        if (edge.ranks is not ir.RankSet.LOCAL or None in edge.index_map or consumer.kind is not ir.Kind.TILE
                or producer.kind is not ir.Kind.CHUNK):
            continue
        rank = concrete.instances[wait.consumer].rank
        mine = concrete.ranges[edge.consumer][rank]
        if wait.consumer != min(mine, key=concrete.order.__getitem__):
            continue  # judged by the instance that runs first on this rank
        chunks = concrete.ranges[edge.producer][rank]
        ranked = sorted(chunks, key=concrete.order.__getitem__)
        needed = max(ranked.index(p) for p in wait.producers)
        if needed > 0:
            first = concrete.instances[wait.consumer]
            late = concrete.instances[ranked[needed]]
            yield ("order", wait.edge), warning(
                f"{_at(first)} runs first but waits for {_at(late)}, which '{producer.name}' runs "
                f"{_ordinal(needed + 1)} of {len(ranked)}: the chunks do not arrive in the order the tiles "
                f"use them (at {_sizes_text(concrete)})", edge.span,
                hint=f"order '{producer.name}' the way '{consumer.name}' uses it, e.g. `order {producer.name} by ...`")


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


# ---- the instance graph --------------------------------------------------------------------------

def _graph(concrete: Concrete) -> tuple[list[list[int]], list[int]]:
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


def _topological(successors: list[list[int]]) -> list[int]:
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


def _cycle(concrete: Concrete, successors, via, left: set[int]):
    """One cycle of waits, read off the nodes that Kahn's order could not reach. Every edge map is a
    total function of the consumer's instance, so a cycle between families always shows up here."""
    count, instances = len(concrete.instances), concrete.instances
    graph = networkx.DiGraph((v, n) for v in left for n in successors[v] if n in left)
    arcs = networkx.find_cycle(graph)
    start = next(n for n, (source, _) in enumerate(arcs) if source < count)
    steps = []  # (waiter, waited for, edge number), in happens-before order
    for source, target in arcs[start:] + arcs[:start]:
        if source < count:  # a producer, then its producer-set node, then the consumer
            producer = source
        else:
            steps.append((target, producer, via[source - count]))
    if len({instances[waiter].family for waiter, _, _ in steps}) == 1:
        return  # waits within one family only: `_self_waits` names the wait on a later instance
    steps.reverse()  # read as "waits for"
    families = list(concrete.schedule.families)
    first = min(range(len(steps)), key=lambda n: (families.index(instances[steps[n][0]].family),
                                                  instances[steps[n][0]].rank, instances[steps[n][0]].index))
    steps = steps[first:] + steps[:first]
    path = " -> ".join(str(instances[waiter]) for waiter, _, _ in steps) + f" -> {instances[steps[0][0]]}"
    edges = concrete.schedule.edges
    notes = [Note(f"{instances[waiter]} waits for {instances[waited]} here", edges[edge].span)
             for waiter, waited, edge in steps]
    yield ("cycle", frozenset(edge for _, _, edge in steps)), error(
        f"deadlock: a cycle of waits: {path} (at {_sizes_text(concrete)})", edges[steps[0][2]].span,
        notes=notes, hint="each instance waits for the next one, so none of them can start")


def _ancestors(concrete: Concrete, successors, order) -> list[int]:
    """Per instance, the bitset of the instances that happen before it through edges."""
    count = len(concrete.instances)
    before = [0] * len(successors)
    for v in order:
        reach = before[v] | (1 << v if v < count else 0)
        for n in successors[v]:
            before[n] |= reach
    return before[:count]


# ---- races ---------------------------------------------------------------------------------------

def _races(concrete: Concrete, before: list[int]):
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
        writes = numpy.flatnonzero(write)
        step = max(1, (1 << 20) // len(accesses))  # bounds the pair matrices to about a million cells
        for at in range(0, len(writes), step):
            w = writes[at:at + step, None]
            clash = who[None] != who[w]
            for dim_lo, dim_hi in zip(lo, hi):
                clash &= (dim_lo[None] < dim_hi[w]) & (dim_lo[w] < dim_hi[None])
            clash &= ~write[None] | (numpy.arange(len(accesses))[None] > w)  # each pair of writes once
            clash &= ~(adds[None] & adds[w])
            for row, other in zip(*numpy.nonzero(clash)):
                first = int(w[row, 0])
                a, b = int(who[first]), int(who[other])
                if reported[family[first], family[other]] or (before[b] >> a) & 1 or (before[a] >> b) & 1:
                    continue
                reported[family[first], family[other]] = reported[family[other], family[first]] = True
                yield ("race", frozenset((names[family[first]], names[family[other]]))), _race(
                    concrete, accesses[first], accesses[other])


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
    message = f"{_family_text(schedule, a.family)} {does} {tensor} while {_family_text(schedule, b.family)} " \
              f"may still {may} it"
    hint = f"add an edge: {a.family}[{', '.join(schedule.families[a.family].index_names)}] after {b.family}[...]"
    if a.family == b.family:
        message = (f"instances of {_family_text(schedule, a.family)} "
                   f"{'both write' if other.write else 'read and write'} the same elements of {tensor}")
        hint = ("give each instance its own region" if a.rank != b.rank else
                f"give each instance its own region, or chain them: {hint}")
    elif a.rank != b.rank:
        hint += " @ every rank"
    return error(f"race: {message}", waiter.region.span, hint=hint,
                 notes=[Note(f"'{b.family}' {may}s {tensor} here: {a} and {b} touch the same elements, "
                             f"ordered by no edge (at {_sizes_text(concrete)})", waited.region.span)])
