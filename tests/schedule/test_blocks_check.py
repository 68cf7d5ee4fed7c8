"""Tiles written as blocks (tile_body.py): what the front end refuses, each with its line and column,
and what the checker proves about a loop's waits. Every accepted program has a twin, changed in one
place, that is refused: a step that reads a chunk it did not wait for is a race, whatever the other
steps waited for; a carried value must keep one shape; names bound in a step are gone after the loop."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tiledsl.diagnostics import TdsError
from tiledsl.pipeline import run
from tiledsl.schedule.meaning import default_sizes, instantiate
from tiledsl.schedule.witness import Race

ROOT = Path(__file__).resolve().parents[2]


def tds(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def errors(source: str) -> list:
    with pytest.raises(TdsError) as raised:
        run(source, until="check")
    return [d for d in raised.value.diagnostics if d.severity == "error"]


def the_error(source: str, starts: str):
    found = [d for d in errors(source) if d.message.startswith(starts)]
    assert found, f"no error starting {starts!r}: {[d.message for d in errors(source)]}"
    return found[0]


def where(source: str, text: str) -> tuple[int, int]:
    """Line and column of the first occurrence of `text`."""
    for number, line in enumerate(source.splitlines(), 1):
        if text in line:
            return number, line.index(text) + 1
    raise AssertionError(f"{text!r} not in the source")


def at(diagnostic) -> tuple[int, int]:
    return diagnostic.span.line, diagnostic.span.column


# An all-gather of K and V by the copy engine, and attention whose step c waits for the chunk that
# holds key block c: this rank's own chunk first.
GATHERED = tds("""
    program gathered
    param M, N
    const BM = 16, BN = 16, D = 32
    in  Q : bf16[M, D]
    in  K : bf16[N / world, D]
    in  V : bf16[N / world, D]
    out O : bf16[M, D]
    symm K_all : bf16[N, D]
    symm V_all : bf16[N, D]
    let Nl = N / world
    require Nl % BN == 0

    chunk gk[s in world] on copy_engine: K@s -> K_all[s*Nl : +Nl, :]
    chunk gv[s in world] on copy_engine: V@s -> V_all[s*Nl : +Nl, :]
    tile attn[i in cdiv(M, BM)]:
        q = Q[i*BM : +BM, :]
        m = -inf; l = 0; acc = 0
        for t in N / BN:
            c = (rank*(Nl/BN) + t) mod (N/BN)
            wait gk[(c*BN)/Nl], gv[(c*BN)/Nl]
            s = (q @ K_all[c*BN : +BN, :].T) * 0.25
            mn = max(m, rowmax(s)); p = exp2(s - mn); alpha = exp2(m - mn)
            l = l * alpha + rowsum(p)
            acc = acc * alpha + bf16(p) @ V_all[c*BN : +BN, :]
            m = mn
        O[i*BM : +BM, :] = acc / l
    order gk by (s - rank) mod world
    order gv by (s - rank) mod world
