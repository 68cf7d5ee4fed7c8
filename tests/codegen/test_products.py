"""Tiles holding several matrix products (codegen/products.py): SwiGLU's `silu(X @ Wg) * (X @ Wu)`, a sum
of two products, one product read twice. Products contracting a whole K are accumulated over one loop of
K steps (the last one ragged here: K = 150 against steps of 64); others are lowered as written. Each runs
on an emulated rank against torch computed from what the line says, and the SwiGLU tile compiles for
sm_90 at a model's blocks within the SM's shared memory."""
from __future__ import annotations

import pytest
import torch

from tiledsl.runtime.emulate import run_ranks

M, K, N, K2 = 40, 150, 48, 24

# name: (the tile's value, the inputs' shapes, what it means)
CASES = {
    "swiglu": ("silu(A[i*BM : +BM, :] @ B[:, j*BN : +BN]) * (A[i*BM : +BM, :] @ D[:, j*BN : +BN])",
               {"A": (M, K), "B": (K, N), "D": (K, N)},
               lambda t: torch.nn.functional.silu(t["A"] @ t["B"]) * (t["A"] @ t["D"])),
    "two_sums": ("A[i*BM : +BM, :] @ B[:, j*BN : +BN] + E[i*BM : +BM, :] @ D[:, j*BN : +BN]",
                 {"A": (M, K), "B": (K, N), "E": (M, K), "D": (K, N)},
                 lambda t: t["A"] @ t["B"] + t["E"] @ t["D"]),
    "same_twice": ("(A[i*BM : +BM, :] @ B[:, j*BN : +BN]) * (A[i*BM : +BM, :] @ B[:, j*BN : +BN])",
                   {"A": (M, K), "B": (K, N)}, lambda t: (t["A"] @ t["B"]) ** 2),
    # different K: not split, each operand loaded whole along its K
    "two_ks": ("A[i*BM : +BM, :] @ B[:, j*BN : +BN] - F[i*BM : +BM, :] @ G[:, j*BN : +BN]",
               {"A": (M, K), "B": (K, N), "F": (M, K2), "G": (K2, N)},
               lambda t: t["A"] @ t["B"] - t["F"] @ t["G"]),
    # one product, an operand transposed (a linear layer's weight, [N, K]; the left one read as K x M):
    # lowered as a block, with the same K loop
    "linear": ("A[i*BM : +BM, :] @ W[j*BN : +BN, :].T", {"A": (M, K), "W": (N, K)}, lambda t: t["A"] @ t["W"].T),
    "left_t": ("T[:, i*BM : +BM].T @ B[:, j*BN : +BN]", {"T": (K, M), "B": (K, N)}, lambda t: t["T"].T @ t["B"]),
}
DIMS = {M: "M", K: "K", N: "N", K2: "K2"}


def source(name: str, dtype: str = "f32", blocks: str = "BM = 16, BN = 32") -> str:
    value, shapes, _ = CASES[name]
    inputs = "".join(f"in  {t} : {dtype}[{', '.join(DIMS[d] for d in shape)}]\n" for t, shape in shapes.items())
    params = ", ".join(dict.fromkeys(DIMS[d] for shape in shapes.values() for d in shape))
    return (f"program {name}\nparam {params}\nconst {blocks}\n{inputs}out C : {dtype}[M, N]\n"
            f"tile mm[i in cdiv(M, BM), j in cdiv(N, BN)]: C[i*BM : +BM, j*BN : +BN] = {value}\n")


def _rank(heap):
    import tiledsl
    torch.manual_seed(0)
    errors = {}
    for name, (_, shapes, meaning) in CASES.items():
        tensors = {t: torch.randn(*shape) for t, shape in shapes.items()}
        c = torch.full((M, N), float("nan"))
        tiledsl.compile(source(name), heap, emulated=True)(*tensors.values(), c)
        want = meaning({t: v.double() for t, v in tensors.items()})
        errors[name] = ((c.double() - want).abs().max() / want.abs().max()).item()
    heap.close()
    return errors


@pytest.mark.emulated
def test_tiles_with_several_products_match_torch():
    errors, = run_ranks(_rank, 1, timeout_s=300)
    assert errors == {name: pytest.approx(0, abs=1e-5) for name in CASES}, errors


def test_whole_k_products_share_one_k_loop_and_their_common_operand():
    from tiledsl.pipeline import run
    code = run(source("swiglu"), until="module").module
    assert code.count("for tds_kstep in range(0, tl.cdiv(K, 64))") == 1, code
    assert code.count("tl.load(A + ") == 1, code   # X of SwiGLU, loaded once a step for both products
    assert code.count("tl.dot(") == 2, code
    for single in ("linear", "left_t"):  # one product, an operand transposed: the same loop, no whole-K load
        code = run(source(single), until="module").module
        assert code.count("for tds_kstep in range(0, tl.cdiv(K, 64))") == 1 and code.count("tl.dot(") == 1, code
    unsplit = run(source("two_ks"), until="module").module
    assert "tds_kstep" not in unsplit            # products over different K are lowered as written


@pytest.mark.aot
def test_swiglu_at_model_blocks_compiles_for_sm90_within_shared_memory():
    from tiledsl.api import build_module
    from tiledsl.codegen.aot import report
    row = report(build_module(source("swiglu", "bf16", "BM = 128, BN = 128")), "sm_90")
    assert row.cubin_bytes > 0 and row.shared_bytes <= 227 * 1024, row


@pytest.mark.aot
def test_a_linear_layer_with_its_weight_transposed_compiles_for_sm90_within_shared_memory():
    """Issue 24, bug 8: `A[i*BM : +BM, :] @ W[j*BN : +BN, :].T` loaded K whole (4 MB of shared memory)."""
    from tiledsl.api import build_module
    from tiledsl.codegen.aot import report
    row = report(build_module(source("linear", "bf16", "BM = 128, BN = 128")), "sm_90")
    assert row.cubin_bytes > 0 and row.shared_bytes <= 227 * 1024, row
