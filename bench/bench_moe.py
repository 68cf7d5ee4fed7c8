"""The MoE programs under torchrun (world 2), bf16, against torch measured in the same run on random data:
  - dispatch + combine (moe_dispatch, moe_combine) at DeepSeek-V3's routing (hidden 7168, 256 experts,
    top-8) at 128 and 4096 tokens per rank, the dispatch in bf16 and in fp8 (moe_dispatch_fp8), against
    all_to_all_single with the splits exchanged first and against torch's symmetric-memory
    all_to_all_vdev_2d (its error recorded where it does not run); the expert in between is the
    identity, so every path must give sum over k of w * X;
  - the grouped GEMM tile alone (group_gemm, and group_gemm_fp8 on the same rows in fp8) against
    torch._grouped_mm (a loop of matmuls where this torch lacks it: the JSON says which), and
    group_gemm in the tile order used before the ninth session (experiments/group_gemm_expert_major);
  - AllGather + grouped GEMM (ag_group_gemm) at M = 8192 for Mixtral-8x7B, Qwen1.5-MoE and DeepSeek-MoE,
    and grouped GEMM + top-k reduction + ReduceScatter (moe_gemm_rs), against NCCL plus the grouped GEMM.
Every timed variant's output is checked against a float reference first (and after timing): a wrong
one is a FAIL line, left out (NaN), and the exit code is 1. Times are steady state (calls back to back
between CUDA events, median over windows), the slowest rank's. The targets of issue 12 are printed as
met / not met at the end, and everything goes to $OUT/moe_world{N}.json (and moe.png where matplotlib is)."""
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
import moe_baselines as base  # noqa: E402
from common import NAN, Verdicts, out_dir, save, slowest, time_loop_ms  # noqa: E402

import tiledsl  # noqa: E402
from tiledsl.runtime.heap import disable_multicast, open_heap  # noqa: E402

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
EXPERIMENTS = Path(__file__).resolve().parent / "experiments"
BF16 = torch.bfloat16
EP_HIDDEN, EP_EXPERTS, EP_TOPK = 7168, 256, 8        # DeepSeek-V3
EP_TOKENS = (128, 4096)                              # per rank: decode, prefill
FP8_GROUP = 128                                      # values one fp8 scale covers (moe_dispatch_fp8's QG)
AG_M = 8192                                          # tokens in all
AG_SHAPES = {"Mixtral-8x7B": (4096, 14336, 8, 2), "Qwen1.5-MoE": (1408, 2048, 60, 4),
             "DeepSeek-MoE": (2048, 1408, 64, 6)}    # (N, K, experts, top-k); N split over the ranks
RS_SHAPES = [(8192, 2048, 1536, 32, 2), (8192, 14336, 4096, 64, 4)]  # (tokens, N, K, experts, top-k); K split
_reported = set()


def optional(name, fn):
    """A baseline this machine may not run: NaN and one line saying why, instead of a crash."""
    try:
        return fn()
    except Exception as error:  # noqa: BLE001 - a missing baseline is reported, not fatal
        if dist.get_rank() == 0 and name not in _reported:
            _reported.add(name)
            print(f"  {name}: unavailable ({type(error).__name__}: {str(error)[:200]})", flush=True)
        return NAN


def timed(verdicts, name, call, got, want, check=lambda: None, tol=2e-2) -> float:
    """The slowest rank's steady-state ms of call(False), or NaN if `got()` differs from `want` after one
    checked call (which compiles and proves the schedule) or after the timed calls."""
    call(True)
    if not verdicts.ok(name, got(), want, tol):
        return NAN
    ms = slowest(time_loop_ms(lambda: call(False)))
    check()
    if not verdicts.ok(f"{name}, after timing", got(), want, tol):
        return NAN
    return ms


def uniform_ids(T, K, experts, device="cuda"):
    return torch.rand(T, experts, device=device).topk(K, dim=1).indices.to(torch.int32)


def capacity(counts: torch.Tensor) -> int:
    """Rows reserved per (rank, expert): the largest count on any rank, rounded up to 64."""
    most = counts.max().to(torch.int64).reshape(1).cuda()
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    return max(64, math.ceil(int(most) / 64) * 64)


