"""A program called with new tensors of shapes it has seen binds them into the call it prepared for
those shapes (Program._rebind) instead of preparing again: a functional op's fresh output costs no
preparation, and a call can be recorded into the caller's CUDA graph (no host-to-device copy). Checked
on emulated ranks: each call on fresh inputs and fresh outputs against torch, through a staged input
(peer offsets moved with the caller's address), a copy-engine gather (its copies made again from the
new views) and a product (its TMA descriptors made again), and after release() (the template keeps no
caller tensor)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tiledsl.runtime.emulate import run_ranks

pytestmark = pytest.mark.emulated

ROOT = Path(__file__).resolve().parents[2]
CALLS = 5
# program, small consts, sizes; all_gather(A) @ B for the AG+GEMMs, the sum of X over ranks for AllReduce
CASES = {
    "ag_gemm": ({"BM": 16, "BN": 16, "BK": 64}, {"M": 64, "K": 128, "N": 48}),
    "ag_gemm_push": ({"BM": 16, "BN": 16, "BK": 64}, {"M": 64, "K": 128, "N": 48}),
    "allreduce": ({}, {"N": 4096}),
}


def _inputs(name: str, sizes: dict, world: int, call: int) -> list[dict]:
    """Every rank's inputs of one call, the same on every rank (each rank computes the expected result)."""
    generator = torch.Generator().manual_seed(1000 * call + 7)
    if name == "allreduce":
        return [{"X": torch.randn(sizes["N"], generator=generator)} for _ in range(world)]
    B = torch.randn(sizes["K"], sizes["N"], generator=generator)
    return [{"A": torch.randn(sizes["M"] // world, sizes["K"], generator=generator), "B": B} for _ in range(world)]


def _rank(heap, name: str, consts: dict, sizes: dict, release: bool):
    import tiledsl
    world, rank = heap.world, heap.rank
    program = tiledsl.compile(ROOT / "programs" / f"{name}.tds", heap, emulated=True, wait_timeout_s=5.0,
                              dtype_override={"bfloat16": torch.float32}, **consts)
    prepared = []
    prepare = program._prepare
    program._prepare = lambda *args: prepared.append(1) or prepare(*args)
    worst = 0.0
    for call in range(CALLS):
        inputs = _inputs(name, sizes, world, call)
        if name == "allreduce":
            expected = sum(i["X"] for i in inputs)
            out = inputs[rank]["X"].clone()  # inout: the sum replaces it
            got = program(out)
        else:
            expected = torch.cat([i["A"] for i in inputs]) @ inputs[rank]["B"]
            out = torch.full_like(expected, float("nan"))
            got = program(inputs[rank]["A"].clone(), inputs[rank]["B"].clone(), out)
        assert got is out
        worst = max(worst, float((got - expected).abs().max() / expected.abs().max()))
        if release:
            program.release()
    scrubbed = all(v is None for t in program._templates.values()
                   for k, v in t.kernel_args.items() if k in {a.name for a in program._caller_args})
    heap.close()
    return worst, len(prepared), program._staging, scrubbed


@pytest.mark.parametrize("release", [False, True], ids=["kept", "released"])
@pytest.mark.parametrize("name", list(CASES))
def test_new_tensors_of_seen_shapes_are_bound_into_the_prepared_call_and_every_call_is_right(name, release):
    consts, sizes = CASES[name]
    results = run_ranks(_rank, 2, name, consts, sizes, release, timeout_s=300)
    for worst, prepared, staging, scrubbed in results:
        assert worst < 1e-4
        # a staged input alternates between two heap copies: one preparation per parity, every other
        # call bound into one of them (without staging: one preparation)
        assert prepared == (2 if staging else 1), prepared
        assert staging == (name != "ag_gemm_push")  # its puts read A where it is
        assert scrubbed == release
