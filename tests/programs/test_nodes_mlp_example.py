"""examples/nodes_mlp.py on emulated ranks posing as 2 nodes x 2 and 2 x 1: the sequence-parallel MLP
through the two-level AG+GEMM and GEMM+RS gives, on every rank, what torch's all_gather + matmul +
reduce_scatter give on the same inputs (a gloo group beside the heap), with outputs poisoned first."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.emulated

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nodes_mlp.py"


def _example():
    if "nodes_mlp" not in sys.modules:
        spec = importlib.util.spec_from_file_location("nodes_mlp", EXAMPLE)
        sys.modules["nodes_mlp"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["nodes_mlp"])
    return sys.modules["nodes_mlp"]


def _rank(heap, rendezvous, options):
    return _example().emulated_rank(heap, rendezvous, options)  # loaded by path: examples/ is no package


@pytest.mark.parametrize("world, nodes", [(4, 2), (2, 2)], ids=["2x2", "2x1"])
def test_the_mlp_across_nodes_agrees_with_torch_collectives_on_every_rank(tmp_path, world, nodes):
    from tiledsl.runtime.emulate import run_ranks
    options = {"tokens": world * 32, "hidden": 64, "ffn": world * 24, "iters": 0}
    rows = run_ranks(_rank, world, str(tmp_path / "rendezvous"), options, timeout_s=600, nodes=nodes)
    assert [r["rank"] for r in rows] == list(range(world))
    assert {r["topology"] for r in rows} == {f"{nodes} nodes x {world // nodes}"}
    for r in rows:  # NaN (an element never written) fails the comparison too
        assert r["max_rel_diff"] <= 1e-5, r
    assert "largest difference" in _example().report(rows, _example().torch.float32)
