"""The plain torch + collective path of each op, on rows (shapes.py turns any layout into rows): what
every fused program is measured against, and what serves a group or shape no program can."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

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


def flash_decode(q, k, v, lens, group, world: int) -> torch.Tensor:
    """Attention of one query token a sequence (q [B, H, D]) over a cache split along the sequence:
    this rank holds positions rank*C .. rank*C + C-1 (k, v [B, C, HKV, D]), valid below lens[b]. Each
    rank's attention over its share in float32 with its log-sum-exp, both all-gathered and merged; a
    sequence with no key anywhere gives 0, as the program does."""
    B, H, D = q.shape
    C, HKV = k.shape[1], k.shape[2]
    rank = dist.get_rank(group)
    scores = torch.einsum("bkgd,bkcd->bkgc", q.float().view(B, HKV, H // HKV, D),
                          k.float().permute(0, 2, 1, 3)) / math.sqrt(D)
    mine = torch.arange(C, device=q.device)[None, :] < (lens.to(torch.int64)[:, None] - rank * C)
    scores = scores.masked_fill(~mine[:, None, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)                          # -inf where this rank has no key
    weights = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)
    out = torch.einsum("bkgc,bkcd->bkgd", weights, v.float().permute(0, 2, 1, 3))
    part = torch.cat([out.reshape(B, H, D), lse.reshape(B, H, 1)], dim=-1)
    every = all_gather_rows(part, group, world).view(world, B, H, D + 1)
    lses = every[..., D]
    scale = torch.exp(lses - lses.max(dim=0).values).nan_to_num(0.0)  # [world, B, H]
    total = (scale.unsqueeze(-1) * every[..., :D]).sum(dim=0)
    return (total / scale.sum(dim=0).unsqueeze(-1).clamp_min(torch.finfo(torch.float32).tiny)).to(q.dtype)


def sp_attention(q, k, v, group, world: int) -> torch.Tensor:
    """Causal attention of this rank's query pieces over a sequence sharded zig-zag: 2 * world pieces of
    P tokens, rank r holding pieces r and 2*world-1-r (q [B, 2, P, H, D], k and v [B, 2, P, HKV, D]),
    query head h on KV head h // (H / HKV). K and V are all-gathered and put in sequence order, then
    torch's attention in a formulation that keeps its fastest backend (cuDNN on an H200): an explicit
    mask turns cuDNN off. At world 1 the two pieces are the sequence in order: one causal call over
    it. Beyond, each query piece attends causally to its own piece and, without a mask, to the pieces
    before it, the two merged by their log-sum-exps (`sdpa_lse`)."""
    B, _, P, H, D = q.shape
    HKV = k.shape[3]
    if world == 1:  # pieces 0 and 1: the sequence in order, in torch's [B, S, heads, D] layout
        out = F.scaled_dot_product_attention(q.reshape(B, 2 * P, H, D).transpose(1, 2),
                                             k.reshape(B, 2 * P, HKV, D).transpose(1, 2),
                                             v.reshape(B, 2 * P, HKV, D).transpose(1, 2), is_causal=True,
                                             enable_gqa=H != HKV)
        return out.transpose(1, 2).reshape(q.shape)
    rank = dist.get_rank(group)
    gathered = [all_gather_rows(t, group, world).view(world, B, 2, P, HKV, D) for t in (k, v)]
    order = sorted((s + z * (2 * world - 1 - 2 * s), s, z) for s in range(world) for z in range(2))
    keys, values = (torch.cat([t[s, :, z] for _, s, z in order], dim=1).transpose(1, 2)  # [B, HKV, 2wP, D]
                    for t in gathered)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    for z in range(2):
        piece = rank + z * (2 * world - 1 - 2 * rank)
        query = q[:, z].transpose(1, 2)
        own = slice(piece * P, (piece + 1) * P)
        mine, mine_lse = sdpa_lse(query, keys[:, :, own], values[:, :, own], causal=True)
        if piece:
            before, before_lse = sdpa_lse(query, keys[:, :, :piece * P], values[:, :, :piece * P], causal=False)
            top = torch.maximum(mine_lse, before_lse)
            a, b = torch.exp(mine_lse - top), torch.exp(before_lse - top)
            mine = (mine.float() * a[..., None] + before.float() * b[..., None]) / (a + b)[..., None]
        out[:, z] = mine.transpose(1, 2).to(q.dtype)
    return out


# which aten attention that returns its log-sum-exp runs on each kind of device, found at its first call:
# cuDNN's, then flash's (the natural log-sum-exp [B, H, L] in float32 both), each with the KV heads as
# they are, else repeated to the query heads; then plain float32 matmuls (a CPU has neither)
_LSE_KERNELS: dict = {}


def sdpa_lse(q, k, v, causal: bool):
    """(softmax(q k^T / sqrt(D)) v, its natural log-sum-exp [B, H, L] float32) with torch's fastest
    attention that returns one; a causal call is on a square block (its own piece)."""
    def cudnn(q, k, v, causal):
        return torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False)[:2]

    def flash(q, k, v, causal):
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)[:2]

    def repeated(kernel):
        return lambda q, k, v, causal: kernel(q, *(t.repeat_interleave(q.shape[1] // t.shape[1], dim=1)
                                                   for t in (k, v)), causal)

    def matmuls(q, k, v, causal):
        k, v = (t.float().repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        scores = q.float() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if causal:
            scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device)
                                        .triu(1), float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        return (torch.softmax(scores, dim=-1) @ v).to(q.dtype), lse
    known = _LSE_KERNELS.get(q.device.type)
    for kernel in [known] if known else [cudnn, repeated(cudnn), flash, repeated(flash), matmuls]:
        try:
            out, lse = kernel(q, k, v, causal)
        except (RuntimeError, NotImplementedError):
            continue
        if lse.shape[:3] == q.shape[:3] and lse.numel() == q.shape[:3].numel():  # [B, H, L] or [B, H, L, 1]
            _LSE_KERNELS.setdefault(q.device.type, kernel)
            return out, lse.float().reshape(q.shape[:3])
    raise RuntimeError("no torch attention kernel here returns its log-sum-exp")


def _expert_rows(ids, experts: int, group, world: int):
    """(order, sent, got): this rank's (token, k) pairs sorted by global expert (stable: token by token
    within one, tiledsl's arrival()), the rows it sends to each expert, and the rows each rank sends
    to each of this rank's experts (got[s * E + e]), exchanged with all_to_all_single."""
    from tiledsl.runtime.issue import IndexOutOfRange
    flat = ids.reshape(-1).long()
    if flat.numel() and not 0 <= int(flat.min()) <= int(flat.max()) < experts * world:  # this path syncs anyway
        bad = int(flat[(flat < 0) | (flat >= experts * world)][0])
        raise IndexOutOfRange(f"rank {dist.get_rank(group)}: expert id {bad} is not among the group's "
                              f"{experts * world} experts (0 .. {experts * world - 1})")
    sent = torch.bincount(flat, minlength=experts * world)
    got = torch.empty_like(sent)
    dist.all_to_all_single(got, sent, group=group)
    return torch.argsort(flat, stable=True), sent, got


