"""Where a decode step's microseconds go on one H200 (issue 27), in one torchrun process at world 1:

  1. floor: what a call costs with nothing in it (a CUDA graph of one tiny kernel, of three, a torch
     op on 8 KB) and HBM's pace on a 14.7 MB copy;
  2. moe: dispatch (bf16, fp8) and combine at DeepSeek-V3's routing (hidden 7168, 256 experts, top 8),
     128 and 4096 tokens: the library programs, and each with one const as it was before session 14
     (dispatch BH=1024, combine BR=32 and BH=1024), dispatch with pack tiles of 16 rows, and one pass a
     direction (bench/experiments/moe_dispatch_direct.tds, moe_combine_direct.tds), against
     all_to_all_single, every output checked; then one traced
     call of each library program (every instance's start, end of waits and end on the GPU clock),
     summarised per family and written as Perfetto JSON; the kernels of one untraced call
     (torch.profiler); tiledsl.ops.moe_dispatch/moe_combine, tuned and with each path forced;
  3. products: M = 1, 8, 32, 64, 128 at N = K = 8192 and the LLaMA-3-8B / 70B decode projections at TP 2
     and 8: torch.matmul (cuBLAS), gemm_ar at world 1 (its TMA tile + its reduction, a copy at world 1)
     and bench/experiments/gemm_ar_skinny.tds (a 16-128 row tile pipelined by cp.async, K split KS
     ways; BM=16 also on two programs an SM); the skinny tiles traced at M = 1 and 128;
  4. call: an 8 KB all-reduce (tiledsl one-shot, two-shot, out of place from the heap), an 8 KB copy
     program, torch symm_mem two-shot and NCCL: GPU time per call back to back, host time per call,
     the program's own CUDA graph replayed with no Python in between, and each kernel's GPU time.

A short table is printed last. PROBE_ONLY=moe,products,... picks sections; PROBE_BUDGET_S (default 200)
bounds the whole run: a section that would start past it is skipped by name, so the table still prints.

    torchrun --nproc-per-node=1 bench/experiments/latency_probe.py
"""
from __future__ import annotations

import gzip
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "experiments"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
import moe_baselines as base  # noqa: E402
from common import NAN, host_us, out_dir, time_interleaved_ms  # noqa: E402
from harness import mismatch, start  # noqa: E402

import tiledsl  # noqa: E402
from tiledsl.tools import trace  # noqa: E402

PROGRAMS, EXPERIMENTS = ROOT / "programs", ROOT / "bench" / "experiments"
BF16 = torch.bfloat16
H, NE, TOPK = 7168, 256, 8
GEMM_M = (1, 8, 32, 64, 128)
# (N, K) of each decode projection: weights [K, N], activations [M, K]
LLAMA = {"8B": dict(hidden=4096, q=32, kv=8, inter=14336), "70B": dict(hidden=8192, q=64, kv=8, inter=28672)}


