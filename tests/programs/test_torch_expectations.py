"""Every program in programs/ on emulated ranks against its expectation written directly in torch
(expectations.py), not against tiledsl's reference: the reference reads the same IR as code
generation, so a parser or schedule mistake would show in both and agree with itself.

Every program runs at worlds 2 and 3, most at 4 too (CASES), all of one world in one set of rank
processes. Each case calls its program twice on the same tensors, refilled with fresh random
inputs and NaN outputs before each call, and both calls are checked. Sizes are ragged where the
launch conditions allow: no tile divides them, so last tiles are cut short."""
from __future__ import annotations

import dataclasses
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from expectations import EXPECTATIONS  # tests/programs/ is on sys.path, as pytest imports this file
# The attention programs need inputs of their own (one query on every rank, lengths) and a bf16-sized
# tolerance (their kernels round probabilities to bf16): they run against their expectations there.
from test_attention_emulated import RUNS as ATTENTION_RUNS

pytestmark = pytest.mark.emulated

PROGRAMS = Path(__file__).resolve().parents[2] / "programs"
# The interpreter computes bf16 `tl.dot` wrongly, so bf16 programs run as float32 (keyed by the
# .tds dtype's torch name: a torch.dtype key would be ignored).
EMULATED = {"bfloat16": torch.float32}
# float32 against float64, relative to the output's largest magnitude: the sums here round to at most
# 4e-7 (K = 200); bf16 rounding anywhere would show as 4e-3.
TOLERANCE = 1e-5
# Both calls on the same tensors: the second finds the call prepared and uses the other staging copy.
CALLS = 2


@dataclass(frozen=True)
class Case:
    worlds: tuple[int, ...]
    params: Callable[[int], dict]  # the program's params at a world
    consts: dict = field(default_factory=dict)  # overrides of consts and tunables


