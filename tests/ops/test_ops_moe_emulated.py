"""tiledsl.ops.moe_dispatch and moe_combine on 2 emulated ranks, through the torch path
(all_to_all_single, splits exchanged first) and the programs (forced, and as the rule picks), in fp32
and bf16: dispatch delivers every rank's rows grouped by expert, token by token, with exact counts;
combine, given the experts' outputs with every row past the counts poisoned, returns each token's
weighted sum; a routing above capacity raises CapacityExceeded and an id past the last expert
IndexOutOfRange on both paths; a wrong tensor is a ValueError; opcheck passes, and a layer of
dispatch, an expert and combine compiles whole (torch.compile fullgraph) and matches eager."""
from __future__ import annotations

import re

import pytest
import torch

from ops_ranks import TOLERANCE, as_numpy, relative_error, start, stop

pytestmark = pytest.mark.emulated

WORLD = 2
DTYPES = (torch.float32, torch.bfloat16)
T, H, K, E = 13, 40, 2, 2         # 13 tokens a rank, rows of 40, top-2 of 4 experts (2 a rank)
CAPACITY = 16                     # at least T: no routing of distinct top-k ids exceeds it
PATHS = ("torch", "program", None)
PROGRAM = {"moe_dispatch": "moe_dispatch", "moe_combine": "moe_combine"}


def _routing(generator, skewed: bool):
    ids = torch.rand(T, E * WORLD, generator=generator).topk(K, dim=1).indices.to(torch.int32)
    if skewed:  # expert 0 first for every token: 13 rows from each rank
        ids[:, 0] = 0
        ids[:, 1] = torch.randint(1, E * WORLD, (T,), generator=generator, dtype=torch.int32)
    return ids


def _inputs():
    generator = torch.Generator().manual_seed(17)
    return [{"x": torch.randn(T, H, generator=generator),
             "ids": {skew: _routing(generator, skew) for skew in (False, True)},
             "w": torch.rand(T, K, generator=generator)} for _ in range(WORLD)]


def _expected_dispatch(inputs, skew, rank):
    """rows[(e, s)]: the rows of rank s's tokens routed to expert rank*E + e, token by token."""
    rows = {}
    for s, mine in enumerate(inputs):
        for e in range(E):
            chosen = [t for t in range(T) if rank * E + e in mine["ids"][skew][t].tolist()]
            rows[e, s] = mine["x"][chosen].double()
    return rows


def _expert(y):
    """What the experts compute in the test: 2 x + 1 on each row."""
    return 2 * y + 1


