"""The ops as torch.library custom ops (`torch.ops.tiledsl.*`), each with a fake implementation that
gives its output's shape, dtype and (contiguous) layout without running it: torch.compile traces a
model through them (fullgraph) instead of into the launcher's Python, and runs the real op at run time.
A process group travels as its name, as in torch's own symmetric-memory ops. Where the output's shape
depends on the group's size, the size travels too (`world`, given by the tiledsl.ops functions): it is
then a constant of the traced graph, part of torch.compile's cache key. Read from the name inside the
fake, a graph compiled at world 2 was reused from the cache at world 4 with world-2 shapes (inductor's
size assertion failed on one H200 shared by four ranks); 0 reads it from the group."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from tiledsl.ops import dispatch
from tiledsl.ops.context import world_of
from tiledsl.ops.shapes import MULTIPLIED, normalise_dim

NAMESPACE = "tiledsl"


IMPLS: dict = {}  # op name -> its Python body, which the custom op runs (and `call` may run directly)


def _op(name: str):
    def register(fn):
        IMPLS[name] = fn
        return torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=())(fn)
    return register


def call(name: str, *args):
    """One op call, as tiledsl.ops' functions make it. Eagerly, on plain tensors that need no gradient,
    with no torch mode, functorch transform or profiler active, the op's body runs directly: torch's
    custom-op dispatch adds nothing there (no autograd formula, no fake tensor, nothing to trace) and
    costs ~20 us a call on this repository's CPU; on the H200 machine an eager MoE op spent ~90 us of host
    time beyond its program's call in the dispatch and the ops layer together (2026-12-04,
    bench/experiments/ops_host_profile.py), more than a small program's GPU time. Everything else goes
    through torch.ops.tiledsl.* as before, so torch.compile, FakeTensorMode and autograd see the op."""
    if direct(args):
        return IMPLS[name](*args)
    return getattr(torch.ops.tiledsl, name)(*args)


def direct(args) -> bool:
    """Whether a call with `args` may skip torch's dispatcher (see `call`)."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() or \
            torch._C._len_torch_function_stack() or torch._C._are_functorch_transforms_active() or \
            torch.autograd._profiler_enabled():
        return False
    grad = torch.is_grad_enabled()
    return all(type(a) is torch.Tensor and not (grad and a.requires_grad)
               for a in args if isinstance(a, torch.Tensor))


def _resized(x: Tensor, dim: int, why: str | None, factor: int, last: int | None = None) -> Tensor:
    """An empty tensor like x with dimension `dim` multiplied (factor > 0) or divided (factor < 0)."""
    shape = list(x.shape)
    dim = normalise_dim(dim, x.dim(), why)
    shape[dim] = shape[dim] * factor if factor > 0 else shape[dim] // -factor
    if last is not None:
        shape[-1] = last
    return x.new_empty(shape)



@_op("all_gather_matmul")
def all_gather_matmul(a: Tensor, b: Tensor, group_name: str, gather_dim: int = 0, impl: Optional[str] = None,
                      tune: Optional[bool] = None, world: int = 0) -> Tensor:
    p = dispatch.problem("all_gather_matmul", group_name, a, gather_dim, w=b)
    return dispatch.run("all_gather_matmul", p, impl, tune)


@all_gather_matmul.register_fake
def _(a, b, group_name, gather_dim=0, impl=None, tune=None, world=0):
    return _resized(a, gather_dim, MULTIPLIED, world or world_of(group_name), b.shape[1])


@_op("matmul_reduce_scatter")
def matmul_reduce_scatter(a: Tensor, b: Tensor, group_name: str, scatter_dim: int = 0, impl: Optional[str] = None,
                          tune: Optional[bool] = None, world: int = 0) -> Tensor:
    p = dispatch.problem("matmul_reduce_scatter", group_name, a, scatter_dim, w=b)
    return dispatch.run("matmul_reduce_scatter", p, impl, tune)


@matmul_reduce_scatter.register_fake
def _(a, b, group_name, scatter_dim=0, impl=None, tune=None, world=0):
    return _resized(a, scatter_dim, MULTIPLIED, -(world or world_of(group_name)), b.shape[1])


@_op("matmul_all_reduce")
def matmul_all_reduce(a: Tensor, b: Tensor, group_name: str, impl: Optional[str] = None,
                      tune: Optional[bool] = None) -> Tensor:
    p = dispatch.problem("matmul_all_reduce", group_name, a, w=b)
    return dispatch.run("matmul_all_reduce", p, impl, tune)


