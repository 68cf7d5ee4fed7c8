"""Multi-GPU checks of the two-level programs under torchrun, on a topology of several nodes. On one
machine, TILEDSL_NODES=2 makes its GPUs pose as 2 nodes (2 x 1 on 2 GPUs, 2 x 2 on 4): ranks on
different pretended nodes then talk only through NVSHMEM (the heap gives no pointer to them, and a
peer offset to them points into poisoned addresses). On a cluster, launch it with `torchrun --nnodes N
--nproc-per-node G` instead and the topology comes from torchrun.

Every hierarchical program against torch.distributed: AllGather, ReduceScatter and AllReduce (bf16 and
fp32, 1 KB to 64 MB, and a ragged size near each), AG+GEMM and GEMM+RS (bf16, a square shape and one no
tile divides, the latter through the CUDA graph, direct relaunch and the JIT); 100 calls back to back,
fresh random inputs every call, outputs poisoned (NaN) before it and checked after; ReduceScatter also
from an input on the heap, read in place and overwritten after every call. Then the topology
itself: what the heap declares, no pointer to another node, and a one-node program refused at launch.
Rank 0 prints one PASS/FAIL line a check."""
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from harness import Case, Checks, back_to_back, close, empty, host, start  # noqa: E402

import tiledsl

PROGRAMS = Path(__file__).resolve().parents[2] / "programs"
CALLS = 100
DTYPES = (torch.bfloat16, torch.float32)
BYTES = (1 << 10, 1 << 20, 64 << 20)
# launch paths of the GEMM programs: (name, compile options)
PATHS = (("graph", {}), ("relaunch", {"graphs": False}), ("jit", {"graphs": False, "replay": False}))
HEAP_BYTES = str(16 << 30)  # R, S, Q and the staging buffers per size: more than NVSHMEM's 1 GiB default
NAN = float("nan")


def override(dtype):
    return {} if dtype == torch.bfloat16 else {"bfloat16": dtype}


def tolerance(dtype) -> float:
    """Relative to the reference's scale. bf16: partial sums are rounded to bf16 on their way across
    nodes (as NCCL's are), so two roundings."""
    return 2e-2 if dtype == torch.bfloat16 else 1e-5


