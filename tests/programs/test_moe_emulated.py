"""The four MoE programs on emulated ranks against their expectations written directly in torch
(moe_expectations.py), at worlds 2, 3 and 4, on routings that stress the data dependence: uniform,
skewed (one expert in every token's top-k), experts that receive no token, a rank whose tokens all stay
on it (it sends nothing to any other rank), top-k of 1, 2 and 8, token counts and widths no tile
divides, and a count above capacity, which must end in CapacityExceeded naming the rank and the expert.

Every case calls its program twice on the same tensors, with a fresh routing and fresh inputs each
time and the outputs poisoned (NaN, or the most negative integer) before each call; both calls are
checked. Outputs declared `upto count` are compared below the counts only (the rest is unspecified).
Starting ranks costs seconds, so each world runs every case in one set of rank processes."""
from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

import moe_expectations as expect  # tests/programs/ is on sys.path, as pytest imports this file

pytestmark = pytest.mark.emulated

PROGRAMS = Path(__file__).resolve().parents[2] / "programs"
EXPERIMENTS = Path(__file__).resolve().parents[2] / "bench" / "experiments"
# one pass a direction (bench/experiments/): the same contract as the library program they stand for
VARIANTS = {"moe_dispatch_direct": "moe_dispatch", "moe_combine_direct": "moe_combine"}
MOE_PROGRAMS = ("moe_dispatch", "moe_dispatch_fp8", "moe_combine", "ag_group_gemm", "moe_gemm_rs")
EMULATED = {"bfloat16": torch.float32}  # the interpreter computes bf16 `tl.dot` wrongly
TOLERANCE = 1e-5  # float32 against float64, relative to the output's largest magnitude
CALLS = 2
WORLDS = (2, 3, 4)
# small tiles: several instances along every index at these sizes (BK's choices are 64 and 128)
# BR = BT: the ids are numbered by several route tiles, each after counting the ids before its rows
EP_TILES = {"BT": 8, "BH": 8, "BR": 8}
FP8_TILES = {"BT": 8, "QG": 8, "BR": 8}  # QG: values a scale covers (128 on the GPU)
GEMM_TILES = {"BM": 16, "BN": 16, "BT": 8, "BR": 8}
DIRECT_TILES = {"BR": 4, "BH": 8, "BC": 4}  # BC: rows a gathering tile copies (several below C = 20)


@dataclass(frozen=True)
class Case:
    program: str
    label: str
    params: dict            # the program's params (the same at every world)
    routing: str            # a function of ROUTINGS
    worlds: tuple[int, ...]
    error: str | None = None  # the DataError every call must end in, where one is expected

    @property
    def kind(self) -> str:
        """The library program whose contract (inputs, outputs, expectation) this program keeps."""
        return VARIANTS.get(self.program, self.program)

    @property
    def consts(self) -> dict:
        if self.program == "moe_dispatch_direct":
            return DIRECT_TILES
        if self.program == "group_gemm":
            return {n: GEMM_TILES[n] for n in ("BM", "BN")}
        if self.program == "group_gemm_fp8":
            return {"BM": GEMM_TILES["BM"], "BN": GEMM_TILES["BN"], "QG": FP8_TILES["QG"]}
        if self.program == "moe_dispatch_fp8":
            return FP8_TILES
        return EP_TILES if self.kind in ("moe_dispatch", "moe_combine") else GEMM_TILES

    @property
    def name(self) -> str:
        return f"{self.program}-{self.label}"


# ---- routings: each rank's top-k expert ids ------------------------------------------------------

def _distinct(rows: int, k: int, choices: torch.Tensor, generator) -> torch.Tensor:
    """`rows` rows of k distinct ids drawn from `choices`."""
    order = torch.rand(rows, len(choices), generator=generator).argsort(dim=1)[:, :k]
    return choices[order]


def uniform(rank, world, T, K, experts, local, generator):
    return _distinct(T, K, torch.arange(experts), generator)


def skewed(rank, world, T, K, experts, local, generator):
    """Expert 0 in every token's top-k: it takes T rows from every rank."""
    others = _distinct(T, K - 1, torch.arange(1, experts), generator)
    return torch.cat([torch.zeros(T, 1, dtype=torch.long), others], dim=1)


