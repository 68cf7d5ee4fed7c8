"""What each corpus program is meant to compute, in plain torch on every rank's inputs.

One function per program, named as the program, with the interface of `tiledsl run --expect`:
`f(inputs, world, sizes)`, where inputs maps each in and inout tensor to the list of every rank's
float64 copy, and the result maps each out and inout tensor to the list of every rank's expected
value (None: the rank's copy must stay as passed). Written from each program's header comment, the
way the layer is computed in model code; nothing here imports tiledsl or reads a .tds file."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _every(value: torch.Tensor, world: int) -> list[torch.Tensor]:
    return [value.clone() for _ in range(world)]


def _rows(full: torch.Tensor, world: int, dim: int = 0) -> list[torch.Tensor]:
    """Rank r's block along `dim`, as torch.chunk splits a tensor-parallel activation."""
    assert full.shape[dim] % world == 0
    return list(full.chunk(world, dim=dim))


# ---- MLP epilogues on one rank --------------------------------------------------------------------

def swiglu(inputs, world, sizes):
    return {"H": [F.silu(g) * u for g, u in zip(inputs["G"], inputs["U"])]}


def bias_gelu(inputs, world, sizes):
    return {"H": [F.gelu(F.linear(x, w.T, b)) for x, w, b in zip(inputs["X"], inputs["W"], inputs["b"])]}


# ---- root collectives -----------------------------------------------------------------------------

def reduce_to_root(inputs, world, sizes):
    return {"Y": [sum(inputs["X"])] + [None] * (world - 1)}
