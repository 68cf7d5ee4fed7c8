"""Multi-GPU checks, run under torchrun: every program and engine against torch.distributed on fresh
random bf16 inputs, outputs poisoned (NaN) before every call, 100 calls back to back with no reset,
a schedule broken on purpose, and launch-time validation. Rank 0 prints one PASS/FAIL line a check."""
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from harness import Checks, start  # noqa: E402

import tiledsl
from tiledsl.runtime.launch import LaunchError, ScheduleTimeout

PROGRAMS = Path(__file__).resolve().parents[2] / "programs"
CALLS = 100


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    """bf16 products over K terms: compare relative to the reference's scale, and never accept NaN."""
    assert not torch.isnan(got).any(), "output has NaN: some element was never written"
    scale = want.float().abs().max().item()
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2 * scale)


def repeat(program, make_out, args, want):
    """One checked call, then CALLS calls back to back (poisoned each time), then one final check."""
    out = make_out()
    program(*args, out, check=True)
    close(out, want)
    for _ in range(CALLS):
        out.fill_(float("nan"))
        program(*args, out, check=False)
    program.check()
    close(out, want)


def ag_gemm_check(source, rank, world, heap, M, K, N, **consts):
    def run():
        program = tiledsl.compile(source, heap, **consts)
        A = torch.randn(M // world, K, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        full = torch.empty(M, K, device="cuda", dtype=torch.bfloat16)
        dist.all_gather_into_tensor(full, A)
        repeat(program, lambda: torch.empty(M, N, device="cuda", dtype=torch.bfloat16), (A, B), full @ B)
    return run


def gemm_rs_inputs(world, M, K, N):
    """This rank's shards of A and B (K split over the ranks), and its rows of the reduce-scattered
    product computed by NCCL in float32."""
    A = torch.randn(M, K // world, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(K // world, N, device="cuda", dtype=torch.bfloat16)
    want = torch.empty(M // world, N, device="cuda", dtype=torch.float32)
    dist.reduce_scatter_tensor(want, (A.float() @ B.float()).contiguous())
    return A, B, want


def gemm_rs_check(rank, world, heap, M, K, N, name="gemm_rs"):
    def run():
        program = tiledsl.compile(PROGRAMS / f"{name}.tds", heap)
        A, B, want = gemm_rs_inputs(world, M, K, N)
        repeat(program, lambda: torch.empty(M // world, N, device="cuda", dtype=torch.bfloat16), (A, B), want)
    return run


def alternating_outputs_check(world, heap, M, K, N):
    """Two output tensors used in turn: each has its own recorded call (and CUDA graph); every call
    must land in the tensor it was given."""
    def run():
        program = tiledsl.compile(PROGRAMS / "gemm_rs.tds", heap)
        A, B, want = gemm_rs_inputs(world, M, K, N)
        outs = [torch.empty(M // world, N, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        for n in range(20):
            outs[n % 2].fill_(float("nan"))
            program(A, B, outs[n % 2], check=False)
            if n >= 18:
                program.check()
                close(outs[n % 2], want)
        program.check()
    return run


def collective_check(name, world, heap, shape_in, reference, out_shape=None):
    def run():
        program = tiledsl.compile(PROGRAMS / f"{name}.tds", heap)
        X = torch.randn(*shape_in, device="cuda", dtype=torch.bfloat16)
        want = reference(X)
        if out_shape is None:  # inout: the program overwrites X
            for n in range(1 + CALLS // 10):
                Y = X.clone()
                program(Y, check=(n == 0))
            program.check()
            close(Y, want)
        else:
            repeat(program, lambda: torch.empty(*out_shape, device="cuda", dtype=torch.bfloat16), (X,), want)
    return run


def main() -> int:
    rank, world, heap = start(1234)
    checks = Checks()
    record = checks.record

    shapes = [(4096, 2048, 2048), (384 * world, 1000, 1000)]  # the second divides into no tile evenly
    ag = (PROGRAMS / "ag_gemm.tds").read_text()
    for M, K, N in shapes:
        record(f"ag_gemm copy_engine M={M} K={K} N={N}", ag_gemm_check(PROGRAMS / "ag_gemm.tds", rank, world, heap, M, K, N))
        if (M, K, N) == shapes[0]:  # the direct launch paths the CUDA-graph replay stands in front of
            record(f"ag_gemm copy_engine, no CUDA graphs M={M} K={K} N={N}",
                   ag_gemm_check(PROGRAMS / "ag_gemm.tds", rank, world, heap, M, K, N, graphs=False))
            record(f"ag_gemm copy_engine, every launch through the JIT M={M} K={K} N={N}",
                   ag_gemm_check(PROGRAMS / "ag_gemm.tds", rank, world, heap, M, K, N, graphs=False, replay=False))
            record(f"gemm_rs two output tensors in turn M={M} K={K * world} N={N}",
                   alternating_outputs_check(world, heap, M, K * world, N))
        record(f"ag_gemm sms M={M} K={K} N={N}",
               ag_gemm_check(ag.replace("on copy_engine", "on sms(8)"), rank, world, heap, M, K, N))
        record(f"ag_gemm nvshmem M={M} K={K} N={N}",
               ag_gemm_check(PROGRAMS / "ag_gemm_push.tds", rank, world, heap, M, K, N))
        record(f"gemm_rs sms M={M} K={K * world} N={N}", gemm_rs_check(rank, world, heap, M, K * world, N))
        for variant in ("gemm_rs_push", "gemm_rs_pull"):
            record(f"{variant} sms M={M} K={K * world} N={N}",
                   gemm_rs_check(rank, world, heap, M, K * world, N, variant))
        # rows sent by the copy engine once the stream sees their tiles counted
        record(f"gemm_rs_ce copy_engine M={M} K={K * world} N={N}",
               gemm_rs_check(rank, world, heap, M, K * world, N, "gemm_rs_ce"))

    def all_reduce(x):
        y = x.float().clone()
        dist.all_reduce(y)
        return y

    def reduce_scatter(x):
        y = torch.empty(x.shape[0] // world, x.shape[1], device="cuda")
        dist.reduce_scatter_tensor(y, x.float().contiguous())
        return y

    def all_gather(x):
        y = torch.empty(x.shape[0] * world, x.shape[1], device="cuda", dtype=x.dtype)
        dist.all_gather_into_tensor(y, x)
        return y

    for n in (1000, 1 << 20, 3 * (1 << 20) + 7):
        record(f"allreduce N={n}", collective_check("allreduce", world, heap, (n,), all_reduce))
    for rows, cols in ((64 * world, 1024), (1000 * world, 1000)):
        record(f"reduce_scatter {rows}x{cols}",
               collective_check("reduce_scatter", world, heap, (rows, cols), reduce_scatter, (rows // world, cols)))
        record(f"allgather {rows // world}x{cols} per rank",
               collective_check("allgather", world, heap, (rows // world, cols), all_gather, (rows, cols)))

    def broken():
        program = tiledsl.compile(PROGRAMS / "ag_gemm.tds", heap, wait_timeout_s=1.0, skip=("gather",))
        A = torch.randn(1024 // world, 256, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
        try:
            program(A, B, torch.empty(1024, 512, device="cuda", dtype=torch.bfloat16))
        except ScheduleTimeout as error:
            assert "edge 0" in str(error) and "gather" in str(error), str(error)
            return
        raise AssertionError("a schedule with its gather left out did not time out")
    record("broken schedule reports rank, edge and epoch", broken)

    def validation():
        program = tiledsl.compile(PROGRAMS / "ag_gemm.tds", heap)
        A = torch.randn(1024 // world, 256, device="cuda", dtype=torch.float32)
        B = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
        try:
            program(A, B, torch.empty(1024, 512, device="cuda", dtype=torch.bfloat16))
        except LaunchError as error:
            assert "'A'" in str(error) and "dtype" in str(error), str(error)
            return
        raise AssertionError("a float32 A was accepted")
    record("launch validation names the wrong tensor", validation)

    return checks.finish(heap)


if __name__ == "__main__":
    sys.exit(main())
