"""Mixture-of-experts as ops: moe_dispatch sends each token's row to the ranks of its top-k experts,
grouped by expert on arrival, and moe_combine brings the experts' outputs back and sums them with the
top-k weights (programs/moe_dispatch.tds and moe_combine.tds; their torch path: all_to_all_single with
the splits exchanged first, a host synchronisation). Buffers are sized by a capacity, so the programs'
path makes no host synchronisation; a count above it raises CapacityExceeded on either path."""
from __future__ import annotations

import torch

from tiledsl.ops import torch_path
from tiledsl.ops.context import SUPPORTED, compute_dtype
from tiledsl.ops.paths import Op, call, empty, group, pow2


class _Moe(Op):
    def refusal(self, path, p, entry):
        if p.dtype not in SUPPORTED:
            return f"the programs run fp16, bf16 and fp32, not {p.dtype}"
        return None

    def exact(self, path, p, entry):
        return True  # the programs take any number of tokens, hidden size and capacity as they are

    def bucket(self, p):
        x, ids = p.more[0], p.more[1]
        return (f"{str(p.dtype).removeprefix('torch.')} tokens<={pow2(ids.shape[0])} top-{ids.shape[1]} "
                f"hidden={x.shape[-1]}")


class MoeDispatch(_Moe):
    """recv[e, s, :count[e, s]]: the rows rank s sent to this rank's expert e, in token order."""
    name = "moe_dispatch"
    programs = ("moe_dispatch",)

    def unfused(self, p):
        x, ids, experts, capacity = p.more
        return torch_path.moe_dispatch(x, ids, experts, capacity, group(p), p.world)

    def fused(self, path, p, entry, check):
        x, ids, experts, capacity = p.more
        program = self.program(path, p, entry)
        compute = compute_dtype(entry, p.dtype)
        recv = empty((experts, p.world, capacity, x.shape[1]), compute, p.device)
        count = empty((experts, p.world), torch.int32, p.device)
        slot = empty(tuple(ids.shape), torch.int32, p.device)
        call(program, (x.to(compute).contiguous(), ids.to(torch.int32).contiguous(), recv, count, slot), check)
        return recv.to(p.dtype), count


class MoeCombine(_Moe):
    """out[t] = sum over k of w[t, k] * y's row for (t, k), back on the token's rank."""
    name = "moe_combine"
    programs = ("moe_combine",)

    def unfused(self, p):
        y, ids, w = p.more
        return torch_path.moe_combine(y, ids, w, group(p), p.world)

    def fused(self, path, p, entry, check):
        y, ids, w = p.more
        program = self.program(path, p, entry)
        compute = compute_dtype(entry, p.dtype)
        out = empty((ids.shape[0], y.shape[-1]), compute, p.device)
        call(program, (y.to(compute).contiguous(), ids.to(torch.int32).contiguous(),
                       w.to(torch.float32).contiguous(), out), check)
        return out.to(p.dtype)
