"""The tuner's logic with an injected timer and stand-in ranks (CPU timings mean nothing): it keeps the
fastest path (the torch path too), agrees across ranks, caches on disk and reads the cache back,
ignores a stale or corrupt cache with a warning and never crashes, and measures nothing when tuning is off."""
from __future__ import annotations

import json
import warnings

import pytest
import torch

import tiledsl
import tiledsl.ops as ops
from tiledsl.ops import tuning

PATHS = ["torch", "ag_gemm[BK=64]", "ag_gemm[BK=128]", "ag_gemm_push[BK=64]"]


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    monkeypatch.delenv("TILEDSL_OPS_TUNE", raising=False)
    ops.reset()
    ops.configure(cache_dir=str(tmp_path), progress=False)
    yield
    ops.reset()


class Ranks:
    """Stand-in for the group: this is rank `rank`; the other ranks measured `peer_times`, and rank 0's
    cache holds `rank0_entry` and its tuning switch is `rank0_tune` (what rank 0 broadcasts)."""

    def __init__(self, rank=0, world=2, peer_times=None, rank0_entry=None, rank0_tune=True):
        self.rank, self.world = rank, world
        self.peer_times = peer_times or []
        self.rank0_entry, self.rank0_tune = rank0_entry, rank0_tune
        self.barriers = 0

    def broadcast(self, value):
        return value if self.rank == 0 else (self.rank0_entry, self.rank0_tune)

    def gather(self, value):
        return [value] + [(times, {}) for times in self.peer_times]

    def barrier(self):
        self.barriers += 1


class Timer:
    """Seconds per path as scripted; runs each measured function once, and counts."""

    def __init__(self, seconds: dict):
        self.seconds = seconds
        self.timed = []

    def __call__(self, name, fn):
        fn()
        self.timed.append(name)
        return self.seconds[name]


def question(not_applicable=None, rule="torch", ran=None, failing=()):
    ran = [] if ran is None else ran

    def measure(name):
        def call():
            if name in failing:
                raise RuntimeError(f"{name} broke")
            ran.append(name)
        return call

    return tuning.Question("all_gather_matmul", "bfloat16 M<=8192 K=4096 N=7168", "key|group 0", "key", list(PATHS),
                           dict(not_applicable or {}), rule, measure, lambda name: None, gpu="NVIDIA H200",
                           world=2, device=torch.device("cpu"))


def test_the_fastest_path_is_kept_after_timing_every_applicable_one():
    timer = Timer({"torch": 3e-3, "ag_gemm[BK=64]": 2e-3, "ag_gemm[BK=128]": 1e-3})
    ops.configure(timer=timer)
    ranks = Ranks(peer_times=[{"torch": 3.0, "ag_gemm[BK=64]": 2.0, "ag_gemm[BK=128]": 1.0}])
    decision = tuning.decide(question({"ag_gemm_push[BK=64]": "needs an NVSHMEM heap"}), ranks, tune=True)
    assert decision.choice == "ag_gemm[BK=128]" and decision.how == "tuned"
    assert timer.timed == ["torch", "ag_gemm[BK=64]", "ag_gemm[BK=128]"]  # never the path that cannot run
    assert ranks.barriers == 3  # ranks line up before each path
    assert [p for p, _ in decision.times_ms] == ["ag_gemm[BK=128]", "ag_gemm[BK=64]", "torch"]
    text = decision.describe()
    assert "ag_gemm[BK=128] 1.0000 ms" in text and "ag_gemm_push[BK=64]: needs an NVSHMEM heap" in text


def test_the_torch_path_wins_when_it_is_fastest():
    ops.configure(timer=Timer({"torch": 1e-3, "ag_gemm[BK=64]": 2e-3, "ag_gemm[BK=128]": 3e-3,
                               "ag_gemm_push[BK=64]": 4e-3}))
    assert tuning.decide(question(), Ranks(world=1), tune=True).choice == "torch"


