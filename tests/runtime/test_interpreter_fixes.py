"""The fix to Triton's interpreter that every emulated rank installs: a load masked by a block
condition and a scalar one (a looked-up row `E[ids[t], :]` in range) reads as on the GPU, where the
interpreter used to refuse it ("mask has unsupported dtype")."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

LOOKUP = textwrap.dedent("""
    import torch, triton, triton.language as tl
    from tiledsl.runtime import interpreter_fixes
    interpreter_fixes.install()

    @triton.jit
    def lookup(ids, E, Y, V, D, BLOCK: tl.constexpr):
        elems = tl.arange(0, BLOCK)
        row = tl.load(ids + 0)
        x = tl.load(E + row * D + elems, mask=(elems < D) & ((row >= 0) & (row < V)), other=0.0)
        tl.store(Y + elems, x, mask=elems < D)

    E, Y = torch.randn(11, 40), torch.zeros(40)
    lookup[(1,)](torch.tensor([3], dtype=torch.int32), E, Y, 11, 40, BLOCK=64)
    assert torch.equal(Y, E[3])
    lookup[(1,)](torch.tensor([11], dtype=torch.int32), E, Y, 11, 40, BLOCK=64)
    assert torch.equal(Y, torch.zeros(40))  # a row out of range reads nothing
""")


def test_a_block_mask_and_a_scalar_condition_mask_a_load_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", LOOKUP], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


PRODUCT = textwrap.dedent("""
    import torch, triton, triton.language as tl
    from tiledsl.runtime import interpreter_fixes
    interpreter_fixes.install()

    @triton.jit
    def product(X, Y, O, N: tl.constexpr):
        at = tl.arange(0, N)[:, None] * N + tl.arange(0, N)[None, :]
        tl.store(O + at, tl.dot(tl.load(X + at), tl.load(Y + at)))

    for dtype in (torch.bfloat16, torch.float16):
        x, y = torch.randn(32, 32).to(dtype), torch.randn(32, 32).to(dtype)
        out = torch.full((32, 32), float("nan"))
        product[(1,)](x, y, out, 32)
        want = x.double() @ y.double()   # the products of the 16-bit values are exact in float32
        assert (out.double() - want).abs().max() < 1e-4, (dtype, (out.double() - want).abs().max())
""")


def test_a_product_of_bfloat16_blocks_multiplies_their_values_in_the_interpreter():
    """triton-lang/triton#11584: without the fix the interpreter multiplies bfloat16 bit patterns."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", PRODUCT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
