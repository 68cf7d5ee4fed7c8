"""GPU checks of tiledsl.ops under torchrun: what a model calls, on the shapes a model has. Each op in
bf16 through every path (torch + NCCL, and each library program, forced), in fp16 and fp32 through its
preferred program, and tuned (the first call measures the paths and keeps the fastest), on the shapes
issue 14 found broken (M = 4091 * world rows, N = 32001 columns) and others no tile divides; every
call on fresh random inputs, against float64 results of every rank's inputs gathered through NCCL;
flash_decode and sp_attention through torch's path and their programs, against float64 attention;
moe_dispatch and moe_combine around an expert, against each token's float64 weighted sum.
Then a call recorded in the caller's own CUDA graph and replayed with new inputs, a block of ops under
torch.compile(fullgraph=True) against eager, and what explain() says. Rank 0 prints one PASS/FAIL line
a check and the summary line last.

    torchrun --nproc-per-node=2 tests/gpu/ops_checks.py
"""
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402
from harness import Checks, close, host, start  # noqa: E402

import tiledsl.ops as ops  # noqa: E402
from tiledsl.ops.dispatch import OPS  # noqa: E402

CALLS = 3  # calls of each path, each on fresh inputs
# relative to the largest expected value: bf16/fp16 rounding, TF32 products for fp32 (the programs'
# tl.dot and torch's matmul at precision "high" alike)
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 1e-2, torch.float32: 5e-3}
EPS = 1e-5


def cases(world: int) -> list[tuple[str, str, list[tuple], dict]]:
    """(label, op, every rank's input shapes, keyword arguments)."""
    return [
        ("all_gather_matmul M=4091*world K=1024 N=5120", "all_gather_matmul", [(4091, 1024), (1024, 5120)], {}),
        ("all_gather_matmul N=32001 (a vocabulary)", "all_gather_matmul", [(512, 4096), (4096, 32001)], {}),
        ("matmul_reduce_scatter M=4091*world K=1000 N=5120", "matmul_reduce_scatter",
         [(4091 * world, 1000), (1000, 5120)], {}),
        ("matmul_all_reduce decode M=7 K=4096 N=4100", "matmul_all_reduce", [(7, 4096), (4096, 4100)], {}),
        ("all_reduce 1000003 elements", "all_reduce", [(1000003,)], {}),
        ("all_gather 333x1000", "all_gather", [(333, 1000)], {}),
        ("reduce_scatter 666x1000", "reduce_scatter", [(333 * world, 1000)], {}),
        ("all_reduce_rmsnorm 7x8192", "all_reduce_rmsnorm", [(7, 8192), (7, 8192), (8192,)], {"eps": EPS}),
    ]


def call(op: str, tensors: list[torch.Tensor], kwargs: dict, **extra):
    out = getattr(ops, op)(*tensors, **kwargs, **extra)
    return list(out) if isinstance(out, tuple) else [out]


def expected(op: str, mine: list[torch.Tensor], kwargs: dict, rank: int, world: int) -> list[torch.Tensor]:
    """float64 results from every rank's inputs, gathered through NCCL (gloo where ranks share a GPU).
    Every rank's inputs are gathered as they are and widened one at a time, and a reduce-scatter's
    products are formed only over this rank's rows: where 8 ranks share one GPU, every rank's float64
    products of matmul_reduce_scatter at M = 4091 x 8 took 14 GB a rank (2026-12-03), and NVSHMEM's heap
    could then not grow (cuMemCreate failed)."""
    def gathered(t):
        parts = [torch.empty_like(t) for _ in range(world)]
        host.all_gather(parts, t.contiguous())
        return parts

    def total(terms):  # the float64 sum of tensors made one at a time
        out = None
        for term in terms:
            out = term.to(torch.float64, copy=True) if out is None else out.add_(term.double())
        return out

    if op == "all_gather_matmul":
        return [torch.cat(gathered(mine[0])).double() @ mine[1].double()]
    if op == "matmul_reduce_scatter":
        return [total(a.chunk(world)[rank].double() @ b.double()
                      for a, b in zip(gathered(mine[0]), gathered(mine[1]), strict=True))]
    if op == "matmul_all_reduce":
        return [total(a.double() @ b.double() for a, b in zip(gathered(mine[0]), gathered(mine[1]), strict=True))]
    if op == "all_reduce":
        return [total(gathered(mine[0]))]
    if op == "all_gather":
        return [torch.cat(gathered(mine[0])).double()]
    if op == "reduce_scatter":
        return [total(p.chunk(world)[rank] for p in gathered(mine[0]))]
    h = total(gathered(mine[0])) + mine[1].double()
    return [F.rms_norm(h, (h.shape[-1],), mine[2].double(), eps=kwargs["eps"]), h]


