"""The signal slots each generated wait reads are exactly the producer instances the schedule's meaning
names (schedule/meaning.py, what the checker proves with): for every SM family's edge, at every
consumer instance (and loop step) of a concrete world and size, the slots of the plan's Wait (its loops,
its existence test, a producer's parts, a ranged wait's span and stride) against the slots of the
producers `meaning.instantiate` lists. A wait that read a slot too few would let a consumer through
early, one too many would wait on an instance that never signals: both show here by name, for the
library's programs and for generated schedules, without running a kernel.

Waits whose slots read device values (a count, an id) are left to the emulated runs; the test checks
that most waits are covered."""
from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
import sympy

from tiledsl import pipeline
from tiledsl.codegen import plan
from tiledsl.schedule import ir, meaning

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = sorted((ROOT / "programs").glob("*.tds"))
WORLDS = (2, 3)


def _evaluate(expr, env: dict) -> int:
    value = sympy.sympify(expr).xreplace(env)
    value = sympy.simplify(value) if not value.is_Number else value
    return int(value)


def _holds(expr, env: dict) -> bool:
    return bool(sympy.sympify(expr).xreplace(env))


def _plan_slots(wait: plan.Wait, env: dict) -> set[int] | None:
    """The slots one consumer instance's wait reads, in an environment of every symbol's value."""
    if any(ir.device_values(e) for e in (wait.slot, wait.exists, wait.span, wait.stride)):
        return None
    found = set()
    ranges = [(var, range(_evaluate(extent, env))) for var, extent in wait.loops]
    for values in itertools.product(*(r for _, r in ranges)):
        here = {**env, **{var: sympy.Integer(v) for (var, _), v in zip(ranges, values)}}
        if not _holds(wait.exists, here):
            continue
        base = _evaluate(wait.slot, here)
        if wait.span is not None:
            stride = _evaluate(wait.stride, here)
            found.update(base + j * stride for j in range(_evaluate(wait.span, here)))
        else:
            found.update(base + p for p in range(wait.parts))
    return found


def _meaning_slots(done: meaning.Concrete, schedule: ir.Schedule, producer: ir.Family, rank: int,
                   positions) -> set[int]:
    """The slots of producer instances by position: the writer's rank times a rank's slots, plus the
    instance's row-major number times its parts (a rank's slots counted with the consumer's extents,
    as the kernel lays them out: a family's slots exist on every rank, those its `if` excludes too)."""
    *extents, _ = meaning._compiled_extents(schedule, producer.name)(
        *meaning._size_values(schedule, done.world, done.sizes, done.nodes), rank)
    extents = [max(0, n) for n in extents]
    per_rank = 1
    for n in extents:
        per_rank *= n
    parts = producer.parts(schedule.consts)
    out = set()
    for position in positions:
        instance = done.instances[position]
        number = 0
        for i, n in zip(instance.index, extents):
            number = number * n + i
        out.update(instance.rank * per_rank * parts + number * parts + p for p in range(parts))
    return out


def check_waits(source: str, world: int, sizes: dict | None = None, path: str = "<generated>") -> tuple[int, int]:
    """(waits compared, waits left to emulation); raises AssertionError naming the first mismatch."""
    done_check = pipeline.run(source, until="check", path=path)
    schedule = plan._resolve_splits(done_check.schedule, done_check.schedule.consts)  # `split PIECES`: its value
    sizes = sizes if sizes is not None else meaning.default_sizes(schedule, world)
    done = meaning.instantiate(schedule, world, sizes, accesses=False)
    values = meaning._size_values(schedule, world, sizes)
    base_env = {s: sympy.Integer(v) for s, v in zip(meaning.size_symbols(schedule), values)}
    reach = meaning.notify_reach(schedule)
    expected: dict[tuple, set] = {}
    for wait in done.waits:
        edge = schedule.edges[wait.edge]
        consumer = done.instances[wait.consumer]
        producer = schedule.families[edge.producer]
        key = (wait.consumer, wait.edge, wait.step)
        expected.setdefault(key, set()).update(
            _meaning_slots(done, schedule, producer, consumer.rank, wait.producers))
    compared = skipped = 0
    for family in schedule.families.values():
        if family.engine.kind is ir.EngineKind.COPY_ENGINE:
            continue  # the stream's waits are host code (plan._host_copy), tested in tests/runtime
        for wait in plan._waits(schedule, family, lambda e: sympy.sympify(e), reach):
            edge = schedule.edges[wait.edge]
            for rank in range(world):
                for position in done.ranges[family.name][rank]:
                    index = done.instances[position].index
                    env = {**base_env, ir.RANK: sympy.Integer(rank),
                           **{s: sympy.Integer(i) for (s, _), i in zip(family.indices, index)}}
                    steps = [None] if edge.loop is None else range(done.steps(position))
                    for step in steps:
                        here = env if step is None else {**env, edge.loop: sympy.Integer(step)}
                        expanded = plan.Wait(**{**wait.__dict__, **{
                            name: family.expand(getattr(wait, name)) for name in ("slot", "exists", "span", "stride")
                            if getattr(wait, name) is not None},
                            "loops": tuple((v, family.expand(e)) for v, e in wait.loops)})
                        got = _plan_slots(expanded, here)
                        if got is None:
                            skipped += 1
                            continue
                        want = expected.get((position, wait.edge, step), set())
                        compared += 1
                        assert got == want, (
                            f"{path}, world {world}, {sizes}: {family.name}{list(index)} on rank {rank}"
                            f"{'' if step is None else f', step {step}'} waits at {wait.where}: slots "
                            f"{sorted(got - want)[:8]} too many, {sorted(want - got)[:8]} missing "
                            f"(the meaning names {len(want)})")
    return compared, skipped


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.stem)
def test_every_wait_reads_the_slots_of_the_producers_the_meaning_names(path, world):
    source = path.read_text()
    schedule = pipeline.run(source, until="check", path=os.fspath(path)).schedule
    if schedule.spans_nodes:
        pytest.skip("a program written for nodes: its checks run per topology (tests/schedule/test_nodes.py)")
    compared, skipped = check_waits(source, world, path=os.fspath(path.relative_to(ROOT)))
    if any(e.consumer == f.name for e in schedule.edges for f in schedule.families.values()
           if f.engine.kind is not ir.EngineKind.COPY_ENGINE):
        assert compared > skipped, f"only {compared} of {compared + skipped} waits compared"


GENERATED_SEEDS = range(int(os.environ.get("TILEDSL_WAIT_SLOT_SEEDS", "80")))


def test_generated_schedules_wait_on_the_slots_the_meaning_names():
    """The differential test's generated schedules (every pattern, coarse `*` and `@ every rank`
    edges, affine maps, splits, self edges): each one the checker accepts, at both its worlds."""
    import sys
    sys.path.insert(0, os.fspath(ROOT / "tests" / "schedule"))
    from gen_schedules import WORLDS as GENERATED_WORLDS, generate

    from tiledsl.diagnostics import TdsError
    compared = accepted = 0
    for seed in GENERATED_SEEDS:
        generated = generate(seed)
        try:
            pipeline.run(generated.source, until="check")
        except TdsError:
            continue  # refused: nothing runs, so no wait is generated
        accepted += 1
        for world in GENERATED_WORLDS:
            sizes = None if generated.sizes is None else generated.sizes[world]
            try:
                done, _ = check_waits(generated.source, world, sizes, path=f"generate({seed})")
            except AssertionError as failure:
                raise AssertionError(f"{failure}\n{generated.source}") from None
            compared += done
    assert accepted >= len(GENERATED_SEEDS) // 4 and compared > accepted, (accepted, compared)
