"""A kernel that is its call's own entry (no separate entry launch): it advances the epoch cell at
its end, and, for a program that communicates, passes the barrier between ranks at its start.
Emulated, a program of one family runs this way, so CI checks the protocol the GPU path uses."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tiledsl.runtime.emulate import run_ranks
from tiledsl.runtime.run_program import EMULATED_DTYPES

pytestmark = pytest.mark.emulated

PROGRAMS = Path(__file__).resolve().parents[2] / "programs"
CALLS = 3
OVERRIDE = {k: getattr(torch, v) for k, v in EMULATED_DTYPES.items()}  # bf16 runs as float32 on a CPU


def _rank_calls(heap, name: str, consts: dict, numel: int):
    """Three calls on fresh data: (entry folded, epoch cell, result, expected) after each."""
    import tiledsl
    program = tiledsl.compile(os.fspath(PROGRAMS / f"{name}.tds"), heap, emulated=True, wait_timeout_s=30.0,
                              dtype_override=OVERRIDE, **consts)
    seen = []
    for call in range(CALLS):
        # every rank's input for this call, so each rank can check its own sum
        inputs = [torch.arange(numel, dtype=torch.float32) * (r + 1) + call for r in range(heap.world)]
        out = program(inputs[heap.rank].clone())
        prepared = next(iter(program._calls.values()))
        # numpy, not tensors: tensors cross processes as shared storage that dies with the rank
        seen.append((prepared.fold, program._epoch_cell.tolist(), out.numpy().copy(), sum(inputs).numpy()))
    heap.close()
    return seen


def test_a_one_family_program_is_its_own_entry_and_counts_epochs_across_calls():
    for rank_seen in run_ranks(_rank_calls, 2, "allreduce", {"BLOCK": 64}, 200, timeout_s=300):
        for epoch, (fold, cell, out, expected) in enumerate(rank_seen, 1):
            assert fold
            assert cell == [epoch, 0, 0]  # this call's epoch; the counts of programs back at zero
            torch.testing.assert_close(torch.from_numpy(out), torch.from_numpy(expected))


def test_a_program_of_several_families_keeps_its_entry_kernel_when_emulated():
    for rank_seen in run_ranks(_rank_calls, 2, "allreduce_two_shot", {"BLOCK": 64}, 300, timeout_s=300):
        for epoch, (fold, cell, out, expected) in enumerate(rank_seen, 1):
            assert not fold
            assert cell[0] == epoch
            torch.testing.assert_close(torch.from_numpy(out), torch.from_numpy(expected))


def _rank_alone(heap):
    """Both ranks make one call; then rank 0 calls again and rank 1 does not: rank 0's in-kernel
    barrier must time out, naming itself and the epochs. (The first call is there because symmetric
    buffers are allocated by every rank together.)"""
    import tiledsl
    from tiledsl.runtime.launch import ScheduleTimeout
    program = tiledsl.compile(os.fspath(PROGRAMS / "allreduce.tds"), heap, emulated=True, wait_timeout_s=0.2,
                              dtype_override=OVERRIDE, BLOCK=64)
    x = torch.ones(100)
    program(x)
    message = "one call"
    if heap.rank == 0:
        try:
            program(x)
            message = "finished"
        except ScheduleTimeout as timeout:
            message = str(timeout)
    heap.close()
    return message


def test_a_rank_that_never_comes_makes_the_in_kernel_barrier_time_out_by_name():
    first, second = run_ranks(_rank_alone, 2, timeout_s=300)
    assert first == "rank 0 timed out waiting on the entry barrier (waiting instance 1, expected epoch 2, saw 1)"
    assert second == "one call"