def fresh(shapes, dtype) -> list[torch.Tensor]:
    """New random inputs, scaled so that sums over K stay near 1 (bf16 keeps its relative precision)."""
    out = []
    for shape in shapes:
        t = torch.randn(shape, device=harness.DEVICE, dtype=torch.float32)
        if len(shape) == 2 and shape[0] >= 256:
            t /= shape[0] ** 0.5
        out.append(t.to(dtype))
    return out


def path_check(op, shapes, kwargs, dtype, rank, world, **extra):
    def run():
        for _ in range(harness.cap_calls(CALLS)):
            tensors = fresh(shapes, dtype)
            want = expected(op, tensors, kwargs, rank, world)
            got = call(op, tensors, kwargs, **extra)
            for g, w in zip(got, want, strict=True):
                close(g, w, TOLERANCE[dtype])
        ops.check()
    return run


DECODE = {"B": 8, "H": 64, "HKV": 8, "D": 128, "C": 3001}  # 3001 keys a rank: no block divides them


def decode_check(dtype, rank, world, **extra):
    """flash_decode on a cache split over the ranks, lengths drawn per sequence (one of them 0, one past
    rank 0's share only), against float64 attention over every rank's cache gathered through NCCL."""
    B, H, HKV, D, C = (DECODE[k] for k in ("B", "H", "HKV", "D", "C"))

    def run():
        for _ in range(harness.cap_calls(CALLS)):
            q = torch.randn(B, H, D, device=harness.DEVICE).to(dtype)
            host.broadcast(q, 0)  # one query token a sequence, the same on every rank
            k, v = (torch.randn(B, C, HKV, D, device=harness.DEVICE).to(dtype) for _ in range(2))
            lens = torch.randint(0, world * C + 1, (B,), device=harness.DEVICE, dtype=torch.int32)
            lens[0], lens[1] = 0, C // 2
            host.broadcast(lens, 0)
            everyone_k = [torch.empty_like(k) for _ in range(world)]
            everyone_v = [torch.empty_like(v) for _ in range(world)]
            host.all_gather(everyone_k, k), host.all_gather(everyone_v, v)
            keys = torch.cat(everyone_k, dim=1).double()
            values = torch.cat(everyone_v, dim=1).double()
            want = torch.zeros(B, H, D, dtype=torch.float64, device=harness.DEVICE)
            for b in range(B):
                n = int(lens[b])
                if n:
                    kh = keys[b, :n].repeat_interleave(H // HKV, dim=1)     # [n, H, D]
                    scores = torch.einsum("hd,nhd->hn", q[b].double(), kh) / D ** 0.5
                    want[b] = torch.einsum("hn,nhd->hd", torch.softmax(scores, -1),
                                           values[b, :n].repeat_interleave(H // HKV, dim=1))
            got = ops.flash_decode(q, k, v, lens, **extra)
            close(got, want, TOLERANCE[dtype])
        ops.check()
    return run


SP = {"B": 2, "P": 1000, "H": 32, "HKV": 8}  # 1000 tokens a piece: no 64- or 128-row tile divides them


def sp_check(dtype, rank, world, **extra):
    """sp_attention on a zig-zag sharded sequence against float64 causal attention over every rank's
    pieces gathered through NCCL."""
    B, P, H, HKV = (SP[k] for k in ("B", "P", "H", "HKV"))

    def run():
        for _ in range(harness.cap_calls(CALLS)):
            q = torch.randn(B, 2, P, H, 128, device=harness.DEVICE).to(dtype)
            k, v = (torch.randn(B, 2, P, HKV, 128, device=harness.DEVICE).to(dtype) for _ in range(2))
            every_k, every_v = ([torch.empty_like(t) for _ in range(world)] for t in (k, v))
            host.all_gather(every_k, k), host.all_gather(every_v, v)
            order = sorted((s + z * (2 * world - 1 - 2 * s), s, z) for s in range(world) for z in range(2))
            keys, values = (torch.cat([every[s][:, z] for _, s, z in order], dim=1).double().transpose(1, 2)
                            for every in (every_k, every_v))        # [B, HKV, every token, D]
            want = torch.empty(q.shape, dtype=torch.float64, device=harness.DEVICE)
            G = H // HKV
            for z in range(2):
                piece = rank + z * (2 * world - 1 - 2 * rank)
                allowed = torch.ones(P, 2 * world * P, dtype=torch.bool, device=harness.DEVICE).tril(piece * P)
                # one KV head's G query heads at a time: the float64 scores of every head at once are
                # [B, H, P, 2 world P], 8 GB a rank at world 8, and 8 ranks sharing one GPU ran out of
                # memory there (NVSHMEM's heap could not grow: a hang, 2026-12-03)
                for g in range(HKV):
                    heads = slice(g * G, (g + 1) * G)
                    kh, vh = (t[:, g:g + 1].expand(-1, G, -1, -1) for t in (keys, values))
                    want[:, z, :, heads] = F.scaled_dot_product_attention(
                        q[:, z, :, heads].transpose(1, 2).double(), kh, vh, attn_mask=allowed).transpose(1, 2)
            close(ops.sp_attention(q, k, v, **extra), want, TOLERANCE[dtype])
        ops.check()
    return run


MOE = {"T": 300, "H": 4096, "K": 4, "E": 8}  # 300 tokens a rank, top-4 of 8 experts a rank


def moe_check(dtype, impls, **extra):
    """moe_dispatch, an expert (2 x + 1 on each row, every row past the counts poisoned), moe_combine:
    each token gets the sum over its top-k of weight * (2 x + 1), computed here in float64."""
    T, H, K, E = (MOE[k] for k in ("T", "H", "K", "E"))

    def run():
        world = dist.get_world_size()
        for _ in range(harness.cap_calls(CALLS)):
            x = torch.randn(T, H, device=harness.DEVICE).to(dtype)
            ids = torch.rand(T, E * world, device=harness.DEVICE).topk(K, dim=1).indices.to(torch.int32)
            w = torch.rand(T, K, device=harness.DEVICE)
            recv, count = ops.moe_dispatch(x, ids, E, T, impl=impls[0], **extra)
            y = (2 * recv.float() + 1).to(dtype)
            past = torch.arange(T, device=harness.DEVICE)[None, None, :] >= count[:, :, None]
            y[past] = float("nan")
            got = ops.moe_combine(y, ids, w, impl=impls[1], **extra)
            close(got, w.double().sum(1, keepdim=True) * (2 * x.double() + 1), TOLERANCE[dtype])
        ops.check()
    return run


def user_graph_check(rank, world):
    """all_gather_matmul and all_reduce recorded in the caller's CUDA graph after a warm-up call, replayed
    three times with new inputs copied into the captured tensors."""
    def run():
        a, b = fresh([(1024, 4096), (4096, 5120)], torch.bfloat16)
        x, = fresh([(1 << 20,)], torch.bfloat16)
        call("all_gather_matmul", [a, b], {}, impl="ag_gemm")  # warm-up: compiles and prepares
        call("all_reduce", [x], {}, impl="allreduce")
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            product, = call("all_gather_matmul", [a, b], {}, impl="ag_gemm")
            total, = call("all_reduce", [x], {}, impl="allreduce")
        for _ in range(3):
            new_a, new_b = fresh([(1024, 4096), (4096, 5120)], torch.bfloat16)
            new_x, = fresh([(1 << 20,)], torch.bfloat16)
            a.copy_(new_a), b.copy_(new_b), x.copy_(new_x)
            product.fill_(float("nan")), total.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            ops.check()
            close(product, expected("all_gather_matmul", [a, b], {}, rank, world)[0], TOLERANCE[torch.bfloat16])
            close(total, expected("all_reduce", [x], {}, rank, world)[0], TOLERANCE[torch.bfloat16])
    return run


def compiled_block_check():
    """A block of ops traced whole by torch.compile(fullgraph=True) (inductor), against the same block eager."""
    def block(a, b, b2, residual, weight):
        h = ops.all_gather_matmul(a, b)
        h = ops.matmul_reduce_scatter(F.silu(h), b2)
        normed, res = ops.all_reduce_rmsnorm(h, residual, weight, eps=EPS)
        return normed, ops.all_reduce(res)

    def run():
        a, b, b2, residual, weight = fresh([(1000, 2048), (2048, 4096), (4096, 2048), (1000, 2048), (2048,)],
                                           torch.bfloat16)
        compiled = torch.compile(block, fullgraph=True)
        for _ in range(2):
            want = block(a, b, b2, residual, weight)
            got = compiled(a, b, b2, residual, weight)
            for g, w in zip(got, want, strict=True):
                close(g, w.float(), TOLERANCE[torch.bfloat16])
            a, b, b2, residual, weight = fresh([t.shape for t in (a, b, b2, residual, weight)], torch.bfloat16)
    return run


def torch_needs(impl: str) -> str | None:
    """The torch path's collectives are NCCL's (and tuning measures that path): skipped where ranks share a GPU."""
    return "nccl" if impl == "torch" else None


SEED = 23


def register(checks, rank: int, world: int, heap) -> None:
    """Every check of this suite, run (after `checks` listed them, spread, where ranks share a GPU) before
    what the ops decided is shown; tests/gpu/all_checks.py runs the suites one after another in one
    process group."""
    torch.set_float32_matmul_precision("high")  # TF32, as the programs' tl.dot: the fp32 programs apply
    ops.configure(progress=False, cache_dir=os.path.join(tempfile.gettempdir(), "tiledsl_ops_checks"))
    ops.use_heap(heap)
    for label, op, shapes, kwargs in cases(world):
        for name in ("torch", *OPS[op].programs):  # a program by name: its default tunables
            checks.record(f"{label} bf16 via {name}",
                          path_check(op, shapes, kwargs, torch.bfloat16, rank, world, impl=name), needs=torch_needs(name))
        for dtype in (torch.float16, torch.float32):
            checks.record(f"{label} {str(dtype)[6:]} via its preferred program",
                          path_check(op, shapes, kwargs, dtype, rank, world, impl=OPS[op].programs[0]))
        checks.record(f"{label} bf16 tuned", path_check(op, shapes, kwargs, torch.bfloat16, rank, world, tune=True),
                      needs="nccl")
    for label, dtype, extra in (("bf16 via torch", torch.bfloat16, {"impl": "torch"}),
                                ("bf16 via flash_decode", torch.bfloat16, {"impl": "flash_decode"}),
                                ("fp16 via flash_decode", torch.float16, {"impl": "flash_decode"}),
                                ("bf16 tuned", torch.bfloat16, {"tune": True})):
        needs = torch_needs(extra.get("impl", "torch"))  # tuning measures the torch path too
        checks.record(f"flash_decode B=8 H=64/8 C=3001 a rank {label}", decode_check(dtype, rank, world, **extra),
                      needs=needs)
        program = {"impl": "sp_ag_attention"} if extra.get("impl") == "flash_decode" else extra
        checks.record(f"sp_attention B=2 P=1000 H=32/8 {label.replace('flash_decode', 'sp_ag_attention')}",
                      sp_check(dtype, rank, world, **program), needs=needs)
    for label, dtype, impls, extra in (("bf16 via torch", torch.bfloat16, ("torch", "torch"), {}),
                                       ("bf16 via the programs", torch.bfloat16, ("moe_dispatch", "moe_combine"), {}),
                                       ("fp32 via the programs", torch.float32, ("moe_dispatch", "moe_combine"), {}),
                                       ("bf16 tuned", torch.bfloat16, (None, None), {"tune": True})):
        checks.record(f"moe_dispatch + moe_combine T=300 H=4096 top-4 of 8 a rank {label}",
                      moe_check(dtype, impls, **extra), needs=torch_needs(impls[0] or "torch"))
    checks.record("ops recorded in the caller's CUDA graph, replayed with new inputs", user_graph_check(rank, world))
    checks.record("a block of ops under torch.compile(fullgraph=True) matches eager", compiled_block_check())
    checks.run_pending()  # spread (ranks sharing a GPU): the checks run here, before what they decided is shown
    if rank == 0:
        for label, op, _, _ in cases(world):
            print(f"  {label}: {ops.decision(op)}", flush=True)
        print(ops.explain(), flush=True)
    ops.reset()


def main() -> int:
    rank, world, heap = start(SEED)
    checks = Checks()
    register(checks, rank, world, heap)
    return checks.finish(heap)


if __name__ == "__main__":
    sys.exit(main())