def collective_shapes(nbytes: int, size: int, world: int):
    """(rows per rank, columns) for a message of `nbytes` (the whole gathered or scattered tensor), then
    a ragged shape near it: an odd row count and 1000 columns, a multiple of no tile."""
    numel = nbytes // size
    cols = 1024 if numel >= 1024 * world else 128
    rows = max(1, numel // cols // world)
    return [(rows, cols), (max(1, numel * 3 // 4 // 1000 // world) | 1, 1000)]


def gemm_shapes(world):
    """(M, K, N): square, and ragged (K and N no tile divides; M whole row tiles a rank, as required).
    hier_gemm_rs splits K by ranks and reads A's rows through TMA, which needs rows of a multiple of 16
    bytes: each rank's share of K is 488 (bf16 rows of 976 bytes, ragged against BK = 64 and 128)."""
    return [(4096, 4096, 4096), (world * 384, world * 488, 1000)]


def allgather_check(heap, world, rows, cols, dtype):
    def run():
        program = tiledsl.compile(PROGRAMS / "hier_allgather.tds", heap, dtype_override=override(dtype))

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
        program = tiledsl.compile(PROGRAMS / "hier_reduce_scatter.tds", heap, dtype_override=override(dtype))

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


def reduce_scatter_in_place_check(heap, world, rows, cols, dtype):
    """X on the symmetric heap (tiledsl.empty): peers on both levels read it where it is, no staging copy,
    and each set's new inputs are copied into it right after the previous call returns (stream-ordered,
    no synchronisation). Only the two-level exit barrier keeps that copy from overwriting rows a peer on
    another node still reads."""
    def run():
        program = tiledsl.compile(PROGRAMS / "hier_reduce_scatter.tds", heap, dtype_override=override(dtype))
        # heap.alloc is what tiledsl.empty does; without a heap (the scripts' CPU stand-ins) a plain tensor
        X = heap.alloc((rows * world, cols), dtype) if heap is not None else empty(rows * world, cols, dtype=dtype)

        def make_case():
            source, want, Y = empty(rows * world, cols, dtype=dtype), empty(rows, cols), empty(rows, cols, dtype=dtype)

            def refresh():
                source.normal_()
                host.reduce_scatter_tensor(want, source.float())
                Y.fill_(NAN)
            return Case((X, Y), refresh, lambda: close(Y, want, tolerance(dtype)), load=lambda: X.copy_(source))
        back_to_back(program, program.check, make_case, CALLS)
        prepared = list(getattr(program, "_calls", {}).values())  # a stand-in prepares nothing
        assert all(not call.staged and call.exit for call in prepared), "X was staged, not read in place"
    return run


def allreduce_check(heap, numel, dtype):
    def run():
        program = tiledsl.compile(PROGRAMS / "hier_allreduce.tds", heap, dtype_override=override(dtype))

        def make_case():
            X, want = empty(numel, dtype=dtype), empty(numel)

            def refresh():  # inout: X is both the input and the output
                X.normal_()
                want.copy_(X)
                host.all_reduce(want)
            return Case((X,), refresh, lambda: close(X, want, tolerance(dtype)))
        back_to_back(program, program.check, make_case, CALLS)
    return run


def ag_gemm_check(heap, world, M, K, N, options):
    def run():
        program = tiledsl.compile(PROGRAMS / "hier_ag_gemm.tds", heap, **options)

        def make_case():
            A, B = empty(M // world, K, dtype=torch.bfloat16), empty(K, N, dtype=torch.bfloat16)
            C, gathered, want = empty(M, N, dtype=torch.bfloat16), empty(M, K, dtype=torch.bfloat16), empty(M, N)

            def refresh():
                A.normal_()
                B.normal_()
                host.all_gather_into_tensor(gathered, A)
                torch.matmul(gathered.float(), B.float(), out=want)
                C.fill_(NAN)
            return Case((A, B, C), refresh, lambda: close(C, want))
        back_to_back(program, program.check, make_case, CALLS)
    return run


def gemm_rs_check(heap, world, M, K, N, options):
    def run():
        program = tiledsl.compile(PROGRAMS / "hier_gemm_rs.tds", heap, **options)

        def make_case():
            A, B = empty(M, K // world, dtype=torch.bfloat16), empty(K // world, N, dtype=torch.bfloat16)
            C, product, want = empty(M // world, N, dtype=torch.bfloat16), empty(M, N), empty(M // world, N)

            def refresh():
                A.normal_()
                B.normal_()
                torch.matmul(A.float(), B.float(), out=product)
                host.reduce_scatter_tensor(want, product)
                C.fill_(NAN)
            return Case((A, B, C), refresh, lambda: close(C, want))
        back_to_back(program, program.check, make_case, CALLS)
    return run


def topology_check(heap, world):
    """The heap's topology is the one declared, a rank of another node has no pointer, and its peer
    offsets point into poisoned addresses."""
    def run():
        from tiledsl.runtime.heap import CrossNodeAccess, poisoned_rank
        from tiledsl.topology import declared
        topology = heap.topology
        assert topology == declared(world), (topology, declared(world))
        t = heap.alloc((16,), torch.float32)
        others = [r for r in range(world) if not topology.same_node(heap.rank, r)]
        offsets = heap.peer_offsets(t).tolist()
        for r in range(world):
            address = t.data_ptr() + t.element_size() * offsets[r]
            assert (poisoned_rank(address, world) == r) == (r in others), (r, address)
        for r in others:
            try:
                heap.peer(t, r)
            except CrossNodeAccess:
                continue
            raise AssertionError(f"rank {heap.rank} got a pointer to rank {r}, on another node")
    return run


def one_node_program_refused(heap):
    def run():
        from tiledsl.runtime.validate import LaunchError
        try:
            tiledsl.compile(PROGRAMS / "allgather.tds", heap)
        except LaunchError as error:
            assert "names no topology" in str(error), error
            return
        raise AssertionError("allgather.tds, written for one node, was accepted on several")
    return run


SEED = 8642


def register(checks, rank: int, world: int, heap) -> None:
    """Every check of this suite, recorded in `checks` (tests/gpu/all_checks.py runs the suites one after
    another in one process group)."""
    record = checks.record
    if heap is not None and rank == 0:
        print(f"topology: {heap.topology} ranks (TILEDSL_NODES={os.environ.get('TILEDSL_NODES', 'unset')})",
              flush=True)

    for dtype in DTYPES:
        size = torch.empty((), dtype=dtype).element_size()
        tag = str(dtype).removeprefix("torch.")
        for nbytes in BYTES:
            for rows, cols in collective_shapes(nbytes, size, world):
                record(f"hier_allgather {tag} {rows}x{cols} per rank ({rows * cols * world * size} bytes gathered)",
                       allgather_check(heap, world, rows, cols, dtype))
                record(f"hier_reduce_scatter {tag} {rows * world}x{cols} ({rows * cols * world * size} bytes in)",
                       reduce_scatter_check(heap, world, rows, cols, dtype))
                if nbytes == BYTES[1]:
                    record(f"hier_reduce_scatter {tag} {rows * world}x{cols} from the heap, read in place",
                           reduce_scatter_in_place_check(heap, world, rows, cols, dtype))
            for numel in (nbytes // size, nbytes // size * 3 // 4 + 7):
                record(f"hier_allreduce {tag} N={numel} ({numel * size} bytes)", allreduce_check(heap, numel, dtype))

    for n, (M, K, N) in enumerate(gemm_shapes(world)):
        for path, options in PATHS if n else PATHS[:1]:  # every launch path on the ragged shape
            record(f"hier_ag_gemm M={M} K={K} N={N} {path}", ag_gemm_check(heap, world, M, K, N, options))
            record(f"hier_gemm_rs M={M} K={K} N={N} {path}", gemm_rs_check(heap, world, M, K, N, options))

    if heap is not None:
        record(f"topology {heap.topology}: no pointer to another node", topology_check(heap, world))
        if heap.topology.nodes > 1:
            record("a program written for one node is refused at launch", one_node_program_refused(heap))


def main() -> int:
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", HEAP_BYTES)
    rank, world, heap = start(SEED)
    checks = Checks()
    register(checks, rank, world, heap)
    return checks.finish(heap)


if __name__ == "__main__":
    sys.exit(main())