def test_ranks_agree_on_the_fastest_by_the_slowest_ranks_time():
    # alone, this rank would take ag_gemm[BK=64] and the other rank torch; the slowest times pick BK=128
    ops.configure(timer=Timer({"torch": 9e-3, "ag_gemm[BK=64]": 1e-3, "ag_gemm[BK=128]": 2e-3,
                               "ag_gemm_push[BK=64]": 9e-3}))
    peer = {"torch": 1.0, "ag_gemm[BK=64]": 8.0, "ag_gemm[BK=128]": 3.0, "ag_gemm_push[BK=64]": 9.0}
    decision = tuning.decide(question(), Ranks(peer_times=[peer]), tune=True)
    assert decision.choice == "ag_gemm[BK=128]"
    assert dict(decision.times_ms)["torch"] == 9.0 and dict(decision.times_ms)["ag_gemm[BK=64]"] == 8.0


def test_a_path_that_fails_on_any_rank_is_not_taken():
    ops.configure(timer=Timer({"torch": 3e-3, "ag_gemm[BK=64]": 1e-3, "ag_gemm[BK=128]": 2e-3,
                               "ag_gemm_push[BK=64]": 4e-3}))
    peer = ({"torch": 3.0, "ag_gemm[BK=64]": 1.0, "ag_gemm[BK=128]": float("inf"), "ag_gemm_push[BK=64]": 4.0},
            {"ag_gemm[BK=128]": "ScheduleTimeout: rank 1 timed out"})

    class PeerFailed(Ranks):
        def gather(self, value):
            return [value, peer]

    decision = tuning.decide(question(failing=("ag_gemm[BK=64]",)), PeerFailed(), tune=True)
    assert decision.choice == "torch"
    assert dict(decision.failures) == {"ag_gemm[BK=64]": "RuntimeError: ag_gemm[BK=64] broke",
                                       "ag_gemm[BK=128]": "ScheduleTimeout: rank 1 timed out"}
    assert "failed while measured: ag_gemm[BK=64]" in decision.describe()


def test_a_choice_is_cached_on_disk_and_read_back_without_measuring(tmp_path):
    ops.configure(timer=Timer({"torch": 3e-3, "ag_gemm[BK=64]": 2e-3, "ag_gemm[BK=128]": 1e-3,
                               "ag_gemm_push[BK=64]": 4e-3}))
    first = tuning.decide(question(), Ranks(world=1), tune=True)
    [path] = tmp_path.glob("*.json")
    assert path.name == f"NVIDIA_H200-world2-tiledsl{tiledsl.__version__}.json"
    stored = json.loads(path.read_text())
    assert stored["entries"]["key"]["choice"] == "ag_gemm[BK=128]" and stored["world"] == 2
    tuning.forget()  # a new process: nothing in memory
    timer = Timer({})
    ops.configure(timer=timer)
    again = tuning.decide(question(), Ranks(world=1), tune=True)
    assert (again.choice, again.how, timer.timed) == (first.choice, "cached", [])
    assert again.times_ms == first.times_ms


def test_other_ranks_follow_rank_0s_cached_choice_and_tuning_switch():
    entry = {"choice": "ag_gemm[BK=64]", "times_ms": {p: 1.0 + i for i, p in enumerate(PATHS)}}
    timer = Timer({})
    ops.configure(timer=timer)
    decision = tuning.decide(question(), Ranks(rank=1, rank0_entry=entry), tune=True)
    assert (decision.choice, decision.how, timer.timed) == ("ag_gemm[BK=64]", "cached", [])
    tuning.forget()
    decision = tuning.decide(question(rule="ag_gemm[BK=128]"), Ranks(rank=1, rank0_tune=False), tune=True)
    assert (decision.choice, decision.how, timer.timed) == ("ag_gemm[BK=128]", "rule", [])  # measures with rank 0


