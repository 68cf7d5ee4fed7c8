"""The checks that prove a schedule safe before any code is emitted: no race, no deadlock (a cycle of
waits and serial order, families that wait on each other, a wait no signal reaches, more spinning
programs than SMs), no region out of bounds. What is proved is the schedule's one meaning
(`schedule/meaning.py`), the same the code generator prints and the reference runs.

Races, cycles and bounds are decided on concrete instances at a few world sizes
(`meaning.default_sizes`), where every index map and region is an integer: exact, and fast enough
to run on every build. Each finding is reported once, with its `.tds` sites, and each error carries
its witness (`schedule/witness.py`): the instances that prove it."""
from __future__ import annotations

import dataclasses
from collections import defaultdict

from tiledsl import gpus
from tiledsl.diagnostics import Diagnostic, Note, error, warning
from tiledsl.grammar import ast
from tiledsl.schedule import carried, ir, races, transport
from tiledsl.schedule.meaning import (MAX_INSTANCES, Concrete, FamilyCycleError, default_sizes, family_sequence,
                                     instantiate, launch_conditions, per_schedule, ragged_sizes, runs_on,
                                     scaled_sizes, small_sizes, topologies, total_instances, waits_on_itself)
from tiledsl.schedule.padding import clipped_regions, padded_reductions
from tiledsl.schedule.witness import Deadlock, FamilyCycle, NoSuchRank, OutOfBounds, Step, Unsignalled
from tiledsl.schedule.wording import at, family_text, index_text, point, site, sizes_text, where

SM_COUNT = gpus.DEFAULT.sms  # the default GPU's: programs that spin on signals must all be resident at once
# a family that waits on itself is proved, alone, at sizes up to this many of its instances (all ranks
# together), each 4 times the last: 0.1 s for chain_broadcast's hop at its three worlds
WIDE_INSTANCES = 1024


def check(schedule: ir.Schedule, gpu: gpus.GPU | str | None = None) -> list[Diagnostic]:
    """Every error and warning the schedule has, sorted by source position. The residency of the kernel's
    programs is proven for `gpu` (tiledsl.gpus; the default H200's 132 SMs): a launch on a GPU where it
    would not hold is refused by the launcher."""
    gpu = gpus.named(gpu)
    found: dict[object, Diagnostic] = {}  # keyed so that a finding made at several worlds is reported once
    for key, diagnostic in [*_resident_programs(schedule, gpu), *_unused(schedule), *_constant_conditions(schedule)]:
        found.setdefault(key, diagnostic)
    try:
        family_sequence(schedule)
        cyclic = None
    except FamilyCycleError as why:
        cyclic = why
    unchecked = []
    clipped = set()  # the loads some checked size clips at the end of a dimension
    checked = topologies(schedule)
    for topology in checked:
        world, nodes = topology.world, topology.nodes
        try:
            # sizes the tiles divide, and sizes where last tiles are partial
            divided = default_sizes(schedule, world, nodes=nodes)
            at_sizes = [divided, ragged_sizes(schedule, world, nodes=nodes, sizes=divided),
                        small_sizes(schedule, world, nodes=nodes, sizes=divided)]
            concretes = [instantiate(schedule, world, sizes, nodes) for sizes in at_sizes if sizes is not None]
        except ValueError as why:
            unchecked.append(str(why))  # the launch conditions exclude this world, say
            continue
        except ArithmeticError as why:
            unchecked.append(f"{why} at {topology}")  # a size divides by `rank`, say
            continue
        for n, concrete in enumerate(concretes):
            clipped |= clipped_regions(concrete)
            # the order warning is about speed at sizes a program is meant for, not at ragged edges
            for key, diagnostic in _concrete_findings(concrete, order_warnings=n == 0):
                found.setdefault(key, diagnostic)
        for key, diagnostic in _wide_chains(schedule, world, nodes, divided, found):
            found.setdefault(key, diagnostic)
    for key, diagnostic in padded_reductions(schedule, clipped):
        found.setdefault(key, diagnostic)
    if cyclic is not None and not any(key[0] in ("cycle", "self") for key in found):
        key, diagnostic = _family_cycle(schedule, cyclic)
        found[key] = diagnostic
    if len(unchecked) == len(checked) and not any(key[0] == "condition" for key in found):
        found["unchecked"] = warning(f"races, deadlocks and bounds were not checked: {unchecked[0]}",
                                     schedule.program.name.span)
    return sorted(found.values(), key=lambda d: (d.span.line, d.span.column, d.message))


