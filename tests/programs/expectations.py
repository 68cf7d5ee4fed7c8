"""What each program in programs/ computes, written directly in torch from its header comment.

One function per program: keyword arguments named as the program's in and inout tensors, each a list
of every rank's tensor (index = rank); the result maps each out and inout tensor to a list of every
rank's expected value, None for an out tensor a rank never writes (it keeps what the caller passed). Nothing here reads a .tds file or imports tiledsl, so a mistake in the parser,
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


# the rings pass blocks from rank to rank instead of reading every peer: the same collectives
def ring_allgather(X):
    return allgather(X)


def ring_reduce_scatter(X):
    return reduce_scatter(X)


# ---- work on some ranks only: None is a rank's tensor that nothing writes (it keeps what was passed) ------

def reduce_root(X):
    """Rank 0 ends with the sum over ranks; the other ranks' Y is not written."""
    return {"Y": [sum(_wide(X))] + [None] * (len(X) - 1)}


def chain_broadcast(X):
    """Every rank's X becomes rank 0's."""
    return {"X": [X[0].double().clone() for _ in X]}


# ---- attention: torch's scaled_dot_product_attention on the whole sequence --------------------------

def _sdpa(q, k, v, causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v per query head, [batch, tokens, heads, D] in and out; query head h
    reads KV head h // (q heads / KV heads), as enable_gqa does."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=causal, enable_gqa=True)
    return out.transpose(1, 2)


def _zigzag_whole(parts: list[torch.Tensor]) -> torch.Tensor:
    """[B, 2, P, heads, D] per rank, rank r holding pieces r and 2*world-1-r: [B, 2*world*P, heads, D]."""
    world = len(parts)
    pieces = [None] * (2 * world)
    for rank, part in enumerate(parts):
        pieces[rank], pieces[2 * world - 1 - rank] = part[:, 0], part[:, 1]
    return torch.cat(pieces, dim=1)


def sp_ag_attention(Q, K, V):
    """Causal attention over the sequence whose zig-zag pieces the ranks hold; each rank keeps its
    pieces of the output."""
    world = len(Q)
    out = _sdpa(_zigzag_whole(_wide(Q)), _zigzag_whole(_wide(K)), _zigzag_whole(_wide(V)), causal=True)
    pieces = out.split(Q[0].shape[2], dim=1)
    return {"O": [torch.stack([pieces[r], pieces[2 * world - 1 - r]], dim=1) for r in range(world)]}


def sp_ulysses(X, WQ, WK, WV, D=128, causal=True):
    """Attention over the whole sequence of every rank's tokens, each rank projecting its own tokens
    with its own weights; each rank keeps its tokens' outputs, [tokens, H * D]."""
    q, k, v = (torch.cat([x @ w for x, w in zip(_wide(X), _wide(W), strict=True)]) for W in (WQ, WK, WV))
    tokens = q.shape[0]
    q, k, v = (t.reshape(1, tokens, t.shape[1] // D, D) for t in (q, k, v))
    out = _sdpa(q, k, v, causal).reshape(tokens, -1)
    return {"O": list(out.split(tokens // len(X)))}


def flash_decode(Q, K, V, Lens):
    """One query token per sequence against the first Lens[b] keys of its cache, which rank r holds
    positions r*C .. r*C + C-1 of; every rank ends with the output. The query and the lengths are the
    same on every rank."""
    assert all(torch.equal(q, Q[0]) for q in Q) and all(torch.equal(n, Lens[0]) for n in Lens)
    q, k, v = Q[0].double(), torch.cat(_wide(K), dim=1), torch.cat(_wide(V), dim=1)
    rows = [_sdpa(q[b][None, None], k[b:b + 1, :int(n)], v[b:b + 1, :int(n)], causal=False)[0, 0]
            for b, n in enumerate(Lens[0])]
    out = torch.stack(rows)
    return {"O": [out.clone() for _ in Q]}


EXPECTATIONS = {f.__name__: f for f in (
    copy, gemm, allgather, reduce_scatter, allreduce, allreduce_two_shot, allreduce_out, ag_gemm, ag_gemm_push,
    gemm_rs, gemm_rs_ce, gemm_rs_pull, gemm_rs_push, gemm_ar, allreduce_rmsnorm, sp_ag_attention, sp_ulysses,
    flash_decode, hier_allgather, hier_reduce_scatter, hier_allreduce, hier_ag_gemm, hier_gemm_rs, ring_allgather,
    ring_reduce_scatter, reduce_root, chain_broadcast)}
