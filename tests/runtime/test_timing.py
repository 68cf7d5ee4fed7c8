"""tiledsl.runtime.timing's logic on the CPU: a stub stands in for torch.cuda, its events reading a
clock that each call of the timed function moves on, so what the timer computes from them (per call,
per window, the median) and what it calls when (warmup, `before`, the events around the calls) are
checked without a GPU. Nothing here times anything."""
from __future__ import annotations

import pytest

from tiledsl.runtime import timing


class StubCuda:
    """torch.cuda's synchronize and Event, on a clock in milliseconds that `tick` moves on."""

    def __init__(self):
        self.now_ms = 0.0
        self.log: list[str] = []

    def synchronize(self):
        self.log.append("sync")

    def Event(self, enable_timing=False):  # noqa: N802 - torch.cuda's name
        assert enable_timing, "an event the timer reads must be made with enable_timing=True"
        return StubEvent(self)


class StubEvent:
    def __init__(self, cuda: StubCuda):
        self.cuda, self.at = cuda, None

    def record(self):
        self.at = self.cuda.now_ms
        self.cuda.log.append("record")

    def synchronize(self):
        self.cuda.log.append("wait end")

    def elapsed_time(self, end: StubEvent) -> float:
        assert self.at is not None and end.at is not None, "elapsed_time of an event never recorded"
        return end.at - self.at


def calls_taking(cuda: StubCuda, durations_ms):
    """fn() whose n-th call moves the clock by durations_ms[n] (the warmup's calls included)."""
    durations = iter(durations_ms)

    def fn():
        cuda.now_ms += next(durations)
        cuda.log.append("call")
    return fn


def test_each_window_is_its_calls_time_divided_by_their_count_in_microseconds():
    cuda = StubCuda()
    # warmup 2 calls (not timed), then 3 windows of 4 calls: 1 ms, 2 ms and 3 ms a call
    fn = calls_taking(cuda, [100, 100] + [1] * 4 + [2] * 4 + [3] * 4)
    assert timing.windows_us(fn, calls=4, windows=3, warmup=2, cuda=cuda) == [1000.0, 2000.0, 3000.0]


def test_median_is_not_moved_by_one_slow_window():
    cuda = StubCuda()
    fn = calls_taking(cuda, [0.01] * 2 + [0.05] * 2 + [9.0] * 2)
    assert timing.median_us(fn, calls=2, windows=3, warmup=0, cuda=cuda) == pytest.approx(50.0)


def test_warmup_is_drained_before_the_first_event_and_before_runs_untimed_ahead_of_each_window():
    cuda = StubCuda()
    fn = calls_taking(cuda, [1.0] * 5)
    ahead = []

    def before():
        cuda.now_ms += 1000.0  # untimed: outside the window's events
        ahead.append(cuda.log.count("record"))
        cuda.log.append("before")

    times = timing.windows_us(fn, calls=2, windows=2, warmup=1, before=before, cuda=cuda)
    assert times == [1000.0, 1000.0]
    assert cuda.log == ["call", "sync",
                        "before", "record", "call", "call", "record", "wait end",
                        "before", "record", "call", "call", "record", "wait end"]
    assert ahead == [0, 2]  # each `before` ran before its window's first event


def test_calibrate_the_ops_tuner_and_the_benchmarks_read_the_one_timer(monkeypatch):
    """predict/measure.gpu_us, ops' event_timer and bench/common's time_loop_ms, with torch.cuda's
    synchronize and Event stubbed: each is the same windows of the same calls, in its own unit."""
    from pathlib import Path

    import torch

    from tiledsl.ops import timers
    from tiledsl.predict import measure
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    import common

    cuda = StubCuda()
    monkeypatch.setattr(torch.cuda, "synchronize", cuda.synchronize)
    monkeypatch.setattr(torch.cuda, "Event", cuda.Event)

    def fn():
        cuda.now_ms += 0.25  # every call 250 us
    assert measure.gpu_us(fn, calls=4, windows=3, warmup=1) == pytest.approx(250.0)
    assert timers.event_timer("path", fn) == pytest.approx(250e-6)
    assert common.time_loop_ms(fn, calls=4, windows=3, warmup=1) == pytest.approx(0.25)
    assert common.time_ms(fn, warmup=1, reps=3) == pytest.approx(0.25)
    assert common.time_interleaved_ms({"a": fn}, calls=2, windows=2, warmup=1) == {"a": pytest.approx(0.25)}
