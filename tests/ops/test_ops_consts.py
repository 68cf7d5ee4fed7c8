"""The consts tiledsl.ops builds a library program with: the heap's overrides, kept within the program's
requires (a build at consts that break a `require` is refused at that line)."""
from __future__ import annotations

import pytest

from tiledsl import pipeline
from tiledsl.library import program as library_program
from tiledsl.ops.context import HeapEntry, consts_for
from ops_ranks import SMALL_TILES


@pytest.mark.parametrize("program, br", [("ag_group_gemm", 16), ("moe_gemm_rs", 16), ("moe_dispatch_fp8", 32),
                                         ("gemm_rs", 8), ("moe_dispatch", 8)])
def test_small_tiles_are_raised_where_a_require_ties_them_to_other_consts(program, br):
    entry = HeapEntry(heap=None, group_name="default", emulated=True, consts=dict(SMALL_TILES))
    consts = consts_for(entry, program)
    assert consts["BR"] == br  # BR = 8 where `require BR % BT == 0` allows it, else the next power of two up
    pipeline.run(library_program(program), until="check", consts=consts)  # accepted at what it builds with


def test_an_override_the_requires_allow_is_kept_and_the_path_tunables_win():
    entry = HeapEntry(heap=None, group_name="default", emulated=True, consts={"BR": 32, "BK": 64})
    assert consts_for(entry, "ag_group_gemm", (("BK", 128),)) == {**consts_for(None, "ag_group_gemm"),
                                                                  "BR": 32, "BK": 128}
