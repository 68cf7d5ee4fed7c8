"""Multi-GPU checks of the collective programs, run under torchrun: AllGather, ReduceScatter, one-shot
and two-shot AllReduce (and the launcher's choice between them), GEMM+AllReduce and AllReduce+RMSNorm, against
torch.distributed and torch ops on fresh random inputs. Each in bf16 (as declared) and fp32 (through
dtype_override), from 1 KB to 256 MB with sizes that no tile divides; out tensors are poisoned (NaN)
and inout tensors reset from the input before every call, 100 calls back to back with no reset of the
program. Rank 0 prints one PASS/FAIL line a check."""
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from harness import Checks, start  # noqa: E402

import tiledsl
from tiledsl.collectives import AllReduce

PROGRAMS = Path(__file__).resolve().parents[2] / "programs"
CALLS = 100
DTYPES = (torch.bfloat16, torch.float32)
# Message sizes in bytes; each also runs at a ragged element count near it (odd, a multiple of no block).
AR_BYTES = (1 << 10, 1 << 16, 1 << 20, 16 << 20, 256 << 20)
# Staging buffers are world times the message and stay allocated per size: more than NVSHMEM's 1 GiB default.
HEAP_BYTES = str(16 << 30)


def override(dtype):
    return {} if dtype == torch.bfloat16 else {"bfloat16": dtype}


def close(got: torch.Tensor, want: torch.Tensor, dtype) -> None:
    """Relative to the reference's scale; fp32 sums must be exact to rounding, never NaN."""
    assert not torch.isnan(got).any(), "output has NaN: some element was never written"
    scale = want.float().abs().max().item() or 1.0
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * scale)


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    y = x.float().clone()
    dist.all_reduce(y)
    return y


def allreduce_check(allreduce: AllReduce, algorithm, numel: int, dtype):
    def run():
        X0 = torch.randn(numel, device="cuda", dtype=dtype)
        want = all_reduce(X0)
        X = X0.clone()
        allreduce(X, algorithm=algorithm, check=True)
        assert allreduce.last_algorithm == (algorithm or allreduce.choose(X)), allreduce.last_algorithm
        close(X, want, dtype)
        for _ in range(CALLS):
            X.copy_(X0)  # inout: each call sums the same input
            allreduce(X, algorithm=algorithm, check=False)
        allreduce.check()
        close(X, want, dtype)
    return run


def poisoned_calls(program, args, out, verify):
    """1 + CALLS calls writing `out`, poisoned (NaN) before each; `verify()` after the first, checked
    call and again after the last."""
    for n in range(1 + CALLS):
        out.fill_(float("nan"))
        program(*args, out, check=(n == 0))
        if n == 0:
            verify()
    program.check()
    verify()


