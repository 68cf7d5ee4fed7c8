"""The order in which one call is put on the GPU, against stand-ins for the streams, the kernel and the
copy list: a copy-engine chunk may wait on the kernel's counts, so the kernel must be enqueued before
any copy (the first launch loads the kernel's module, which waits for the device: with the copies'
waits already queued, that never returned)."""
import types

import torch

from tiledsl.runtime import copy_engine
from tiledsl.runtime.issue import CopyOp, Issuing, PreparedCall


class FakeStream:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait_stream(self, other):
        self.log.append(f"{self.name} waits for {other.name}")


PEER = CopyOp("peer target", "source", [], [])
LOCAL = CopyOp("own target", "source", [], [], local=True)
LOCAL_WAITING = CopyOp("own target", "source", [], [(64, 1)], local=True)


def _call(log, copies=(PEER,), **changes):
    call = PreparedCall(env={}, diag=None, staged=[], barrier=(), kernel_args={}, copies={"send": list(copies)},
                        roles={}, grid=4, options={}, fold=False, counts=[types.SimpleNamespace(
                            zero_=lambda: log.append("counts zeroed"))])
    call.enter_replay = lambda: log.append("entry")
    call.kernel_replay = lambda: log.append("kernel")
    for name, value in changes.items():
        setattr(call, name, value)
    return call


def _issued(monkeypatch, copies) -> list:
    log = []
    compute = FakeStream(log, "compute")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: compute)

    class FakeCopyList:
        def __init__(self, stream, ops, cell):
            self.stream, self.ops = stream, ops

        def issue(self, stream=None):
            log.append(f"{[op.target for op in self.ops]} on {(stream or self.stream).name}")
    monkeypatch.setattr(copy_engine, "CopyList", FakeCopyList)
    program = Issuing()
    program._comm_stream = FakeStream(log, "comm")
    program._epoch_cell = None
    call = _call(log, copies)
    program._issue(call)
    program._issue(call)  # the second call issues the lists the first made, the same way
    assert log[:len(log) // 2] == log[len(log) // 2:]
    return log[:len(log) // 2]


def test_counts_are_zeroed_then_entry_then_kernel_then_copies_then_the_join(monkeypatch):
    assert _issued(monkeypatch, [PEER]) == ["counts zeroed", "entry", "comm waits for compute", "kernel",
                                            "['peer target'] on comm", "compute waits for comm"]


def test_a_copy_within_the_gpu_that_waits_on_nothing_runs_before_the_kernel(monkeypatch):
    """The driver runs a copy within one GPU on the SMs: before the kernel it has them all, beside a
    kernel holding them it crawls or never starts (issue.goes_first). One that waits on the kernel's
    tiles cannot go first and stays beside it; peer copies go on the communication stream, which does
    not wait for the local ones."""
    assert _issued(monkeypatch, [PEER, LOCAL, LOCAL_WAITING]) == [
        "counts zeroed", "entry", "comm waits for compute", "['own target'] on compute", "kernel",
        "['peer target', 'own target'] on comm", "compute waits for comm"]
    assert _issued(monkeypatch, [LOCAL]) == ["counts zeroed", "entry", "['own target'] on compute", "kernel"]
