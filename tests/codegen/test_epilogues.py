"""A matrix product followed by operands that broadcast against its block (a bias row, a [1, N] bias, a
row scale [M, 1], a scalar): the usual MLP epilogue. Each builds, runs on an emulated rank and matches
torch computed from what the line says, and compiles for sm_90."""
from __future__ import annotations

import pytest
import torch

from tiledsl.runtime.emulate import run_ranks

# what each epilogue is meant to compute, from A @ B and the operand (torch's own broadcasting)
EPILOGUES = {
    "bias_row": ("in  b : f32[N]", "gelu(A[i*BM : +BM, :] @ B[:, j*BN : +BN] + b[j*BN : +BN])", (lambda M, N: (N,)),
                 lambda p, b: torch.nn.functional.gelu(p + b)),
    "bias_1xn": ("in  b : f32[1, N]", "A[i*BM : +BM, :] @ B[:, j*BN : +BN] + b[0 : +1, j*BN : +BN]",
                 (lambda M, N: (1, N)), lambda p, b: p + b),
    "row_scale": ("in  b : f32[M, 1]", "silu(A[i*BM : +BM, :] @ B[:, j*BN : +BN] * b[i*BM : +BM, 0 : +1])",
                  (lambda M, N: (M, 1)), lambda p, b: torch.nn.functional.silu(p * b)),
    "scalar": ("in  b : f32[1]", "A[i*BM : +BM, :] @ B[:, j*BN : +BN] * b[0]", (lambda M, N: (1,)),
               lambda p, b: p * b[0]),
}
M, K, N = 96, 64, 80  # ragged: the last tile of each dimension is cut short


def source(name: str) -> str:
    declaration, value, _, _ = EPILOGUES[name]
    return (f"program {name}\nparam M, K, N\nconst BM = 64, BN = 64\nin  A : f32[M, K]\nin  B : f32[K, N]\n"
            f"{declaration}\nout C : f32[M, N]\n"
            f"tile mm[i in cdiv(M, BM), j in cdiv(N, BN)]: C[i*BM : +BM, j*BN : +BN] = {value}\n")


def _rank(heap):
    import tiledsl
    torch.manual_seed(0)
    out = {}
    for name, (_, _, shape, meaning) in EPILOGUES.items():
        a, b, bias = torch.randn(M, K), torch.randn(K, N), torch.randn(*shape(M, N))
        c = torch.full((M, N), float("nan"))
        tiledsl.compile(source(name), heap, emulated=True)(a, b, bias, c)
        want = meaning(a.double() @ b.double(), bias.double())
        out[name] = ((c.double() - want).abs().max() / want.abs().max()).item()
    heap.close()
    return out


@pytest.mark.emulated
def test_a_product_with_a_broadcast_epilogue_matches_torch():
    errors, = run_ranks(_rank, 1, timeout_s=300)
    assert errors == {name: pytest.approx(0, abs=1e-5) for name in EPILOGUES}, errors


@pytest.mark.aot
@pytest.mark.parametrize("name", ["bias_row", "row_scale", "scalar"])
def test_a_product_with_a_broadcast_epilogue_compiles_for_sm90(name):
    from tiledsl.api import build_module
    from tiledsl.codegen.aot import report
    row = report(build_module(source(name)), "sm_90")
    assert row.cubin_bytes > 0 and row.shared_bytes <= 227 * 1024
