"""examples/tp_block.py at toy sizes on 2 emulated ranks: the LLaMA-style layer written once gives the
same prefill (sequence parallel) and decode outputs with torch's collectives and with tiledsl.ops, and
the tiledsl.ops run went through the library's programs, not the torch path."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.emulated

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tp_block.py"


def _example():
    if "tp_block" not in sys.modules:
        spec = importlib.util.spec_from_file_location("tp_block", EXAMPLE)
        sys.modules["tp_block"] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
        spec.loader.exec_module(sys.modules["tp_block"])
    return sys.modules["tp_block"]


def _rank(heap, rendezvous, options):
    return _example().emulated_rank(heap, rendezvous, options)  # loaded by path: examples/ is no package


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    from tiledsl.runtime.emulate import run_ranks
    folder = tmp_path_factory.mktemp("tp_block")
    options = {"size": "toy", "dtype": torch.bfloat16, "batch": 2, "seq": 16, "decode_batches": [3], "kv_len": 8,
               "iters": 0, "cache_dir": str(folder / "tuning")}
    return run_ranks(_rank, 2, str(folder / "rendezvous"), options, timeout_s=600)


def test_prefill_and_decode_agree_between_torch_collectives_and_tiledsl_ops(emulated):
    tolerance = _example().TOLERANCE[torch.bfloat16]
    for rows, _ in emulated:
        assert [(r["phase"], r["tokens"]) for r in rows] == [("prefill", 32), ("decode", 3)]
        for r in rows:
            assert r["max_rel_diff"] <= tolerance, r


def test_the_tiledsl_run_took_the_programs(emulated):
    _, explained = emulated[0]
    for op, program in [("all_gather_matmul", "ag_gemm"), ("matmul_reduce_scatter", "gemm_rs_pull"),
                        ("all_reduce_rmsnorm", "allreduce_rmsnorm"), ("matmul_all_reduce", "gemm_ar")]:
        assert any(line.startswith(op) and f": {program}" in line for line in explained.splitlines()), explained
