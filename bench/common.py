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


def time_ms(fn, warmup: int = 5, reps: int = 30) -> float:
    """Median of `reps` CUDA-event timings of fn(), run back to back as a training step would run
    them (no synchronisation between runs, so host work overlaps the previous run's GPU work)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def out_dir() -> Path:
    path = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    path.mkdir(parents=True, exist_ok=True)
    return path


def save(name: str, payload) -> Path:
    path = out_dir() / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1))
    return path
