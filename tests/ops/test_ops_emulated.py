"""tiledsl.ops on 2 emulated ranks (Triton's interpreter, a gloo group beside the heap): every op on
shapes no tile divides and rows of no 16-byte multiple, in fp32, bf16 and fp16, through every path
(the torch path and each program, forced), against float64 sums of every rank's inputs; the rule that
runs when nothing is measured; torch.library.opcheck and torch.compile(fullgraph=True) on the custom
ops; and two ranks agreeing on a tuned choice that their own timings disagree on. Spawning ranks costs
seconds, so one set of rank processes runs everything and the tests below read their share."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from ops_ranks import TOLERANCE, as_numpy, relative_error, start, stop

pytestmark = pytest.mark.emulated

WORLD = 2
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# (label, op, shapes of each rank's inputs, keyword arguments); sizes chosen so that nothing fits:
# 15 rows a rank against 16-row tiles, K = 37 and N = 45 against 16-byte rows
CASES = [
    ("ag_matmul ragged rows, K and N", "all_gather_matmul", [(5, 3, 37), (37, 45)], {"gather_dim": 0}),
    ("ag_matmul along dim 1", "all_gather_matmul", [(3, 6, 37), (37, 45)], {"gather_dim": 1}),
    ("ag_matmul weight as w.t()", "all_gather_matmul", [(7, 37), (45, 37)], {"transposed": True}),
    ("matmul_rs ragged", "matmul_reduce_scatter", [(6, 3, 37), (37, 45)], {"scatter_dim": 0}),
    ("matmul_rs along dim 1", "matmul_reduce_scatter", [(3, 6, 37), (37, 45)], {"scatter_dim": 1}),
    ("matmul_ar decode rows", "matmul_all_reduce", [(3, 37), (37, 45)], {}),
    ("all_reduce 91 elements", "all_reduce", [(7, 13)], {}),
    ("all_gather along dim 1", "all_gather", [(5, 7)], {"gather_dim": 1}),
    ("reduce_scatter ragged", "reduce_scatter", [(6, 13)], {}),
    ("all_reduce_rmsnorm LLaMA-3 eps", "all_reduce_rmsnorm", [(5, 40), (5, 40), (40,)], {"eps": 1e-5}),
]
# shapes that every program takes as they are (16-row tiles, 16-byte rows): the rule picks the program
FITTING = {
    "all_gather_matmul": ([(16, 32), (32, 32)], {}),
    "matmul_reduce_scatter": ([(32, 32), (32, 32)], {}),
    "matmul_all_reduce": ([(4, 32), (32, 32)], {}),
    "all_reduce": ([(8, 16)], {}),
    "all_gather": ([(4, 8)], {}),
    "reduce_scatter": ([(8, 8)], {}),
    "all_reduce_rmsnorm": ([(4, 32), (4, 32), (32,)], {"eps": 1e-6}),
}
# rank -> seconds per all_reduce path: alone, rank 0 would take torch and rank 1 allreduce
AGREEMENT_TIMES = [{"torch": 1.0, "allreduce": 5.0, "allreduce_two_shot": 3.0},
                   {"torch": 9.0, "allreduce": 2.0, "allreduce_two_shot": 4.0}]


def _call(ops, op, tensors, kwargs, **extra):
    kwargs = dict(kwargs)
    if kwargs.pop("transposed", False):
        tensors = [tensors[0], tensors[1].t()]
    return getattr(ops, op)(*tensors, **kwargs, **extra)


def _results(out):
    return [(as_numpy(t), tuple(t.shape), t.stride(), t.is_contiguous()) for t in (out if isinstance(out, tuple) else (out,))]


def _rank(heap, rendezvous, inputs, fitting, cache_dir):
    ops = start(heap, rendezvous)
    from tiledsl.ops.dispatch import OPS
    from tiledsl.ops.context import STATE
    mine = {key: tensors[heap.rank] for key, tensors in inputs.items()}
    results = {"paths": {}, "rule": {}, "opcheck": {}, "predicted": {}}
    for (label, dtype), tensors in mine.items():
        op, kwargs = next((op, kwargs) for name, op, _, kwargs in CASES if name == label)
        for path in [p.name for p in OPS[op].paths(STATE.heaps["0"])]:
            results["paths"][label, dtype, path] = _results(_call(ops, op, tensors, kwargs, impl=path))
        _call(ops, op, tensors, kwargs)
        results["rule"][label, dtype] = ops.decision(op).choice
    for op, tensors in fitting[heap.rank].items():
        _call(ops, op, tensors, FITTING[op][1])
        results["rule"][op, "fitting"] = ops.decision(op).choice
        results["predicted"][op] = (ops.decision(op).how, ops.decision(op).predicted_us)
        args = [*tensors[:-1], tensors[-1], "0"] if op != "all_reduce_rmsnorm" else [*tensors, "0", 1e-6]
        try:
            torch.library.opcheck(getattr(torch.ops.tiledsl, op).default, tuple(args))
            results["opcheck"][op] = "ok"
        except Exception as error:  # noqa: BLE001 - reported by the test
            results["opcheck"][op] = f"{type(error).__name__}: {error}"
    results["compiled"] = _compiled_block(ops, fitting[heap.rank])
    with pytest.raises(ValueError) as refused:
        ops.all_gather_matmul(torch.randn(4, 8, dtype=torch.float64), torch.randn(8, 8, dtype=torch.float64),
                              impl="ag_gemm")
    results["refused"] = str(refused.value)
    with pytest.raises(ValueError) as uneven:
        ops.reduce_scatter(torch.randn(5, 3))
    results["uneven"] = str(uneven.value)
    results["agreement"] = _agreement(ops, heap.rank, cache_dir)
    results["explain"] = ops.explain()
    stop(heap)
    return results


def _compiled_block(ops, tensors):
    """A block of ops traced whole by torch.compile (aot_eager: no C++ compiler needed), then run."""
    a, b = tensors["all_gather_matmul"]
    _, residual, weight = tensors["all_reduce_rmsnorm"]

    def block(a, b, residual, weight):
        h = ops.all_gather_matmul(a, b)                   # [32, 32]
        h = ops.matmul_reduce_scatter(F.silu(h), b)        # [16, 32]
        normed, res = ops.all_reduce_rmsnorm(h[:4], residual, weight)
        return ops.all_gather(normed) + ops.all_reduce(res).sum()

    eager = block(a, b, residual, weight)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")(a, b, residual, weight)
    return relative_error(as_numpy(compiled), eager.double())


def _agreement(ops, rank, cache_dir):
    def timer(name, fn):
        fn()
        return AGREEMENT_TIMES[rank][name]

    ops.configure(tune=True, timer=timer, cache_dir=cache_dir)
    x = torch.full((300,), float(rank + 1))
    y = ops.all_reduce(x)
    decision = ops.decision("all_reduce")
    ops.configure(tune=None, timer=None)
    return decision.choice, decision.how, as_numpy(y)


def _inputs():
    generator = torch.Generator().manual_seed(11)
    inputs = {}
    for label, op, shapes, _ in CASES:
        for dtype in DTYPES:
            inputs[label, dtype] = [[torch.randn(s, generator=generator).to(dtype) for s in shapes]
                                    for _ in range(WORLD)]
    fitting = [{op: [torch.randn(s, generator=generator).to(torch.bfloat16) for s in shapes]
                for op, (shapes, _) in FITTING.items()} for _ in range(WORLD)]
    return inputs, fitting


def _expected(op, kwargs, every_rank, rank):
    """float64 results for `rank` from every rank's inputs."""
    tensors = [[t.double() for t in ts] for ts in every_rank]
    if kwargs.get("transposed"):
        tensors = [[a, b.t()] for a, b in tensors]
    mine = tensors[rank]
    dim = kwargs.get("gather_dim", kwargs.get("scatter_dim", 0))
    if op == "all_gather_matmul":
        return [torch.cat([t[0] for t in tensors], dim) @ mine[1]]
    if op in ("matmul_reduce_scatter", "reduce_scatter"):
        total = sum(t[0] @ t[1] if op == "matmul_reduce_scatter" else t[0] for t in tensors)
        return [total.chunk(WORLD, dim)[rank]]
    if op == "matmul_all_reduce":
        return [sum(t[0] @ t[1] for t in tensors)]
    if op == "all_reduce":
        return [sum(t[0] for t in tensors)]
    if op == "all_gather":
        return [torch.cat([t[0] for t in tensors], dim)]
    h = sum(t[0] for t in tensors) + mine[1]
    return [h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + kwargs["eps"]) * mine[2], h]


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    from tiledsl.runtime.emulate import run_ranks
    inputs, fitting = _inputs()
    folder = tmp_path_factory.mktemp("ops")
    results = run_ranks(_rank, WORLD, str(folder / "rendezvous"), inputs, fitting, str(folder / "cache"),
                        timeout_s=600)
    return inputs, fitting, results, folder / "cache"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_path_matches_the_sum_over_ranks_on_shapes_no_tile_fits(emulated, case, dtype):
    inputs, _, results, _ = emulated
    label, op, _, kwargs = case
    paths = {path: out for (name, dt, path), out in results[0]["paths"].items() if (name, dt) == (label, dtype)}
    assert "torch" in paths and len(paths) >= 2, f"only {list(paths)}"
    for rank in range(WORLD):
        want = _expected(op, kwargs, inputs[label, dtype], rank)
        for path in paths:
            got = results[rank]["paths"][label, dtype, path]
            for (array, shape, _, contiguous), expected in zip(got, want, strict=True):
                assert shape == tuple(expected.shape) and contiguous, f"{path}: shape {shape}, contiguous {contiguous}"
                error = relative_error(array, expected)
                assert error <= TOLERANCE[dtype], f"{path} on rank {rank}: relative error {error:.2e}"


