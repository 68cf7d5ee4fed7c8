"""A bucket with nothing measured at its world is ranked by tiledsl.predict (on the CPU, no GPU): the
program predicted fastest is chosen, the same every time, explain() says it was a prediction and not a
measurement, nothing is timed and nothing is written to the tuning cache."""
from __future__ import annotations

import pytest
import torch

import tiledsl.ops as ops
from tiledsl.ops import prediction, tuning
from tiledsl.ops.context import consts_for

PATHS = ["torch", "gemm_rs_pull", "gemm_rs_ce", "gemm_rs"]
SIZES = (("K", 512), ("M", 1024), ("N", 1024))


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    monkeypatch.delenv("TILEDSL_OPS_TUNE", raising=False)
    ops.reset()
    ops.configure(cache_dir=str(tmp_path), progress=False)
    yield
    ops.reset()


class Rank0:
    """A group of one: rank 0, its cache empty, tuning off."""
    rank, world = 0, 2

    def broadcast(self, value):
        return value

    def gather(self, value):
        return [value]

    def barrier(self):
        pass


def predicted(name):
    if name == "torch":
        return None
    return prediction.predicted_us(name, tuple(sorted(consts_for(None, name).items())), 2, SIZES)


def question(predict):
    def measure(name):
        raise AssertionError(f"{name} was measured: a predicted decision times nothing")
    return tuning.Question("matmul_reduce_scatter", "bfloat16 M<=1024 K=512 N=1024", "rs|group 0", "rs", list(PATHS),
                           {}, "gemm_rs_pull", measure, lambda name: None, gpu="NVIDIA H200", world=2,
                           device=torch.device("cpu"), predict=predict)


def test_unmeasured_bucket_takes_the_program_predicted_fastest_and_explain_names_the_prediction(tmp_path):
    decision = tuning.decide(question(predicted), Rank0(), tune=False)
    times = {name: predicted(name) for name in PATHS[1:]}
    ranked = sorted(times, key=times.get)
    assert decision.how == "predicted" and decision.choice == ranked[0]
    assert [p for p, _ in decision.predicted_us] == ranked
    assert decision.times_ms == ()  # nothing claimed as measured
    text = ops.explain("matmul_reduce_scatter")
    assert (f"chosen by prediction (not measured): {ranked[0]} predicted {times[ranked[0]]:.1f} us vs "
            f"{ranked[1]} {times[ranked[1]]:.1f} us at world 2") in text
    assert "predicted (not measured): " in text and "measured (slowest rank)" not in text
    assert not list(tmp_path.glob("*.json"))  # a prediction is not written as a tuning result


def test_prediction_is_deterministic_and_from_the_simulator():
    first = {name: predicted(name) for name in PATHS[1:]}
    prediction.predicted_us.cache_clear()
    again = {name: predicted(name) for name in PATHS[1:]}
    assert first == again and all(us > 0 for us in first.values())
    from tiledsl import pipeline
    from tiledsl.ops.context import library_program
    from tiledsl.predict import load, predict
    schedule = pipeline.run(library_program("gemm_rs_ce"), until="schedule").schedule
    direct = predict(schedule, 2, {**consts_for(None, "gemm_rs_ce"), **dict(SIZES)}, load()).total_us
    assert first["gemm_rs_ce"] == direct


def test_one_predicted_path_is_no_ranking_the_rule_decides():
    only = lambda name: predicted(name) if name == "gemm_rs_ce" else None  # noqa: E731
    decision = tuning.decide(question(only), Rank0(), tune=False)
    assert decision.how == "rule" and decision.choice == "gemm_rs_pull"


def test_a_measured_bucket_is_not_overridden_by_a_prediction():
    timed = {"torch": 3e-3, "gemm_rs_pull": 2e-3, "gemm_rs_ce": 1e-3, "gemm_rs": 4e-3}
    q = question(predicted)
    q.measure = lambda name: (lambda: None)
    ops.configure(timer=lambda name, fn: (fn(), timed[name])[1])
    decision = tuning.decide(q, Rank0(), tune=True)
    assert decision.how == "tuned" and decision.choice == "gemm_rs_ce" and decision.predicted_us == ()


