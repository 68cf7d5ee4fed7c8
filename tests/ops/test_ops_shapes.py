"""tiledsl.ops.shapes: size classes, TMA alignment, layouts to rows and back, zero-padded workspaces, and
the padded copies of weights that follow a weight's in-place updates."""
from __future__ import annotations

import pytest
import torch

from tiledsl.ops.shapes import (Buffers, Weights, aligned, flat_rows, matrix_rows, normalise_dim, padded, restore,
                                size_class, unpadded)


def test_size_classes_waste_at_most_an_eighth_and_keep_tile_multiples():
    for n in range(1, 5000):
        c = size_class(n)
        assert n <= c <= n + n / 8 + 1
        assert size_class(c) == c  # a class is its own class: exact fits stay exact
    assert size_class(4091, 128) == 4096        # M = 4091 * world: one tile of padding per rank
    assert size_class(5, 16) == 16 and size_class(33, 16) == 48
    assert len({size_class(n) for n in range(1, 1 << 16)}) < 8 * 17  # few sizes reach a program


def test_rows_are_aligned_to_16_bytes_per_dtype():
    assert aligned(32001, torch.bfloat16) == 32008   # the vocabulary that failed with "strides must be 16-byte aligned"
    assert aligned(32001, torch.float32) == 32004
    assert aligned(4096, torch.float16) == 4096


def test_layouts_round_trip_through_rows():
    x = torch.randn(3, 5, 7)
    rows, moved = matrix_rows(x, 1)
    assert rows.shape == (15, 7) and moved == (5, 3, 7)
    assert torch.equal(restore(rows, moved, 1), x)
    rows, moved = flat_rows(x, -1)
    assert rows.shape == (7, 15) and torch.equal(restore(rows, moved, 2), x)
    with pytest.raises(ValueError, match="last dimension is the one multiplied"):
        matrix_rows(x, -1)
    with pytest.raises(ValueError, match="out of range"):
        normalise_dim(3, 3)


def test_padding_is_zero_and_a_fitting_tensor_is_not_copied():
    buffers = Buffers()
    x = torch.randn(1, 5, 7)
    p = padded(x, (1, 16, 8), torch.float32, buffers, "test")
    assert p.shape == (1, 16, 8) and torch.equal(p[:, :5, :7], x)
    assert p[:, 5:].abs().sum() == 0 and p[:, :, 7:].abs().sum() == 0
    fitting = torch.randn(1, 16, 8)
    assert padded(fitting, (1, 16, 8), torch.float32, buffers, "test") is fitting
    assert padded(x, (1, 16, 8), torch.float32, buffers, "test") is p  # the workspace is reused
    assert torch.equal(unpadded(p, (1, 5, 7)), x)


def test_a_padded_weight_is_copied_once_and_again_after_an_in_place_update():
    weights = Weights()
    w = torch.randn(45, 37)  # stored [N, K] as nn.Linear does; passed as w.t()
    first = weights.get(w.t(), (40, 48), torch.float32)
    assert torch.equal(first[:37, :45], w.t()) and first[37:].abs().sum() == 0
    assert weights.get(w.t(), (40, 48), torch.float32) is first       # a new view of the same weight
    with torch.no_grad():
        w.mul_(2)                                                      # an optimizer step
    second = weights.get(w.t(), (40, 48), torch.float32)
    assert second is not first and torch.equal(second[:37, :45], w.t())
    with torch.inference_mode():
        frozen = torch.randn(37, 45)
    assert torch.equal(weights.get(frozen, (40, 48), torch.float32)[:37, :45], frozen)  # no version: copied