def compact(padded: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The valid rows of a tensor declared `upto counts` ([..., C, N], counts [...]), in order."""
    C = padded.shape[-2]
    valid = torch.arange(C, device=padded.device) < counts.reshape(-1, 1).to(padded.device)
    return padded.reshape(-1, C, padded.shape[-1])[valid]


def torch_grouped_ok() -> bool:
    try:
        rows, B = torch.randn(32, 64, device="cuda", dtype=BF16), torch.randn(2, 64, 32, device="cuda", dtype=BF16)
        base.grouped_mm(rows, B, torch.tensor([16, 16], device="cuda"), True)
        return True
    except Exception:  # noqa: BLE001 - older torch, or an unsupported layout: the loop of matmuls
        return False


# ---- expert parallelism: dispatch + combine ------------------------------------------------------

def ep_row(heap, world, T, verdicts, group):
    H, NE, K = EP_HIDDEN, EP_EXPERTS, EP_TOPK
    E = NE // world
    X = torch.randn(T, H, device="cuda", dtype=BF16)
    ids = uniform_ids(T, K, NE)
    w = torch.softmax(torch.randn(T, K, device="cuda"), dim=1)
    want = (w[..., None] * X[:, None, :].float()).sum(1)  # the identity expert: no communication needed
    C = capacity(torch.bincount(ids.flatten().long(), minlength=NE))
    row = {"op": "dispatch+combine", "world": world, "tokens": T, "hidden": H, "experts": NE, "topk": K, "C": C}
    dispatch = tiledsl.compile(PROGRAMS / "moe_dispatch.tds", heap)
    combine = tiledsl.compile(PROGRAMS / "moe_combine.tds", heap)
    recv = torch.empty(E, world, C, H, device="cuda", dtype=BF16)
    count = torch.empty(E, world, device="cuda", dtype=torch.int32)
    slot = torch.empty(T, K, device="cuda", dtype=torch.int32)
    out = torch.full((T, H), NAN, device="cuda", dtype=BF16)

    def send(check):
        dispatch(X=X, ids=ids, recv=recv, count=count, slot=slot, check=check)

    def back(check):
        combine(Y=recv, ids=ids, w=w, out=out, check=check)

    def both_checks():
        dispatch.check()
        combine.check()
    row["tiledsl"] = timed(verdicts, f"moe dispatch+combine T={T}", lambda check: (send(check), back(check)),
                           lambda: out, want, both_checks)
    # each alone (the other's output is in place): dispatch's output reaches `out` only through combine
    row["tiledsl_dispatch"] = slowest(time_loop_ms(lambda: send(False)))
    row["tiledsl_combine"] = slowest(time_loop_ms(lambda: back(False)))
    both_checks()
    result = {}
    row["all_to_all_single"] = timed(
        verdicts, f"all_to_all_single dispatch+combine T={T}",
        lambda check: result.update(out=base.dispatch_combine_a2a(X, ids, w, NE, world)), lambda: result["out"], want)
    vdev = optional("all_to_all_vdev_2d", lambda: base.VDev2d(T, K, H, NE, world, BF16, group, world * T * K))
    row["all_to_all_vdev_2d"] = NAN if not isinstance(vdev, base.VDev2d) else optional(
        "all_to_all_vdev_2d", lambda: timed(verdicts, f"all_to_all_vdev_2d dispatch+combine T={T}",
                                            lambda check: result.update(v=vdev(X, ids, w)), lambda: result["v"], want))
    row.update(fp8_dispatch(heap, world, X, ids, w, want, C, count, slot, out, combine, verdicts))
    return row


def fp8_dispatch(heap, world, X, ids, w, want, C, count, slot, out, combine, verdicts) -> dict:
    """moe_dispatch_fp8 (e4m3 on the wire, one scale per FP8_GROUP values) and the same bf16 combine:
    the identity expert dequantises the arrived rows (recv * rscale) once, in the checked call, and
    the timed calls leave that step out (it is the expert's work, not the wire's); each alone too."""
    T, H = X.shape
    E = EP_EXPERTS // world
    dispatch = tiledsl.compile(PROGRAMS / "moe_dispatch_fp8.tds", heap)
    recv = torch.empty(E, world, C, H, device="cuda", dtype=torch.float8_e4m3fn)
    rscale = torch.empty(E, world, C, H // FP8_GROUP, device="cuda")
    Y = torch.empty(E, world, C, H, device="cuda", dtype=BF16)

    def send(check):
        dispatch(X=X, ids=ids, recv=recv, rscale=rscale, count=count, slot=slot, check=check)

    def both(check):
        send(check)
        if check:
            Y.copy_((recv.float().unflatten(-1, (H // FP8_GROUP, FP8_GROUP)) * rscale.unsqueeze(-1)).flatten(-2))
        combine(Y=Y, ids=ids, w=w, out=out, check=check)

    def checks():
        dispatch.check()
        combine.check()
    out.fill_(NAN)
    # e4m3 rounds each value by up to 2^-4 of itself: the weighted sum of k rows keeps that relative size
    row = {"tiledsl_fp8": timed(verdicts, f"moe dispatch fp8 + combine T={T}", both, lambda: out, want, checks,
                                tol=7e-2)}
    row["tiledsl_fp8_dispatch"] = slowest(time_loop_ms(lambda: send(False)))
    dispatch.check()
    return row


# ---- the grouped GEMM tile alone -----------------------------------------------------------------

def group_gemm_row(heap, world, model, N, K, E, topk, verdicts, use_torch, consts=None):
    rows_in_all, N_local = AG_M * topk, N // world
    counts = torch.full((E,), rows_in_all // E // 16 * 16, device="cuda")
    counts[: (rows_in_all - int(counts.sum())) // 16] += 16  # the rest, 16 rows at a time
    C = max(64, math.ceil(int(counts.max()) / 64) * 64)
    P = torch.randn(E, C, K, device="cuda", dtype=BF16)
    B = torch.randn(E, K, N_local, device="cuda", dtype=BF16) * K ** -0.5
    G = torch.full((E, C, N_local), NAN, device="cuda", dtype=BF16)
    rows = compact(P, counts)
    want = base.grouped_mm(rows.float(), B.float(), counts, False)
    program = tiledsl.compile(PROGRAMS / "group_gemm.tds", heap, **(consts or {}))
    count32 = counts.to(torch.int32)
    row = {"op": "group_gemm", "model": model, "rows": int(counts.sum()), "N": N_local, "K": K, "E": E, "C": C,
           "torch_grouped": "torch._grouped_mm" if use_torch else "loop of matmuls", **(consts or {})}
    row["tiledsl"] = timed(verdicts, f"group_gemm {model}", lambda check: program(count=count32, P=P, B=B, G=G,
                                                                                   check=check),
                           lambda: compact(G, counts), want, program.check)
    # the same tiles in the order the library gave them before the ninth session (a wave: one row
    # block of 8 experts), to show in one run what the order costs
    old = tiledsl.compile(EXPERIMENTS / "group_gemm_expert_major.tds", heap, **(consts or {}))
    row["tiledsl_expert_major"] = timed(verdicts, f"group_gemm expert-major order {model}",
                                        lambda check: old(count=count32, P=P, B=B, G=G, check=check),
                                        lambda: compact(G, counts), want, old.check)
    result = {}
    row["torch"] = timed(verdicts, f"torch grouped GEMM {model}",
                         lambda check: result.update(o=base.grouped_mm(rows, B, counts, use_torch)),
                         lambda: result["o"], want)
    if K % FP8_GROUP == 0:  # the same rows as they arrive in fp8 (moe_dispatch_fp8): group_gemm_fp8
        scale = P.float().unflatten(-1, (K // FP8_GROUP, FP8_GROUP)).abs().amax(-1).clamp_min(1e-30) / 448
        P8 = (P.float().unflatten(-1, scale.shape[-1:] + (FP8_GROUP,)) / scale.unsqueeze(-1)).flatten(-2).to(
            torch.float8_e4m3fn)
        rows8 = compact((P8.float().unflatten(-1, scale.shape[-1:] + (FP8_GROUP,)) * scale.unsqueeze(-1)).flatten(-2)
                        .to(BF16), counts)
        want8 = base.grouped_mm(rows8.float(), B.float(), counts, False)
        fp8 = tiledsl.compile(PROGRAMS / "group_gemm_fp8.tds", heap)
        row["tiledsl_fp8"] = timed(verdicts, f"group_gemm_fp8 {model}",
                                   lambda check: fp8(count=count32, P=P8, S=scale, B=B, G=G, check=check),
                                   lambda: compact(G, counts), want8, fp8.check)
    return row


# ---- tensor parallelism: AllGather + grouped GEMM, grouped GEMM + ReduceScatter --------------------

def ag_row(heap, world, model, N, K, E, topk, verdicts, use_torch, consts=None):
    T, N_local = AG_M // world, N // world
    A = torch.randn(T, K, device="cuda", dtype=BF16)
    ids = uniform_ids(T, topk, E)
    B = torch.randn(E, K, N_local, device="cuda", dtype=BF16) * K ** -0.5
    C = capacity(torch.bincount(ids.flatten().long(), minlength=E))
    want = base.ag_group_gemm_sequential(A.float(), ids, B.float(), world, False)
    program = tiledsl.compile(PROGRAMS / "ag_group_gemm.tds", heap, **(consts or {}))
    G = torch.full((world, E, C, N_local), NAN, device="cuda", dtype=BF16)
    count = torch.empty(world, E, device="cuda", dtype=torch.int32)
    row = {"op": "ag_group_gemm", "model": model, "M": AG_M, "N": N_local, "K": K, "E": E, "topk": topk, "C": C,
           "torch_grouped": "torch._grouped_mm" if use_torch else "loop of matmuls", **(consts or {})}
    row["tiledsl"] = timed(verdicts, f"ag_group_gemm {model}",
                           lambda check: program(A=A, ids=ids, B=B, G=G, count=count, check=check),
                           lambda: compact(G, count), want, program.check)
    result = {}
    row["sequential"] = timed(verdicts, f"all-gather + grouped GEMM {model}",
                              lambda check: result.update(o=base.ag_group_gemm_sequential(A, ids, B, world, use_torch)),
                              lambda: result["o"], want)
    return row


def rs_row(heap, world, tokens, N, K, E, topk, verdicts, use_torch):
    T, I_local = tokens // world, K // world
    ids = uniform_ids(T, topk, E)
    w = torch.softmax(torch.randn(T, topk, device="cuda"), dim=1)
    every_ids = torch.empty(world * T, topk, device="cuda", dtype=torch.int32)
    dist.all_gather_into_tensor(every_ids, ids)
    every_w = torch.empty(world * T, topk, device="cuda")
    dist.all_gather_into_tensor(every_w, w)
    groups = [base.grouped(every_ids[s * T:(s + 1) * T], E) for s in range(world)]
    counts = torch.stack([g[1] for g in groups])  # [world, E]
    order = torch.stack([g[0] for g in groups])
    C = capacity(counts)
    Hx = torch.randn(world, E, C, I_local, device="cuda", dtype=BF16)
    B = torch.randn(E, I_local, N, device="cuda", dtype=BF16) * K ** -0.5
    Hx_rows = compact(Hx, counts)  # [world * T * topk, I_local], rank by rank, expert by expert
    W = every_w.view(world, T, topk)
    want = base.moe_gemm_rs_sequential(Hx_rows.float(), counts, order, W, B.float(), world, False).float()
    program = tiledsl.compile(PROGRAMS / "moe_gemm_rs.tds", heap)
    Y = torch.full((T, N), NAN, device="cuda", dtype=BF16)
    row = {"op": "moe_gemm_rs", "tokens": tokens, "N": N, "K": I_local, "E": E, "topk": topk, "C": C,
           "torch_grouped": "torch._grouped_mm" if use_torch else "loop of matmuls"}
    row["tiledsl"] = timed(verdicts, f"moe_gemm_rs tokens={tokens} N={N} K={K}",
                           lambda check: program(Hx=Hx, ids=ids, w=w, B=B, Y=Y, check=check), lambda: Y, want,
                           program.check)
    result = {}
    row["sequential"] = timed(
        verdicts, f"grouped GEMM + reduce-scatter tokens={tokens} N={N} K={K}",
        lambda check: result.update(o=base.moe_gemm_rs_sequential(Hx_rows, counts, order, W, B, world, use_torch)),
        lambda: result["o"], want)
    return row


# ---- the verdicts against the targets ------------------------------------------------------

def geomean(values):
    values = [v for v in values if math.isfinite(v) and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else NAN


def targets(rows) -> list[str]:
    ep = {r["tokens"]: r for r in rows if r["op"] == "dispatch+combine"}
    lines = []
    big, small = ep.get(4096), ep.get(128)
    if big:
        speedup = big["all_to_all_single"] / big["tiledsl"]
        faster = big["tiledsl"] < big["all_to_all_vdev_2d"]  # False where vdev_2d did not run (NaN)
        lines.append(f"dispatch+combine 4096 tokens: {speedup:.2f}x over all_to_all_single (target 2x): "
                     f"{'met' if speedup >= 2 else 'not met'}; vs all_to_all_vdev_2d {big['all_to_all_vdev_2d']:.3f} "
                     f"ms against {big['tiledsl']:.3f} ms: {'met' if faster else 'not met'}")
    if small:
        us, us8 = small["tiledsl"] * 1000, small["tiledsl_fp8"] * 1000
        lines.append(f"dispatch+combine 128 tokens bf16: {us:.1f} us (target under 40 us): "
                     f"{'met' if us < 40 else 'not met'}; fp8: {us8:.1f} us: {'met' if us8 < 40 else 'not met'}")
    tile = [r["torch"] / r["tiledsl"] for r in rows if r["op"] == "group_gemm"]
    if tile:
        lines.append(f"grouped GEMM tile: {min(tile):.2f}x of torch at worst, geometric mean {geomean(tile):.2f}x "
                     f"(target 0.9x): {'met' if min(tile) >= 0.9 else 'not met'}")
    fp8 = [r["torch"] / r["tiledsl_fp8"] for r in rows if r["op"] == "group_gemm" and "tiledsl_fp8" in r]
    if fp8:
        lines.append(f"grouped GEMM on fp8 rows (group_gemm_fp8) against torch's bf16 grouped GEMM: "
                     f"{min(fp8):.2f}x at worst, geometric mean {geomean(fp8):.2f}x (no target)")
    for op, name in (("ag_group_gemm", "AG + grouped GEMM"), ("moe_gemm_rs", "MoE + RS")):
        mean = geomean([r["sequential"] / r["tiledsl"] for r in rows if r["op"] == op])
        lines.append(f"{name}: {mean:.2f}x over sequential, geometric mean (target 1.15x): "
                     f"{'met' if mean >= 1.15 else 'not met'}")
    return lines


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    labels, speedups = [], []
    for r in rows:
        baseline = {"dispatch+combine": "all_to_all_single", "group_gemm": "torch"}.get(r["op"], "sequential")
        labels.append(f"{r['op']}\n{r.get('model') or r.get('tokens')}")
        speedups.append(r[baseline] / r["tiledsl"] if r["tiledsl"] > 0 else NAN)
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.1), 4))
    ax.bar(range(len(rows)), speedups)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), labels, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("speedup over the torch baseline")
    ax.set_title("tiledsl MoE programs, world 2, bf16")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    disable_multicast()
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(24 << 30))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(1212 + rank)
    heap = open_heap()
    group = dist.group.WORLD.group_name
    try:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group
        enable_symm_mem_for_group(group)
    except Exception:  # noqa: BLE001 - all_to_all_vdev_2d then reports itself unavailable
        pass
    verdicts, rows = Verdicts(), []
    use_torch = torch_grouped_ok()
    only = os.environ.get("MOE_ONLY", "")  # a part of the benchmark by op name, to try one under a short limit

    def add(row):
        rows.append(row)
        if rank == 0:
            print(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                  flush=True)
    if rank == 0:
        print(f"world {world}; times in ms; grouped GEMM baseline: "
              f"{'torch._grouped_mm' if use_torch else 'loop of matmuls'}", flush=True)
    if only in "dispatch+combine":
        for T in EP_TOKENS:
            add(ep_row(heap, world, T, verdicts, group))
    for model, (N, K, E, topk) in AG_SHAPES.items():
        if only in "group_gemm":
            add(group_gemm_row(heap, world, model, N, K, E, topk, verdicts, use_torch))
        if only in "ag_group_gemm":
            add(ag_row(heap, world, model, N, K, E, topk, verdicts, use_torch))
    for tokens, N, K, E, topk in RS_SHAPES:
        if only in "moe_gemm_rs":
            add(rs_row(heap, world, tokens, N, K, E, topk, verdicts, use_torch))
    if rank == 0:
        for line in targets(rows):
            print(f"target: {line}", flush=True)
        save(f"moe_world{world}", rows)
        plot(rows, out_dir() / "moe.png")
    code = verdicts.exit_code()
    heap.close()
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