AT_MOST_INSTANCES = 20 * MAX_INSTANCES  # check_at's proof at a run's own sizes: a few seconds of it


def check_at(schedule: ir.Schedule, world: int, sizes: dict[str, int], nodes: int = 1) -> list[Diagnostic]:
    """The errors of the schedule at one world and set of sizes (params and consts), those a run is
    about to use: `check` proves a few worlds, and a program may be right only at some (`S[rank, :]`
    of a `[4, N]` tensor at world 5, `X@(world - 2)` at world 1). Peer ranks and bounds are proved at
    any sizes (one pass over the accesses); races and deadlocks where the instances stay few enough
    for the checker's search (meaning.MAX_INSTANCES). Past AT_MOST_INSTANCES (a 64 MB all-reduce at
    world 8: 72 s to instantiate) the proof is at this world and its default sizes, the run's consts
    kept: what depends on the world is proved there, what depends on the sizes at check's sizes."""
    if total_instances(schedule, world, sizes, nodes) > AT_MOST_INSTANCES:
        consts = {name: sizes[name] for name in schedule.consts if name in sizes}
        sizes = {**default_sizes(schedule, world, nodes=nodes), **consts}
    concrete = instantiate(schedule, world, sizes, nodes)
    findings = _concrete_findings(concrete, order_warnings=False) if len(concrete.instances) <= MAX_INSTANCES \
        else _bounds(concrete)
    found: dict[object, Diagnostic] = {}
    for key, diagnostic in findings:
        if diagnostic.severity == "error":
            found.setdefault(key, diagnostic)
    return sorted(found.values(), key=lambda d: (d.span.line, d.span.column, d.message))


def _concrete_findings(concrete: Concrete, order_warnings: bool = True):
    yield from _bounds(concrete)
    yield from transport.findings(concrete)
    yield from _skipped(concrete)
    yield from _unsignalled(concrete)
    yield from carried.findings(concrete)
    # a family waiting on itself or a later instance of its own: named as such, not as a cycle
    self_waits = list(_self_waits(concrete))
    yield from self_waits
    successors, via = races.graph(concrete)
    order = races.topological(successors)
    if len(order) < len(successors):  # a cycle of waits alone
        if not self_waits:
            yield from races.cycle(concrete, successors, via, set(range(len(successors))) - set(order))
        return
    before = races.ancestors(concrete, successors, order)
    yield from races.find_races(concrete, before)
    yield from carried.stale_reads(concrete, before)
    if concrete.sequence is None:
        return  # families that wait on each other: no serial order (reported once, by check())
    if order_warnings:
        yield from _order_mismatch(concrete)
    if not self_waits:
        races.add_serial_order(concrete, successors)
        order = races.topological(successors)
        if len(order) < len(successors):
            yield from races.cycle(concrete, successors, via, set(range(len(successors))) - set(order))


