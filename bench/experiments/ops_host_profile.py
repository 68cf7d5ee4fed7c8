"""Where a `tiledsl.ops.moe_dispatch` / `moe_combine` call's time goes beyond its program's own call
(issue 27: ~150-230 us more on 2026-12-03), at world 1 on one GPU, DeepSeek-V3 routing at 128 tokens
(hidden 7168, 256 experts, top 8):

  1. GPU time per call, back to back (CUDA events, median of windows), of: the op with its program path
     forced (eagerly: without torch's dispatcher since 2026-12-04; through torch.ops.tiledsl; recorded
     into the caller's CUDA graph); the program called directly with the same tensors (a CUDA-graph
     replay); the program with new output tensors every call (a prepared call rebound, no graph); that
     and `release()` after every call, as tiledsl.ops does;
  2. host time per call of each (no synchronisation between calls);
  3. cProfile of 200 op calls: the Python functions that take the host's time;
  4. torch.profiler of 20 op calls: CPU ops and the kernels on the GPU, by self time.

    torchrun --nproc-per-node=1 bench/experiments/ops_host_profile.py
"""
from __future__ import annotations

import cProfile
import io
import math
import os
import pstats
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
from common import host_us, time_interleaved_ms  # noqa: E402
from harness import mismatch, start  # noqa: E402

BF16 = torch.bfloat16
T, H, NE, TOPK = 128, 7168, 256, 8


def say(line: str) -> None:
    print(line, flush=True)


def profile_python(fn, calls: int = 200, rows: int = 30) -> str:
    fn()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(rows)
    return text.getvalue()


def profile_torch(fn, calls: int = 20, rows: int = 25) -> str:
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    return (averages.table(sort_by="self_cpu_time_total", row_limit=rows) + "\n"
            + averages.table(sort_by="self_cuda_time_total", row_limit=12))


def main() -> int:
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(6 << 30))
    _, world, heap = start(31)
    if world != 1:
        raise SystemExit("ops_host_profile.py is made for world 1: torchrun --nproc-per-node=1")
    import tiledsl.ops as ops
    from tiledsl.ops.context import STATE
    ops.use_heap(heap)
    X = torch.randn(T, H, device="cuda", dtype=BF16)
    ids = torch.rand(T, NE, device="cuda").topk(TOPK, dim=1).indices.to(torch.int32)
    w = torch.softmax(torch.randn(T, TOPK, device="cuda"), dim=1)
    C = max(64, math.ceil(int(torch.bincount(ids.flatten().long(), minlength=NE).max()) / 64) * 64)
    want_recv, want_count = ops.moe_dispatch(X, ids, NE, C, impl="torch")
    got_recv, got_count = ops.moe_dispatch(X, ids, NE, C, impl="moe_dispatch")
    rows = torch.arange(C, device="cuda")[None, None, :] < want_count[..., None]
    bad = mismatch(got_recv[rows], want_recv[rows], 1e-3) or (None if torch.equal(got_count, want_count) else "counts")
    say(f"{'FAIL' if bad else 'PASS'} ops dispatch against torch's path {bad or ''}")
    out_want = ops.moe_combine(want_recv, ids, w, impl="torch")
    out_got = ops.moe_combine(want_recv, ids, w, impl="moe_combine")
    bad = mismatch(out_got, out_want, 2e-2)
    say(f"{'FAIL' if bad else 'PASS'} ops combine against torch's path {bad or ''}")
    dispatch = next(p for key, p in STATE.programs.items() if "moe_dispatch" in str(key))
    combine = next(p for key, p in STATE.programs.items() if "moe_combine" in str(key))
    say(f"programs: {[str(k)[:120] for k in STATE.programs]}")

    recv = torch.full((NE, 1, C, H), float("nan"), device="cuda", dtype=BF16)
    count = torch.full((NE, 1), -1, device="cuda", dtype=torch.int32)
    slot = torch.full((T, TOPK), -1, device="cuda", dtype=torch.int32)
    out = torch.full((T, H), float("nan"), device="cuda", dtype=BF16)

    def fresh_dispatch(release=False):
        r = torch.empty((NE, 1, C, H), device="cuda", dtype=BF16)
        n = torch.empty((NE, 1), device="cuda", dtype=torch.int32)
        s = torch.empty((T, TOPK), device="cuda", dtype=torch.int32)
        dispatch(X, ids, r, n, s, check=False)
        if release:
            dispatch.release()

    group = ops.group_name(None)
    # the op recorded into the caller's CUDA graph (as a model's captured decode step would): its GPU time
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured):
        graph_recv, graph_count = ops.moe_dispatch(X, ids, NE, C, impl="moe_dispatch")
    graph_recv.fill_(float("nan"))
    captured.replay()
    torch.cuda.synchronize()
    bad = mismatch(graph_recv[rows], want_recv[rows], 1e-3) or (
        None if torch.equal(graph_count, want_count) else "counts")
    say(f"{'FAIL' if bad else 'PASS'} ops dispatch in the caller's CUDA graph against torch's path {bad or ''}")
    fns = {
        "ops dispatch (program path)": lambda: ops.moe_dispatch(X, ids, NE, C, impl="moe_dispatch"),
        "ops dispatch in the caller's CUDA graph": captured.replay,
        "ops dispatch through torch.ops.tiledsl (the dispatcher)":
            lambda: torch.ops.tiledsl.moe_dispatch(X, ids, NE, C, group, "moe_dispatch", None, 1),
        "dispatch program, same tensors": lambda: dispatch(X, ids, recv, count, slot, check=False),
        "dispatch program, new outputs": lambda: fresh_dispatch(),
        "dispatch program, new outputs + release": lambda: fresh_dispatch(release=True),
        "ops combine (program path)": lambda: ops.moe_combine(want_recv, ids, w, impl="moe_combine"),
        "combine program, same tensors": lambda: combine(want_recv, ids, w, out, check=False),
        "torch.empty x3 (the outputs alone)": lambda: (torch.empty((NE, 1, C, H), device="cuda", dtype=BF16),
                                                       torch.empty((NE, 1), device="cuda", dtype=torch.int32),
                                                       torch.empty((T, TOPK), device="cuda", dtype=torch.int32)),
    }
    for fn in fns.values():
        fn()
        fn()
    torch.cuda.synchronize()
    gpu = time_interleaved_ms(fns, windows=7, calls=20, warmup=3)
    say("| call | GPU us a call (back to back) | host us a call |")
    say("|---|---|---|")
    for key, fn in fns.items():
        say(f"| {key} | {gpu[key] * 1000:.1f} | {host_us(fn):.1f} |")
    say("== cProfile, 200 ops dispatch calls (program path), by own time")
    say(profile_python(fns["ops dispatch (program path)"]))
    say("== cProfile, 200 dispatch program calls with new outputs + release")
    say(profile_python(fns["dispatch program, new outputs + release"], rows=20))
    say("== torch.profiler, 20 ops dispatch calls")
    say(profile_torch(fns["ops dispatch (program path)"]))
    heap.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