def test_without_timings_fitting_shapes_take_the_program_and_padded_products_torch(emulated):
    _, _, results, _ = emulated
    rule = results[0]["rule"]
    # two or more programs that fit: ranked by tiledsl.predict at this world (nothing measured)
    for op in ("all_gather_matmul", "matmul_reduce_scatter", "all_reduce"):
        how, predicted = results[0]["predicted"][op]
        assert how == "predicted" and len(predicted) >= 2, (op, how, predicted)
        assert rule[op, "fitting"] == min(predicted, key=lambda item: item[1])[0]
    assert results[0]["predicted"]["matmul_all_reduce"][0] == "rule"  # one program: nothing to rank
    assert rule["matmul_all_reduce", "fitting"] == "gemm_ar"
    assert rule["all_reduce", "fitting"] == "allreduce"                # one-shot predicted faster at 128 elements
    assert rule["all_reduce_rmsnorm", "fitting"] == "allreduce_rmsnorm"
    # padding copies only a measurement can justify: ragged products take torch, collectives need none
    assert rule["ag_matmul ragged rows, K and N", torch.bfloat16] == "torch"
    assert rule["matmul_rs ragged", torch.float16] == "torch"
    assert rule["all_reduce 91 elements", torch.float32] == "allreduce"
    assert all(r["rule"] == rule for r in results)


