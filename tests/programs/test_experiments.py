"""The experiment programs that the benchmarks time beside the library (bench/experiments/) stay
correct: each checks clean and matches the reference on two emulated ranks."""
import os
from pathlib import Path

import pytest

from tiledsl.pipeline import run
from tiledsl.tools.run_program import run_emulated

EXPERIMENTS = sorted((Path(__file__).resolve().parents[2] / "bench" / "experiments").glob("*.tds"))
# (sizes, consts) where the defaults would keep the interpreter busy for minutes (blocks of 64 by 128)
SMALL = {"attention_local": ({"B": 1, "P": 21, "H": 2, "HKV": 1}, {"D": 16, "BM": 16, "BN": 16}),
         # 32 query rows a tile over 16 keys a block: whole blocks, diagonal ones and a ragged last one
         "attention_local_split": ({"B": 1, "P": 37, "H": 2, "HKV": 1}, {"D": 16, "BM": 32, "BN": 16}),
         # K split in two ranges of 100, in blocks of 64: each range's last block reaches into the next,
         # whose columns the tile must zero (fails without: the product counts them twice)
         "gemm_ar_split": ({"M": 70, "K": 200, "N": 136}, {"BK": 64}),
         # ragged row and column blocks, two splits of two steps each (the defaults make K 16896)
         "gemm_ar_skinny": ({"M": 20, "K": 512, "N": 72}, None)}


def test_there_are_experiments():
    assert {p.stem for p in EXPERIMENTS} >= {"allreduce_push", "allreduce_two_shot_push", "gemm_ar_push",
                                             "gemm_rs_pull_own"}


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_experiment_checks_clean_and_matches_the_reference(path):
    assert run(path, until="check").warnings == []
    sizes, consts = SMALL.get(path.stem, (None, None))
    verdicts = run_emulated(os.fspath(path), 2, sizes, consts=consts)
    assert verdicts and all(v.ok for v in verdicts), "\n".join(v.line() for v in verdicts)