@matmul_all_reduce.register_fake
def _(a, b, group_name, impl=None, tune=None):
    return a.new_empty(tuple(a.shape[:-1]) + (b.shape[1],))


@_op("all_reduce")
def all_reduce(x: Tensor, group_name: str, impl: Optional[str] = None, tune: Optional[bool] = None) -> Tensor:
    return dispatch.run("all_reduce", dispatch.problem("all_reduce", group_name, x), impl, tune)


@all_reduce.register_fake
def _(x, group_name, impl=None, tune=None):
    return x.new_empty(x.shape)


@_op("all_gather")
def all_gather(x: Tensor, group_name: str, gather_dim: int = 0, impl: Optional[str] = None,
               tune: Optional[bool] = None, world: int = 0) -> Tensor:
    return dispatch.run("all_gather", dispatch.problem("all_gather", group_name, x, gather_dim), impl, tune)


@all_gather.register_fake
def _(x, group_name, gather_dim=0, impl=None, tune=None, world=0):
    return _resized(x, gather_dim, None, world or world_of(group_name))


@_op("reduce_scatter")
def reduce_scatter(x: Tensor, group_name: str, scatter_dim: int = 0, impl: Optional[str] = None,
                   tune: Optional[bool] = None, world: int = 0) -> Tensor:
    return dispatch.run("reduce_scatter", dispatch.problem("reduce_scatter", group_name, x, scatter_dim), impl, tune)


@reduce_scatter.register_fake
def _(x, group_name, scatter_dim=0, impl=None, tune=None, world=0):
    return _resized(x, scatter_dim, None, -(world or world_of(group_name)))


@_op("all_reduce_rmsnorm")
def all_reduce_rmsnorm(x: Tensor, residual: Tensor, weight: Tensor, group_name: str, eps: float = 1e-6,
                       impl: Optional[str] = None, tune: Optional[bool] = None) -> tuple[Tensor, Tensor]:
    p = dispatch.problem("all_reduce_rmsnorm", group_name, x, w=weight, residual=residual, eps=eps)
    return dispatch.run("all_reduce_rmsnorm", p, impl, tune)


@all_reduce_rmsnorm.register_fake
def _(x, residual, weight, group_name, eps=1e-6, impl=None, tune=None):
    return x.new_empty(x.shape), x.new_empty(x.shape)


@_op("flash_decode")
def flash_decode(q: Tensor, k: Tensor, v: Tensor, lens: Tensor, group_name: str, impl: Optional[str] = None,
                 tune: Optional[bool] = None) -> Tensor:
    return dispatch.run("flash_decode", dispatch.decode_problem(group_name, q, k, v, lens), impl, tune)


@flash_decode.register_fake
def _(q, k, v, lens, group_name, impl=None, tune=None):
    return q.new_empty(q.shape)


@_op("sp_attention")
def sp_attention(q: Tensor, k: Tensor, v: Tensor, group_name: str, impl: Optional[str] = None,
                 tune: Optional[bool] = None) -> Tensor:
    return dispatch.run("sp_attention", dispatch.sp_problem(group_name, q, k, v), impl, tune)


@sp_attention.register_fake
def _(q, k, v, group_name, impl=None, tune=None):
    return q.new_empty(q.shape)


@_op("moe_dispatch")
def moe_dispatch(x: Tensor, ids: Tensor, experts_per_rank: int, capacity: int, group_name: str,
                 impl: Optional[str] = None, tune: Optional[bool] = None, world: int = 0) -> tuple[Tensor, Tensor]:
    p = dispatch.moe_problem("moe_dispatch", group_name, x, ids, experts=experts_per_rank, capacity=capacity)
    return dispatch.run("moe_dispatch", p, impl, tune)


@moe_dispatch.register_fake
def _(x, ids, experts_per_rank, capacity, group_name, impl=None, tune=None, world=0):
    world = world or world_of(group_name)
    return (x.new_empty((experts_per_rank, world, capacity, x.shape[1])),
            x.new_empty((experts_per_rank, world), dtype=torch.int32))


@_op("moe_combine")
def moe_combine(y: Tensor, ids: Tensor, weights: Tensor, group_name: str, impl: Optional[str] = None,
                tune: Optional[bool] = None) -> Tensor:
    return dispatch.run("moe_combine", dispatch.moe_problem("moe_combine", group_name, y, ids, weights), impl, tune)


@moe_combine.register_fake
def _(y, ids, weights, group_name, impl=None, tune=None):
    return y.new_empty((ids.shape[0], y.shape[-1]))