@pytest.mark.parametrize("content, warning", [
    ("{not json", "unreadable"),
    ('{"format": 1, "entries": []}', "malformed"),
    (json.dumps({"format": 1, "gpu": "NVIDIA H200", "world": 2, "tiledsl": "0.0.1", "entries": {
        "key": {"choice": "torch", "times_ms": {"torch": 1.0}}}}), "stale"),
], ids=["corrupt", "malformed", "older tiledsl"])
def test_a_bad_cache_file_warns_and_is_tuned_again_never_a_crash(tmp_path, content, warning):
    path = tmp_path / f"NVIDIA_H200-world2-tiledsl{tiledsl.__version__}.json"
    path.write_text(content)
    ops.configure(timer=Timer({"torch": 3e-3, "ag_gemm[BK=64]": 2e-3, "ag_gemm[BK=128]": 1e-3,
                               "ag_gemm_push[BK=64]": 4e-3}))
    with pytest.warns(UserWarning, match=warning):
        decision = tuning.decide(question(), Ranks(world=1), tune=True)
    assert (decision.choice, decision.how) == ("ag_gemm[BK=128]", "tuned")
    assert json.loads(path.read_text())["entries"]["key"]["choice"] == "ag_gemm[BK=128]"  # replaced


def test_an_entry_measured_over_other_paths_is_measured_again(tmp_path):
    path = tmp_path / f"NVIDIA_H200-world2-tiledsl{tiledsl.__version__}.json"
    header = {"format": tuning.CACHE_FORMAT, "gpu": "NVIDIA H200", "world": 2, "tiledsl": tiledsl.__version__}
    path.write_text(json.dumps({**header, "entries": {"key": {"choice": "gemm_old", "times_ms": {"gemm_old": 1.0}}}}))
    timer = Timer({"torch": 1e-3, "ag_gemm[BK=64]": 2e-3, "ag_gemm[BK=128]": 3e-3, "ag_gemm_push[BK=64]": 4e-3})
    ops.configure(timer=timer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an outdated entry is not a broken file: no warning
        decision = tuning.decide(question(), Ranks(world=1), tune=True)
    assert decision.how == "tuned" and len(timer.timed) == 4


def test_tuning_off_takes_the_rule_and_measures_nothing(monkeypatch):
    timer = Timer({})
    ops.configure(timer=timer)
    decision = tuning.decide(question(rule="ag_gemm[BK=64]"), Ranks(world=1), tune=False)
    assert (decision.choice, decision.how, timer.timed) == ("ag_gemm[BK=64]", "rule", [])
    # the switch as settings and environment: the argument wins, then configure, then the variable
    settings = ops.STATE.settings
    monkeypatch.setenv("TILEDSL_OPS_TUNE", "0")
    assert settings.tuning(emulated=False, tune=None) is False
    assert settings.tuning(emulated=False, tune=True) is True
    monkeypatch.setenv("TILEDSL_OPS_TUNE", "1")
    assert settings.tuning(emulated=True, tune=None) is True
    ops.configure(tune=False)
    assert settings.tuning(emulated=False, tune=None) is False
    monkeypatch.delenv("TILEDSL_OPS_TUNE")
    ops.configure(tune=None)
    assert settings.tuning(emulated=False, tune=None) is True and settings.tuning(emulated=True, tune=None) is False


def test_a_single_applicable_path_needs_no_ranks_and_no_timer():
    class NoRanks:
        def __getattr__(self, name):
            raise AssertionError("no collective for a decision with one path")

    only = {p: "no symmetric heap for this group" for p in PATHS[1:]}
    decision = tuning.decide(question(only), NoRanks(), tune=True)
    assert (decision.choice, decision.how) == ("torch", "only path")
    assert "no symmetric heap for this group" in decision.describe()


def test_every_path_failing_is_an_error_naming_them():
    ops.configure(timer=Timer({}))
    with pytest.raises(RuntimeError, match="every path of all_gather_matmul failed: torch: RuntimeError: torch broke"):
        tuning.decide(question(failing=PATHS), Ranks(world=1), tune=True)