""")


def test_a_loop_that_waits_for_each_chunk_it_reads_is_accepted():
    assert run(GATHERED, until="check").warnings == []


def test_each_step_waits_on_the_chunk_its_index_map_names_for_that_step():
    schedule = run(GATHERED, until="check").schedule
    concrete = instantiate(schedule, 2, default_sizes(schedule, 2))
    blocks = concrete.sizes["N"] // 16
    for wait in concrete.waits:
        consumer = concrete.instances[wait.consumer]
        (producer,) = (concrete.instances[p] for p in wait.producers)
        chunk = ((consumer.rank * blocks // 2 + wait.step) % blocks) * 16 // (concrete.sizes["N"] // 2)
        assert producer.index == (chunk,) and producer.rank == consumer.rank
    assert {w.step for w in concrete.waits} == set(range(blocks))


def test_a_step_that_waits_for_the_wrong_chunk_races_with_the_gather():
    source = GATHERED.replace("wait gk[(c*BN)/Nl]", "wait gk[((c*BN)/Nl + 1) mod world]")
    error = the_error(source, "race: tile 'attn' reads K_all while chunk 'gk' may still write it")
    assert at(error) == where(source, "K_all[c*BN : +BN, :].T")
    assert "at step 0" in error.notes[0].message
    assert error.hint.startswith("wait for it in the loop")
    # the witness names the step: the gather's write, and the read of attention's step 0
    assert isinstance(error.witness, Race)
    assert (error.witness.first.family, error.witness.first.step) == ("gk", None)
    assert (error.witness.second.family, error.witness.second.step) == ("attn", 0)


def test_waiting_early_for_a_later_chunk_does_not_cover_this_step():
    """Step c waits only for chunk c+1 (mod): its own chunk was waited for by no earlier step on the
    first step, and that is a race even though the steps together wait for every chunk."""
    source = GATHERED.replace("wait gk[(c*BN)/Nl], gv[(c*BN)/Nl]",
                              "wait gk[((c*BN)/Nl + 1) mod world], gv[((c*BN)/Nl + 1) mod world]")
    found = {d.message.split(" while ")[0] for d in errors(source)}
    assert found == {"race: tile 'attn' reads K_all", "race: tile 'attn' reads V_all"}


def test_a_loop_without_its_waits_races():
    source = GATHERED.replace("        wait gk[(c*BN)/Nl], gv[(c*BN)/Nl]\n", "")
    assert len([d for d in errors(source) if d.message.startswith("race: tile 'attn' reads")]) == 2


def test_a_wait_in_the_loop_that_makes_families_wait_on_each_other_is_a_deadlock():
    source = tds("""
        program cycle
        param N
        const B = 16
        in  X : f32[N]
        out Y : f32[N]
        symm S : f32[N]
        chunk send[s in cdiv(N, B)] on sms(1): X[s*B : +B] -> S[s*B : +B]
        tile t[i in cdiv(N, B)]:
            acc = 0
            for c in cdiv(N, B):
                wait send[c]
                acc = acc + S[c*B : +B]
            Y[i*B : +B] = acc
        send[s] after t[s]
    """)
    error = the_error(source, "deadlock: a cycle of waits: send[0]@rank0 -> t[0]@rank0 -> send[0]@rank0")
    notes = [n.message for n in error.notes]
    assert "t[0]@rank0 at step 0 waits for send[0]@rank0 here" in notes
    assert where(source, "send[c]")[0] in {n.span.line for n in error.notes}


# ---- the front end: carried state, statement placement, values -------------------------------------

ONE_RANK = tds("""
    program local
    param M, N
    const BM = 16, BN = 16, D = 32
    in  Q : bf16[M, D]
    in  K : bf16[N, D]
    in  V : bf16[N, D]
    out O : bf16[M, D]
    tile attn[i in cdiv(M, BM)]:
        q = Q[i*BM : +BM, :]
        m = -inf; l = 0; acc = 0
        for c in cdiv(N, BN):
            s = where(c*BN + cols(BN) < N, (q @ K[c*BN : +BN, :].T) * 0.25, -inf)
            mn = max(m, rowmax(s)); p = exp2(s - mn); alpha = exp2(m - mn)
            l = l * alpha + rowsum(p)
            acc = acc * alpha + bf16(p) @ V[c*BN : +BN, :]
            m = mn
        O[i*BM : +BM, :] = acc / l
