"""The multi-GPU checks' own logic, on CPU: the comparison every check uses, and the driver of calls back
to back, against stand-in programs that are wrong in the ways the checks exist to catch."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from harness import Case, back_to_back, close, mismatch, set_count  # noqa: E402

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("where", ["got", "want", "both"])
@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_a_value_that_is_not_finite_never_compares_equal(where, value):
    got, want = torch.ones(8), torch.ones(8)
    for tensor in {"got": [got], "want": [want], "both": [got, want]}[where]:
        tensor[3] = value
    assert mismatch(got, want, 0.5) is not None
    with pytest.raises(AssertionError, match="NaN or Inf"):
        close(got, want)


def test_tolerance_is_relative_to_the_largest_expected_value():
    want = torch.tensor([100.0, 1.0, -3.0])
    assert mismatch(want + torch.tensor([0.0, 1.0, 0.0]), want, 1e-2) is None  # 1.0 <= 0.01 x (1 + 100)
    reason = mismatch(want + torch.tensor([0.0, 1.1, 0.0]), want, 1e-2)
    assert reason and "1 of 3 elements" in reason and "flat index 1" in reason
    assert mismatch(want + torch.tensor([0.0, 1.1, 0.0]), want, 1e-2, atol=1.2) is None  # atol given
    assert mismatch(want + torch.tensor([0.0, 1.1, 0.0]), want, 1e-2, atol=1.0) is not None
    assert mismatch(torch.zeros(4), torch.zeros(4), 0.0) is None
    assert mismatch(torch.ones(4, dtype=torch.bfloat16), torch.ones(4), 0.0) is None
    assert "shape" in mismatch(torch.ones(4), torch.ones(5), 1.0)
    assert mismatch(torch.ones(1, 4) * 1.0001, torch.ones(1, 4), 0.0) is not None  # tol 0: exact


def test_sets_are_even_and_fit_the_memory():
    assert set_count(1) == 10
    assert set_count(768 << 20) == 2   # a 256 MB bf16 all-reduce with its float32 expectation
    assert set_count(512 << 20) == 4
    assert set_count(10 << 30) == 2    # never fewer than two: calls back to back need another set
    assert all(set_count(n) % 2 == 0 for n in (1, 300 << 20, 700 << 20, 3 << 30))


class Doubler:
    """A stand-in program: Y = 2 X, reading X through a 'symmetric buffer' that each call stages. With
    `stale_after`, from that call on it reads the buffer before staging, i.e. the previous call's X,
    as a wait that lets a reader through one epoch early would."""

    def __init__(self, stale_after=None, skip_write_at=None):
        self.staged = None
        self.calls = 0
        self.stale_after, self.skip_write_at = stale_after, skip_write_at
        self.log = []

    def __call__(self, X, Y, check):
        early = self.stale_after is not None and self.calls >= self.stale_after
        source = self.staged if early and self.staged is not None else X
        if self.calls != self.skip_write_at:
            Y.copy_(2 * source)
        self.staged = X.clone()
        self.calls += 1
        self.log.append("call")

    def check(self):
        self.log.append("check")


def doubling_case(program, log=None):
    X, Y, want = torch.empty(64), torch.empty(64), torch.empty(64)

    def refresh():
        X.normal_()
        torch.mul(X, 2, out=want)
        Y.fill_(NAN)

    def verify():
        program.log.append("verify")
        close(Y, want, 0.0)
    return Case((X, Y), refresh, verify)


def test_every_call_is_checked_and_calls_run_back_to_back():
    program = Doubler()
    back_to_back(program, program.check, lambda: doubling_case(program), calls=25)
    assert program.calls == 25 and program.log.count("verify") == 25
    # the first call alone, then rounds of ten calls with nothing between them, each round verified
    rounds = "|".join(program.log).split("|check|")
    assert rounds[0] == "call" and rounds[1] == "|".join(["verify"] + ["call"] * 10)


def test_a_reader_one_call_early_is_caught_on_its_first_early_call():
    """Called with the same inputs every time (as the checks once were), this stand-in would pass."""
    program = Doubler(stale_after=7)
    with pytest.raises(AssertionError, match="differ"):
        back_to_back(program, program.check, lambda: doubling_case(program), calls=100)
    assert program.calls == 11  # the round holding call 7 (calls 1-10 after the first)


def test_an_output_left_unwritten_is_caught():
    program = Doubler(skip_write_at=42)
    with pytest.raises(AssertionError, match="NaN or Inf"):
        back_to_back(program, program.check, lambda: doubling_case(program), calls=100)
    assert program.calls == 51


@pytest.mark.parametrize("where", ["got", "want", "both"])
@pytest.mark.parametrize("value", [NAN, INF])
def test_the_emulated_collectives_comparison_fails_on_nan_or_inf(where, value):
    """tests/programs/test_collectives_emulated.py compares with its own helper (numpy results from
    the ranks); the worst over ranks is a max(), which skips a NaN that is not first."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "programs"))
    from test_collectives_emulated import _worst_error
    got, want = torch.ones(8), torch.ones(8, dtype=torch.float64)
    for tensor in {"got": [got], "want": [want], "both": [got, want]}[where]:
        tensor[5] = value
    errors = [_worst_error(torch.ones(8).numpy(), torch.ones(8, dtype=torch.float64)),
              _worst_error(got.numpy(), want)]
    assert max(errors) == INF


