"""Collectives built from the programs in `programs/`, with the launch-time choices they need.

`AllReduce` picks one-shot (`allreduce.tds`: every rank reads all of X from every rank, one step, the
lowest latency) below a message size and two-shot (`allreduce_two_shot.tds`: reduce-scatter then
all-gather, each rank reads 2 (world-1)/world of X, the most bandwidth) above it. `GemmReduceScatter`
picks `gemm_rs_pull.tds` (owners pull and sum after the GEMM) for small products and `gemm_rs_ce.tds`
(the copy engine sends finished row blocks while the GEMM runs) for large ones."""
from __future__ import annotations

import torch

import tiledsl
from tiledsl.library import program as library_program

ALGORITHMS = {"one_shot": "allreduce", "two_shot": "allreduce_two_shot"}  # programs of the library
OUT_OF_PLACE = "allreduce_out"  # one-shot into another tensor: reads an input on the heap where it is
# Bytes from which two-shot is used at world 3 and more. One-shot reads (world-1) times the message
# over NVLink, two-shot 2 (world-1)/world times: the same at world 2, where one-shot (less local work,
# one step) was faster at every size from 8 KB to 256 MB (bench/results/2026-11-29-world2), so world 2
# never switches. At world 4 the push programs crossed over between 512 KB and 1 MB
# (bench/results/2026-11-29/collectives_world4.json); the pull programs are not yet measured there.
DEFAULT_THRESHOLD_BYTES = 1024 * 1024
# Launch options per algorithm, measured at world 2: one-shot with 16 warps a program read 282 GB/s at
# 256 MB against 161 with 4, and was as fast or faster at every smaller size. 8192 elements a tile
# instead of 2048 read 1% more at 64 and 256 MB, and was as fast below in one run and up to 2x slower
# at 16-256 KB in the next (bench/results/2026-11-29-world2-s9/run3-f7c4392, run4-d0e9c00): kept 2048.
ALGORITHM_OPTIONS = {"one_shot": {"num_warps": 16}, "two_shot": {}}
DECLARED_DTYPE = torch.bfloat16  # the dtype the programs declare; others run through dtype_override

GEMM_RS_PROGRAMS = {"pull": "gemm_rs_pull", "copy_engine": "gemm_rs_ce"}
# Bytes of one rank's whole product (M x N) from which the copy engine sends it. Measured at world 2
# only (bench/results/2026-11-29-world2-s9/run7-5bdb0d8): gemm_rs_ce was faster from 470 MB (LLaMA-3-70B,
# 8192 x 28672 bf16: 3.31 against 3.46 ms) and slower up to 235 MB (LLaMA-3-8B: 1.59 against 1.08),
# where its fixed cost per row block shows. 256 MiB lies between; world 4 may move it.
GEMM_RS_THRESHOLD_BYTES = 256 * 1024 * 1024


class _Library:
    """Library programs compiled on first use, once per (name, dtype): bf16 as declared, other dtypes
    through dtype_override; `options` go to `tiledsl.compile`."""

    def __init__(self, heap, options: dict):
        self.heap = heap
        self.options = options
        self._programs: dict[tuple[str, torch.dtype], object] = {}

    def get(self, name: str, dtype: torch.dtype, **defaults):
        key = (name, dtype)
        if key not in self._programs:
            override = {} if dtype == DECLARED_DTYPE else {str(DECLARED_DTYPE).removeprefix("torch."): dtype}
            self._programs[key] = tiledsl.compile(library_program(name), self.heap, dtype_override=override,
                                                  **{**defaults, **self.options})
        return self._programs[key]

    def check(self) -> None:
        """Raise ScheduleTimeout if a call made with check=False gave up waiting."""
        for program in self._programs.values():
            program.check()


