"""The ways each op can run: the plain torch + collective path and the library programs that compute it,
with what each program needs of a shape (rows in whole tiles, 16-byte rows for TMA) met by padding
into workspaces and cutting the result back, so that any shape torch's own ops accept works."""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

import torch

from tiledsl.collectives import ALGORITHM_OPTIONS, DEFAULT_THRESHOLD_BYTES, GEMM_RS_THRESHOLD_BYTES
from tiledsl.library import program as library_program
from tiledsl.ops import torch_path
from tiledsl.ops.context import STATE, compiled, compute_dtype, consts_for, library_consts, should_check
from tiledsl.ops.shapes import aligned, matrix_rows, padded, restore, size_class, unpadded


@dataclass(frozen=True)
class Path:
    """One way to compute an op: the torch path (no program), or a library program with its tunables."""
    program: str | None = None
    tunables: tuple = ()  # (("BK", 128),)

    @property
    def name(self) -> str:
        if self.program is None:
            return "torch"
        return self.program + ("[" + ",".join(f"{k}={v}" for k, v in self.tunables) + "]" if self.tunables else "")


TORCH = Path()


@dataclass
class Problem:
    """One call's operands, with the op's dimension moved first and the rest flattened into rows."""
    group: str            # process group name
    world: int
    dtype: torch.dtype
    device: torch.device
    x: torch.Tensor       # the main operand as rows: A of a product, X of a collective
    moved: tuple          # the caller's layout of x with the op's dimension first, to restore results
    dim: int
    w: torch.Tensor | None = None         # B of a product, the norm's weight
    residual: torch.Tensor | None = None
    eps: float = 0.0

    @property
    def rows(self) -> int:
        return self.x.shape[0]


class Op:
    """What every op provides; subclasses below, one per op."""
    name = ""
    programs: tuple = ()
    gemm = False  # its programs multiply with tl.dot through TMA descriptors (Hopper; TF32 for fp32)

    def paths(self, entry) -> list[Path]:
        """The torch path, then each program with each combination of the tunables the heap leaves open."""
        out = [TORCH]
        for program in self.programs:
            _, tunables = library_consts(program)
            open_ = {k: v for k, v in tunables.items() if entry is None or k not in entry.consts}
            for values in itertools.product(*open_.values()):
                out.append(Path(program, tuple(zip(open_, values))))
        return out

    def refusal(self, path: Path, p: Problem, entry) -> str | None:
        """Why `path` cannot compute this call here, or None."""
        if p.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            return f"the programs run fp16, bf16 and fp32, not {p.dtype}"
        if self.gemm and p.device.type == "cuda":
            if torch.cuda.get_device_capability(p.device) < (9, 0):
                return "the GEMM programs use TMA and wgmma: Hopper (sm_90) or newer"
            if p.dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest":
                return ("tl.dot multiplies fp32 as TF32 and torch is set to full fp32 products "
                        "(torch.set_float32_matmul_precision('high') allows the programs)")
        if path.program.endswith("_push") and not (entry.emulated or entry.kind == "NvshmemHeap"):
            return f"NVSHMEM puts need an NVSHMEM heap, not a {entry.kind}"
        return None

    def rule(self, p: Problem, entry, applicable: set) -> str:
        """The path taken when nothing is measured: the first preferred program whose default tunables
        apply and that needs no padding (padding copies, which only a measurement can justify), else torch."""
        for program in self.preferred(p):
            _, tunables = library_consts(program)
            for path in self.paths(entry)[1:]:
                default = all(tunables[k][0] == v for k, v in path.tunables)  # the program's own choice
                if path.program == program and default and path.name in applicable and self.exact(path, p, entry):
                    return path.name
        return TORCH.name

    def preferred(self, p: Problem) -> tuple:
        return self.programs

    def bucket(self, p: Problem) -> str:
        return f"{str(p.dtype).removeprefix('torch.')} {_pow2_bytes(p.x.numel() * p.x.element_size())}"

    # what each op defines
    def exact(self, path: Path, p: Problem, entry) -> bool:
        raise NotImplementedError

    def torch(self, p: Problem):
        raise NotImplementedError

    def fused(self, path: Path, p: Problem, entry, check: bool | None):
        raise NotImplementedError

    def run(self, path: Path, p: Problem, entry, check: bool | None = None):
        return self.torch(p) if path.program is None else self.fused(path, p, entry, check)

    def program(self, path: Path, p: Problem, entry):
        return compiled(entry, path.program, compute_dtype(entry, p.dtype), path.tunables)


def _pow2_bytes(n: int) -> str:
    n = 1 << max(0, (max(1, n) - 1).bit_length())
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"<={n // size} {unit}"
    return f"<={n} B"


def _pow2(n: int) -> int:
    return 1 << max(0, (max(1, n) - 1).bit_length())


def _call(program, tensors: tuple, check: bool | None) -> None:
    """One program call. Its prepared call is dropped at once: it would keep these tensors (new at
    almost every call of a functional op) alive, up to 64 sets of them."""
    if check is None:
        check = should_check(program, tuple(tuple(t.shape) for t in tensors))
    try:
        program(*tensors, check=check)
    finally:
        program.release()


