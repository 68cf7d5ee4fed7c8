"""Timing helpers shared by the benchmarks: CUDA events, medians, outputs checked against torch before
anything is timed, results written as JSON."""
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
from harness import mismatch  # noqa: E402  (the comparison the GPU checks use: NaN or Inf is never right)

from tiledsl.runtime import timing  # noqa: E402
from tiledsl.runtime.placement import refuse_timing  # noqa: E402


def refuse_shared() -> None:
    """No benchmark times ranks that share a GPU, ever (their kernels take turns on it): refused by name at
    import and again at every timing."""
    refuse_timing(Path(sys.argv[0]).stem or "benchmark")


refuse_shared()

SHAPES = {  # model: (N, K) of its MLP projection, as in Triton-distributed's and torch's async-TP benchmarks
    "LLaMA-7B": (11008, 4096),
    "LLaMA-3-8B": (14336, 4096),
    "LLaMA-3-70B": (28672, 8192),
    "Qwen2-72B": (29568, 8192),
    "LLaMA-3-405B": (53248, 16384),
}
M = 8192
NAN = float("nan")


def time_ms(fn, warmup: int = 5, reps: int = 30, before=None) -> float:
    """Median of `reps` CUDA-event timings of fn(); `before` (untimed) runs ahead of each one."""
    refuse_shared()
    for _ in range(warmup):
        if before:
            before()
        fn()
    return timing.median_us(fn, calls=1, windows=reps, warmup=0, before=before) / 1e3


def host_us(fn, calls: int = 200) -> float:
    """Host microseconds per call of `calls` calls issued back to back (no synchronisation between them;
    the GPU drained before and after)."""
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    spent = (time.perf_counter() - began) / calls * 1e6
    torch.cuda.synchronize()
    return spent


def time_loop_ms(fn, calls: int = 20, windows: int = 10, warmup: int = 5, before=None) -> float:
    """Steady-state time per call, as a training or decode loop sees it: `calls` calls back to back
    between two CUDA events, the median over `windows` such windows; `before` (untimed) runs ahead of
    each window. The host enqueues ahead of the GPU, so launch cost is hidden where the GPU is busier.
    The timer is tiledsl.runtime.timing's, which calibrate and the ops' tuner use too."""
    refuse_shared()
    return timing.median_us(fn, calls=calls, windows=windows, warmup=warmup, before=before) / 1e3


def time_interleaved_ms(fns: dict, calls: int = 20, windows: int = 10, warmup: int = 5) -> dict:
    """time_loop_ms for several ways of doing one thing, their windows taken in turn (A B A B ...), so
    that a clock or a neighbour that drifts during the run weighs on each alike: {name: median ms}."""
    refuse_shared()
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(windows):
        for name, fn in fns.items():
            times[name] += timing.windows_us(fn, calls=calls, windows=1, warmup=0)
    return {name: statistics.median(t) / 1e3 for name, t in times.items()}


def slowest(value: float) -> float:
    """The largest of every rank's `value` (under torchrun): a collective is as slow as its slowest rank."""
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


class Verdicts:
    """Outputs checked against torch. A wrong one is a FAIL line (rank 0), its time is left out (NaN) and
    the script's exit code becomes 1. Under torchrun every rank reaches the same verdict, so a variant
    wrong on one rank is skipped on all, and no rank is left waiting in a collective the others skip."""

    def __init__(self):
        self.checked = 0
        self.wrong: list[str] = []

    def ok(self, name: str, got: torch.Tensor, want: torch.Tensor, tol: float = 2e-2) -> bool:
        self.checked += 1
        reasons = [mismatch(got, want, tol)]
        if dist.is_initialized():
            mine, reasons = reasons[0], [None] * dist.get_world_size()
            dist.all_gather_object(reasons, mine)
        bad = [f"rank {r}: {reason}" for r, reason in enumerate(reasons) if reason]
        if bad:
            self.wrong.append(name)
            if rank0():
                print(f"FAIL {name} -- {'; '.join(bad)}", flush=True)
        return not bad

    def exit_code(self) -> int:
        """1 if any output was wrong, or if nothing was checked (nothing then was shown to be right)."""
        if rank0():
            print(f"{self.checked} outputs checked against torch, {len(self.wrong)} wrong"
                  + (": " + ", ".join(self.wrong) if self.wrong else ""), flush=True)
        return 1 if self.wrong or not self.checked else 0


def time_checked(verdicts: Verdicts, name: str, call, check, out: torch.Tensor, want: torch.Tensor,
                 before=None, recheck: bool = True, timer=time_ms, tol: float = 2e-2, **timing) -> float:
    """The slowest rank's time of `call(check=False)`, or NaN if its output is wrong. First `before()`
    (default: NaN into `out`) and one checked call (it compiles and proves the schedule), whose `out`
    must match `want`; then `timer`, with `before` ahead of each timing; then `check()` and, with
    `recheck` (inputs the timed calls leave unchanged), `out` once more: the last timed call's."""
    (before or (lambda: out.fill_(NAN)))()
    call(check=True)
    if not verdicts.ok(name, out, want, tol):
        return NAN
    ms = slowest(timer(lambda: call(check=False), before=before, **timing))
    check()
    if recheck and not verdicts.ok(f"{name}, after timing", out, want, tol):
        return NAN
    return ms


def program_call(program, *args):
    """`call(check=...)` for `time_checked`: a compiled program on fixed arguments."""
    return lambda check: program(*args, check=check)


def out_dir() -> Path:
    path = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    path.mkdir(parents=True, exist_ok=True)
    return path


def save(name: str, payload) -> Path:
    path = out_dir() / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1))
    return path
