"""Attention across GPUs under torchrun (made for world 2), bf16, every baseline timed in the same run on
the same random data, every timed variant's output checked against a float32 torch reference first.

Prefill (batch 2, 32 query heads, 8 KV heads, head dim 128, 4096 and 8192 tokens a rank, causal,
zig-zag pieces): tiledsl's sp_ag_attention (copy-engine gather, attention waiting per piece) against
NCCL's all-gather of K and V then torch's scaled_dot_product_attention on each of the rank's two query
pieces (the fastest of torch's backends, named), and each one's attention alone: tiledsl's tile with
the sequence's K and V already here (bench/experiments/attention_local.tds) and torch's SDPA on the
gathered K and V.

Decode (batch 1 and 8, 64 query heads, 8 KV heads, head dim 128, 1K to 128K cache positions a rank):
tiledsl's flash_decode (replayed from its CUDA graph) with the slices it chooses from the sizes, the
same with a one-pass combine (bench/experiments/flash_decode_onepass.tds), and forced to half and
twice as many slices, against a local torch attention that returns its
log-sum-exp (flash attention's, with the 8 query heads of a KV head as its query rows; else matmuls),
an NCCL all-gather of (output, log-sum-exp) and a torch combine, timed eagerly and in a CUDA graph
(the faster counts).

Times are medians of CUDA-event timings of the slowest rank: prefill one call at a time, decode
20 calls back to back. Writes attention_world{W}.json and prints a table; a wrong output is a FAIL
line, left out, and the exit code is 1."""
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from common import NAN, Verdicts, program_call, rank0, save, time_checked, time_loop_ms  # noqa: E402

import tiledsl  # noqa: E402
from tiledsl.runtime.heap import disable_multicast, open_heap  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PREFILL = [(2, 4096), (2, 8192)]                       # (batch, tokens a rank)
PREFILL_HEADS, PREFILL_KV_HEADS, D = 32, 8, 128
DECODE_BATCHES = (1, 8)
DECODE_KV = (1024, 4096, 16384, 65536, 131072)         # cache positions a rank
DECODE_HEADS, DECODE_KV_HEADS = 64, 8
# Variants timed beside the defaults (label: program, consts at build, compile options); the best is
# reported apart. The defaults (sp_ag_attention and attention_local alike: 128 query rows on 8 warps,
# BN = 64, 3 stages) were the fastest tile of session 12; the SP program at those blocks was 1.5x its
# tile until session 13 found its gather crawling on one SM (runtime/issue.goes_first). Beside them: the
# earlier default (64 rows, 2 stages), the tile as Triton's fused-attention tutorial builds it on Hopper
# (the causal loop split into whole blocks and masked diagonal blocks; BN 128, which spills 176 bytes
# at sm_90), and the SP program's loop and waits without its gather (attention_local_waits).
SP_VARIANTS: dict = {"BM64_BN64_2stages": ({"BM": 64, "STAGES": 2}, {})}
TILE_VARIANTS = {
    "BM64_BN64_2stages": ("attention_local", {"BM": 64, "STAGES": 2}, {}),
    "split_BM128_BN64": ("attention_local_split", {"BM": 128, "BN": 64}, {}),
    "split_BM128_BN64_3stages": ("attention_local_split", {"BM": 128, "BN": 64}, {"num_stages": 3}),
    "BM128_BN128_2stages": ("attention_local", {"BN": 128, "STAGES": 2}, {}),
    "waits_BM128_BN64_3stages": ("attention_local_waits", {"BM": 128, "BN": 64}, {"num_stages": 3}),
}
# flash_decode's slices of a rank's cache (a part tile each): the program's default, chosen from the sizes
# (SLICES in programs/flash_decode.tds), timed beside half and twice as many (forced through its consts)
SLICE_NEIGHBOURS = (0.5, 2, 4)
BF16 = {"device": "cuda", "dtype": torch.bfloat16}
_said = set()


