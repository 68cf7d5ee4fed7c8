"""One op call: its operands as a Problem, the paths that can compute it here and why the others
cannot, the path decided for its shape bucket (tuning.py), and the run."""
from __future__ import annotations

import torch

from tiledsl.ops import prediction, tuning
from tiledsl.ops.context import STATE, consts_for, heap_for, world_of
from tiledsl.ops.attention_ops import FlashDecode, SequenceParallelAttention
from tiledsl.ops.collective_ops import AllGather, AllReduce, AllReduceRMSNorm, ReduceScatter
from tiledsl.ops.moe_ops import MoeCombine, MoeDispatch
from tiledsl.ops.paths import Problem
from tiledsl.ops.products import AllGatherMatmul, MatmulAllReduce, MatmulReduceScatter
from tiledsl.ops.shapes import MULTIPLIED, flat_rows, matrix_rows, normalise_dim

OPS = {op.name: op for op in (AllGatherMatmul(), MatmulReduceScatter(), MatmulAllReduce(), AllReduce(),
                              AllGather(), ReduceScatter(), AllReduceRMSNorm(), FlashDecode(),
                              SequenceParallelAttention(), MoeDispatch(), MoeCombine())}
LAST: dict[str, tuning.Decision] = {}  # op -> the decision its last call followed (forced ones too)


def problem(op: str, group: str, x: torch.Tensor, dim: int = 0, w: torch.Tensor | None = None,
            residual: torch.Tensor | None = None, eps: float = 0.0) -> Problem:
    """The call's operands as rows, after the checks torch's own ops make (same refusals on every rank)."""
    world = world_of(group)
    if op in ("all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce"):
        if w is None or w.dim() != 2 or x.dim() < 2 or x.shape[-1] != w.shape[0]:
            raise ValueError(f"{op}: cannot multiply {list(x.shape)} by {list(None if w is None else w.shape)}")
        if x.dtype != w.dtype or x.device != w.device:
            raise ValueError(f"{op}: A is {x.dtype} on {x.device}, B is {w.dtype} on {w.device}")
        if op == "matmul_all_reduce":
            rows, moved, dim = x.reshape(-1, x.shape[-1]), tuple(x.shape), 0
        else:
            dim = normalise_dim(dim, x.dim(), MULTIPLIED)
            rows, moved = matrix_rows(x, dim)
    elif op == "all_reduce":
        rows, moved, dim = x.reshape(-1), tuple(x.shape), 0
    elif op == "all_reduce_rmsnorm":
        if residual is None or residual.shape != x.shape or residual.dtype != x.dtype or x.dim() < 1:
            raise ValueError(f"{op}: x {list(x.shape)} {x.dtype} and residual must have one shape and dtype")
        if w is None or tuple(w.shape) != (x.shape[-1],):
            raise ValueError(f"{op}: the weight must be [{x.shape[-1]}], got {None if w is None else list(w.shape)}")
        rows, moved, dim = x.reshape(-1, x.shape[-1]), tuple(x.shape), 0
        residual = residual.reshape(-1, x.shape[-1])
    else:
        dim = normalise_dim(dim, max(1, x.dim()))
        rows, moved = flat_rows(x, dim)
    if op in ("matmul_reduce_scatter", "reduce_scatter") and moved[0] % world:
        raise ValueError(f"{op}: dimension {dim} has {moved[0]} entries, not a multiple of the group's {world} ranks")
    return Problem(group, world, x.dtype, x.device, rows, moved, dim, w, residual, eps)


