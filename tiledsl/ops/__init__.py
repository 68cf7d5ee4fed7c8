"""The program library as functions a model calls, in the style of torch's symmetric-memory ops:

    y = tiledsl.ops.all_gather_matmul(x_shard, w)        # all_gather(x_shard) @ w, fused where faster
    z = tiledsl.ops.matmul_reduce_scatter(y, w2)         # reduce_scatter(y @ w2)

Each is a `torch.ops.tiledsl.*` custom op (torch.compile traces through it; an eager call on plain
tensors runs the op's body without torch's dispatcher, `torch_ops.call`), takes a process group
(default: the default group) and any fp16, bf16 or fp32 tensors of any shape torch's own ops accept,
and returns new tensors. The first call in each shape bucket measures the fused programs, their
tunables and the plain torch + collective path, and keeps the fastest (`explain()` shows the choice
and the times), cached on disk per GPU model, world and tiledsl version. Programs are compiled on
first use, per dtype. A group is served by a symmetric heap: opened on first use for the default
group on a GPU, or given with `use_heap(heap, group)` (emulated ranks pass theirs); a group with no
heap takes the torch path, and `explain()` says so.

Settings (`configure`, or the environment): tune=False / TILEDSL_OPS_TUNE=0 measures nothing (a cached
choice; else, for all_gather_matmul, matmul_reduce_scatter, matmul_all_reduce and all_reduce, the
program predicted fastest by tiledsl.predict at the call's world among those that need no padding,
`explain()` naming it "predicted" with each predicted time; else the rule: the preferred program where
the shape needs no padding, else torch);
timer= (timer(name, fn) -> seconds) replaces the CUDA-event timer, TILEDSL_OPS_TIMER=graph times
inside a CUDA graph; cache_dir= / TILEDSL_OPS_CACHE_DIR; check=True / TILEDSL_OPS_CHECK=1 checks
every call for a wait that gave up (by default a program's first call at each shape is checked, and
`check()` checks the rest)."""
from __future__ import annotations

import torch

from tiledsl.ops import torch_ops  # registers torch.ops.tiledsl.*; torch_ops.call runs them
from tiledsl.ops.context import STATE, Settings, group_name, use_heap, world_size
from tiledsl.ops.dispatch import LAST, explain, reset
from tiledsl.ops.timers import event_timer, graph_timer, wall_timer
from tiledsl.ops.tuning import Decision

__all__ = ["all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce", "all_reduce", "all_gather",
           "reduce_scatter", "all_reduce_rmsnorm", "flash_decode", "sp_attention", "moe_dispatch", "moe_combine",
           "use_heap", "configure", "explain", "decision", "check", "reset", "Decision", "event_timer",
           "graph_timer", "wall_timer"]


def all_gather_matmul(a_shard: torch.Tensor, b: torch.Tensor, group=None, *, gather_dim: int = 0,
                      impl: str | None = None, tune: bool | None = None) -> torch.Tensor:
    """all_gather(a_shard, along gather_dim) @ b: a column-parallel layer under sequence parallelism.

    a_shard [..., K] is this rank's shard (every rank's the same shape), b [K, N] (any layout: a
    weight stored [N, K] is passed as `w.t()`, and copied once into the layout the programs need)."""
    return torch_ops.call("all_gather_matmul", a_shard, b, group_name(group), gather_dim, impl, tune,
                          world_size(group))


def matmul_reduce_scatter(a: torch.Tensor, b: torch.Tensor, group=None, *, scatter_dim: int = 0,
                          impl: str | None = None, tune: bool | None = None) -> torch.Tensor:
    """reduce_scatter(a @ b, along scatter_dim): a row-parallel layer under sequence parallelism;
    a [..., K/world] and b [K/world, N] hold this rank's share of K."""
    return torch_ops.call("matmul_reduce_scatter", a, b, group_name(group), scatter_dim, impl, tune,
                          world_size(group))


def matmul_all_reduce(a: torch.Tensor, b: torch.Tensor, group=None, *, impl: str | None = None,
                      tune: bool | None = None) -> torch.Tensor:
    """all_reduce(a @ b): a row-parallel layer without sequence parallelism (decode)."""
    return torch_ops.call("matmul_all_reduce", a, b, group_name(group), impl, tune)


def all_reduce(x: torch.Tensor, group=None, *, impl: str | None = None, tune: bool | None = None) -> torch.Tensor:
    """The sum of x over the group's ranks, as a new tensor."""
    return torch_ops.call("all_reduce", x, group_name(group), impl, tune)


