"""What every multi-GPU check script shares: starting a rank under torchrun with its symmetric heap;
recording checks so that every rank runs every check and rank 0 prints one PASS/FAIL line each; the
comparison every check uses; and many calls back to back, each on fresh inputs, each output checked."""
import gc
import os
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from tiledsl.runtime import placement
from tiledsl.runtime import placement as host  # host collectives on any backend: CUDA tensors via the CPU on gloo
from tiledsl.runtime.heap import disable_multicast, open_heap

BEGAN = time.monotonic()  # the script's start: CHECKS_BUDGET_S counts from here, startup included

# The tensor sets of one repeated-call check take at most about this much memory together: two sets
# at 256 MB messages, up to MAX_SETS for small ones.
SETS_BYTES = 2 << 30
# Calls back to back between two verifications, at most.
MAX_SETS = 10
# Where the checks' tensors live. CPU tests set "cpu" to run the checks' own logic (references, shapes,
# comparisons, the calls back to back) on gloo ranks with stand-ins for the programs.
DEVICE = "cuda"
# Whether ranks share GPUs (set by start): then the process group is gloo, the references go through the
# CPU, and the checks of NCCL's or torch's symmetric memory, which refuse such ranks, are skipped by name.
SHARED = False
# What each check needs that ranks sharing a GPU lack (Checks.record's `needs`)
NEEDS = {"nccl": "NCCL, which refuses two ranks on one GPU",
         "symm_mem": "torch's symmetric memory, which refuses ranks sharing a GPU"}


def wait_s(seconds: float) -> float:
    """A wait timeout for calls that must not time out: where ranks share a GPU a wait lasts until the
    peers' kernels get their turns on it, so as many times longer as ranks share a GPU."""
    return seconds * (placement.current().per_gpu if SHARED else 1)


def cap_calls(n: int) -> int:
    """`n` calls, or at most CHECKS_CALLS (set where time is short: ranks sharing one GPU take turns on it)."""
    cap = os.environ.get("CHECKS_CALLS")
    return min(n, max(2, int(cap))) if cap else n


def empty(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.empty(*shape, device=DEVICE, dtype=dtype)


def start(seed: int, cpu: bool = False):
    """(rank, world, heap) for this torchrun process, on its GPU (tiledsl.runtime.placement: ranks may
    share GPUs); NVLink multicast stays off everywhere. `cpu`: gloo ranks without a GPU or a heap, for
    the CPU tests of the checks' own logic."""
    global SHARED
    disable_multicast()
    if cpu:
        dist.init_process_group("gloo")
        heap = None
    else:
        SHARED = placement.start().shared
        heap = open_heap()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed + rank)
    if rank == 0 and heap is not None:
        shared = f"; {placement.current().describe()}: correctness only" if SHARED else ""
        print(f"heap: {type(heap).__name__}, world {world}{shared}", flush=True)
    return rank, world, heap


def summary_line(ran: int, failed: int) -> str:
    """The last line a check script prints; test_multigpu.py parses it."""
    return f"{ran} run, {failed} failed"


