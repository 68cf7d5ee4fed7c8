"""The checker's warning on a row reduction that counts the 0s a clipped `+n` load reads past the end
of its dimension (schedule/padding.py): warned where a function on the way turns them into something
the reduction does not ignore, quiet where 0 changes nothing or the author masked them."""
from __future__ import annotations

import textwrap

import pytest

from tiledsl.pipeline import run

# X's columns come in blocks of BN: at ragged N the last block is clipped, and reads 0 past N
HEAD = """\
program rows
param M, N
const BM = 4, BN = 16
in  X : f32[M, N]
out S : f32[M, 1]
tile t[i in cdiv(M, BM), j in 1]:
    x = X[i*BM : +BM, j*BN : +BN]
"""


def warnings(body: str, head: str = HEAD) -> list:
    source = head + textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n"
    return [d for d in run(source, until="check").warnings if "padding" in d.message]


def test_a_sum_of_exp_over_a_clipped_block_is_warned_at_the_reduction_with_a_mask_hint():
    (found,) = warnings("""
        m = rowmax(where(j*BN + cols(BN) < N, x, -inf))
        S[i*BM : +BM, :] = rowsum(exp(x - m))
    """)
    assert (found.span.line, found.span.column) == (9, 24)  # rowsum(, not the load
    assert found.message == ("rowsum() counts the padding of a ragged last tile: its load of 'X' reads 0 past the "
                             "end of the dimension, where only 0 would change nothing, and rowsum() gets a value "
                             "other than that there")
    assert found.hint == "mask the padding before reducing: where(BN*j + cols(BN) < N, ..., 0.0)"


@pytest.mark.parametrize("reduced, gets", [("rowsum(x + 1.0)", "1"), ("rowsum(sigmoid(x))", "0.5"),
                                           ("rowsum(exp(x))", "1"), ("rowmax(x)", "0"), ("rowmax(x - 1.0)", "-1")])
def test_functions_that_do_not_map_0_to_what_the_reduction_ignores_are_warned(reduced, gets):
    (found,) = warnings(f"S[i*BM : +BM, :] = {reduced}")
    assert found.message.endswith(f"gets {gets} there")
    assert found.hint.endswith("..., -inf)" if reduced.startswith("rowmax") else "..., 0.0)")


@pytest.mark.parametrize("reduced", [
    "rowsum(x)",                                   # 0 adds nothing
    "rowsum(x * x)", "rowsum(relu(x) / 3.0)", "rowsum(f16(x) * 2.0)",  # 0 stays 0 on the way
    "rowmax(abs(x))",                              # never negative: a 0 is no row's new maximum
    "rowsum(where(j*BN + cols(BN) < N, exp(x), 0.0))",  # the author's mask
    "rowmax(where(j*BN + cols(BN) < N, x, -inf))",
])
def test_padding_that_changes_nothing_or_is_masked_is_not_warned(reduced):
    assert warnings(f"S[i*BM : +BM, :] = {reduced}") == []


def test_a_block_never_clipped_along_the_reduced_axis_is_not_warned():
    # whole rows (`:`) are never clipped; ragged M clips rows, which a row reduction does not mix
    head = HEAD.replace("j*BN : +BN]", ":]")
    assert warnings("S[i*BM : +BM, :] = rowsum(exp(x - rowmax(x)))", head) == []
    # a size the tiles always divide: the last block is whole
    divided = HEAD.replace("in  X", "require N % BN == 0\nin  X")
    assert warnings("S[i*BM : +BM, :] = rowsum(exp(x))", divided) == []


def test_a_transposed_product_carries_the_clipped_keys_into_the_reduced_axis():
    # scores q @ k.T: a clipped block of keys is the scores' columns, each q . 0 = 0, then exp(0 - m)
    head = HEAD.replace("in  X : f32[M, N]", "in  X : f32[M, N]\nin  K : f32[N, 16]").replace("X : f32[M, N]", "X : f32[M, 16]")
    found = warnings("""
        s = X[i*BM : +BM, 0 : +16] @ K[j*BN : +BN, :].T
        S[i*BM : +BM, :] = rowsum(exp(s - rowmax(s)))
    """, head.replace("    x = X[i*BM : +BM, j*BN : +BN]\n", ""))
    assert [(d.message.split("()")[0], d.span.column) for d in found] == [("rowsum", 24), ("rowmax", 39)]
    assert all("load of 'K'" in d.message and d.hint.startswith("mask the padding before reducing: where(BN*j + "
                                                                "cols(BN) < N") for d in found)
