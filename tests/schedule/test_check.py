"""The schedule checks: each has a program it refuses (message and line:column asserted) and one it
accepts; every program in programs/ passes, fast."""
from __future__ import annotations

import gc
import re
import textwrap
import time
from pathlib import Path

import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

from tiledsl.diagnostics import TdsError
from tiledsl.pipeline import run
from tiledsl.schedule import ir
from tiledsl.schedule.check import SM_COUNT, check
from tiledsl.schedule.describe import describe
from tiledsl.schedule.meaning import compile_exprs, default_sizes, instantiate

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = sorted((ROOT / "programs").glob("*.tds"))
BROKEN = sorted((Path(__file__).parent / "broken").glob("*.tds"))
AG_GEMM = (ROOT / "programs" / "ag_gemm.tds").read_text()
# the push variant of the one-shot all-reduce: a chunk, a staging buffer and edges across ranks
ALLREDUCE = (ROOT / "bench" / "experiments" / "allreduce_push.tds").read_text()


def tds(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def errors(source: str) -> list:
    with pytest.raises(TdsError) as raised:
        run(source, until="check")
    return [d for d in raised.value.diagnostics if d.severity == "error"]


def the_error(source: str, starts: str):
    found = [d for d in errors(source) if d.message.startswith(starts)]
    assert found, f"no error starting {starts!r}"
    return found[0]


def at(diagnostic) -> tuple[int, int]:
    return diagnostic.span.line, diagnostic.span.column


def passes(source: str) -> list:
    """The warnings of a program that must check without errors."""
    return run(source, until="check").warnings


def line_of(source: str, text: str) -> int:
    return next(n for n, line in enumerate(source.splitlines(), 1) if text in line)


def where(source: str, text: str) -> tuple[int, int]:
    """The line and column of `text` on the first line that has it."""
    line = line_of(source, text)
    return line, source.splitlines()[line - 1].index(text) + 1


# ---- every program ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.stem)
def test_every_program_checks_clean_and_fast(path):
    run(path, until="check")  # warm: the grammar is compiled and expressions are cached once per process
    source = path.read_text()
    # the best of five, in CPU time with the collector paused: what the check itself costs, not other
    # work on busy cores nor a collection of the garbage earlier tests left (timeit's rule). A guard
    # against a check that blows up (a loop per element, an exponential case split), not a benchmark:
    # the slowest programs (sp_ag_attention, ag_group_gemm) take 0.4-0.6 s alone on a 2-core VM and
    # up to 2x that in CI beside the other worker (0.87 s on 2026-12-02), so the bound is 2 s
    seconds = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(5):
            start = time.process_time()
            done = run(source, until="check", path=str(path))
            seconds.append(time.process_time() - start)
    finally:
        gc.enable()
    assert min(seconds) < 2.0, seconds
    assert done.warnings == []


def test_what_the_checker_memoises_per_schedule_is_that_schedules_and_dies_with_it():
    """`meaning.per_schedule` keys by the schedule's id: a second schedule must never get the first's
    answers, even at the same address once the first is gone."""
    import weakref

    from tiledsl.schedule.meaning import per_schedule
    calls = []

    @per_schedule
    def consts_of(schedule, world):
        calls.append(world)
        return dict(schedule.consts), world

    first = run(AG_GEMM, until="check").schedule
    assert consts_of(first, 2) is consts_of(first, 2) and calls == [2]
    assert consts_of(first, 3)[1] == 3 and calls == [2, 3]
    memo = next(cell.cell_contents for cell in consts_of.__closure__ if isinstance(cell.cell_contents, dict))
    assert len(memo) == 2
    gone = weakref.ref(first)
    del first
    gc.collect()
    assert gone() is None and memo == {}  # forgotten with it: no stale answer for a later id
    second = run(AG_GEMM.replace("BN = 256", "BN = 128"), until="check").schedule
    assert consts_of(second, 2)[0]["BN"] == 128 and calls == [2, 3, 2]


@pytest.mark.parametrize("path", BROKEN, ids=lambda p: p.stem)
def test_broken_program_reports_its_expected_error(path):
    """Each file's first line says `# expect: LINE:COL message-prefix`."""
    expected = re.match(r"# expect: (\d+):(\d+) (.*)", path.read_text().splitlines()[0])
    line, column, prefix = int(expected[1]), int(expected[2]), expected[3]
    found = errors(path)
    assert any(at(d) == (line, column) and d.message.startswith(prefix) for d in found), \
        [f"{d.span.line}:{d.span.column} {d.message}" for d in found]


# Each edge of each program, and the race the program has without it: (program, edge) -> (message, site),
# the site being the text of the region the race is reported at.
EDGE_RACES = {
    ("ag_gemm", "mm[i, j] after gather"):
        ("race: tile 'mm' reads A_all while chunk 'gather' may still write it", "A_all[i*BM"),
    ("ag_gemm_push", "mm[i, j] after put"):
        ("race: tile 'mm' reads A_all while chunk 'put' may still write it", "A_all[i*BM"),
    ("allreduce_two_shot", "back[i] after red"):
        ("race: tile 'back' reads G while tile 'red' may still write it", "G@((i*BLOCK)"),
    ("gemm_ar", "red[i, j] after mm"): ("race: tile 'red' reads Q while tile 'mm' may still write it", "Q@s["),
    ("gemm_rs", "red[i, j] after mm"): ("race: tile 'red' reads P while tile 'mm' may still write it", "P[s, "),
    ("gemm_rs_ce", "send[i] after mm"):
        ("race: chunk 'send' reads W while tile 'mm' may still write it", "W[i*BM : +BM, :]"),
    ("gemm_rs_ce", "red[i, j] after send"):
        ("race: tile 'red' reads P while chunk 'send' may still write it", "P[s, "),
    ("gemm_rs_pull", "red[i, j] after mm"): ("race: tile 'red' reads W while tile 'mm' may still write it", "W@s["),
    ("gemm_rs_push", "send[i, j] after mm"):
        ("race: chunk 'send' reads W while tile 'mm' may still write it", "W[i*BM : +BM, j*BN : +BN] ->"),
    ("gemm_rs_push", "red[i, j] after send"):
        ("race: tile 'red' reads P while chunk 'send' may still write it", "P[s, "),
    # the MoE programs: each edge orders a device-valued size, an index tensor or the rows it routes
    ("moe_dispatch", "pack[t, k, h] after route"):
        ("race: tile 'pack' reads slot while tile 'route' may still write it", "slot[t*BT"),
    ("moe_dispatch", "tell[d] after tally"):
        ("race: chunk 'tell' reads sent while tile 'tally' may still write it", "sent[d*E"),
    ("moe_dispatch", "pull[s, e] after"):
        ("race: chunk 'pull' reads send while tile 'pack' may still write it", "send@s["),
    ("moe_dispatch_fp8", "pack[t, k, h] after route"):
        ("race: tile 'pack' reads slot while tile 'route' may still write it", "slot[t*BT"),
    ("moe_dispatch_fp8", "tell[d] after tally"):
        ("race: chunk 'tell' reads sent while tile 'tally' may still write it", "sent[d*E"),
    ("moe_dispatch_fp8", "pull[s, e] after"):
        ("race: chunk 'pull' reads send while tile 'pack' may still write it", "send@s["),
    ("moe_dispatch_fp8", "pulls[s, e] after"):
        ("race: chunk 'pulls' reads scale while tile 'pack' may still write it", "scale@s["),
    ("moe_combine", "ret[s, e] after tally"):
        ("race: chunk 'ret' reads sent while tile 'tally' may still write it", "sent@s[rank*E + e], :] ->"),
    ("moe_combine", "comb[t, h] after"):
        ("race: tile 'comb' reads back while chunk 'ret' may still write it", "back[ids["),
    ("ag_group_gemm", "tally[s] after gather[s]"):
        ("race: tile 'tally' reads ids_all while chunk 'gather' may still write it", "ids_all[s, :, :], E)"),
    ("ag_group_gemm", "route[s, b] after gather[s]"):
        ("race: tile 'route' reads ids_all while chunk 'gather' may still write it", "ids_all[s, :, :], E)["),
    # without it pack is ordered after nothing: the ids it reads are the first race found
    ("ag_group_gemm", "pack[s, t, k] after route[s, (t*BT) / BR]"):
        ("race: tile 'pack' reads ids_all while chunk 'gather' may still write it", "ids_all[s, t*BT"),
    ("ag_group_gemm", "mm[s, e, m, n] after tally[s]"):
        ("race: tile 'mm' reads count while tile 'tally' may still write it", "G[s, e, m*BM"),
    ("ag_group_gemm", "mm[s, e, m, n] after pack"):
        ("race: tile 'mm' reads P while tile 'pack' may still write it", "P[s, e, m*BM"),
    ("moe_gemm_rs", "tally[s] after gather[s]"):
        ("race: tile 'tally' reads ids_all while chunk 'gather' may still write it", "ids_all[s, :, :], E)"),
    ("moe_gemm_rs", "route[s, b] after gather[s]"):
        ("race: tile 'route' reads ids_all while chunk 'gather' may still write it", "ids_all[s, :, :], E)["),
    ("moe_gemm_rs", "mm[s, e, m, n] after tally[s]"):
        ("race: tile 'mm' reads count while tile 'tally' may still write it", "Z[s, e, m*BM"),
    ("moe_gemm_rs", "red[t, n] after"): ("race: tile 'red' reads Z while tile 'mm' may still write it", "Z@q[rank"),
    ("hier_allgather", "mine[m] after across"):
        ("race: chunk 'mine' reads G while chunk 'across' may still write it", "G[(m*local_world"),
    ("hier_allgather", "pull[k, m] after mine"):
        ("race: chunk 'pull' reads G while chunk 'across' may still write it", "G@(node*local_world"),
    ("hier_reduce_scatter", "send[m] after part"):
        ("race: chunk 'send' reads S while tile 'part' may still write it", "S[m, :, :] ->"),
    ("hier_reduce_scatter", "red[i, j] after send"):
        ("race: tile 'red' reads R while chunk 'send' may still write it", "R[s, "),
    ("hier_allreduce", "across[m, i] after red"):
        ("race: chunk 'across' reads P while tile 'red' may still write it", "P[local_rank*Ns + i*BLOCK : +BLOCK] ->"),
    ("hier_allreduce", "tot[i] after across"):
        ("race: tile 'tot' reads Q while chunk 'across' may still write it", "Q[s, "),
    ("hier_allreduce", "back[i] after tot"):
        ("race: tile 'back' reads G while tile 'tot' may still write it", "G@(node*local_world"),
    ("hier_ag_gemm", "share[k, m] after across"):
        ("race: chunk 'share' reads G while chunk 'across' may still write it", "G[(m*local_world"),
    ("hier_ag_gemm", "mm[i, j] after share"):
        ("race: tile 'mm' reads A_all while chunk 'share' may still write it", "A_all[i*BM"),
    ("hier_gemm_rs", "part[m, i, j] after mm"):
        ("race: tile 'part' reads W while tile 'mm' may still write it", "W@(node*local_world"),
    ("hier_gemm_rs", "send[m] after part"):
        ("race: chunk 'send' reads S while tile 'part' may still write it", "S[m, :, :] ->"),
    ("hier_gemm_rs", "red[i, j] after send"):
        ("race: tile 'red' reads R while chunk 'send' may still write it", "R[s, "),
    ("flash_decode", "comb[b, g] after part"):
        ("race: tile 'comb' reads Part while tile 'part' may still write it", "Part@s["),
    ("sp_ulysses", "attn[h, qs, i] after pq"):
        ("race: tile 'attn' reads Qh while tile 'pq' may still write it", "Qh[qs, i*BM"),
    ("sp_ulysses", "fin[i, j] after attn"):
        ("race: tile 'fin' reads Os while tile 'attn' may still write it", "Os[i*BM : +BM, j*D"),
    # rings: without its wait on the previous rank's step, a step forwards a block before it arrives
    ("ring_allgather", "fwd[t] after mine"):
        ("race: chunk 'fwd' reads R while chunk 'mine' may still write it", "R[((rank - t)"),
    ("ring_allgather", "fwd[t] after fwd"):
        ("race: instances of chunk 'fwd' read and write the same elements of R", "R[((rank - t)"),
    ("ring_allgather", "take[t] after fwd"):
        ("race: chunk 'take' reads R while chunk 'fwd' may still write it", "R[((rank - 1 - t)"),
    ("ring_reduce_scatter", "step[k, i, j] after first"):
        ("race: tile 'step' reads P while tile 'first' may still write it", "P[(rank - k - 2)"),
    ("ring_reduce_scatter", "step[k, i, j] after step"):
        ("race: instances of tile 'step' read and write the same elements of P", "P[(rank - k - 2)"),
    ("ring_reduce_scatter", "fin[i, j] after first"):
        ("race: tile 'fin' reads P while tile 'first' may still write it", "P[rank, "),
    ("chain_broadcast", "hop[i] after seed"):
        ("race: tile 'hop' reads B while tile 'seed' may still write it", "B@(rank - 1)"),
    ("chain_broadcast", "hop[i] after hop"):
        ("race: instances of tile 'hop' read and write the same elements of B", "B@(rank - 1)"),
}
EDGES = [(path, line) for path in PROGRAMS for line in path.read_text().splitlines()
         if re.match(r"\w+\[[^]]*\] after ", line)]


@pytest.mark.parametrize("path, edge", EDGES, ids=lambda v: v.stem if isinstance(v, Path) else v.split(" after ")[0])
def test_every_edge_of_every_program_is_needed_without_it_the_program_races(path, edge):
    """The twin of checking every program clean: each edge is what orders the accesses it guards."""
    key = next((k for k in EDGE_RACES if k[0] == path.stem and edge.startswith(k[1])), None)
    assert key, f"{path.stem}: add the race that `{edge}` prevents to EDGE_RACES"
    message, site = EDGE_RACES[key]
    source = path.read_text().replace(edge + "\n", "")
    race = the_error(source, message)
    assert at(race) == where(source, site)
    assert race.hint.startswith(f"add an edge: {edge.split(' after ')[0]} after ")


def test_allgather_pulling_every_block_into_the_same_rows_races_between_its_chunks():
    """allgather is safe because each pull writes its own block of Y: on one rank, two instances of one
    chunk family writing the same rows race."""
    source = (ROOT / "programs" / "allgather.tds").read_text().replace("-> Y[s*Ms", "-> Y[rank*Ms")
    race = the_error(source, "race: instances of chunk 'pull' both write the same elements of Y")
    assert at(race) == where(source, "Y[rank*Ms")
    assert race.hint == "give each instance its own region, or chain them: add an edge: pull[s] after pull[...]"
    assert "pull[1]@rank0 and pull[0]@rank0" in race.notes[0].message


def test_allreduce_is_safe_only_because_peers_read_the_copy_of_x_staged_at_the_call_start():
    """`inout X` read as X@s is read from its staged copy; a symm X is read live while its owner overwrites it."""
    source = (ROOT / "programs" / "allreduce.tds").read_text().replace("inout X", "symm  X")
    race = the_error(source, "race: instances of tile 'add' read and write the same elements of X")
    assert at(race) == where(source, "X@s")
    assert race.hint == "give each instance its own region"  # the instances are on different ranks


# ---- races -----------------------------------------------------------------------------------------

def test_ag_gemm_without_its_edge_races_on_the_gathered_rows():
    source = AG_GEMM.replace("mm[i, j] after gather[(i*BM) / Ms]\n", "")
    race = the_error(source, "race: tile 'mm' reads A_all while chunk 'gather' may still write it")
    tile_line = line_of(source, "tile  mm")
    assert at(race) == (tile_line, source.splitlines()[tile_line - 1].index("A_all[") + 1)
    assert race.hint == "add an edge: mm[i, j] after gather[...]"
    (note,) = race.notes
    assert note.span.line == line_of(source, "chunk gather") and "'gather' writes A_all here" in note.message


def test_allreduce_without_local_pushes_in_its_edge_overwrites_x_while_they_read_it():
    source = ALLREDUCE.replace("add[i] after push[*], ", "add[i] after ")
    race = the_error(source, "race: tile 'add' writes X while chunk 'push' may still read it")
    assert at(race) == (10, 33)
    assert race.notes[0].span.line == 9 and race.notes[0].span.column == 35
    assert race.hint == "add an edge: add[i] after push[...]"


def test_allreduce_without_remote_pushes_reads_the_staging_buffer_too_early():
    source = ALLREDUCE.replace(", push[rank] @ every rank", "")
    race = the_error(source, "race: tile 'add' reads S while chunk 'push' may still write it")
    assert at(race) == (10, 59)
    assert race.hint.endswith("@ every rank")


def test_a_wait_on_an_nvshmem_put_from_a_rank_it_does_not_write_to_would_hang():
    """`add[i] after push[*]` waits on this rank's own puts (which read X) from this rank, but an
    NVSHMEM put signals only the rank it writes to: with sms(4) that edge is fine, on nvshmem it hangs."""
    source = ALLREDUCE.replace("on sms(4)", "on nvshmem(4)")
    assert source != ALLREDUCE
    found = the_error(source, "deadlock: add[0] on rank 0 waits for push[1] on rank 0, an nvshmem put")
    assert at(found) == (line_of(source, "add[i] after push[*]"), 14)
    assert "signals only the rank it writes to (rank 1)" in found.message
    assert found.hint.startswith("wait on the put from the rank it writes to")


def test_a_wait_on_an_nvshmem_put_from_its_target_rank_passes():
    assert passes((ROOT / "programs" / "ag_gemm_push.tds").read_text()) == []


def test_ag_gemm_push_waiting_on_a_put_from_a_rank_it_does_not_write_to_would_hang():
    """The twin of the test above: put[b] on this rank writes rank b's copy and signals only rank b."""
    source = (ROOT / "programs" / "ag_gemm_push.tds").read_text()
    source = source.replace("put[rank] @ ((i*BM) / Ms)", "put[(i*BM) / Ms] @ rank")
    found = the_error(source, "deadlock: mm[2, 0] on rank 0 waits for put[1] on rank 0, an nvshmem put that "
                              "signals only the rank it writes to (rank 1)")
    assert at(found) == where(source, "put[(i*BM) / Ms] @ rank")


def test_race_is_reported_once_per_family_pair():
    source = AG_GEMM.replace("mm[i, j] after gather[(i*BM) / Ms]\n", "")
    assert len([d for d in errors(source) if d.message.startswith("race")]) == 1


OVERLAP = tds("""
    program overlap
    param N
    const B = 64
    in  X : f32[N]
    out Y : f32[N]
    tile first[i in N/B]:  Y[i*B : +B] = X[i*B : +B]
    tile second[i in N/B]: Y[i*B : +B] = relu(X[i*B : +B])
    """)


def test_two_families_writing_the_same_elements_race_until_an_edge_orders_them():
    race = the_error(OVERLAP, "race: tile 'second' writes Y while tile 'first' may still write it")
    assert at(race) == (7, 24)
    assert race.hint == "add an edge: second[i] after first[i]"
    passes(OVERLAP + "second[i] after first[i]\n")


def test_instances_of_one_family_writing_the_same_elements_race():
    source = tds("""
        program same
        param N
        const B = 64
        in  X : f32[N]
        out Y : f32[B]
        tile acc[i in N/B]: Y = X[i*B : +B]
        """)
    race = the_error(source, "race: instances of tile 'acc' both write the same elements of Y")
    assert at(race) == (6, 21)
    passes(source + "acc[i] after acc[i-1]\n")  # a chain orders them


def test_a_family_with_one_instance_per_rank_at_the_smallest_sizes_is_checked_where_it_has_two():
    """N/(world*B) is 1 at the smallest N: the checker grows N until every index has two instances."""
    source = tds("""
        program few
        param N
        const B = 64
        in  X : f32[N]
        out Y : f32[N]
        tile acc[i in N/(world*B)]: Y[TARGET] = X[i*B : +B]
        """)
    assert passes(source.replace("TARGET", "i*B : +B")) == []
    shared = source.replace("TARGET", "0 : +B")
    race = the_error(shared, "race: instances of tile 'acc' both write the same elements of Y")
    assert at(race) == where(shared, "Y[0 : +B]")
    assert "acc[1]@rank0 and acc[0]@rank0" in race.notes[0].message


ACCUMULATE = tds("""
    program accumulate
    param N
    in    X : f32[N]
    symm  S : f32[N]
    out   Y : f32[N]
    chunk push[s in world] on sms(2): X -> S@s[:] reduce add
    tile  take[i in 1]: Y = S
    take[i] after push[rank] @ every rank
    """)


def test_reduce_add_chunks_into_one_target_do_not_race():
    # no race; the one warning is that S, never cleared, sums over calls (tests/schedule/test_carried.py)
    assert [w.message.split(":")[0] for w in passes(ACCUMULATE)] == ["chunk 'push' adds into 'S', which nothing in the call clears"]


@pytest.mark.parametrize("engine", ["sms(2)", "nvshmem(2)", "copy_engine"])
def test_chunks_of_one_family_on_different_ranks_writing_one_copy_race_without_reduce_add(engine):
    """The twin of the test above: every rank's push[s] writes all of S@s, which only `reduce add` makes safe."""
    source = ACCUMULATE.replace(" reduce add", "").replace("on sms(2)", f"on {engine}")
    race = the_error(source, "race: instances of chunk 'push' both write the same elements of S")
    assert at(race) == where(source, "S@s[:]")
    assert race.hint == "give each instance its own region"  # no chain: the instances are on different ranks
    assert "push[0]@rank1 and push[0]@rank0" in race.notes[0].message


def test_reduce_add_still_races_with_a_reader_or_writer_that_is_not_ordered_after_it():
    """Only accumulations commute with each other: reading the target, or writing it plainly, needs an edge."""
    unread = ACCUMULATE.replace("take[i] after push[rank] @ every rank\n", "")
    race = the_error(unread, "race: tile 'take' reads S while chunk 'push' may still write it")
    assert at(race) == (7, 25)
    overwritten = ACCUMULATE.replace("tile  take", "chunk init[s in 1] on sms(1): X -> S[:]\ntile  take") + \
        "take[i] after init[0]\n"
    race = the_error(overwritten, "race: chunk 'init' writes S while chunk 'push' may still write it")
    assert at(race) == where(overwritten, "S[:]")


def test_two_chunk_families_writing_the_same_elements_race_until_an_edge_orders_them():
    source = tds("""
        program twice
        param N
        in    X : f32[N]
        symm  S : f32[world, N]
        out   Y : f32[N]
        chunk a[s in world] on sms(1): X -> S@s[rank, :]
        chunk b[s in world] on copy_engine: X -> S@s[rank, :]
        tile  take[i in 1]: Y = S[0, :]
        take[i] after a[rank] @ every rank, b[rank] @ every rank
        """)
    race = the_error(source, "race: chunk 'b' writes S while chunk 'a' may still write it")
    assert at(race) == (7, 42)
    assert race.hint == "add an edge: b[s] after a[...]"
    assert passes(source + "b[s] after a[s]\n") == []


def test_a_chunk_reading_what_a_chunk_on_another_rank_writes_races_without_the_edge_between_them():
    """RING's `back` forwards what the neighbour's `fwd` wrote into this rank's T."""
    source = RING.replace("back[s] after fwd[0] @ ((rank + world - 1) mod world)\n", "")
    race = the_error(source, "race: chunk 'back' reads T while chunk 'fwd' may still write it")
    assert at(race) == (8, 31)
    assert race.hint == "add an edge: back[s] after fwd[...] @ every rank"
    assert "back[0]@rank1 and fwd[0]@rank0" in race.notes[0].message


ROTATE = tds("""
    program rotate
    param N
    in    X : f32[N]
    symm  S : f32[N]
    out   Y : f32[N]
    chunk push[s in 1] on sms(1): X -> S@(TARGET)[:]
    tile  take[i in 1]: Y = S
    take[i] after push[0] @ every rank
    """)


def test_chunks_that_write_peers_race_only_where_two_ranks_pick_the_same_target():
    """Each rank pushes into one peer's S: safe where the ranks' targets differ, checked at worlds 2, 3
    and 4. rank^3 mod world is one-to-one at worlds 2 and 3, so only world 4 shows the race."""
    assert passes(ROTATE.replace("TARGET", "(rank + 1) mod world")) == []
    race = the_error(ROTATE.replace("TARGET", "(rank * rank * rank) mod world"),
                     "race: instances of chunk 'push' both write the same elements of S")
    assert at(race) == (6, 36)
    assert "push[0]@rank2 and push[0]@rank0" in race.notes[0].message and "world=4" in race.notes[0].message
    race = the_error(ROTATE.replace("TARGET", "(rank * rank) mod world"), "race: instances of chunk 'push'")
    assert "world=3" in race.notes[0].message


def test_regions_that_share_one_element_race_and_adjacent_ones_do_not():
    source = tds("""
        program halves
        param N
        const B = 64
        in  X : f32[N]
        out Y : f32[N]
        tile lo[i in 1]: Y[0 : +B] = X[0 : +B]
        tile hi[i in 1]: Y[START : +B] = X[START : +B]
        """)
    assert passes(source.replace("START", "B")) == []
    race = the_error(source.replace("START", "B - 1"), "race: tile 'hi' writes Y while tile 'lo' may still write it")
    assert at(race) == (7, 18)


def test_a_region_of_size_zero_touches_no_element_and_races_with_nothing():
    """b's region lies inside a[0]'s and has N mod B elements: none at the checked sizes, one more races."""
    source = tds("""
        program empty
        param N
        const B = 64
        require N % B == 0
        in  X : f32[N]
        out Y : f32[N]
        tile a[i in N/B]: Y[i*B : +B] = X[i*B : +B]
        tile b[i in 1]: Y[B/2 : +(SIZE)] = X[B/2 : +(SIZE)]
        """)
    assert passes(source.replace("SIZE", "N mod B")) == []
    race = the_error(source.replace("SIZE", "N mod B + 1"), "race: tile 'b' writes Y while tile 'a' may still write it")
    assert at(race) == (8, 17)


RELAY = tds("""
    program relay
    param N
    const B = 64
    in    X : f32[N]
    local T : f32[N]
    local U : f32[N]
    out   Y : f32[N]
    tile a[i in N/B]: T[i*B : +B] = X[i*B : +B]
    tile b[i in N/B]: U[i*B : +B] = 2 * X[i*B : +B]
    tile c[i in N/B]: Y[i*B : +B] = T[i*B : +B] + U[i*B : +B]
    b[i] after a[i]
    c[i] after b[i]
    """)


def test_a_path_of_edges_through_a_family_that_does_not_touch_the_tensor_orders_its_accesses():
    """c reads what a writes, ordered only through b; without `b after a` nothing orders them."""
    assert passes(RELAY) == []
    source = RELAY.replace("b[i] after a[i]\n", "")
    race = the_error(source, "race: tile 'c' reads T while tile 'a' may still write it")
    assert at(race) == (10, 33)


SLOTS = tds("""
    program slots
    param N
    in    X : f32[N]
    symm  S : f32[world, N]
    out   Y : f32[N]
    chunk push[s in world] on sms(1): X -> S@s[rank, :]
    tile  take[i in 1]: Y = sum(S[s, :] for s in world)
    take[i] after push[rank] @ every rank
    """)


def test_a_sum_over_ranks_reads_every_slot_so_it_waits_for_every_writer():
    assert passes(SLOTS) == []
    source = SLOTS.replace("@ every rank", "@ 0")  # rank 1's push writes slot 1, which nothing orders
    race = the_error(source, "race: tile 'take' reads S while chunk 'push' may still write it")
    assert at(race) == (7, 29)
    assert "push[0]@rank1" in race.notes[0].message


# ---- cycles ----------------------------------------------------------------------------------------

PIPELINE = tds("""
    program pipeline
    param N
    const B = 64
    in    X : f32[N]
    local T : f32[N]
    local U : f32[N]
    out   Y : f32[N]
    tile a[i in N/B]: T[i*B : +B] = X[i*B : +B]
    tile b[i in N/B]: U[i*B : +B] = T[i*B : +B]
    tile c[i in N/B]: Y[i*B : +B] = U[i*B : +B]
    b[i] after a[i]
    c[i] after b[i]
    """)


def test_two_family_cycle_is_reported_with_its_path_and_both_edges():
    cycle = the_error(PIPELINE + "a[i] after b[i]\n", "deadlock: a cycle of waits: a[0]@rank0 -> b[0]@rank0 -> a[0]@rank0")
    assert at(cycle) == (13, 12)
    assert [(n.span.line, n.span.column) for n in cycle.notes] == [(13, 12), (11, 12)]
    passes(PIPELINE)


RING = tds("""
    program ring
    param N
    in   X : f32[N]
    symm T : f32[N]
    symm U : f32[N]
    out  Y : f32[N]
    chunk fwd[s in 1] on sms(1): X -> T@((rank + 1) mod world)[:]
    chunk back[s in 1] on sms(1): T -> U@((rank + world - 1) mod world)[:]
    tile  use[i in 1]: Y = U
    back[s] after fwd[0] @ ((rank + world - 1) mod world)
    use[i] after back[0] @ ((rank + 1) mod world)
    """)


def test_cycle_across_ranks_is_reported_with_ranks_in_its_path():
    cycle = the_error(RING + "fwd[s] after back[0] @ ((rank + 1) mod world)\n",
                      "deadlock: a cycle of waits: fwd[0]@rank0 -> back[0]@rank1 -> fwd[0]@rank0")
    assert at(cycle) == (12, 14)
    assert {n.span.line for n in cycle.notes} == {10, 12}
    passes(RING)


def test_cycle_through_every_rank_is_reported():
    source = PIPELINE.replace("c[i] after b[i]", "c[i] after b[i]\na[i] after b[*] @ every rank")
    cycle = the_error(source, "deadlock: a cycle of waits: a[0]@rank0 -> b[")
    assert at(cycle) == (13, 12)


CHAIN = tds("""
    program chain
    param N
    const B = 64
    in  X : f32[N]
    out Y : f32[N]
    tile a[i in N/B]: Y[i*B : +B] = X[i*B : +B]
    """)


def test_a_family_may_wait_on_its_earlier_instances():
    passes(CHAIN + "a[i] after a[i-1]\n")
    passes(CHAIN + "a[i] after a[i+1]\norder a by N/B - i\n")


def test_a_family_waiting_on_a_later_instance_is_a_deadlock():
    late = the_error(CHAIN + "a[i] after a[i+1]\n",
                     "deadlock: a[0] on rank 0 waits for a[1] on rank 0, which comes after it in the order of 'a'")
    assert at(late) == (7, 12)
    reversed_order = CHAIN + "a[i] after a[i-1]\norder a by N/B - i\n"
    assert at(the_error(reversed_order, "deadlock: a[1] on rank 0 waits for a[0]")) == (7, 12)
    assert at(the_error(CHAIN + "a[i] after a[i]\n", "deadlock: a[0] on rank 0 waits for itself")) == (7, 12)


# seed 4963 of tests/schedule/gen_schedules.py, cut down (the file says why it deadlocks)
TREE = (Path(__file__).parent / "broken" / "seed_4963_tree.tds").read_text()


def test_a_wait_on_a_later_instance_that_only_more_instances_show_is_a_deadlock():
    (found,) = errors(TREE)
    assert found.message == ("deadlock: seed[4] on rank 0 waits for seed[1] on rank 0, which comes after it in "
                             "the order of 'seed' (at N=12, world=2)")
    assert at(found) == where(TREE, "seed[(i - 1)/2]")
    (note,) = found.notes
    assert note.message == "on rank 0 'seed' runs seed[4] 3rd and seed[1] 4th of its 6 instances"
    assert note.span.line == line_of(TREE, "order seed")
    (waits, runs_first) = found.witness.steps
    assert (waits.waiter.index, waits.waited.index, waits.edge) == ((4,), (1,), 0)
    assert (runs_first.waiter.index, runs_first.waited.index, runs_first.edge) == ((1,), (4,), None)
    # in index order seed only ever waits on an earlier instance, at every size
    passes(TREE.replace("order seed by (i - rank) mod world\n", ""))


def test_a_family_waiting_on_itself_is_reported_once_as_a_wait_in_its_order_not_again_as_a_cycle():
    (found,) = errors(CHAIN + "a[i] after a[i]\n")
    assert found.message.startswith("deadlock: a[0] on rank 0 waits for itself in the order of 'a'")


# ---- edges that name no instance ------------------------------------------------------------------

def test_off_by_one_index_map_waits_on_nothing_there_and_the_race_it_leaves_is_refused():
    source = AG_GEMM.replace("gather[(i*BM) / Ms]", "gather[(i*BM) / Ms + 1]")
    race = the_error(source, "race: tile 'mm' reads A_all while chunk 'gather' may still write it")
    assert race.witness is not None and race.witness.tensor == "A_all"
    with pytest.raises(TdsError) as raised:
        run(source, until="check")
    skipped = [d for d in raised.value.diagnostics if d.severity == "warning" and "waits on nothing" in d.message]
    assert skipped and skipped[0].message.startswith(
        "mm[2, 0] on rank 0 waits on nothing through this edge: it names gather[2], but gather has instances 0..1")
    assert at(skipped[0]) == (line_of(source, "mm[i, j] after"), 16)
    assert skipped[0].notes[0].span.line == line_of(source, "chunk gather")


def test_wait_on_a_rank_outside_the_world_waits_on_nothing():
    """`use` on the last rank names rank `world`, which does not exist: it waits on nothing there,
    and reads U before the back chunk of rank 0 has written it: a race."""
    source = RING.replace("((rank + 1) mod world)\n", "(rank + 1)\n")
    the_error(source, "race: tile 'use' reads U while chunk 'back' may still write it")
    with pytest.raises(TdsError) as raised:
        run(source, until="check")
    assert any(d.message.startswith("use[0] on rank 1 waits on nothing through this edge: it names back[0] on "
                                    "rank 2, but ranks are 0..1") and at(d) == (11, 14)
               for d in raised.value.diagnostics if d.severity == "warning")


def test_a_chain_start_waits_on_nothing_without_a_warning():
    assert passes(CHAIN + "a[i] after a[i-1]\n") == []


# ---- bounds ----------------------------------------------------------------------------------------

BLOCKS = tds("""
    program blocks
    param N
    const B = 64
    in  X : f32[N]
    out Y : f32[N]
    tile cp[i in cdiv(N, B)]: Y[i*B : +B] = X[SLICE]
    """)


def test_explicit_range_past_the_end_is_out_of_bounds():
    error = the_error(BLOCKS.replace("SLICE", "i*B + 1 : (i+1)*B + 1"), "out of bounds: dimension 0 of 'X' has size")
    assert at(error) == (6, 43)
    assert "reads it up to" in error.message and "N=" in error.message and "world=" in error.message


def test_explicit_range_that_ends_at_the_end_of_the_dimension_is_in_bounds():
    # N / B instances: a launch condition makes B divide N, so the last range ends at the end
    assert passes(BLOCKS.replace("SLICE", "i*B : (i+1)*B").replace("cdiv(N, B)", "N / B")) == []


def test_explicit_range_past_the_end_at_a_size_no_tile_divides_is_out_of_bounds():
    """Nothing makes B divide N here: the checker also tries sizes with a partial last tile."""
    error = the_error(BLOCKS.replace("SLICE", "i*B : (i+1)*B"), "out of bounds: dimension 0 of 'X' has size")
    assert at(error) == (6, 43) and "reads it up to" in error.message


def test_an_instance_that_writes_nothing_may_read_past_the_end():
    """Two-shot all-reduce at a ragged size: the last ranks' reduce tiles start past the end of X, so
    every region they touch is clipped away and they do nothing; reading past the end in a tile that
    writes something is still refused."""
    two_shot = (ROOT / "programs" / "allreduce_two_shot.tds").read_text()
    assert passes(two_shot) == []
    shifted = BLOCKS.replace("SLICE", "i*B + B : +B")
    assert the_error(shifted, "out of bounds: dimension 0 of 'X' has size")


def test_negative_start_is_out_of_bounds():
    error = the_error(BLOCKS.replace("SLICE", "i*B - 1 : +B"), "out of bounds: dimension 0 of 'X' has size")
    assert at(error) == (6, 43) and "reads it from -1" in error.message


def test_start_beyond_the_dimension_is_out_of_bounds():
    error = the_error(BLOCKS.replace("SLICE", "i*B + B : +B"), "out of bounds: dimension 0 of 'X' has size")
    assert at(error) == (6, 43)


def test_index_beyond_the_dimension_is_out_of_bounds():
    source = tds("""
        program point
        param N
        in  S : f32[world, N]
        out Y : f32[N]
        tile take[i in 1]: Y = S[world, :]
        """)
    assert at(the_error(source, "out of bounds: dimension 0 of 'S' has size")) == (5, 26)


def test_sized_range_may_run_past_the_end_as_a_ragged_last_tile():
    passes(BLOCKS.replace("SLICE", "i*B : +B"))
    passes(BLOCKS.replace("SLICE", "i*B : +B").replace("cdiv(N, B)", "cdiv(N + 1, B)").replace("f32[N]", "f32[N + 1]"))


WIDE = tds("""
    program wide
    param N
    const B = 64
    require N > 8 * B * world
    in  X : f32[N]
    out Y : f32[N]
    tile cp[i in 1]: Y[0 : +1] = X[8*B*world : +1]
    """)


def test_the_checker_assumes_the_requires_and_checks_only_sizes_that_meet_them():
    """X[8*B*world] exists because of the require. The sizes tried first (N = 64 * world, and with the
    require N = 512 * world) do not meet it; checked there, the read would be out of bounds."""
    assert passes(WIDE) == []
    error = the_error(WIDE.replace("require N > 8 * B * world\n", ""),
                      "out of bounds: dimension 0 of 'X' has size 128, but cp[0] on rank 0 reads it from 1024")
    assert at(error) == (6, 32)


# ---- resident programs -----------------------------------------------------------------------------

PROGRAM_COUNTS = tds("""
    program counts
    param N
    in    X : f32[N]
    symm  S : f32[world, N]
    symm  T : f32[world, N]
    out   Y : f32[N]
    chunk a[s in world] on sms(FIRST): X -> S@s[rank, :]
    chunk b[s in world] on sms(SECOND): X -> T@s[rank, :]
    tile  c[i in 1]: Y = S[0, :] + T[1, :]
    c[i] after a[rank] @ every rank, b[rank] @ every rank
    """)


def counts(first: int, second: int) -> str:
    return PROGRAM_COUNTS.replace("FIRST", str(first)).replace("SECOND", str(second))


def test_fixed_programs_must_leave_one_for_the_rest():
    error = the_error(counts(100, 32), f"the families ask for all {SM_COUNT} SMs of the H200, leaving none for 'c'")
    assert at(error) == (7, 21)
    assert error.notes[0].span.line == 8


def test_more_programs_than_sms_is_an_error():
    error = the_error(counts(100, 40), f"the families ask for 140 resident SM programs, but the H200 has {SM_COUNT}")
    assert at(error) == (7, 21)


def test_programs_that_fit_pass():
    passes(counts(100, 31))


# ---- warnings --------------------------------------------------------------------------------------

def test_unused_tensor_lost_work_and_unwritten_symm_are_warned():
    source = tds("""
        program waste
        param N
        in   X : f32[N]
        in   Z : f32[N]
        symm S : f32[N]
        symm R : f32[N]
        out  Y : f32[N]
        tile a[i in 1]: Y = R
        tile b[i in 1]: S = X
        """)
    found = {(d.span.line, d.span.column): d.message for d in passes(source)}
    assert found == {
        (4, 1): "'Z' is never read or written",
        (8, 21): "tile 'a' reads 'R', but nothing in the program writes it",
        (9, 1): "nothing waits on tile 'b' and nothing reads what it writes (S): its work is lost",
    }


def test_out_tensor_nothing_writes_is_warned():
    source = tds("""
        program nothing
        param N
        in  X : f32[N]
        out Y : f32[N]
        out Z : f32[N]
        tile a[i in 1]: Y = X + Z
        """)
    (warning,) = passes(source)
    assert (warning.span.line, warning.message) == (5, "'Z' is `out` but nothing writes it")


# ---- instances -------------------------------------------------------------------------------------

def test_compiled_expressions_use_integer_floor_and_mod():
    x, y = sympy.Symbol("x", integer=True), sympy.Symbol("y", integer=True, positive=True)
    evaluate = compile_exprs((sympy.floor(x / y), sympy.ceiling(x / y), sympy.Mod(x, y), x * y / 4,
                              sympy.Max(x, 3)), (x, y))
    assert evaluate(-7, 2) == (-4, -3, 1, -7 * 2 // 4, 3)
    assert evaluate(10**20 + 1, 3) == ((10**20 + 1) // 3, -(-(10**20 + 1) // 3), (10**20 + 1) % 3,
                                       (10**20 + 1) * 3 // 4, 10**20 + 1)


@given(st.integers(-10**6, 10**6), st.integers(1, 10**4), st.integers(0, 64))
def test_compiled_index_maps_agree_with_sympy(i, m, rank):
    x, y, r = sympy.Symbol("x", integer=True), sympy.Symbol("y", integer=True, positive=True), sympy.Symbol("r")
    exprs = (sympy.floor((128 * x + y * r / 4) / 128), sympy.Mod(sympy.floor(x * 4 / y) - r, 3),
             sympy.ceiling(x / (32 * y)), sympy.Mod(128 * x, y / 2))
    values = {x: i, y: 2 * m, r: 4 * rank}
    assert compile_exprs(exprs, (x, y, r))(i, 2 * m, 4 * rank) == tuple(int(e.subs(values)) for e in exprs)


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.stem)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_default_sizes_meet_the_conditions_with_two_instances_per_index(path, world):
    schedule = run(path, until="schedule").schedule
    sizes = default_sizes(schedule, world)
    concrete = instantiate(schedule, world, sizes)
    assert 0 < len(concrete.instances) <= 5000
    for name, extents in concrete.extents.items():
        # an index over the nodes (`m in nodes`, no param in it) has one value on one node, and a ring's
        # steps (`t in world - 1`) one at world 2: sizes cannot change an extent of no param
        by_topology = [not {str(s) for s in e.free_symbols} & set(schedule.params)
                       and bool(e.free_symbols & {ir.NODES, ir.LOCAL_WORLD, ir.WORLD})
                       for _, e in schedule.families[name].indices]
        # on a rank the family runs on (`if rank != 0`: not on rank 0)
        running = next((e for e in extents if any(e)), extents[0])
        assert all(n >= 2 for n, fixed in zip(running, by_topology) if not fixed), (name, extents)
    values = {sympy.Symbol(k, integer=True, positive=True): v for k, v in concrete.sizes.items()}
    values[sympy.Symbol("world", integer=True, positive=True)] = world
    assert all(bool(c.holds.subs(values)) for c in schedule.conditions)


def test_ag_gemm_instances_read_the_rows_their_gather_writes():
    schedule = run(AG_GEMM, until="schedule").schedule
    concrete = instantiate(schedule, 2, {"M": 512, "K": 64, "N": 300})
    assert concrete.extents == {"gather": [(2,), (2,)], "mm": [(4, 2), (4, 2)]}
    writes = {(concrete.instances[a.instance].index, a.copy): (a.lo, a.hi)
              for a in concrete.accesses if a.write and concrete.instances[a.instance].family == "gather"}
    assert writes[(1,), 0] == ((256, 0), (512, 64))
    # The last column tile is ragged: clipped at N = 300.
    last = next(a for a in concrete.accesses if a.write and concrete.instances[a.instance].index == (3, 1))
    assert (last.lo, last.hi, last.reach[1]) == ((384, 256), (512, 300), (256, 256, 512))
    waits = {concrete.instances[w.consumer].index: [concrete.instances[p] for p in w.producers]
             for w in concrete.waits if concrete.instances[w.consumer].rank == 1}
    assert [(p.family, p.index, p.rank) for p in waits[(3, 0)]] == [("gather", (1,), 1)]
    # mm on rank 1 starts with the rows it already has (gather[1]), then rank 0's.
    mm = sorted(concrete.ranges["mm"][1], key=concrete.order.__getitem__)
    assert [concrete.instances[p].index for p in mm[:4]] == [(2, 0), (3, 0), (2, 1), (3, 1)]


def test_every_rank_edges_name_the_producer_on_each_rank():
    schedule = run(ALLREDUCE, until="schedule").schedule
    concrete = instantiate(schedule, 3, {"N": 4096})
    remote = [w for w in concrete.waits if w.edge == 1 and concrete.instances[w.consumer].rank == 2]
    assert {(concrete.instances[p].index, concrete.instances[p].rank) for p in remote[0].producers} == \
        {((2,), 0), ((2,), 1), ((2,), 2)}
    reads = [a for a in concrete.accesses if not a.write and concrete.instances[a.instance].family == "add"]
    assert reads[0].lo == (0, 0) and reads[0].hi == (3, 2048)  # `s in world` spans every slot


def test_describe_lists_tensors_families_edges_and_conditions():
    text = describe(run(AG_GEMM, until="schedule").schedule)
    assert "symm  A_all : bfloat16[M, K]" in text
    assert "chunk gather[s in world] on copy_engine" in text
    assert "tile mm[i in M/BM, j in ceiling(N/BN)] on sms(rest)" in text
    assert "mm[i, j] after gather[floor(BM*i*world/M)]" in text
    assert "M must be divisible by world" in text


def test_check_returns_no_diagnostics_for_a_clean_schedule():
    assert check(run(AG_GEMM, until="schedule").schedule) == []


GATHER_THEN_SCALE = tds("""
    program gather_then_scale
    param M, N
    inout X : bf16[M / world, N]
    out   Y : bf16[M, N]
    let Ms = M / world
    chunk pull[s in world] on copy_engine: X@s -> Y[s*Ms : +Ms, :]
    tile  scale[i in 1]: X = X * 2
    """)


def test_peer_reads_of_a_caller_tensor_read_its_staged_copy_and_do_not_race_with_local_writes():
    assert passes(GATHER_THEN_SCALE) == []


def test_peer_reads_of_a_symm_tensor_read_it_live_and_race_with_its_owners_writes():
    source = GATHER_THEN_SCALE.replace("inout X", "symm  X")
    race = the_error(source, "race: chunk 'pull' reads X while tile 'scale' may still write it")
    assert at(race) == (6, 40)
    # of the racing pairs, one across ranks (the peer's read): the edge must reach every rank
    assert "pull[0]@rank1 and scale[0]@rank0" in race.notes[0].message
    assert race.hint == "add an edge: pull[s] after scale[...] @ every rank"


def test_program_too_large_to_instantiate_is_warned_not_checked():
    source = tds("""
        program many
        param N
        const B = 4096
        in  X : f32[N]
        out Y : f32[N]
        out Z : f32[N]
        tile one[i in N]: Y[i] = X[i]
        tile blocks[i in N/B]: Z[i*B : +B] = X[i*B : +B]
        """)
    (warning,) = passes(source)
    assert warning.message.startswith("races, deadlocks and bounds were not checked: no params meet")
    assert (warning.span.line, warning.span.column) == (1, 9)


def test_default_sizes_drop_consts_the_conditions_do_not_need_when_instances_would_be_too_many():
    source = tds("""
        program ragged
        param N
        const B = 4096
        in  X : f32[N]
        out Y : f32[N]
        out Z : f32[N]
        tile one[i in N]: Y[i] = X[i]
        tile blocks[i in cdiv(N, B)]: Z[i*B : +B] = X[i*B : +B]
        """)
    schedule = run(source, until="schedule").schedule
    assert default_sizes(schedule, 2) == {"N": 2}
    assert passes(source) == []


def test_launch_condition_on_consts_alone_that_fails_is_an_error():
    source = tds("""
        program indivisible
        param N
        const B = 4, C = 3
        in  X : f32[N]
        out Y : f32[N]
        tile a[i in B/C]: Y[i*B : +B] = X[i*B : +B]
        """)
    error = the_error(source, "B must be divisible by C, and it is not (B = 4, C = 3)")
    assert at(error) == (6, 13)


# ---- orders that make tiles wait ---------------------------------------------------------------------

def test_a_chunk_running_in_another_order_than_its_tiles_need_is_a_warning():
    source = AG_GEMM.replace("order gather by (s - rank) mod world\n", "")
    found = run(source, until="check").warnings
    (late,) = [w for w in found if "do not arrive in the order" in w.message]
    assert late.message.startswith("mm[2, 0] on rank 1 runs first but waits for gather[1] on rank 1, which "
                                   "'gather' runs 2nd of 2")
    assert at(late) == (line_of(source, "mm[i, j] after"), 16)
    assert late.hint == "order 'gather' the way 'mm' uses it, e.g. `order gather by ...`"


def test_a_chunk_ordered_like_its_tiles_draws_no_warning():
    assert not run(AG_GEMM, until="check").warnings


def test_a_race_only_below_the_tile_size_is_found():
    """A generated all-gather (seed 4327 of gen_schedules.py): use[i] reads rows i*4 .. i*4+3 and waits
    for the chunk of its first row and for the one after its last row's. At N=2 or 3 (below the tile's
    4 rows) use[0] reads rows of gather[1] without waiting for it; at the multiples (N=8) and their
    neighbours (N=9) every row's chunk is waited for, directly or through use[i - 1]. The checker also
    proves a schedule at the smallest sizes its conditions allow, and finds the race."""
    source = tds("""
        program gen_gather
        param N, M
        const B4 = 4
        in X : f32[N, M]
        out Y : f32[world * N, M]
        symm G : f32[world * N, M]
        chunk gather[s in world] on sms(2): X@s -> G[s*N : +N, :]
        tile use[i in cdiv(world * N, B4)]: Y[i*B4 : +B4, :] = G[i*B4 : +B4, :]
        gather[s] after gather[s - 1]
        use[i] after gather[(i*B4)/N], gather[(i*B4 + 3)/N + 1], use[i - 1]
    """)
    assert the_error(source, "race: tile 'use' reads G while chunk 'gather' may still write it")


# ---- peers ----------------------------------------------------------------------------------------

CHAIN_FROM_RANK_1 = tds("""
    program chain
    param N
    in X : f32[N]
    out Y : f32[N]
    symm B : f32[N]
    tile seed[i in cdiv(N, 3)] if rank == 1: B[i*3 : +3] = X[i*3 : +3]
    tile hop[i in cdiv(N, 3)] if rank != 1: B[i*3 : +3] = B@(rank - 1)[i*3 : +3]
    tile use[i in cdiv(N, 2)]: Y[i*2 : +2] = B[i*2 : +2] + 1.0
    hop[i] after seed[i] @ (rank - 1), hop[i] @ (rank - 1)
    use[i] after seed[(i*2)/3], seed[min((i*2 + 1)/3, cdiv(N, 3) - 1)], hop[(i*2)/3], hop[(i*2 + 1)/3]
""")


def test_a_read_of_a_peer_below_rank_0_is_refused_with_the_rank_and_the_peer():
    """Seed 226624777 of the long differential run: `hop` runs on rank 0 (its guard is `rank != 1`) and
    reads B@(-1), which no rank has; it was accepted and computed garbage."""
    found = the_error(CHAIN_FROM_RANK_1, "no such rank")
    assert "hop[0] on rank 0 reads 'B'@-1" in found.message
    assert at(found) == where(CHAIN_FROM_RANK_1, "B@(rank - 1)")
    assert found.witness.copy == -1 and found.witness.instance.rank == 0 and not found.witness.write


def test_a_write_to_a_peer_past_the_last_rank_is_refused():
    source = tds("""
        program push
        param N
        in X : f32[N]
        symm B : f32[N]
        out Y : f32[N]
        tile put[i in N / 2]: B@(rank + 1)[i*2 : +2] = X[i*2 : +2]
        tile use[i in N / 2]: Y[i*2 : +2] = B[i*2 : +2]
        use[i] after put[i] @ (rank - 1)
    """)
    found = the_error(source, "no such rank")
    assert "writes 'B'@" in found.message and found.witness.write
    assert found.witness.copy == found.witness.at.world and found.witness.instance.rank == found.witness.at.world - 1
    assert at(found) == where(source, "B@(rank + 1)")


def test_the_same_peer_wrapped_around_the_world_is_accepted():
    wrapped = CHAIN_FROM_RANK_1.replace("B@(rank - 1)", "B@((rank - 1) mod world)")
    assert not [d for d in errors_or_none(wrapped) if d.message.startswith("no such rank")]
    guarded = CHAIN_FROM_RANK_1.replace("if rank != 1", "if rank > 1").replace("if rank == 1", "if rank == 0") \
        .replace("seed[i] @ (rank - 1), hop[i] @ (rank - 1)", "seed[i] @ 0, hop[i] @ (rank - 1)")
    assert not [d for d in errors_or_none(guarded) if d.message.startswith("no such rank")]


def errors_or_none(source: str) -> list:
    try:
        run(source, until="check")
    except TdsError as refusal:
        return [d for d in refusal.diagnostics if d.severity == "error"]
    return []


def test_check_at_a_runs_large_sizes_proves_the_world_at_its_default_sizes():
    """A run at sizes of millions of instances (a 64 MB all-reduce at world 8 took 72 s to instantiate)
    is proved at its world and default sizes instead: quickly, and still refusing what its world breaks."""
    from tiledsl import pipeline
    from tiledsl.schedule.check import AT_MOST_INSTANCES, check_at
    from tiledsl.schedule.meaning import total_instances
    schedule = pipeline.run("program p\nparam N\nin X : f32[N]\nout Y : f32[N]\n"
                            "tile cp[i in N/4]: Y[i*4 : +4] = X@(world - 2)[i*4 : +4]\n", until="check").schedule
    huge = {"N": 4 * (AT_MOST_INSTANCES + 4)}
    assert total_instances(schedule, 1, huge) > AT_MOST_INSTANCES
    began = time.monotonic()
    wrong = check_at(schedule, 1, huge)
    assert time.monotonic() - began < 10
    assert [d.message.split(":")[0] for d in wrong] == ["no such rank"] and "world=1" in wrong[0].message
    assert check_at(schedule, 2, huge) == []
