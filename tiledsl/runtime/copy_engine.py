"""Copy-engine chunks: a peer copy on a communication stream, then a signal written by the stream itself.

A copy between two GPUs runs on a copy engine, no SM; the driver runs a copy within one GPU (the
4-byte signal into this rank's own slot too) as a kernel on the SMs, which is why such copies go
before the persistent kernel where they can (`issue.goes_first`). A program's chunks go through
`CopyList`: each copy is one cuMemcpyAsync, each signal a 4-byte copy of the epoch cell into the
slot, and each wait on kernel tiles a cuStreamWaitValue32 on a count the tiles keep, so a call can be
captured in a CUDA graph.
`copy_and_signal`, `write_signal` (cuStreamWriteValue32) and `wait_value` (cuStreamWaitValue32) are
the single-use forms the runtime smoke test exercises. Signals are int32
slots holding epoch numbers, so they never need resetting.
"""
import torch

_MAX_EPOCH = 2**31 - 1  # the stream-side wait compares (int32)(*slot - value) >= 0, so epochs stay below 2**31


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as error:
        raise RuntimeError(f"copy-engine signals need the `cuda-python` package (cuda.bindings): {error}") from error
    return driver


def _check(driver, result, call: str) -> None:
    (status,) = result
    if status != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{call} failed: {status.name}")


def _check_slot(address: int, value: int) -> None:
    if address % 4:
        raise ValueError(f"signal address {address:#x} is not 4-byte aligned")
    if not 0 <= value <= _MAX_EPOCH:
        raise ValueError(f"signal value {value} is not an epoch in [0, 2**31)")


def write_signal(stream: torch.cuda.Stream, address: int, value: int) -> None:
    """Enqueue on `stream`: write int32 `value` at device `address` (may be a peer's) after prior work completes."""
    _check_slot(address, value)
    driver = _driver()
    # DEFAULT (not NO_MEMORY_BARRIER): the write waits for all prior work on the stream and is preceded by a
    # fence like __threadfence_system(), so a reader that sees `value` also sees the data copied before it.
    flags = driver.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT
    result = driver.cuStreamWriteValue32(driver.CUstream(stream.cuda_stream), driver.CUdeviceptr(address), value, flags)
    _check(driver, result, "cuStreamWriteValue32")


def wait_value(stream: torch.cuda.Stream, address: int, value: int) -> None:
    """Enqueue on `stream`: hold all later work until the int32 at `address` reaches epoch `value`."""
    _check_slot(address, value)
    driver = _driver()
    flags = driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
    result = driver.cuStreamWaitValue32(driver.CUstream(stream.cuda_stream), driver.CUdeviceptr(address), value, flags)
    _check(driver, result, "cuStreamWaitValue32")


