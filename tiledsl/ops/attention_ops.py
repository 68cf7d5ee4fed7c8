"""Attention across GPUs as ops: flash_decode, one query token per sequence against a KV cache split
along the sequence over the group's ranks (programs/flash_decode.tds; its torch path: each rank's
attention over its share, then the partial outputs and log-sum-exps all-gathered and merged); and
sp_attention, causal prefill attention of a sequence sharded zig-zag over the ranks
(programs/sp_ag_attention.tds; its torch path: K and V all-gathered, then torch's attention). Both
programs round their softmax weights to bf16 before the product with V, as flash attention does, so
fp32 callers get the torch path."""
from __future__ import annotations

import torch

from tiledsl.ops import torch_path
from tiledsl.ops.context import compute_dtype
from tiledsl.ops.paths import Op, call, empty, group, pow2

HEAD_DIM = 128  # the const D of both programs: their blocks are built for it


class _Attention(Op):
    """What both attention ops refuse: fp32 (emulated, flash_decode at fp32 was 1.3e-3 off float64
    attention, against 2e-4 for the torch path) and a head dimension other than the programs' const."""

    def refusal(self, path, p, entry):
        q = p.more[0]
        if p.dtype not in (torch.float16, torch.bfloat16):
            return (f"{self.name} runs fp16 and bf16, not {p.dtype}: it rounds the softmax weights to bf16 "
                    "before their product with V, as flash attention does")
        if q.shape[-1] != HEAD_DIM:
            return f"{self.name} is built for head dimension {HEAD_DIM}, not {q.shape[-1]}"
        return None

    def exact(self, path, p, entry):
        return True  # the programs read the caller's layout as it is: no padding

    def fused(self, path, p, entry, check):
        """The program on the caller's tensors (its operands in declaration order), into a new output."""
        program = self.program(path, p, entry)
        compute = compute_dtype(entry, p.dtype)
        out = empty(tuple(p.more[0].shape), compute, p.device)
        operands = [t.to(compute) if t.is_floating_point() else t.to(torch.int32) for t in p.more]
        call(program, (*(t.contiguous() for t in operands), out), check)
        return out.to(p.dtype)


class FlashDecode(_Attention):
    """softmax(q k^T / sqrt(D)) v per sequence over the whole cache, every rank holding C positions."""
    name = "flash_decode"
    programs = ("flash_decode",)

    def bucket(self, p):
        """The head dimension exactly (the program takes one), batch and keys a rank by powers of two."""
        q, k, _, _ = p.more
        return (f"{str(p.dtype).removeprefix('torch.')} D={q.shape[-1]} batch<={pow2(q.shape[0])} "
                f"keys<={pow2(k.shape[1])}")

    def unfused(self, p):
        q, k, v, lens = p.more
        return torch_path.flash_decode(q, k, v, lens, group(p), p.world)


class SequenceParallelAttention(_Attention):
    """Causal attention of this rank's two zig-zag pieces of the sequence over the whole sequence."""
    name = "sp_attention"
    programs = ("sp_ag_attention",)

    def bucket(self, p):
        """The head dimension exactly, batch and tokens a piece by powers of two."""
        q = p.more[0]
        return (f"{str(p.dtype).removeprefix('torch.')} D={q.shape[-1]} batch<={pow2(q.shape[0])} "
                f"piece<={pow2(q.shape[2])}")

    def unfused(self, p):
        q, k, v = p.more
        return torch_path.sp_attention(q, k, v, group(p), p.world)
