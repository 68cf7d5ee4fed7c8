"""Attention on GPUs under torchrun, bf16, every baseline timed in the same run on the same random data,
every timed output checked against a float32 torch reference first. Baselines are the calls a user
makes, each under the backend named (`torch.nn.attention.sdpa_kernel`, which raises rather than fall
back: the name is the kernel that ran), and the kernels torch's default dispatch picked are printed.

The tile (world 1): B = 2, 32 query heads, 8 KV heads, head dim 128, 4K, 8K and 16K tokens, causal and
not, in torch's [B, S, heads, D] layout. tiledsl's attention tiles (bench/experiments/attention_*.tds,
the variants below side by side) against `F.scaled_dot_product_attention(q, k, v, is_causal=...,
enable_gqa=True)` under cuDNN and flash, on q.transpose(1, 2) (the caller's layout) and on contiguous
[B, heads, S, D] copies; the best of each backend counts.

SP prefill (any world; the rank's zig-zag pieces of 4K and 8K tokens): sp_ag_attention against NCCL's
all-gather then torch's attention in a formulation that keeps cuDNN (the whole gathered sequence with
`is_causal=True`, or each query piece's own piece causal and the earlier pieces unmasked, merged by
log-sum-exp); attention_local (the SP program's tile alone, K and V already gathered); and
`tiledsl.ops.sp_attention` tuned against its torch path and the user's call.

Decode (batch 1 and 8, 64 query heads, 8 KV heads, 1K to 128K cache positions a rank): flash_decode
(replayed from its CUDA graph) with the slices it chooses and variants, against a local torch attention
that returns its log-sum-exp, an NCCL all-gather of (output, log-sum-exp) and a torch combine, eagerly
and in a CUDA graph (the faster counts); the K and V bytes a rank streams over the time, as GB/s.

Times are medians of CUDA-event timings of the slowest rank: prefill one call at a time, decode 20
calls back to back. ATTENTION_ONLY=tile|sp|ops|decode (several, comma-separated) runs parts;
DECODE="1:1024,4096;8:16384" picks decode's rows;
ATTENTION_VARIANTS=all times every tile variant (else the defaults and the best measured); TOKENS=4096,
8192 picks the tile table's lengths. Writes attention_world{W}.json and .png and prints the tables last;
a wrong output is a FAIL line, left out, and the exit code is 1."""
import math
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from common import NAN, Verdicts, program_call, rank0, save, time_checked, time_loop_ms  # noqa: E402

import tiledsl  # noqa: E402
from tiledsl.runtime.heap import disable_multicast, open_heap  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "bench" / "experiments"
B, HEADS, KV_HEADS, D = 2, 32, 8, 128
TILE_TOKENS = tuple(int(t) for t in os.environ.get("TOKENS", "4096,8192,16384").split(","))
SP_TOKENS = tuple(int(t) for t in os.environ.get("SP_TOKENS", "4096,8192").split(","))  # tokens a rank
DECODE_BATCHES = (1, 8)
DECODE_KV = (1024, 4096, 16384, 65536, 131072)         # cache positions a rank
# DECODE="1:1024,4096;8:16384" picks the decode rows (batch: cache positions a rank), else every pair above
DECODE_ROWS = [(int(b), int(c)) for part in os.environ.get("DECODE", "").split(";") if part
               for b, cs in [part.split(":")] for c in cs.split(",")] or \
    [(b, c) for b in DECODE_BATCHES for c in DECODE_KV]
DECODE_HEADS, DECODE_KV_HEADS = 64, 8
BF16 = {"device": "cuda", "dtype": torch.bfloat16}