class Checks:
    """Each check runs on every rank; it passes only if it passed everywhere, and a failure on one rank
    is printed with its message, never hidden by the others' success."""

    def __init__(self, deadline: float | None = None, prefix: str = ""):
        """`deadline`: a time.monotonic() past which no check starts (else CHECKS_BUDGET_S from the
        script's start); `prefix`: before each name printed (the suite, where several share a run)."""
        self.prefix = prefix
        self.failures = 0
        self.ran = 0
        self.skipped = 0
        # CHECKS_ONLY=TEXT[|TEXT...] runs only the checks whose name contains one of the TEXTs (to try
        # new programs first, under a short time limit)
        self.only = os.environ.get("CHECKS_ONLY", "")
        self._only = [part for part in self.only.split("|") if part] or [""]
        # CHECKS_BUDGET_S=S: no check starts once S seconds have passed since the script began; the rest
        # print SKIP lines (a limit of time the caller sets a little under its hard one, so that the run
        # still ends with its summary)
        self.budget = float(os.environ.get("CHECKS_BUDGET_S") or "inf")
        self.deadline = BEGAN + self.budget if deadline is None else deadline
        self.unneeded = 0   # skipped: they need what ranks sharing a GPU lack
        self.late = 0       # skipped: out of time
        # Where ranks share a GPU time is short and a budget cuts the list: the checks then run in turns,
        # one of each kind (the name's first word: the program) before a second of any, so that every
        # program is checked before any is checked twice. CHECKS_SPREAD=1 asks for it anywhere.
        self.spread = SHARED or os.environ.get("CHECKS_SPREAD") == "1"
        self.pending: list[tuple[str, Callable, str | None, bool]] = []

    def record(self, name: str, check, needs: str | None = None, last: bool = False) -> bool:
        """Run one check on every rank and print one PASS/FAIL line (SKIP where it cannot run here: it
        `needs` NCCL or torch's symmetric memory and ranks share a GPU, or the time budget is spent).
        Spread (see __init__), the check only joins the list, which `finish` runs; `last`: after every
        other (a check that may leave a program's state behind). Returns whether it passed (True when
        it only joined the list)."""
        if self.spread:
            self.pending.append((name, check, needs, last))
            return True
        return self._run(name, check, needs)

    def run_pending(self) -> None:
        """The checks `record` listed, in turns over their kinds, the `last` ones at the end."""
        pending, self.pending = self.pending, []
        queues: dict[str, list] = {}
        for entry in pending:
            if not entry[3]:
                queues.setdefault(entry[0].split(" ")[0], []).append(entry)
        ordered = []
        while any(queues.values()):
            for queue in queues.values():
                if queue:
                    ordered.append(queue.pop(0))
        ordered += [entry for entry in pending if entry[3]]
        for name, check, needs, _ in ordered:
            self._run(name, check, needs)

    def _run(self, name: str, check, needs: str | None) -> bool:
        if not any(part in name for part in self._only):
            self.skipped += 1
            return True
        if needs is not None and SHARED:
            self.unneeded += 1
            self._say(f"SKIP {self.prefix}{name} -- needs {NEEDS[needs]}")
            return True
        if self._out_of_time():
            self.late += 1
            self._say(f"SKIP {self.prefix}{name} -- out of time")
            return True
        self.ran += 1
        began = time.monotonic()
        try:
            check()
            mine = (True, "")
        except Exception as error:  # noqa: BLE001 - reported, not hidden
            mine = (False, f"{type(error).__name__}: {str(error)[:400]}")
        if SHARED and DEVICE == "cuda":
            # Ranks sharing a GPU: what torch's allocator keeps cached after a check is memory the PEs' NVSHMEM
            # heaps cannot grow into (at world 8 the ops suite's sp_attention failed its heap growth,
            # `cuMemCreate failed`, after flash_decode's references, 2026-12-04): give it back every check.
            gc.collect()
            torch.cuda.empty_cache()
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        ok = all(passed for passed, _ in everyone)
        self.failures += not ok
        took = time.monotonic() - began
        detail = f" -- {took:.1f} s" if ok else \
            " -- " + next(message for passed, message in everyone if not passed) + f" ({took:.1f} s)"
        self._say(f"{'PASS' if ok else 'FAIL'} {self.prefix}{name}{detail}")
        return ok

    def _out_of_time(self) -> bool:
        """Rank 0's clock decides for every rank: they skip together or run together. The first check
        always runs: a suite whose start-up took its budget still shows whether it works."""
        if self.deadline == float("inf") or not self.ran:
            return False
        late = [time.monotonic() > self.deadline]
        dist.broadcast_object_list(late, src=0)
        return bool(late[0])

    @staticmethod
    def _say(line: str) -> None:
        if dist.get_rank() == 0:
            print(line, flush=True)

    def finish(self, heap) -> int:
        """Close the heap and the group; the exit code of the script. A run that checked nothing failed:
        a CHECKS_ONLY left in the environment must not pass for a clean run."""
        self.run_pending()
        dist.barrier()
        if not self.ran:
            self.failures += 1
        if dist.get_rank() == 0:
            if self.skipped:
                print(f"skipped {self.skipped} checks whose name lacks CHECKS_ONLY={self.only!r}", flush=True)
            if self.unneeded:
                print(f"skipped {self.unneeded} checks of NCCL or torch's symmetric memory: ranks share a GPU",
                      flush=True)
            if self.late:
                print(f"skipped {self.late} checks: out of time", flush=True)
            if not self.ran:
                print(f"FAIL no check ran (CHECKS_ONLY={self.only!r} matched none of {self.skipped})", flush=True)
            print(summary_line(self.ran, self.failures), flush=True)
        if heap is not None:
            heap.close()
        dist.destroy_process_group()
        return 1 if self.failures else 0


# ---- comparing ------------------------------------------------------------------------------------

