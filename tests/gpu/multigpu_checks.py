"""Multi-GPU checks, run under torchrun: every program and engine against torch.distributed, 100 calls
back to back with no reset, each on fresh random bf16 inputs with its output poisoned (NaN) before and
checked after; a schedule broken on purpose, and launch-time validation. Rank 0 prints one PASS/FAIL
line a check."""
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from harness import Case, Checks, back_to_back, cap_calls, close, empty, host, start, wait_s  # noqa: E402

import tiledsl
from tiledsl.runtime.launch import LaunchError, ScheduleTimeout

PROGRAMS = Path(__file__).resolve().parents[2] / "programs"
CALLS = 100
ALLREDUCE_SIZES = (1000, 1 << 20, 3 * (1 << 20) + 7)
NAN = float("nan")
BF16 = {"dtype": torch.bfloat16}


def gemm_shapes(world):
    """(M, K, N) of the AG+GEMM checks (K times world for GEMM+RS): the second divides into no tile evenly."""
    return [(4096, 2048, 2048), (384 * world, 1000, 1000)]


def collective_shapes(world):
    """(rows, columns) of the whole tensor a ReduceScatter splits or an AllGather gathers."""
    return [(64 * world, 1024), (1000 * world, 1000)]


def calls_checked(program, make_case):
    back_to_back(program, program.check, make_case, CALLS)