# ---- ranks sharing a GPU: checks skipped by name, spread over programs, cut by a time budget ------

@pytest.fixture
def one_rank():
    """A process group of this process alone (gloo), for the Checks' own bookkeeping."""
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def test_where_ranks_share_a_gpu_checks_of_nccl_skip_by_name_and_the_rest_run_spread(one_rank, monkeypatch, capfd):
    import harness
    monkeypatch.setattr(harness, "SHARED", True)
    monkeypatch.delenv("CHECKS_BUDGET_S", raising=False)
    checks = harness.Checks()
    ran = []
    for name in ("allgather 1", "allgather 2", "allgather 3", "reduce_scatter 1", "reduce_scatter 2", "gemm_ar 1"):
        assert checks.record(name, lambda name=name: ran.append(name))
    checks.record("allgather via torch", lambda: ran.append("torch"), needs="nccl")
    checks.record("moe over capacity", lambda: ran.append("last"), last=True)
    checks.record("allgather 4", lambda: ran.append("allgather 4"))
    assert not ran  # spread: they wait for finish
    monkeypatch.setattr(harness.dist, "destroy_process_group", lambda: None)  # the fixture's
    assert checks.finish(None) == 0
    assert ran == ["allgather 1", "reduce_scatter 1", "gemm_ar 1", "allgather 2", "reduce_scatter 2",
                   "allgather 3", "allgather 4", "last"]
    out = capfd.readouterr().out
    assert "SKIP allgather via torch -- needs NCCL, which refuses two ranks on one GPU" in out
    assert "skipped 1 checks of NCCL or torch's symmetric memory" in out and "8 run, 0 failed" in out


def test_past_the_budget_no_check_starts_but_the_first_always_runs(one_rank, monkeypatch, capfd):
    import harness
    monkeypatch.setenv("CHECKS_BUDGET_S", "0.5")
    monkeypatch.setattr(harness, "BEGAN", harness.time.monotonic() - 10)  # the start-up took the budget
    checks = harness.Checks()
    ran = []
    for n in range(3):
        checks.record(f"check {n}", lambda n=n: ran.append(n))
    monkeypatch.setattr(harness.dist, "destroy_process_group", lambda: None)
    assert checks.finish(None) == 0 and ran == [0]
    out = capfd.readouterr().out
    assert out.count("SKIP check") == 2 and "-- out of time" in out and "1 run, 0 failed" in out


def test_checks_calls_caps_the_calls_back_to_back(monkeypatch):
    import harness
    monkeypatch.setenv("CHECKS_CALLS", "3")
    assert harness.cap_calls(100) == 3 and harness.cap_calls(2) == 2
    monkeypatch.setenv("CHECKS_CALLS", "1")
    assert harness.cap_calls(100) == 2  # a first call, and at least one back to back after it
    calls = []
    make = lambda: Case((torch.zeros(2),), lambda: None, lambda: None)  # noqa: E731
    back_to_back(lambda *args, check: calls.append(check), lambda: None, make, calls=100)
    assert calls == [True, False]
