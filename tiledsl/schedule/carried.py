"""Values carried from one call to the next: a `reduce add` chunk adds into its target (and a tile
`S[...] = S[...] + X[...]` reads what it overwrites), and a `symm` or `local` target keeps what the
last call left there, so a sum that nothing in the call clears grows
call after call. Legal (a running total), but rarely meant: a warning, decided per element of each
rank's copy on the concrete instances, like races."""
from __future__ import annotations

from collections import defaultdict

import numpy

from tiledsl.diagnostics import Note, warning
from tiledsl.schedule import ir
from tiledsl.schedule.meaning import Concrete
from tiledsl.schedule.wording import at, family_text, sizes_text

KEPT = (ir.Role.SYMM, ir.Role.LOCAL)  # the roles whose values outlive a call


def findings(concrete: Concrete):
    """An accumulation into elements of a kept tensor that no plain write of the call covers: neither
    a clear before it (a fresh sum) nor a reset after it (for the next call; the heap starts zeroed).
    An unordered plain write is a race, refused on its own."""
    schedule = concrete.schedule
    adding = {id(r) for f in schedule.families.values() if f.reduce == "add" for r in f.writes
              if schedule.tensors[r.tensor].role in KEPT}
    rewriting = {f.name for f in schedule.families.values()
                 if {r.tensor for r in f.writes if schedule.tensors[r.tensor].role in KEPT} & {r.tensor for r in f.reads}}
    if not adding and not rewriting:
        return
    reads: dict[tuple[int, str, int], list] = defaultdict(list)  # (instance, tensor, copy) -> its reads
    if rewriting:
        for access in concrete.accesses:
            if not access.write and not access.empty and concrete.instances[access.instance].family in rewriting:
                reads[access.instance, access.region.tensor, access.copy].append(access)
    written: dict[tuple[str, int], list] = defaultdict(list)   # (tensor, copy) -> plain writes
    added: dict[tuple[str, int], list] = defaultdict(list)     # (tensor, copy) -> accumulations
    for access in concrete.accesses:
        if access.write and not access.empty:
            accumulates = id(access.region) in adding or any(
                _overlap(access, read) for read in reads.get((access.instance, access.region.tensor, access.copy), ()))
            (added if accumulates else written)[access.region.tensor, access.copy].append(access)
    for (tensor, copy), accumulations in added.items():
        cleared = numpy.zeros(concrete.shapes[tensor], dtype=bool)
        for write in written.get((tensor, copy), ()):
            cleared[_box(write)] = True
        for access in accumulations:
            if cleared[_box(access)].all():
                continue
            family = concrete.instances[access.instance].family
            role = schedule.tensors[tensor].role.value
            verb = "adds into" if id(access.region) in adding else "reads what it overwrites of"
            yield ("carried", tensor), warning(
                f"{family_text(schedule, family)} {verb} '{tensor}', which nothing in the call clears: "
                f"each call's {'sum' if verb == 'adds into' else 'result'} starts from what the last call left (at {sizes_text(concrete)})",
                access.region.span,
                notes=[Note(f"'{tensor}' is `{role}`: its values outlive a call", schedule.tensors[tensor].span)],
                hint=f"clear it first: a tile `{tensor}[...] = 0` that '{family}' waits on (an edge "
                     f"`{family}[...] after ...`)" + ("" if access.region.owner is not None else
                                                     f"; for a total kept over calls, make '{tensor}' `inout`"))
            break


def _overlap(a, b) -> bool:
    return all(max(lo1, lo2) < min(hi1, hi2) for lo1, hi1, lo2, hi2 in zip(a.lo, a.hi, b.lo, b.hi))


def _box(access) -> tuple[slice, ...]:
    return tuple(slice(lo, hi) for lo, hi in zip(access.lo, access.hi))