def _wide_chains(schedule: ir.Schedule, world: int, nodes: int, divided: dict[str, int], found: dict):
    """A family that waits on itself, proved alone at sizes k times `divided` (k = 2, 8, 32, ... up to
    WIDE_INSTANCES of its instances): the sizes above give each index two instances, too few for an
    order whose keys repeat every `world` instances to put a waiter before what it waits on (`order
    seed by (i - rank) mod world` with `seed[i] after seed[(i - 1)/2]`: seed[3] runs before seed[1] once
    there are four). What it proves is the family's own waits and its ranks' order of it, a part of
    the whole graph: a cycle there is one of the whole schedule. The first k with a finding is narrowed
    to the smallest multiple that still has one, for a short witness."""
    for family in schedule.families.values():
        if not waits_on_itself(schedule, family):
            continue
        mine = {n for n, e in enumerate(schedule.edges) if e.producer == e.consumer == family.name}
        if any(key[0] == "self" and key[1] in mine or key[0] == "cycle" and key[1] & mine for key in found):
            continue  # its deadlock is reported already, at smaller sizes

        def findings(k: int) -> list | None:
            sizes, _ = scaled_sizes(schedule, family, world, divided, k, nodes)
            if sizes is None:
                return None
            return list(_chain_findings(instantiate(schedule, world, sizes, nodes, accesses=False,
                                                    families=(family.name,))))

        clean, k, first = 1, 2, None
        count = scaled_sizes(schedule, family, world, divided, 1, nodes)[1]
        while count < (count := scaled_sizes(schedule, family, world, divided, k, nodes)[1]) <= WIDE_INSTANCES:
            first = findings(k)  # (a family whose instances no param multiplies is proved whole above)
            if first:
                break
            if first is not None:
                clean = k
            k *= 4
        if not first:
            continue
        while k - clean > 1:  # the smallest multiple with a finding, if findings grow with the sizes
            middle = (clean + k) // 2
            narrower = findings(middle)
            if narrower:
                k, first = middle, narrower
            else:
                clean = middle
        yield from first


def _chain_findings(concrete: Concrete):
    """Deadlocks among the instances `concrete` holds (one family, say): a wait on its own later
    instance, or a cycle of waits and each rank's order."""
    self_waits = list(_self_waits(concrete))
    if self_waits:
        yield from self_waits
        return
    successors, via = races.graph(concrete)
    order = races.topological(successors)
    if len(order) == len(successors):
        races.add_serial_order(concrete, successors)
        order = races.topological(successors)
    if len(order) < len(successors):
        yield from races.cycle(concrete, successors, via, set(range(len(successors))) - set(order))


def _family_cycle(schedule: ir.Schedule, cyclic: FamilyCycleError):
    """Families that wait on each other, although their instances do not: tiledsl runs a rank's
    families one after another (all of them, emulated), so one of them must come first."""
    edges = [schedule.edges[n] for n in cyclic.edges]
    notes = [Note(f"'{e.consumer}' waits on '{e.producer}' here", e.span) for e in edges[1:]]
    names = " and ".join(f"'{f}'" for f in cyclic.families) if len(cyclic.families) == 2 else \
        ", ".join(f"'{f}'" for f in cyclic.families)
    return ("family-cycle", cyclic.families), error(
        f"families {names} wait on each other: a rank runs its families one after another, producers "
        f"first, so one of them must come first", edges[0].span, notes=notes,
        hint="split a family in two, or merge the two into one family",
        witness=FamilyCycle(cyclic.families, cyclic.edges))


# ---- sizes ---------------------------------------------------------------------------------------

def _constant_conditions(schedule: ir.Schedule):
    """A launch condition on consts alone that fails would refuse every launch: refuse the build."""
    consts = {ir.size_symbol(name): value for name, value in schedule.consts.items()}
    for condition in launch_conditions(schedule):
        if condition.holds.free_symbols <= set(consts) and not bool(condition.holds.subs(consts)):
            values = ", ".join(f"{s} = {consts[s]}" for s in sorted(condition.holds.free_symbols, key=str))
            yield ("condition", condition.message), error(
                f"{condition.message}, and it is not" + (f" ({values})" if values else ""), condition.span,
                hint=condition.hint)


# ---- programs per rank ---------------------------------------------------------------------------

