"""The ways each op can run: the plain torch + collective path and the library programs that compute it.
`Op` is what every op provides (its paths, why a path cannot take a call, the rule when nothing is
measured, the run); products.py, collective_ops.py, attention_ops.py and moe_ops.py define the ops on
top of it, meeting what a program needs of a shape (rows in whole tiles, 16-byte rows for TMA) by padding into
workspaces and cutting the result back, so that any shape torch's own ops accept works."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from tiledsl.ops.context import SUPPORTED, compiled, compute_dtype, library_consts, resolve, should_check


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
    more: tuple = ()                      # the attention and MoE ops' operands, as they were given

    @property
    def rows(self) -> int:
        return self.x.shape[0]


class Op:
    """What every op provides; one subclass per op in products.py, collective_ops.py, attention_ops.py and
    moe_ops.py."""
    name = ""
    programs: tuple = ()
    # its programs multiply with tl.dot through TMA descriptors (Hopper). A program that declares f32
    # multiplies in IEEE fp32; the library's declare bf16 and run fp32 through dtype_override, whose
    # kernel source (made from the declared dtypes) keeps Triton's default for fp32: TF32
    gemm = False

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
        if p.dtype not in SUPPORTED:
            return f"the programs run fp16, bf16 and fp32, not {p.dtype}"
        if self.gemm and p.device.type == "cuda":
            if torch.cuda.get_device_capability(p.device) < (9, 0):
                return "the GEMM programs use TMA and wgmma: Hopper (sm_90) or newer"
            if p.dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest":
                return ("the library's GEMM programs declare bf16 and run fp32 through a dtype override, "
                        "where tl.dot multiplies as TF32, and torch is set to full fp32 products "
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
        return f"{str(p.dtype).removeprefix('torch.')} {pow2_bytes(p.x.numel() * p.x.element_size())}"

    def predicted_sizes(self, p: Problem) -> dict | None:
        """The params its programs are predicted at for this call (tiledsl.ops.prediction), or None:
        the op's paths are not ranked by prediction."""
        return None

    # what each op defines
    def exact(self, path: Path, p: Problem, entry) -> bool:
        """Whether the program takes this call's tensors with no padding copies."""
        raise NotImplementedError

    def unfused(self, p: Problem):
        """The plain torch + collective path."""
        raise NotImplementedError

    def fused(self, path: Path, p: Problem, entry, check: bool | None):
        """Through the program of `path`; `check`: whether the call checks its waits (None: the policy)."""
        raise NotImplementedError

    def run(self, path: Path, p: Problem, entry, check: bool | None = None):
        return self.unfused(p) if path.program is None else self.fused(path, p, entry, check)

    def program(self, path: Path, p: Problem, entry):
        return compiled(entry, path.program, compute_dtype(entry, p.dtype), path.tunables)


def pow2_bytes(n: int) -> str:
    n = pow2(n)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"<={n // size} {unit}"
    return f"<={n} B"


def pow2(n: int) -> int:
    return 1 << max(0, (max(1, n) - 1).bit_length())


def call(program, tensors: tuple, check: bool | None) -> None:
    """One program call. Its prepared call is dropped at once: it would keep these tensors (new at
    almost every call of a functional op) alive, up to 64 sets of them."""
    if check is None:
        check = should_check(program, tuple(tuple(t.shape) for t in tensors))
    try:
        program(*tensors, check=check)
    finally:
        program.release()


def empty(shape, dtype, device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


def group(p: Problem):
    """The call's process group, for the torch path's collectives."""
    return resolve(p.group)