class CopyList:
    """A fixed list of copy-engine chunks, each waits then a copy then its signals, issued the same
    way at every call. A wait (address, count) holds the stream until the int32 there reaches the
    count (cuStreamWaitValue32): kernel tiles count themselves there, zeroed at each call, so the
    value is the same at every call. A count may be kept by another rank's tiles (codegen/plan.py,
    `counts_peers`): their release atomics reach this GPU's copy of it over NVLink, and the data the
    copy then reads stays in their GPU, so the wait needs no flush of remote writes. Contiguous
    copies go straight to cuMemcpyAsync with driver handles made once, a few microseconds each;
    anything else takes torch's copy. A signal is a
    4-byte copy of the epoch cell (which the call's entry kernel advanced) into the slot: like the
    data, it is the same operation at every call, so the list can be captured in a CUDA graph.
    Copies on one stream run in order, so the slot changes only once the data before it has landed.
    A list made with no stream is issued on the stream each `issue` names (the caller's current one,
    which differs inside a CUDA graph capture)."""

    def __init__(self, stream: torch.cuda.Stream | None, ops, epoch_cell: torch.Tensor):
        driver = self._driver = _driver()
        self._stream = None if stream is None else driver.CUstream(stream.cuda_stream)
        self._torch_stream = stream
        self._cell = driver.CUdeviceptr(epoch_cell.data_ptr())
        self._ops = []
        for op in ops:
            target, source, addresses = op[:3]
            waits = op[3] if len(op) > 3 else ()
            row = op[4] if len(op) > 4 else None  # timeline stamps before and after it (runtime/timeline.py)
            for address in addresses:
                _check_slot(address, 0)
            for address, count in waits:
                _check_slot(address, count)
            signals = [driver.CUdeviceptr(a) for a in addresses]
            waits = [(driver.CUdeviceptr(a), count) for a, count in waits]
            if (target.dtype == source.dtype and target.shape == source.shape and target.is_contiguous()
                    and source.is_contiguous()):
                raw = (driver.CUdeviceptr(target.data_ptr()), driver.CUdeviceptr(source.data_ptr()),
                       target.numel() * target.element_size())
                self._ops.append((waits, raw, None, signals, row))
            else:
                self._ops.append((waits, None, (target, source), signals, row))

    def issue(self, stream: torch.cuda.Stream | None = None) -> None:
        """Enqueue every wait, copy and signal on the list's stream or `stream` (which must already
        follow their sources)."""
        if stream is not None:
            self._stream, self._torch_stream = self._driver.CUstream(stream.cuda_stream), stream
        driver = self._driver
        geq = driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ if any(op[0] for op in self._ops) else None
        for waits, raw, tensors, signals, row in self._ops:
            self._stamp(row, 0)
            for address, count in waits:
                _check(driver, driver.cuStreamWaitValue32(self._stream, address, count, geq), "cuStreamWaitValue32")
            self._stamp(row, 1)
            if raw is not None:
                _check(driver, driver.cuMemcpyAsync(*raw, self._stream), "cuMemcpyAsync")
            else:
                with torch.cuda.stream(self._torch_stream):
                    tensors[0].copy_(tensors[1], non_blocking=True)
            for signal in signals:
                _check(driver, driver.cuMemcpyAsync(signal, self._cell, 4, self._stream), "cuMemcpyAsync")
            self._stamp(row, 2)

    def _stamp(self, row, point: int) -> None:
        """A one-thread kernel on the stream writing the GPU clock into the chunk's timeline row."""
        if row is None:
            return
        from tiledsl.runtime import timeline
        with torch.cuda.stream(self._torch_stream):
            timeline.stamp[(1,)](row, point)


def copy_and_signal(stream: torch.cuda.Stream, dst: torch.Tensor, src: torch.Tensor, signal_address: int,
                    value: int) -> None:
    """Enqueue on `stream`: copy `src` into `dst` (typically a peer view from SymmetricHeap.peer), then signal.

    `stream` must already be ordered after whatever produced `src` (an event or `stream.wait_stream`).
    """
    # Anything but two contiguous tensors of one dtype on this device makes torch launch a copy kernel on the SMs
    # (or hop through another device's stream) instead of issuing a single cudaMemcpyAsync on `stream`.
    if dst.dtype != src.dtype or dst.shape != src.shape:
        raise ValueError(f"copy-engine copy needs equal dtype and shape, got {dst.dtype}{tuple(dst.shape)} "
                         f"<- {src.dtype}{tuple(src.shape)}")
    if not (dst.is_contiguous() and src.is_contiguous()):
        raise ValueError("copy-engine copy needs contiguous tensors")
    if not dst.device == src.device == stream.device:
        raise ValueError(f"copy-engine copy needs dst, src and stream on one device, got {dst.device}, {src.device}, "
                         f"{stream.device}; take peer memory as a view from SymmetricHeap.peer")
    with torch.cuda.stream(stream):
        dst.copy_(src, non_blocking=True)
    # src is read on `stream`, not on the stream that allocated it: keep the caching allocator from reusing it early.
    src.record_stream(stream)
    write_signal(stream, signal_address, value)
