"""Timing helpers shared by the benchmarks: CUDA events, medians, results written as JSON."""
import json
import os
import statistics
from pathlib import Path

import torch

SHAPES = {  # model: (N, K) of its MLP projection, as in Triton-distributed's and torch's async-TP benchmarks
    "LLaMA-7B": (11008, 4096),
    "LLaMA-3-8B": (14336, 4096),
    "LLaMA-3-70B": (28672, 8192),
    "Qwen2-72B": (29568, 8192),
    "LLaMA-3-405B": (53248, 16384),
}
M = 8192


def time_ms(fn, warmup: int = 5, reps: int = 30, before=None) -> float:
    """Median of `reps` CUDA-event timings of fn(); `before` (untimed) runs ahead of each one."""
    for _ in range(warmup):
        if before:
            before()
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if before:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_loop_ms(fn, calls: int = 20, windows: int = 10, warmup: int = 5, before=None) -> float:
    """Steady-state time per call, as a training or decode loop sees it: `calls` calls back to back
    between two CUDA events, the median over `windows` such windows; `before` (untimed) runs ahead of
    each window. The host enqueues ahead of the GPU, so launch cost is hidden where the GPU is busier."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(windows):
        if before:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def slowest(value: float) -> float:
    """The largest of every rank's `value` (under torchrun): a collective is as slow as its slowest rank."""
    import torch.distributed as dist
    t = torch.tensor([value], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def time_program(program, *args, timer=time_ms, **timing) -> float:
    """A compiled tiledsl program: one checked call (it compiles, and proves the schedule, before any
    timing), `timer` over calls that skip the check, then the check; the slowest rank's figure."""
    program(*args)
    ms = slowest(timer(lambda: program(*args, check=False), **timing))
    program.check()
    return ms


def out_dir() -> Path:
    path = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    path.mkdir(parents=True, exist_ok=True)
    return path


def save(name: str, payload) -> Path:
    path = out_dir() / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1))
    return path
