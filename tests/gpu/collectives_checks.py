"""Multi-GPU checks of the collective programs, run under torchrun: AllGather, ReduceScatter, one-shot
and two-shot AllReduce (and the launcher's choice between them), GEMM+AllReduce and AllReduce+RMSNorm, against
torch.distributed and torch ops. Each in bf16 (as declared) and fp32 (through dtype_override), from 1 KB
to 256 MB with sizes that no tile divides; 100 calls back to back with no reset of the program, each on
fresh random inputs with its out tensors poisoned (NaN) before and every output checked after. Rank 0
prints one PASS/FAIL line a check."""
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from harness import Case, Checks, back_to_back, close, empty, host, start  # noqa: E402

import tiledsl
from tiledsl.collectives import AllReduce

PROGRAMS = Path(__file__).resolve().parents[2] / "programs"
CALLS = 100
DTYPES = (torch.bfloat16, torch.float32)
# Message sizes in bytes; each also runs at a ragged element count near it (odd, a multiple of no block).
AR_BYTES = (1 << 10, 1 << 16, 1 << 20, 16 << 20, 256 << 20)
# Sizes at which the AllReduce launcher picks its algorithm itself (elements).
AUTO_NUMELS = (1000, 3 * (1 << 20) + 7)
# (T, D) of AllReduce+RMSNorm
RMSNORM_SHAPES = [(1, 8192), (7, 8192), (128, 8192), (2048, 8192), (333, 1000)]
# Staging buffers are world times the message and stay allocated per size: more than NVSHMEM's 1 GiB default.
HEAP_BYTES = str(16 << 30)
NAN = float("nan")


def override(dtype):
    return {} if dtype == torch.bfloat16 else {"bfloat16": dtype}


def tolerance(dtype) -> float:
    """Relative to the reference's scale: bf16 rounding, or fp32 sums exact to rounding."""
    return 2e-2 if dtype == torch.bfloat16 else 1e-5


def allreduce_check(allreduce: AllReduce, algorithm, numel: int, dtype):
    def run():
        def make_case():
            X, want = empty(numel, dtype=dtype), empty(numel)

            def refresh():  # inout: X is both the input and the output
                X.normal_()
                want.copy_(X)
                host.all_reduce(want)
            return Case((X,), refresh, lambda: close(X, want, tolerance(dtype)))

        def call(X, check):
            allreduce(X, algorithm=algorithm, check=check)
            assert allreduce.last_algorithm == (algorithm or allreduce.choose(X)), allreduce.last_algorithm
        back_to_back(call, allreduce.check, make_case, CALLS)
    return run


def gemm_ar_shapes(world):
    """(M, K, N) of GEMM+AllReduce: decode-sized M, and a K and N that no tile divides."""
    return [(1, 8192, 8192), (8, 8192, 8192), (37, 8192, 8192), (128, 8192, 8192), (200, 1000 * world, 1000)]


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

        def make_case():
            X = empty(rows, cols, dtype=dtype)
            want = empty(rows * world, cols, dtype=dtype)
            Y = torch.empty_like(want)

            def refresh():
                X.normal_()
                host.all_gather_into_tensor(want, X)
                Y.fill_(NAN)
            return Case((X, Y), refresh, lambda: close(Y, want, 0.0))  # copies: exact
        back_to_back(program, program.check, make_case, CALLS)
    return run


def reduce_scatter_check(heap, world, rows, cols, dtype):
    def run():
        program = tiledsl.compile(PROGRAMS / "reduce_scatter.tds", heap, dtype_override=override(dtype))

        def make_case():
            X = empty(rows * world, cols, dtype=dtype)
            want = empty(rows, cols)
            Y = empty(rows, cols, dtype=dtype)

            def refresh():
                X.normal_()
                host.reduce_scatter_tensor(want, X.float())
                Y.fill_(NAN)
            return Case((X, Y), refresh, lambda: close(Y, want, tolerance(dtype)))
        back_to_back(program, program.check, make_case, CALLS)
    return run


def gemm_ar_check(heap, world, M, K, N, dtype, **consts):
    def run():
        program = tiledsl.compile(PROGRAMS / "gemm_ar.tds", heap, dtype_override=override(dtype), **consts)

        def make_case():
            A = empty(M, K // world, dtype=dtype)
            B = empty(K // world, N, dtype=dtype)
            C, want = empty(M, N, dtype=dtype), empty(M, N)

            def refresh():
                A.normal_()
                B.normal_()
                torch.matmul(A.float(), B.float(), out=want)
                host.all_reduce(want)
                C.fill_(NAN)
            # fp32 products go through TF32 tensor cores: the bf16 tolerance is the right one
            return Case((A, B, C), refresh, lambda: close(C, want, tolerance(torch.bfloat16)))
        back_to_back(program, program.check, make_case, CALLS)
    return run


def allreduce_rmsnorm_check(heap, T, D, dtype):
    def run():
        program = tiledsl.compile(PROGRAMS / "allreduce_rmsnorm.tds", heap, dtype_override=override(dtype))

        def make_case():
            X, R, Y = (empty(T, D, dtype=dtype) for _ in range(3))
            W = empty(D, dtype=dtype)
            residual, normed = empty(T, D, dtype=dtype), empty(T, D)

            def refresh():  # R is inout: the residual comes in and the sum goes out
                X.normal_()
                R.normal_()
                W.copy_(1 + 0.1 * empty(D).normal_())
                summed = X.to(torch.float32, copy=True)  # X.float() would be X itself in fp32
                host.all_reduce(summed)
                residual.copy_(summed + R.float())
                normed.copy_(F.rms_norm(residual.float(), (D,), W.float(), eps=1e-6))
                Y.fill_(NAN)

            def verify():
                close(R, residual, tolerance(dtype))
                close(Y, normed, tolerance(dtype))
            return Case((X, R, W, Y), refresh, verify)
        back_to_back(program, program.check, make_case, CALLS)
    return run


SEED = 4321


def register(checks, rank: int, world: int, heap) -> None:
    """Every check of this suite, recorded in `checks` (tests/gpu/all_checks.py runs the suites one after
    another in one process group)."""
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
        for numel in AUTO_NUMELS:
            record(f"allreduce auto {tag} N={numel} (threshold {allreduce.threshold_bytes} bytes)",
                   allreduce_check(allreduce, None, numel, dtype))

    for dtype in DTYPES:
        tag = str(dtype).removeprefix("torch.")
        # fp32 operands take twice the shared memory a stage: smaller tiles fit the pipeline
        consts = {} if dtype == torch.bfloat16 else {"BN": 64, "BK": 64}
        for M, K, N in gemm_ar_shapes(world):
            record(f"gemm_ar {tag} M={M} K={K} N={N}", gemm_ar_check(heap, world, M, K, N, dtype, **consts))
        for T, D in RMSNORM_SHAPES:
            record(f"allreduce_rmsnorm {tag} T={T} D={D}", allreduce_rmsnorm_check(heap, T, D, dtype))



def main() -> int:
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", HEAP_BYTES)
    rank, world, heap = start(SEED)
    checks = Checks()
    register(checks, rank, world, heap)
    return checks.finish(heap)


if __name__ == "__main__":
    sys.exit(main())
