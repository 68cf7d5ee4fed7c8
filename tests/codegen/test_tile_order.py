"""The order product tiles run in, as the generated module gives it to the launcher: the tiles on the
SMs at one time (a wave) share their operands through L2. Mixtral's grouped GEMM ran at 0.74x of
torch._grouped_mm (2026-12-01, one H200) while each wave read 8 experts' weights for one row block."""
from __future__ import annotations

from pathlib import Path

import pytest

from tiledsl.api import build_module

ROOT = Path(__file__).resolve().parents[2]
WAVE = 132  # SMs of an H200: one program each


def wave_footprint(path: str, sizes: dict, tile_of, rank: int = 0, world: int = 1):
    """Per wave of `tile_of(instance number)` tuples (batch, row block, column block): the batches,
    row blocks and column blocks it touches."""
    module = build_module(ROOT / path)
    env = {**module.tds_SPEC.consts, **sizes, "rank": rank, "world": world}
    order = module.tds_SPEC.orders(env)["mm"]
    waves = [order[at:at + WAVE] for at in range(0, len(order), WAVE)]
    return env, [[tile_of(env, t) for t in wave] for wave in waves]


def group_gemm_tile(env, t):
    rows, cols = -(-env["C"] // env["BM"]), -(-env["N"] // env["BN"])
    return t // (rows * cols), t // cols % rows, t % cols


@pytest.mark.parametrize("experts, rows", [(8, 2048), (64, 768), (60, 1024)])
def test_a_grouped_gemm_wave_works_on_as_few_experts_as_it_can(experts, rows):
    """Mixtral (8 experts, 2048 rows each at 8192 tokens top-2), DeepSeek-MoE's and Qwen1.5-MoE's
    shapes: a wave takes one expert's tiles after another (as few experts as its size allows, and one
    more where an expert ends mid-wave), and within an expert 8 row blocks across the columns."""
    env, waves = wave_footprint("programs/group_gemm.tds", {"E": experts, "C": rows, "N": 4096, "D": 14336},
                                group_gemm_tile)
    row_blocks, col_blocks = -(-rows // env["BM"]), -(-4096 // env["BN"])
    assert sorted(t for wave in waves for t in wave) == [
        (e, m, n) for e in range(experts) for m in range(row_blocks) for n in range(col_blocks)]
    per_expert = row_blocks * col_blocks
    for wave in waves:
        experts_in_wave = {e for e, _, _ in wave}
        assert len(experts_in_wave) <= -(-WAVE // per_expert) + 1, sorted(experts_in_wave)
        for e in experts_in_wave:
            assert len({m for f, m, _ in wave if f == e}) <= 2 * 8  # GROUP_M rows, twice where a group ends


def test_dense_gemm_order_is_unchanged_by_the_batch_rule():
    """gemm has no batch index: 8 row blocks across the columns, as measured at 99% of cuBLAS."""
    env, waves = wave_footprint("programs/gemm.tds", {"M": 8192, "N": 2048, "K": 28672},
                                lambda env, t: divmod(t, -(-env["N"] // env["BN"])))
    first = waves[0][:16]
    assert first == [(i, j) for j in range(2) for i in range(8)]