def even_only(rank, world, T, K, experts, local, generator):
    """Only even experts: every odd one (and a rank's share of them) receives no token."""
    return _distinct(T, K, torch.arange(0, experts, 2), generator)


def stay_home(rank, world, T, K, experts, local, generator):
    """Rank 0's tokens choose only rank 0's experts (it sends nothing to another rank); the rest uniform."""
    return _distinct(T, K, torch.arange(local if rank == 0 else experts), generator)


ROUTINGS = {f.__name__: f for f in (uniform, skewed, even_only, stay_home)}

# Every program at every world, every routing at two worlds or more; the rest at world 2 only (each
# case at world 4 costs about ten seconds of the interpreter on two cores).
ALL, TWO_THREE, TWO_FOUR, TWO = (2, 3, 4), (2, 3), (2, 4), (2,)
CASES = [
    # expert parallelism: E experts a rank, E * world in all; T = 10 against BT = 8, H = 12 against BH = 8
    Case("moe_dispatch", "uniform-top2", dict(T=10, H=12, K=2, E=2, C=20), "uniform", ALL),
    Case("moe_dispatch", "skewed", dict(T=10, H=12, K=2, E=2, C=10), "skewed", TWO_THREE),
    Case("moe_dispatch", "idle-experts-top1", dict(T=9, H=8, K=1, E=3, C=9), "even_only", TWO_FOUR),
    Case("moe_dispatch", "rank0-sends-nothing", dict(T=10, H=8, K=2, E=2, C=20), "stay_home", ALL),
    Case("moe_dispatch", "top8", dict(T=5, H=8, K=8, E=4, C=5), "uniform", TWO_FOUR),
    Case("moe_dispatch", "over-capacity", dict(T=10, H=8, K=2, E=2, C=6), "skewed", ALL, "CapacityExceeded"),
    # fp8 on the wire: H = 16 and 24 are 2 and 3 groups of QG = 8 values, each with its own scale
    Case("moe_dispatch_fp8", "uniform-top2", dict(T=10, H=16, K=2, E=2, C=20), "uniform", ALL),
    Case("moe_dispatch_fp8", "skewed-top8", dict(T=5, H=24, K=8, E=4, C=5), "skewed", TWO_THREE),
    Case("moe_dispatch_fp8", "rank0-sends-nothing-top1", dict(T=9, H=8, K=1, E=3, C=9), "stay_home", TWO_FOUR),
    Case("moe_dispatch_fp8", "idle-experts", dict(T=10, H=16, K=2, E=2, C=20), "even_only", TWO),
    Case("moe_dispatch_fp8", "over-capacity", dict(T=10, H=8, K=2, E=2, C=6), "skewed", TWO, "CapacityExceeded"),
    Case("moe_combine", "uniform-top2", dict(T=10, H=12, K=2, E=2, C=20), "uniform", ALL),
    Case("moe_combine", "skewed", dict(T=10, H=12, K=2, E=2, C=10), "skewed", TWO_FOUR),
    Case("moe_combine", "rank0-sends-nothing-top1", dict(T=9, H=8, K=1, E=3, C=9), "stay_home", TWO_THREE),
    Case("moe_combine", "top8-idle-experts", dict(T=5, H=8, K=8, E=8, C=5), "even_only", TWO),
    Case("moe_combine", "over-capacity", dict(T=10, H=8, K=2, E=2, C=6), "skewed", TWO, "CapacityExceeded"),
    # one pass a direction, at world 1 too (peers' inputs read where the caller has them)
    Case("moe_dispatch_direct", "uniform-top2", dict(T=10, H=12, K=2, E=2, C=20), "uniform", (1, 2, 4)),
    Case("moe_dispatch_direct", "skewed-top8", dict(T=5, H=8, K=8, E=4, C=5), "skewed", TWO),
    Case("moe_dispatch_direct", "rank0-sends-nothing", dict(T=10, H=8, K=2, E=2, C=20), "stay_home", TWO),
    Case("moe_dispatch_direct", "over-capacity", dict(T=10, H=8, K=2, E=2, C=6), "skewed", TWO, "CapacityExceeded"),
    Case("moe_combine_direct", "uniform-top2", dict(T=10, H=12, K=2, E=2, C=20), "uniform", (1, 2, 4)),
    Case("moe_combine_direct", "skewed", dict(T=10, H=12, K=2, E=2, C=10), "skewed", TWO),
    Case("moe_combine_direct", "over-capacity", dict(T=10, H=8, K=2, E=2, C=6), "skewed", TWO, "CapacityExceeded"),
    # tensor parallelism: E experts on every rank; D, N and I multiples of 8 (TMA rows of 16 bytes)
    Case("ag_group_gemm", "uniform-top2", dict(T=10, D=16, N=24, K=2, E=3, C=20), "uniform", ALL),
    Case("ag_group_gemm", "skewed", dict(T=10, D=16, N=24, K=2, E=3, C=10), "skewed", TWO_THREE),
    Case("ag_group_gemm", "idle-experts-top1", dict(T=9, D=8, N=16, K=1, E=4, C=9), "even_only", TWO_FOUR),
    Case("ag_group_gemm", "top8", dict(T=5, D=8, N=16, K=8, E=8, C=5), "uniform", TWO),
    Case("ag_group_gemm", "over-capacity", dict(T=10, D=8, N=16, K=2, E=3, C=6), "skewed", TWO_THREE,
         "CapacityExceeded"),
    Case("moe_gemm_rs", "uniform-top2", dict(T=10, I=16, N=24, K=2, E=3, C=20), "uniform", ALL),
    Case("moe_gemm_rs", "skewed-top1", dict(T=9, I=8, N=16, K=1, E=3, C=9), "skewed", TWO_THREE),
    Case("moe_gemm_rs", "top8-idle-experts", dict(T=5, I=8, N=16, K=8, E=16, C=5), "even_only", TWO_FOUR),
    # the grouped GEMM alone: counts given on the device, one of them 0, none a multiple of BM = 16
    Case("group_gemm", "ragged-counts", dict(D=16, N=24, E=4, C=37), "uniform", TWO),
    Case("group_gemm", "over-capacity", dict(D=8, N=16, E=3, C=9), "uniform", TWO, "CapacityExceeded"),
    # on fp8 rows (moe_dispatch_fp8's output): D = 24 is 3 groups of QG = 8, each with its own scales
    Case("group_gemm_fp8", "ragged-counts", dict(D=24, N=24, E=4, C=37), "uniform", TWO),
    Case("group_gemm_fp8", "over-capacity", dict(D=8, N=16, E=3, C=9), "uniform", TWO, "CapacityExceeded"),
]
# inputs the programs take in a dtype numpy lacks: sent as float32 (exact), stored in that dtype
INPUT_DTYPES = {("group_gemm_fp8", "P"): torch.float8_e4m3fn}
RUNS = [(case, world) for case in CASES for world in case.worlds]


