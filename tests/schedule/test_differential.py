"""One meaning for a schedule, tested differentially: generated schedules (tests/schedule/gen_schedules.py)
go through tiledsl's checker. Every schedule it accepts must have no problem that an independent brute
force over the instance graph finds (tests/schedule/bruteforce.py), and must run on emulated ranks at
worlds 2 and 3 with every output matching the torch reference, on two calls with fresh inputs and
outputs poisoned with NaN; every schedule it refuses must come with a witness (the race, the cycle)
that the brute force confirms.

CI runs 300 schedules, 30 to a hypothesis example (one set of emulated ranks per world runs all the
accepted programs of an example), derandomized. A longer run, random, by hand:

    TILEDSL_DIFF_EXAMPLES=5000 python -m pytest tests/schedule/test_differential.py -x -q

`TILEDSL_DIFF_SHRINK=1` lets hypothesis shrink a failing example (each step reruns the emulation of a
whole example: slow). A failure prints each failing schedule whole, with the sizes: save it as
FILE.tds and run `tiledsl run FILE.tds --world N --size N=...`, or rebuild it from the seed it names
with `gen_schedules.generate(SEED)`. The test stops at the first failing example; to see every kind
of failure in a long run instead, `python tests/schedule/test_differential.py 3000` judges 3000
random schedules and prints each kind of failure with its count and its shortest schedule."""
from __future__ import annotations

import collections
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings

import bruteforce
import emulated_batch
from gen_schedules import WORLDS, Generated, batches
from tiledsl import pipeline
from tiledsl.codegen import LoweringError
from tiledsl.diagnostics import TdsError
from tiledsl.schedule.witness import At, Deadlock, FamilyCycle, OutOfBounds, Point, Race, Step, Unsignalled

EXAMPLES = int(os.environ.get("TILEDSL_DIFF_EXAMPLES", "300"))
BATCH = 30                  # schedules per hypothesis example
CI = bool(os.environ.get("CI"))
MALFORMED_PER_BATCH = 2     # programs the front end refuses: the generator's mistakes, kept rare
TOTALS: collections.Counter = collections.Counter()


def default_sizes(schedule, world: int) -> dict[str, int]:
    try:  # the lead's rebuild moves default_sizes into schedule/meaning.py
        from tiledsl.schedule.meaning import default_sizes as sizes
    except ImportError:
        from tiledsl.schedule.instances import default_sizes as sizes
    return sizes(schedule, world)


@dataclass
class Failure:
    kind: str
    detail: str
    generated: Generated
    world: int | None = None
    sizes: dict | None = None

    def render(self) -> str:
        where = ""
        if self.world is not None:
            where = f" at world {self.world}, {', '.join(f'{k}={v}' for k, v in (self.sizes or {}).items())}"
            flags = " ".join(f"--size {k}={v}" for k, v in (self.sizes or {}).items())
            where += f" (tiledsl run FILE.tds --world {self.world} {flags})"
        return (f"== {self.kind}{where}\n{self.detail}\n-- generated as: {self.generated.intent}\n"
                f"{self.generated.source}")


def run_sizes(generated: Generated, schedule, world: int) -> dict[str, int]:
    return dict(generated.sizes[world]) if generated.sizes is not None else default_sizes(schedule, world)


# ---- the property ----------------------------------------------------------------------------------

def judge(batch: list[Generated]) -> tuple[list[Failure], collections.Counter]:
    failures, stats = [], collections.Counter()
    queued = {world: [] for world in WORLDS}  # accepted programs to emulate: (generated, schedule, sizes, job)
    malformed = []
    for generated in batch:
        try:
            schedule = pipeline.run(generated.source, until="schedule").schedule
        except TdsError as refusal:
            malformed.append(Failure("malformed", refusal.render(), generated))
            continue
        try:
            pipeline.run(generated.source, until="check")
        except TdsError as refusal:
            stats["refused"] += 1
            failures += judge_refusal(generated, schedule, refusal, stats, malformed)
            continue
        stats["accepted"] += 1
        try:
            pipeline.run(generated.source, until="module")
        except LoweringError as why:
            failures.append(Failure("accepted, but not lowered", f"LoweringError: {why}", generated))
            continue
        for world in WORLDS:
            sizes = run_sizes(generated, schedule, world)
            problems = bruteforce.problems(schedule, world, sizes)
            if problems:
                failures.append(Failure(f"accepted, but the brute force finds a {type(problems[0]).__name__}",
                                        f"{problems[0]}", generated, world, sizes))
                continue
            try:
                job = emulated_batch.job(schedule, generated.source, world, sizes)
            except Exception as why:  # noqa: BLE001 - the reference refusing a program is a finding
                failures.append(Failure("accepted, but the reference cannot run it",
                                        f"{type(why).__name__}: {why}", generated, world, sizes))
                continue
            queued[world].append((generated, schedule, sizes, job))
    for world, jobs in queued.items():
        if jobs:
            failures += emulate(world, jobs)
    if len(malformed) > MALFORMED_PER_BATCH:
        failures += malformed
    stats["malformed"] += len(malformed)
    return failures, stats