# The tile's variants: label -> (program in bench/experiments, build consts and options). Every program
# takes Q [B, S, H, D], K and V [B, S, HKV, D] (attention_local its [B, 2, S/2, ...] view: at world 1
# its two pieces are the sequence in order). TMA=1: blocks through host-made TMA descriptors, TMA=2:
# made on the device (2-D, what Triton's warp specialization on Hopper takes), WS=1: that warp
# specialization (with WARPS=4 Triton adds the producer warps), STAGES: the loops' pipeline depth.
# Predictions (bench/NOTES-attention.md) before the first GPU run of these.
CAUSAL_VARIANTS = {
    "sp_tile": ("attention_local", {}),                              # sp_ag_attention's tile (default)
    "sp_tile_pointers": ("attention_local", {"TMA": 0}),             # its loads as pointers (cp.async)
    "sp_tile_2stages": ("attention_local", {"STAGES": 2}),
    "sp_tile_4stages": ("attention_local", {"STAGES": 4}),
    "sp_tile_BN128": ("attention_local", {"BN": 128, "STAGES": 2}),
    "split": ("attention_causal", {}),
    "split_device_tma": ("attention_causal", {"TMA": 2}),
    "split_BN128": ("attention_causal", {"BN": 128, "STAGES": 2}),
    "split_BN128_3stages": ("attention_causal", {"BN": 128}),      # 230400 bytes of shared memory
    "masked_ws_BN128": ("attention_causal_masked", {"WS": 1, "TMA": 2, "WARPS": 4, "BN": 128, "STAGES": 2}),
    "masked_ws": ("attention_causal_masked", {"WS": 1, "TMA": 2, "WARPS": 4, "STAGES": 2}),
    "masked_ws_3stages": ("attention_causal_masked", {"WS": 1, "TMA": 2, "WARPS": 4}),
    "masked": ("attention_causal_masked", {}),
    "masked_pointers": ("attention_causal_masked", {"TMA": 0}),      # close to the tile before issue 26
}
FULL_VARIANTS = {
    "masked": ("attention_full", {}),
    "split": ("attention_full_split", {}),
    "split_BN128": ("attention_full_split", {"BN": 128, "STAGES": 2}),
    "split_BN128_3stages": ("attention_full_split", {"BN": 128}),
    "ws": ("attention_full", {"WS": 1, "TMA": 2, "WARPS": 4, "STAGES": 2}),
    "ws_3stages": ("attention_full", {"WS": 1, "TMA": 2, "WARPS": 4}),
    "ws_BN128": ("attention_full", {"WS": 1, "TMA": 2, "WARPS": 4, "BN": 128, "STAGES": 2}),
    "pointers": ("attention_full", {"TMA": 0}),
}
# timed unless ATTENTION_VARIANTS=all: the programs' defaults and the fastest of the last GPU run
# (one wave of warm-up compiles): sp_ag_attention's tile; the split loops at BN=128 on 3 stages (fewer
# rescales of the accumulator a key; the fastest right causal and full-split variant on 2026-12-03);
# Hopper warp specialization. On 2026-12-03 the causal masked_ws and masked_ws_BN128 were wrong on the GPU
# (0.4% of elements): masked (the same program without warp specialization) beside masked_ws tells whether
# the specialization or the masked loop is at fault
DEFAULT_VARIANTS = {True: ("sp_tile", "masked", "masked_ws", "split_BN128_3stages"),
                    False: ("split", "ws", "ws_BN128", "split_BN128_3stages")}
# sp_ag_attention variants beside its defaults (label: consts)
SP_VARIANTS: dict = {}  # the tile table times its builds; each SP build costs a compile of its own
# flash_decode's slices of a rank's cache (a part tile each): the program's default, chosen from the sizes
# (SLICES in programs/flash_decode.tds), timed beside half and twice as many (forced through its consts)
SLICE_NEIGHBOURS = tuple(float(f) for f in os.environ.get("SLICE_NEIGHBOURS", "0.5,2").split(",") if f)
_said = set()
# DEADLINE_S: no new row starts past it (seconds from the start), so that a run cut at its limit has
# written its tables (after every row: attention_world{W}.json and attention_table.md in $OUT)
START = time.monotonic()
DEADLINE_S = float(os.environ.get("DEADLINE_S", "0") or 0)


def late(what: str) -> bool:
    """Past the deadline: `what` is skipped, and said so."""
    if DEADLINE_S and time.monotonic() - START > DEADLINE_S:
        if rank0():
            print(f"  skipped (deadline {DEADLINE_S:.0f} s): {what}", flush=True)
        return True
    return False


def optional(name, fn):
    """A baseline this torch or machine may lack: NaN and one line saying why, instead of a crash."""
    try:
        return fn()
    except Exception as error:  # noqa: BLE001 - a missing baseline is reported, not fatal
        if rank0() and name not in _said:
            _said.add(name)
            print(f"  {name}: unavailable ({type(error).__name__}: {str(error)[:160]})", flush=True)
        return NAN


def attempt(verdicts, name, fn):
    """fn() for a tiledsl variant, whose failure (a compile the device refuses, say) is a FAIL line and
    NaN rather than the end of the run."""
    try:
        return fn()
    except Exception as error:  # noqa: BLE001 - reported as a failure, the other variants go on
        verdicts.wrong.append(name)
        if rank0():
            print(f"FAIL {name} -- {type(error).__name__}: {str(error)[:300]}", flush=True)
        return NAN


def gathered(x):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return parts


def best(pairs):
    """The fastest (time, name) of `pairs`, NaN times last."""
    return min(pairs, key=lambda x: (math.isnan(x[0]), x[0]), default=(NAN, None))