def _places(got, experts: int):
    """For rows received grouped by source rank, then expert, then arrival: (expert, source, slot)."""
    which = torch.repeat_interleave(torch.arange(got.numel(), device=got.device), got)
    starts = torch.cumsum(got, 0) - got
    return which % experts, which // experts, torch.arange(which.numel(), device=got.device) - starts[which]


def moe_dispatch(x, ids, experts: int, capacity: int, group, world: int):
    """(recv [E, world, C, H], count [E, world] int32) as moe_dispatch.tds delivers them, through
    all_to_all_single with the splits exchanged first (a host synchronisation)."""
    from tiledsl.runtime.issue import CapacityExceeded
    K = ids.shape[1]
    order, sent, got = _expert_rows(ids, experts, group, world)
    send_sizes, recv_sizes = sent.view(world, experts).sum(1).tolist(), got.view(world, experts).sum(1).tolist()
    rows = x.new_empty((sum(recv_sizes), x.shape[1]))
    dist.all_to_all_single(rows, x[order // K].contiguous(), recv_sizes, send_sizes, group=group)
    count = got.view(world, experts).t().to(torch.int32)
    if int(count.max()) > capacity:
        e, s = divmod(int(count.argmax()), world)
        raise CapacityExceeded(f"rank {dist.get_rank(group)}: {int(count[e, s])} rows from rank {s} for local "
                               f"expert {e}, above the capacity {capacity}")
    recv = x.new_zeros((experts, world, capacity, x.shape[1]))
    recv[_places(got, experts)] = rows
    return recv, count


def moe_combine(y, ids, w, group, world: int):
    """out [T, H] = sum over k of w[t, k] * (the expert output y holds for (t, k)): the rows go back to
    their tokens' ranks through all_to_all_single (splits exchanged first), weighted in float32."""
    experts, T, K = y.shape[0], ids.shape[0], ids.shape[1]
    order, sent, got = _expert_rows(ids, experts, group, world)
    back = y.new_empty((T * K, y.shape[-1]))
    dist.all_to_all_single(back, y[_places(got, experts)].contiguous(), sent.view(world, experts).sum(1).tolist(),
                           got.view(world, experts).sum(1).tolist(), group=group)
    out = torch.zeros((T, y.shape[-1]), dtype=torch.float32, device=y.device)
    out.index_add_(0, order // K, back.float() * w.reshape(-1)[order, None].float())
    return out.to(y.dtype)