@pytest.mark.parametrize("op", list(FITTING))
def test_opcheck_passes_for_the_custom_op(emulated, op):
    _, _, results, _ = emulated
    assert results[0]["opcheck"][op] == "ok" and results[1]["opcheck"][op] == "ok"


def test_torch_compile_fullgraph_traces_a_block_of_ops_and_matches_eager(emulated):
    _, _, results, _ = emulated
    assert all(r["compiled"] <= 1e-5 for r in results), [r["compiled"] for r in results]


def test_ranks_agree_on_a_choice_their_own_timings_disagree_on(emulated):
    _, _, results, cache = emulated
    for rank, r in enumerate(results):
        choice, how, summed = r["agreement"]
        assert (choice, how) == ("allreduce_two_shot", "tuned")  # fastest by the slowest rank's time
        assert (summed == 3.0).all()
    [path] = cache.glob("*.json")
    entries = json.loads(path.read_text())["entries"]
    [entry] = [e for key, e in entries.items() if key.startswith("all_reduce|world2|EmulatedHeap|")]
    assert entry == {"choice": "allreduce_two_shot",
                     "times_ms": {"torch": 9000.0, "allreduce": 5000.0, "allreduce_two_shot": 4000.0}}


def test_explain_names_each_choice_and_why(emulated):
    _, _, results, _ = emulated
    text = results[0]["explain"]
    # nothing measured at world 2: ranked by prediction, and explain() says it was not measured
    (first, us1), (second, us2) = results[0]["predicted"]["all_gather_matmul"][1][:2]
    assert (f"all_gather_matmul [bfloat16 M<=32 K=32 N=32]: {first} (predicted: chosen by prediction (not measured): "
            f"{first} predicted {us1:.1f} us vs {second} {us2:.1f} us at world 2)") in text
    assert "all_gather_matmul [float32 M<=32 K=37 N=45]: torch (rule: tuning is off)" in text  # padded: the rule
    assert "all_reduce [float32 <=2 KiB]: allreduce_two_shot (tuned)" in text
    assert "measured (slowest rank): allreduce_two_shot 4000.0000 ms, allreduce 5000.0000 ms, torch 9000.0000 ms" in text


def test_a_forced_path_that_cannot_run_and_uneven_blocks_are_refused_by_name(emulated):
    _, _, results, _ = emulated
    assert "ag_gemm cannot run this call: the programs run fp16, bf16 and fp32, not torch.float64" in results[0]["refused"]
    assert "dimension 0 has 5 entries, not a multiple of the group's 2 ranks" in results[0]["uneven"]