def collective_shapes(nbytes: int, size: int, world: int):
    """(rows per rank, columns) for a message of `nbytes` (the whole gathered or scattered tensor),
    then a ragged shape near it: an odd row count and 1000 columns, a multiple of no tile."""
    numel = nbytes // size
    cols = 1024 if numel >= 1024 * world else 128
    rows = max(1, numel // cols // world)
    return [(rows, cols), (max(1, numel * 3 // 4 // 1000 // world) | 1, 1000)]


def allgather_check(heap, world, rows, cols, dtype):
    def run():
        program = tiledsl.compile(PROGRAMS / "allgather.tds", heap, dtype_override=override(dtype))
        X = torch.randn(rows, cols, device="cuda", dtype=dtype)
        want = torch.empty(rows * world, cols, device="cuda", dtype=dtype)
        dist.all_gather_into_tensor(want, X)
        Y = torch.empty_like(want)

        def same():
            assert torch.equal(Y, want), "gathered rows differ from NCCL's"
        poisoned_calls(program, (X,), Y, same)
    return run


def reduce_scatter_check(heap, world, rows, cols, dtype):
    def run():
        program = tiledsl.compile(PROGRAMS / "reduce_scatter.tds", heap, dtype_override=override(dtype))
        X = torch.randn(rows * world, cols, device="cuda", dtype=dtype)
        want = torch.empty(rows, cols, device="cuda", dtype=torch.float32)
        dist.reduce_scatter_tensor(want, X.float())
        Y = torch.empty(rows, cols, device="cuda", dtype=dtype)
        poisoned_calls(program, (X,), Y, lambda: close(Y, want, dtype))
    return run


def gemm_ar_check(heap, world, M, K, N, dtype, **consts):
    def run():
        program = tiledsl.compile(PROGRAMS / "gemm_ar.tds", heap, dtype_override=override(dtype), **consts)
        A = torch.randn(M, K // world, device="cuda", dtype=dtype)
        B = torch.randn(K // world, N, device="cuda", dtype=dtype)
        want = all_reduce(A.float() @ B.float())
        C = torch.empty(M, N, device="cuda", dtype=dtype)
        # fp32 products go through TF32 tensor cores: the bf16 tolerance is the right one
        poisoned_calls(program, (A, B), C, lambda: close(C, want, torch.bfloat16))
    return run


def allreduce_rmsnorm_check(heap, T, D, dtype):
    def run():
        program = tiledsl.compile(PROGRAMS / "allreduce_rmsnorm.tds", heap, dtype_override=override(dtype))
        X = torch.randn(T, D, device="cuda", dtype=dtype)
        R0 = torch.randn(T, D, device="cuda", dtype=dtype)
        W = (1 + 0.1 * torch.randn(D, device="cuda")).to(dtype)
        residual = (all_reduce(X) + R0.float()).to(dtype)
        normed = F.rms_norm(residual.float(), (D,), W.float(), eps=1e-6)
        R = R0.clone()
        Y = torch.empty(T, D, device="cuda", dtype=dtype)
        for n in range(1 + CALLS):
            R.copy_(R0)
            Y.fill_(float("nan"))
            program(X, R, W, Y, check=(n == 0))
            if n == 0:
                close(R, residual, dtype)
                close(Y, normed, dtype)
        program.check()
        close(R, residual, dtype)
        close(Y, normed, dtype)
    return run


def main() -> int:
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", HEAP_BYTES)
    rank, world, heap = start(4321)
    checks = Checks()
    record = checks.record

    for dtype in DTYPES:
        size = torch.empty((), dtype=dtype).element_size()
        tag = str(dtype).removeprefix("torch.")
        for nbytes in AR_BYTES:
            for rows, cols in collective_shapes(nbytes, size, world):
                record(f"allgather {tag} {rows}x{cols} per rank ({rows * cols * world * size} bytes gathered)",
                       allgather_check(heap, world, rows, cols, dtype))
                record(f"reduce_scatter {tag} {rows * world}x{cols} ({rows * cols * world * size} bytes in)",
                       reduce_scatter_check(heap, world, rows, cols, dtype))

    allreduce = AllReduce(heap)
    for dtype in DTYPES:
        size = torch.empty((), dtype=dtype).element_size()
        tag = str(dtype).removeprefix("torch.")
        for nbytes in AR_BYTES:
            for numel in (nbytes // size, nbytes // size * 3 // 4 + 7):
                for algorithm in ("one_shot", "two_shot"):
                    record(f"allreduce {algorithm} {tag} N={numel} ({numel * size} bytes)",
                           allreduce_check(allreduce, algorithm, numel, dtype))
        for numel in (1000, 3 * (1 << 20) + 7):
            record(f"allreduce auto {tag} N={numel} (threshold {allreduce.threshold_bytes} bytes)",
                   allreduce_check(allreduce, None, numel, dtype))

    for dtype in DTYPES:
        tag = str(dtype).removeprefix("torch.")
        # fp32 operands take twice the shared memory a stage: smaller tiles fit the pipeline
        consts = {} if dtype == torch.bfloat16 else {"BN": 64, "BK": 64}
        for M, K, N in [(1, 8192, 8192), (8, 8192, 8192), (37, 8192, 8192), (128, 8192, 8192),
                        (200, 1000 * world, 1000)]:
            record(f"gemm_ar {tag} M={M} K={K} N={N}", gemm_ar_check(heap, world, M, K, N, dtype, **consts))
        for T, D in [(1, 8192), (7, 8192), (128, 8192), (2048, 8192), (333, 1000)]:
            record(f"allreduce_rmsnorm {tag} T={T} D={D}", allreduce_rmsnorm_check(heap, T, D, dtype))

    return checks.finish(heap)


if __name__ == "__main__":
    sys.exit(main())