def _counts(case: Case, generator: torch.Generator) -> torch.Tensor:
    """group_gemm's counts: random below capacity, expert 1's 0; over capacity, expert 0's C + 3."""
    p = case.params
    count = torch.randint(1, p["C"] + 1, (p["E"],), generator=generator)
    count[1] = 0
    if case.error:
        count[0] = p["C"] + 3
    return count.to(torch.int32)


def _experts(case: Case, world: int) -> tuple[int, int]:
    """(experts the ids range over, experts a rank holds)."""
    E = case.params["E"]
    return (E * world, E) if case.kind in ("moe_dispatch", "moe_dispatch_fp8", "moe_combine") else (E, E)


def _inputs(case: Case, world: int, generator: torch.Generator) -> list[dict]:
    """Every rank's inputs for one call: a fresh routing and fresh values."""
    p = case.params
    experts, local = _experts(case, world)
    out = []
    for rank in range(world):
        if case.program == "group_gemm":
            randn = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
            out.append({"count": _counts(case, generator), "P": randn(p["E"], p["C"], p["D"]),
                        "B": randn(p["E"], p["D"], p["N"])})
            continue
        if case.program == "group_gemm_fp8":
            randn = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
            groups = p["D"] // FP8_TILES["QG"]
            out.append({"count": _counts(case, generator),
                        # e4m3 values (torch's cast makes NaN of anything past 448)
                        "P": (randn(p["E"], p["C"], p["D"]) * 100).clamp(-448, 448).to(torch.float8_e4m3fn).float(),
                        "S": torch.rand(p["E"], p["C"], groups, generator=generator) / 50 + 1e-3,
                        "B": randn(p["E"], p["D"], p["N"])})
            continue
        ids = ROUTINGS[case.routing](rank, world, p["T"], p["K"], experts, local, generator).to(torch.int32)
        randn = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
        tensors = {
            "moe_dispatch": lambda: {"X": randn(p["T"], p["H"]), "ids": ids},
            # magnitudes over 8 binades: every group's values fill e4m3's range differently
            "moe_dispatch_fp8": lambda: {"X": randn(p["T"], p["H"]) * 2.0 ** (8 * torch.rand(p["T"], p["H"],
                                                                                            generator=generator) - 4),
                                         "ids": ids},
            "moe_combine": lambda: {"Y": randn(p["E"], world, p["C"], p["H"]), "ids": ids, "w": randn(p["T"], p["K"])},
            "ag_group_gemm": lambda: {"A": randn(p["T"], p["D"]), "ids": ids, "B": randn(p["E"], p["D"], p["N"])},
            "moe_gemm_rs": lambda: {"Hx": randn(world, p["E"], p["C"], p["I"]), "ids": ids,
                                    "w": randn(p["T"], p["K"]), "B": randn(p["E"], p["I"], p["N"])},
        }[case.kind]()
        out.append(tensors)
    return out


