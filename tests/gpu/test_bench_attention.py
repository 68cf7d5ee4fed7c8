"""bench/bench_attention.py's own torch on CPU, where it can run: the zig-zag reference and the
baselines' attention (torch's math backend standing in for the GPU ones) against the programs' torch
expectations, and the decode baseline's combine of (output, log-sum-exp) pairs against attention over
every rank's keys at once. The benchmark checks tiledsl against these before timing anything."""
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "programs"))
import bench_attention as bench  # noqa: E402
from expectations import EXPECTATIONS  # noqa: E402

D = bench.D


def test_zigzag_reference_and_the_torch_baseline_agree_with_the_expectation(monkeypatch):
    world, B, P, H, HKV = 2, 1, 24, 4, 2
    generator = torch.Generator().manual_seed(3)
    parts = {n: [torch.randn(B, 2, P, h, D, generator=generator) for _ in range(world)]
             for n, h in (("Q", H), ("K", HKV), ("V", HKV))}
    want = EXPECTATIONS["sp_ag_attention"](**parts)["O"]
    K_all, V_all = bench.sequence(parts["K"], world), bench.sequence(parts["V"], world)
    for rank in range(world):
        got = bench.zigzag_reference(parts["Q"][rank], K_all, V_all, rank, world)
        assert torch.allclose(got.double(), want[rank], atol=1e-5)
        for gqa in ("native", "repeat"):
            O = torch.empty(B, 2, P, H, D)
            bench.torch_pieces(parts["Q"][rank], K_all, V_all, O, rank, world, SDPBackend.MATH, gqa)
            assert torch.allclose(O.double(), want[rank], atol=1e-5)


def test_the_decode_baseline_combines_every_ranks_partial_into_attention_over_all_keys(monkeypatch):
    world, B, H, HKV, C = 3, 2, 8, 2, 10
    generator = torch.Generator().manual_seed(4)
    Q = torch.randn(B, H, D, generator=generator)
    K = [torch.randn(B, C, HKV, D, generator=generator) for _ in range(world)]
    V = [torch.randn(B, C, HKV, D, generator=generator) for _ in range(world)]
    lens = torch.full((B,), world * C, dtype=torch.int32)
    want = EXPECTATIONS["flash_decode"]([Q] * world, K, V, [lens] * world)["O"][0]
    monkeypatch.setattr(bench, "gathered", lambda x: K if x is K[0] else V)
    assert torch.allclose(bench.decode_reference(Q, K[0], V[0], world).double(), want, atol=1e-5)
    # each rank's (output, lse), as the all-gather would lay them out; the combine is the baseline's own
    partials = [torch.cat([o, lse[..., None]], dim=-1) for o, lse in
                (bench.local_attention_lse(Q, k.transpose(1, 2), v.transpose(1, 2), "matmul") for k, v in zip(K, V))]
    monkeypatch.setattr(bench.dist, "all_gather_into_tensor", lambda out, mine: out.copy_(torch.stack(partials)))
    O = torch.empty(B, H, D)
    bench.torch_decode(Q, K[0].transpose(1, 2), V[0].transpose(1, 2), O, torch.empty(world, B, H, D + 1), "matmul")
    assert torch.allclose(O.double(), want, atol=1e-4)
