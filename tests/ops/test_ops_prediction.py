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
