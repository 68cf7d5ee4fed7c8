"""The torch paths bench_moe.py times the MoE programs against, written once and device-agnostic so that
tests/gpu/test_bench_moe.py proves on gloo ranks that they compute what the programs compute:
expert-parallel dispatch + combine through all_to_all_single with the splits exchanged first (a host
synchronisation, as torch's MoE layers do it), the same through torch's symmetric-memory
all_to_all_vdev_2d (sizes on the device), and the sequential tensor-parallel layers: NCCL all-gather then
a grouped GEMM, and a grouped GEMM with the top-k weighted sum then NCCL reduce-scatter."""
import torch
import torch.distributed as dist


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


def grouped_mm(rows: torch.Tensor, B: torch.Tensor, counts: torch.Tensor, use_torch: bool) -> torch.Tensor:
    """rows [sum(counts), K] grouped by expert times B [E, K, N]: torch._grouped_mm where `use_torch`
    (offsets on the device, no host synchronisation), else one matmul per expert."""
    if use_torch:
        offs = torch.cumsum(counts, 0).to(torch.int32)
        return torch._grouped_mm(rows, B, offs=offs)
    out = torch.empty(rows.shape[0], B.shape[-1], dtype=rows.dtype, device=rows.device)
    at = 0
    for e, n in enumerate(counts.tolist()):
        out[at:at + n] = rows[at:at + n] @ B[e]
        at += n
    return out


def dispatch_combine_a2a(X, ids, w, experts: int, world: int, expert=lambda rows: rows) -> torch.Tensor:
    """Each pair's row to its expert's rank (experts x on rank x // E, E = experts / world) and back,
    weighted and summed per token: all_to_all_single for the counts, then the rows each way. `expert`:
    what the expert ranks do to the rows they got (identity: out = sum over k of w * X)."""
    T, K = ids.shape
    order, sent, _ = grouped(ids, experts)
    per_rank = sent.view(world, -1).sum(1)
    got = torch.empty_like(per_rank)
    dist.all_to_all_single(got, per_rank)
    send_sizes, recv_sizes = per_rank.tolist(), got.tolist()  # the host synchronisation
    rows = torch.empty(sum(recv_sizes), X.shape[1], dtype=X.dtype, device=X.device)
    dist.all_to_all_single(rows, X[order // K], recv_sizes, send_sizes)
    back = torch.empty(ids.numel(), X.shape[1], dtype=X.dtype, device=X.device)
    dist.all_to_all_single(back, expert(rows), send_sizes, recv_sizes)
    out = torch.zeros(T, X.shape[1], dtype=torch.float32, device=X.device)
    out.index_add_(0, order // K, back.float() * w.flatten()[order, None])
    return out.to(X.dtype)


class VDev2d:
    """Dispatch + combine through torch.ops.symm_mem.all_to_all_vdev_2d and its _offset twin: buffers in
    torch's symmetric memory sized for `max_rows` rows, the splits on the device."""

    def __init__(self, T, K, H, experts, world, dtype, group_name, max_rows):
        from torch.distributed import _symmetric_memory as symm_mem
        device = torch.device("cuda", torch.cuda.current_device())
        self.group, self.K = group_name, K
        self.inp = symm_mem.empty(T * K, H, dtype=dtype, device=device)
        self.out = symm_mem.empty(max_rows, H, dtype=dtype, device=device)
        self.back = symm_mem.empty(T * K, H, dtype=dtype, device=device)
        self.splits = symm_mem.empty(experts, dtype=torch.int64, device=device)
        self.out_splits = symm_mem.empty(2, experts, dtype=torch.int64, device=device)
        self.back_splits = symm_mem.empty(2, experts, dtype=torch.int64, device=device)
        for t in (self.inp, self.out, self.back, self.splits, self.out_splits, self.back_splits):
            symm_mem.rendezvous(t, group_name)
        self.experts = experts

    def __call__(self, X, ids, w):
        order, sent, _ = grouped(ids, self.experts)
        self.inp.copy_(X[order // self.K])
        self.splits.copy_(sent)
        torch.ops.symm_mem.all_to_all_vdev_2d(self.inp, self.out, self.splits, self.out_splits, self.group)
        # the expert outputs (identity here) go back where they came from
        torch.ops.symm_mem.all_to_all_vdev_2d_offset(self.out, self.back, self.out_splits, self.back_splits,
                                                     self.group)
        out = torch.zeros(X.shape[0], X.shape[1], dtype=torch.float32, device=X.device)
        out.index_add_(0, order // self.K, self.back.float() * w.flatten()[order, None])
        return out.to(X.dtype)


def ag_group_gemm_sequential(A, ids, B, world: int, use_torch: bool):
    """All-gather of the tokens and ids (NCCL), then every rank's rows grouped by expert times their
    experts' weights: [world * T * K, N] rows, rank by rank, expert by expert within one."""
    T, K = ids.shape
    A_all = torch.empty(world * T, A.shape[1], dtype=A.dtype, device=A.device)
    dist.all_gather_into_tensor(A_all, A)
    ids_all = torch.empty(world * T, K, dtype=ids.dtype, device=ids.device)
    dist.all_gather_into_tensor(ids_all, ids)
    E = B.shape[0]
    outs = []
    for s in range(world):
        order, counts, _ = grouped(ids_all[s * T:(s + 1) * T], E)
        outs.append(grouped_mm(A_all[s * T:(s + 1) * T][order // K], B, counts, use_torch))
    return torch.cat(outs)


def moe_gemm_rs_sequential(Hx_rows, counts, order, w, B, world: int, use_torch: bool):
    """Every rank's rows (grouped by expert, [world * T * K, I], rank by rank) times this rank's shard of
    the down projection, each token's k rows weighted and summed, then NCCL reduce-scatter of the
    [world * T, N] partial sums. counts [world, E] and order [world, T * K] say how each rank's rows are
    grouped; w [world, T, K] are every rank's weights."""
    T, K = w.shape[1], w.shape[2]
    partial = torch.zeros(world * T, B.shape[-1], dtype=torch.float32, device=B.device)
    at = 0
    for s in range(world):
        n = int(T * K)
        rows = grouped_mm(Hx_rows[at:at + n], B, counts[s], use_torch)
        partial[s * T:(s + 1) * T].index_add_(0, order[s] // K, rows.float() * w[s].flatten()[order[s], None])
        at += n
    mine = torch.empty(T, B.shape[-1], dtype=torch.float32, device=B.device)
    dist.reduce_scatter_tensor(mine, partial)
    return mine.to(B.dtype)