def mismatch(got: torch.Tensor, want: torch.Tensor, tol: float, atol: float | None = None) -> str | None:
    """Why `got` is not `want`, or None: each element must be within tol x |expected| + atol, where atol
    is by default tol x the largest |expected|. NaN or Inf anywhere, in either, is a mismatch: outputs
    start poisoned with NaN, and an expected value that is not finite would let any error through."""
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, expected {list(want.shape)}"
    if not got.numel():
        return None
    got, want = got.float(), want.float()
    # in place where it can be: at 256 MB messages every temporary is 512 MB of float32
    excess = (got - want).abs_().sub_(want.abs().mul_(tol))
    # one synchronisation for all four figures
    bad_got, bad_want, scale, worst_excess = torch.stack([
        torch.isfinite(got).logical_not_().sum().double(), torch.isfinite(want).logical_not_().sum().double(),
        want.abs().amax().double(), excess.amax().double()]).tolist()
    if bad_want:
        return f"{int(bad_want)} of {want.numel()} expected values are NaN or Inf"
    if bad_got:
        return f"{int(bad_got)} of {got.numel()} elements are NaN or Inf (NaN: never written)"
    allowed = tol * (scale or 1.0) if atol is None else atol
    if worst_excess <= allowed:
        return None
    worst = int(excess.argmax())
    return (f"{int((excess > allowed).sum())} of {got.numel()} elements differ by more than {tol} x |expected| "
            f"+ {allowed:.3g}; worst at flat index {worst}: got {got.flatten()[worst].item():.6g}, "
            f"expected {want.flatten()[worst].item():.6g}")


def close(got: torch.Tensor, want: torch.Tensor, tol: float = 2e-2) -> None:
    """Raise AssertionError unless `got` matches `want` (see `mismatch`). bf16 products over K terms
    round relative to the result's scale, hence the tolerance in proportion to the largest value."""
    reason = mismatch(got, want, tol)
    if reason:
        raise AssertionError(reason)


# ---- many calls back to back ----------------------------------------------------------------------

@dataclass
class Case:
    """One set of a program's caller tensors, kept across calls (so that its prepared call and CUDA graph
    are reused) and given new contents for every call."""
    args: tuple                      # the caller tensors, as the call takes them
    refresh: Callable[[], None]      # fresh random inputs, their expected outputs, NaN in the outputs
    verify: Callable[[], None]       # raise AssertionError where an output differs from the expected
    # stream-ordered work right before the call (copying new inputs into tensors the sets share)
    load: Callable[[], None] = lambda: None


def _allocated() -> int:
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else 0


def set_count(nbytes: int) -> int:
    """How many tensor sets of `nbytes` each a check uses in turn: an even number, so that programs whose
    staged inputs alternate between two heap copies by call parity keep one prepared call per set."""
    fits = SETS_BYTES // max(nbytes, 1)
    return max(2, min(MAX_SETS, fits)) // 2 * 2


def _anyone(failed: bool) -> bool:
    """Whether any rank failed: every rank leaves the loop together, instead of the others calling on
    and timing out in the barrier of a rank that stopped."""
    if not dist.is_initialized():
        return failed
    flag = torch.tensor([int(failed)], device=DEVICE if torch.cuda.is_available() else "cpu")
    host.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def back_to_back(call, check, make_case: Callable[[], Case], calls: int) -> None:
    """`calls` calls of a program (`call(*args, check=...)`, then `check()` for the calls made without),
    each on fresh random inputs, each output checked.

    The first call runs alone and checked (it compiles and proves the schedule). The rest run in rounds
    over a few tensor sets used in turn: before a round every set gets new inputs, their expected outputs
    and NaN in its outputs; then the round's calls run back to back, nothing but a set's `load` between
    them and no synchronisation; then every set is verified. A call thus always finds the previous
    call's different data in the symmetric buffers (gathered rows, staged copies): a wait that lets a
    reader through too early reads wrong values, not stale ones that happen to be right."""
    calls = cap_calls(calls)
    before = _allocated()
    first = make_case()
    first.refresh()
    cases = [first] + [make_case() for _ in range(set_count(_allocated() - before) - 1)]
    round_, done = [first], 0
    while True:
        problem = None
        try:
            for case in round_:
                case.load()
                call(*case.args, check=not done)
            check()
            for case in round_:
                case.verify()
        except Exception as error:  # noqa: BLE001 - re-raised below, once every rank knows
            problem = error
        if _anyone(problem is not None):
            raise problem or AssertionError("another rank's output differed or its call timed out")
        done += len(round_)
        if done >= calls:
            return
        round_ = cases[:min(len(cases), calls - done)]
        for case in round_:
            case.refresh()