def _expected(case: Case, inputs: list[dict]) -> list[dict]:
    """Every rank's expected outputs, from every rank's inputs."""
    p = case.params
    lists = {n: [mine[n] for mine in inputs] for n in inputs[0]}
    outputs = {
        "moe_dispatch": lambda: expect.moe_dispatch(lists["X"], lists["ids"], p["E"], p["C"]),
        "moe_dispatch_fp8": lambda: expect.moe_dispatch_fp8(lists["X"], lists["ids"], p["E"], p["C"],
                                                            FP8_TILES["QG"]),
        "moe_combine": lambda: expect.moe_combine(lists["Y"], lists["ids"], lists["w"], p["E"]),
        "ag_group_gemm": lambda: expect.ag_group_gemm(lists["A"], lists["ids"], lists["B"], p["C"]),
        "moe_gemm_rs": lambda: expect.moe_gemm_rs(lists["Hx"], lists["ids"], lists["w"], lists["B"]),
        "group_gemm": lambda: expect.group_gemm(lists["count"], lists["P"], lists["B"]),
        "group_gemm_fp8": lambda: expect.group_gemm_fp8(lists["count"], lists["P"], lists["S"], lists["B"],
                                                        FP8_TILES["QG"]),
    }[case.kind]()
    return [{n: values[rank] for n, values in outputs.items()} for rank in range(len(inputs))]


