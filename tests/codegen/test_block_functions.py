"""Functions in block tiles (a name a line): a row function of a local name gets its row length, and a
size kept an integer for index arithmetic enters float32 math as a float (tl.math.sqrt_rn and div_rn
take fp32 operands only; the interpreter refused int32)."""
from __future__ import annotations

from tiledsl.pipeline import run

RMSNORM_OF_A_NAME = """program add_rmsnorm
param T, D
const BT = 2
in  X : f32[T, D]
in  W : f32[D]
out Y : f32[T, D]

tile t[i in cdiv(T, BT)]:
    h = X[i*BT : +BT, :] * 2 + 1
    Y[i*BT : +BT, :] = rmsnorm(h, W)
"""

SQRT_OF_A_PARAM = """program scores
param S, D
const BQ = 16
in  Q : f32[S, D]
in  K : f32[S, D]
out P : f32[S, S]

tile t[i in cdiv(S, BQ)]:
    s = (Q[i*BQ : +BQ, :] @ K.T) / sqrt(D)
    P[i*BQ : +BQ, :] = s / D
"""


def _tile(source: str) -> str:
    module = run(source).module
    return module.split("def tds_tile_t(")[1].split("\n@triton.jit")[0]


def test_rmsnorm_of_a_local_name_divides_by_its_row_length_and_masks_the_padding():
    tile = _tile(RMSNORM_OF_A_NAME)
    assert "/ None" not in tile and "axis=1) / D + 1e-6)" in tile, tile
    # h = 2x + 1 is 1 past the row, not 0: the sum of squares must not count it
    assert "tds_masked = tl.where(" in tile and "tds_rmsnorm = tds_masked * tl.rsqrt(" in tile, tile


def test_a_param_enters_sqrt_and_division_as_float32():
    tile = _tile(SQRT_OF_A_PARAM)
    assert "tl.math.sqrt_rn((D).to(tl.float32))" in tile, tile
    assert "tl.math.div_rn(s, (D).to(tl.float32))" in tile, tile