def judge_refusal(generated, schedule, refusal: TdsError, stats, malformed) -> list[Failure]:
    failures = []
    for diagnostic in [d for d in refusal.diagnostics if d.severity == "error"]:
        if diagnostic.witness is not None:
            stats["witnesses"] += 1
            why = bruteforce.confirm(schedule, diagnostic.witness)
            if why is not None:
                failures.append(Failure("refused, but the brute force does not confirm the witness",
                                        f"{diagnostic.message}\nwitness: {diagnostic.witness}\nbrute force: {why}",
                                        generated))
            continue
        # FALLBACK while the checker attaches no witness (remove once every refusal carries one): the
        # brute force must find some problem at the world and sizes the message names.
        stats["refusals without a witness"] += 1
        at = message_sizes(" ".join([diagnostic.message] + [note.message for note in diagnostic.notes]))
        if at is None:
            malformed.append(Failure("refused for a reason outside the semantics", diagnostic.message, generated))
            continue
        world, sizes = at
        if not bruteforce.problems(schedule, world, sizes):
            failures.append(Failure("refused, but the brute force finds no problem", diagnostic.message,
                                    generated, world, sizes))
    return failures


def message_sizes(message: str) -> tuple[int, dict[str, int]] | None:
    """The world and params a finding names: `(at N=8, world=2)`."""
    found = re.search(r"\(at ((?:\w+=-?\d+, )*)world=(\d+)\)", message)
    if found is None:
        return None
    sizes = dict((k, int(v)) for k, v in re.findall(r"(\w+)=(-?\d+)", found.group(1)))
    return int(found.group(2)), sizes


def emulate(world: int, jobs: list) -> list[Failure]:
    try:
        verdicts = emulated_batch.run_batch([job for *_, job in jobs], world)
    except RuntimeError as crash:
        return [Failure("accepted, but the emulated ranks crashed", str(crash), g, world, s) for g, _, s, _ in jobs]
    failures = []
    for (generated, schedule, sizes, _), verdict in zip(jobs, verdicts):
        if isinstance(verdict, str):
            kind = "a wait timed out" if "ScheduleTimeout" in verdict else "the program failed"
            detail = verdict
        elif not all(v.ok for v in verdict):
            kind = "the result differs from the reference"
            detail = "\n".join(v.line() for v in verdict if not v.ok)
        else:
            continue
        skipped = bruteforce.skipped_waits(schedule, world, sizes)
        if skipped:  # a hint for triage: the rules say these wait for nothing
            detail += f"\nnote: edges that name no instance (no wait): {'; '.join(skipped[:4])}" + (
                f" and {len(skipped) - 4} more" if len(skipped) > 4 else "")
        failures.append(Failure(f"accepted, but {kind}", detail, generated, world, sizes))
    return failures


