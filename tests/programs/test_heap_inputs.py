"""Inputs the caller allocated on the symmetric heap (`tiledsl.empty`) are read by peers where they are:
no staging copy, and an exit barrier instead, so that a caller may overwrite its input as soon as the
call returns. Emulated at worlds 2 and 3: out-of-place all-reduce from heap inputs, overwritten between
calls (every call checked), next to the same program on an ordinary tensor (staged)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tiledsl.runtime.emulate import run_ranks

ROOT = Path(__file__).resolve().parents[2]


def _rank(heap, n: int, calls: int):
    import tiledsl
    from tiledsl.collectives import AllReduce
    allreduce = AllReduce(heap, emulated=True, wait_timeout_s=5.0)
    x = tiledsl.empty(n, torch.float32, heap=heap)
    y = torch.full((n,), float("nan"))
    out = {"staged": [], "sums": [], "wants": []}
    for call in range(calls):
        torch.manual_seed(100 * call + heap.rank)
        x.copy_(torch.randn(n))  # overwritten right after the last call returned: the exit barrier's job
        y.fill_(float("nan"))
        allreduce(x, out=y)
        program = allreduce._library.get("allreduce_out", torch.float32)
        out["staged"].append(len(next(iter(program._calls.values())).staged))
        out["sums"].append(y.clone().numpy())
    plain = torch.randn(n)
    y2 = torch.empty(n)
    allreduce(plain, out=y2)  # an ordinary tensor: staged as usual
    (call,) = [c for key, c in program._calls.items() if any(entry[1] == plain.data_ptr() for entry in key[1:])]
    out["plain_staged"] = len(call.staged)
    heap.close()
    return out


@pytest.mark.emulated
@pytest.mark.parametrize("world", [2, 3])
def test_out_of_place_all_reduce_reads_heap_inputs_in_place_and_every_call_is_right(world):
    n, calls = 5000, 3
    results = run_ranks(_rank, world, n, calls, timeout_s=300)
    for call in range(calls):
        want = sum(torch.randn(n, generator=torch.Generator().manual_seed(100 * call + r)) for r in range(world))
        for rank in range(world):
            got = torch.from_numpy(results[rank]["sums"][call])
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert all(r["staged"] == [0] * calls for r in results)  # nothing copied into the heap
    assert all(r["plain_staged"] == 1 for r in results)
