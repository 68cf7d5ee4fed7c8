"""Multi-GPU checks of the MoE programs, run under torchrun: moe_dispatch and moe_combine against
torch's expert-parallel path (the splits exchanged with all_to_all_single, then the rows), ag_group_gemm
and moe_gemm_rs against NCCL all-gather / reduce-scatter and per-expert matmuls. Routings that stress
the data dependence: uniform, skewed (expert 0 in every token's top-k), idle experts, a rank that sends
nothing, top-k of 1, 2 and 8, token counts no tile divides; 100 calls back to back, each with a fresh
routing and fresh inputs and its outputs poisoned (NaN); dispatch and combine also replayed inside the
caller's CUDA graph; and a count above capacity, which must raise CapacityExceeded naming the rank and
the expert. moe_dispatch_fp8 against the same path's bf16 rows: each arrived e4m3 value times its
group's scale within e4m3's rounding of the row, each scale its group's largest magnitude / 448;
group_gemm_fp8 against torch on one rank's ragged counts. Outputs declared `upto count` are compared
below the counts only. Rank 0 prints one PASS/FAIL line a check."""
import os
import re
import sys
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from harness import Case, Checks, back_to_back, cap_calls, close, empty, host, start  # noqa: E402

import tiledsl

PROGRAMS = Path(__file__).resolve().parents[2] / "programs"
CALLS = 100
NAN = float("nan")
BF16 = torch.bfloat16
# (T tokens per rank, H hidden, K top-k, E experts per rank, C capacity) of dispatch and combine
EP_SHAPES = [(128, 7168, 8, 16, 128), (333, 1000, 2, 4, 333), (64, 2048, 1, 8, 64)]
# (T, D or I, N, K, E, C) of the two grouped GEMMs
GEMM_SHAPES = [(256, 1024, 512, 2, 8, 256), (100, 512, 384, 8, 16, 100), (77, 256, 128, 1, 4, 77)]
# (D, N, E, C) of group_gemm_fp8: counts random below C, none a multiple of its 128-row tiles
FP8_GEMM_SHAPES = [(1024, 512, 8, 300), (256, 136, 3, 77)]
HEAP_BYTES = str(16 << 30)


# ---- routings: this rank's top-k expert ids, [T, K] int32 -------------------------------------------

def _topk(T, K, choices: torch.Tensor) -> torch.Tensor:
    """T rows of K distinct ids drawn from `choices`."""
    scores = torch.rand(T, len(choices), device=choices.device)
    return choices[scores.topk(K, dim=1).indices]


def route(kind: str, T: int, K: int, experts: int, local: int, rank: int) -> torch.Tensor:
    every = torch.arange(experts, device=empty(0).device)
    if kind == "skewed":  # expert 0 takes a row from every token of every rank
        ids = torch.cat([torch.zeros(T, 1, dtype=every.dtype, device=every.device), _topk(T, K - 1, every[1:])], 1)
    elif kind == "idle":  # odd experts receive nothing
        ids = _topk(T, K, every[::2])
    elif kind == "stay_home":  # rank 0 routes only to its own experts: it sends no row to another rank
        ids = _topk(T, K, every[:local] if rank == 0 else every)
    else:
        ids = _topk(T, K, every)
    return ids.to(torch.int32)


def routings(K: int, experts: int, local: int, ep: bool, every: bool) -> list[str]:
    """The routings a shape takes: uniform and skewed, and with `every` those it can take of idle
    experts (K distinct even ones needed) and a rank that sends nothing (expert parallelism only)."""
    kinds = ["uniform", "skewed"]
    if not every:
        return kinds
    if 2 * K <= experts:
        kinds.append("idle")
    if ep and K <= local:
        kinds.append("stay_home")
    return kinds


# ---- references through torch.distributed ----------------------------------------------------------

def grouped(ids: torch.Tensor, experts: int):
    """(order, counts, slot): the (t, k) pairs sorted by expert, stable (token by token within one),
    the rows each expert gets, and each pair's place among its expert's rows (tiledsl's arrival())."""
    flat = ids.flatten().long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(flat)
    slot[order] = torch.arange(flat.numel(), device=flat.device) - starts[flat[order]]
    return order, counts, slot.view(ids.shape)


