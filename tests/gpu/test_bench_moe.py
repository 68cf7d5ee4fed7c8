"""bench/bench_moe.py's logic on CPU: its torch baselines (bench/moe_baselines.py) run on two gloo ranks
and must give what tests/programs/moe_expectations.py says the MoE programs compute (written
independently: loops over tokens, no collectives); the valid rows of an `upto count` tensor come out
in the baselines' order; the targets are judged as the issue states them."""
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-5


def _near(got, want) -> bool:
    got, want = got.double(), want.double()
    return got.shape == want.shape and bool(((got - want).abs().max() <= TOLERANCE * want.abs().max()).item())


def _rank(rank, world, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests" / "programs")]
    torch.set_num_threads(1)
    import moe_baselines as base
    import moe_expectations as expect
    dist.init_process_group("gloo")
    torch.manual_seed(7)  # the same on every rank: each rank takes its own share of one draw
    T, H, K, E, C = 9, 6, 2, 3, 9
    NE = E * world
    X = [torch.randn(T, H) for _ in range(world)]
    ids = [torch.rand(T, NE).topk(K, dim=1).indices.to(torch.int32) for _ in range(world)]
    w = [torch.rand(T, K) for _ in range(world)]
    checks = {}

    # dispatch + combine with the identity expert: sum over k of w * X
    out = base.dispatch_combine_a2a(X[rank], ids[rank], w[rank], NE, world)
    checks["a2a identity"] = _near(out, (w[rank][..., None] * X[rank][:, None, :]).sum(1))
    # with an expert that scales its rows by (its rank + 1): combine of dispatch's layout
    scaled = base.dispatch_combine_a2a(X[rank], ids[rank], w[rank], NE, world, lambda rows: rows * (rank + 1))
    recv = expect.moe_dispatch(X, ids, E, C)["recv"]
    Y = [recv[d] * (d + 1) for d in range(world)]
    checks["a2a as dispatch then combine"] = _near(scaled, expect.moe_combine(Y, ids, w, E)["out"][rank])

    # AllGather + grouped GEMM: the valid rows of ag_group_gemm's G, in order
    D, N, Et = 4, 5, 3
    A = [torch.randn(T, D) for _ in range(world)]
    ids_tp = [torch.rand(T, Et).topk(K, dim=1).indices.to(torch.int32) for _ in range(world)]
    B = [torch.randn(Et, D, N) for _ in range(world)]
    rows = base.ag_group_gemm_sequential(A[rank], ids_tp[rank], B[rank], world, False)
    G = expect.ag_group_gemm(A, ids_tp, B, C)
    checks["ag + grouped GEMM"] = _near(rows, _compact(G["G"][rank], G["count"][rank]))

    # grouped GEMM + weighted sum + reduce-scatter: moe_gemm_rs's Y
    Hx = [torch.randn(world, Et, C, D) for _ in range(world)]
    B2 = [torch.randn(Et, D, N) for _ in range(world)]
    groups = [base.grouped(i, Et) for i in ids_tp]
    counts = torch.stack([g[1] for g in groups])
    order = torch.stack([g[0] for g in groups])
    Y2 = base.moe_gemm_rs_sequential(_compact(Hx[rank], counts), counts, order, torch.stack(w), B2[rank], world, False)
    checks["grouped GEMM + reduce-scatter"] = _near(Y2, expect.moe_gemm_rs(Hx, ids_tp, w, B2)["Y"][rank])
    results.put((rank, checks))
    dist.destroy_process_group()


def _compact(padded, counts):
    C = padded.shape[-2]
    valid = torch.arange(C) < counts.reshape(-1, 1)
    return padded.reshape(-1, C, padded.shape[-1])[valid]


def test_the_baselines_compute_what_the_programs_compute():
    context = mp.get_context("spawn")
    results = context.Queue()
    port = 29500 + (os.getpid() + 313) % 1000
    procs = [context.Process(target=_rank, args=(r, 2, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = sorted(results.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    for rank, checks in got:
        assert all(checks.values()), (rank, checks)
        assert len(checks) == 4


def test_compact_and_the_targets():
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_moe
    padded = torch.arange(2 * 3 * 4 * 1, dtype=torch.float32).view(2, 3, 4, 1)
    counts = torch.tensor([[1, 0, 4], [2, 3, 0]])
    assert bench_moe.compact(padded, counts).flatten().tolist() == [0, 8, 9, 10, 11, 12, 13, 16, 17, 18]
    rows = [{"op": "dispatch+combine", "tokens": 4096, "tiledsl": 1.0, "all_to_all_single": 2.5,
             "all_to_all_vdev_2d": 0.9},
            {"op": "dispatch+combine", "tokens": 128, "tiledsl": 0.039, "all_to_all_single": 0.2,
             "all_to_all_vdev_2d": float("nan"), "tiledsl_fp8": 0.041},
            {"op": "group_gemm", "model": "m", "tiledsl": 1.0, "torch": 0.95},
            {"op": "ag_group_gemm", "model": "m", "tiledsl": 1.0, "sequential": 1.2},
            {"op": "moe_gemm_rs", "tokens": 8192, "tiledsl": 1.0, "sequential": 1.1}]
    lines = bench_moe.targets(rows)
    assert lines[0].startswith("dispatch+combine 4096 tokens: 2.50x over all_to_all_single (target 2x): met;")
    assert lines[0].endswith(": not met")  # slower than all_to_all_vdev_2d
    assert lines[1] == "dispatch+combine 128 tokens bf16: 39.0 us (target under 40 us): met; fp8: 41.0 us: not met"
    assert "0.95x of torch at worst" in lines[2] and lines[2].endswith(": met")
    assert lines[3].endswith("1.20x over sequential, geometric mean (target 1.15x): met")
    assert lines[4].endswith("1.10x over sequential, geometric mean (target 1.15x): not met")
