"""What a Program offers callers beyond a call, on emulated ranks: dtype overrides by torch dtype,
dropping the prepared calls of some tensors only, reset() after a failed call, and the refusal of
tensors a TMA descriptor cannot read."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tiledsl.runtime.emulate import run_ranks

ROOT = Path(__file__).resolve().parents[2]
ALLREDUCE = os.fspath(ROOT / "programs" / "allreduce.tds")
GEMM = os.fspath(ROOT / "programs" / "gemm.tds")


def _rank(heap):
    import tiledsl
    from tiledsl.runtime.launch import LaunchError, ScheduleTimeout
    out = {}
    # dtype_override keyed by torch dtype, as a model has it
    program = tiledsl.compile(ALLREDUCE, heap, emulated=True, dtype_override={torch.bfloat16: torch.float32},
                              wait_timeout_s=0.3)
    torch.manual_seed(0)  # every rank draws the same X: the sum is world * X
    xs = [torch.randn(300) for _ in range(2)]
    want = [x * heap.world for x in xs]
    for x in xs:
        program(x)
    out["summed"] = all(torch.allclose(x, w) for x, w in zip(xs, want))
    out["prepared"] = len(program._calls)
    program.release(xs[0])
    out["after_release_one"] = len(program._calls)
    # a failed call: rank 1 passes a wrong dtype (refused before any launch), rank 0 times out waiting
    bad = torch.randn(300, dtype=torch.float64) if heap.rank == 1 else torch.randn(300)
    try:
        program(bad)
        out["failed"] = None
    except (LaunchError, ScheduleTimeout) as error:
        out["failed"] = type(error).__name__
    program.reset()
    x = torch.ones(300)
    program(x)
    out["after_reset"] = torch.allclose(x, torch.full((300,), float(heap.world)))
    heap.close()
    return out


@pytest.mark.emulated
def test_dtype_keys_release_of_some_tensors_and_reset_after_a_failed_call():
    results = run_ranks(_rank, 2, timeout_s=300)
    for rank, out in enumerate(results):
        assert out["summed"] and out["prepared"] == 2 and out["after_release_one"] == 1
        assert out["failed"] == ("LaunchError" if rank == 1 else "ScheduleTimeout"), out
        assert out["after_reset"], out


def _rank_unaligned(heap):
    import tiledsl
    from tiledsl.runtime.launch import LaunchError
    program = tiledsl.compile(GEMM, heap, emulated=True, dtype_override={"bfloat16": torch.float32})
    try:
        program(torch.randn(64, 64), torch.randn(64, 70), torch.empty(64, 70))
    except LaunchError as error:
        return str(error)
    return "accepted"


@pytest.mark.emulated
def test_rows_a_tma_descriptor_cannot_read_are_refused_by_name():
    message, = run_ranks(_rank_unaligned, 1, timeout_s=120)
    assert "tensor 'B'" in message and "multiple of 16 bytes" in message and "multiple of 4" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is of a machine without a GPU")
def test_a_program_loaded_for_a_gpu_on_a_machine_without_one_says_how_to_emulate_it():
    """Not torch's "Torch not compiled with CUDA enabled" from inside the launcher."""
    import tiledsl
    from tiledsl.runtime.launch import LaunchError
    program = tiledsl.compile(GEMM, emulated=False)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    with pytest.raises(LaunchError, match="no GPU here.*TRITON_INTERPRET=1"):
        program(a, b, torch.empty(64, 64))