# Each program's in and inout tensors, shaped from the world and the params.
INPUTS = {
    "copy": lambda w, N: {"X": (N,)},
    "gemm": lambda w, M, K, N: {"A": (M, K), "B": (K, N)},
    "allgather": lambda w, M, N: {"X": (M // w, N)},
    "reduce_scatter": lambda w, M, N: {"X": (M, N)},
    "allreduce": lambda w, N: {"X": (N,)},
    "allreduce_two_shot": lambda w, N: {"X": (N,)},
    "allreduce_out": lambda w, N: {"X": (N,)},
    "ag_gemm": lambda w, M, K, N: {"A": (M // w, K), "B": (K, N)},
    "ag_gemm_push": lambda w, M, K, N: {"A": (M // w, K), "B": (K, N)},
    "gemm_rs": lambda w, M, K, N: {"A": (M, K), "B": (K, N)},
    "gemm_rs_ce": lambda w, M, K, N: {"A": (M, K), "B": (K, N)},
    "gemm_rs_pull": lambda w, M, K, N: {"A": (M, K), "B": (K, N)},
    "gemm_rs_push": lambda w, M, K, N: {"A": (M, K), "B": (K, N)},
    "gemm_ar": lambda w, M, K, N: {"A": (M, K), "B": (K, N)},
    "allreduce_rmsnorm": lambda w, T, D: {"X": (T, D), "R": (T, D), "W": (D,)},
    "hier_allgather": lambda w, M, N: {"X": (M // w, N)},
    "hier_reduce_scatter": lambda w, M, N: {"X": (M, N)},
    "hier_allreduce": lambda w, N: {"X": (N,)},
    "hier_ag_gemm": lambda w, M, K, N: {"A": (M // w, K), "B": (K, N)},
    "hier_gemm_rs": lambda w, M, K, N: {"A": (M, K), "B": (K, N)},
    "ring_allgather": lambda w, M, N: {"X": (M // w, N)},
    "ring_reduce_scatter": lambda w, M, N: {"X": (M, N)},
    "reduce_root": lambda w, N: {"X": (N,)},
    "chain_broadcast": lambda w, N: {"X": (N,)},
}

# The interpreter runs a tile in tens of milliseconds and ranks beyond two share the cores (a waiting rank
# spins), so the programs' own GEMM tiles run at world 2 only, and smaller ones (two row tiles to a rank's
# rows, two column tiles) at every world. K and N are multiples of 8: TMA needs 16-byte rows in bf16.
SMALL_TILES = {"BM": 16, "BN": 32}
# Ms % BM == 0 is a launch condition of the GEMMs that split M by rank: there N and K are ragged.
ROWS_IN_WHOLE_TILES = [Case((2,), lambda w: {"M": w * 128, "K": 104, "N": 296}),
                       Case((2, 3, 4), lambda w: {"M": w * 32, "K": 104, "N": 40}, SMALL_TILES)]
REDUCE_SCATTER = [ROWS_IN_WHOLE_TILES[0],
                  Case((2, 3, 4), lambda w: {"M": w * 32, "K": 104, "N": 40}, {**SMALL_TILES, "BR": 16})]
# Each world's programs run in one set of ranks, and four ranks spinning on CI's two cores made world 4 the
# slowest set (176 s, 2026-12-03): the variants of ag_gemm and gemm_rs (push, pull, copy engine, all-reduce,
# two-level on one node) run at worlds 2 and 3 here; ag_gemm and gemm_rs themselves at 2, 3 and 4; every
# one at worlds 2, 4 and 8 on the GPU (tests/gpu/multigpu_checks.py)
AT_2_AND_3 = {"worlds": (2, 3)}
ROWS_IN_WHOLE_TILES_2_3 = [ROWS_IN_WHOLE_TILES[0], dataclasses.replace(ROWS_IN_WHOLE_TILES[1], **AT_2_AND_3)]
REDUCE_SCATTER_2_3 = [REDUCE_SCATTER[0], dataclasses.replace(REDUCE_SCATTER[1], **AT_2_AND_3)]

CASES = {
    # no communication: the world changes nothing
    "copy": [Case((2,), lambda w: {"N": 2500})],
    "gemm": [Case((2,), lambda w: {"M": 200, "K": 104, "N": 296}),
             Case((2,), lambda w: {"M": 40, "K": 104, "N": 40}, SMALL_TILES)],
    "allgather": [Case((2, 3, 4), lambda w: {"M": w * 37, "N": 45})],
    "reduce_scatter": [Case((2, 3, 4), lambda w: {"M": w * 45, "N": 300})],
    "allreduce": [Case((2, 3, 4), lambda w: {"N": 5000}),
                  Case((2, 3, 4), lambda w: {"N": 1001}, {"BLOCK": 256})],
    "allreduce_out": [Case((2, 3, 4), lambda w: {"N": 5001}, {"BLOCK": 1024})],
    # N = 20000 at world 4: slices of 8192, the last rank's lies wholly past the end
    "allreduce_two_shot": [Case((2, 3, 4), lambda w: {"N": 20000}),
                           Case((2, 3, 4), lambda w: {"N": 3001}, {"BLOCK": 256})],
    "ag_gemm": ROWS_IN_WHOLE_TILES,
    "ag_gemm_push": ROWS_IN_WHOLE_TILES_2_3,
    "gemm_rs": REDUCE_SCATTER,
    "gemm_rs_ce": REDUCE_SCATTER_2_3,
    "gemm_rs_pull": REDUCE_SCATTER_2_3,
    "gemm_rs_push": REDUCE_SCATTER_2_3,
    "gemm_ar": [Case((2,), lambda w: {"M": 3, "K": 200, "N": 296}),
                Case((2, 3), lambda w: {"M": 20, "K": 104, "N": 40}, SMALL_TILES)],
    "allreduce_rmsnorm": [Case((2, 3, 4), lambda w: {"T": 3, "D": 100}),
                          Case((2, 3, 4), lambda w: {"T": 5, "D": 33}, {"BT": 2})],
    # the two-level programs on one node here (several nodes: test_nodes_emulated.py), small tiles only
    "hier_allgather": [Case((2, 3, 4), lambda w: {"M": w * 37, "N": 45})],
    "hier_reduce_scatter": [Case((2, 3, 4), lambda w: {"M": w * 45, "N": 300})],
    "hier_allreduce": [Case((2, 3, 4), lambda w: {"N": 3001}, {"BLOCK": 256})],
    "hier_ag_gemm": [ROWS_IN_WHOLE_TILES_2_3[1]],
    "hier_gemm_rs": [REDUCE_SCATTER_2_3[1]],
    # rows no tile divides (45 a rank against BM = 32), ragged columns; ring_reduce_scatter has no step at world 2
    "ring_allgather": [Case((2, 3, 4), lambda w: {"M": w * 37, "N": 45}, {"PIECES": 2})],
    "ring_reduce_scatter": [Case((2, 3, 4), lambda w: {"M": w * 45, "N": 300})],
    # families on some ranks only (`if rank == 0`), a last block cut short
    "reduce_root": [Case((2, 3, 4), lambda w: {"N": 1001}, {"BLOCK": 256})],
    "chain_broadcast": [Case((2, 3, 4), lambda w: {"N": 1001}, {"BLOCK": 256})],
}
RUNS = sorted({(name, world) for name, cases in CASES.items() for case in cases for world in case.worlds})


def _program(heap, name: str, consts: list[dict], inputs: list, out_shapes: list, outputs: list) -> list:
    """Each case of one program on this rank, CALLS calls each: every call's out and inout tensors, as
    numpy. `out_shapes[case][rank]` shapes the out tensors, which no input gives."""
    import tiledsl
    results = []
    for overrides, calls, shapes in zip(consts, inputs, out_shapes, strict=True):
        program = tiledsl.compile(os.fspath(PROGRAMS / f"{name}.tds"), heap, emulated=True,
                                  dtype_override=EMULATED, wait_timeout_s=20.0, **overrides)
        mine, outs = calls[0][heap.rank], shapes[heap.rank]
        tensors = {n: torch.empty(t.shape) for n, t in mine.items()} | {n: torch.empty(s) for n, s in outs.items()}
        per_call = []
        for call in calls:
            for n, t in call[heap.rank].items():
                tensors[n].copy_(torch.from_numpy(t))
            for n in outs:
                tensors[n].fill_(float("nan"))  # an element no tile writes stays NaN
            program(**tensors)
            # numpy arrays travel back by value; torch tensors would be shared through this process's fds
            per_call.append({n: tensors[n].numpy().copy() for n in outputs})
        results.append(per_call)
    return results


def _rank(heap, jobs: list) -> list:
    """One emulated rank: each program of `jobs` in turn, all on one heap."""
    results = [_program(heap, *job) for job in jobs]
    heap.close()
    return results


def _inputs(name: str, world: int, params: dict, generator: torch.Generator) -> list[dict]:
    shapes = INPUTS[name](world, **params)
    return [{n: torch.randn(shape, generator=generator) for n, shape in shapes.items()} for _ in range(world)]


def _expected(name: str, inputs: list[dict]) -> list[dict]:
    """Every rank's expected outputs, from every rank's inputs."""
    outputs = EXPECTATIONS[name](**{n: [mine[n] for mine in inputs] for n in inputs[0]})
    return [{n: values[rank] for n, values in outputs.items()} for rank in range(len(inputs))]


@dataclass
class Run:
    """One program at one world: its cases, every call's inputs and expected outputs, and what ran."""
    name: str
    world: int
    cases: list[Case]
    inputs: list  # [case][call][rank] -> {tensor: value}
    expected: list  # the same indices
    got: list | None = None  # [rank][case][call] -> {tensor: numpy array}
    failure: str | None = None

    @classmethod
    def prepare(cls, name: str, world: int) -> "Run":
        generator = torch.Generator().manual_seed(zlib.crc32(f"{name} {world}".encode()))
        cases = [case for case in CASES[name] if world in case.worlds]
        inputs = [[_inputs(name, world, case.params(world), generator) for _ in range(CALLS)] for case in cases]
        return cls(name, world, cases, inputs, [[_expected(name, call) for call in calls] for calls in inputs])

    def job(self) -> tuple:
        """`_program`'s arguments."""
        # an out tensor a rank does not write (None) has the shape the other ranks' have
        shapes = [{n: tuple(t.shape) for rank in want[0] for n, t in rank.items() if t is not None}
                  for want in self.expected]
        out_shapes = [[{n: shape[n] for n in mine if n not in calls[0][0]} for mine in want[0]]
                      for calls, want, shape in zip(self.inputs, self.expected, shapes, strict=True)]
        outputs = list(self.expected[0][0][0])
        # inputs as numpy, by value: torch tensors would each take a file descriptor to the ranks, and the
        # forkserver passes fewer than 256 (every program of a world goes to one set of ranks)
        inputs = [[[{n: t.numpy() for n, t in mine.items()} for mine in call] for call in calls]
                  for calls in self.inputs]
        return self.name, [case.consts for case in self.cases], inputs, out_shapes, outputs


def run_together(runs: list[Run]) -> None:
    """Every run of one world in one set of rank processes: each process pays once for starting and for
    tiledsl's first compile (about a second each). A rank that raises stops the set; then each run is
    repeated alone, so that the failure is laid at its program's door."""
    from tiledsl.runtime.emulate import run_ranks
    try:
        per_rank = run_ranks(_rank, runs[0].world, [run.job() for run in runs], timeout_s=600.0)
    except RuntimeError as failure:
        if len(runs) == 1:
            runs[0].failure = str(failure)
            return
        for run in runs:
            run_together([run])
        return
    for n, run in enumerate(runs):
        run.got = [mine[n] for mine in per_rank]


@pytest.fixture(scope="module")
def emulated(request):
    """(name, world) -> its Run, done; the first test of a world runs every selected test of that world."""
    # The tensors here are tiny: a second torch thread only adds waiting, seconds of it on busy cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    done: dict[tuple[str, int], Run] = {}

    def result(name: str, world: int) -> Run:
        if (name, world) not in done:
            selected = {tuple(item.callspec.params[k] for k in ("name", "world")) for item in request.session.items
                        if getattr(item, "originalname", None) == "test_program_matches_its_torch_expectation"}
            runs = [Run.prepare(n, w) for n, w in sorted(selected) if w == world and (n, w) not in done]
            run_together(runs)
            done.update({(run.name, world): run for run in runs})
        return done[name, world]
    yield result
    torch.set_num_threads(threads)


def assert_matches(got: np.ndarray, want: torch.Tensor, what: str) -> None:
    """Within TOLERANCE of the output's scale, and finite on both sides: NaN is an element nothing wrote."""
    got = torch.from_numpy(got).double()
    assert got.shape == want.shape, f"{what}: shape {list(got.shape)}, expected {list(want.shape)}"
    assert want.numel() and torch.isfinite(want).all(), f"{what}: the expectation is empty or not finite"
    unwritten = int((~torch.isfinite(got)).sum())
    assert unwritten == 0, f"{what}: {unwritten} of {got.numel()} elements not finite (never written?)"
    scale = want.abs().max().item() or 1.0
    error = (got - want).abs().max().item() / scale
    assert error <= TOLERANCE, f"{what}: max error {error:.2e} of scale {scale:.3g}"


# programs whose inputs are routings: test_moe_emulated.py runs them against moe_expectations.py, on
# routings that stress the data dependence, at worlds 2-4
ROUTED = {"moe_dispatch", "moe_dispatch_fp8", "moe_combine", "ag_group_gemm", "moe_gemm_rs", "group_gemm",
          "group_gemm_fp8"}


LOCAL = {"copy", "gemm"}  # no communication: world 2 only
AT_2_3 = {"ag_gemm_push", "gemm_rs_ce", "gemm_rs_pull", "gemm_rs_push", "gemm_ar", "hier_ag_gemm", "hier_gemm_rs"}


def test_every_program_has_an_expectation_and_runs_at_worlds_2_3_and_4():
    names = {p.stem for p in PROGRAMS.glob("*.tds")} - ROUTED
    attention = {name for name, _ in ATTENTION_RUNS}
    assert not attention & set(CASES)
    assert names == set(EXPECTATIONS) == set(CASES) | attention == set(INPUTS) | attention
    assert LOCAL | AT_2_3 <= names
    worlds = {name: (2,) if name in LOCAL else (2, 3) if name in AT_2_3 else (2, 3, 4) for name in names}
    assert set(RUNS) | set(ATTENTION_RUNS) == {(name, world) for name in names for world in worlds[name]}


@pytest.mark.parametrize("name, world", RUNS, ids=[f"{name}-world{world}" for name, world in RUNS])
def test_program_matches_its_torch_expectation(emulated, name, world):
    run = emulated(name, world)
    assert run.failure is None, run.failure
    for c, case in enumerate(run.cases):
        for call in range(CALLS):
            for rank in range(world):
                for tensor, want in run.expected[c][call][rank].items():
                    where = f"{name} {tensor} on rank {rank}, call {call}, world {world}, {case.params(world)}"
                    got = run.got[rank][c][call][tensor]
                    if want is None:  # not written on this rank: still the NaN it was passed
                        assert np.isnan(got).all(), f"{where}: written, where the program writes nothing"
                        continue
                    assert_matches(got, want, f"{where} {case.consts}")
