"""Attention across GPUs as an op: flash_decode, one query token per sequence against a KV cache split
along the sequence over the group's ranks (programs/flash_decode.tds; its torch path: each rank's
attention over its share, then the partial outputs and log-sum-exps all-gathered and merged)."""
from __future__ import annotations

import torch

from tiledsl.ops import torch_path
from tiledsl.ops.context import compute_dtype
from tiledsl.ops.paths import Op, call, empty, group, pow2

HEAD_DIM = 128  # flash_decode's const D: its blocks are built for it


class FlashDecode(Op):
    """softmax(q k^T / sqrt(D)) v per sequence over the whole cache, every rank holding C positions."""
    name = "flash_decode"
    programs = ("flash_decode",)

    def refusal(self, path, p, entry):
        q, k, _, _ = p.more
        if p.dtype not in (torch.float16, torch.bfloat16):
            # emulated at fp32 it was 1.3e-3 off float64 attention, against 2e-4 for torch's path
            return (f"flash_decode runs fp16 and bf16, not {p.dtype}: it rounds the softmax weights to bf16 "
                    "before their product with V, as flash attention does")
        if q.shape[-1] != HEAD_DIM:
            return f"flash_decode is built for head dimension {HEAD_DIM}, not {q.shape[-1]}"
        return None

    def exact(self, path, p, entry):
        return True  # the program reads the caller's layout as it is: no padding

    def bucket(self, p):
        """The head dimension exactly (the program takes one), batch and keys a rank by powers of two."""
        q, k, _, _ = p.more
        return (f"{str(p.dtype).removeprefix('torch.')} D={q.shape[-1]} batch<={pow2(q.shape[0])} "
                f"keys<={pow2(k.shape[1])}")

    def unfused(self, p):
        q, k, v, lens = p.more
        return torch_path.flash_decode(q, k, v, lens, group(p), p.world)

    def fused(self, path, p, entry, check):
        q, k, v, lens = p.more
        program = self.program(path, p, entry)
        compute = compute_dtype(entry, p.dtype)
        out = empty(tuple(q.shape), compute, p.device)
        call(program, (q.to(compute).contiguous(), k.to(compute).contiguous(), v.to(compute).contiguous(),
                       lens.to(torch.int32).contiguous(), out), check)
        return out.to(p.dtype)