def _out_shapes(case: Case, world: int) -> dict:
    p = case.params
    return {
        "moe_dispatch": lambda: {"recv": ((p["E"], world, p["C"], p["H"]), torch.float32),
                                 "count": ((p["E"], world), torch.int32), "slot": ((p["T"], p["K"]), torch.int32)},
        "moe_dispatch_fp8": lambda: {"recv": ((p["E"], world, p["C"], p["H"]), torch.float8_e4m3fn),
                                     "rscale": ((p["E"], world, p["C"], p["H"] // FP8_TILES["QG"]), torch.float32),
                                     "count": ((p["E"], world), torch.int32), "slot": ((p["T"], p["K"]), torch.int32)},
        "moe_combine": lambda: {"out": ((p["T"], p["H"]), torch.float32)},
        "ag_group_gemm": lambda: {"G": ((world, p["E"], p["C"], p["N"]), torch.float32),
                                  "count": ((world, p["E"]), torch.int32)},
        "moe_gemm_rs": lambda: {"Y": ((p["T"], p["N"]), torch.float32)},
        "group_gemm": lambda: {"G": ((p["E"], p["C"], p["N"]), torch.float32)},
        "group_gemm_fp8": lambda: {"G": ((p["E"], p["C"], p["N"]), torch.float32)},
    }[case.kind]()


# ---- the ranks -----------------------------------------------------------------------------------

def _rank(heap, jobs: list) -> list:
    """One emulated rank: every case in turn, each program compiled once per set of consts. A call
    that raises a DataError (a count above capacity) gives its kind and message instead of outputs."""
    import tiledsl
    from tiledsl.runtime.launch import DataError
    from tiledsl.tools.run_program import as_numpy
    programs, results = {}, []
    for name, consts, calls, outs in jobs:
        key = (name, tuple(sorted(consts.items())))
        if key not in programs:
            source = EXPERIMENTS / f"{name}.tds" if name in VARIANTS else PROGRAMS / f"{name}.tds"
            programs[key] = tiledsl.compile(os.fspath(source), heap, emulated=True,
                                            dtype_override=EMULATED, wait_timeout_s=20.0, **consts)
        program = programs[key]
        mine = calls[0][heap.rank]
        tensors = {n: torch.empty(t.shape, dtype=INPUT_DTYPES.get((name, n), torch.from_numpy(t).dtype))
                   for n, t in mine.items()}
        tensors |= {n: torch.empty(shape, dtype=dtype) for n, (shape, dtype) in outs.items()}
        per_call = []
        for call in calls:
            for n, t in call[heap.rank].items():
                tensors[n].copy_(torch.from_numpy(t))
            for n, (_, dtype) in outs.items():  # poison: an element no instance writes shows up
                tensors[n].fill_(float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min)
            try:
                program(**tensors)
                per_call.append({n: as_numpy(tensors[n]) for n in outs})
            except DataError as error:
                per_call.append((type(error).__name__, str(error)))
        results.append(per_call)
    heap.close()
    return results


@dataclass
class Run:
    case: Case
    world: int
    inputs: list   # [call][rank] -> {tensor: value}
    expected: list  # [call][rank] -> {tensor: value}, or None where an error is expected
    got: list | None = None  # [rank][call] -> {tensor: numpy array} or (error kind, message)

    @classmethod
    def prepare(cls, case: Case, world: int) -> "Run":
        generator = torch.Generator().manual_seed(zlib.crc32(f"{case.name} {world}".encode()))
        inputs = [_inputs(case, world, generator) for _ in range(CALLS)]
        expected = [None if case.error else _expected(case, call) for call in inputs]
        return cls(case, world, inputs, expected)

    def job(self) -> tuple:
        """`_rank`'s share of work for this run. Inputs travel as numpy arrays, by value: torch tensors
        would each take a file descriptor to the rank processes, hundreds of them for a world."""
        calls = [[{n: t.numpy() for n, t in mine.items()} for mine in call] for call in self.inputs]
        return self.case.program, dict(self.case.consts), calls, _out_shapes(self.case, self.world)


@pytest.fixture(scope="module")
def emulated():
    """world -> every case's Run at that world, run together in one set of rank processes."""
    from tiledsl.runtime.emulate import run_ranks
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    done: dict[int, list[Run]] = {}

    def result(world: int) -> dict:
        if world not in done:
            runs = [Run.prepare(case, world) for case in CASES if world in case.worlds]
            per_rank = run_ranks(_rank, world, [run.job() for run in runs], timeout_s=900.0)
            for n, run in enumerate(runs):
                run.got = [mine[n] for mine in per_rank]
            done[world] = runs
        return {run.case.name: run for run in done[world]}
    yield result
    torch.set_num_threads(threads)


# ---- checks --------------------------------------------------------------------------------------

def _valid(shape, count: torch.Tensor) -> torch.Tensor:
    """Where a tensor declared `upto count` is valid: along the dimension after count's, below count."""
    prefix = count.dim()
    along = torch.arange(shape[prefix]).view(*([1] * prefix), -1, *([1] * (len(shape) - prefix - 1)))
    return along < count.view(*count.shape, *([1] * (len(shape) - prefix)))


# outputs compared below their counts only (group_gemm's count is an input, given back as an expected value)
UPTO = {"recv": "count", "rscale": "count", "G": "count"}


def assert_matches(got: np.ndarray, want: torch.Tensor, expected: dict, name: str, what: str) -> None:
    got = torch.from_numpy(got).double()
    want = want.double()
    assert got.shape == want.shape, f"{what}: shape {list(got.shape)}, expected {list(want.shape)}"
    if name in UPTO:
        valid = _valid(want.shape, expected[UPTO[name]]).expand(want.shape)
        got, want = got[valid], want[valid]
    unwritten = int((~torch.isfinite(got)).sum()) + int((got == torch.iinfo(torch.int32).min).sum())
    assert unwritten == 0, f"{what}: {unwritten} of {got.numel()} elements never written"
    scale = want.abs().max().item() if want.numel() else 1.0
    error = (got - want).abs().max().item() / (scale or 1.0) if want.numel() else 0.0
    assert error <= TOLERANCE, f"{what}: max error {error:.2e} of scale {scale:.3g}"


def test_every_moe_program_has_cases_at_worlds_2_3_and_4_and_the_brief_routings():
    for world in WORLDS:
        assert {case.program for case in CASES if world in case.worlds} >= set(MOE_PROGRAMS)
        assert any(case.error == "CapacityExceeded" for case in CASES if world in case.worlds)
    for routing in ROUTINGS:
        assert len({w for case in CASES if case.routing == routing for w in case.worlds}) >= 2
    assert {p for p in MOE_PROGRAMS} <= {p.stem for p in PROGRAMS.glob("*.tds")}
    assert {case.params["K"] for case in CASES if "K" in case.params} >= {1, 2, 8}
    assert set(ROUTINGS) == {case.routing for case in CASES}
    assert {case.program for case in CASES if case.error == "CapacityExceeded"} >= {"moe_dispatch", "ag_group_gemm",
                                                                                    "group_gemm"}


@pytest.mark.parametrize("case, world", RUNS, ids=[f"{case.name}-world{world}" for case, world in RUNS])
def test_moe_program_matches_torch_on_emulated_ranks(emulated, case, world):
    run = emulated(world)[case.name]
    for call in range(CALLS):
        for rank in range(world):
            got = run.got[rank][call]
            where = f"{case.name} on rank {rank}, call {call}, world {world}, {case.params}"
            if case.error:
                continue  # test_over_capacity_raises_capacity_exceeded checks these
            assert not isinstance(got, tuple), f"{where}: {got[0]}: {got[1]}"
            for name, want in run.expected[call][rank].items():
                if name in got:
                    assert_matches(got[name], want, run.expected[call][rank], name, f"{where}: {name}")


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"world{w}")
def test_over_capacity_raises_capacity_exceeded_naming_rank_and_expert(emulated, world):
    """Expert 0 takes a row from every token of every rank, more than C: every rank's call raises
    CapacityExceeded, naming the rank and the count of expert 0 (sent[0] where it sends, got[0, s] or
    count[...] where it receives), never a silent overflow or a hang."""
    runs = [run for run in emulated(world).values() if run.case.error]
    assert runs
    for run in runs:
        for call in range(CALLS):
            raised = [run.got[rank][call] for rank in range(world)]
            assert any(isinstance(r, tuple) for r in raised), f"{run.case.name}: no rank raised"
            for rank, outcome in enumerate(raised):
                if not isinstance(outcome, tuple):
                    continue  # a rank that neither sends to nor holds expert 0 may see nothing wrong
                kind, message = outcome
                assert kind == run.case.error, message
                assert message.startswith(f"rank {rank}: "), message
                element = re.search(r": (sent\[0\]|got\[0, \d\]|count\[(\d, )?0\]) = (\d+) is above its cap (\d+)",
                                    message)
                assert element, message
                assert int(element[3]) > int(element[4]) == run.case.params["C"], message