def _resident_programs(schedule: ir.Schedule, gpu: gpus.GPU):
    on_sms = [f for f in schedule.families.values() if f.engine.kind is not ir.EngineKind.COPY_ENGINE]
    fixed = [f for f in on_sms if f.engine.programs is not None]
    rest = [f for f in on_sms if f.engine.programs is None]
    count = {f.name: f.engine.count(schedule.consts) for f in fixed}
    total = sum(count.values())
    if total <= gpu.sms - (1 if rest else 0):
        return
    largest = max(fixed, key=lambda f: count[f.name])
    notes = [Note(f"'{f.name}' asks for {count[f.name]}", site(f, f.engine.span)) for f in fixed
             if f is not largest]
    if total > gpu.sms:
        message = f"the families ask for {total} resident SM programs, but the {gpu.name} has {gpu.sms} SMs"
    else:
        message = f"the families ask for all {gpu.sms} SMs of the {gpu.name}, leaving none for '{rest[0].name}' (sms(rest))"
    yield "programs", error(message, site(largest, largest.engine.span), notes=notes,
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
                    f"{family_text(schedule, f.name)} reads '{r.tensor}', but nothing in the program writes it",
                    r.span, hint=f"`{role.value}` tensors start with whatever the last call left there")
    waited = {e.producer for e in schedule.edges if e.producer != e.consumer}
    for f in families:
        written = {r.tensor for r in f.writes}
        scratch = all(schedule.tensors[t].role in (ir.Role.SYMM, ir.Role.LOCAL) for t in written)
        if f.name not in waited and written and scratch and not any(readers[t] - {f.name} for t in written):
            yield ("lost", f.name), warning(
                f"nothing waits on {family_text(schedule, f.name)} and nothing reads what it writes "
                f"({', '.join(sorted(written))}): its work is lost", f.span)


# ---- bounds --------------------------------------------------------------------------------------

@per_schedule
def _program_slices(schedule: ir.Schedule) -> dict[ast.Span, tuple]:
    return _slices(schedule.program)


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
    slices = _program_slices(schedule)
    idle = None
    world = concrete.world
    for access in concrete.accesses:
        if not 0 <= access.copy < world:  # one pass over the accesses for both (the checker runs it often)
            yield _no_such_rank(concrete, access)
            continue
        shape = concrete.shapes[access.region.tensor]
        if all(first >= 0 and stop <= extent for (first, _, stop), extent in zip(access.reach, shape)):
            continue  # inside its tensor: no problem below can arise (the common case, kept cheap)
        pieces = slices.get(access.region.span, ())
        if any(stop <= last for _, last, stop in access.reach):
            continue  # a region of size 0 touches nothing, wherever it starts
        idle = _writing_nothing(concrete) if idle is None else idle
        if access.instance in idle and all(first >= 0 for first, _, _ in access.reach):
            continue  # an instance that writes nothing does nothing: what it would read does not matter
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
            value = first if first < 0 else last if last >= extent else stop
            yield ("bounds", access.region.span, dim), error(
                f"out of bounds: dimension {dim} of '{access.region.tensor}' has size {extent}, but "
                f"{at(instance)} {verb} it {problem} (at {sizes_text(concrete)})",
                piece.span if piece is not None else access.region.span,
                hint="`a : +n` may run past the end of a dimension (a ragged last tile is clipped); "
                     "`a : b` and indices may not",
                witness=OutOfBounds(where(concrete), point(instance), access.region.tensor, dim, value, extent,
                                    stop=value == stop and first >= 0 and last < extent))


def _rank_guard(rank: int, peer: int) -> str:
    """The guard that keeps a rank from naming `peer`: below 0 the first ranks must not run the family
    (`if rank > 0` for `rank - 1`), past the last one the last ranks (`if rank < world - 1` for `rank + 1`)."""
    if peer < 0:
        step = rank - peer
        return "`if rank > 0`" if step == 1 else f"`if rank >= {step}`"
    step = peer - rank
    return f"`if rank < world - {step}`" if step > 0 else "`if rank < world`"


