#!/usr/bin/env python3
"""A LLaMA-style decoder layer under tensor parallelism, written once in plain PyTorch, run with torch +
NCCL collectives or with tiledsl.ops; checks that the two agree and reports tokens per second for both.

Prefill uses sequence parallelism (Megatron's [sequence, batch, hidden] layout, the sequence sharded
between layers): RMSNorm, column-parallel QKV and gate/up projections as all-gather + GEMM, causal
attention over this rank's heads (torch SDPA, rotary embeddings, grouped KV heads), row-parallel output
and down projections as GEMM + reduce-scatter, residuals. Decode has no sequence to shard: QKV and gate/up
are plain GEMMs on replicated activations, the output projection's all-reduce is fused with the residual
add and the next RMSNorm, and the down projection is GEMM + all-reduce; attention reads a KV cache of a
fixed length (the step's shapes never change, so a CUDA graph replays it).

    torchrun --nproc-per-node=2 examples/tp_block.py --size llama3-8b       # GPUs
    python examples/tp_block.py --emulate --world 2 --size toy              # CPU, emulated ranks

On GPUs decode steps are timed inside CUDA graphs (`--no-graphs`: eagerly); the first calls of each
tiledsl op tune it (see tiledsl.ops; each path timed in a CUDA graph too, unless `--no-graphs`), so
timing starts after warm-up steps. Emulated timings measure the
interpreter, not a GPU: the emulated run checks agreement only."""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F


@dataclass(frozen=True)
class Config:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    eps: float = 1e-5


SIZES = {
    "llama3-8b": Config(hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336),
    "llama3-70b": Config(hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672),
    # every product fits the emulated tiles (16 rows, 16-byte rows) at world 2: the programs run
    "toy": Config(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128),
}
EMULATED_TILES = {"BM": 16, "BN": 32, "BR": 8, "BLOCK": 64}  # small tiles for the interpreter


# ---- the two ways to communicate --------------------------------------------------------------------

def _waited(t):
    """A functional collective's result as a plain tensor (not torch's AsyncCollectiveTensor)."""
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


def _mm(x, w):
    """x [..., K] @ w [K, N] as one GEMM of all rows. `x @ w` on the layer's [S, B, K] activations
    ran as S batched one-row products (nvjet 512x8 tiles): 30 ms of a 38 ms LLaMA-3-8B prefill on one
    H200 (profiled in session 12); the first prefill comparisons were against that."""
    return (x.reshape(-1, x.shape[-1]) @ w).unflatten(0, x.shape[:-1])


class TorchComm:
    """torch's functional collectives (NCCL on GPUs) next to plain matmuls."""
    name = "torch+nccl"

    def __init__(self, group):
        self.group = group

    def all_gather_matmul(self, x, w):
        return _mm(_waited(funcol.all_gather_tensor(x.contiguous(), 0, self.group)), w)

    def matmul_reduce_scatter(self, x, w):
        return _waited(funcol.reduce_scatter_tensor(_mm(x, w), "sum", 0, self.group))

    def matmul_all_reduce(self, x, w):
        return _waited(funcol.all_reduce(_mm(x, w), "sum", self.group))

    def all_reduce_rmsnorm(self, x, residual, weight, eps):
        h = _waited(funcol.all_reduce(x, "sum", self.group)) + residual
        return rms_norm(h, weight, eps), h


class TiledslComm:
    """The same four operations from tiledsl.ops (fused where that measured faster)."""
    name = "tiledsl.ops"

    def __init__(self, group):
        import tiledsl.ops
        self.ops, self.group = tiledsl.ops, group

    def all_gather_matmul(self, x, w):
        return self.ops.all_gather_matmul(x, w, self.group)

    def matmul_reduce_scatter(self, x, w):
        return self.ops.matmul_reduce_scatter(x, w, self.group)

    def matmul_all_reduce(self, x, w):
        return self.ops.matmul_all_reduce(x, w, self.group)

    def all_reduce_rmsnorm(self, x, residual, weight, eps):
        return self.ops.all_reduce_rmsnorm(x, residual, weight, self.group, eps=eps)


# ---- the layer, written once ------------------------------------------------------------------------