def ag_gemm_case(world, M, K, N):
    """This rank's A rows and B; the expected product of the rows gathered by NCCL with B."""
    A, B, C = empty(M // world, K, **BF16), empty(K, N, **BF16), empty(M, N, **BF16)
    full, want = empty(M, K, **BF16), empty(M, N, **BF16)

    def refresh():
        A.normal_()
        B.normal_()
        host.all_gather_into_tensor(full, A)
        torch.matmul(full, B, out=want)
        C.fill_(NAN)
    return Case((A, B, C), refresh, lambda: close(C, want))


def ag_gemm_check(source, world, heap, M, K, N, **consts):
    def run():
        program = tiledsl.compile(source, heap, **consts)
        calls_checked(program, lambda: ag_gemm_case(world, M, K, N))
    return run


def gemm_rs_case(world, M, K, N):
    """This rank's shards of A and B (K split over the ranks); the expected rows of the product, summed
    by NCCL in float32."""
    A, B = empty(M, K // world, **BF16), empty(K // world, N, **BF16)
    C, want = empty(M // world, N, **BF16), empty(M // world, N)

    def refresh():
        A.normal_()
        B.normal_()
        host.reduce_scatter_tensor(want, A.float() @ B.float())
        C.fill_(NAN)
    return Case((A, B, C), refresh, lambda: close(C, want))


def gemm_rs_check(world, heap, M, K, N, name="gemm_rs"):
    def run():
        program = tiledsl.compile(PROGRAMS / f"{name}.tds", heap)
        calls_checked(program, lambda: gemm_rs_case(world, M, K, N))
    return run


def alternating_outputs_check(world, heap, M, K, N):
    """The same A and B tensors at every call and several output tensors in turn: each output has its
    own prepared call (and CUDA graph), and every call must land in the tensor it was given. New
    values are copied into A and B right before each call."""
    def run():
        program = tiledsl.compile(PROGRAMS / "gemm_rs.tds", heap)
        A, B = empty(M, K // world, **BF16), empty(K // world, N, **BF16)

        def make_case():
            mine = gemm_rs_case(world, M, K, N)
            fresh_A, fresh_B, C = mine.args

            def load():
                A.copy_(fresh_A)
                B.copy_(fresh_B)
            return Case((A, B, C), mine.refresh, mine.verify, load)
        calls_checked(program, make_case)
    return run


def collective_check(name, world, heap, shape_in, reference, out_shape=None, tol=2e-2):
    """X random; `reference(X, want)` writes the expected result (float32). Without `out_shape` the
    program overwrites X (inout), which then is its own output."""
    def run():
        program = tiledsl.compile(PROGRAMS / f"{name}.tds", heap)

        def make_case():
            X = empty(*shape_in, **BF16)
            want = empty(*(out_shape or shape_in))
            Y = X if out_shape is None else empty(*out_shape, **BF16)

            def refresh():
                X.normal_()
                reference(X, want)
                if Y is not X:
                    Y.fill_(NAN)
            return Case((X,) if Y is X else (X, Y), refresh, lambda: close(Y, want, tol))
        calls_checked(program, make_case)
    return run


SEED = 1234


def register(checks, rank: int, world: int, heap) -> None:
    """Every check of this suite, recorded in `checks` (tests/gpu/all_checks.py runs the suites one after
    another in one process group)."""
    record = checks.record

    shapes = gemm_shapes(world)
    ag = (PROGRAMS / "ag_gemm.tds").read_text()
    for M, K, N in shapes:
        record(f"ag_gemm copy_engine M={M} K={K} N={N}", ag_gemm_check(PROGRAMS / "ag_gemm.tds", world, heap, M, K, N))
        if (M, K, N) == shapes[0]:  # the direct launch paths the CUDA-graph replay stands in front of
            record(f"ag_gemm copy_engine, no CUDA graphs M={M} K={K} N={N}",
                   ag_gemm_check(PROGRAMS / "ag_gemm.tds", world, heap, M, K, N, graphs=False))
            record(f"ag_gemm copy_engine, every launch through the JIT M={M} K={K} N={N}",
                   ag_gemm_check(PROGRAMS / "ag_gemm.tds", world, heap, M, K, N, graphs=False, replay=False))
            record(f"gemm_rs two output tensors in turn M={M} K={K * world} N={N}",
                   alternating_outputs_check(world, heap, M, K * world, N))
        record(f"ag_gemm sms M={M} K={K} N={N}",
               ag_gemm_check(ag.replace("on copy_engine", "on sms(8)"), world, heap, M, K, N))
        record(f"ag_gemm nvshmem M={M} K={K} N={N}",
               ag_gemm_check(PROGRAMS / "ag_gemm_push.tds", world, heap, M, K, N))
        record(f"gemm_rs sms M={M} K={K * world} N={N}", gemm_rs_check(world, heap, M, K * world, N))
        for variant in ("gemm_rs_push", "gemm_rs_pull"):
            record(f"{variant} sms M={M} K={K * world} N={N}",
                   gemm_rs_check(world, heap, M, K * world, N, variant))
        # rows sent by the copy engine once the stream sees their tiles counted
        record(f"gemm_rs_ce copy_engine M={M} K={K * world} N={N}",
               gemm_rs_check(world, heap, M, K * world, N, "gemm_rs_ce"))

    def all_reduce(x, want):
        want.copy_(x)
        host.all_reduce(want)

    def reduce_scatter(x, want):
        host.reduce_scatter_tensor(want, x.float())

    def all_gather(x, want):
        gathered = empty(*want.shape, dtype=x.dtype)
        host.all_gather_into_tensor(gathered, x)
        want.copy_(gathered)

    for n in ALLREDUCE_SIZES:
        record(f"allreduce N={n}", collective_check("allreduce", world, heap, (n,), all_reduce))
    for rows, cols in collective_shapes(world):
        record(f"reduce_scatter {rows}x{cols}",
               collective_check("reduce_scatter", world, heap, (rows, cols), reduce_scatter, (rows // world, cols)))
        record(f"allgather {rows // world}x{cols} per rank",  # copies: exact
               collective_check("allgather", world, heap, (rows // world, cols), all_gather, (rows, cols), tol=0.0))

    def broken():
        program = tiledsl.compile(PROGRAMS / "ag_gemm.tds", heap, wait_timeout_s=1.0, skip=("gather",))
        A = empty(1024 // world, 256, **BF16).normal_()
        B = empty(256, 512, **BF16).normal_()
        try:
            program(A, B, empty(1024, 512, **BF16))
        except ScheduleTimeout as error:
            assert "edge 0" in str(error) and "gather" in str(error), str(error)
            return
        raise AssertionError("a schedule with its gather left out did not time out")
    record("broken schedule reports rank, edge and epoch", broken)

    def validation():
        program = tiledsl.compile(PROGRAMS / "ag_gemm.tds", heap)
        A = empty(1024 // world, 256).normal_()
        B = empty(256, 512, **BF16).normal_()
        try:
            program(A, B, empty(1024, 512, **BF16))
        except LaunchError as error:
            assert "'A'" in str(error) and "dtype" in str(error), str(error)
            return
        raise AssertionError("a float32 A was accepted")
    record("launch validation names the wrong tensor", validation)

    def user_graph(name, make_case, calls_per_graph, **options):
        """Calls recorded into the caller's own CUDA graph (as a serving engine captures a decode step),
        after one warm-up call; each replay on fresh inputs in the same tensors, every replay checked,
        waits still bounded (check() after the replays)."""
        def run():
            program = tiledsl.compile(PROGRAMS / f"{name}.tds", heap, **options)
            case = make_case()
            case.refresh()
            program(*case.args)  # warm-up: prepares the call, compiles, copies its tables to the GPU
            if calls_per_graph == 1:
                case.verify()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(calls_per_graph):
                    program(*case.args, check=False)
            for _ in range(cap_calls(20)):
                case.refresh()
                graph.replay()
                torch.cuda.synchronize()
                case.verify()
            program.check()
        return run

    def allreduce_case(n, calls=1):
        """X summed over ranks in place, `calls` times over: each call reduces the last one's result."""
        X, want = empty(n, **BF16), empty(n)

        def refresh():
            X.normal_()
            want.copy_(X)
            host.all_reduce(want)
            want.mul_(world ** (calls - 1))
        return Case((X,), refresh, lambda: close(X, want))

    M, K, N = shapes[0]
    record(f"user CUDA graph, ag_gemm (copy engine) M={M} K={K} N={N}",
           user_graph("ag_gemm", lambda: ag_gemm_case(world, M, K, N), 1))
    # a staged input, an odd number of calls a graph: the staging buffer's parity is frozen in the graph
    record("user CUDA graph, allreduce (staged input) x1 per graph N=1048576",
           user_graph("allreduce", lambda: allreduce_case(1 << 20), 1))
    record("user CUDA graph, allreduce (staged input) x3 per graph N=4096",
           user_graph("allreduce", lambda: allreduce_case(4096, calls=3), 3))

    def capture_without_warm_up():
        program = tiledsl.compile(PROGRAMS / "allreduce.tds", heap)
        X = empty(4096, **BF16).normal_()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                program(X, check=False)
        except LaunchError as error:
            assert "call it once with tensors of these shapes, dtypes and strides before capturing" in str(error), \
                str(error)
            return
        raise AssertionError("a capture without a warm-up call was not refused by name")
    record("user CUDA graph without a warm-up call is refused by name", capture_without_warm_up)

    def recovery():
        """A call that fails on one rank (a wrong tensor there) times out on the other; reset() on every
        rank puts them back in step, and the next calls are right."""
        program = tiledsl.compile(PROGRAMS / "allreduce.tds", heap, wait_timeout_s=wait_s(0.5))
        case = allreduce_case(8192)
        case.refresh()
        program(*case.args)
        bad = empty(8192).normal_() if dist.get_rank() == 1 else case.args[0]
        try:
            program(bad)
        except (LaunchError, ScheduleTimeout):
            pass
        program.reset()
        for _ in range(3):
            case.refresh()
            program(*case.args)
            case.verify()
    record("a failed call, then reset() on every rank, then correct calls", recovery)

    def unaligned():
        program = tiledsl.compile(PROGRAMS / "ag_gemm.tds", heap)
        A, B = empty(1024 // world, 256, **BF16).normal_(), empty(256, 32001, **BF16).normal_()
        try:
            program(A, B, empty(1024, 32001, **BF16))
        except LaunchError as error:
            assert "'B'" in str(error) and "16 bytes" in str(error), str(error)
            return
        raise AssertionError("N=32001 reached Triton's stride assertion instead of a LaunchError")
    record("N=32001 (rows not a multiple of 16 bytes) is refused by name", unaligned)



def main() -> int:
    rank, world, heap = start(SEED)
    checks = Checks()
    register(checks, rank, world, heap)
    return checks.finish(heap)


if __name__ == "__main__":
    sys.exit(main())
