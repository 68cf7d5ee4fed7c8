"""tiledsl.ops at world 3 on emulated ranks: a subgroup of ranks 0 and 2, which no heap serves, takes the
torch path for every op (and `explain` says why) with results of that subgroup alone, while the whole
group's calls go through the programs at an odd world; a heap whose ranks are not the group's is refused."""
from __future__ import annotations

import pytest
import torch

from ops_ranks import TOLERANCE, as_numpy, relative_error, start, stop

pytestmark = pytest.mark.emulated

WORLD = 3
MEMBERS = [0, 2]
DTYPE = torch.bfloat16
# op: (shapes of each rank's inputs, keyword arguments), for the subgroup
SUBGROUP_CASES = {
    "all_gather_matmul": ([(3, 37), (37, 45)], {}),
    "matmul_reduce_scatter": ([(6, 37), (37, 45)], {}),
    "matmul_all_reduce": ([(3, 37), (37, 45)], {}),
    "all_reduce": ([(7, 13)], {}),
    "all_gather": ([(5, 7)], {"gather_dim": 1}),
    "reduce_scatter": ([(6, 13)], {}),
    "all_reduce_rmsnorm": ([(5, 40), (5, 40), (40,)], {"eps": 1e-5}),
}
# (op, path forced, shapes): the whole group through programs, 5 rows a rank against 16-row tiles
WORLD_CASES = [
    ("all_gather_matmul", "ag_gemm", [(5, 37), (37, 45)]),
    ("matmul_reduce_scatter", "gemm_rs_ce", [(15, 37), (37, 45)]),
    ("all_reduce", "allreduce_two_shot", [(7, 13)]),
]


def _rank(heap, rendezvous, sub_inputs, world_inputs):
    import torch.distributed as dist
    ops = start(heap, rendezvous)
    sub = dist.new_group(MEMBERS)  # every rank creates it, members use it
    out = {"sub": {}, "world": []}
    if heap.rank in MEMBERS:
        for op, (_, kwargs) in SUBGROUP_CASES.items():
            result = getattr(ops, op)(*sub_inputs[op][heap.rank], group=sub, **kwargs)
            decision = ops.decision(op)
            out["sub"][op] = ([as_numpy(t) for t in (result if isinstance(result, tuple) else (result,))],
                              decision.choice, decision.how, decision.describe())
        with pytest.raises(ValueError) as mismatch:
            ops.use_heap(heap, group=sub)
        out["mismatch"] = str(mismatch.value)
    for (op, path, _), tensors in zip(WORLD_CASES, world_inputs[heap.rank], strict=True):
        out["world"].append(as_numpy(getattr(ops, op)(*tensors, impl=path)))
    stop(heap)
    return out


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    from tiledsl.runtime.emulate import run_ranks
    generator = torch.Generator().manual_seed(5)
    sub_inputs = {op: [[torch.randn(s, generator=generator).to(DTYPE) for s in shapes] for _ in range(WORLD)]
                  for op, (shapes, _) in SUBGROUP_CASES.items()}
    world_inputs = [[[torch.randn(s, generator=generator).to(DTYPE) for s in shapes] for _, _, shapes in WORLD_CASES]
                    for _ in range(WORLD)]
    folder = tmp_path_factory.mktemp("subgroup")
    results = run_ranks(_rank, WORLD, str(folder / "rendezvous"), sub_inputs, world_inputs, timeout_s=600)
    return sub_inputs, world_inputs, results


def _expected(op, kwargs, tensors, position):
    """float64 results at `position` among `tensors`, one list of inputs per member."""
    t = [[x.double() for x in ts] for ts in tensors]
    if op == "all_gather_matmul":
        return [torch.cat([a for a, _ in t]) @ t[position][1]]
    if op == "matmul_reduce_scatter":
        return [sum(a @ b for a, b in t).chunk(len(t))[position]]
    if op == "matmul_all_reduce":
        return [sum(a @ b for a, b in t)]
    if op == "all_reduce":
        return [sum(x[0] for x in t)]
    if op == "all_gather":
        return [torch.cat([x[0] for x in t], kwargs.get("gather_dim", 0))]
    if op == "reduce_scatter":
        return [sum(x[0] for x in t).chunk(len(t))[position]]
    h = sum(x[0] for x in t) + t[position][1]
    return [h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + kwargs["eps"]) * t[position][2], h]


@pytest.mark.parametrize("op", list(SUBGROUP_CASES))
def test_a_subgroup_without_a_heap_takes_the_torch_path_over_its_own_ranks(emulated, op):
    sub_inputs, _, results = emulated
    kwargs = SUBGROUP_CASES[op][1]
    members = [sub_inputs[op][rank] for rank in MEMBERS]
    for position, rank in enumerate(MEMBERS):
        got, choice, how, text = results[rank]["sub"][op]
        assert (choice, how) == ("torch", "only path")
        assert "no symmetric heap for this group" in text
        for array, want in zip(got, _expected(op, kwargs, members, position), strict=True):
            assert relative_error(array, want) <= TOLERANCE[DTYPE], f"{op} on rank {rank}"
    assert results[1]["sub"] == {}


def test_the_whole_group_runs_programs_at_an_odd_world(emulated):
    _, world_inputs, results = emulated
    for n, (op, path, _) in enumerate(WORLD_CASES):
        every = [world_inputs[rank][n] for rank in range(WORLD)]
        for rank in range(WORLD):
            [want] = _expected(op, {}, every, rank)
            error = relative_error(results[rank]["world"][n], want)
            assert error <= TOLERANCE[DTYPE], f"{op} through {path} on rank {rank}: {error:.2e}"


def test_a_heap_whose_ranks_are_not_the_groups_is_refused(emulated):
    _, _, results = emulated
    assert "the heap is rank 2 of 3; the group's rank is 1 of 2" in results[2]["mismatch"]
