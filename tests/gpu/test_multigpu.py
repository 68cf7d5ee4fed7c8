"""The multi-GPU checks as pytest tests: each script runs under torchrun at world 2 and, where there
are 4 GPUs, at world 4. Skipped cleanly on machines with fewer than 2 GPUs (CI, laptops); the harness
they share is checked on CPU ranks with gloo."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = Path(__file__).parent
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
WORLDS = [w for w in (2, 4) if w <= GPUS]
SUMMARY = re.compile(r"^(\d+) run, (\d+) failed$", re.MULTILINE)


def summary(stdout: str) -> tuple[int, int]:
    """(checks run, checks failed) from a check script's output: exactly one summary line, read whole,
    so that "10 failed" is never taken for "0 failed"."""
    found = SUMMARY.findall(stdout)
    assert len(found) == 1, f"expected one summary line, found {found}"
    return int(found[0][0]), int(found[0][1])


@pytest.mark.multigpu
@pytest.mark.skipif(GPUS < 2, reason="needs at least 2 GPUs")
@pytest.mark.parametrize("world", WORLDS or [2])
@pytest.mark.parametrize("script", ["multigpu_checks.py", "collectives_checks.py"])
def test_checks_pass_under_torchrun(script, world):
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}", str(HERE / script)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    ran, failed = summary(done.stdout)
    assert ran > 0 and failed == 0, done.stdout[-4000:]
    assert not re.search(r"^FAIL", done.stdout, re.MULTILINE), done.stdout[-4000:]


def test_summary_is_read_whole():
    assert summary("PASS a\n12 run, 0 failed\n") == (12, 0)
    assert summary("12 run, 10 failed\n") == (12, 10)
    with pytest.raises(AssertionError):
        summary("x 0 failed\n")


def _harness_rank(rank, world, port, only, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      CHECKS_ONLY=only)
    sys.path.insert(0, str(HERE))
    from harness import Case, Checks, back_to_back, close, start

    start(0, cpu=True)
    checks = Checks()
    passed = checks.record("passes everywhere", lambda: None)

    def fails_on_rank_1():
        assert dist.get_rank() != 1, "rank 1 disagrees"
    failed = checks.record("fails on one rank", fails_on_rank_1)

    def make_case():
        X, Y = torch.empty(8), torch.empty(8)
        return Case((X, Y), lambda: (X.normal_(), Y.fill_(float("nan"))), lambda: close(Y, X))
    calls = []

    def copy_wrong_on_rank_1_from_call_5(X, Y, check):
        calls.append(check)
        if rank == 1 and len(calls) > 5:
            raise RuntimeError("rank 1 gave up")
        Y.copy_(X)
    # rank 0 passes every call of the round rank 1 fails in: both stop there, neither waits on the other
    stopped = checks.record("calls back to back, one rank stops", lambda: back_to_back(
        copy_wrong_on_rank_1_from_call_5, lambda: None, make_case, calls=100))
    results.put((rank, passed, failed, stopped, len(calls), checks.finish(None)))


def _run_harness(only: str):
    context = mp.get_context("spawn")
    results = context.Queue()
    port = 29500 + os.getpid() % 1000 + (7 + len(only) if only else 0)  # one port per test
    procs = [context.Process(target=_harness_rank, args=(r, 2, port, only, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = sorted(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    return got


def test_a_check_failing_on_one_rank_fails_for_all(capfd):
    assert _run_harness("") == [(0, True, False, False, 11, 1), (1, True, False, False, 6, 1)]
    out = capfd.readouterr().out
    assert "PASS passes everywhere" in out and "FAIL fails on one rank -- AssertionError: rank 1 disagrees" in out
    assert "FAIL calls back to back, one rank stops -- AssertionError: another rank's output differed" in out
    assert summary(out) == (3, 2)


def test_a_run_that_checks_nothing_fails(capfd):
    """A CHECKS_ONLY left in the environment that matches no check must not read as a clean run."""
    assert _run_harness("no such check") == [(0, True, True, True, 0, 1), (1, True, True, True, 0, 1)]
    out = capfd.readouterr().out
    assert "FAIL no check ran" in out and "skipped 3 checks" in out
    assert summary(out) == (0, 1)


def test_checks_only_takes_several_texts(capfd):
    """CHECKS_ONLY=A|B runs the checks whose name holds A or B, and only those."""
    assert _run_harness("passes|fails on") == [(0, True, False, True, 0, 1), (1, True, False, True, 0, 1)]
    out = capfd.readouterr().out
    assert "PASS passes everywhere" in out and "FAIL fails on one rank" in out and "skipped 1 checks" in out
    assert summary(out) == (2, 1)