""")


def test_the_local_program_is_accepted_and_its_carried_state_has_the_updates_shapes():
    schedule = run(ONE_RANK, until="check").schedule
    loop = schedule.families["attn"].loop
    assert {c.name: [str(d) for d in c.shape] for c in loop.carried} == \
        {"m": ["BM", "1"], "l": ["BM", "1"], "acc": ["BM", "D"]}


@pytest.mark.parametrize("change, site, message", [
    # a carried value keeps one shape: a start of another shape than its update
    (("acc = 0", "acc = rowsum(Q[i*BM : +BM, :])"), "for c in",
     "'acc' is carried across the loop, but it starts with shape [BM, 1]"),
    # a name a step binds is gone after the loop
    (("O[i*BM : +BM, :] = acc / l", "O[i*BM : +BM, :] = p @ V[0 : +BN, :]"), "p @ V[0", "'p' is bound in the loop's steps"),
    # stores come before or after the loop
    (("        m = mn\n", "        m = mn\n        O[i*BM : +BM, :] = acc  # in the loop\n"), "# in the loop",
     "a tile stores before or after its loop, not in it"),
    # a product's operands have one dtype: p is float32, V bf16
    (("bf16(p) @ V", "p @ V"), "p @ V", "'@' multiplies float32 by bfloat16"),
    # where takes a comparison first
    (("where(c*BN + cols(BN) < N,", "where(c*BN + cols(BN),"), "where(c*BN + cols(BN),",
     "where(condition, a, b) takes a comparison first"),
    (("mn = max(m, rowmax(s))", "mn = max(m, rowmax(s[0]))"), "rowmax(s[0])", "unknown name 's'"),
    (("rowmax(s)", "rowmax(rowsum(s).T.T + 0 * cols(BN) < 1)"), "rowmax(rowsum", "a comparison gives booleans"),
    (("q = Q[i*BM : +BM, :]", "q = Q[i*BM : +BM, 0]"), "q @ K", "'@' multiplies two matrices"),
    (("K[c*BN : +BN, :].T", "K[c*BN : +BN, 0].T"), "K[c*BN : +BN, 0].T", "'.T' transposes a 2-D value"),
    (("cols(BN)", "cols(c)"), "cols(c)", "cols(n): n is a block's size"),
    (("q = Q[", "BM = Q["), "BM = Q[", "'BM' is a size; a tile's block binds names of its own"),
    (("for c in", "for i in"), "for i in", "loop variable 'i' shadows another name"),
])
def test_a_misused_block_is_refused_at_its_site(change, site, message):
    source = ONE_RANK.replace(*change)
    assert source != ONE_RANK
    error = the_error(source, message)
    assert error.span.line == where(source, site)[0]


def test_a_wait_goes_at_the_top_of_a_step_and_only_in_a_loop():
    source = GATHERED.replace("        wait gk[(c*BN)/Nl], gv[(c*BN)/Nl]\n        s = (q @",
                              "        s = (q @").replace("        m = mn\n", "        m = mn\n        wait gk[0]\n")
    error = the_error(source, "a step waits before it reads anything")
    assert at(error) == where(source, "wait gk[0]")
    outside = GATHERED.replace("    O[i*BM", "    wait gk[0]\n    O[i*BM")
    error = the_error(outside, "`wait` waits at a step of a loop")
    assert at(error) == where(outside, "wait gk[0]")
    assert error.hint == "attn[i] after producer[...]"


def test_one_loop_per_tile_one_inside_it_and_no_wait_inside_that():
    second = ONE_RANK.replace("    O[i*BM", "    for d in 2:\n        acc = acc + 1\n    O[i*BM")
    assert at(the_error(second, "a tile has one loop")) == where(second, "for d in 2")
    nested = ONE_RANK.replace("        m = mn\n", "        m = mn\n        for d in 2:\n            for e in 2:\n"
                                                  "                x = 1\n")
    assert at(the_error(nested, "a loop two deep inside a tile's loop")) == where(nested, "for e in 2")
    waiting = GATHERED.replace("        wait gk[(c*BN)/Nl], gv[(c*BN)/Nl]\n",
                               "        for d in 2:\n            wait gk[d]\n")
    error = the_error(waiting, "`wait` goes in a step of the tile's loop, not in a loop inside it")
    assert at(error) == where(waiting, "wait gk[d]")
    gone = ONE_RANK.replace("        m = mn\n", "        m = mn\n        for d in 2:\n            x = acc\n"
                                                "        acc = x\n")
    line, column = where(gone, "acc = x")
    assert at(the_error(gone, "'x' is bound in the inner loop")) == (line, column + len("acc = "))


# A loop over pieces that waits for each piece, and inside each step a loop over the piece's blocks
# that waits for nothing: the inner loop's reads happen at the step, over all its blocks.
PIECES = GATHERED.replace("""    for t in N / BN:
        c = (rank*(Nl/BN) + t) mod (N/BN)
        wait gk[(c*BN)/Nl], gv[(c*BN)/Nl]
        s = (q @ K_all[c*BN : +BN, :].T) * 0.25
        mn = max(m, rowmax(s)); p = exp2(s - mn); alpha = exp2(m - mn)
        l = l * alpha + rowsum(p)
        acc = acc * alpha + bf16(p) @ V_all[c*BN : +BN, :]
        m = mn
