"""The GPU time of a call, as a loop that issues it back to back sees it: CUDA events around `calls`
calls in a row, per call, over several such windows. One timer for calibrate (`predict/measure.py`),
the ops' tuner (`ops/timers.py`) and the benchmarks (`bench/common.py`), so that what the predictor is
calibrated with and what it is checked against are timed the same way. `cuda` is torch.cuda unless a
caller (a CPU test) hands something with its `synchronize()` and `Event(enable_timing=True)`."""
from __future__ import annotations

import statistics
from typing import Callable


def windows_us(fn: Callable[[], object], calls: int = 20, windows: int = 10, warmup: int = 5,
               before: Callable[[], object] | None = None, cuda=None) -> list[float]:
    """Microseconds per call of each of `windows` windows of `calls` back-to-back calls of fn(), after
    `warmup` untimed calls and a synchronisation (nothing of the warmup is left in the first window);
    `before` (untimed) runs ahead of each window, before its first event is recorded."""
    if cuda is None:
        import torch
        cuda = torch.cuda
    for _ in range(warmup):
        fn()
    cuda.synchronize()
    times = []
    for _ in range(windows):
        if before is not None:
            before()
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)  # elapsed_time is in milliseconds
    return times


def median_us(fn: Callable[[], object], calls: int = 20, windows: int = 10, warmup: int = 5,
              before: Callable[[], object] | None = None, cuda=None) -> float:
    """The median over windows of `windows_us`: one window slowed by a neighbour or a clock change
    does not move it."""
    return statistics.median(windows_us(fn, calls, windows, warmup, before, cuda))
