"""The persistent kernel cannot deadlock where the checker proved the schedule: a model of how the
kernel hands instances to programs, run to the end.

The checker proves that the waits plus each rank's serial order (its families in sequence, each in
its order) have no cycle (schedule/meaning.py). On a GPU a program spinning on a wait blocks every
instance queued behind it on that program, so the argument that it cannot deadlock is about queues:
every program's queue is a subsequence of its rank's serial order, so a topological order of the
proved graph puts each queue's head before everything queued behind it, and the first unfinished
instance in that order is always at the head of its queue with its producers done. This test does
not take the argument on trust: it lays out the instances as the plan and the kernel template do
(a family with `sms(N)` on its own programs, the others sharing the rest and running in the family
sequence, program p of P taking slots p, p + P, ... of the family's order table, a slot being an
instance's part), puts copy-engine chunks on one stream per rank, and runs every queue of every rank
while any head can run. Every accepted program, rings included, must finish with 1, 2 and 3 shared
programs (few programs: the most blocking); a ring whose order runs its steps backwards, which the
checker refuses, must get stuck here too."""
from __future__ import annotations

import functools
import itertools
import os
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tiledsl import pipeline
from tiledsl.codegen import lower
from tiledsl.diagnostics import TdsError
from tiledsl.schedule import meaning

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = sorted((ROOT / "programs").glob("*.tds"))
SHARED = (1, 2, 3)  # programs that the families without a count of their own share


class Layout(NamedTuple):
    """What the kernel's layout of one family depends on, as plan._family decides it."""
    name: str
    on_sms: bool
    programs: int | None  # its own programs; None: the shared ones
    split: int
    order: tuple | None   # the keys of its order table; None: instance number order


def layout(schedule) -> list[Layout]:
    """The plan's families in the family sequence, from the schedule as plan.lower reads it (lowering
    some programs whole takes seconds; test_the_layout_is_the_plans holds this to the plan)."""
    out = []
    for name in meaning.family_sequence(schedule):
        family = schedule.families[name]
        on_sms = family.engine.kind is not meaning.ir.EngineKind.COPY_ENGINE
        ordered = meaning.ordered(schedule, family) or not on_sms
        out.append(Layout(name, on_sms, family.engine.count(schedule.consts), family.parts(schedule.consts),
                          meaning.order_keys(schedule, family) if ordered else None))
    return out


@functools.lru_cache(maxsize=8)
def _planned(source: str, world: int, sizes: tuple | None):
    schedule = pipeline.run(source, until="schedule").schedule
    sizes = dict(sizes) if sizes is not None else meaning.default_sizes(schedule, world)
    return schedule, layout(schedule), meaning.instantiate(schedule, world, sizes, accesses=False), sizes


def queues(source: str, world: int, shared: int, sizes: dict | None = None):
    """Per rank, the queues of (instance position, part) as the kernel and the copy stream run them,
    and the concrete instances with their waits."""
    schedule, families, concrete, sizes = _planned(source, world, None if sizes is None else tuple(sorted(sizes.items())))
    values = meaning._size_values(schedule, world, sizes)
    symbols = (*meaning.size_symbols(schedule), meaning.ir.RANK)
    out = []
    for rank in range(world):
        mine: list[list] = []
        shared_queues: list[list] = [[] for _ in range(shared)]
        stream: list = []
        for family in families:  # the family sequence
            positions = list(concrete.ranges[family.name][rank])
            if family.order is not None:  # the host's order table (launcher: tds_orders)
                indices = schedule.families[family.name].indices
                keys = meaning.compile_exprs(family.order, (*symbols, *(s for s, _ in indices)))
                positions.sort(key=lambda p: keys(*values, rank, *concrete.instances[p].index))
            slots = [(p, part) for p in positions for part in range(family.split)]
            if not family.on_sms:
                stream += slots
                continue
            if family.programs is None:
                programs = shared_queues
            else:  # specs.spread: its own range, no more programs than slots
                programs = [[] for _ in range(max(1, min(family.programs, len(slots))))]
                mine += programs
            for t, slot in enumerate(slots):  # the kernel: for tds_t in range(tds_program, slots, programs)
                programs[t % len(programs)].append(slot)
        out.append(mine + shared_queues + [stream])
    return concrete, out


def stuck(concrete: meaning.Concrete, ranks: list[list[list]]) -> list:
    """Run every queue's head while its waits are met; the heads left when none can run."""
    parts_left = {}
    for queues_of_rank in ranks:
        for queue in queues_of_rank:
            for position, _ in queue:
                parts_left[position] = parts_left.get(position, 0) + 1
    waits: dict[int, list] = {}
    for wait in concrete.waits:  # an instance with a loop: its steps' waits too (it holds its program)
        waits.setdefault(wait.consumer, []).extend(wait.producers)
    heads = [(queue, 0) for queues_of_rank in ranks for queue in queues_of_rank]
    moved = True
    while moved:
        moved = False
        for n, (queue, at) in enumerate(heads):
            while at < len(queue) and all(parts_left[p] == 0 for p in waits.get(queue[at][0], ())):
                parts_left[queue[at][0]] -= 1
                at, moved = at + 1, True
            heads[n] = (queue, at)
    return [concrete.instances[queue[at][0]] for queue, at in heads if at < len(queue)]