def optional(name, fn):
    """A baseline this torch or machine may lack: NaN and one line saying why, instead of a crash."""
    try:
        return fn()
    except Exception as error:  # noqa: BLE001 - a missing baseline is reported, not fatal
        if rank0() and name not in _said:
            _said.add(name)
            print(f"  {name}: unavailable ({type(error).__name__}: {str(error)[:160]})", flush=True)
        return NAN


def gathered(x):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return parts


# ---- prefill ---------------------------------------------------------------------------------------

def sequence(parts, world):
    """Every rank's [B, 2, P, h, D] pieces (rank r: pieces r and 2w-1-r) as [B, 2w, P, h, D] in order."""
    return torch.stack([parts[min(g, 2 * world - 1 - g)][:, g // world] for g in range(2 * world)], dim=1)


def zigzag_reference(Q, K_all, V_all, rank, world):
    """float32 causal attention of this rank's two query pieces, KV heads repeated for the memory-light
    backends; [B, 2, P, H, D]."""
    B, _, P, H, _ = Q.shape
    group = H // K_all.shape[3]
    outs = []
    for z in range(2):
        g = rank if z == 0 else 2 * world - 1 - rank
        q = Q[:, z].transpose(1, 2).float()
        k, v = (t[:, :g + 1].reshape(B, (g + 1) * P, -1, D).repeat_interleave(group, dim=2).transpose(1, 2).float()
                for t in (K_all, V_all))
        # the last P keys are the query's own piece: causal there, every earlier key allowed
        mask = torch.ones(P, (g + 1) * P, dtype=torch.bool, device=q.device).tril(g * P)
        outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2))
    return torch.stack(outs, dim=1)


def torch_pieces(Q, K_all, V_all, O, rank, world, backend, gqa):
    """torch's attention of this rank's two query pieces on the gathered K and V, into O: one backend,
    the query heads of a KV head either left to the kernel (`gqa` "native") or as repeated KV heads."""
    from torch.nn.attention import sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
    B, _, P, H, _ = Q.shape
    with sdpa_kernel([backend]):
        for z in range(2):
            g = rank if z == 0 else 2 * world - 1 - rank
            k, v = (t[:, :g + 1].reshape(B, (g + 1) * P, -1, D).transpose(1, 2) for t in (K_all, V_all))
            if gqa == "repeat":
                k, v = (t.repeat_interleave(H // t.shape[1], dim=1) for t in (k, v))
            # the last P keys are the query piece's own: causal there, aligned to the bottom right
            out = F.scaled_dot_product_attention(Q[:, z].transpose(1, 2), k, v, enable_gqa=gqa == "native",
                                                 attn_mask=causal_lower_right(P, (g + 1) * P))
            O[:, z].copy_(out.transpose(1, 2))


def prefill_row(programs, B, tokens, rank, world, verdicts):
    P = tokens // 2
    H, HKV = PREFILL_HEADS, PREFILL_KV_HEADS
    Q, O = torch.randn(B, 2, P, H, D, **BF16), torch.empty(B, 2, P, H, D, **BF16)
    K, V = torch.randn(B, 2, P, HKV, D, **BF16), torch.randn(B, 2, P, HKV, D, **BF16)
    K_all, V_all = sequence(gathered(K), world).contiguous(), sequence(gathered(V), world).contiguous()
    want = zigzag_reference(Q, K_all, V_all, rank, world)
    row = {"op": "prefill", "world": world, "B": B, "tokens_per_rank": tokens, "H": H, "HKV": HKV, "D": D}
    # causal attention over the sequence: 4 B H S^2 D / 2 flops, shared evenly by the zig-zag pieces
    row["tflop_per_rank"] = 4 * B * H * (2 * world * P) ** 2 * D / 2 / world / 1e12
    tag = f"prefill B={B} tokens={tokens}"
    sp_labels = [""] + [f"_{label}" for label in SP_VARIANTS]
    for label in sp_labels:
        sp = programs[f"sp_ag_attention{label}"]
        row[f"tiledsl{label}"] = time_checked(verdicts, f"{tag} sp_ag_attention {label[1:] or 'default'}",
                                              program_call(sp, Q, K, V, O), sp.check, O, want)
    row["tiledsl_best"], row["tiledsl_best_blocks"] = min(
        ((row[f"tiledsl{label}"], label[1:] or "default") for label in sp_labels),
        key=lambda x: (math.isnan(x[0]), x[0]))
    tile_labels = [""] + [f"_{label}" for label in TILE_VARIANTS]
    for label in tile_labels:
        local = programs[f"attention_local{label}"]
        row[f"tiledsl_attention_alone{label}"] = time_checked(
            verdicts, f"{tag} the tile alone {label[1:] or 'default'}", program_call(local, Q, K_all, V_all, O),
            local.check, O, want)
    row["tiledsl_alone_best"], row["tiledsl_alone_best_variant"] = min(
        ((row[f"tiledsl_attention_alone{label}"], label[1:] or "default") for label in tile_labels),
        key=lambda x: (math.isnan(x[0]), x[0]))
    from torch.nn.attention import SDPBackend
    K_buf, V_buf = torch.empty(world, *K.shape, **BF16), torch.empty(world, *V.shape, **BF16)
    best_alone, best_total = (NAN, None), (NAN, None)
    variants = [(backend, gqa) for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                                               SDPBackend.EFFICIENT_ATTENTION) for gqa in ("native", "repeat")]
    for backend, gqa in variants:
        name = f"{backend.name.lower()} ({gqa} GQA)"

        def alone(check, backend=backend, gqa=gqa):
            torch_pieces(Q, K_all, V_all, O, rank, world, backend, gqa)

        def total(check, backend=backend, gqa=gqa):  # NCCL's gather, the pieces in sequence order, attention
            dist.all_gather_into_tensor(K_buf, K)
            dist.all_gather_into_tensor(V_buf, V)
            torch_pieces(Q, sequence(K_buf, world), sequence(V_buf, world), O, rank, world, backend, gqa)
        t_alone = optional(f"torch SDPA {name}", lambda: time_checked(
            verdicts, f"{tag} torch SDPA {name} alone", alone, lambda: None, O, want))
        t_total = NAN if math.isnan(t_alone) else time_checked(
            verdicts, f"{tag} NCCL all-gather + torch SDPA {name}", total, lambda: None, O, want)
        row[f"torch_{name}_alone"], row[f"torch_{name}_ag"] = t_alone, t_total
        best_alone = min(best_alone, (t_alone, name), key=lambda x: (math.isnan(x[0]), x[0]))
        best_total = min(best_total, (t_total, name), key=lambda x: (math.isnan(x[0]), x[0]))
    row["torch_alone"], row["torch_alone_backend"] = best_alone
    row["torch_ag_sdpa"], row["torch_ag_sdpa_backend"] = best_total
    return row


# ---- decode ----------------------------------------------------------------------------------------

def local_attention_lse(Q, Kb, Vb, how):
    """Attention of one query a sequence over this rank's cache ([B, HKV, C, D], the layout torch's
    kernels take), the G query heads of a KV head as query rows: (output [B, H, D] float32, its
    natural log-sum-exp [B, H])."""
    B, H, _ = Q.shape
    HKV = Kb.shape[1]
    q = Q.view(B, HKV, H // HKV, D)
    if how == "flash":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, Kb, Vb)[:2]
        return out.reshape(B, H, D).float(), lse.reshape(B, H)
    scores = torch.matmul(q, Kb.transpose(-1, -2)).float() * D ** -0.5
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.softmax(scores, dim=-1).to(Vb.dtype), Vb)
    return out.reshape(B, H, D).float(), lse.reshape(B, H)


def torch_decode(Q, Kb, Vb, O, packed, how):
    """The decode baseline: local attention with its log-sum-exp, one NCCL all-gather of both, combine."""
    out, lse = local_attention_lse(Q, Kb, Vb, how)
    mine = torch.cat([out, lse[..., None]], dim=-1)
    dist.all_gather_into_tensor(packed, mine)
    outs, lses = packed[..., :D], packed[..., D]
    top = lses.max(dim=0).values
    weights = torch.exp(lses - top)
    O.copy_((weights[..., None] * outs).sum(dim=0) / weights.sum(dim=0)[..., None])


def decode_reference(Q, K, V, world):
    """float32, one KV head at a time (a whole float32 copy of a 128K-a-rank cache would not fit)."""
    keys, values = torch.cat(gathered(K), dim=1), torch.cat(gathered(V), dim=1)  # every position, in order
    B, H, _ = Q.shape
    HKV = K.shape[2]
    G = H // HKV
    out = torch.empty(B, H, D, device=Q.device)
    for b in range(B):
        for g in range(HKV):
            q, k, v = Q[b, g * G:(g + 1) * G].float(), keys[b, :, g].float(), values[b, :, g].float()
            out[b, g * G:(g + 1) * G] = torch.softmax(q @ k.T * D ** -0.5, dim=-1) @ v
    return out


def graphed(fn):
    """fn recorded in a CUDA graph (warmed up on a side stream first): the graph's replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


class DecodePrograms:
    """flash_decode as built by default, and built to force a number of slices, each compiled once."""

    def __init__(self, heap):
        self.heap = heap
        self.default = tiledsl.compile(ROOT / "programs" / "flash_decode.tds", heap)
        # the same with a one-pass combine (bench/experiments/flash_decode_onepass.tds), at the same slices
        self.onepass = tiledsl.compile(ROOT / "bench" / "experiments" / "flash_decode_onepass.tds", heap)
        # the same with 128 keys a step: twice the bytes of K and V in flight a part tile (2026-12-01 at
        # world 1, batch 8 streamed 1.4 TB/s at 64K keys a rank with 2 or 4 slices alike, torch 2.0)
        self.wide = tiledsl.compile(ROOT / "programs" / "flash_decode.tds", heap, BN=128)
        # the same with 4 stages: three 64-key blocks in flight instead of one (2026-12-01, sm_90 build on
        # CPU: 104 KB of shared memory, LDGSTS pipeline of 4)
        self.deep = tiledsl.compile(ROOT / "programs" / "flash_decode.tds", heap, num_stages=4)
        self.forced = {}

    def slices(self, B, H, HKV, C, world) -> int:
        """What the default chooses at these sizes (the first dimension of its partials)."""
        env = {"B": B, "H": H, "HKV": HKV, "C": C, "rank": 0, "world": world, **self.default.module.tds_CONSTS}
        return self.default.module.tds_tensor_shapes(env)["Part"][0]

    def force(self, n):
        if n not in self.forced:  # the chooser opened wide: exactly NS slices
            self.forced[n] = tiledsl.compile(ROOT / "programs" / "flash_decode.tds", self.heap, NS=n, MINKEYS=1,
                                             SMS=2**30)
        return self.forced[n]


def decode_row(programs, B, C, world, verdicts):
    H, HKV = DECODE_HEADS, DECODE_KV_HEADS
    Q, O = torch.randn(B, H, D, **BF16), torch.empty(B, H, D, **BF16)
    dist.broadcast(Q, 0)  # one query token a sequence, the same on every rank
    K, V = torch.randn(B, C, HKV, D, **BF16), torch.randn(B, C, HKV, D, **BF16)
    Lens = torch.full((B,), world * C, dtype=torch.int32, device="cuda")
    want = decode_reference(Q, K, V, world)
    Kb, Vb = K.transpose(1, 2).contiguous(), V.transpose(1, 2).contiguous()  # the baseline's own layout
    packed = torch.empty(world, B, H, D + 1, device="cuda")
    row = {"op": "decode", "world": world, "B": B, "kv_per_rank": C, "H": H, "HKV": HKV, "D": D}
    tag = f"decode B={B} kv={C}"
    chosen = programs.slices(B, H, HKV, C, world)
    row["tiledsl_slices"] = chosen
    variants = [("tiledsl", chosen, programs.default), ("tiledsl_onepass", chosen, programs.onepass),
                ("tiledsl_BN128", chosen, programs.wide), ("tiledsl_4stages", chosen, programs.deep)]
    for factor in SLICE_NEIGHBOURS:
        n = int(chosen * factor)
        if 1 <= n <= C:
            variants.append((f"tiledsl_NS{n}", n, programs.force(n)))
    for key, slices, program in variants:
        how = {"tiledsl": "", "tiledsl_onepass": " (one-pass combine)", "tiledsl_BN128": " (BN=128)",
               "tiledsl_4stages": " (4 stages)"}.get(key, " (forced)")
        name = f"{tag} flash_decode {slices} slices{how}"
        row[key] = time_checked(verdicts, name, program_call(program, Q, K, V, Lens, O), program.check, O, want,
                                timer=time_loop_ms)
        program.release()  # its prepared calls keep this row's caches alive
    row["tiledsl_best"], row["tiledsl_best_slices"] = min(
        ((row[key], {"tiledsl_onepass": f"{n}, one pass", "tiledsl_BN128": f"{n}, BN=128",
                     "tiledsl_4stages": f"{n}, 4 stages"}.get(key, n))
         for key, n, _ in variants),
        key=lambda x: (math.isnan(x[0]), x[0]))
    best = (NAN, None)
    for how in ("flash", "matmul"):
        def eager(check, how=how):
            torch_decode(Q, Kb, Vb, O, packed, how)
        t_eager = optional(f"torch decode ({how})", lambda: time_checked(
            verdicts, f"{tag} torch {how} + NCCL all-gather + combine", eager, lambda: None, O, want,
            timer=time_loop_ms))
        replay = optional(f"torch decode ({how}) in a CUDA graph", lambda: graphed(lambda: eager(False)))
        t_graph = NAN if not callable(replay) else time_checked(
            verdicts, f"{tag} torch {how} + NCCL all-gather + combine, CUDA graph", lambda check: replay(),
            lambda: None, O, want, timer=time_loop_ms)
        row[f"torch_{how}"], row[f"torch_{how}_graph"] = t_eager, t_graph
        for t, name in ((t_eager, how), (t_graph, f"{how}, CUDA graph")):
            best = min(best, (t, name), key=lambda x: (math.isnan(x[0]), x[0]))
    row["torch"], row["torch_variant"] = best
    return row


# ---- report ----------------------------------------------------------------------------------------

def ratio(a, b) -> str:
    return f"{a / b:.2f}x" if math.isfinite(a) and math.isfinite(b) and b else "-"


def table(rows) -> str:
    lines = ["Prefill (ms; speed-ups are baseline / tiledsl):", "",
             "| B | tokens/rank | tiledsl SP | tiledsl attention alone | AG + SDPA (backend) | SDPA alone (backend) "
             "| SP vs AG+SDPA | tile vs SDPA alone | SP / own attention | tile TFLOP/s | best SP (blocks) "
             "| best tile (variant) | best tile vs SDPA alone |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if r["op"] == "prefill"):
        tflops = r["tflop_per_rank"] / (r["tiledsl_attention_alone"] / 1e3)
        lines.append(f"| {r['B']} | {r['tokens_per_rank']} | {r['tiledsl']:.3f} | {r['tiledsl_attention_alone']:.3f} | "
                     f"{r['torch_ag_sdpa']:.3f} ({r['torch_ag_sdpa_backend']}) | {r['torch_alone']:.3f} "
                     f"({r['torch_alone_backend']}) | {ratio(r['torch_ag_sdpa'], r['tiledsl'])} | "
                     f"{ratio(r['torch_alone'], r['tiledsl_attention_alone'])} | "
                     f"{ratio(r['tiledsl'], r['tiledsl_attention_alone'])} | {tflops:.0f} | "
                     f"{r['tiledsl_best']:.3f} ({r['tiledsl_best_blocks']}) | "
                     f"{r['tiledsl_alone_best']:.3f} ({r['tiledsl_alone_best_variant']}) | "
                     f"{ratio(r['torch_alone'], r['tiledsl_alone_best'])} |")
    lines += ["", "Decode (ms per step, 20 steps back to back):", "",
              "| B | KV/rank | tiledsl (slices) | best tiledsl (slices) | torch (variant) | speed-up | best speed-up |",
              "|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if r["op"] == "decode"):
        lines.append(f"| {r['B']} | {r['kv_per_rank']} | {r['tiledsl']:.4f} ({r['tiledsl_slices']}) | "
                     f"{r['tiledsl_best']:.4f} "
                     f"({r['tiledsl_best_slices']}) | {r['torch']:.4f} ({r['torch_variant']}) | "
                     f"{ratio(r['torch'], r['tiledsl'])} | {ratio(r['torch'], r['tiledsl_best'])} |")
    return "\n".join(lines)


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    if not any(r["op"] == "decode" for r in rows):  # ATTENTION_ONLY=prefill: nothing to draw
        return
    figure, axis = plt.subplots(figsize=(6, 4))
    for B in DECODE_BATCHES:
        mine = [r for r in rows if r["op"] == "decode" and r["B"] == B]
        kv = [r["kv_per_rank"] for r in mine]
        axis.plot(kv, [r["tiledsl"] for r in mine], "o-", label=f"tiledsl flash_decode, B={B}")
        axis.plot(kv, [r["torch"] for r in mine], "s--", label=f"torch + NCCL, B={B}")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("KV positions per rank")
    axis.set_ylabel("ms per decode step")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path)


def main() -> int:
    disable_multicast()
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(16 << 30))  # K_all, V_all at 16K tokens: 1 GiB
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(rank)
    heap = open_heap()
    verdicts = Verdicts()
    programs = {}
    experiments = ROOT / "bench" / "experiments"
    programs = {"sp_ag_attention": tiledsl.compile(ROOT / "programs" / "sp_ag_attention.tds", heap),
                "attention_local": tiledsl.compile(experiments / "attention_local.tds", heap)}
    for label, (consts, options) in SP_VARIANTS.items():
        programs[f"sp_ag_attention_{label}"] = tiledsl.compile(ROOT / "programs" / "sp_ag_attention.tds", heap,
                                                               **consts, **options)
    for label, (name, consts, options) in TILE_VARIANTS.items():
        programs[f"attention_local_{label}"] = tiledsl.compile(experiments / f"{name}.tds", heap, **consts, **options)
    decode = DecodePrograms(heap)
    rows = []
    only = os.environ.get("ATTENTION_ONLY", "")  # "prefill" or "decode": one half, to fit a short call
    for B, tokens in PREFILL if only in "prefill" else ():
        rows.append(prefill_row(programs, B, tokens, rank, world, verdicts))
        if rank == 0:
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
        for program in programs.values():
            program.release()
    for B in DECODE_BATCHES if only in "decode" else ():
        for C in DECODE_KV:
            rows.append(decode_row(decode, B, C, world, verdicts))
            if rank == 0:
                print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
            torch.cuda.empty_cache()
    if rank == 0:
        print(table(rows), flush=True)
        path = save(f"attention_world{world}", rows)
        plot(rows, path.with_suffix(".png"))
    heap.close()
    code = verdicts.exit_code()
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