def kernels_run(fn) -> str:
    """The CUDA kernels one call of fn launches, by name (torch's profiler): which backend ran."""
    from torch.profiler import ProfilerActivity, profile
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})
    except Exception as error:  # noqa: BLE001 - naming is a courtesy, not a result
        return f"(profiler unavailable: {type(error).__name__})"
    return "; ".join(n[:70] for n in names) or "(no kernel seen)"


# ---- the tile, world 1 -------------------------------------------------------------------------------

def tflop(S: int, causal: bool) -> float:
    return 4 * B * HEADS * S * S * D / (2 if causal else 1) / 1e12


def sdpa(q, k, v, causal, backend=None):
    """The user's call on [B, heads, S, D] views, under `backend` (None: torch's own choice)."""
    from torch.nn.attention import sdpa_kernel
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def reference(q, k, v, causal):
    """float32 attention, the KV heads repeated (torch's memory-light float32 kernel takes no GQA)."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    return F.scaled_dot_product_attention(q.float(), k, v, is_causal=causal).to(q.dtype)


def warm(jobs):
    """Compile every variant once in parallel processes (Triton caches the binaries on disk, so the
    timed process's compile is a cache read): each runs its program on a short sequence whose sizes
    specialise the kernel as the timed ones do (the same B and heads, a multiple of 16 tokens)."""
    if os.environ.get("ATTENTION_WARM", "1") == "0" or len(jobs) < 2:
        return
    import multiprocessing
    try:
        with ProcessPoolExecutor(max_workers=min(8, len(jobs), os.cpu_count() or 1),
                                 mp_context=multiprocessing.get_context("spawn")) as pool:
            for job, error in zip(jobs, pool.map(_warm_one, jobs)):
                if error and rank0():
                    print(f"  warm-up of {job}: {error}", flush=True)
    except Exception as error:  # noqa: BLE001 - a lost warm-up only costs the timed process its compiles
        if rank0():
            print(f"  warm-up stopped ({type(error).__name__}: {error}); compiling in turn", flush=True)


def _warm_one(job) -> str | None:
    name, consts = job[0], dict(job[1])
    try:
        torch.cuda.set_device(0)
        program = tiledsl.compile(EXPERIMENTS / f"{name}.tds", **consts)
        S = 512
        q = torch.randn(B, S, HEADS, D, **BF16)
        k, v = (torch.randn(B, S, KV_HEADS, D, **BF16) for _ in range(2))
        args = _tile_args(name, q, k, v, torch.empty_like(q))
        program(*args)
        torch.cuda.synchronize()
        return None
    except Exception as error:  # noqa: BLE001 - the timed process reports it again
        return f"{type(error).__name__}: {str(error)[:200]}"


def _tile_args(name, q, k, v, out):
    if name == "attention_local":  # [B, 2, S/2, heads, D]: at world 1 the two pieces in order
        Bq, S = q.shape[:2]
        return tuple(t.view(Bq, 2, S // 2, *t.shape[2:]) for t in (q, k, v, out))
    return q, k, v, out


def tile_rows(verdicts, variants_of, rows: list) -> list:
    from torch.nn.attention import SDPBackend
    programs = {}
    for causal in (True, False):
        for label, (name, consts) in variants_of(causal).items():
            programs[causal, label] = optional(f"build {name} {consts}",
                                               lambda name=name, consts=consts: tiledsl.compile(
                                                   EXPERIMENTS / f"{name}.tds", **consts))
    for S in TILE_TOKENS:
        if late(f"the tile at {S} tokens"):
            break
        q = torch.randn(B, S, HEADS, D, **BF16)
        k, v = (torch.randn(B, S, KV_HEADS, D, **BF16) for _ in range(2))
        out = torch.empty_like(q)
        views = [t.transpose(1, 2) for t in (q, k, v)]             # the caller's layout, as SDPA takes it
        contiguous = [t.contiguous() for t in views]                 # [B, heads, S, D] of its own
        for causal in (True, False):
            mode = "causal" if causal else "full"
            want = reference(*views, causal).transpose(1, 2)
            row = {"op": "tile", "B": B, "tokens": S, "H": HEADS, "HKV": KV_HEADS, "D": D, "causal": causal,
                   "tflop": tflop(S, causal)}
            tag = f"tile {mode} S={S}"
            row["torch_default_kernels"] = kernels_run(lambda: sdpa(*views, causal))
            for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
                name = backend.name.lower().removesuffix("_attention")
                times = []
                for layout, tensors in (("BSHD view", views), ("BHSD contiguous", contiguous)):
                    def call(check, tensors=tensors, backend=backend):  # the copy out only to check it
                        result = sdpa(*tensors, causal, backend)
                        if check:
                            out.copy_(result.transpose(1, 2))
                    t = optional(f"torch {name} {layout}", lambda call=call, layout=layout, name=name: time_checked(
                        verdicts, f"{tag} torch {name} ({layout})", call, lambda: None, out, want, recheck=False))
                    row[f"torch_{name}_{layout.split()[0]}"] = t
                    times.append((t, layout))
                row[f"torch_{name}"], row[f"torch_{name}_layout"] = best(times)
            for label in variants_of(causal):
                program = programs[causal, label]
                if not callable(program):
                    row[f"tile_{label}"] = NAN
                    continue
                name = variants_of(causal)[label][0]
                row[f"tile_{label}"] = attempt(verdicts, f"{tag} tile {label}", lambda program=program, name=name:
                                               time_checked(verdicts, f"{tag} tile {label}",
                                                            program_call(program, *_tile_args(name, q, k, v, out)),
                                                            program.check, out, want))
                program.release()
            row["tile"], row["tile_variant"] = best((row[f"tile_{x}"], x) for x in variants_of(causal))
            rows.append(row)
            written(rows)
        del q, k, v, out, views, contiguous
        torch.cuda.empty_cache()
    return rows


# ---- SP prefill ------------------------------------------------------------------------------------

def sequence(parts, world):
    """Every rank's [B, 2, P, h, D] pieces (rank r: pieces r and 2w-1-r) as [B, 2w, P, h, D] in order."""
    return torch.stack([parts[min(g, 2 * world - 1 - g)][:, g // world] for g in range(2 * world)], dim=1)


def zigzag_reference(Q, K_all, V_all, rank, world):
    """float32 causal attention of this rank's two query pieces, KV heads repeated for the memory-light
    backends; [B, 2, P, H, D]."""
    Bq, _, P, H, _ = Q.shape
    group = H // K_all.shape[3]
    outs = []
    for z in range(2):
        g = rank if z == 0 else 2 * world - 1 - rank
        q = Q[:, z].transpose(1, 2).float()
        k, v = (t[:, :g + 1].reshape(Bq, (g + 1) * P, -1, D).repeat_interleave(group, dim=2).transpose(1, 2).float()
                for t in (K_all, V_all))
        # the last P keys are the query's own piece: causal there, every earlier key allowed
        mask = torch.ones(P, (g + 1) * P, dtype=torch.bool, device=q.device).tril(g * P)
        outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2))
    return torch.stack(outs, dim=1)


_QUERIES = {}  # the whole sequence's queries for the "whole" formulation, one buffer a shape


def torch_pieces(Q, K_all, V_all, O, rank, world, backend, gqa, how="whole", store=True):
    """torch's attention of this rank's two query pieces on the gathered K and V ([B, 2w, P, HKV, D] in
    sequence order), into O, in a formulation that keeps `backend` on (no explicit mask): "whole", one
    causal call over the whole sequence with this rank's queries at their positions (the other rows
    are computed and dropped: world times the work; at world 1 exactly the work); "lse", each query
    piece's own piece causal and the pieces before it unmasked, merged by log-sum-exp (aten's
    attentions that return one). `gqa` "native" leaves the query heads of a KV head to the kernel,
    "repeat" repeats the KV heads. At world 1 the whole formulation's output is the caller's already
    (a view of [B, S, heads, D]): `store` False leaves it there, as a caller would."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    Bq, _, P, H, _ = Q.shape
    S = 2 * world * P
    pieces = (rank, 2 * world - 1 - rank)
    k, v = (t.reshape(Bq, S, -1, D).transpose(1, 2) for t in (K_all, V_all))
    if gqa == "repeat":
        k, v = (t.repeat_interleave(H // t.shape[1], dim=1) for t in (k, v))
    if how == "whole":
        if world == 1:
            q = Q.reshape(Bq, S, H, D)
        else:
            q = _QUERIES.get((Q.shape, Q.device))
            if q is None:
                q = _QUERIES.setdefault((Q.shape, Q.device), Q.new_zeros(Bq, S, H, D))
            for z, g in enumerate(pieces):
                q[:, g * P:(g + 1) * P].copy_(Q[:, z])
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True,
                                                 enable_gqa=gqa == "native").transpose(1, 2)
        if store or world > 1:
            for z, g in enumerate(pieces):
                O[:, z].copy_(out[:, g * P:(g + 1) * P])
        return
    kernel = {SDPBackend.CUDNN_ATTENTION: lambda q, k, v, c: torch.ops.aten._scaled_dot_product_cudnn_attention(
                  q, k, v, None, True, 0.0, c, False)[:2],
              SDPBackend.FLASH_ATTENTION: lambda q, k, v, c: torch.ops.aten._scaled_dot_product_flash_attention(
                  q, k, v, 0.0, c)[:2]}[backend]

    def aten(q, k, v, c):  # (out, natural log-sum-exp [B, H, L] float32; cuDNN's may carry a trailing 1)
        out, lse = kernel(q, k, v, c)
        return out, lse.float().reshape(q.shape[:3])
    for z, g in enumerate(pieces):
        q = Q[:, z].transpose(1, 2)
        out, lse = aten(q, k[:, :, g * P:(g + 1) * P], v[:, :, g * P:(g + 1) * P], True)
        if g:
            before, before_lse = aten(q, k[:, :, :g * P], v[:, :, :g * P], False)
            top = torch.maximum(lse, before_lse)
            a, b = torch.exp(lse - top), torch.exp(before_lse - top)
            out = (out.float() * a[..., None] + before.float() * b[..., None]) / (a + b)[..., None]
        O[:, z].copy_(out.transpose(1, 2))


def sp_rows(programs, rank, world, verdicts, heap, rows: list) -> list:
    from torch.nn.attention import SDPBackend
    import tiledsl.ops as ops
    for tokens in SP_TOKENS:
        if late(f"SP at {tokens} tokens a rank"):
            break
        P = tokens // 2
        H, HKV = HEADS, KV_HEADS
        Q, O = torch.randn(B, 2, P, H, D, **BF16), torch.empty(B, 2, P, H, D, **BF16)
        K, V = torch.randn(B, 2, P, HKV, D, **BF16), torch.randn(B, 2, P, HKV, D, **BF16)
        K_all, V_all = sequence(gathered(K), world).contiguous(), sequence(gathered(V), world).contiguous()
        want = zigzag_reference(Q, K_all, V_all, rank, world).to(torch.bfloat16)
        row = {"op": "sp", "world": world, "B": B, "tokens_per_rank": tokens, "H": H, "HKV": HKV, "D": D,
               "tflop_per_rank": 4 * B * H * (2 * world * P) ** 2 * D / 2 / world / 1e12}
        tag = f"sp B={B} tokens={tokens}"
        for label in [""] + [f"_{x}" for x in SP_VARIANTS]:
            sp, name = programs[f"sp_ag_attention{label}"], f"{tag} sp_ag_attention {label[1:] or 'default'}"
            row[f"tiledsl{label}"] = attempt(verdicts, name, lambda sp=sp, name=name: time_checked(
                verdicts, name, program_call(sp, Q, K, V, O), sp.check, O, want))
            sp.release()
        local = programs["attention_local"]
        row["tile_alone"] = attempt(verdicts, f"{tag} the tile alone", lambda: time_checked(
            verdicts, f"{tag} the tile alone", program_call(local, Q, K_all, V_all, O), local.check, O, want))
        local.release()
        K_buf, V_buf = torch.empty(world, *K.shape, **BF16), torch.empty(world, *V.shape, **BF16)
        alone, total = [], []
        for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
            for how in ("whole", "lse") if world > 1 else ("whole",):
                name = f"{backend.name.lower().removesuffix('_attention')} {how}"

                def on_gathered(check, backend=backend, how=how):
                    torch_pieces(Q, K_all, V_all, O, rank, world, backend, "native", how, store=check)

                def with_gather(check, backend=backend, how=how):  # NCCL's gather, pieces in order, attention
                    dist.all_gather_into_tensor(K_buf, K)
                    dist.all_gather_into_tensor(V_buf, V)
                    torch_pieces(Q, sequence(K_buf, world), sequence(V_buf, world), O, rank, world, backend,
                                 "native", how, store=check)
                t = optional(f"torch {name}", lambda f=on_gathered, name=name: time_checked(
                    verdicts, f"{tag} torch {name}, K and V gathered", f, lambda: None, O, want, recheck=False))
                g = NAN if math.isnan(t) else time_checked(verdicts, f"{tag} NCCL all-gather + torch {name}",
                                                             with_gather, lambda: None, O, want, recheck=False)
                row[f"torch_{name}_alone"], row[f"torch_{name}_ag"] = t, g
                alone.append((t, name))
                total.append((g, name))
        row["torch_alone"], row["torch_alone_backend"] = best(alone)
        row["torch_ag"], row["torch_ag_backend"] = best(total)
        # tiledsl.ops: tuned on its first call (it measures the program and its torch path), then both; a
        # fresh cache of choices, so that no earlier run's choice is read back
        ops.configure(progress=False, cache_dir=os.path.join(tempfile.gettempdir(), f"tiledsl_bench_attn_{os.getpid()}"))
        ops.use_heap(heap)
        for key, extra in (("ops_tuned", {}), ("ops_torch_path", {"impl": "torch"})):
            def op_call(check, extra=extra):  # the copy out only to check it
                result = ops.sp_attention(Q, K, V, **extra)
                if check:
                    O.copy_(result)
            row[key] = attempt(verdicts, f"{tag} tiledsl.ops.sp_attention {key}", lambda f=op_call, key=key: time_checked(
                verdicts, f"{tag} tiledsl.ops.sp_attention {key}", f, ops.check, O, want, recheck=False))
        row["ops_choice"] = optional("ops decision", lambda: ops.decision("sp_attention").choice)
        row["ops_explain"] = optional("ops explain", lambda: "\n".join(
            line for line in ops.explain().splitlines() if "sp_attention" in line or "measured" in line))
        rows.append(row)
        written(rows)
        for program in programs.values():
            program.release()
    return rows


# ---- decode ----------------------------------------------------------------------------------------

def local_attention_lse(Q, Kb, Vb, how):
    """Attention of one query a sequence over this rank's cache ([B, HKV, C, D], the layout torch's
    kernels take), the G query heads of a KV head as query rows: (output [B, H, D] float32, its
    natural log-sum-exp [B, H])."""
    Bq, H, _ = Q.shape
    HKV = Kb.shape[1]
    q = Q.view(Bq, HKV, H // HKV, D)
    if how == "flash":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, Kb, Vb)[:2]
        return out.reshape(Bq, H, D).float(), lse.reshape(Bq, H)
    scores = torch.matmul(q, Kb.transpose(-1, -2)).float() * D ** -0.5
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.softmax(scores, dim=-1).to(Vb.dtype), Vb)
    return out.reshape(Bq, H, D).float(), lse.reshape(Bq, H)


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
    Bq, H, _ = Q.shape
    HKV = K.shape[2]
    G = H // HKV
    out = torch.empty(Bq, H, D, device=Q.device)
    for b in range(Bq):
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
    """flash_decode as built by default, and built with variants, each compiled once."""

    def __init__(self, heap):
        self.heap = heap
        path = ROOT / "programs" / "flash_decode.tds"
        self.default = tiledsl.compile(path, heap)
        every = {"TMA": {"TMA": 1}, "BN=128": {"BN": 128}, "TMA, BN=128": {"TMA": 1, "BN": 128}}
        # DECODE_VARIANTS="TMA,BN=128" picks them (each a compile), default every one
        chosen = [v for v in os.environ.get("DECODE_VARIANTS", ",".join(every)).split(",") if v in every]
        self.variants = {label: tiledsl.compile(path, heap, **every[label]) for label in chosen}  # the default's slices
        self.forced = {}

    def slices(self, Bq, H, HKV, C, world) -> int:
        """What the default chooses at these sizes (the first dimension of its partials)."""
        env = {"B": Bq, "H": H, "HKV": HKV, "C": C, "rank": 0, "world": world, **self.default.spec.consts}
        return self.default.spec.tensor_shapes(env)["Part"][0]

    def force(self, n):
        if n not in self.forced:  # the chooser opened wide: exactly NS slices
            self.forced[n] = tiledsl.compile(ROOT / "programs" / "flash_decode.tds", self.heap, NS=n, MINKEYS=1,
                                             SMS=2**30)
        return self.forced[n]


def decode_row(programs, Bq, C, world, verdicts):
    H, HKV = DECODE_HEADS, DECODE_KV_HEADS
    Q, O = torch.randn(Bq, H, D, **BF16), torch.empty(Bq, H, D, **BF16)
    dist.broadcast(Q, 0)  # one query token a sequence, the same on every rank
    K, V = torch.randn(Bq, C, HKV, D, **BF16), torch.randn(Bq, C, HKV, D, **BF16)
    Lens = torch.full((Bq,), world * C, dtype=torch.int32, device=BF16["device"])
    want = decode_reference(Q, K, V, world)
    Kb, Vb = K.transpose(1, 2).contiguous(), V.transpose(1, 2).contiguous()  # the baseline's own layout
    packed = torch.empty(world, Bq, H, D + 1, device=BF16["device"])
    row = {"op": "decode", "world": world, "B": Bq, "kv_per_rank": C, "H": H, "HKV": HKV, "D": D,
           "kv_bytes_per_rank": 2 * Bq * C * HKV * D * 2}
    tag = f"decode B={Bq} kv={C}"
    chosen = programs.slices(Bq, H, HKV, C, world)
    row["tiledsl_slices"] = chosen
    variants = [("tiledsl", f"{chosen}", programs.default)]
    variants += [(f"tiledsl_{label}", f"{chosen}, {label}", p) for label, p in programs.variants.items()]
    for factor in SLICE_NEIGHBOURS:
        n = int(chosen * factor)
        if 1 <= n <= C and n != chosen:
            variants.append((f"tiledsl_NS{n}", f"{n} forced", programs.force(n)))
    for key, what, program in variants:
        row[key] = attempt(verdicts, f"{tag} {key}", lambda program=program, what=what: time_checked(
            verdicts, f"{tag} flash_decode {what} slices", program_call(program, Q, K, V, Lens, O), program.check,
            O, want, timer=time_loop_ms))
        program.release()  # its prepared calls keep this row's caches alive
    row["tiledsl_best"], row["tiledsl_best_variant"] = best((row[key], what) for key, what, _ in variants)
    found = []
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
        found += [(t_eager, how), (t_graph, f"{how}, CUDA graph")]
    row["torch"], row["torch_variant"] = best(found)
    return row


# ---- report ----------------------------------------------------------------------------------------

def ratio(a, b) -> str:
    return f"{a / b:.2f}x" if math.isfinite(a) and math.isfinite(b) and b else "-"


def ms(t) -> str:
    return f"{t:.3f}" if isinstance(t, float) and math.isfinite(t) else "-"


def table(rows) -> str:
    lines = []
    tiles = [r for r in rows if r["op"] == "tile"]
    if tiles:
        lines += ["The tile on one GPU (ms, TFLOP/s in brackets; B = 2, 32/8 heads, D = 128, bf16; torch's "
                  "best layout of each backend):", "",
                  "| mode | tokens | tile (variant) | torch flash | torch cuDNN | tile / cuDNN | tile / flash |",
                  "|---|---|---|---|---|---|---|"]
        for r in tiles:
            def cell(t):
                return f"{ms(t)} ({r['tflop'] / (t / 1e3):.0f})" if math.isfinite(t) else "-"
            lines.append(f"| {'causal' if r['causal'] else 'full'} | {r['tokens']} | {cell(r['tile'])} "
                         f"({r['tile_variant']}) | {cell(r['torch_flash'])} | {cell(r['torch_cudnn'])} | "
                         f"{ratio(r['torch_cudnn'], r['tile'])} | {ratio(r['torch_flash'], r['tile'])} |")
        labels = sorted({k[5:] for r in tiles for k in r if k.startswith("tile_") and k != "tile_variant"})
        lines += ["", "Every tile variant (ms):", "",
                  "| mode | tokens | " + " | ".join(labels) + " |", "|---|---|" + "---|" * len(labels)]
        for r in tiles:
            lines.append(f"| {'causal' if r['causal'] else 'full'} | {r['tokens']} | "
                         + " | ".join(ms(r.get(f"tile_{x}", NAN)) for x in labels) + " |")
        lines += ["", "torch's default dispatch ran: " + "; ".join(
            f"{'causal' if r['causal'] else 'full'} {r['tokens']}: {r['torch_default_kernels']}" for r in tiles[:2])]
    sps = [r for r in rows if r["op"] == "sp"]
    if sps:
        lines += ["", "SP prefill (ms; world %d, tokens a rank):" % sps[0]["world"], "",
                  "| tokens | sp_ag_attention | its tile alone | SP / tile | torch on gathered K, V (formulation) "
                  "| AG + torch (formulation) | SP vs AG + torch | ops tuned (choice) | ops torch path | "
                  "ops tuned / torch path |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in sps:
            lines.append(f"| {r['tokens_per_rank']} | {ms(r['tiledsl'])} | {ms(r['tile_alone'])} | "
                         f"{ratio(r['tiledsl'], r['tile_alone'])} | {ms(r['torch_alone'])} "
                         f"({r['torch_alone_backend']}) | {ms(r['torch_ag'])} ({r['torch_ag_backend']}) | "
                         f"{ratio(r['torch_ag'], r['tiledsl'])} | {ms(r['ops_tuned'])} ({r['ops_choice']}) | "
                         f"{ms(r['ops_torch_path'])} | {ratio(r['ops_torch_path'], r['ops_tuned'])} |")
    decodes = [r for r in rows if r["op"] == "decode"]
    if decodes:
        lines += ["", "Decode (ms per step, 20 steps back to back; GB/s: this rank's K and V over the time):", "",
                  "| B | KV/rank | tiledsl (slices) | GB/s | best tiledsl (variant) | GB/s | torch (variant) | "
                  "speed-up | best speed-up |", "|---|---|---|---|---|---|---|---|---|"]
        for r in decodes:
            def rate(t):
                return f"{r['kv_bytes_per_rank'] / (t * 1e6):.0f}" if math.isfinite(t) else "-"
            lines.append(f"| {r['B']} | {r['kv_per_rank']} | {r['tiledsl']:.4f} ({r['tiledsl_slices']}) | "
                         f"{rate(r['tiledsl'])} | {r['tiledsl_best']:.4f} ({r['tiledsl_best_variant']}) | "
                         f"{rate(r['tiledsl_best'])} | {r['torch']:.4f} ({r['torch_variant']}) | "
                         f"{ratio(r['torch'], r['tiledsl'])} | {ratio(r['torch'], r['tiledsl_best'])} |")
    return "\n".join(lines)


def written(rows) -> None:
    """The last row printed, and every row so far as JSON and as tables (rank 0), after each row."""
    if not rank0():
        return
    print({k: (round(x, 4) if isinstance(x, float) else x) for k, x in rows[-1].items()}, flush=True)
    world = dist.get_world_size() if dist.is_initialized() else 1
    path = save(f"attention_world{world}", rows)
    path.with_name("attention_table.md").write_text(table(rows) + "\n")


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    tiles = [r for r in rows if r["op"] == "tile"]
    decodes = [r for r in rows if r["op"] == "decode"]
    panels = [p for p in ("causal", "full", "decode") if (p == "decode" and decodes) or
              (p != "decode" and any(r["causal"] == (p == "causal") for r in tiles))]
    if not panels:
        return
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for axis, panel in zip(axes[0], panels):
        if panel == "decode":
            for Bq in DECODE_BATCHES:
                mine = [r for r in decodes if r["B"] == Bq]
                kv = [r["kv_per_rank"] for r in mine]
                axis.plot(kv, [r["tiledsl"] for r in mine], "o-", label=f"tiledsl flash_decode, B={Bq}")
                axis.plot(kv, [r["torch"] for r in mine], "s--", label=f"torch + NCCL, B={Bq}")
            axis.set_xscale("log", base=2)
            axis.set_yscale("log")
            axis.set_xlabel("KV positions per rank")
            axis.set_ylabel("ms per decode step")
        else:
            mine = [r for r in tiles if r["causal"] == (panel == "causal")]
            tokens = [r["tokens"] for r in mine]
            for key, label, style in (("tile", "tiledsl tile (best variant)", "o-"),
                                      ("torch_cudnn", "torch cuDNN", "s--"), ("torch_flash", "torch flash", "^--")):
                axis.plot(tokens, [r["tflop"] / (r[key] / 1e3) for r in mine], style, label=label)
            axis.set_xscale("log", base=2)
            axis.set_xlabel("tokens")
            axis.set_ylabel("TFLOP/s")
            axis.set_title(f"{panel} attention, B=2, 32/8 heads, D=128, bf16")
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
    only = set(filter(None, os.environ.get("ATTENTION_ONLY", "").split(","))) or {"tile", "sp", "ops", "decode"}
    every = os.environ.get("ATTENTION_VARIANTS", "") == "all"

    def variants_of(causal):
        table = CAUSAL_VARIANTS if causal else FULL_VARIANTS
        return table if every else {k: table[k] for k in DEFAULT_VARIANTS[causal]}
    verdicts, rows = Verdicts(), []
    if "tile" in only and world == 1:  # one GPU's attention: world-1 figures only
        warm(list(dict.fromkeys((name, tuple(sorted(consts.items())))
                                for causal in (True, False) for name, consts in variants_of(causal).values())))
        tile_rows(verdicts, variants_of, rows)
    heap = open_heap()
    if ("sp" in only or "ops" in only) and not late("SP and ops"):
        programs = {"sp_ag_attention": tiledsl.compile(ROOT / "programs" / "sp_ag_attention.tds", heap),
                    "attention_local": tiledsl.compile(EXPERIMENTS / "attention_local.tds", heap)}
        for label, consts in SP_VARIANTS.items():
            programs[f"sp_ag_attention_{label}"] = tiledsl.compile(ROOT / "programs" / "sp_ag_attention.tds", heap,
                                                                   **consts)
        sp_rows(programs, rank, world, verdicts, heap, rows)
    if "decode" in only and not late("decode"):
        decode = DecodePrograms(heap)
        for Bq, C in DECODE_ROWS:
            if late(f"decode B={Bq} kv={C}"):
                break
            rows.append(decode_row(decode, Bq, C, world, verdicts))
            written(rows)
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
