"""Hints are checked: a race's hint, followed as a user would (its edge added to the source), gives a
program the checker accepts, or one whose next race has a hint to follow, and never a deadlock.
Racy programs written by hand (reads and writes across ranks, a buffer read and then reused) and
drawn from the differential test's generator (tests/schedule/gen_schedules.py)."""
from __future__ import annotations

import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

from tiledsl.diagnostics import TdsError
from tiledsl.pipeline import run

sys.path.insert(0, os.fspath(Path(__file__).parent))
from gen_schedules import generate  # noqa: E402

STEPS = 4  # hints followed before a program must be accepted
# generated programs followed per run (TILEDSL_HINT_SEEDS=300 for a longer run by hand)
SEEDS = range(int(os.environ.get("TILEDSL_HINT_SEEDS", "40")))


def tds(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def check_errors(source: str) -> list:
    try:
        run(source, until="check")
    except TdsError as refused:
        return [d for d in refused.diagnostics if d.severity == "error"]
    return []


def is_deadlock(diagnostic) -> bool:
    return diagnostic.message.startswith("deadlock") or "wait on each other" in diagnostic.message


def hinted_edges(hint: str | None, source: str) -> list[str]:
    """The edge a hint names, with each way a user could fill its `[...]`: every instance (`[*]`), or
    the instance that `rank` names where the producer has an index over the ranks (a put to rank s
    signals only rank s: waiting on all of them would hang). [] where the hint names no edge."""
    found = re.search(r"add an edge: (.*)", hint or "")
    if found is None:
        return []
    edge = found.group(1).split(" (a chain across ranks)")[0]
    if "[...]" not in edge:
        return [edge]
    consumer, producer = edge.split(" after ")
    name = producer.split("[")[0]
    family = run(source, until="schedule").schedule.families[name]
    if consumer.split("[")[0] == name:  # chained: each instance after the one before it
        if len(family.indices) != 1:
            return []
        return [edge.replace("[...]", f"[{family.index_names[0]} - 1]")]
    fills = [["*"] * len(family.indices)]
    for n, (_, extent) in enumerate(family.indices):
        if str(extent) == "world":
            fills.append(["rank" if m == n else "*" for m in range(len(family.indices))])
    return [edge.replace("[...]", f"[{', '.join(fill)}]") for fill in fills]


def follow(source: str) -> tuple[str, list[str]]:
    """Follow the hint of the first race until the program is accepted: ('accepted', edges added), or
    why it stopped ('unfollowable: HINT' where the hint names no edge, 'deadlock: ...', 'racy')."""
    added: list[str] = []
    for _ in range(STEPS + 1):
        found = check_errors(source)
        if not found:
            return "accepted", added
        races = [d for d in found if d.message.startswith("race")]
        if any(is_deadlock(d) for d in found) or not races:
            return f"refused: {found[0].message}", added
        choices = hinted_edges(races[0].hint, source)
        if not choices:
            return f"unfollowable: {races[0].hint}", added
        # the first way of filling the hint's index map that does not deadlock
        followed = [source + edge + "\n" for edge in choices]
        fine = [n for n, s in enumerate(followed) if not any(is_deadlock(d) for d in check_errors(s))]
        if not fine:
            deadlock = next(d for d in check_errors(followed[0]) if is_deadlock(d))
            return f"deadlock: {choices[0]}: {deadlock.message}", added
        added.append(choices[fine[0]])
        source = followed[fine[0]]
    return "racy", added


# a buffer read across ranks, then overwritten with the result of the read (issue 24, bug 5): the
# writer already waits for the reader on its rank, so `p2 after p3 @ every rank` would deadlock
READ_THEN_OVERWRITE = tds("""
    program read_then_overwrite
    param N
    in    X : f32[N]
    symm  S : f32[N]
    out   Y : f32[N]
    tile  p1[i in 1]: S = X
    tile  p2[i in 1]: Y = S@((rank + 1) mod world)
    tile  p3[i in 1]: S = Y
    p2[i] after p1[0] @ ((rank + 1) mod world)
    p3[i] after p2[i]
    """)

# a buffer reused: p2 reads what p1 wrote (it waits on p1), then p3 writes the buffer anew. An edge
# `p2 after p3` is accepted too, but p2 would read p3's values: the hint orders the overwrite after the read
BUFFER_REUSED = tds("""
    program buffer_reused
    param N
    in    X : f32[N]
    in    Z : f32[N]
    symm  S : f32[N]
    out   Y : f32[N]
    out   W : f32[N]
    tile  p1[i in 1]: S = X
    tile  p2[i in 1]: Y = S@((rank + 1) mod world)
    tile  p3[i in 1]: S = Z
    tile  p4[i in 1]: W = S@((rank + 1) mod world)
    p2[i] after p1[0] @ ((rank + 1) mod world)
    p3[i] after p1[0]
    p4[i] after p3[0] @ ((rank + 1) mod world)
    """)

# a read across ranks of what a peer's tile writes, with no edge at all
PULL_WITHOUT_EDGE = tds("""
    program pull_without_edge
    param N
    in    X : f32[N]
    symm  S : f32[N]
    out   Y : f32[N]
    tile  fill[i in 1]: S = X * 2
    tile  take[i in 1]: Y = S@((rank + 1) mod world)
    """)

# the caller's value of an `inout` tensor read by a later family on its own rank, overwritten before
CALLER_VALUE = tds("""
    program caller_value
    param N
    const B = 2
    inout X : f32[N]
    out   Y : f32[N]
    tile  scale[i in cdiv(N, B)]: X[i*B : +B] = X[i*B : +B] * 2
    tile  copy[i in cdiv(N, B)]: Y[i*B : +B] = X[i*B : +B]
    """)

# puts into every rank's buffer, read there with no wait
PUTS_UNWAITED = tds("""
    program puts_unwaited
    param N
    in    X : f32[N]
    symm  G : f32[world * N]
    out   Y : f32[world * N]
    chunk put[s in world] on nvshmem(2): X -> G@s[rank*N : +N]
    tile  use[i in world]: Y[i*N : +N] = G[i*N : +N]
    """)

# an all-gather through staging buffers with no edge (tests/corpus/refused/stage_race.tds): take[s, i]
# reads the block that stage[i] writes on rank s, and the hint names that instance and rank
STAGE_RACE = tds("""
    program stage_race
    param N
    const BLOCK = 128
    in    X : f32[N]
    out   Y : f32[world, N]
    symm  S : f32[N]
    tile  stage[i in cdiv(N, BLOCK)]: S[i*BLOCK : +BLOCK] = X[i*BLOCK : +BLOCK]
    tile  take[s in world, i in cdiv(N, BLOCK)]: Y[s, i*BLOCK : +BLOCK] = S@s[i*BLOCK : +BLOCK]
    """)

# the LM head's copy engine pulling a peer's logits with no edge (tests/corpus/refused/lm_head_race.tds):
# it copies all of Lg@s, which tiles write block by block, so the hint names every tile of rank s,
# which is also what a copy engine can wait on (a row or all of a kernel family's instances)
LM_HEAD_RACE = (Path(__file__).parents[1] / "corpus" / "refused" / "lm_head_race.tds").read_text()

HAND_WRITTEN = {"read_then_overwrite": READ_THEN_OVERWRITE, "buffer_reused": BUFFER_REUSED,
                "pull_without_edge": PULL_WITHOUT_EDGE, "caller_value": CALLER_VALUE, "puts_unwaited": PUTS_UNWAITED,
                "stage_race": STAGE_RACE, "lm_head_race": LM_HEAD_RACE}


def test_a_read_of_a_peers_block_is_hinted_with_the_instance_and_rank_that_write_it():
    race = next(d for d in check_errors(STAGE_RACE) if d.message.startswith("race"))
    assert race.hint == "add an edge: take[s, i] after stage[i] @ s"  # before: stage[...] @ every rank
    assert check_errors(STAGE_RACE + "take[s, i] after stage[i] @ s\n") == []


def test_a_copy_of_a_whole_peer_tensor_is_hinted_with_every_tile_of_that_rank():
    race = next(d for d in check_errors(LM_HEAD_RACE) if d.message.startswith("race"))
    assert race.hint == "add an edge: gather[s] after mm[*, *] @ s"  # before: mm[0, 0] @ s, one tile
    assert check_errors(LM_HEAD_RACE + "gather[s] after mm[*, *] @ s\n") == []


def test_a_copy_of_a_row_block_is_hinted_with_every_tile_of_the_row():
    """gemm_rs_ce without its edge: the copy of a row block reads what every tile of the row writes."""
    gemm_rs_ce = (Path(__file__).parents[2] / "programs" / "gemm_rs_ce.tds").read_text()
    without = gemm_rs_ce.replace("send[i] after mm[i, *]\n", "")
    race = next(d for d in check_errors(without) if d.message.startswith("race"))
    assert race.hint == "add an edge: send[i] after mm[i, *]"  # before: mm[...]


def test_a_write_after_a_read_across_ranks_is_hinted_to_wait_for_the_read():
    (race,) = [d for d in check_errors(READ_THEN_OVERWRITE) if "'p2'" in d.message]
    assert race.message == "race: tile 'p3' writes S while tile 'p2' may still read it"
    assert race.hint == "add an edge: p3[i] after p2[...] @ every rank"
    # the reverse, the hint of old, deadlocks: p3 waits for p2 on its own rank already
    reverse = READ_THEN_OVERWRITE + "p2[i] after p3[*] @ every rank\n"
    assert any(is_deadlock(d) for d in check_errors(reverse))


def test_a_buffer_read_then_reused_is_hinted_to_overwrite_after_the_read():
    race = next(d for d in check_errors(BUFFER_REUSED) if d.message.startswith("race"))
    assert race.message == "race: tile 'p3' writes S while tile 'p2' may still read it"
    assert race.hint == "add an edge: p3[i] after p2[...] @ every rank"


def test_a_race_between_two_families_is_hinted_across_ranks_when_any_of_its_pairs_is():
    """put[0] on rank 0 writes rank 0's G and put[0] on rank 1 writes it too: the edge must reach every rank."""
    race = next(d for d in check_errors(PUTS_UNWAITED) if d.message.startswith("race"))
    assert race.hint == "add an edge: use[i] after put[...] @ every rank"


@pytest.mark.parametrize("name", HAND_WRITTEN)
def test_following_the_hints_of_a_racy_program_gives_an_accepted_one(name):
    source = HAND_WRITTEN[name]
    assert any(d.message.startswith("race") for d in check_errors(source)), "the program must race"
    verdict, added = follow(source)
    assert verdict == "accepted", f"{verdict} after {added}\n{source}"


def test_following_the_hints_of_generated_racy_programs_never_deadlocks():
    """Generated programs whose only errors are races: every hint that names an edge, followed, leads
    to an accepted program within a few steps. Programs with an error no edge can mend (a deadlock of
    their own, a read of a rank that does not exist, as `B@(rank - 1)` on rank 0) are left out: their
    refusal stands after any edge, and is the checker's to show, not the hint's."""
    followed = accepted = 0
    for seed in SEEDS:
        generated = generate(seed)
        found = check_errors(generated.source)
        if not found or not all(d.message.startswith("race") for d in found):
            continue
        verdict, added = follow(generated.source)
        if verdict.startswith("unfollowable"):
            continue
        followed += 1
        assert verdict == "accepted", f"generate({seed}): {verdict} after {added}\n{generated.source}"
        accepted += 1
    assert followed >= len(SEEDS) // 10, f"only {followed} racy programs with an edge to follow"
