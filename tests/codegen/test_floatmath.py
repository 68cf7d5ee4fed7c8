"""fp8 and bf16 rounding in kernels (tiledsl/runtime/floatmath.py) agrees with torch's casts on every
value class: every midpoint between neighbouring e4m3 (bf16) values (ties to even), values that round
up into the next binade (where Triton's interpreter's own e4m3 cast carries wrongly; its bf16 cast
truncates), subnormals, values past e4m3's 448 (saturated) and random values over the whole range; run
in Triton's interpreter, as emulated ranks run it. The GPU build of the same helpers is compiled for
sm_90 by test_aot.py (a program of each)."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

KERNEL = '''
import triton
import triton.language as tl
from tiledsl.runtime import floatmath as tds_float


@triton.jit
def rounded(x, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tds_float.round_e4m3(tl.load(x + i, mask=i < n)).to(tl.float8e4nv), mask=i < n)


@triton.jit
def rounded_bf16(x, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tds_float.round_bf16(tl.load(x + i, mask=i < n)), mask=i < n)
'''
BLOCK = 1024


def values() -> torch.Tensor:
    generator = torch.Generator().manual_seed(8)
    finite = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    midpoints = (finite[:-1] + finite[1:]) / 2
    just_below = midpoints * (1 - 2.0 ** -20)
    just_above = midpoints * (1 + 2.0 ** -20)
    random = torch.randn(20000, generator=generator) * 2.0 ** (torch.rand(20000, generator=generator) * 24 - 12)
    beyond = torch.tensor([448.5, 464.0, 480.0, 1e6, 3.4e38])
    every = torch.cat([finite, midpoints, just_below, just_above, random, beyond])
    return torch.cat([every, -every]).float()


def _rank(heap, path: str, x, bf16: bool = False):
    spec = importlib.util.spec_from_file_location("floatmath_kernel", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["floatmath_kernel"] = module
    spec.loader.exec_module(module)
    x = torch.from_numpy(x)
    out = torch.empty(x.numel(), dtype=torch.float32 if bf16 else torch.float8_e4m3fn)
    (module.rounded_bf16 if bf16 else module.rounded)[(-(-x.numel() // BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)
    return out.float().numpy()


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    path = tmp_path_factory.mktemp("floatmath") / "floatmath_kernel.py"
    path.write_text(KERNEL)
    return os.fspath(path)


def _run(kernel, x, bf16=False):
    from tiledsl.runtime.emulate import run_ranks
    got, = run_ranks(_rank, 1, kernel, x.numpy(), bf16, timeout_s=300)
    return torch.from_numpy(got)


@pytest.mark.emulated
def test_round_e4m3_then_cast_is_torchs_cast_on_every_value_class(kernel):
    x = values()
    want = x.clamp(-448, 448).to(torch.float8_e4m3fn).float()  # torch's cast makes NaN past 448; e4m3 saturates
    got = _run(kernel, x)
    wrong = got != want
    assert not wrong.any(), f"{int(wrong.sum())} values differ, e.g. {x[wrong][:4].tolist()} -> " \
                            f"{got[wrong][:4].tolist()}, not {want[wrong][:4].tolist()}"


@pytest.mark.emulated
def test_round_bf16_is_torchs_cast_on_every_value_class(kernel):
    generator = torch.Generator().manual_seed(16)
    finite = torch.arange(0, 2 ** 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    finite = finite[torch.isfinite(finite)]
    midpoints = ((finite[:-1] + finite[1:]) / 2)[::3]  # exact in float32: bf16 keeps 8 of its 24 bits
    finite = finite[::7]
    random = torch.randn(20000, generator=generator) * 2.0 ** (torch.rand(20000, generator=generator) * 60 - 30)
    x = torch.cat([finite, midpoints, random, torch.tensor([3.4e38, float("inf")])])
    x = torch.cat([x, -x])
    got = _run(kernel, x, bf16=True)
    want = x.to(torch.bfloat16).float()
    wrong = got != want
    assert not wrong.any(), f"{int(wrong.sum())} values differ, e.g. {x[wrong][:4].tolist()} -> " \
                            f"{got[wrong][:4].tolist()}, not {want[wrong][:4].tolist()}"