def decode_shapes():
    shapes = {"square 8192": (8192, 8192)}
    for model, m in LLAMA.items():
        h, qkv = m["hidden"], (m["q"] + 2 * m["kv"]) * 128
        for tp in (2, 8):
            shapes[f"{model} QKV tp{tp}"] = (qkv // tp, h)
            shapes[f"{model} O tp{tp}"] = (h, h // tp)
            shapes[f"{model} up/gate tp{tp}"] = (2 * m["inter"] // tp, h)
            shapes[f"{model} down tp{tp}"] = (h, m["inter"] // tp)
    return shapes


class _Table(list):
    """The short table printed last; each row also printed when it is made (a run stopped at its time
    limit still leaves the rows it reached)."""

    def append(self, row: str) -> None:
        super().append(row)
        print(f"TABLE {row}", flush=True)


TABLE = _Table()
BEGAN = time.monotonic()
QUICK = os.environ.get("PROBE_QUICK") == "1"
BUDGET_S = float(os.environ.get("PROBE_BUDGET_S", "42" if QUICK else "200"))
# round 2 of issue 27 has a 60 s slot: `PROBE_QUICK=1` runs the call, MoE at 128 and 4096 tokens (library
# programs), the skinny products at N = K = 8192 and the smallest decode N, then the 8 KB call


def say(line: str) -> None:
    print(line, flush=True)


def over_budget(what: str) -> bool:
    if time.monotonic() - BEGAN > BUDGET_S:
        say(f"SKIPPED {what}: past PROBE_BUDGET_S={BUDGET_S:.0f} s")
        TABLE.append(f"{what:<44} skipped (budget)")
        return True
    return False


def ok(name, got, want, tol=2e-2) -> bool:
    reason = mismatch(got, want, tol)
    if reason:
        say(f"FAIL {name} -- {reason}")
    return reason is None


def guarded(name, fn, default=NAN):
    """A variant that fails to build or run is one line, not the end of the probe."""
    try:
        return fn()
    except Exception as error:  # noqa: BLE001 - reported by name, the probe goes on
        say(f"ERROR {name}: {type(error).__name__}: {str(error)[:300]}")
        return default


def prepared_graph(program):
    """The CUDA graph of a program's one prepared call (None before its second call)."""
    calls = list(program._calls.values())
    return calls[-1].graph if calls else None


def kernels_of(fn, calls: int = 5) -> str:
    """Each GPU kernel and copy of `calls` calls of fn (torch.profiler): name, count a call, us each."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = [(e.key, e.count / calls, e.device_time_total / e.count) for e in prof.key_averages()
            if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1] * r[2])
    return "; ".join(f"{k[:40]} x{n:g} {us:.1f} us" for k, n, us in rows[:6]) or "(no kernels seen)"


# ---- 1. floor ---------------------------------------------------------------------------------------

def floor_section():
    x = torch.randn(4096, device="cuda", dtype=BF16)
    y = torch.empty_like(x)
    one = torch.cuda.CUDAGraph()
    with torch.cuda.graph(one):
        y.copy_(x)
    three = torch.cuda.CUDAGraph()
    with torch.cuda.graph(three):
        y.copy_(x)
        y.add_(1)
        y.copy_(x)
    big = torch.empty(1024 * H, device="cuda", dtype=BF16)
    big_out = torch.empty_like(big)
    t = time_interleaved_ms({"graph of one 8 KB copy kernel": one.replay,
                             "graph of three dependent kernels": three.replay, "torch y.copy_(x) 8 KB": lambda: y.copy_(x),
                             "torch copy 14.7 MB": lambda: big_out.copy_(big)}, windows=5)
    for name, ms in t.items():
        extra = f" ({2 * big.numel() * 2 / ms / 1e9:.0f} GB/s read+write)" if "14.7" in name else ""
        say(f"floor {name:<34} {ms * 1000:7.2f} us a call back to back{extra}")
    TABLE.append(f"{'floor: graph of one kernel / of three':<44} {t['graph of one 8 KB copy kernel'] * 1000:6.1f} / "
                 f"{t['graph of three dependent kernels'] * 1000:.1f} us; 14.7 MB copy {t['torch copy 14.7 MB'] * 1000:.1f} us")


# ---- 2. MoE dispatch and combine ---------------------------------------------------------------------

def family_lines(events) -> list[str]:
    """Per family: instances, programs, first start, last end, median and max busy, total waiting."""
    lines = []
    for family in dict.fromkeys(e.family for e in events):
        mine = [e for e in events if e.family == family]
        busy = sorted(e.end_us - e.waited_us for e in mine)
        waiting = sum(e.waited_us - e.start_us for e in mine)
        programs = len({e.program for e in mine})
        per_program = {}
        for e in mine:
            per_program[e.program] = per_program.get(e.program, 0) + 1
        lines.append(f"  {family:<6} {len(mine):5d} inst on {programs:3d} programs (<= {max(per_program.values())} each); "
                     f"{min(e.start_us for e in mine):8.1f} -> {max(e.end_us for e in mine):8.1f} us; busy median "
                     f"{busy[len(busy) // 2]:6.2f} max {busy[-1]:7.2f} us; waiting {waiting / programs:7.1f} us a program")
    return lines


def trace_one(name, program, T, call_args):
    """One traced program: three calls, the last one's events summarised and written as JSON."""
    for _ in range(3):
        program(**call_args)
    found = trace.events(program)
    span = max(e.end_us for e in found) - min(e.start_us for e in found)
    say(f"trace {name} T={T}: {len(found)} instances, span {span:.1f} us (from the kernel's entry)")
    for line in family_lines(found):
        say(line)
    target = out_dir() / f"trace_{name}_T{T}.json"
    trace.chrome_trace(found, target)
    with open(target, "rb") as raw, gzip.open(f"{target}.gz", "wb") as packed:
        packed.write(raw.read())
    target.unlink()
    return span


# key: (program, consts). The library programs, and each with one const as before session 14, to
# show what that choice was worth in the same run
MOE_PROGRAMS = {"dispatch": (PROGRAMS / "moe_dispatch.tds", {}), "combine": (PROGRAMS / "moe_combine.tds", {}),
                "fp8": (PROGRAMS / "moe_dispatch_fp8.tds", {}),
                "dispatch_BH1024": (PROGRAMS / "moe_dispatch.tds", {"BH": 1024}),
                "combine_BR32_BH1024": (PROGRAMS / "moe_combine.tds", {"BR": 32, "BH": 1024}),
                # one pass a direction (issue 27): the expert rank gathers rows from X@s by the token numbers
                # the token's rank packed; the token's rank sums its K rows from Y@(expert's rank)
                # pack tiles of 16 rows: half the tiles (and their system-scope signals) of 8
                "dispatch_BT16": (PROGRAMS / "moe_dispatch.tds", {"BT": 16, "BR": 16}),
                "dispatch_direct": (EXPERIMENTS / "moe_dispatch_direct.tds", {}),
                # half its gathering tiles (each waits twice and reads the count, most empty at 128 tokens)
                "dispatch_direct_BH4096": (EXPERIMENTS / "moe_dispatch_direct.tds", {"BH": 4096}),
                "combine_direct": (EXPERIMENTS / "moe_combine_direct.tds", {})}
PAIRS = (("dispatch", "combine"), ("dispatch_BH1024", "combine_BR32_BH1024"), ("fp8", "combine"),
         ("dispatch_direct", "combine_direct"), ("dispatch_BT16", "combine_direct"),
         ("dispatch_direct_BH4096", "combine_direct"))


def moe_case(heap, T, programs, traced):
    world = 1
    E = NE // world
    X = torch.randn(T, H, device="cuda", dtype=BF16)
    ids = torch.rand(T, NE, device="cuda").topk(TOPK, dim=1).indices.to(torch.int32)
    w = torch.softmax(torch.randn(T, TOPK, device="cuda"), dim=1)
    want = (w[..., None] * X[:, None, :].float()).sum(1)
    most = int(torch.bincount(ids.flatten().long(), minlength=NE).max())
    C = max(64, math.ceil(most / 64) * 64)
    recv = torch.empty(E, world, C, H, device="cuda", dtype=BF16)
    count = torch.empty(E, world, device="cuda", dtype=torch.int32)
    slot = torch.empty(T, TOPK, device="cuda", dtype=torch.int32)
    out = torch.full((T, H), NAN, device="cuda", dtype=BF16)
    recv8 = torch.empty(E, world, C, H, device="cuda", dtype=torch.float8_e4m3fn)
    rscale = torch.empty(E, world, C, H // 128, device="cuda")
    Y8 = torch.empty(E, world, C, H, device="cuda", dtype=BF16)
    moved = T * TOPK * H * 2
    say(f"moe T={T}: C={C}, {moved / 1e6:.1f} MB of rows each way (read once and written once at 4 TB/s: "
        f"{2 * moved / 4e12 * 1e6:.1f} us a direction)")
    args = {}
    for key in programs:
        if key.startswith("fp8"):
            args[key] = dict(X=X, ids=ids, recv=recv8, rscale=rscale, count=count, slot=slot)
        elif key.startswith("dispatch"):
            args[key] = dict(X=X, ids=ids, recv=recv, count=count, slot=slot)
        else:
            args[key] = dict(Y=recv, ids=ids, w=w, out=out)
    calls = {key: (lambda check=False, key=key: programs[key](**args[key], check=check)) for key in programs}
    good = set()
    for d, c in PAIRS:  # right first: dispatch, the identity expert (fp8: dequantised once), combine
        if d not in calls or c not in calls:
            continue

        def both(d=d, c=c):
            out.fill_(NAN)
            calls[d](check=True)
            if d.startswith("fp8"):
                Y8.copy_((recv8.float().unflatten(-1, (H // 128, 128)) * rscale.unsqueeze(-1)).flatten(-2))
                programs[c](Y=Y8, ids=ids, w=w, out=out, check=True)
            else:
                calls[c](check=True)
            return ok(f"moe {d} + {c} T={T}", out, want, 7e-2 if d.startswith("fp8") else 2e-2)
        if guarded(f"run {d} + {c} T={T}", lambda both=both: both() and both(), False):
            good.update((d, c))
    timed = {key: calls[key] for key in calls if key in good}
    result = {}

    def a2a():
        result["o"] = base.dispatch_combine_a2a(X, ids, w, NE, world)
    a2a()
    if ok(f"all_to_all_single T={T}", result["o"], want):
        timed["all_to_all_single (both)"] = a2a
    times = time_interleaved_ms(timed, windows=4 if QUICK else 7, calls=10 if QUICK else 20)
    for key, ms in times.items():
        say(f"moe T={T} {key:<26} {ms * 1000:9.1f} us a call")
    us = {k: times.get(k, NAN) * 1000 for k in (*MOE_PROGRAMS, "all_to_all_single (both)")}
    TABLE.append(f"{f'moe T={T} dispatch+combine = d + c':<44} {us['dispatch'] + us['combine']:7.1f} = "
                 f"{us['dispatch']:.1f} + {us['combine']:.1f} us; fp8 dispatch {us['fp8']:.1f}; "
                 f"a2a {us['all_to_all_single (both)']:.1f}")
    TABLE.append(f"{f'moe T={T} direct dispatch+combine':<44} {us['dispatch_direct'] + us['combine_direct']:7.1f} = "
                 f"{us['dispatch_direct']:.1f} + {us['combine_direct']:.1f} us")
    # where the time goes: the kernels of one call, then every instance of a traced call
    for key in () if QUICK else ("dispatch", "combine", "fp8", "dispatch_direct", "combine_direct"):
        if key in timed:
            say(f"moe T={T} {key} kernels: {guarded(f'profile {key}', lambda key=key: kernels_of(timed[key]), '?')}")
    for key, program in traced.items():
        if over_budget(f"moe T={T} trace {key}"):
            return
        guarded(f"trace {key} T={T}", lambda key=key, program=program: trace_one(key, program, T, args[key]))


def ops_path(heap, T):
    """tiledsl.ops.moe_dispatch / moe_combine: the tuned choice, and each path forced, per call."""
    import tiledsl.ops as ops
    ops.use_heap(heap)
    X = torch.randn(T, H, device="cuda", dtype=BF16)
    ids = torch.rand(T, NE, device="cuda").topk(TOPK, dim=1).indices.to(torch.int32)
    w = torch.softmax(torch.randn(T, TOPK, device="cuda"), dim=1)
    C = max(64, math.ceil(int(torch.bincount(ids.flatten().long(), minlength=NE).max()) / 64) * 64)
    fns = {}
    for impl in (None, "torch", "moe_dispatch"):
        label = impl or "tuned"
        fns[f"ops dispatch ({label})"] = lambda impl=impl: ops.moe_dispatch(X, ids, NE, C, impl=impl)
    recv, _ = ops.moe_dispatch(X, ids, NE, C, impl="torch")
    for impl in (None, "torch", "moe_combine"):
        label = impl or "tuned"
        fns[f"ops combine ({label})"] = lambda impl=impl: ops.moe_combine(recv, ids, w, impl=impl)
    for fn in fns.values():
        fn()
    times = time_interleaved_ms(fns, windows=5, calls=10, warmup=2)
    for key, ms in times.items():
        say(f"moe T={T} {key:<30} {ms * 1000:9.1f} us a call")
    say(f"ops explain: {ops.explain()}"[:1500])
    TABLE.append(f"{f'moe T={T} ops dispatch/combine tuned vs torch':<44} "
                 f"{times['ops dispatch (tuned)'] * 1000:.1f}/{times['ops combine (tuned)'] * 1000:.1f} us vs "
                 f"{times['ops dispatch (torch)'] * 1000:.1f}/{times['ops combine (torch)'] * 1000:.1f}")


def moe_section(heap):
    keys = ("dispatch", "combine", "fp8", "dispatch_direct", "combine_direct") if QUICK else tuple(MOE_PROGRAMS)
    programs = {k: guarded(f"compile {k}", lambda p=p, c=c: tiledsl.compile(p, heap, **c), None)
                for k, (p, c) in MOE_PROGRAMS.items() if k in keys}
    programs = {k: p for k, p in programs.items() if p is not None}
    traced = {} if QUICK else {
        k: guarded(f"compile {k} traced", lambda k=k: tiledsl.compile(MOE_PROGRAMS[k][0], heap, trace=True), None)
        for k in ("dispatch", "combine", "fp8", "dispatch_direct", "combine_direct")}
    traced = {k: p for k, p in traced.items() if p is not None}
    for T in (128, 4096):
        if over_budget(f"moe T={T}"):
            return
        moe_case(heap, T, programs, traced)
    if not QUICK and not over_budget("moe ops path"):
        guarded("moe ops path", lambda: ops_path(heap, 128))


# ---- 3. skinny products ------------------------------------------------------------------------------

SKINNY = EXPERIMENTS / "gemm_ar_skinny.tds"


def skinny_consts(M: int, N: int, K: int, sms: int, BN: int = 64, BK: int = 128) -> dict:
    """The skinny tile's rows (16 for M <= 16, else 64 or 128: one row block, B streamed once) and the
    split of K that gives the SMs about two tiles each (each split at least 4 steps of BK)."""
    BM = 16 if M <= 16 else 64 if M <= 64 else 128
    tiles = math.ceil(M / BM) * math.ceil(N / BN)
    KS = 1
    while KS < 16 and tiles * KS * 2 <= 2 * sms and K % (2 * KS * BK) == 0 and K // (2 * KS * BK) >= 4:
        KS *= 2
    return {"BM": BM, "BN": BN, "BK": BK, "KS": KS}


def products_section(heap):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # gemm_ar's TMA tile: 3.2-4.9x cuBLAS in round 1; left out of the quick run (a compile)
    library = None if QUICK else guarded("compile gemm_ar.tds", lambda: tiledsl.compile(PROGRAMS / "gemm_ar.tds", heap),
                                         None)
    compiled = {}

    def skinny(consts, **options):
        key = tuple(sorted(consts.items())) + tuple(sorted(options.items()))
        if key not in compiled:
            compiled[key] = guarded(f"compile skinny {consts} {options}",
                                    lambda: tiledsl.compile(SKINNY, heap, **consts, **options), None)
        return compiled[key]
    worst, rows = {}, []
    shapes = decode_shapes()
    points = [(name, M) for name in shapes for M in GEMM_M]
    if QUICK:  # the square shape at every M, then the smallest N (K split 8 ways)
        points = [("square 8192", M) for M in GEMM_M] + [("70B QKV tp8", 1), ("70B QKV tp8", 8)]
    for shape_name, M in points:
        N, K = shapes[shape_name]
        if over_budget(f"products {shape_name} M={M}"):
            return
        A = torch.randn(M, K, device="cuda", dtype=BF16)
        B = torch.randn(K, N, device="cuda", dtype=BF16) * K ** -0.5
        C = torch.full((M, N), NAN, device="cuda", dtype=BF16)
        want = A.float() @ B.float()
        consts = skinny_consts(M, N, K, sms)
        fns = {"cublas": lambda: torch.matmul(A, B, out=C)}
        if library is not None:
            fns["gemm_ar"] = lambda: library(A, B, C, check=False)
        variants = {"skinny": skinny(consts)}
        if consts["BM"] == 16 and not QUICK:  # 61 KB of shared memory: three programs fit an SM
            variants["skinny_2x"] = skinny(consts, num_sms=2 * sms)
        for key, program in variants.items():
            if program is not None:
                fns[key] = lambda program=program: program(A, B, C, check=False)
        checked = {}
        for key, fn in fns.items():
            C.fill_(NAN)
            if guarded(f"{key} {shape_name} M={M}", lambda fn=fn: (fn(), fn(), fn(), torch.cuda.synchronize())
                       and ok(f"{key} {shape_name} M={M}", C, want), False):
                checked[key] = fn
        for key, program in variants.items():
            if key in checked:
                guarded(f"check {key}", program.check)
        times = time_interleaved_ms(checked, windows=3 if QUICK else 5, calls=20, warmup=3)
        cublas = times["cublas"]
        best = min((ms for k, ms in times.items() if k.startswith("skinny")), default=NAN)
        cells = ", ".join(f"{k} {ms * 1000:.1f}" for k, ms in times.items())
        say(f"product {shape_name:<16} M={M:<3} N={N:<5} K={K:<5} {consts}: {cells} us; "
            f"skinny best / cuBLAS {best / cublas:.2f}")
        for key, ms in times.items():
            worst[key] = max(worst.get(key, 0), ms / cublas)
        worst["skinny best"] = max(worst.get("skinny best", 0), best / cublas)
        rows.append(best / cublas)
        if QUICK:
            TABLE.append(f"{f'product {shape_name} M={M}':<44} skinny {best * 1000:.1f} us, cuBLAS "
                         f"{cublas * 1000:.1f}, gemm_ar {times.get('gemm_ar', NAN) * 1000:.1f} ({best / cublas:.2f}x)")
        del A, B, C, want
    met = sum(r <= 1.1 for r in rows)
    TABLE.append(f"{f'products: worst / cuBLAS ({len(rows)} points)':<44} " +
                 ", ".join(f"{k} {v:.2f}x" for k, v in worst.items() if k != "cublas") +
                 f"; skinny best <= 1.1x at {met} of {len(rows)}")


def gemm_ar_traces(heap):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for M in (1, 128):
        consts = skinny_consts(M, 8192, 8192, sms)
        program = tiledsl.compile(SKINNY, heap, trace=True, **consts)
        A = torch.randn(M, 8192, device="cuda", dtype=BF16)
        B = torch.randn(8192, 8192, device="cuda", dtype=BF16)
        C = torch.empty(M, 8192, device="cuda", dtype=BF16)
        for _ in range(3):
            program(A, B, C)
        found = trace.events(program)
        mm = [e for e in found if e.family == "mm"]
        busy = statistics.median(e.end_us - e.waited_us for e in mm)
        strip = 8192 // consts["KS"] * consts["BN"] * 2  # bytes of B one tile streams
        say(f"trace gemm_ar_skinny M={M} {consts}: {len(mm)} mm tiles, median {busy:.1f} us each "
            f"({strip / busy / 1e3:.1f} GB/s a tile); span {max(e.end_us for e in found) - min(e.start_us for e in found):.1f} us")
        for line in family_lines(found):
            say(line)


# ---- 4. the call itself: an 8 KB all-reduce ---------------------------------------------------------

def raw_launch(graph):
    """The graph launched through the CUDA runtime directly (cuda.bindings), not torch's replay(): what
    a call costs without torch's wrapper. The executable graph's handle needs a graph kept by torch."""
    from cuda.bindings import runtime as cudart
    handle = cudart.cudaGraphExec_t(int(graph.raw_cuda_graph_exec()))
    stream = cudart.cudaStream_t(torch.cuda.current_stream().cuda_stream)

    def launch():
        error, = cudart.cudaGraphLaunch(handle, stream)
        if error != cudart.cudaError_t.cudaSuccess:
            raise RuntimeError(f"cudaGraphLaunch: {error}")
    launch()
    torch.cuda.synchronize()
    return launch


def call_section(heap):
    group = dist.group.WORLD.group_name
    fresh = torch.randn(4096, device="cuda", dtype=BF16) * 2.0 ** -100
    x = fresh.clone()
    y = torch.empty_like(x)
    one = tiledsl.compile(PROGRAMS / "allreduce.tds", heap, num_warps=16)
    two = None if QUICK else tiledsl.compile(PROGRAMS / "allreduce_two_shot.tds", heap)
    out_of_place = tiledsl.compile(PROGRAMS / "allreduce_out.tds", heap, num_warps=16)
    copy = tiledsl.compile(PROGRAMS / "copy.tds", heap)
    hx = tiledsl.empty(4096, BF16, heap=heap)
    hx.copy_(fresh)
    fns = {"tiledsl one-shot (X staged)": lambda: one(x, check=False),
           "tiledsl two-shot (X staged)": lambda: two(x, check=False),
           "tiledsl out of place, X on heap": lambda: out_of_place(hx, y, check=False),
           "tiledsl copy.tds 8 KB": lambda: copy(fresh, y, check=False)}
    if two is None:
        del fns["tiledsl two-shot (X staged)"]
    for key, fn in list(fns.items()):  # right first (world 1: the sum is the input), then the graph exists
        x.copy_(fresh)
        fn()
        fn()
        torch.cuda.synchronize()
        if not ok(key, x if "staged" in key else y, fresh.float()):  # world 1: the sum is X itself
            del fns[key]
    try:
        from torch.distributed import _symmetric_memory as symm_mem
        symm = symm_mem.empty(4096, dtype=BF16, device="cuda")
        symm_mem.rendezvous(symm, group)
        symm.copy_(fresh)
        fns["torch symm_mem two-shot"] = lambda: torch.ops.symm_mem.two_shot_all_reduce_(symm, "sum", group)
        fns["torch symm_mem one-shot"] = lambda: torch.ops.symm_mem.one_shot_all_reduce(symm, "sum", group)
    except Exception as error:  # noqa: BLE001
        say(f"ERROR symm_mem: {type(error).__name__}: {str(error)[:200]}")
    fns["nccl all_reduce"] = lambda: dist.all_reduce(x)
    programs = {"tiledsl one-shot (X staged)": one, "tiledsl two-shot (X staged)": two,
                "tiledsl out of place, X on heap": out_of_place, "tiledsl copy.tds 8 KB": copy}
    graphs = {f"{k}: graph only": g.replay for k, p in programs.items() if k in fns and (g := prepared_graph(p))}
    launch = guarded("cudaGraphLaunch", lambda: raw_launch(prepared_graph(copy)), None)
    if launch is not None:
        graphs["tiledsl copy.tds 8 KB: cudaGraphLaunch"] = launch
    if QUICK:
        for key in ("torch symm_mem one-shot", "nccl all_reduce"):
            fns.pop(key, None)
    loop = time_interleaved_ms({**fns, **graphs}, windows=5 if QUICK else 9)
    for key, ms in loop.items():
        host = host_us(fns[key]) if key in fns else host_us(graphs[key])
        kernels = "" if QUICK else guarded(f"profile {key}", lambda key=key: kernels_of(fns.get(key) or graphs[key]), "?")
        say(f"call {key:<44} {ms * 1000:6.2f} us back to back; host {host:6.2f} us a call; {kernels}")
    symm2 = loop.get("torch symm_mem two-shot", NAN)
    TABLE.append(f"{'8 KB all-reduce one-shot / heap / symm 2-shot':<44} "
                 f"{loop.get('tiledsl one-shot (X staged)', NAN) * 1000:.1f} / "
                 f"{loop.get('tiledsl out of place, X on heap', NAN) * 1000:.1f} / {symm2 * 1000:.1f} us")
    TABLE.append(f"{'8 KB copy.tds call / its graph alone':<44} {loop.get('tiledsl copy.tds 8 KB', NAN) * 1000:.1f} / "
                 f"{loop.get('tiledsl copy.tds 8 KB: graph only', NAN) * 1000:.1f} us")


def main() -> int:
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str((6 if QUICK else 24) << 30))
    _, world, heap = start(27)
    if world != 1:
        raise SystemExit("latency_probe.py is made for world 1 (one GPU): torchrun --nproc-per-node=1")
    only = [s for s in os.environ.get("PROBE_ONLY", "").split(",") if s]
    sections = {"moe": lambda: moe_section(heap), "call": lambda: call_section(heap),
                "products": lambda: products_section(heap), "gemm_ar_trace": lambda: gemm_ar_traces(heap),
                "floor": lambda: floor_section()}
    if QUICK:
        del sections["gemm_ar_trace"], sections["floor"]
    for name, run in sections.items():
        if only and name not in only:
            continue
        if over_budget(name):
            continue
        began = time.monotonic()
        guarded(f"section {name}", run)
        say(f"-- section {name}: {time.monotonic() - began:.0f} s")
    say("== latency probe (world 1, one H200): times per call, back to back")
    for line in TABLE:
        say(line)
    heap.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