@pytest.mark.emulated
@settings(max_examples=max(1, math.ceil(EXAMPLES / BATCH)), deadline=None, derandomize=CI,
          **({"database": None} if CI else {}),
          # a shrinking step reruns a whole example's emulation; a failure prints its schedule whole anyway
          phases=[Phase.explicit, Phase.reuse, Phase.generate]
          + ([Phase.shrink] if os.environ.get("TILEDSL_DIFF_SHRINK") == "1" else []),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(batches(BATCH))
def test_accepted_schedules_run_and_refusals_are_confirmed(batch):
    failures, stats = judge(batch)
    TOTALS.update(stats)
    for key, count in stats.items():
        event(f"{key} per example", count)
    if failures:  # the schedules whole, not a repr of the list
        pytest.fail(f"{len(failures)} failures in {len(batch)} schedules:\n\n" + "\n\n".join(
            f.render() for f in failures), pytrace=False)


# ---- the brute force on witnesses made by hand ------------------------------------------------------

def schedule_of(source: str):
    return pipeline.run(source, until="schedule").schedule


RACE = """\
program race
param N
in X : f32[N]
out Y : f32[N]
symm T : f32[N]
tile load[i in N / 2]: T[i*2 : +2] = X[i*2 : +2]
tile use[i in N / 2]: Y[i*2 : +2] = T@((rank + 1) mod world)[i*2 : +2]
"""


def test_bruteforce_confirms_a_race_and_rejects_one_that_an_edge_orders():
    at = At(2, (("N", 4),))
    race = Race(at, "T", 1, Point("load", (1,), 1), Point("use", (1,), 0), False, (2,), (4,))
    assert bruteforce.confirm(schedule_of(RACE), race) is None
    assert any(isinstance(p, Race) for p in bruteforce.problems(schedule_of(RACE), 2, {"N": 4}))
    ordered = schedule_of(RACE + "use[i] after load[i] @ ((rank + 1) mod world)\n")
    assert "path of waits" in bruteforce.confirm(ordered, race)
    assert bruteforce.problems(ordered, 2, {"N": 4}) == []
    elsewhere = Race(at, "T", 1, Point("load", (0,), 1), Point("use", (1,), 0), False, (0,), (2,))
    assert "do not conflict" in bruteforce.confirm(schedule_of(RACE), elsewhere)
    assert "not an instance" in bruteforce.confirm(schedule_of(RACE), Race(
        at, "T", 1, Point("load", (2,), 1), Point("use", (1,), 0), False, (2,), (4,)))


CHAIN = """\
program chain
param N
in X : f32[N]
out Y : f32[N]
tile t[i in N / 2]: Y[i*2 : +2] = X[i*2 : +2]
t[i] after t[i + 1]
"""


def test_bruteforce_confirms_a_deadlock_through_the_serial_order():
    at = At(2, (("N", 4),))
    first, second = Point("t", (0,), 0), Point("t", (1,), 0)
    cycle = Deadlock(at, (Step(first, second, 0), Step(second, first, None)))
    assert bruteforce.confirm(schedule_of(CHAIN), cycle) is None
    assert "does not run before" in bruteforce.confirm(schedule_of(CHAIN + "order t by -i\n"), cycle)
    assert "breaks" in bruteforce.confirm(schedule_of(CHAIN), Deadlock(at, (Step(first, second, 0),)))
    # in the order `-i`, t[1] runs first and waits on nothing: the chain is fine
    assert bruteforce.problems(schedule_of(CHAIN + "order t by -i\n"), 2, {"N": 4}) == []
    found = [p for p in bruteforce.problems(schedule_of(CHAIN), 3, {"N": 6}) if isinstance(p, Deadlock)]
    assert found and bruteforce.confirm(schedule_of(CHAIN), found[0]) is None


def test_an_edge_to_an_instance_or_rank_that_does_not_exist_waits_for_nothing():
    source = CHAIN.replace("t[i + 1]", "t[i - 1]") + (
        "tile u[i in N / 2]: Y2[i*2 : +2] = X[i*2 : +2]\nu[i] after t[i + 2], t[0] @ (rank - 1)\n")
    source = source.replace("out Y", "out Y2 : f32[N]\nout Y")
    assert bruteforce.problems(schedule_of(source), 2, {"N": 4}) == []


PUT = """\
program put
param N
in X : f32[N]
out Y : f32[world * N]
symm U : f32[world * N]
chunk push[s in world] on nvshmem(1): X -> U@s[rank*N : +N]
tile use[i in 1]: Y = U
use[i] after push[(rank + 1) mod world]
"""


def test_bruteforce_confirms_an_nvshmem_wait_its_signal_never_reaches():
    at = At(3, (("N", 4),))
    wait = Unsignalled(at, Point("use", (0,), 0), Point("push", (1,), 0), 0)
    assert bruteforce.confirm(schedule_of(PUT), wait) is None
    fixed = schedule_of(PUT.replace("push[(rank + 1) mod world]", "push[rank] @ every rank"))
    assert bruteforce.problems(fixed, 3, {"N": 4}) == []
    assert "does not wait" in bruteforce.confirm(fixed, wait)


def test_bruteforce_confirms_families_that_wait_on_each_other():
    source = CHAIN.replace("t[i] after t[i + 1]", "tile u[i in N / 2]: X2[i*2 : +2] = Y[i*2 : +2]\n"
                           "t[i] after u[i]\nu[i] after t[i]").replace("out Y", "out X2 : f32[N]\nout Y")
    schedule = schedule_of(source)
    assert bruteforce.confirm(schedule, FamilyCycle(("t", "u"), (0, 1))) is None
    assert bruteforce.confirm(schedule, FamilyCycle(("u", "t"), (1, 0))) is None
    assert "do not lead around" in bruteforce.confirm(schedule, FamilyCycle(("t", "u"), (0, 0)))
    assert FamilyCycle(("t", "u"), (0, 1)) in bruteforce.problems(schedule, 2, {"N": 4})
    # t[0] and u[0] wait on each other: a deadlock of waits alone, with no serial order to speak of
    t, u = Point("t", (0,), 0), Point("u", (0,), 0)
    assert bruteforce.confirm(schedule, Deadlock(At(2, (("N", 4),)), (Step(t, u, 0), Step(u, t, 1)))) is None
    assert "no serial order" in bruteforce.confirm(schedule, Deadlock(At(2, (("N", 4),)), (Step(t, u, 0),
                                                                                          Step(u, t, None))))
    # one family's own order still holds: t[0] waiting on t[1], which runs after it, is a deadlock
    chained = schedule_of(source + "t[i] after t[i + 1]\n")
    later = Point("t", (1,), 0)
    assert bruteforce.confirm(chained, Deadlock(At(2, (("N", 4),)), (Step(t, later, 2), Step(later, t, None)))) is None


TREE = (Path(__file__).parent / "broken" / "seed_4963_tree.tds").read_text()  # seed 4963, cut down


def test_seed_4963_is_refused_with_a_deadlock_the_brute_force_confirms():
    """The checker accepted seed 4963 (it looked at two instances an index); it now refuses it with a
    witness at world 2, and the brute force finds the generator's own deadlock at world 3, N=7."""
    with pytest.raises(TdsError) as refused:
        pipeline.run(TREE, until="check")
    (found,) = [d for d in refused.value.diagnostics if d.severity == "error"]
    assert found.message.startswith("deadlock: seed[4] on rank 0 waits for seed[1] on rank 0")
    schedule = schedule_of(TREE)
    assert bruteforce.confirm(schedule, found.witness) is None
    assert any(isinstance(p, Deadlock) for p in bruteforce.problems(schedule, 3, {"N": 7}))
    assert bruteforce.problems(schedule, 2, {"N": 8}) == []  # too few instances at world 2 to show it


def test_bruteforce_confirms_a_slice_end_past_the_dimension_but_not_a_clipped_one():
    source = CHAIN.replace("X[i*2 : +2]", "X[i*2 + 1 : i*2 + 3]").replace("t[i] after t[i + 1]\n", "")
    at = At(2, (("N", 4),))
    assert bruteforce.confirm(schedule_of(source), OutOfBounds(at, Point("t", (1,), 0), "X", 0, 5, 4, True)) is None
    clipped = schedule_of(source.replace("i*2 + 1 : i*2 + 3", "i*2 + 1 : +2"))
    assert bruteforce.problems(clipped, 2, {"N": 4}) == []
    assert "reaches no" in bruteforce.confirm(clipped, OutOfBounds(at, Point("t", (1,), 0), "X", 0, 5, 4, True))


def test_a_generated_refusal_names_its_world_and_sizes():
    assert message_sizes("race: ... (at N=8, M=4, world=3)") == (3, {"N": 8, "M": 4})
    assert message_sizes("the families ask for 200 resident SM programs") is None


if __name__ == "__main__":  # ranks re-import this module as __mp_main__: only the survey runs under this guard
    import random
    import sys

    from gen_schedules import generate

    count, first = int(sys.argv[1]), random.randrange(2**32)
    kinds: dict[str, list[Failure]] = collections.defaultdict(list)
    for start in range(0, count, BATCH):
        found, stats = judge([generate(first + n) for n in range(start, min(count, start + BATCH))])
        TOTALS.update(stats)
        for failure in found:
            kinds[failure.kind].append(failure)
        print(f"{min(count, start + BATCH)} schedules: {dict(TOTALS)}", flush=True)
    for kind, failures in sorted(kinds.items(), key=lambda item: -len(item[1])):
        print(f"\n{len(failures)} x {kind}; the shortest:")
        print(min(failures, key=lambda f: len(f.generated.source)).render())