def decode_problem(group: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor) -> Problem:
    """flash_decode's operands, after the checks that make a wrong tensor an error here, not a wrong
    answer: q [B, H, D], this rank's cache k and v [B, C, HKV, D] with H a multiple of HKV, lens [B] of
    integers (every sequence's length over all ranks), one dtype and device."""
    if q.dim() != 3 or k.dim() != 4 or v.shape != k.shape:
        raise ValueError(f"flash_decode: q must be [B, H, D] and k, v one shape [B, C, HKV, D]; got "
                         f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    (B, H, D), HKV = q.shape, k.shape[2]
    if k.shape[0] != B or k.shape[3] != D or H % HKV:
        raise ValueError(f"flash_decode: q {list(q.shape)} and k {list(k.shape)} disagree (batch and head "
                         f"dimension must match, and the {H} query heads divide into the {HKV} KV heads)")
    if tuple(lens.shape) != (B,) or lens.dtype.is_floating_point or lens.dtype.is_complex:
        raise ValueError(f"flash_decode: lens must be [{B}] integers, got {list(lens.shape)} {lens.dtype}")
    if not (q.dtype == k.dtype == v.dtype) or len({q.device, k.device, v.device, lens.device}) != 1:
        raise ValueError(f"flash_decode: q, k, v are {q.dtype}, {k.dtype}, {v.dtype} on "
                         f"{q.device}, {k.device}, {v.device} (lens on {lens.device}): one dtype and device")
    return Problem(group, world_of(group), q.dtype, q.device, q.reshape(B * H, D), tuple(q.shape), 0,
                   more=(q, k, v, lens))


def sp_problem(group: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Problem:
    """sp_attention's operands, checked: this rank's two zig-zag pieces, q [B, 2, P, H, D] and k, v one
    shape [B, 2, P, HKV, D] with H a multiple of HKV, one dtype and device."""
    if q.dim() != 5 or k.dim() != 5 or v.shape != k.shape or q.shape[1] != 2:
        raise ValueError(f"sp_attention: q must be [B, 2, P, H, D] (this rank's two pieces) and k, v one shape "
                         f"[B, 2, P, HKV, D]; got {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    H, HKV = q.shape[3], k.shape[3]
    if q.shape[:3] != k.shape[:3] or q.shape[4] != k.shape[4] or H % HKV:
        raise ValueError(f"sp_attention: q {list(q.shape)} and k {list(k.shape)} disagree (batch, pieces, tokens "
                         f"and head dimension must match, and the {H} query heads divide into the {HKV} KV heads)")
    if not (q.dtype == k.dtype == v.dtype) or len({q.device, k.device, v.device}) != 1:
        raise ValueError(f"sp_attention: q, k, v are {q.dtype}, {k.dtype}, {v.dtype} on {q.device}, {k.device}, "
                         f"{v.device}: one dtype and device")
    return Problem(group, world_of(group), q.dtype, q.device, q.reshape(-1, q.shape[-1]), tuple(q.shape), 0,
                   more=(q, k, v))


def moe_problem(op: str, group: str, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor | None = None,
                experts: int = 0, capacity: int = 0) -> Problem:
    """moe_dispatch's (x [T, H], ids [T, K], experts per rank, capacity) or moe_combine's (y [E, world,
    C, H] as dispatch delivered, ids [T, K], w [T, K]) operands, checked."""
    world = world_of(group)
    if ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype.is_complex:
        raise ValueError(f"{op}: ids must be [T, K] integers (top-k expert ids), got {list(ids.shape)} {ids.dtype}")
    if op == "moe_dispatch":
        if x.dim() != 2 or x.shape[0] != ids.shape[0]:
            raise ValueError(f"{op}: x must be [T, H] with T = {ids.shape[0]} (ids' rows), got {list(x.shape)}")
        if experts < 1 or capacity < 1:
            raise ValueError(f"{op}: experts per rank ({experts}) and capacity ({capacity}) must be positive")
        more = (x, ids, experts, capacity)
    else:
        if x.dim() != 4 or x.shape[1] != world:
            raise ValueError(f"{op}: y must be [E, {world}, C, H] (as moe_dispatch delivers rows), got {list(x.shape)}")
        if w is None or w.shape != ids.shape or not w.dtype.is_floating_point:
            raise ValueError(f"{op}: weights must be floats shaped as ids {list(ids.shape)}, got "
                             f"{None if w is None else (list(w.shape), w.dtype)}")
        more = (x, ids, w)
    devices = [str(t.device) for t in more if isinstance(t, torch.Tensor)]
    if len(set(devices)) != 1:
        raise ValueError(f"{op}: the tensors are on {', '.join(devices)}: one device")
    return Problem(group, world, x.dtype, x.device, x.reshape(-1, x.shape[-1]), tuple(x.shape), 0, more=more)


def run(op_name: str, p: Problem, impl: str | None = None, tune: bool | None = None):
    decision, path, entry = choose(op_name, p, impl, tune)
    LAST[op_name] = decision
    return OPS[op_name].run(path, p, entry)


def choose(op_name: str, p: Problem, impl: str | None = None, tune: bool | None = None):
    """(decision, path, heap entry) for this call."""
    op = OPS[op_name]
    entry, no_heap = heap_for(p.group, p.device)
    paths = op.paths(entry)
    by_name = {path.name: path for path in paths}

    def refusals() -> dict:  # why each path but the first (torch's) cannot run this call
        found = {}
        for path in paths[1:]:
            why = no_heap or op.refusal(path, p, entry)
            if why:
                found[path.name] = why
        return found

    if impl is not None:
        path = _path(by_name, impl, op)
        # torch's path runs every call: forced, it pays for no other path's refusals (a baseline timed
        # through impl="torch" measured the refusals of every fused path as well, on the host)
        not_applicable = refusals() if path is not paths[0] else {}
        if path.name in not_applicable:
            raise ValueError(f"{op.name}: {path.name} cannot run this call: {not_applicable[path.name]}")
        forced = tuning.Decision(op.name, op.bucket(p), path.name, "forced",
                                 not_applicable=tuple(not_applicable.items()))
        return forced, path, entry
    emulated = entry.emulated if entry is not None else p.device.type == "cpu"
    bucket = op.bucket(p)
    key = "|".join([op.name, f"world{p.world}", entry.kind if entry else "no heap", bucket])
    memory_key = f"{key}|group {p.group}"
    decision = tuning.DECISIONS.get(memory_key)
    if decision is None:  # the refusals are worked out once a bucket, when it is decided
        not_applicable = refusals()
        applicable = {name for name in by_name if name not in not_applicable}

        def measure(name):
            return lambda: op.run(by_name[name], p, entry, check=False)

        def verify(name):  # a wait that gave up while measured raises here
            if by_name[name].program is not None:
                op.program(by_name[name], p, entry).check()

        def predict(name):  # exact program paths only: padding is what only a measurement can justify
            path, sizes = by_name[name], op.predicted_sizes(p)
            if path.program is None or sizes is None or not op.exact(path, p, entry):
                return None
            consts = consts_for(entry, path.program, path.tunables)
            return prediction.predicted_us(path.program, tuple(sorted(consts.items())), p.world,
                                           tuple(sorted(sizes.items())))

        question = tuning.Question(
            op.name, bucket, memory_key, key, list(by_name), not_applicable, op.rule(p, entry, applicable),
            measure, verify, gpu=torch.cuda.get_device_name(p.device) if p.device.type == "cuda" else "cpu (emulated)",
            world=p.world, device=p.device, predict=predict)
        decision = tuning.decide(question, _Agreement(p.group), STATE.settings.tuning(emulated, tune))
    return decision, by_name[decision.choice], entry


def _path(by_name: dict, impl: str, op):
    """The path named `impl`: exactly, or a program's name for its default tunables."""
    if impl in by_name:
        return by_name[impl]
    defaults = [p for p in by_name.values() if p.program == impl]
    if defaults:
        return defaults[0]
    raise ValueError(f"{op.name}: unknown path {impl!r}; paths here: {', '.join(by_name)}")


class _Agreement:
    """GroupAgreement made only when a decision needs one (resolving the group costs a little)."""

    def __init__(self, group: str):
        self._group, self._agreement = group, None

    def __getattr__(self, name):
        if self._agreement is None:
            self._agreement = tuning.GroupAgreement(self._group)
        return getattr(self._agreement, name)


def explain(op: str | None = None) -> str:
    """Every decision made in this process (for one op, or all), with timings and reasons."""
    decisions = [d for d in tuning.DECISIONS.values() if op is None or d.op == op]
    decisions += [d for name, d in LAST.items() if d.how == "forced" and (op is None or name == op)]
    if not decisions:
        return f"tiledsl.ops: no decision made yet{' for ' + op if op else ''}"
    return "\n".join(d.describe() for d in decisions)


def reset() -> None:
    """Forget decisions, programs, workspaces and registered heaps; close heaps tiledsl.ops opened."""
    for entry in STATE.heaps.values():
        if entry.opened_here:
            entry.heap.close()
    tuning.forget()
    LAST.clear()
    STATE.clear()