def _no_such_rank(concrete: Concrete, access):
    """`X@(rank - 1)` on rank 0 names a copy no rank has: the kernel would follow a peer pointer that
    does not exist and the reference has nothing to read. Refused, with the rank and the peer it names
    (`(rank - 1) mod world` stays inside)."""
    instance = concrete.instances[access.instance]
    verb = "writes" if access.write else "reads"
    tensor = access.region.tensor
    return ("peer", access.region.span), error(
        f"no such rank: {at(instance)} {verb} '{tensor}'@{access.copy}, but ranks are "
        f"0..{concrete.world - 1} (at {sizes_text(concrete)})", access.region.span,
        hint=f"guard the {instance.family} family ({_rank_guard(instance.rank, access.copy)}), or wrap the peer "
             "around: `(...) mod world`",
        witness=NoSuchRank(where(concrete), point(instance), tensor, access.copy, access.write))


def _writing_nothing(concrete: Concrete) -> set[int]:
    """Instances every write of which is a `+n` slice clipped away whole (it starts past the end of
    a dimension): the last ranks' share of a ragged size, say. They do nothing, in the kernel (every
    store masked) and in the reference (empty views) alike."""
    writes: dict[int, list] = {}
    for access in concrete.accesses:
        if access.write:
            writes.setdefault(access.instance, []).append(access)
    return {instance for instance, accesses in writes.items()
            if all(any(first >= extent for (first, _, _), extent in zip(a.reach, concrete.shapes[a.region.tensor]))
                   for a in accesses)}


# ---- waits ---------------------------------------------------------------------------------------

def _skipped(concrete: Concrete):
    """An edge between two families that names a producer instance that does not exist waits on
    nothing there (the schedule's meaning, everywhere): often an index map off by one. A warning,
    since what it leaves unordered is refused as a race anyway."""
    schedule = concrete.schedule
    for skipped in concrete.skipped:
        edge = schedule.edges[skipped.edge]
        if edge.producer == edge.consumer:
            continue  # the start of a chain, `t[i] after t[i - 1]` at i = 0
        if 0 <= skipped.rank < concrete.world and not runs_on(
                schedule, schedule.families[edge.producer], concrete.world, concrete.sizes, skipped.rank, concrete.nodes):
            continue  # a rank its `if` leaves out: waiting on it there is waiting on whatever runs there
        consumer = concrete.instances[skipped.consumer]
        wanted = f"{edge.producer}{index_text(skipped.index)}"
        if skipped.rank != consumer.rank or edge.ranks is not ir.RankSet.LOCAL:
            wanted += f" on rank {skipped.rank}"
        if not 0 <= skipped.rank < concrete.world:
            why = f"ranks are 0..{concrete.world - 1}"
        else:
            extents = concrete.extents[edge.producer][skipped.rank]
            spans = [f"0..{n - 1}" for n in extents]
            has = ("no instances" if 0 in extents else
                   f"instances {spans[0]}" if len(spans) == 1 else f"instances [{', '.join(spans)}]")
            why = f"{edge.producer} has {has}"
        producer = schedule.families[edge.producer]
        when = "" if skipped.step is None else f" at step {skipped.step} of its loop"
        yield ("skipped", skipped.edge), warning(
            f"{at(consumer)}{when} waits on nothing through this edge: it names {wanted}, but {why} "
            f"(at {sizes_text(concrete)})",
            edge.span, notes=[Note(f"'{producer.name}' is declared here", producer.span)],
            hint="an index or rank outside the producer's instances means no wait; check the index map "
                 "if a wait was meant")


