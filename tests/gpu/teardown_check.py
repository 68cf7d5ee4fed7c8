"""Does a process that met failures end cleanly, with no NVSHMEM error at exit? Run without arguments it
starts `torchrun --nproc-per-node=2` on itself for each way to fail, reads what the ranks printed, and
prints one PASS/FAIL line a case, then the summary line:

    python3 tests/gpu/teardown_check.py

The ways to fail, each in its own processes: a call that times out (a schedule with its gather left
out), a compile of a malformed program, an exception raised by the caller while the heap is open, and
a call refused at launch (a wrong tensor). Each rank then leaves as a script would (the heap closed by
its `with`, or left to the exit hook); a clean end is exit code 0 on every rank and no line naming
NVSHMEM with an error or warning."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = ("timeout", "bad_compile", "caller_raises", "launch_refused", "exit_hook")
# what NVSHMEM prints when memory is still allocated at finalize, or a teardown step fails
COMPLAINT = re.compile(r"nvshmem[^\n]*(error|warn|fail|abort)|(error|warn)[^\n]*nvshmem", re.IGNORECASE)


def rank_main(case: str) -> int:
    import torch
    import torch.distributed as dist

    import tiledsl
    from tiledsl.diagnostics import TdsError
    from tiledsl.runtime.issue import ScheduleTimeout
    from tiledsl.runtime.validate import LaunchError
    from tiledsl.runtime import placement
    from tiledsl.runtime.heap import open_heap

    placement.start()  # NCCL, or gloo where the two ranks share a GPU
    world = dist.get_world_size()
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    expected_error = False
    if case == "exit_hook":  # the heap never closed by the caller: the exit hook frees it
        heap = open_heap()
        program = tiledsl.compile(ROOT / "programs" / "allreduce.tds", heap)
        program(torch.randn(4096, **bf16))
        torch.cuda.synchronize()
        return 0
    try:
        with open_heap() as heap:
            if case == "timeout":
                program = tiledsl.compile(ROOT / "programs" / "ag_gemm.tds", heap, wait_timeout_s=1.0, skip=("gather",))
                program(torch.randn(1024 // world, 256, **bf16), torch.randn(256, 512, **bf16),
                        torch.empty(1024, 512, **bf16))
            elif case == "bad_compile":
                bad = Path(os.environ.get("TMPDIR", "/tmp")) / f"teardown_bad_{os.getpid()}.tds"
                bad.write_text("program bad\nparam N\nin X : bf16[N]\nout Y : bf16[N]\ntile t[i in N]: Y[i] = Z[i]\n")
                tiledsl.compile(bad, heap)
            elif case == "caller_raises":
                program = tiledsl.compile(ROOT / "programs" / "allreduce.tds", heap)
                program(torch.randn(4096, **bf16))
                raise KeyError("raised by the caller with the heap open")
            elif case == "launch_refused":
                program = tiledsl.compile(ROOT / "programs" / "ag_gemm.tds", heap)
                program(torch.randn(1024 // world, 256, **bf16), torch.randn(256, 512, **bf16),
                        torch.empty(7, 512, **bf16))
    except (TdsError, ScheduleTimeout, LaunchError, KeyError) as error:  # what each case is meant to raise
        expected_error = True
        print(f"rank {dist.get_rank()} {case}: raised {type(error).__name__}: {str(error)[:200]}", flush=True)
    dist.destroy_process_group()
    if not expected_error:
        print(f"rank {dist.get_rank()} {case}: nothing was raised", flush=True)
        return 3
    return 0


def main() -> int:
    failed = 0
    # TEARDOWN_CASES=a,b runs only those (each case costs a start of two processes; time may be short)
    cases = [c for c in CASES if c in os.environ.get("TEARDOWN_CASES", ",".join(CASES)).split(",")]
    for case in cases:
        done = subprocess.run(["torchrun", "--nproc-per-node=2", __file__, case], capture_output=True, text=True,
                              timeout=150, check=False, cwd=ROOT)
        output = done.stdout + done.stderr
        complaints = [line for line in output.splitlines() if COMPLAINT.search(line)]
        raised = case == "exit_hook" or output.count(f"{case}: raised") == 2
        ok = done.returncode == 0 and not complaints and raised
        failed += not ok
        why = "" if ok else f" -- exit {done.returncode}; raised on both ranks: {raised}; " + \
            ("; ".join(complaints[:3]) or output[-600:].replace("\n", " | "))
        print(f"{'PASS' if ok else 'FAIL'} teardown after {case.replace('_', ' ')}{why}", flush=True)
    print(f"{len(cases)} run, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(rank_main(sys.argv[1]) if len(sys.argv) > 1 else main())
