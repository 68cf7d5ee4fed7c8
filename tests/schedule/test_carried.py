"""Values carried from one call to the next (issue 24, bug 7): a `reduce add` into a `symm` or `local`
tensor that nothing in the call clears sums over calls. A positioned warning; a target cleared
before the sum (or reset after it), or an `inout` one, is not warned."""
from __future__ import annotations

import textwrap

import pytest

from tiledsl.pipeline import run

def tds(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def carried(source: str) -> list:
    return [w for w in run(source, until="check").warnings if "which nothing in the call clears" in w.message]


# every rank pushes its X into every rank's S: the author means S = sum of X, fresh each call
PUSHED = tds("""
    program pushed
    param N
    in    X : f32[N]
    symm  S : f32[N]
    out   Y : f32[N]
    chunk push[s in world] on sms(2): X -> S@s[:] reduce add
    tile  take[i in 1]: Y = S
    take[i] after push[rank] @ every rank
    """)

CLEARED_FIRST = PUSHED.replace("chunk push", "tile  clear[i in 1]: S = 0\nchunk push") + "push[s] after clear[0] @ s\n"
# reset after the use, for the next call (the heap starts zeroed): no call sees another's sum
RESET_AFTER = PUSHED + "tile  reset[i in 1]: S = 0\nreset[i] after take[0]\n"
# only the first half cleared: the second half still sums over calls
HALF_CLEARED = CLEARED_FIRST.replace("S = 0", "S[0 : N / 2] = 0")


def test_a_reduce_add_into_a_symm_tensor_never_cleared_is_warned_at_the_target():
    (found,) = carried(PUSHED)
    assert found.severity == "warning"
    assert found.message.startswith("chunk 'push' adds into 'S', which nothing in the call clears: each call's "
                                    "sum starts from what the last call left")
    line = PUSHED.splitlines().index("chunk push[s in world] on sms(2): X -> S@s[:] reduce add") + 1
    assert (found.span.line, found.span.column) == (line, PUSHED.splitlines()[line - 1].index("S@s") + 1)
    assert found.hint.startswith("clear it first: a tile `S[...] = 0` that 'push' waits on")
    assert found.notes[0].span.line == 4  # the `symm S` declaration


PULLED = tds("""
    program pulled
    param N
    in    X : f32[N]
    local T : f32[N]
    out   Y : f32[N]
    chunk pull[s in world] on sms(1): X@s -> T reduce add
    tile  take[i in 1]: Y = T
    take[i] after pull[*]
    """)


def test_a_local_target_pulled_into_is_warned_too():
    (found,) = carried(PULLED)
    assert found.message.startswith("chunk 'pull' adds into 'T'")
    # a target on this rank may be the caller's instead (a pushed one may not: only symm is written remotely)
    assert found.hint.endswith("for a total kept over calls, make 'T' `inout`")
    assert "inout" not in carried(PUSHED)[0].hint


@pytest.mark.parametrize("source", [CLEARED_FIRST, RESET_AFTER], ids=["cleared first", "reset after"])
def test_a_target_the_call_clears_is_not_warned(source):
    assert run(source, until="check").warnings == []


def test_a_target_cleared_in_part_is_warned_for_the_rest():
    assert len(carried(HALF_CLEARED)) == 1


def test_an_inout_target_is_the_callers_value_and_is_not_warned():
    source = PULLED.replace("local T", "inout T")
    assert run(source, until="check").warnings == []


# a tile that accumulates by reading what it overwrites: the same meaning as `reduce add`
ACCUMULATED = tds("""
    program accumulated
    param N
    in    X : f32[N]
    symm  S : f32[N]
    out   Y : f32[N]
    tile  acc[i in N / 2]: S[i*2 : +2] = S[i*2 : +2] + X[i*2 : +2]
    tile  take[i in N / 2]: Y[i*2 : +2] = S[i*2 : +2]
    take[i] after acc[i]
    """)


def test_a_tile_adding_into_a_symm_tensor_it_reads_is_warned_like_a_reduce_add():
    (found,) = carried(ACCUMULATED)
    assert found.message.startswith("tile 'acc' reads what it overwrites of 'S', which nothing in the call "
                                    "clears: each call's result starts from what the last call left")
    line = ACCUMULATED.splitlines().index("tile  acc[i in N / 2]: S[i*2 : +2] = S[i*2 : +2] + X[i*2 : +2]") + 1
    assert found.span.line == line


def test_a_tile_adding_into_a_cleared_or_inout_target_is_not_warned():
    cleared = ACCUMULATED.replace("tile  acc", "tile  clear[i in N / 2]: S[i*2 : +2] = 0\ntile  acc") \
        + "acc[i] after clear[i]\n"
    assert carried(cleared) == []
    kept_by_caller = ACCUMULATED.replace("symm  S", "inout S")
    assert carried(kept_by_caller) == []


# the edge is the wrong way round: rd reads S before this call's wr writes it, so Y is the last call's X
READ_FIRST = tds("""
    program read_first
    param N
    in    X : f32[N]
    out   Y : f32[N]
    local S : f32[N]
    tile  rd[i in N/4]: Y[i*4 : +4] = S[i*4 : +4]
    tile  wr[i in N/4]: S[i*4 : +4] = X[i*4 : +4]
    wr[i] after rd[i]
    """)


def test_a_read_of_a_local_tensor_ordered_before_its_only_write_is_warned_with_both_lines():
    (found,) = [w for w in run(READ_FIRST, until="check").warnings if "before the call writes it" in w.message]
    assert found.message.startswith("tile 'rd' reads 'S' before the call writes it: rd[0] on rank 0 comes before "
                                    "wr[0] on rank 0, so it reads what the last call left")
    assert (found.span.line, found.span.column) == (6, 35)
    assert [(n.span.line, n.span.column) for n in found.notes] == [(7, 21), (5, 1)]  # the write, the tensor
    assert "`local`: its values outlive a call" in found.notes[1].message
    # the hint, followed, gives a program with no warning at all
    assert "`rd[...] after wr[...]`" in found.hint
    assert run(READ_FIRST.replace("wr[i] after rd[i]", "rd[i] after wr[i]"), until="check").warnings == []


def test_a_read_of_what_the_call_wrote_before_a_reset_for_the_next_call_is_not_warned():
    assert not [w for w in run(RESET_AFTER, until="check").warnings if "before the call writes it" in w.message]
