"""The collective programs (two-shot AllReduce, GEMM+AllReduce, AllReduce+RMSNorm) and the AllReduce
launcher, run on emulated ranks (Triton's interpreter, one process per rank) against the torch
reference, at world 2 and 4, on sizes that no tile divides. Spawning ranks costs seconds, so each world
runs every case in one set of rank processes, and the tests below read their share of its results."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tiledsl.collectives import DEFAULT_THRESHOLD_BYTES, AllReduce
from tiledsl.tools.reference import Reference
from tiledsl.tools.run_program import EMULATED_DTYPES, TOLERANCE, make_inputs, program_schedule

pytestmark = pytest.mark.emulated

PROGRAMS = Path(__file__).resolve().parents[2] / "programs"
CALLS = 2  # the second call checks that signals count epochs, with no reset in between
# program: (sizes, consts). Small blocks give several blocks a slice; no size is a multiple of a tile.
CASES = {
    "allreduce_two_shot": ({"N": 3001}, {"BLOCK": 256}),
    "gemm_ar": ({"M": 3, "K": 40, "N": 200}, {}),
    "allreduce_rmsnorm": ({"T": 3, "D": 100}, {}),
}
THRESHOLD = 4096  # bytes; the launcher calls below sit on either side of it
# (name, numel or shape, dtype, algorithm forced or None, algorithm expected)
LAUNCHES = [
    ("small picks one-shot", 700, torch.float32, None, "one_shot"),
    ("large picks two-shot", 3001, torch.float32, None, "two_shot"),
    ("large forced one-shot", 3001, torch.float32, "one_shot", "one_shot"),
    ("small forced two-shot", 700, torch.float32, "two_shot", "two_shot"),
    ("2-D bf16 as declared", (30, 50), torch.bfloat16, None, "one_shot"),
]


def _rank(heap, cases: dict, shapes: dict, inputs: dict, launches: list):
    """One emulated rank: every program case, then the AllReduce launcher; numpy arrays back."""
    import tiledsl
    override = {k: getattr(torch, v) for k, v in EMULATED_DTYPES.items()}
    results = {}
    for name, (_, consts) in cases.items():
        program = tiledsl.compile(os.fspath(PROGRAMS / f"{name}.tds"), heap, emulated=True,
                                  dtype_override=override, wait_timeout_s=30.0, **consts)
        mine, outs = inputs[name][heap.rank], shapes[name][heap.rank]
        for _ in range(CALLS):
            # inputs afresh, outputs poisoned: an element no tile writes shows up as NaN
            args = {spec.name: mine[spec.name].clone() if spec.name in mine else
                    torch.full(outs[spec.name], float("nan"), dtype=torch.float32) for spec in program.callers}
            program(**args)
        results[name] = {spec.name: args[spec.name].numpy().copy() for spec in program.callers
                         if spec.role in ("out", "inout")}
    allreduce = AllReduce(heap, threshold_bytes=THRESHOLD, emulated=True, wait_timeout_s=30.0, BLOCK=256)
    for (label, _, _, algorithm, _), x in zip(launches, inputs["launches"][heap.rank], strict=True):
        y = allreduce(x.clone(), algorithm=algorithm)
        results[label] = (allreduce.last_algorithm, y.float().numpy().copy())
    heap.close()
    return results


def _launch_inputs(world: int) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(7)
    return [[torch.randn(shape, generator=generator).to(dtype) for _, shape, dtype, _, _ in LAUNCHES]
            for _ in range(world)]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"world{w}")
def emulated(request):
    """Every case run once per world: (world, inputs, each rank's results)."""
    from tiledsl.runtime.emulate import run_ranks
    world = request.param
    inputs, shapes = {}, {}
    for name, (sizes, consts) in CASES.items():
        schedule = program_schedule(os.fspath(PROGRAMS / f"{name}.tds"))
        inputs[name] = make_inputs(schedule, world, sizes, seed=world, dtype_map=EMULATED_DTYPES)
        reference = Reference(schedule, world, sizes, consts)
        shapes[name] = [reference.shapes(rank) for rank in range(world)]
    inputs["launches"] = _launch_inputs(world)
    results = run_ranks(_rank, world, CASES, shapes, inputs, LAUNCHES, timeout_s=300.0)
    return world, inputs, results


def _worst_error(got, want) -> float:
    """The largest error relative to want's largest magnitude; Inf where either holds NaN or Inf (an
    output left poisoned, or an expectation that proves nothing), never a NaN that `<=` and max()
    would quietly pass over."""
    got = torch.from_numpy(got).double()
    want = torch.as_tensor(want).double()
    if not (torch.isfinite(got).all() and torch.isfinite(want).all()):
        return float("inf")
    if not got.numel():
        return 0.0
    return (got - want).abs().max().item() / (want.abs().max().item() or 1.0)


@pytest.mark.parametrize("name", list(CASES))
def test_program_matches_reference_on_ragged_sizes(emulated, name):
    world, inputs, results = emulated
    sizes, consts = CASES[name]
    schedule = program_schedule(os.fspath(PROGRAMS / f"{name}.tds"))
    expected = Reference(schedule, world, sizes, consts, EMULATED_DTYPES).run(inputs[name])
    outputs = [n for n, t in schedule.tensors.items() if t.role.value in ("out", "inout")]
    assert outputs
    for tensor in outputs:
        dtype = EMULATED_DTYPES.get(schedule.tensors[tensor].dtype, schedule.tensors[tensor].dtype)
        worst = max(_worst_error(results[rank][name][tensor], expected[rank][tensor]) for rank in range(world))
        assert worst <= TOLERANCE[dtype], f"{name}: {tensor} differs by {worst:.2e} at world {world}, {sizes}"


@pytest.mark.parametrize("launch", LAUNCHES, ids=[launch[0] for launch in LAUNCHES])
def test_allreduce_picks_algorithm_by_size_and_sums(emulated, launch):
    world, inputs, results = emulated
    label, _, dtype, _, algorithm = launch
    position = LAUNCHES.index(launch)
    want = sum(inputs["launches"][rank][position].double() for rank in range(world))
    tolerance = TOLERANCE[str(dtype).removeprefix("torch.")]
    for rank in range(world):
        chosen, got = results[rank][label]
        assert chosen == algorithm
        assert _worst_error(got, want) <= tolerance, f"{label} on rank {rank} at world {world}"


def test_allreduce_choice_is_by_bytes_and_visible():
    allreduce = AllReduce(heap=None, threshold_bytes=1024)
    assert allreduce.choose(torch.empty(255)) == "one_shot"            # 1020 bytes
    assert allreduce.choose(torch.empty(256)) == "two_shot"            # 1024 bytes: at the threshold
    assert allreduce.choose(torch.empty(511, dtype=torch.bfloat16)) == "one_shot"
    assert allreduce.last_algorithm is None                            # nothing ran yet
    with pytest.raises(ValueError, match="one_shot, two_shot"):
        allreduce(torch.empty(8), algorithm="three_shot")


def test_the_default_threshold_never_switches_at_world_2_and_does_at_1_mib_beyond():
    class Heap:
        def __init__(self, world):
            self.world = world

    big = torch.empty(256 << 20, dtype=torch.uint8)
    assert AllReduce(Heap(2)).choose(big) == "one_shot"  # two-shot reads no fewer bytes at world 2
    assert AllReduce(Heap(4)).choose(big) == "two_shot"
    assert AllReduce(Heap(4)).threshold_bytes == DEFAULT_THRESHOLD_BYTES
    assert AllReduce(Heap(2), threshold_bytes=1024).choose(big) == "two_shot"  # a given threshold wins


# ---- GEMM + ReduceScatter: the program chosen by product size ----------------------------------------

def _rank_gemm_rs(heap, inputs: list, threshold: int, forced: list):
    """Each (A, B) pair through the launcher, as chosen and as forced; (choice, C) for each."""
    from tiledsl.collectives import GemmReduceScatter
    gemm_rs = GemmReduceScatter(heap, threshold_bytes=threshold, emulated=True, wait_timeout_s=30.0,
                                BM=64, BN=64, BR=16)
    out = []
    for (A, B), program in zip(inputs[heap.rank], forced, strict=True):
        C = torch.full((A.shape[0] // heap.world, B.shape[1]), float("nan"))
        gemm_rs(A, B, C, program=program)
        out.append((gemm_rs.last_program, C.numpy().copy()))
    heap.close()
    return out


def test_gemm_rs_launcher_picks_pull_for_small_products_and_the_copy_engine_for_large():
    from tiledsl.runtime.emulate import run_ranks
    world, K = 2, 48
    shapes = [(128, 100), (256, 200), (128, 100)]  # (M, N): 51 KB, 205 KB, 51 KB of float32 product
    forced = [None, None, "copy_engine"]
    generator = torch.Generator().manual_seed(3)
    inputs = [[(torch.randn(M, K, generator=generator), torch.randn(K, N, generator=generator)) for M, N in shapes]
              for _ in range(world)]
    results = run_ranks(_rank_gemm_rs, world, inputs, 64 * 1024, forced, timeout_s=300)
    for rank in range(world):
        for n, (M, N) in enumerate(shapes):
            chosen, got = results[rank][n]
            assert chosen == ["pull", "copy_engine", "copy_engine"][n]
            total = sum(inputs[r][n][0].double() @ inputs[r][n][1].double() for r in range(world))
            want = total[rank * M // world:(rank + 1) * M // world]
            assert _worst_error(got, want) <= TOLERANCE["float32"], f"{shapes[n]} on rank {rank}"


def test_gemm_rs_launcher_refuses_an_unknown_program():
    from tiledsl.collectives import GemmReduceScatter
    with pytest.raises(ValueError, match="choose from pull, copy_engine"):
        GemmReduceScatter(heap=None).program("push")