def _self_waits(concrete: Concrete):
    """`mm[i] after mm[i-1]`: a family runs its instances in order, so it may only wait on earlier ones
    of its own rank. A wait on its instances on other ranks (a ring: `step[t] after step[t - 1] @
    ((rank - 1) mod world)`) is judged by the cycle search, with every rank's order (meaning.py)."""
    schedule = concrete.schedule
    for wait in concrete.waits:
        edge = schedule.edges[wait.edge]
        if edge.producer != edge.consumer:
            continue
        rank = concrete.instances[wait.consumer].rank
        late = [p for p in wait.producers if concrete.instances[p].rank == rank
                and concrete.order[p] >= concrete.order[wait.consumer]]
        if late:
            consumer, producer = concrete.instances[wait.consumer], concrete.instances[late[0]]
            what = "itself" if late[0] == wait.consumer else f"{at(producer)}, which comes after it"
            steps = (Step(point(consumer), point(producer), wait.edge),)
            notes = []
            if late[0] != wait.consumer:
                steps += (Step(point(producer), point(consumer), None),)
                ranked = concrete.in_order(edge.consumer, rank)
                for decl in schedule.program.of(ast.OrderDecl):  # where the order was written
                    if decl.family.id == edge.consumer:
                        notes.append(Note(
                            f"on rank {rank} '{edge.consumer}' runs {edge.consumer}{index_text(consumer.index)} "
                            f"{_ordinal(ranked.index(wait.consumer) + 1)} and {edge.consumer}{index_text(producer.index)} "
                            f"{_ordinal(ranked.index(late[0]) + 1)} of its {len(ranked)} instances", decl.span))
            yield ("self", wait.edge), error(
                f"deadlock: {at(consumer)} waits for {what} in the order of '{edge.consumer}' "
                f"(at {sizes_text(concrete)})", edge.span, notes=notes,
                hint="a family runs its instances in order: it may only wait on its earlier instances",
                witness=Deadlock(where(concrete), steps))


def _unsignalled(concrete: Concrete):
    """An NVSHMEM put signals only the rank it writes to (the signal travels with the data, as one
    putmem_signal): a wait on it from any other rank would never see the signal and time out."""
    schedule = concrete.schedule
    on_puts = {n for n, e in enumerate(schedule.edges) if schedule.families[e.producer].puts}
    if not on_puts:
        return
    targets: dict[int, set[int]] = {}
    for access in concrete.accesses:
        if access.write:
            targets.setdefault(access.instance, set()).add(access.copy)
    for wait in concrete.waits:
        if wait.edge not in on_puts:
            continue
        edge = schedule.edges[wait.edge]
        producer = schedule.families[edge.producer]
        rank = concrete.instances[wait.consumer].rank
        for p in wait.producers:
            if rank not in targets.get(p, {rank}):
                put, consumer = concrete.instances[p], concrete.instances[wait.consumer]
                to = ", ".join(f"rank {r}" for r in sorted(targets[p]))
                yield ("unsignalled", wait.edge), error(
                    f"deadlock: {at(consumer)} waits for {at(put)}, an nvshmem put that signals only the "
                    f"rank it writes to ({to}) (at {sizes_text(concrete)})", edge.span,
                    notes=[Note(f"'{producer.name}' is declared here", producer.span)],
                    hint="wait on the put from the rank it writes to, or run the chunk on sms(N), "
                         "which signals every rank",
                    witness=Unsignalled(where(concrete), point(consumer), point(put), wait.edge))
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
        if wait.step not in (None, 0):
            continue  # a later step of a loop waits for what it needs then: judged by the first step
        if (edge.ranks is not ir.RankSet.LOCAL or None in edge.index_map or consumer.kind is not ir.Kind.TILE
                or producer.kind is not ir.Kind.CHUNK):
            continue
        rank = concrete.instances[wait.consumer].rank
        mine = concrete.ranges[edge.consumer][rank]
        if wait.consumer != min(mine, key=concrete.order.__getitem__):
            continue  # judged by the instance that runs first on this rank
        ranked = concrete.in_order(edge.producer, rank)
        needed = max(ranked.index(p) for p in wait.producers)
        if needed > 0:
            first = concrete.instances[wait.consumer]
            late = concrete.instances[ranked[needed]]
            yield ("order", wait.edge), warning(
                f"{at(first)} runs first but waits for {at(late)}, which '{producer.name}' runs "
                f"{_ordinal(needed + 1)} of {len(ranked)}: the chunks do not arrive in the order the tiles "
                f"use them (at {sizes_text(concrete)})", edge.span,
                hint=f"order '{producer.name}' the way '{consumer.name}' uses it, e.g. `order {producer.name} by ...`")


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


