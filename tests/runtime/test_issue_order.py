"""The order in which one call is put on the GPU, against stand-ins for the streams, the kernel and the
copy list: a copy-engine chunk may wait on the kernel's counts, so the kernel must be enqueued before
any copy (the first launch loads the kernel's module, which waits for the device: with the copies'
waits already queued, that never returned)."""
import types

import torch

from tiledsl.runtime import copy_engine
from tiledsl.runtime.issue import Issuing, PreparedCall


class FakeStream:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait_stream(self, other):
        self.log.append(f"{self.name} waits for {other.name}")


def _call(log, **changes):
    call = PreparedCall(env={}, diag=None, staged=[], barrier=(), kernel_args={}, copies={"send": [("op",)]},
                        roles={}, grid=4, options={}, fold=False, counts=[types.SimpleNamespace(
                            zero_=lambda: log.append("counts zeroed"))])
    call.enter_replay = lambda: log.append("entry")
    call.kernel_replay = lambda: log.append("kernel")
    for name, value in changes.items():
        setattr(call, name, value)
    return call


def test_counts_are_zeroed_then_entry_then_kernel_then_copies_then_the_join(monkeypatch):
    log = []
    compute = FakeStream(log, "compute")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: compute)

    class FakeCopyList:
        def __init__(self, stream, ops, cell):
            assert ops == [("op",)]

        def issue(self):
            log.append("copies")
    monkeypatch.setattr(copy_engine, "CopyList", FakeCopyList)
    program = Issuing()
    program._comm_stream = FakeStream(log, "comm")
    program._epoch_cell = None
    program._issue(_call(log))
    assert log == ["counts zeroed", "entry", "comm waits for compute", "kernel", "copies", "compute waits for comm"]