""", """    for t in world:
        piece = (rank + t) mod world
        wait gk[piece], gv[piece]
        for c in Nl / BN:
            s = (q @ K_all[piece*Nl + c*BN : +BN, :].T) * 0.25
            mn = max(m, rowmax(s)); p = exp2(s - mn); alpha = exp2(m - mn)
            l = l * alpha + rowsum(p)
            acc = acc * alpha + bf16(p) @ V_all[piece*Nl + c*BN : +BN, :]
            m = mn
""")


def test_a_step_that_waits_for_its_piece_covers_the_loop_inside_it():
    assert PIECES != GATHERED
    schedule = run(PIECES, until="check").schedule
    outer = schedule.families["attn"].loop
    (inner,) = [s for s in outer.body if s.__class__.__name__ == "Loop"]
    assert {c.name for c in outer.carried} == {c.name for c in inner.carried} == {"m", "l", "acc"}
    # the twin: the inner loop reads one block into the next piece, which its step did not wait for
    twin = PIECES.replace("for c in Nl / BN:", "for c in Nl / BN + 1:")
    assert the_error(twin, "race: tile 'attn' reads K_all while chunk 'gk' may still write it")


def test_a_size_name_is_bound_once():
    source = GATHERED.replace("        wait gk", "        c = t\n        wait gk")
    error = the_error(source, "'c' is already a size of this tile")
    assert at(error) == where(source, "c = t")


def test_a_value_bound_before_the_loop_and_read_in_it_is_not_carried():
    source = ONE_RANK.replace("acc = acc * alpha + bf16(p) @ V[c*BN : +BN, :]",
                              "acc = acc * alpha + bf16(p) @ V[c*BN : +BN, :] + q")
    loop = run(source, until="check").schedule.families["attn"].loop
    assert "q" not in {c.name for c in loop.carried}


# ---- blocks in the grammar -----------------------------------------------------------------------

@pytest.mark.parametrize("body, site, message", [
    ("    x = 1\n   y = 2\n", "   y = 2", "this line is indented by 3, which matches no block around it"),
    ("    wiat gk[0]\n", "wiat", "unknown statement 'wiat' in a tile's block"),
    ("    x = 1\n    order attn by i\n", "order attn", "'order' is a declaration, not a statement of a tile's block"),
    ("    for c in 2:\n    x = 1\n", "for c in 2:", "the line ends too early: a `for` loop's body goes"),
])
def test_a_malformed_block_is_refused_at_its_line(body, site, message):
    source = tds("""
        program blocks
        param M
        in  X : f32[M]
        out Y : f32[M]
        tile attn[i in M]:
    """) + body
    with pytest.raises(TdsError) as raised:
        run(source, until="parse")
    error = raised.value.diagnostics[0]
    assert error.message.startswith(message), error.message
    assert error.span.line == where(source, site)[0]


def test_a_top_level_line_may_still_be_indented_and_a_block_may_end_the_file_without_a_newline():
    source = tds("""
        program blocks
        param M
          in  X : f32[M]
        out Y : f32[M]
        tile copy[i in M]:
            x = X[i]
            Y[i] = x""")
    assert not source.endswith("\n")
    run(source, until="check")


# ---- the programs' own waits: each is needed ------------------------------------------------------

PROGRAM_WAITS = {  # program: (its `wait` line, the race without it, where it is reported)
    "sp_ag_attention": ("race: tile 'attn' reads K_all while chunk 'gk' may still write it", "K_all[b, pk, c*BN"),
    "sp_ulysses": ("race: tile 'attn' reads Kh while tile 'pk' may still write it", "Kh[ks, c*BM"),
}


@pytest.mark.parametrize("name", sorted(PROGRAM_WAITS))
def test_without_its_waits_each_attention_program_races_at_the_step_that_reads(name):
    path = ROOT / "programs" / f"{name}.tds"
    source = path.read_text()
    wait = next(line for line in source.splitlines() if line.strip().startswith("wait "))
    message, site = PROGRAM_WAITS[name]
    twin = source.replace(wait + "\n", "")
    race = the_error(twin, message)
    assert at(race) == where(twin, site)
    assert race.hint.startswith("wait for it in the loop")
    assert run(source, until="check").warnings == []