# ---- through the dispatcher: the ops' own paths, sizes and rule ------------------------------------

def simulated_us(path, world: int, sizes: dict) -> float:
    """A program path simulated directly (no ops cache) at its consts (the library's, its tunables)."""
    from tiledsl import pipeline
    from tiledsl.ops.context import library_program
    from tiledsl.predict import load, predict
    schedule = pipeline.run(library_program(path.program), until="schedule").schedule
    return predict(schedule, world, {**consts_for(None, path.program, path.tunables), **sizes}, load()).total_us


class CpuHeap:
    """What a decision reads of a heap: its device (nothing is allocated: no path runs)."""
    device = torch.device("cpu")


@pytest.fixture
def emulated_group(monkeypatch):
    """Group "g" of two emulated ranks served by a heap of library consts; this process is its rank 0
    (no torch.distributed: the agreement is Rank0's)."""
    from tiledsl.ops import dispatch
    from tiledsl.ops.context import STATE, HeapEntry
    STATE.heaps["g"] = HeapEntry(CpuHeap(), "g", emulated=True)
    monkeypatch.setattr(dispatch, "_Agreement", lambda group: Rank0())
    return dispatch


def problem(x, w=None):
    from tiledsl.ops.paths import Problem
    rows = x.reshape(-1) if w is None else x
    return Problem("g", 2, x.dtype, x.device, rows, tuple(x.shape), 0, w)


@pytest.mark.parametrize("op, x, w, sizes", [
    # 128 rows a rank gathered at world 2: M = 256 (ag_gemm, ag_gemm_push)
    ("all_gather_matmul", (128, 512), (512, 512), dict(M=256, K=512, N=512)),
    # every rank's 256 rows, this rank's K = 512 (gemm_rs_pull, gemm_rs_ce, gemm_rs)
    ("matmul_reduce_scatter", (256, 512), (512, 512), dict(M=256, K=512, N=512)),
    # 300 000 elements summed in a buffer of their size class: 10 x 32 768 (one of 8 sizes between
    # 2^18 and 2^19), so N = 327 680 (allreduce, allreduce_two_shot)
    ("all_reduce", (300, 1000), None, dict(N=327680)),
])
def test_each_op_with_tuning_off_and_nothing_measured_takes_its_program_predicted_fastest(emulated_group, op, x, w,
                                                                                          sizes):
    x = torch.randn(*x, dtype=torch.bfloat16)
    w = None if w is None else torch.randn(*w, dtype=torch.bfloat16)
    decision, path, _ = emulated_group.choose(op, problem(x, w), tune=False)
    paths = emulated_group.OPS[op].paths(None)[1:]  # every program with every tunable, in tie order
    names = [p.name for p in paths]
    want = {p.name: simulated_us(p, 2, sizes) for p in paths}
    assert len(want) >= 2
    ranked = sorted(want, key=lambda name: (want[name], names.index(name)))
    assert decision.how == "predicted" and decision.choice == path.name == ranked[0]
    assert [(p, pytest.approx(us)) for p, us in decision.predicted_us] == [(p, want[p]) for p in ranked]
    assert decision.times_ms == ()
    text = ops.explain(op)
    assert f"{ranked[0]} (predicted: chosen by prediction (not measured)" in text
    assert "predicted (not measured): " + ", ".join(f"{p} {want[p]:.1f} us" for p in ranked) in text


def test_a_padded_call_is_not_ranked_by_prediction_the_rule_decides(emulated_group):
    """100 rows a rank are not whole 128-row tiles: every program would pad, which only a measurement
    can justify, so no program is predicted and the rule (torch, as nothing fits) decides."""
    x, w = torch.randn(100, 512, dtype=torch.bfloat16), torch.randn(512, 512, dtype=torch.bfloat16)
    decision, _, _ = emulated_group.choose("all_gather_matmul", problem(x, w), tune=False)
    assert decision.how == "rule" and decision.predicted_us == () and decision.choice == "torch"
