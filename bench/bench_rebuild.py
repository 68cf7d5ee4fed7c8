"""Same-run A/B of two builds of tiledsl: the library's AG+GEMM, GEMM+RS, AllReduce, GEMM+AR and GEMM
programs, and at world 1 the attention tile (bench/experiments/attention_local.tds), timed with
whatever `tiledsl` is first on PYTHONPATH, each output checked against torch first. Run it under torchrun once per
build, then compare:

    PYTHONPATH=.baseline torchrun --nproc-per-node=2 bench/bench_rebuild.py --label before
    PYTHONPATH=$PWD torchrun --nproc-per-node=2 bench/bench_rebuild.py --label after
    python3 bench/bench_rebuild.py --compare before after

Both runs use this file, the same shapes, seeds and timing: the builds differ, nothing else. Times are
medians of CUDA-event timings on random data (one call at a time for the GEMM programs, 20 calls back
to back for the collectives), the slowest rank's."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

OUT = Path(os.environ.get("OUT", Path(__file__).resolve().parent / "results"))
M = 8192
SHAPES = {"LLaMA-7B": (11008, 4096), "LLaMA-3-70B": (28672, 8192)}
ALLREDUCE_BYTES = [8 << 10, 1 << 20, 64 << 20, 256 << 20]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--label")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    return measure(args.label)


def measure(label: str) -> int:
    import torch
    import torch.distributed as dist

    import tiledsl
    from tiledsl.runtime.heap import disable_multicast, open_heap

    # never a time from ranks sharing a GPU (their kernels take turns on it); asked here, not of
    # tiledsl.runtime.placement, since the build timed may be one from before it
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 1)
    if torch.cuda.device_count() < ranks_here:
        raise SystemExit(f"bench_rebuild: refused: {ranks_here} ranks share {torch.cuda.device_count()} GPU(s); "
                         "a time measured there means nothing")
    disable_multicast()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(1234 + rank)
    programs = Path(tiledsl.__file__).resolve().parents[1] / "programs"
    if rank == 0:
        print(f"{label}: tiledsl from {Path(tiledsl.__file__).resolve().parent}", flush=True)
    results, failures = {}, 0

    def slowest(ms: float) -> float:
        value = torch.tensor([ms], device="cuda")
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return value.item()

    def time_one(fn, reps=30):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    def time_loop(fn, calls=20, windows=10):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(windows):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / calls)
        return statistics.median(times)

    def checked(name, got, want, rtol=3e-2):
        nonlocal failures
        got, want = got.float(), want.float()
        ok = bool(torch.isfinite(got).all()) and bool(torch.isfinite(want).all()) and \
            (got - want).abs().max().item() <= rtol * want.abs().max().item()
        ok = slowest(0.0 if ok else 1.0) == 0.0
        if rank == 0:
            print(f"{'PASS' if ok else 'FAIL'} {label} {name}", flush=True)
        failures += not ok
        return ok

    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    with open_heap() as heap:
        for model, (N, K) in SHAPES.items():
            # AG+GEMM: A [M/W, K] gathered, B [K, N/W] (column-sharded)
            program = tiledsl.compile(os.fspath(programs / "ag_gemm.tds"), heap)
            A, B = torch.randn(M // world, K, **bf16), torch.randn(K, N // world, **bf16)
            C = torch.full((M, N // world), float("nan"), **bf16)
            program(A, B, C)
            full = torch.empty(M, K, **bf16)
            dist.all_gather_into_tensor(full, A)
            if checked(f"ag_gemm {model}", C, full.float() @ B.float()):
                results[f"ag_gemm {model}"] = slowest(time_one(lambda: program(A, B, C, check=False)))
                program.check()
            # GEMM+RS: A [M, K/W], B [K/W, N], rows reduce-scattered
            A, B = torch.randn(M, K // world, **bf16), torch.randn(K // world, N, **bf16)
            want = torch.empty(M // world, N, device="cuda", dtype=torch.float32)
            dist.reduce_scatter_tensor(want, (A.float() @ B.float()).contiguous())
            for name in ("gemm_rs_pull", "gemm_rs_ce"):
                program = tiledsl.compile(os.fspath(programs / f"{name}.tds"), heap)
                C = torch.full((M // world, N), float("nan"), **bf16)
                program(A, B, C)
                if checked(f"{name} {model}", C, want):
                    results[f"{name} {model}"] = slowest(time_one(lambda: program(A, B, C, check=False)))
                    program.check()
                program.release()
            torch.cuda.empty_cache()
        one_shot = tiledsl.compile(os.fspath(programs / "allreduce.tds"), heap)
        for size in ALLREDUCE_BYTES:
            X = torch.randn(size // 2, **bf16)
            want = X.float().clone()
            dist.all_reduce(want)
            Y = X.clone()
            one_shot(Y)
            if checked(f"allreduce {size} B", Y, want):
                results[f"allreduce {size} B"] = slowest(time_loop(lambda: one_shot(Y, check=False)))
                one_shot.check()
        one_shot.release()
        gemm_ar = tiledsl.compile(os.fspath(programs / "gemm_ar.tds"), heap)
        for m in (1, 16, 128):
            A, B = torch.randn(m, 8192 // world, **bf16), torch.randn(8192 // world, 8192, **bf16)
            want = A.float() @ B.float()
            dist.all_reduce(want)
            C = torch.full((m, 8192), float("nan"), **bf16)
            gemm_ar(A, B, C)
            if checked(f"gemm_ar M={m}", C, want):
                results[f"gemm_ar M={m}"] = slowest(time_loop(lambda: gemm_ar(A, B, C, check=False)))
                gemm_ar.check()
        gemm_ar.release()
        # the GEMM tile alone (gemm.tds), and at world 1 the attention tile alone (sp_ag_attention's,
        # bench/experiments/attention_local.tds: B 2, 4096 tokens, 32 / 8 heads of 128, causal)
        gemm = tiledsl.compile(os.fspath(programs / "gemm.tds"), heap)
        A, B = torch.randn(8192, 8192, **bf16), torch.randn(8192, 8192, **bf16)
        C = torch.full((8192, 8192), float("nan"), **bf16)
        gemm(A, B, C)
        if checked("gemm 8192^3", C, A.float() @ B.float()):
            results["gemm 8192^3"] = slowest(time_one(lambda: gemm(A, B, C, check=False)))
            gemm.check()
        gemm.release()
        del A, B, C
        if world == 1:
            attention = tiledsl.compile(os.fspath(Path(__file__).resolve().parent / "experiments" /
                                                  "attention_local.tds"), heap)
            q = torch.randn(2, 2, 2048, 32, 128, **bf16)
            k, v = (torch.randn(2, 2, 2048, 8, 128, **bf16) for _ in range(2))
            o = torch.full_like(q, float("nan"))
            attention(q, k, v, o)
            sdpa = torch.nn.functional.scaled_dot_product_attention
            want = sdpa(*(t.reshape(2, 4096, -1, 128).transpose(1, 2) for t in (q, k, v)), is_causal=True,
                        enable_gqa=True).transpose(1, 2).reshape(q.shape)
            if checked("attention tile 4K causal", o, want):
                results["attention tile 4K causal"] = slowest(time_one(lambda: attention(q, k, v, o, check=False)))
                attention.check()
            attention.release()
    if rank == 0:
        OUT.mkdir(parents=True, exist_ok=True)
        path = OUT / f"rebuild_{label}.json"
        runs = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps(runs + [results], indent=1))
        for name, ms in results.items():
            print(f"{label:8} {name:28} {ms:9.4f} ms", flush=True)
    dist.destroy_process_group()
    return 1 if failures else 0


def compare(before: str, after: str) -> int:
    """Each case's best-of-runs median, before and after, and the ratio (after / before)."""
    runs = {label: json.loads((OUT / f"rebuild_{label}.json").read_text()) for label in (before, after)}
    names = list(runs[before][0])
    print(f"{'case':28} {before:>10} {after:>10} {'after/before':>13}")
    ratios = []
    for name in names:
        b = min(r[name] for r in runs[before] if name in r)
        a = min((r[name] for r in runs[after] if name in r), default=float("nan"))
        ratios.append(a / b)
        print(f"{name:28} {b:10.4f} {a:10.4f} {a / b:13.3f}")
    print(f"geometric mean after/before: {statistics.geometric_mean(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