def _empty(shape, dtype, device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


# ---- products -------------------------------------------------------------------------------------

class _Product(Op):
    gemm = True

    def bucket(self, p: Problem) -> str:
        rows = p.rows * (p.world if self.name == "all_gather_matmul" else 1)
        return f"{str(p.dtype).removeprefix('torch.')} M<={_pow2(rows)} K={p.w.shape[0]} N={p.w.shape[1]}"

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

    def exact(self, path, p, entry):
        return self.sizes(path, p, entry) == (p.rows, *p.w.shape)

    def result(self, p, rows):
        return restore(rows, (p.world * p.moved[0],) + p.moved[1:-1] + (p.w.shape[1],), p.dim)

    def torch(self, p):
        return self.result(p, torch_path.all_gather_rows(p.x, _group(p), p.world) @ p.w)

    def fused(self, path, p, entry, check):
        program = self.program(path, p, entry)
        rows_pad, k_pad, n_pad = self.sizes(path, p, entry)
        A, B = self.operands(path, p, entry, 1, p.rows, rows_pad, k_pad, n_pad)
        C = _empty((p.world * rows_pad, n_pad), A.dtype, p.device)
        _call(program, (A, B, C), check)
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

    def sizes(self, path, p, entry):
        return self.padded_sizes(path, p, entry, p.rows // p.world,
                                 consts_for(entry, path.program, path.tunables)["BM"])

    def exact(self, path, p, entry):
        return self.sizes(path, p, entry) == (p.rows // p.world, *p.w.shape)

    def result(self, p, rows):
        return restore(rows, (p.moved[0] // p.world,) + p.moved[1:-1] + (p.w.shape[1],), p.dim)

    def torch(self, p):
        return self.result(p, torch_path.reduce_scatter_rows(p.x @ p.w, _group(p), p.world))

    def fused(self, path, p, entry, check):
        program = self.program(path, p, entry)
        rows_pad, k_pad, n_pad = self.sizes(path, p, entry)
        A, B = self.operands(path, p, entry, p.world, p.rows // p.world, rows_pad, k_pad, n_pad)
        C = _empty((rows_pad, n_pad), A.dtype, p.device)
        _call(program, (A, B, C), check)
        return self.result(p, unpadded(C, (p.rows // p.world, p.w.shape[1])).to(p.dtype))


class MatmulAllReduce(_Product):
    """all_reduce(A @ B): A [.., K] and B [K, N] hold this rank's share of K (decode's row-parallel layer)."""
    name = "matmul_all_reduce"
    programs = ("gemm_ar",)

    def sizes(self, path, p, entry):
        return self.padded_sizes(path, p, entry, p.rows, 1)  # tiles are masked: any number of rows

    def exact(self, path, p, entry):
        return self.sizes(path, p, entry) == (p.rows, *p.w.shape)

    def result(self, p, rows):
        return restore(rows, p.moved[:-1] + (p.w.shape[1],), 0)

    def torch(self, p):
        return self.result(p, torch_path.all_reduce(p.x @ p.w, _group(p)))

    def fused(self, path, p, entry, check):
        program = self.program(path, p, entry)
        rows_pad, k_pad, n_pad = self.sizes(path, p, entry)
        A, B = self.operands(path, p, entry, 1, p.rows, rows_pad, k_pad, n_pad)
        C = _empty((rows_pad, n_pad), A.dtype, p.device)
        _call(program, (A, B, C), check)
        return self.result(p, unpadded(C, (p.rows, p.w.shape[1])).to(p.dtype))


# ---- collectives ----------------------------------------------------------------------------------

class AllReduce(Op):
    """The sum over ranks of x, any shape."""
    name = "all_reduce"
    programs = ("allreduce", "allreduce_two_shot")

    def preferred(self, p):
        # AllReduce's rule (tiledsl/collectives.py): two-shot from 1 MiB, never at world 2
        large = p.world > 2 and p.x.numel() * p.x.element_size() >= DEFAULT_THRESHOLD_BYTES
        return tuple(reversed(self.programs)) if large else self.programs

    def exact(self, path, p, entry):
        return True  # the sum is computed in a new buffer either way; its tail past x is not read back

    def torch(self, p):
        return torch_path.all_reduce(p.x, _group(p)).view(p.moved)

    def program(self, path, p, entry):
        options = ALGORITHM_OPTIONS["one_shot" if path.program == "allreduce" else "two_shot"]
        return compiled(entry, path.program, compute_dtype(entry, p.dtype), path.tunables,
                        options=options if not entry.emulated else {})

    def fused(self, path, p, entry, check):
        program = self.program(path, p, entry)
        n = p.x.numel()
        out = _empty((size_class(n),), compute_dtype(entry, p.dtype), p.device)
        out[:n].copy_(p.x)
        _call(program, (out,), check)
        return out[:n].to(p.dtype).view(p.moved)


class AllGather(Op):
    """x from every rank, concatenated along `dim`."""
    name = "all_gather"
    programs = ("allgather",)

    def exact(self, path, p, entry):
        return size_class(p.rows) == p.rows

    def result(self, p, rows):
        return restore(rows, (p.world * p.moved[0],) + p.moved[1:], p.dim)

    def torch(self, p):
        return self.result(p, torch_path.all_gather_rows(p.x, _group(p), p.world))

    def fused(self, path, p, entry, check):
        program = self.program(path, p, entry)
        compute, rows, width = compute_dtype(entry, p.dtype), p.rows, p.x.shape[1]
        rows_pad = size_class(rows)
        X = padded(p.x.unsqueeze(0), (1, rows_pad, width), compute, STATE.buffers, self.name).view(rows_pad, width)
        Y = _empty((p.world * rows_pad, width), compute, p.device)
        _call(program, (X, Y), check)
        out = unpadded(Y.view(p.world, rows_pad, width), (p.world, rows, width))
        return self.result(p, out.reshape(p.world * rows, width).to(p.dtype))


class ReduceScatter(Op):
    """The sum over ranks of x, this rank's block of `dim`."""
    name = "reduce_scatter"
    programs = ("reduce_scatter",)

    def exact(self, path, p, entry):
        return size_class(p.rows // p.world) == p.rows // p.world

    def result(self, p, rows):
        return restore(rows, (p.moved[0] // p.world,) + p.moved[1:], p.dim)

    def torch(self, p):
        return self.result(p, torch_path.reduce_scatter_rows(p.x, _group(p), p.world))

    def fused(self, path, p, entry, check):
        program = self.program(path, p, entry)
        compute, rows, width = compute_dtype(entry, p.dtype), p.rows // p.world, p.x.shape[1]
        rows_pad = size_class(rows)
        X = padded(p.x.reshape(p.world, rows, width), (p.world, rows_pad, width), compute, STATE.buffers,
                   self.name).view(p.world * rows_pad, width)
        Y = _empty((rows_pad, width), compute, p.device)
        _call(program, (X, Y), check)
        return self.result(p, unpadded(Y, (rows, width)).to(p.dtype))


# The library's all-reduce + RMSNorm writes its epsilon as a literal; other epsilons compile a copy of
# the program's text with that literal replaced.
_RMSNORM_EPS = re.compile(r"(rmsnorm\([^\n]*?,\s*)([0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)(\s*\))")


class AllReduceRMSNorm(Op):
    """h = sum over ranks of x + residual; (rmsnorm(h) * weight, h), rows of the last dimension."""
    name = "all_reduce_rmsnorm"
    programs = ("allreduce_rmsnorm",)

    def bucket(self, p):  # the epsilon too: whether the program applies depends on it
        return f"{str(p.dtype).removeprefix('torch.')} T<={_pow2(p.rows)} D={p.x.shape[1]} eps={p.eps:g}"

    def source(self, p) -> tuple[str | None, str | None]:
        """(program text for this epsilon, or None for the library file as it is; why not, or None)."""
        text = library_program(self.programs[0]).read_text()
        found = _RMSNORM_EPS.findall(text)
        if len(found) != 1:
            return None, f"the library program's epsilon is not one literal (found {len(found)})"
        if float(found[0][1]) == p.eps:
            return None, None
        if not (math.isfinite(p.eps) and p.eps > 0):
            return None, f"epsilon {p.eps} is not a positive number"
        return _RMSNORM_EPS.sub(lambda m: m.group(1) + repr(float(p.eps)) + m.group(3), text), None

    def refusal(self, path, p, entry):
        return super().refusal(path, p, entry) or self.source(p)[1]

    def exact(self, path, p, entry):
        return size_class(p.rows) == p.rows

    def torch(self, p):
        y, h = torch_path.all_reduce_rmsnorm(p.x, p.residual, p.w, p.eps, _group(p))
        return y.view(p.moved), h.view(p.moved)

    def program(self, path, p, entry):
        return compiled(entry, path.program, compute_dtype(entry, p.dtype), path.tunables, source=self.source(p)[0])

    def fused(self, path, p, entry, check):
        program = self.program(path, p, entry)
        compute, rows, width = compute_dtype(entry, p.dtype), p.rows, p.x.shape[1]
        rows_pad = size_class(rows)
        X = padded(p.x.unsqueeze(0), (1, rows_pad, width), compute, STATE.buffers, self.name).view(rows_pad, width)
        R = torch.zeros((rows_pad, width), dtype=compute, device=p.device)
        R[:rows].copy_(p.residual)
        W = STATE.weights.get(p.w, (width,), compute)
        Y = _empty((rows_pad, width), compute, p.device)
        _call(program, (X, R, W, Y), check)
        return (unpadded(Y, (rows, width)).to(p.dtype).view(p.moved),
                unpadded(R, (rows, width)).to(p.dtype).view(p.moved))


def _group(p: Problem):
    from tiledsl.ops.context import resolve
    return resolve(p.group)


OPS = {op.name: op for op in (AllGatherMatmul(), MatmulReduceScatter(), MatmulAllReduce(), AllReduce(),
                              AllGather(), ReduceScatter(), AllReduceRMSNorm())}
