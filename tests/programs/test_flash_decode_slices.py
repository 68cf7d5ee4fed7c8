"""flash_decode's slices of a rank's cache (SLICES, a let of the program) follow the sizes: one wave of
part tiles on 132 SMs, at least MINKEYS (512) keys a slice, at most NS; the values the H200 run of
2026-12-01 found fastest where it measured them (8, 16 and 32 tried)."""
from functools import lru_cache
from pathlib import Path

import pytest

from tiledsl.api import build_module

PROGRAM = Path(__file__).resolve().parents[2] / "programs" / "flash_decode.tds"


@lru_cache(maxsize=None)
def _module(consts: tuple):
    return build_module(PROGRAM, dict(consts) or None)


def slices(B, C, HKV=8, H=64, world=2, **consts):
    module = _module(tuple(sorted(consts.items())))
    env = {"B": B, "H": H, "HKV": HKV, "C": C, "rank": 0, "world": world, **module.tds_SPEC.consts}
    return module.tds_SPEC.tensor_shapes(env)["Part"][0]


@pytest.mark.parametrize("C, want", [(1024, 2), (4096, 8), (16384, 16), (65536, 16), (131072, 16)])
def test_one_sequence_fills_one_wave_and_keeps_512_keys_a_slice(C, want):
    # measured: 8 best at 4K, 16 best at 16K-128K (32 slower: a second wave); 1K: the fewest tried (8) won
    assert slices(1, C) == want


@pytest.mark.parametrize("C", [1024, 65536, 131072])
def test_eight_sequences_already_fill_the_sms(C):
    assert slices(8, C) == 2  # 8 sequences x 8 KV heads x 2 = 128 part tiles


def test_ns_caps_the_slices_and_forces_them_with_the_chooser_opened():
    assert slices(1, 65536, NS=4) == 4
    assert slices(1, 4096, NS=32, MINKEYS=1, SMS=2**30) == 32


def test_a_tiny_cache_keeps_one_slice():
    assert slices(1, 13) == 1 and slices(64, 65536) == 1