def all_gather(x: torch.Tensor, group=None, *, gather_dim: int = 0, impl: str | None = None,
               tune: bool | None = None) -> torch.Tensor:
    """Every rank's x, concatenated along gather_dim in rank order."""
    return torch_ops.call("all_gather", x, group_name(group), gather_dim, impl, tune, world_size(group))


def reduce_scatter(x: torch.Tensor, group=None, *, scatter_dim: int = 0, impl: str | None = None,
                   tune: bool | None = None) -> torch.Tensor:
    """This rank's block (along scatter_dim) of the sum of x over the group's ranks."""
    return torch_ops.call("reduce_scatter", x, group_name(group), scatter_dim, impl, tune, world_size(group))


def all_reduce_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, group=None, *,
                       eps: float = 1e-6, impl: str | None = None,
                       tune: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """h = all_reduce(x) + residual; returns (rmsnorm(h) * weight, h), the norm over the last
    dimension in float32: what follows a row-parallel attention or MLP block."""
    return torch_ops.call("all_reduce_rmsnorm", x, residual, weight, group_name(group), eps, impl, tune)


def flash_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor, group=None, *,
                 impl: str | None = None, tune: bool | None = None) -> torch.Tensor:
    """Decode attention over a KV cache split along the sequence over the group's ranks: q [B, H, D] one
    query token a sequence (the same on every rank), k and v [B, C, HKV, D] this rank's positions
    rank*C .. rank*C + C-1 of every sequence, lens [B] each sequence's length over all ranks (a rank's
    share may be short or empty). Returns softmax(q k^T / sqrt(D)) v [B, H, D] on every rank, with
    query head h reading KV head h // (H / HKV); a sequence of length 0 gives 0. The fused path is
    programs/flash_decode.tds (head dimension 128)."""
    return torch_ops.call("flash_decode", q, k, v, lens, group_name(group), impl, tune)


def sp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None, *, impl: str | None = None,
                 tune: bool | None = None) -> torch.Tensor:
    """Causal prefill attention under sequence parallelism, sharded zig-zag: the sequence is 2 * world
    pieces of P tokens and this rank holds pieces rank and 2*world-1-rank (balanced causal work) of
    q [B, 2, P, H, D], k and v [B, 2, P, HKV, D]. Returns this rank's output [B, 2, P, H, D]: each query
    attends to every key at or before its position in the whole sequence, query head h to KV head
    h // (H / HKV). The fused path is programs/sp_ag_attention.tds (head dimension 128): K and V are
    gathered a piece at a time by the copy engine while the attention consumes them."""
    return torch_ops.call("sp_attention", q, k, v, group_name(group), impl, tune)


def moe_dispatch(x: torch.Tensor, ids: torch.Tensor, experts_per_rank: int, capacity: int, group=None, *,
                 impl: str | None = None, tune: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert-parallel dispatch: x [T, H] this rank's tokens, ids [T, K] their top-k experts among the
    group's world * experts_per_rank (expert x lives on rank x // experts_per_rank). Returns (recv
    [E, world, C, H], count [E, world] int32): recv[e, s, :count[e, s]] are the rows rank s sent to
    this rank's expert e, token by token; rows past the count are unspecified. C is `capacity`; a count
    above it raises tiledsl.runtime.issue.CapacityExceeded. The programs' path makes no host
    synchronisation (a CUDA graph can replay it with new routings); torch's exchanges the splits."""
    return torch_ops.call("moe_dispatch", x, ids, experts_per_rank, capacity, group_name(group), impl, tune,
                          world_size(group))


def moe_combine(y: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, group=None, *, impl: str | None = None,
                tune: bool | None = None) -> torch.Tensor:
    """The reverse of moe_dispatch: y [E, world, C, H] the experts' outputs for the rows as dispatch
    delivered them, ids and weights [T, K] this rank's routing. Returns [T, H], each token's sum over
    its top-k of weight * its expert's output (weighted in float32)."""
    return torch_ops.call("moe_combine", y, ids, weights, group_name(group), impl, tune)


def configure(**settings) -> None:
    """Set how ops choose and run: tune, timer, cache_dir, progress, check (see the module docstring)."""
    for name, value in settings.items():
        if not hasattr(STATE.settings, name):
            raise TypeError(f"unknown setting {name!r}; settings: {', '.join(Settings.__dataclass_fields__)}")
        setattr(STATE.settings, name, value)


def decision(op: str) -> Decision | None:
    """The decision the last call of `op` followed (None before any call)."""
    return LAST.get(op)


def check() -> None:
    """Raise ScheduleTimeout if a call made without a check gave up waiting (synchronises)."""
    for program in STATE.programs.values():
        program.check()