def _rank(heap, rendezvous, inputs):
    ops = start(heap, rendezvous)
    mine = inputs[heap.rank]
    out = {}
    for dtype in DTYPES:
        x = mine["x"].to(dtype)
        for skew in (False, True):
            for path in PATHS:
                impl = None if path is None else ("torch" if path == "torch" else "moe_dispatch")
                recv, count = ops.moe_dispatch(x, mine["ids"][skew], E, CAPACITY, impl=impl)
                chose = ops.decision("moe_dispatch").choice
                y = _expert(recv.float()).to(dtype)
                for e in range(E):
                    for s in range(WORLD):
                        y[e, s, int(count[e, s]):] = float("nan")  # past the count: must never be read
                impl = None if path is None else ("torch" if path == "torch" else "moe_combine")
                combined = ops.moe_combine(y, mine["ids"][skew], mine["w"], impl=impl)
                out[dtype, skew, path] = (as_numpy(recv), count.tolist(), chose, as_numpy(combined),
                                          ops.decision("moe_combine").choice, recv.dtype, combined.dtype)
    from tiledsl.runtime.issue import CapacityExceeded, IndexOutOfRange
    for impl in ("torch", "moe_dispatch"):
        with pytest.raises(CapacityExceeded) as exceeded:
            ops.moe_dispatch(mine["x"], mine["ids"][True], E, 4, impl=impl)
        out["capacity", impl] = str(exceeded.value)
        beyond = mine["ids"][False].clone()
        beyond[3, 1] = E * WORLD  # one id past the last expert
        with pytest.raises(IndexOutOfRange) as outside:
            ops.moe_dispatch(mine["x"], beyond, E, CAPACITY, impl=impl)
        out["outside", impl] = str(outside.value)
    errors = {}
    for label, call in {"float ids": lambda: ops.moe_dispatch(mine["x"], mine["ids"][False].float(), E, CAPACITY),
                        "x rows": lambda: ops.moe_dispatch(mine["x"][:-1], mine["ids"][False], E, CAPACITY),
                        "y layout": lambda: ops.moe_combine(mine["x"], mine["ids"][False], mine["w"]),
                        "weights": lambda: ops.moe_combine(torch.zeros(E, WORLD, CAPACITY, H),
                                                           mine["ids"][False], mine["w"][:, :1])}.items():
        with pytest.raises(ValueError) as refused:
            call()
        errors[label] = str(refused.value)
    out["errors"] = errors
    try:
        # dispatch's rows past the counts are unspecified (as DeepEP's): opcheck's comparison of two runs'
        # whole outputs (test_aot_dispatch_dynamic) does not apply to it; combine reads none of them
        torch.library.opcheck(torch.ops.tiledsl.moe_dispatch.default, (mine["x"], mine["ids"][False], E, CAPACITY, "0"),
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
        recv, _ = ops.moe_dispatch(mine["x"], mine["ids"][False], E, CAPACITY)
        torch.library.opcheck(torch.ops.tiledsl.moe_combine.default, (recv, mine["ids"][False], mine["w"], "0"))
        out["opcheck"] = "ok"
    except Exception as error:  # noqa: BLE001 - reported by the test
        out["opcheck"] = f"{type(error).__name__}: {error}"

    def layer(x, ids, w):
        recv, _ = ops.moe_dispatch(x, ids, E, CAPACITY)
        return ops.moe_combine(_expert(recv), ids, w)

    eager = layer(mine["x"], mine["ids"][True], mine["w"])
    traced = torch.compile(layer, fullgraph=True, backend="aot_eager")(mine["x"], mine["ids"][True], mine["w"])
    out["compiled"] = relative_error(as_numpy(traced), eager.double())
    stop(heap)
    return out


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    from tiledsl.runtime.emulate import run_ranks
    inputs = _inputs()
    folder = tmp_path_factory.mktemp("moe")
    return inputs, run_ranks(_rank, WORLD, str(folder / "rendezvous"), inputs, timeout_s=600)


@pytest.mark.parametrize("path", PATHS, ids=["torch", "program", "rule"])
@pytest.mark.parametrize("skew", [False, True], ids=["uniform", "skewed"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_dispatch_then_combine_match_torch_on_every_path(emulated, dtype, skew, path):
    inputs, results = emulated
    for rank, r in enumerate(results):
        recv, count, chose, combined, chose_combine, recv_dtype, out_dtype = r[dtype, skew, path]
        assert recv_dtype == dtype and out_dtype == dtype
        want = _expected_dispatch(inputs, skew, rank)
        assert count == [[len(want[e, s]) for s in range(WORLD)] for e in range(E)]
        for (e, s), rows in want.items():
            got = torch.as_tensor(recv[e, s, :len(rows)])
            assert relative_error(got, rows.to(dtype).double()) == 0.0, (rank, e, s)  # rows travel exactly
        x = inputs[rank]["x"].to(dtype).double()
        wanted = (inputs[rank]["w"].double().sum(1, keepdim=True) * _expert(x)).to(dtype).double()
        assert relative_error(combined, wanted) <= TOLERANCE[dtype], (rank, relative_error(combined, wanted))
        assert (chose, chose_combine) == ({"torch": ("torch", "torch")}.get(path, ("moe_dispatch", "moe_combine")))


def test_above_capacity_both_paths_raise_and_name_the_count(emulated):
    for rank, r in enumerate(emulated[1]):
        found = re.fullmatch(rf"rank {rank}: (\d+) rows from rank \d for local expert \d, above the capacity 4",
                             r["capacity", "torch"])
        assert found and int(found[1]) > 4, r["capacity", "torch"]
        assert "above its cap 4" in r["capacity", "moe_dispatch"], r["capacity", "moe_dispatch"]
    assert "= 13 is above its cap 4" in emulated[1][0]["capacity", "moe_dispatch"]  # expert 0: every token


def test_an_expert_id_past_the_last_expert_is_an_error_on_both_paths(emulated):
    for r in emulated[1]:
        assert "expert id 4 is not among the group's 4 experts" in r["outside", "torch"], r["outside", "torch"]
        assert "ids[3, 1] = 4 is outside 0..3" in r["outside", "moe_dispatch"], r["outside", "moe_dispatch"]


def test_wrong_tensors_are_refused_at_the_call_and_opcheck_passes(emulated):
    for r in emulated[1]:
        assert "ids must be [T, K] integers" in r["errors"]["float ids"]
        assert "x must be [T, H] with T = 13" in r["errors"]["x rows"]
        assert "y must be [E, 2, C, H]" in r["errors"]["y layout"]
        assert "weights must be floats shaped as ids" in r["errors"]["weights"]
        assert r["opcheck"] == "ok", r["opcheck"]
        assert r["compiled"] <= 1e-6, r["compiled"]  # dispatch, an expert, combine under torch.compile