def stale_reads(concrete: Concrete, before: list[int]):
    """A read of a kept tensor's elements that the call writes only after it (an edge orders the writer
    after the reader): it reads what the last call left, and the call's own values go unread until the
    next call. Legal (a value carried on purpose), rarely meant: a warning. `before`: races.ancestors."""
    schedule = concrete.schedule
    later_writers = _later_writers(schedule)
    if not later_writers:
        return
    by_copy: dict[tuple[str, int], list] = defaultdict(list)
    for access in concrete.accesses:
        tensor = access.region.tensor
        if not access.empty and tensor in later_writers and (
                access.write or concrete.instances[access.instance].family in later_writers[tensor]):
            by_copy[tensor, access.copy].append(access)
    for (tensor, _), accesses in by_copy.items():
        writes = [a for a in accesses if a.write]
        reads = [a for a in accesses if not a.write]
        if not writes or not reads:
            continue
        write_lo, write_hi = numpy.array([w.lo for w in writes]), numpy.array([w.hi for w in writes])
        read_lo, read_hi = numpy.array([r.lo for r in reads]), numpy.array([r.hi for r in reads])
        write_node = [concrete.node_of(w) for w in writes]
        write_instance = numpy.array([w.instance for w in writes])
        read_instance = numpy.array([r.instance for r in reads])
        later, step = None, max(1, (1 << 20) // len(writes))  # pair matrices of about a million cells
        for at_read in range(0, len(reads), step):
            rows = slice(at_read, at_read + step)
            overlap = ((write_lo[None] < read_hi[rows, None]) & (read_lo[rows, None] < write_hi[None])).all(axis=2)
            # an accumulation, or a tile reading what it overwrites: `findings` above
            overlap[(overlap & (write_instance[None] == read_instance[rows, None])).any(axis=1)] = False
            for row in numpy.flatnonzero(overlap.any(axis=1)):
                read = reads[at_read + row]
                node, overlapping = concrete.node_of(read), numpy.flatnonzero(overlap[row])
                if any((before[node] >> write_node[w]) & 1 for w in overlapping):
                    continue  # a write comes first: this call's value
                later = next((writes[w] for w in overlapping if (before[write_node[w]] >> node) & 1), None)
                if later is not None:  # (unordered: a race, refused on its own)
                    break
            if later is not None:
                break
        if later is not None:
            reader, writer = concrete.instances[read.instance], concrete.instances[later.instance]
            role = schedule.tensors[tensor].role.value
            yield ("stale", tensor), warning(
                f"{family_text(schedule, reader.family)} reads '{tensor}' before the call writes it: "
                f"{at(reader)} comes before {at(writer)}, so it reads what the last call left "
                f"(at {sizes_text(concrete)})", read.region.span,
                notes=[Note(f"'{writer.family}' writes '{tensor}' here, after the read", later.region.span),
                       Note(f"'{tensor}' is `{role}`: its values outlive a call", schedule.tensors[tensor].span)],
                hint=f"to read this call's values, make '{reader.family}' wait on '{writer.family}' "
                     f"(`{reader.family}[...] after {writer.family}[...]`)")


def _later_writers(schedule: ir.Schedule) -> dict[str, set[str]]:
    """Per kept tensor, the families reading it that a family writing it waits on, through edges (a
    path from the reader to the writer): only their reads can come before the call's write."""
    after: dict[str, set[str]] = defaultdict(set)  # producer -> its consumers
    for edge in schedule.edges:
        after[edge.producer].add(edge.consumer)
    found: dict[str, set[str]] = defaultdict(set)
    for family in schedule.families.values():
        reached, pending = set(), list(after[family.name])
        while pending:
            name = pending.pop()
            if name not in reached:
                reached.add(name)
                pending.extend(after[name])
        written = {r.tensor for f in reached for r in schedule.families[f].writes}
        for region in family.reads:
            if region.tensor in written and schedule.tensors[region.tensor].role in KEPT:
                found[region.tensor].add(family.name)
    return dict(found)
