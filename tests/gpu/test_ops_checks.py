"""The logic of tests/gpu/ops_checks.py on CPU: two gloo ranks, each op through tiledsl.ops' torch path
on small shapes, against the script's float64 expectations from every rank's inputs. A right answer
must pass and a wrong one (another rank's block, or half the result) must fail, so
that the GPU run judges the programs, not the script."""
import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))

WORLD = 2
SMALL = [  # (op, every rank's input shapes, kwargs): the script's ops at sizes a CPU takes in a moment
    ("all_gather_matmul", [(5, 12), (12, 7)], {}),
    ("matmul_reduce_scatter", [(6, 12), (12, 7)], {}),
    ("matmul_all_reduce", [(3, 12), (12, 7)], {}),
    ("all_reduce", [(13,)], {}),
    ("all_gather", [(3, 5)], {}),
    ("reduce_scatter", [(6, 5)], {}),
    ("all_reduce_rmsnorm", [(3, 8), (3, 8), (8,)], {"eps": 1e-5}),
]


def _rank(rank: int, rendezvous: str, failures):
    import harness
    harness.DEVICE = "cpu"
    import ops_checks
    from harness import mismatch

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD)
    torch.manual_seed(5 + rank)
    try:
        for op, shapes, kwargs in SMALL:
            tensors = ops_checks.fresh(shapes, torch.float32)
            want = ops_checks.expected(op, tensors, kwargs, rank, WORLD)
            got = ops_checks.call(op, tensors, kwargs, impl="torch")
            for g, w in zip(got, want, strict=True):
                reason = mismatch(g, w, 1e-5)
                if reason:
                    failures.append(f"{op} rank {rank}: right answer refused: {reason}")
            # wrong answers the script must refuse: the other rank's expectation, or one rank's share only
            other = ops_checks.expected(op, tensors, kwargs, 1 - rank, WORLD)
            halved = [t * 0.5 for t in want]
            refused = 0
            for label, wrong in (("another rank's result", other), ("half the result", halved)):
                if all(torch.equal(a, b) for a, b in zip(wrong, want, strict=True)):
                    continue  # the same as the right answer here (an all-reduce's result is every rank's)
                if all(mismatch(w.float(), r, 1e-5) is None for w, r in zip(wrong, want, strict=True)):
                    failures.append(f"{op} rank {rank}: {label} passed")
                refused += 1
            if not refused:
                failures.append(f"{op} rank {rank}: no wrong answer was tried")
    finally:
        dist.destroy_process_group()


@pytest.mark.emulated
def test_ops_checks_script_expectations_agree_with_the_torch_path_and_refuse_wrong_answers():
    with tempfile.TemporaryDirectory() as folder, mp.Manager() as manager:
        failures = manager.list()
        mp.start_processes(_rank, args=(os.path.join(folder, "rendezvous"), failures), nprocs=WORLD,
                           start_method="fork")
        assert not list(failures), "\n".join(failures)