def rms_norm(x, weight, eps):
    """In float32, rounded once at the end (as the fused program computes it)."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def rotate(x, positions, base=500000.0):
    """Rotary position embedding (LLaMA-3's base) on x [..., positions, head_dim]."""
    half = x.shape[-1] // 2
    freqs = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = positions.float()[:, None] * freqs[None, :]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class DecoderLayer:
    """One rank's shards of a decoder layer: heads and FFN columns split over `world` ranks. Weights
    are stored [K, N] (what `x @ w` multiplies), random, the same for either way of communicating."""

    def __init__(self, config: Config, world: int, rank: int, device, dtype, seed: int = 0):
        if config.heads % world or config.kv_heads % world or config.ffn % world:
            raise ValueError(f"heads {config.heads}, KV heads {config.kv_heads} and FFN {config.ffn} must "
                             f"divide among {world} ranks")
        self.config, self.world = config, world
        self.heads, self.kv_heads, self.ffn = config.heads // world, config.kv_heads // world, config.ffn // world
        generator = torch.Generator(device).manual_seed(seed * 1000 + rank)
        H, d = config.hidden, config.head_dim

        def weight(k, n):
            return (torch.randn(k, n, generator=generator, device=device) / k ** 0.5).to(dtype)

        self.w_qkv = weight(H, (self.heads + 2 * self.kv_heads) * d)
        self.w_o = weight(self.heads * d, H)
        self.w_gate_up = weight(H, 2 * self.ffn)
        self.w_down = weight(self.ffn, H)
        self.norm_attn = (1 + 0.1 * torch.randn(H, generator=generator, device=device)).to(dtype)
        self.norm_mlp = (1 + 0.1 * torch.randn(H, generator=generator, device=device)).to(dtype)

    def split_heads(self, qkv):
        """qkv [..., tokens, (q + k + v) heads * d] -> q, k, v [..., heads, tokens, d]."""
        d = self.config.head_dim
        q, k, v = qkv.split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        return [t.unflatten(-1, (-1, d)).transpose(-3, -2) for t in (q, k, v)]

    def mlp(self, h, comm, up, down):
        gate, value = up(h, self.w_gate_up).chunk(2, dim=-1)
        return down(F.silu(gate) * value, self.w_down)

    def prefill(self, x, comm):
        """x [S/world, B, H], this rank's slice of the sequence -> the same, after the layer."""
        S = x.shape[0] * self.world
        qkv = comm.all_gather_matmul(rms_norm(x, self.norm_attn, self.config.eps), self.w_qkv)  # [S, B, .]
        q, k, v = self.split_heads(qkv.transpose(0, 1))                                     # [B, h, S, d]
        positions = torch.arange(S, device=x.device)
        q, k = rotate(q, positions), rotate(k, positions)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        attn = attn.transpose(1, 2).flatten(-2).transpose(0, 1)                             # [S, B, h*d]
        x = x + comm.matmul_reduce_scatter(attn, self.w_o)
        h = rms_norm(x, self.norm_mlp, self.config.eps)
        return x + self.mlp(h, comm, comm.all_gather_matmul, comm.matmul_reduce_scatter)

    def decode(self, x, cache_k, cache_v, comm):
        """x [B, H], one new token per sequence, replicated; attends to a cache [B, kv heads, L, d]
        whose last slot it writes."""
        L = cache_k.shape[2]
        q, k, v = self.split_heads((rms_norm(x, self.norm_attn, self.config.eps) @ self.w_qkv)[:, None])
        position = torch.full((1,), L - 1, device=x.device)
        q, k = rotate(q, position), rotate(k, position)
        cache_k[:, :, -1:].copy_(k)
        cache_v[:, :, -1:].copy_(v)
        attn = F.scaled_dot_product_attention(q, cache_k, cache_v, enable_gqa=True).flatten(1)  # [B, h*d]
        h, x = comm.all_reduce_rmsnorm(attn @ self.w_o, x, self.norm_mlp, self.config.eps)
        return x + self.mlp(h, comm, torch.matmul, comm.matmul_all_reduce)


# ---- running, checking, timing ----------------------------------------------------------------------

def _timed(step, iters: int, graphs: bool) -> tuple[float, object, str]:
    """(seconds per step, the output of a step, how it was timed); warm-up steps first (they tune)."""
    out = step()
    if iters == 0:
        return float("nan"), out, "not timed"
    out = step()
    if out.device.type != "cuda":
        begin = time.perf_counter()
        for _ in range(iters):
            out = step()
        return (time.perf_counter() - begin) / iters, out, "wall clock (emulated: meaningless)"
    how, run = "CUDA events, eager", step
    if graphs:
        try:
            side = torch.cuda.Stream()  # warm up on a side stream first, as torch.cuda.graph asks
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = step()
            how, run = "CUDA events, CUDA graph", graph.replay
        except Exception as error:  # noqa: BLE001 - reported, then timed eagerly
            how = f"CUDA events, eager (graph capture failed: {type(error).__name__}: {str(error)[:80]})"
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        result = run()
        out = result if result is not None else out
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters, out, how


def _profile(step, label: str) -> None:
    """The GPU kernels of three steps, by total time (TP_BLOCK_PROFILE=1): where a path's time goes."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"profile of 3 steps, {label}:")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))


def run(config: Config, group, device, dtype, batch: int, seq: int, decode_batches, kv_len: int, iters: int,
        graphs: bool) -> list[dict]:
    """Each phase with each way of communicating: rows of (phase, tokens, time, tokens/s, agreement)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if seq % world:
        raise ValueError(f"the sequence ({seq}) must divide among {world} ranks (sequence parallelism)")
    layer = DecoderLayer(config, world, rank, device, dtype)
    generator = torch.Generator(device).manual_seed(1 + rank)
    comms = [TorchComm(group), TiledslComm(group)]
    if os.environ.get("TP_BLOCK_TILEDSL_FIRST"):  # to tell an effect of the order of timing from one of the path
        comms.reverse()
    rows = []
    x = torch.randn(seq // world, batch, config.hidden, generator=generator, device=device).to(dtype)
    phases = [("prefill", batch, batch * seq, lambda comm: layer.prefill(x, comm), graphs)]
    for b in decode_batches:
        token = torch.randn(b, config.hidden, generator=generator, device=device).to(dtype)
        cache = [torch.randn(b, layer.kv_heads, kv_len, config.head_dim, generator=generator, device=device).to(dtype)
                 for _ in range(2)]
        phases.append(("decode", b, b, lambda comm, t=token, c=cache: layer.decode(t, *c, comm), graphs))
    for phase, b, tokens, step, graphed in phases:
        outputs, row = [], {"phase": phase, "batch": b, "tokens": tokens}
        for comm in comms:
            seconds, out, how = _timed(lambda: step(comm), iters, graphed and phase == "decode")
            if os.environ.get("TP_BLOCK_PROFILE") and out.device.type == "cuda":
                _profile(lambda: step(comm), f"{phase} batch {b}, {comm.name}")
            outputs.append(out.float())
            row[comm.name] = {"ms": seconds * 1e3, "tokens_per_s": tokens / seconds, "timed": how}
        want = outputs[[c.name for c in comms].index(TorchComm.name)]
        mine = outputs[[c.name for c in comms].index(TiledslComm.name)]
        row["max_rel_diff"] = ((mine - want).abs().max() / want.abs().max().clamp_min(1e-12)).item()
        rows.append(row)
    return rows


def report(rows: list[dict], config_name: str, world: int, dtype) -> str:
    lines = [f"tp_block {config_name}, world {world}, {str(dtype).removeprefix('torch.')}, one layer",
             f"{'phase':8} {'batch':>5} {'tokens':>7} | {'torch+nccl ms':>13} {'tok/s':>10} | "
             f"{'tiledsl.ops ms':>14} {'tok/s':>10} | {'speedup':>7} | max rel diff"]
    for r in rows:
        t, s = r["torch+nccl"], r["tiledsl.ops"]
        lines.append(f"{r['phase']:8} {r['batch']:5d} {r['tokens']:7d} | {t['ms']:13.4f} {t['tokens_per_s']:10.0f} | "
                     f"{s['ms']:14.4f} {s['tokens_per_s']:10.0f} | {t['ms'] / s['ms']:6.2f}x | {r['max_rel_diff']:.2e}")
    timings = sorted({r[k]["timed"] for r in rows for k in ("torch+nccl", "tiledsl.ops")})
    return "\n".join(lines + [f"timed by: {'; '.join(timings)}"])


TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 5e-2, torch.float16: 2e-2}


def emulated_rank(heap, rendezvous: str, options: dict):
    """One emulated rank (CPU): a gloo group beside the heap, the layer run both ways; rows and the
    choices tiledsl.ops made come back."""
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=heap.rank, world_size=heap.world,
                            timeout=datetime.timedelta(seconds=300))
    import tiledsl.ops
    tiledsl.ops.reset()
    tiledsl.ops.configure(cache_dir=options.get("cache_dir"))
    tiledsl.ops.use_heap(heap, consts=EMULATED_TILES, wait_timeout_s=60.0)
    try:
        rows = run(SIZES[options["size"]], dist.group.WORLD, torch.device("cpu"), options["dtype"], options["batch"],
                   options["seq"], options["decode_batches"], options["kv_len"], options["iters"], graphs=False)
        return rows, tiledsl.ops.explain()
    finally:
        tiledsl.ops.reset()
        dist.destroy_process_group()
        heap.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="llama3-8b")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--batch", type=int, default=1, help="prefill sequences")
    parser.add_argument("--seq", type=int, default=8192, help="prefill sequence length")
    parser.add_argument("--decode-batch", type=int, nargs="*", default=[1, 8, 32, 128])
    parser.add_argument("--kv-len", type=int, default=4096, help="decode KV cache length")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--no-graphs", action="store_true", help="time decode eagerly, not in CUDA graphs")
    parser.add_argument("--emulate", action="store_true", help="CPU: emulated ranks in Triton's interpreter")
    parser.add_argument("--world", type=int, default=2, help="ranks when emulated")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if args.emulate:
        options = {"size": args.size, "dtype": dtype, "batch": args.batch, "seq": args.seq,
                   "decode_batches": args.decode_batch, "kv_len": args.kv_len, "iters": min(args.iters, 1)}
        rows, explained = emulate(args.world, options)
        print(report(rows, args.size, args.world, dtype))
        print(explained)
        return 0 if all(r["max_rel_diff"] <= TOLERANCE[dtype] for r in rows) else 1
    from tiledsl.runtime.heap import disable_multicast
    disable_multicast()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    import tiledsl.ops
    if not args.no_graphs:
        # Decode steps replay from CUDA graphs, where no host work is left: the tuner times each path the
        # same way (timed eagerly, a fused path's launches would count against it). Prefill runs eagerly,
        # where its GPU time hides the host's either way. Choices made so are kept apart from eager ones.
        from tiledsl.ops.timers import graph_timer
        tiledsl.ops.configure(timer=graph_timer,
                              cache_dir=os.path.join(tempfile.gettempdir(), "tiledsl_tp_block_graph_timer"))
    try:
        rows = run(SIZES[args.size], dist.group.WORLD, torch.device("cuda", local_rank), dtype, args.batch, args.seq,
                   args.decode_batch, args.kv_len, args.iters, graphs=not args.no_graphs)
        tiledsl.ops.check()
        if dist.get_rank() == 0:
            print(report(rows, args.size, dist.get_world_size(), dtype))
            print(tiledsl.ops.explain())
        ok = all(r["max_rel_diff"] <= TOLERANCE[dtype] for r in rows)
    finally:
        tiledsl.ops.reset()  # closes the heap tiledsl.ops opened, before the group goes
        dist.destroy_process_group()
    return 0 if ok else 1


def emulate(world: int, options: dict):
    """Run the layer on `world` emulated ranks; rank 0's rows and explanation."""
    from tiledsl.runtime.emulate import run_ranks
    import tp_block  # this file by its own name: the ranks' processes import it, not __main__
    with tempfile.TemporaryDirectory() as folder:
        results = run_ranks(tp_block.emulated_rank, world, os.path.join(folder, "rendezvous"), options,
                            timeout_s=1800)
    return results[0]


if __name__ == "__main__":
    sys.exit(main())
