"""The products: all_gather_matmul, matmul_reduce_scatter and matmul_all_reduce. Rows are padded to
whole tiles (and a size class), K and N to 16-byte rows; weights are padded once (shapes.Weights)."""
from __future__ import annotations

from tiledsl.collectives import GEMM_RS_THRESHOLD_BYTES
from tiledsl.ops import torch_path
from tiledsl.ops.context import STATE, compute_dtype, consts_for
from tiledsl.ops.paths import Op, Path, Problem, call, empty, group, pow2
from tiledsl.ops.shapes import aligned, padded, restore, size_class, unpadded


class _Product(Op):
    gemm = True

    def bucket(self, p: Problem) -> str:
        rows = p.rows * (p.world if self.name == "all_gather_matmul" else 1)
        return f"{str(p.dtype).removeprefix('torch.')} M<={pow2(rows)} K={p.w.shape[0]} N={p.w.shape[1]}"

    def padded_sizes(self, path: Path, p: Problem, entry, rows: int, multiple: int) -> tuple[int, int, int]:
        compute = compute_dtype(entry, p.dtype)
        return size_class(rows, multiple), aligned(p.w.shape[0], compute), aligned(p.w.shape[1], compute)

    def operands(self, path, p, entry, blocks: int, rows: int, rows_pad: int, k_pad: int, n_pad: int):
        compute = compute_dtype(entry, p.dtype)
        A = padded(p.x.reshape(blocks, rows, p.x.shape[1]), (blocks, rows_pad, k_pad), compute, STATE.buffers,
                   self.name)
        return A.view(blocks * rows_pad, k_pad), STATE.weights.get(p.w, (k_pad, n_pad), compute)


class AllGatherMatmul(_Product):
    """all_gather(A) @ B: A [.., K] sharded along `dim` over the ranks, B [K, N] this rank's."""
    name = "all_gather_matmul"
    programs = ("ag_gemm", "ag_gemm_push")

    def sizes(self, path, p, entry):
        return self.padded_sizes(path, p, entry, p.rows, consts_for(entry, path.program, path.tunables)["BM"])

    def predicted_sizes(self, p):  # M: the gathered rows
        return dict(M=p.world * p.rows, K=p.w.shape[0], N=p.w.shape[1])

    def exact(self, path, p, entry):
        return self.sizes(path, p, entry) == (p.rows, *p.w.shape)

    def result(self, p, rows):
        return restore(rows, (p.world * p.moved[0],) + p.moved[1:-1] + (p.w.shape[1],), p.dim)

    def unfused(self, p):
        return self.result(p, torch_path.all_gather_rows(p.x, group(p), p.world) @ p.w)

    def fused(self, path, p, entry, check):
        program = self.program(path, p, entry)
        rows_pad, k_pad, n_pad = self.sizes(path, p, entry)
        A, B = self.operands(path, p, entry, 1, p.rows, rows_pad, k_pad, n_pad)
        C = empty((p.world * rows_pad, n_pad), A.dtype, p.device)
        call(program, (A, B, C), check)
        rows = unpadded(C.view(p.world, rows_pad, n_pad), (p.world, p.rows, p.w.shape[1]))
        return self.result(p, rows.reshape(p.world * p.rows, -1).to(p.dtype))


class MatmulReduceScatter(_Product):
    """reduce_scatter(A @ B) along `dim`: A [.., K] and B [K, N] hold this rank's share of K."""
    name = "matmul_reduce_scatter"
    programs = ("gemm_rs_pull", "gemm_rs_ce", "gemm_rs")

    def preferred(self, p):
        # GemmReduceScatter's rule (tiledsl/collectives.py): the copy engine from a 256 MiB product
        large = p.rows * p.w.shape[1] * p.x.element_size() >= GEMM_RS_THRESHOLD_BYTES
        return ("gemm_rs_ce", "gemm_rs_pull", "gemm_rs") if large else self.programs

    def predicted_sizes(self, p):  # M: every rank's rows, K: this rank's share
        return dict(M=p.rows, K=p.w.shape[0], N=p.w.shape[1])

    def sizes(self, path, p, entry):
        return self.padded_sizes(path, p, entry, p.rows // p.world,
                                 consts_for(entry, path.program, path.tunables)["BM"])

    def exact(self, path, p, entry):
        return self.sizes(path, p, entry) == (p.rows // p.world, *p.w.shape)

    def result(self, p, rows):
        return restore(rows, (p.moved[0] // p.world,) + p.moved[1:-1] + (p.w.shape[1],), p.dim)

    def unfused(self, p):
        return self.result(p, torch_path.reduce_scatter_rows(p.x @ p.w, group(p), p.world))

    def fused(self, path, p, entry, check):
        program = self.program(path, p, entry)
        rows_pad, k_pad, n_pad = self.sizes(path, p, entry)
        A, B = self.operands(path, p, entry, p.world, p.rows // p.world, rows_pad, k_pad, n_pad)
        C = empty((rows_pad, n_pad), A.dtype, p.device)
        call(program, (A, B, C), check)
        return self.result(p, unpadded(C, (p.rows // p.world, p.w.shape[1])).to(p.dtype))


class MatmulAllReduce(_Product):
    """all_reduce(A @ B): A [.., K] and B [K, N] hold this rank's share of K (decode's row-parallel layer)."""
    name = "matmul_all_reduce"
    programs = ("gemm_ar",)

    def predicted_sizes(self, p):
        return dict(M=p.rows, K=p.w.shape[0], N=p.w.shape[1])

    def sizes(self, path, p, entry):
        return self.padded_sizes(path, p, entry, p.rows, 1)  # tiles are masked: any number of rows

    def exact(self, path, p, entry):
        return self.sizes(path, p, entry) == (p.rows, *p.w.shape)

    def result(self, p, rows):
        return restore(rows, p.moved[:-1] + (p.w.shape[1],), 0)

    def unfused(self, p):
        return self.result(p, torch_path.all_reduce(p.x @ p.w, group(p)))

    def fused(self, path, p, entry, check):
        program = self.program(path, p, entry)
        rows_pad, k_pad, n_pad = self.sizes(path, p, entry)
        A, B = self.operands(path, p, entry, 1, p.rows, rows_pad, k_pad, n_pad)
        C = empty((rows_pad, n_pad), A.dtype, p.device)
        call(program, (A, B, C), check)
        return self.result(p, unpadded(C, (p.rows, p.w.shape[1])).to(p.dtype))
