"""The copy-engine chunk list, against a stand-in for the CUDA driver: each chunk's data is copied
before its signals, a signal copies the epoch cell, and only contiguous same-shape copies go straight
to cuMemcpyAsync (anything else takes torch's copy)."""
import contextlib
import types

import pytest
import torch

from tiledsl.runtime import copy_engine


class FakeDriver:
    """Records the driver calls CopyList makes; pointers stay plain integers."""

    class CUresult:
        CUDA_SUCCESS = "ok"

    def __init__(self):
        self.calls = []
        self.CUstream = lambda handle: ("stream", handle)
        self.CUdeviceptr = lambda address: address

    class CUstreamWaitValue_flags:  # noqa: N801 - the driver's name
        CU_STREAM_WAIT_VALUE_GEQ = "geq"

    def cuMemcpyAsync(self, dst, src, nbytes, stream):  # noqa: N802 - the driver's name
        self.calls.append((dst, src, nbytes))
        return (self.CUresult.CUDA_SUCCESS,)

    def cuStreamWaitValue32(self, stream, address, value, flags):  # noqa: N802 - the driver's name
        self.calls.append(("wait", address, value, flags))
        return (self.CUresult.CUDA_SUCCESS,)


@pytest.fixture
def driver(monkeypatch):
    fake = FakeDriver()
    monkeypatch.setattr(copy_engine, "_driver", lambda: fake)
    return fake


def test_each_copy_comes_before_its_signals_and_a_signal_copies_the_epoch_cell(driver):
    cell = torch.zeros(1, dtype=torch.int32)
    a, b = torch.zeros(8), torch.ones(8)
    c, d = torch.zeros(4), torch.ones(4)
    stream = types.SimpleNamespace(cuda_stream=7)
    copies = copy_engine.CopyList(stream, [(a, b, [64, 68]), (c, d, [128])], cell)
    copies.issue()
    assert driver.calls == [(a.data_ptr(), b.data_ptr(), 32), (64, cell.data_ptr(), 4), (68, cell.data_ptr(), 4),
                            (c.data_ptr(), d.data_ptr(), 16), (128, cell.data_ptr(), 4)]
    copies.issue()  # the same operations at every call: what a CUDA graph can record
    assert driver.calls[5:] == driver.calls[:5]


def test_a_strided_copy_takes_torchs_copy_and_still_signals_after_it(driver, monkeypatch):
    copied = []
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    cell = torch.zeros(1, dtype=torch.int32)
    target, source = torch.zeros(4, 4)[:, :2], torch.ones(4, 2)
    copies = copy_engine.CopyList(types.SimpleNamespace(cuda_stream=1), [(target, source, [256])], cell)
    original = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src, non_blocking=False: copied.append(1) or
                        original(self, src))
    copies.issue()
    assert copied == [1] and torch.equal(target, source)
    assert driver.calls == [(256, cell.data_ptr(), 4)]


def test_a_misaligned_signal_slot_is_refused_when_the_list_is_made(driver):
    with pytest.raises(ValueError, match="not 4-byte aligned"):
        copy_engine.CopyList(types.SimpleNamespace(cuda_stream=1), [(torch.zeros(2), torch.ones(2), [66])],
                             torch.zeros(1, dtype=torch.int32))


def test_a_chunk_waits_on_its_counts_before_its_copy_with_the_same_values_every_call(driver):
    cell = torch.zeros(1, dtype=torch.int32)
    a, b = torch.zeros(8), torch.ones(8)
    c, d = torch.zeros(4), torch.ones(4)
    stream = types.SimpleNamespace(cuda_stream=7)
    copies = copy_engine.CopyList(stream, [(a, b, [64], [(256, 112)]), (c, d, [128], [(260, 112), (264, 3)])], cell)
    copies.issue()
    assert driver.calls == [("wait", 256, 112, "geq"), (a.data_ptr(), b.data_ptr(), 32), (64, cell.data_ptr(), 4),
                            ("wait", 260, 112, "geq"), ("wait", 264, 3, "geq"), (c.data_ptr(), d.data_ptr(), 16),
                            (128, cell.data_ptr(), 4)]
    copies.issue()  # counts are zeroed at each call, so the values to wait for never change
    assert driver.calls[7:] == driver.calls[:7]


def test_a_list_made_without_a_stream_goes_on_the_stream_each_issue_names(driver, monkeypatch):
    """The copies that run before the kernel go on the caller's current stream, which inside a CUDA
    graph capture is the capture's: each issue names it."""
    streams = []
    monkeypatch.setattr(driver, "cuMemcpyAsync", lambda dst, src, n, stream: streams.append(stream) or ("ok",))
    cell = torch.zeros(1, dtype=torch.int32)
    copies = copy_engine.CopyList(None, [(torch.zeros(4), torch.ones(4), [64])], cell)
    copies.issue(types.SimpleNamespace(cuda_stream=3))
    copies.issue(types.SimpleNamespace(cuda_stream=5))
    assert streams == [("stream", 3)] * 2 + [("stream", 5)] * 2