@pytest.mark.parametrize("name", ["ring_allgather", "ring_reduce_scatter", "gemm_rs_ce", "ag_gemm_push"])
def test_the_layout_is_the_plans(name):
    schedule = pipeline.run(ROOT / "programs" / f"{name}.tds", until="schedule").schedule
    planned = [Layout(f.name, f.on_sms, f.programs, f.split, f.order) for f in lower(schedule).families]
    assert layout(schedule) == planned


@pytest.mark.parametrize("world", (2, 3, 4))
@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.stem)
def test_the_kernel_of_every_program_runs_to_the_end_with_few_programs(path, world):
    source = path.read_text()
    schedule = pipeline.run(source, until="schedule").schedule
    if schedule.spans_nodes:
        pytest.skip("written for nodes: proved per topology (tests/schedule/test_nodes.py)")
    for shared in SHARED:
        concrete, ranks = queues(source, world, shared)
        assert not stuck(concrete, ranks), (path.stem, world, shared, [str(i) for i in stuck(concrete, ranks)][:6])


@pytest.mark.parametrize("world", (2, 3, 4))
def test_a_copy_stream_waiting_on_every_tile_of_a_peer_runs_to_the_end(world):
    """tests/corpus/lm_head_gather.tds: each rank's stream pulls Lg@s once every mm tile of rank s is
    done (their counts kept in the stream's memory); its waits cross ranks, and the queues finish."""
    source = (ROOT / "tests" / "corpus" / "lm_head_gather.tds").read_text()
    for shared in SHARED:
        concrete, ranks = queues(source, world, shared)
        assert not stuck(concrete, ranks), (world, shared, [str(i) for i in stuck(concrete, ranks)][:6])
    across = [w for w in concrete.waits if concrete.instances[w.consumer].family == "gather"
              and any(concrete.instances[p].rank != concrete.instances[w.consumer].rank for p in w.producers)]
    assert len(across) == world * (world - 1)  # gather[s] on rank r, s != r


def test_a_ring_run_backwards_is_refused_and_would_hang_the_kernel():
    """`order fwd by -t`: each rank forwards its last block first, which waits for a block the previous
    rank forwards last. The checker refuses it (a cycle through every rank's order); the kernel's
    queues, one program for the family, stall as the proof says."""
    source = (ROOT / "programs" / "ring_allgather.tds").read_text() + "order fwd by -t\n"
    with pytest.raises(TdsError, match="deadlock: a cycle of waits"):
        pipeline.run(source, until="check")
    accepted = source.replace("order fwd by -t\n", "")
    text = accepted.replace("on sms(FWD_SMS) split PIECES", "on sms(1)", 1)  # one program: the order matters
    concrete, ranks = queues(text, 3, 1)
    assert not stuck(concrete, ranks)
    # the same queues in the refused order: the model of the kernel stalls
    for queues_of_rank in ranks:
        for queue in queues_of_rank:
            fwd = [slot for slot in queue if concrete.instances[slot[0]].family == "fwd"]
            if fwd:
                others = [slot for slot in queue if concrete.instances[slot[0]].family != "fwd"]
                queue[:] = others + list(reversed(fwd))
    assert any(i.family == "fwd" for i in stuck(concrete, ranks))


GENERATED_SEEDS = range(int(os.environ.get("TILEDSL_RESIDENCY_SEEDS", "40")))


def test_the_kernel_of_every_accepted_generated_schedule_runs_to_the_end():
    """The differential test's schedules (rings and root-only families among them), each one the
    checker accepts, with one and two shared programs at both its worlds."""
    sys.path.insert(0, os.fspath(ROOT / "tests" / "schedule"))
    from gen_schedules import WORLDS, generate
    accepted = 0
    for seed in GENERATED_SEEDS:
        generated = generate(seed)
        try:
            pipeline.run(generated.source, until="check")
        except TdsError:
            continue
        accepted += 1
        for world, shared in itertools.product(WORLDS, (1, 2)):
            sizes = None if generated.sizes is None else generated.sizes[world]
            concrete, ranks = queues(generated.source, world, shared, sizes)
            left = stuck(concrete, ranks)
            assert not left, (f"generate({seed}) world {world}, {shared} shared programs: stuck at "
                              f"{[str(i) for i in left][:6]}\n{generated.source}")
    assert accepted >= len(GENERATED_SEEDS) // 4
