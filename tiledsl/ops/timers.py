"""How a path is timed while tuning: timer(name, fn) -> seconds per call, where fn makes one call of the
op. Every rank must call fn the same number of times (each call is collective). `configure(timer=...)`
replaces the default, as the tests do: on a CPU the times mean nothing."""
from __future__ import annotations

import os
import time
from typing import Callable

import torch

from tiledsl.ops.context import ENV_TIMER, STATE
from tiledsl.runtime import timing

WARMUP, REPEATS = 3, 10  # calls before timing, calls timed back to back (as a model issues them)


def event_timer(name: str, fn: Callable[[], object]) -> float:
    """CUDA events around REPEATS calls back to back, after WARMUP calls (one window of
    tiledsl.runtime.timing's timer, which calibrate and the benchmarks use too)."""
    return timing.median_us(fn, calls=REPEATS, windows=1, warmup=WARMUP) / 1e6


def graph_timer(name: str, fn: Callable[[], object]) -> float:
    """REPEATS calls captured in one CUDA graph and replayed: the time a caller's graph would see,
    without the host's launch cost. A path that cannot be captured counts as failed."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPEATS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / REPEATS


def wall_timer(name: str, fn: Callable[[], object]) -> float:
    """Host wall clock (CPU, emulated: meaningless for speed, kept so the logic runs end to end)."""
    fn()
    begin = time.perf_counter()
    for _ in range(2):
        fn()
    return (time.perf_counter() - begin) / 2


def default_timer(device: torch.device) -> Callable:
    if STATE.settings.timer is not None:
        return STATE.settings.timer
    if device.type != "cuda":
        return wall_timer
    return graph_timer if os.environ.get(ENV_TIMER, "events") == "graph" else event_timer
