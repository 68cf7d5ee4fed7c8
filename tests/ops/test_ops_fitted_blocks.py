"""tiledsl.ops fits a product's fp32 blocks to the shared memory of the GPU its heap's programs launch
on (gpus.of_launch, as tiledsl.compile and the launcher read it; the default H200 emulated or with no
device), not to Hopper's alone: on a GPU with less, the blocks Hopper takes would be refused at launch."""
from __future__ import annotations

import pytest
import torch

import tiledsl
from tiledsl import gpus
from tiledsl.api import build_module
from tiledsl.library import program as library_program
from tiledsl.ops import context
from tiledsl.ops.context import HeapEntry, compiled, fitted_blocks, library_consts
from tiledsl.runtime.specs import SharedMemoryError, kernel_options

A100_SHARED = 163 * 1024  # what a block may opt in to on an A100: less than Hopper's 227 KB


class _Heap:
    device = torch.device("cuda", 0)


def _stand_in(monkeypatch, shared_bytes: int):
    class Properties:
        multi_processor_count = 108
        name = "stand-in GPU"
        major, minor = 9, 0
        shared_memory_per_block_optin = shared_bytes
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Properties())


def _fp32_consts(monkeypatch, emulated: bool) -> dict:
    """The consts tiledsl.ops compiles ag_gemm with in fp32 (tiledsl.compile stood in for)."""
    built = {}
    monkeypatch.setattr(context.STATE, "programs", {})
    monkeypatch.setattr(tiledsl, "compile", lambda source, heap, **options: built.setdefault("options", options))
    compiled(HeapEntry(_Heap(), "default", emulated=emulated), "ag_gemm", torch.float32)
    return {k: built["options"][k] for k in ("BM", "BN", "BK")}


def test_fp32_blocks_are_fitted_to_the_shared_memory_of_the_device_the_heap_is_on(monkeypatch):
    """ag_gemm's [128, 64] x [64, 256] bf16 blocks need 320 KB in fp32: BN halves to 128 for Hopper's
    220 KB of stages; the 156 KB an A100's 163 KB leaves takes BN to 64 too, BK staying one of its
    choices (64 or 128: the program refuses a build at 32)."""
    _stand_in(monkeypatch, gpus.DEFAULT.shared_bytes)
    assert _fp32_consts(monkeypatch, emulated=False) == {"BM": 128, "BN": 128, "BK": 64}
    _stand_in(monkeypatch, A100_SHARED)
    assert _fp32_consts(monkeypatch, emulated=False) == {"BM": 128, "BN": 64, "BK": 64}
    # emulated, the default GPU's, whatever device torch sees
    assert _fp32_consts(monkeypatch, emulated=True) == {"BM": 128, "BN": 128, "BK": 64}


def test_the_fitted_blocks_are_what_the_launch_on_that_device_accepts():
    """What fitted_blocks picks for a GPU, kernel_options takes there; Hopper's pick is refused by name
    on the smaller GPU (the launcher raises it as a LaunchError before any kernel runs)."""
    smaller = gpus.GPU("stand-in GPU", "sm_90", 108, A100_SHARED)
    consts, choices = library_consts("ag_gemm")
    for gpu in (gpus.DEFAULT, smaller):
        spec = build_module(library_program("ag_gemm"), fitted_blocks(consts, 4, gpu, choices)).tds_SPEC
        assert kernel_options(spec, 4, gpu.shared_bytes)["num_stages"] >= 2
    hoppers = build_module(library_program("ag_gemm"), fitted_blocks(consts, 4)).tds_SPEC
    with pytest.raises(SharedMemoryError, match=r"mm: .* need 196608 bytes .* more than the 166912 a block"):
        kernel_options(hoppers, 4, smaller.shared_bytes)
