"""A product of float32 operands means IEEE fp32, as torch's does by default: the kernel asks tl.dot
for input_precision="ieee" there (Triton's default multiplies float32 as TF32, 10 bits of mantissa:
7.8e-4 from the reference on an H200), and leaves 16-bit products as they are."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tiledsl.pipeline import run

ROOT = Path(__file__).resolve().parents[2]
IEEE = 'input_precision="ieee"'

GEMM_F32 = """program gemm_f32
param M, K, N
const BM = 128, BN = 128
in  A : f32[M, K]
in  B : f32[K, N]
out C : f32[M, N]

tile mm[i in cdiv(M, BM), j in cdiv(N, BN)]: C[i*BM : +BM, j*BN : +BN] = A[i*BM : +BM, :] @ B[:, j*BN : +BN]
"""

# a tile written as a block: two products, one of two loaded f32 blocks, one of a computed block
# (float32 in the kernel) with a loaded f32 block
BLOCK_F32 = """program block_f32
param M
const BM = 64, D = 64
in  Q : f32[M, D]
in  W : f32[D, D]
out O : f32[M, D]

tile t[i in cdiv(M, BM)]:
    s = Q[i*BM : +BM, :] @ W
    O[i*BM : +BM, :] = exp(s) @ W
"""


def dots(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if "tl.dot(" in line]


@pytest.mark.parametrize("source", [GEMM_F32, BLOCK_F32], ids=["product", "block"])
def test_every_product_of_float32_operands_asks_for_ieee_precision(source):
    found = dots(run(source).module)
    assert found and all(IEEE in line for line in found), found


@pytest.mark.parametrize("name", ["gemm", "ag_gemm", "sp_ag_attention"])
def test_bf16_products_keep_tl_dot_as_it_was(name):
    path = ROOT / "programs" / f"{name}.tds"
    found = dots(run(path.read_text(), path=os.fspath(path.relative_to(ROOT))).module)
    assert found and not any(IEEE in line for line in found), found


def test_the_description_says_a_float32_product_is_ieee():
    plan = run(GEMM_F32, until="plan").plan
    assert "IEEE fp32" in plan.describe()


@pytest.mark.aot
def test_a_float32_product_compiled_for_sm90_uses_no_tf32(tmp_path):
    """`tiledsl build --arch sm_90` of an f32 GEMM: the PTX multiplies in fp32 (no TF32 mma)."""
    from tiledsl.api import build_module
    from tiledsl.codegen.aot import compile_kernel
    from tiledsl import cli
    path = tmp_path / "gemm_f32.tds"
    path.write_text(GEMM_F32)
    assert cli.main(["build", os.fspath(path), "-o", os.fspath(tmp_path / "out.py"), "--arch", "sm_90"]) == 0
    ptx = compile_kernel(build_module(path), "sm_90").asm["ptx"]
    assert re.search(r"\bfma\.rn\.f32\b", ptx)
    assert "tf32" not in ptx
