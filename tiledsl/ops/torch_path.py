"""The plain torch + collective path of each op, on rows (shapes.py turns any layout into rows): what
every fused program is measured against, and what serves a group or shape no program can."""
from __future__ import annotations

import torch
import torch.distributed as dist

# torch 2.13 renamed the tensor collectives (the old names warn); the GPU machine's 2.11 has only the old
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_rows(rows: torch.Tensor, group, world: int) -> torch.Tensor:
    out = rows.new_empty((world * rows.shape[0],) + tuple(rows.shape[1:]))
    _all_gather(out, rows.contiguous(), group=group)
    return out


def reduce_scatter_rows(rows: torch.Tensor, group, world: int) -> torch.Tensor:
    out = rows.new_empty((rows.shape[0] // world,) + tuple(rows.shape[1:]))
    _reduce_scatter(out, rows.contiguous(), group=group)
    return out


def all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    out = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, group=group)
    return out


def rmsnorm(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32, rounded once at the end, as the fused program computes it."""
    h32 = h.float()
    return (h32 * torch.rsqrt(h32.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()).to(h.dtype)


def all_reduce_rmsnorm(x, residual, weight, eps: float, group) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(sum over ranks of x + residual), sum over ranks of x + residual); the sum is rounded to
    the residual's dtype before the norm reads it, as the fused program and unfused torch both do."""
    h = all_reduce(x, group) + residual
    return rmsnorm(h, weight, eps), h
