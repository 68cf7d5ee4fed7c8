"""A kernel that is its call's own entry (no separate entry launch): it passes the barrier between
ranks at its start and advances the epoch cell at its end. Emulated, a program of one family with no
staged input runs this way, so CI checks the protocol the GPU path uses."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tiledsl.runtime.emulate import run_ranks
from tiledsl.tools.run_program import EMULATED_DTYPES

pytestmark = pytest.mark.emulated

PROGRAMS = Path(__file__).resolve().parents[2] / "programs"
CALLS = 3
OVERRIDE = {k: getattr(torch, v) for k, v in EMULATED_DTYPES.items()}  # bf16 runs as float32 on a CPU
# One family, no staged input: each rank writes X into the next rank's S, and 2 X into its own Y.
ROTATE = """
program rotate
param N
const B = 64
in   X : f32[N]
out  Y : f32[N]
symm S : f32[N]
tile put[i in cdiv(N, B)]: S@((rank + 1) mod world)[i*B : +B] = X[i*B : +B]; Y[i*B : +B] = 2 * X[i*B : +B]
"""


def _data(rank: int, call: int, numel: int) -> torch.Tensor:
    return torch.arange(numel, dtype=torch.float32) * (rank + 1) + call


def _rank_rotate(heap, numel: int):
    """Three calls on fresh data: (entry folded, epoch cell, Y, S) after each; S read after a barrier."""
    import tiledsl
    program = tiledsl.compile(ROTATE, heap, emulated=True, wait_timeout_s=30.0)
    seen = []
    for call in range(CALLS):
        y = program(_data(heap.rank, call, numel), torch.full((numel,), float("nan")))
        heap.barrier()  # every rank's put of this call has landed
        prepared = next(iter(program._calls.values()))
        s = next(iter(program._resources.values())).tensors["S"]
        # numpy, not tensors: tensors cross processes as shared storage that dies with the rank
        seen.append((prepared.fold, program._epoch_cell.tolist(), y.numpy().copy(), s.numpy().copy()))
        heap.barrier()  # nobody's next call writes S before every rank has read it
    heap.close()
    return seen


def test_a_one_family_program_is_its_own_entry_and_counts_epochs_across_calls():
    world, numel = 3, 200
    for rank, rank_seen in enumerate(run_ranks(_rank_rotate, world, numel, timeout_s=300)):
        for call, (fold, cell, y, s) in enumerate(rank_seen):
            assert fold
            assert cell == [call + 1, 0]  # this call's epoch; the count of finished programs back at zero
            torch.testing.assert_close(torch.from_numpy(y), 2 * _data(rank, call, numel))
            torch.testing.assert_close(torch.from_numpy(s), _data((rank - 1) % world, call, numel))


def _rank_allreduce(heap, name: str, consts: dict, numel: int):
    """Three calls on fresh data: (entry folded, epoch, result, expected) after each."""
    import tiledsl
    program = tiledsl.compile(os.fspath(PROGRAMS / f"{name}.tds"), heap, emulated=True, wait_timeout_s=30.0,
                              dtype_override=OVERRIDE, **consts)
    seen = []
    for call in range(CALLS):
        inputs = [_data(r, call, numel) for r in range(heap.world)]
        out = program(inputs[heap.rank].clone())
        prepared = next(iter(program._calls.values()))
        seen.append((prepared.fold, int(program._epoch_cell[0]), out.numpy().copy(), sum(inputs).numpy()))
    heap.close()
    return seen


@pytest.mark.parametrize("name, why", [("allreduce", "a staged input"), ("allreduce_two_shot", "two families")])
def test_a_program_with_a_staged_input_or_several_families_keeps_its_entry_kernel(name, why):
    for rank_seen in run_ranks(_rank_allreduce, 2, name, {"BLOCK": 64}, 300, timeout_s=300):
        for call, (fold, epoch, out, expected) in enumerate(rank_seen):
            assert not fold, why
            assert epoch == call + 1
            torch.testing.assert_close(torch.from_numpy(out), torch.from_numpy(expected))


def _rank_alone(heap):
    """Both ranks make one call; then rank 0 calls again and rank 1 does not: rank 0's in-kernel
    barrier must time out, naming itself and the epochs. (The first call is there because symmetric
    buffers are allocated by every rank together.)"""
    import tiledsl
    from tiledsl.runtime.launch import ScheduleTimeout
    program = tiledsl.compile(ROTATE, heap, emulated=True, wait_timeout_s=0.2)
    x = torch.ones(100)
    program(x, torch.empty(100))
    message = "one call"
    if heap.rank == 0:
        try:
            program(x, torch.empty(100))
            message = "finished"
        except ScheduleTimeout as timeout:
            message = str(timeout)
    heap.close()
    return message


def test_a_rank_that_never_comes_makes_the_in_kernel_barrier_time_out_by_name():
    first, second = run_ranks(_rank_alone, 2, timeout_s=300)
    assert first == "rank 0 timed out waiting on the entry barrier (waiting instance 1, expected epoch 2, saw 1)"
    assert second == "one call"