class AllReduce:
    """Sum a tensor over the ranks of `heap`, in place: `AllReduce(heap)(x)` returns x.

    The algorithm is chosen by message size (`threshold_bytes`; by default DEFAULT_THRESHOLD_BYTES,
    or never two-shot at world 2, where it reads no fewer bytes than one-shot), or forced per call with
    `algorithm="one_shot" | "two_shot"`; the choice made is kept in `last_algorithm`. Each program is
    compiled on first use, once per dtype (bf16 as declared; fp32 and others by dtype override).
    `options` go to `tiledsl.compile` (`emulated=True`, `wait_timeout_s=...`, consts such as BLOCK)."""

    def __init__(self, heap, threshold_bytes: float | None = None, **options):
        self.heap = heap
        world = heap.world if heap is not None else 1
        if threshold_bytes is None:
            threshold_bytes = float("inf") if world <= 2 else DEFAULT_THRESHOLD_BYTES
        self.threshold_bytes = threshold_bytes
        self.last_algorithm: str | None = None
        self._library = _Library(heap, options)

    def choose(self, x: torch.Tensor) -> str:
        """The algorithm a call on x uses when none is given."""
        return "one_shot" if x.numel() * x.element_size() < self.threshold_bytes else "two_shot"

    def program(self, algorithm: str, dtype: torch.dtype = DECLARED_DTYPE):
        """The compiled program for one algorithm and dtype (compiled on first use)."""
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; choose from {', '.join(ALGORITHMS)}")
        return self._library.get(ALGORITHMS[algorithm], dtype, **ALGORITHM_OPTIONS[algorithm])

    def __call__(self, x: torch.Tensor, algorithm: str | None = None, check: bool = True,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """x summed over the ranks: in place, or into `out` (one-shot, `allreduce_out.tds`). An x
        allocated with `tiledsl.empty` on this heap is then read where it is, with no copy into the heap:
        the lowest latency and the most bandwidth (the kernel is the whole call)."""
        if not x.is_contiguous():
            raise ValueError("AllReduce works on a contiguous tensor (call .contiguous() first)")
        if out is not None:
            program = self._library.get(OUT_OF_PLACE, x.dtype, **ALGORITHM_OPTIONS["one_shot"])
            self.last_algorithm = "one_shot_out"
            program(x.view(-1), out.view(-1), check=check)
            return out
        algorithm = self.choose(x) if algorithm is None else algorithm
        program = self.program(algorithm, x.dtype)
        self.last_algorithm = algorithm
        program(x.view(-1), check=check)
        return x

    def check(self) -> None:
        """Raise ScheduleTimeout if a call made with check=False gave up waiting."""
        self._library.check()


class GemmReduceScatter:
    """C = this rank's row block of the sum over ranks of A @ B, where A (M x k) and B (k x N) hold
    this rank's shard of the reduction dimension and C is M/world x N, as a row-parallel layer needs:
    `GemmReduceScatter(heap)(A, B, C)` returns C.

    The program is chosen by the size of one rank's whole product, M x N (`threshold_bytes`, by default
    GEMM_RS_THRESHOLD_BYTES): `pull` below it, `copy_engine` from it; or forced per call with
    `program="pull" | "copy_engine"`. The choice made is kept in `last_program`. `options` go to
    `tiledsl.compile` (`emulated=True`, `wait_timeout_s=...`, consts such as BM)."""

    def __init__(self, heap, threshold_bytes: float = GEMM_RS_THRESHOLD_BYTES, **options):
        self.threshold_bytes = threshold_bytes
        self.last_program: str | None = None
        self._library = _Library(heap, options)

    def choose(self, A: torch.Tensor, B: torch.Tensor) -> str:
        """The program a call on A and B uses when none is given."""
        return "pull" if A.shape[0] * B.shape[-1] * A.element_size() < self.threshold_bytes else "copy_engine"

    def program(self, name: str, dtype: torch.dtype = DECLARED_DTYPE):
        """The compiled program for one choice and dtype (compiled on first use)."""
        if name not in GEMM_RS_PROGRAMS:
            raise ValueError(f"unknown GEMM+ReduceScatter program {name!r}; choose from {', '.join(GEMM_RS_PROGRAMS)}")
        return self._library.get(GEMM_RS_PROGRAMS[name], dtype)

    def __call__(self, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, program: str | None = None,
                 check: bool = True) -> torch.Tensor:
        name = self.choose(A, B) if program is None else program
        compiled = self.program(name, A.dtype)
        self.last_program = name
        compiled(A, B, C, check=check)
        return C

    def check(self) -> None:
        """Raise ScheduleTimeout if a call made with check=False gave up waiting."""
        self._library.check()
