"""What each program in programs/ computes, written directly in torch from its header comment.

One function per program: keyword arguments named as the program's in and inout tensors, each a list
of every rank's tensor (index = rank); the result maps each out and inout tensor to a list of every
rank's expected value. Nothing here reads a .tds file or imports tiledsl, so a mistake in the parser,
the schedule or the reference cannot appear both in a program's run and in its expectation.
Everything is computed in float64, whatever the inputs' dtype: the caller picks the tolerance."""
from __future__ import annotations

import torch
import torch.nn.functional as F

RMSNORM_EPS = 1e-6  # the epsilon allreduce_rmsnorm.tds passes to rmsnorm


def _wide(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.double() for t in tensors]


def _row_blocks(full: torch.Tensor, world: int) -> list[torch.Tensor]:
    """Rank r's block of rows, full[r*Ms : (r+1)*Ms]; the programs require M to divide by world."""
    rows = full.shape[0]
    assert rows % world == 0, f"{rows} rows do not split over {world} ranks"
    return list(full.split(rows // world))


def copy(X):
    return {"Y": [x.clone() for x in _wide(X)]}


def gemm(A, B):
    return {"C": [a @ b for a, b in zip(_wide(A), _wide(B), strict=True)]}


def allgather(X):
    gathered = torch.cat(_wide(X))
    return {"Y": [gathered.clone() for _ in X]}


def reduce_scatter(X):
    return {"Y": _row_blocks(sum(_wide(X)), len(X))}


def allreduce(X):
    total = sum(_wide(X))
    return {"X": [total.clone() for _ in X]}


def allreduce_two_shot(X):
    return allreduce(X)


def allreduce_out(X):
    """Out of place: every rank's Y is the sum, X is left as it was."""
    total = sum(_wide(X))
    return {"Y": [total.clone() for _ in X]}


def ag_gemm(A, B):
    """C = all_gather(A) @ B, with each rank's own B (a column shard of the weight)."""
    gathered = torch.cat(_wide(A))
    return {"C": [gathered @ b for b in _wide(B)]}


def ag_gemm_push(A, B):
    return ag_gemm(A, B)


def gemm_rs(A, B):
    """A and B hold each rank's shard of the reduction dimension; rank r keeps row block r of the sum."""
    total = sum(a @ b for a, b in zip(_wide(A), _wide(B), strict=True))
    return {"C": _row_blocks(total, len(A))}


def gemm_rs_ce(A, B):
    return gemm_rs(A, B)


def gemm_rs_pull(A, B):
    return gemm_rs(A, B)


def gemm_rs_push(A, B):
    return gemm_rs(A, B)


def gemm_ar(A, B):
    """A row-parallel linear layer: every rank ends with the whole sum of the ranks' products."""
    total = sum(a @ b for a, b in zip(_wide(A), _wide(B), strict=True))
    return {"C": [total.clone() for _ in A]}


def allreduce_rmsnorm(X, R, W):
    """H = (sum over ranks of X) + R; R <- H; Y = rmsnorm(H) with this rank's weight W."""
    total = sum(_wide(X))
    hidden = [total + r for r in _wide(R)]
    normed = [F.rms_norm(h, (h.shape[-1],), w, eps=RMSNORM_EPS) for h, w in zip(hidden, _wide(W), strict=True)]
    return {"R": hidden, "Y": normed}


# the two-level programs compute what their one-level counterparts do, on any number of nodes
def hier_allgather(X):
    return allgather(X)


def hier_reduce_scatter(X):
    return reduce_scatter(X)


def hier_allreduce(X):
    return allreduce(X)


def hier_ag_gemm(A, B):
    return ag_gemm(A, B)


def hier_gemm_rs(A, B):
    return gemm_rs(A, B)


EXPECTATIONS = {f.__name__: f for f in (
    copy, gemm, allgather, reduce_scatter, allreduce, allreduce_two_shot, allreduce_out, ag_gemm, ag_gemm_push,
    gemm_rs, gemm_rs_ce, gemm_rs_pull, gemm_rs_push, gemm_ar, allreduce_rmsnorm,
    hier_allgather, hier_reduce_scatter, hier_allreduce, hier_ag_gemm, hier_gemm_rs)}