def exchange_counts(sent: torch.Tensor, world: int, E: int) -> torch.Tensor:
    """got[s, e]: the rows rank s sends to this rank's expert e (the splits exchanged first)."""
    got = torch.empty_like(sent)
    host.all_to_all_single(got, sent)
    return got.view(world, E)


def dispatch_reference(X, ids, E, C, world):
    """(recv [E, world, C, H] float, count [E, world], slot [T, K]) through all_to_all_single."""
    K, H = ids.shape[1], X.shape[1]
    order, sent, slot = grouped(ids, E * world)
    got = exchange_counts(sent, world, E)
    rows = torch.empty(int(got.sum()), H, dtype=X.dtype, device=X.device)
    host.all_to_all_single(rows, X[order // K].contiguous(), got.sum(1).tolist(), sent.view(world, E).sum(1).tolist())
    recv = torch.full((E, world, C, H), NAN, device=X.device)
    at = 0
    for s in range(world):
        for e in range(E):
            n = min(int(got[s, e]), C)
            recv[e, s, :n] = rows[at:at + n].float()
            at += int(got[s, e])
    return recv, got.T.contiguous(), slot


def combine_reference(Y, ids, w, E, world):
    """out [T, H] float: each pair's expert output brought back (all_to_all_single) and weighted."""
    T, K = ids.shape
    order, sent, _ = grouped(ids, E * world)
    got = exchange_counts(sent, world, E)
    rows = torch.cat([Y[e, s, :int(got[s, e])] for s in range(world) for e in range(E)])
    back = torch.empty(int(sent.sum()), Y.shape[-1], dtype=Y.dtype, device=Y.device)
    host.all_to_all_single(back, rows.contiguous(), sent.view(world, E).sum(1).tolist(), got.sum(1).tolist())
    out = torch.zeros(T, Y.shape[-1], device=Y.device)
    out.index_add_(0, order // K, back.float() * w.flatten()[order, None])
    return out


def ag_group_gemm_reference(A, ids, B, C, world):
    """(G [world, E, C, N] float, count [world, E]): all-gathered tokens, per-expert matmuls."""
    E = B.shape[0]
    A_all = torch.empty(world * A.shape[0], A.shape[1], dtype=A.dtype, device=A.device)
    host.all_gather_into_tensor(A_all, A.contiguous())
    ids_all = torch.empty(world * ids.shape[0], ids.shape[1], dtype=ids.dtype, device=ids.device)
    host.all_gather_into_tensor(ids_all, ids.contiguous())
    G = torch.full((world, E, C, B.shape[-1]), NAN, device=A.device)
    count = torch.empty(world, E, dtype=torch.long, device=A.device)
    K, T = ids.shape[1], A.shape[0]
    for s in range(world):
        mine = ids_all[s * T:(s + 1) * T]
        order, count[s], _ = grouped(mine, E)
        rows, at = A_all[s * T:(s + 1) * T][order // K].float(), 0
        for e in range(E):
            n = int(count[s, e])
            G[s, e, :min(n, C)] = (rows[at:at + n] @ B[e].float())[:C]
            at += n
    return G, count


def moe_gemm_rs_reference(Hx, ids, w, B, world):
    """Y [T, N] float: every rank's partial products reduce-scattered (NCCL), then this rank's tokens
    gather their k rows with their weights."""
    Z = torch.einsum("secI,eIN->secN", Hx.float(), B.float())  # [world, E, C, N]
    mine = torch.empty(Z.shape[1:], device=Z.device)
    host.reduce_scatter_tensor(mine, Z.flatten(0, 1))  # rank r's share: Z[r], summed over ranks
    _, _, slot = grouped(ids, B.shape[0])
    picked = mine[ids.long(), slot]  # [T, K, N]
    return (picked * w[..., None]).sum(1)


def below(count: torch.Tensor, shape) -> torch.Tensor:
    """Where a tensor declared `upto count` is valid: along the dimension after count's, below it."""
    prefix = count.dim()
    along = torch.arange(shape[prefix], device=count.device).view(*([1] * prefix), -1,
                                                                  *([1] * (len(shape) - prefix - 1)))
    return (along < count.view(*count.shape, *([1] * (len(shape) - prefix)))).expand(shape)


def close_below(got, want, count, tol=2e-2):
    valid = below(count.to(got.device), want.shape)
    close(got[valid], want[valid], tol)


# ---- the cases ------------------------------------------------------------------------------------

def dispatch_case(world, rank, T, H, K, E, C, kind):
    X, ids = empty(T, H, dtype=BF16), empty(T, K, dtype=torch.int32)
    recv, count, slot = empty(E, world, C, H, dtype=BF16), empty(E, world, dtype=torch.int32), \
        empty(T, K, dtype=torch.int32)
    want = {}

    def refresh():
        X.normal_()
        ids.copy_(route(kind, T, K, E * world, E, rank))
        want["recv"], want["count"], want["slot"] = dispatch_reference(X, ids, E, C, world)
        recv.fill_(NAN)
        count.fill_(-1)
        slot.fill_(-1)

    def verify():
        close(count, want["count"], 0.0)
        close(slot, want["slot"], 0.0)
        close_below(recv, want["recv"], want["count"], 0.0)  # copies: exact
    return Case(({"X": X, "ids": ids, "recv": recv, "count": count, "slot": slot},), refresh, verify)


FP8_GROUP = 128        # values one scale covers (moe_dispatch_fp8's QG)
E4M3_NAN = 0x7F        # an e4m3 NaN's bits: the poison of an fp8 output


def dequantised_close(recv, rscale, want, count):
    """fp8 rows against the bf16 rows they quantise, below the counts: each scale the group's largest
    magnitude / 448 (to float32's rounding), each value within e4m3's rounding (half a step: 2^-4 of the
    value, 2^-10 of the scale below e4m3's normals) with one step of slack (the GPU's float32 division
    is not correctly rounded, which may move a value that lies on a midpoint to the other side)."""
    group = want.shape[-1] // rscale.shape[-1]
    valid = below(count.to(recv.device), want.shape)
    grouped_rows = want.unflatten(-1, (rscale.shape[-1], group))
    scale = grouped_rows.abs().amax(dim=-1).clamp_min(1e-30) / 448
    scale_valid = below(count.to(recv.device), scale.shape)
    close(rscale[scale_valid], scale[scale_valid], 1e-6)
    values = recv.float()
    assert torch.isfinite(values[valid]).all(), "an arrived fp8 value is NaN (never written)"
    got = (values.unflatten(-1, grouped_rows.shape[-2:]) * rscale.unsqueeze(-1)).flatten(-2)
    slack = 2.0 ** -3 * want.abs() + 2.0 ** -9 * scale.repeat_interleave(group, dim=-1)
    wrong = ((got - want).abs() > slack) & valid
    assert not wrong.any(), (f"{int(wrong.sum())} of {int(valid.sum())} dequantised values off by more than e4m3's "
                             f"rounding; worst {float(((got - want).abs() - slack)[valid].max()):.3g} past it")


def dispatch_fp8_case(world, rank, T, H, K, E, C, kind):
    X, ids = empty(T, H, dtype=BF16), empty(T, K, dtype=torch.int32)
    recv, rscale = empty(E, world, C, H, dtype=torch.float8_e4m3fn), empty(E, world, C, H // FP8_GROUP)
    count, slot = empty(E, world, dtype=torch.int32), empty(T, K, dtype=torch.int32)
    want = {}

    def refresh():
        # magnitudes over 8 binades: every group fills e4m3's range differently
        X.copy_(torch.randn(T, H, device=X.device) * 2.0 ** (8 * torch.rand(T, H, device=X.device) - 4))
        ids.copy_(route(kind, T, K, E * world, E, rank))
        want["recv"], want["count"], want["slot"] = dispatch_reference(X, ids, E, C, world)
        recv.view(torch.uint8).fill_(E4M3_NAN)
        rscale.fill_(NAN)
        count.fill_(-1)
        slot.fill_(-1)

    def verify():
        close(count, want["count"], 0.0)
        close(slot, want["slot"], 0.0)
        dequantised_close(recv, rscale, want["recv"], want["count"])
    return Case(({"X": X, "ids": ids, "recv": recv, "rscale": rscale, "count": count, "slot": slot},), refresh,
                verify)


def group_gemm_fp8_case(D, N, E, C):
    """group_gemm_fp8 alone on this rank: random counts (one expert empty), fp8 rows with a scale per
    FP8_GROUP values, against the dequantised rows (rounded to bf16, as the tile rounds them) @ B."""
    count, P, S = empty(E, dtype=torch.int32), empty(E, C, D, dtype=torch.float8_e4m3fn), empty(E, C, D // FP8_GROUP)
    B, G, want = empty(E, D, N, dtype=BF16), empty(E, C, N, dtype=BF16), empty(E, C, N)

    def refresh():
        count.copy_(torch.randint(1, C + 1, (E,), device=count.device))
        count[1] = 0
        # within e4m3's range: torch's cast makes NaN of anything past 448
        P.copy_((torch.randn(E, C, D, device=P.device) * 100).clamp(-448, 448).to(torch.float8_e4m3fn))
        S.uniform_(1e-3, 2e-2)
        B.normal_().mul_(D ** -0.5)
        rows = (P.float().unflatten(-1, (D // FP8_GROUP, FP8_GROUP)) * S.unsqueeze(-1)).flatten(-2)
        want.copy_(torch.bmm(rows.to(BF16).float(), B.float()))
        G.fill_(NAN)
    return Case(({"count": count, "P": P, "S": S, "B": B, "G": G},), refresh,
                lambda: close_below(G, want, count))


def combine_case(world, rank, T, H, K, E, C, kind):
    Y, ids, w = empty(E, world, C, H, dtype=BF16), empty(T, K, dtype=torch.int32), empty(T, K)
    out, want = empty(T, H, dtype=BF16), empty(T, H)

    def refresh():
        Y.normal_()
        w.uniform_()
        ids.copy_(route(kind, T, K, E * world, E, rank))
        want.copy_(combine_reference(Y, ids, w, E, world))
        out.fill_(NAN)
    return Case(({"Y": Y, "ids": ids, "w": w, "out": out},), refresh, lambda: close(out, want))


def ag_group_gemm_case(world, rank, T, D, N, K, E, C, kind):
    A, ids, B = empty(T, D, dtype=BF16), empty(T, K, dtype=torch.int32), empty(E, D, N, dtype=BF16)
    G, count = empty(world, E, C, N, dtype=BF16), empty(world, E, dtype=torch.int32)
    want = {}

    def refresh():
        A.normal_()
        B.normal_().mul_(D ** -0.5)
        ids.copy_(route(kind, T, K, E, E, rank))
        want["G"], want["count"] = ag_group_gemm_reference(A, ids, B, C, world)
        G.fill_(NAN)
        count.fill_(-1)

    def verify():
        close(count, want["count"], 0.0)
        close_below(G, want["G"], want["count"])
    return Case(({"A": A, "ids": ids, "B": B, "G": G, "count": count},), refresh, verify)


def moe_gemm_rs_case(world, rank, T, I, N, K, E, C, kind):
    Hx, ids, w = empty(world, E, C, I, dtype=BF16), empty(T, K, dtype=torch.int32), empty(T, K)
    B, Y, want = empty(E, I, N, dtype=BF16), empty(T, N, dtype=BF16), empty(T, N)

    def refresh():
        Hx.normal_()
        B.normal_().mul_(I ** -0.5)
        w.uniform_()
        ids.copy_(route(kind, T, K, E, E, rank))
        want.copy_(moe_gemm_rs_reference(Hx, ids, w, B, world))
        Y.fill_(NAN)
    return Case(({"Hx": Hx, "ids": ids, "w": w, "B": B, "Y": Y},), refresh, lambda: close(Y, want))


def repeated(heap, name, make_case, **consts):
    def run():
        program = tiledsl.compile(PROGRAMS / f"{name}.tds", heap, **consts)
        back_to_back(lambda args, check: program(**args, check=check), program.check, make_case, CALLS)
    return run


def user_graph(heap, name, make_case):
    """Calls recorded into the caller's own CUDA graph after one warm-up call: the sizes stay on the
    device, so every replay takes a fresh routing; each replay checked, waits still bounded."""
    def run():
        program = tiledsl.compile(PROGRAMS / f"{name}.tds", heap)
        case = make_case()
        case.refresh()
        program(**case.args[0])
        case.verify()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            program(**case.args[0], check=False)
        for _ in range(cap_calls(20)):
            case.refresh()
            graph.replay()
            torch.cuda.synchronize()
            case.verify()
        program.check()
    return run


def over_capacity(heap, name, make_case, world):
    """Expert 0 in every token's top-k with C below the rows it gets: the call raises CapacityExceeded
    on the ranks that see it, naming the rank and expert 0's count, and no rank hangs."""
    def run():
        program = tiledsl.compile(PROGRAMS / f"{name}.tds", heap)
        case = make_case()
        case.refresh()
        try:
            program(**case.args[0])
            raised = None
        except Exception as error:  # noqa: BLE001 - judged below
            raised = error
        everyone = [None] * world
        dist.all_gather_object(everyone, raised is not None)
        assert any(everyone), "no rank raised"
        if raised is not None:
            assert type(raised).__name__ == "CapacityExceeded", f"{type(raised).__name__}: {raised}"
            message = str(raised)
            assert message.startswith(f"rank {dist.get_rank()}: "), message
            assert re.search(r"(sent\[0\]|got\[0, \d+\]|count\[\d+, 0\]) = \d+ is above its cap", message), message
    return run


SEED = 1212


def register(checks, rank: int, world: int, heap) -> None:
    """Every check of this suite, recorded in `checks` (tests/gpu/all_checks.py runs the suites one after
    another in one process group)."""
    record = checks.record

    for n, (T, H, K, E, C) in enumerate(EP_SHAPES):
        for kind in routings(K, E * world, E, ep=True, every=n == 0):
            shape = f"T={T} H={H} K={K} E={E}x{world} C={C} {kind}"
            record(f"moe_dispatch {shape}", repeated(heap, "moe_dispatch", partial(dispatch_case,
                world, rank, T, H, K, E, C, kind)))
            record(f"moe_combine {shape}", repeated(heap, "moe_combine", partial(combine_case,
                world, rank, T, H, K, E, C, kind)))
    for n, (T, H, K, E, C) in enumerate(EP_SHAPES):
        if H % FP8_GROUP:
            continue  # moe_dispatch_fp8 needs whole groups of 128 values (its `require`)
        for kind in routings(K, E * world, E, ep=True, every=n == 0):
            record(f"moe_dispatch_fp8 T={T} H={H} K={K} E={E}x{world} C={C} {kind}", repeated(
                heap, "moe_dispatch_fp8", partial(dispatch_fp8_case, world, rank, T, H, K, E, C, kind)))
    for D, N, E, C in FP8_GEMM_SHAPES:
        record(f"group_gemm_fp8 D={D} N={N} E={E} C={C}", repeated(
            heap, "group_gemm_fp8", partial(group_gemm_fp8_case, D, N, E, C)))
    T, H, K, E, C = EP_SHAPES[0]
    record(f"user CUDA graph, moe_dispatch_fp8 T={T} H={H} K={K}",
           user_graph(heap, "moe_dispatch_fp8", partial(dispatch_fp8_case, world, rank, T, H, K, E, C, "uniform")))
    record(f"user CUDA graph, moe_dispatch T={T} H={H} K={K}",
           user_graph(heap, "moe_dispatch", partial(dispatch_case, world, rank, T, H, K, E, C, "uniform")))
    record(f"user CUDA graph, moe_combine T={T} H={H} K={K}",
           user_graph(heap, "moe_combine", partial(combine_case, world, rank, T, H, K, E, C, "uniform")))

    for n, (T, D, N, K, E, C) in enumerate(GEMM_SHAPES):
        for kind in routings(K, E, E, ep=False, every=n == 0):
            shape = f"T={T} D={D} N={N} K={K} E={E} C={C} {kind}"
            record(f"ag_group_gemm {shape}", repeated(heap, "ag_group_gemm", partial(ag_group_gemm_case,
                world, rank, T, D, N, K, E, C, kind)))
            record(f"moe_gemm_rs {shape}", repeated(heap, "moe_gemm_rs", partial(moe_gemm_rs_case,
                world, rank, T, D, N, K, E, C, kind)))
    # last: a call that raised may leave the heap's signals of that program behind
    record("moe_dispatch over capacity raises CapacityExceeded", over_capacity(
        heap, "moe_dispatch", partial(dispatch_case, world, rank, 64, 256, 2, 2, 16, "skewed"), world), last=True)
    record("ag_group_gemm over capacity raises CapacityExceeded", over_capacity(
        heap, "ag_group_gemm", partial(ag_group_gemm_case, world, rank, 64, 256, 128, 2, 4, 16, "skewed"), world), last=True)



def main() -> int:
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", HEAP_BYTES)
    rank, world, heap = start(SEED)
    checks = Checks()
    register(checks, rank, world, heap)
    return checks.finish(heap)


if __name__ == "__main__":
    sys.exit(main())
