"""Integer division and modulo mean in a kernel exactly what they mean to the checker and the reference
(Python's floor `//` and `%`), for every sign: random affine index maps, printed by the one printer,
evaluated three ways: sympy (the meaning), host code (what the checker and the launcher run) and a
kernel in Triton's interpreter (what the GPU runs)."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import sympy
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tiledsl.schedule.intcode import code

I = sympy.Symbol("i", integer=True, nonnegative=True)     # an index: a block of 0..15 in the kernel
J = sympy.Symbol("j", integer=True, nonnegative=True)     # an index passed as a scalar
N = sympy.Symbol("N", integer=True, positive=True)        # a size
LANES = 16
VALUES = {"j": 5, "N": 3}


def affine():
    """a*i + b*j + c*N + d with small coefficients of either sign."""
    coefficient = st.integers(-4, 4)
    return st.builds(lambda a, b, c, d: a * I + b * J + c * N + d, coefficient, coefficient, coefficient,
                     st.integers(-9, 9))


def divisors():
    return st.one_of(st.integers(1, 7).map(sympy.Integer), st.just(N), st.integers(1, 3).map(lambda k: k * N))


def maps():
    """What index maps are made of: floor divisions, modulos and ceilings of affine expressions, and
    sums and products of those."""
    leaf = st.one_of(
        st.builds(lambda e, d: sympy.floor(e / d), affine(), divisors()),
        st.builds(lambda e, d: sympy.Mod(e, d), affine(), divisors()),
        st.builds(lambda e, d: sympy.ceiling(e / d), affine(), divisors()),
        affine())
    return st.one_of(leaf, st.builds(lambda a, b: a + b, leaf, leaf), st.builds(lambda a, b: a * 2 - b, leaf, leaf),
                     st.builds(lambda a, b: sympy.floor(a / b), leaf, divisors()))


def meaning(expr, i: int) -> int:
    return int(expr.subs({I: i, J: VALUES["j"], N: VALUES["N"]}))


@settings(max_examples=300, deadline=None)
@given(maps())
@example(-sympy.floor(1 / N))   # printed `-1 // N` once: Python's unary minus binds tighter than `//`
def test_host_code_computes_what_sympy_means(expr):
    text = code(expr, kernel=False)
    for i in range(LANES):
        assert eval(text, {"min": min, "max": max}, {"i": i, **VALUES}) == meaning(expr, i), text


KERNEL = '''
import triton
import triton.language as tl
from tiledsl.runtime import intmath as tds_int


@triton.jit
def values(out, N, LANES: tl.constexpr):
    i = tl.arange(0, LANES)
    # j is a loop's index, as a tile's index is: the interpreter hands it over as a plain Python int
    # (whose `//` floors), while i is a tensor (whose `//` truncates, as on the GPU)
    for j in tl.range({j}, {j} + 1):
{stores}
'''


def _kernel_rank(heap, path: str, count: int):
    """In the interpreter: import the generated kernel and return what it stored."""
    spec = importlib.util.spec_from_file_location("intmath_kernel", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["intmath_kernel"] = module
    spec.loader.exec_module(module)
    out = torch.full((count * LANES,), -12345, dtype=torch.int32)
    module.values[(1,)](out, VALUES["N"], LANES=LANES)
    return out.tolist()


@pytest.mark.emulated
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(maps(), min_size=40, max_size=40))
# a scalar's negative floor division and modulo (found: the interpreter floors a loop index's `//`,
# and a correction for truncation stepped its quotient down twice)
@example([sympy.floor((-J - 1) / 2), sympy.Mod(-J - 1, 3), sympy.floor((I - J) / 3)] * 13 + [J])
def test_kernel_code_computes_what_sympy_means_for_every_sign(tmp_path_factory, exprs):
    from tiledsl.runtime.emulate import run_ranks
    stores = "\n".join(f"        tl.store(out + {n * LANES} + tl.arange(0, LANES), ({code(e)}) + 0 * i)"
                       for n, e in enumerate(exprs))
    path = tmp_path_factory.mktemp("intmath") / "intmath_kernel.py"
    path.write_text(KERNEL.replace("{stores}", stores).replace("{j}", str(VALUES["j"])))
    got, = run_ranks(_kernel_rank, 1, os.fspath(path), len(exprs), timeout_s=120)
    for n, expr in enumerate(exprs):
        want = [meaning(expr, i) for i in range(LANES)]
        assert got[n * LANES:(n + 1) * LANES] == want, (expr, code(expr))
