"""How a prepared call runs: emulated, the families one after another; on a GPU, staging, the entry,
the persistent kernel and the copy-engine chunks beside it, then CUDA-graph capture and replay.
`Program` (launch.py) prepares each call once per set of tensors; this is the part that runs it."""
from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy
import torch

from tiledsl.runtime import specs, sync, timeline
from tiledsl.runtime.replay import Replay


class ScheduleTimeout(RuntimeError):
    """A wait ran past its bound: the message names the rank, the edge and the epochs."""


class DataError(RuntimeError):
    """A device value broke its declaration during a call (found on the device, raised after it)."""


class CapacityExceeded(DataError):
    """A count above its tensor's `cap`: the message names the rank, the element (the expert, say) and
    both numbers. The call treated the count as the cap: its results are incomplete."""


class IndexOutOfRange(DataError):
    """A gathered index outside the dimension it indexes: the message names the rank, the element of
    the index tensor and its value. The call skipped that row."""


class CopyOp(NamedTuple):
    """One copy-engine chunk instance of a prepared call."""
    target: object
    source: object
    signals: list        # emulated: (signal tensor, slot); on a GPU: device addresses of the slots
    waits: list          # emulated: (count tensor, index, count to reach, edge, (rank, row) kept by another);
    #                      on a GPU: (address, count)
    row: object = None   # its timeline row, when traced
    local: bool = False  # source and target both in this GPU's own memory (no peer view)


def goes_first(op: CopyOp) -> bool:
    """A copy within this GPU that waits on no tile runs on the compute stream before the kernel. The
    driver runs a copy within one GPU as a kernel on the SMs (cuMemcpyAsync, cuMemcpy2DAsync and
    cuMemcpyPeerAsync alike): beside a persistent kernel holding every SM it cannot start, and with one
    SM left free it moves 37 GB/s (8 MB in 220 us; 540 GB/s alone; bench/experiments/local_copy_probe.py,
    bench/NOTES.md, session 13). Before the kernel it has the whole GPU. It waits on nothing, so running
    it earlier than its family's turn can neither deadlock nor race (the checker orders every conflicting
    access by a wait on its signal, never by the families' sequence)."""
    return op.local and not op.waits


@dataclass
class PreparedCall:
    """What one call needs, prepared once per set of caller tensors."""
    env: dict
    diag: torch.Tensor
    staged: list          # (heap buffer, caller tensor) copied in at the start of each call
    barrier: tuple        # entry-barrier arguments before the epoch cell
    kernel_args: dict
    copies: dict          # copy-engine family -> [CopyOp] in order
    roles: dict | None
    grid: int
    options: dict
    fold: bool            # the kernel is the call's entry (no separate entry launch)
    counts: list          # per-row counts of instances done that copy-engine chunks wait on, zeroed first
    exit: bool = False    # inputs peers read in place: the kernel ends with a barrier of all ranks
    shared: dict | None = None  # staged tensor -> its heap copy, or the caller's heap tensor read in place
    # after the first call on a GPU: the compiled entry and kernel relaunched directly, the copies
    # prepared; from the second, the whole call replayed from a CUDA graph
    issued: bool = False
    enter_replay: Replay | None = None
    kernel_replay: Replay | None = None
    copy_list: tuple | None = None  # (copies before the kernel, copies beside it), each a CopyList or None
    graph: object = None


@contextlib.contextmanager
def _interpreter_quiet():
    """Triton's interpreter runs a kernel's arithmetic on numpy arrays, masked-off lanes included (a
    division by a padded zero, exp of -inf): numpy's RuntimeWarnings about them say nothing about
    the program. Silenced around interpreted launches only; on a GPU nothing of the kind exists."""
    with warnings.catch_warnings(), numpy.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


class Issuing:
    """The issue paths of `launch.Program`, which owns the module's spec, the epoch cell and the streams."""

    trace = False  # stamp a timeline (launch.Program sets it)

    def _issue_serialised(self, call):
        """Emulated: the families one after another in dependency order, each in its own launch."""
        with _interpreter_quiet():
            self._issue_families(call)

    def _issue_families(self, call):
        self._begin(call)
        for spec in self.spec.families:
            if spec.name in self.skip:
                continue
            if spec.engine == "copy_engine":
                for target, source, signals, waits, row, _ in call.copies[spec.name]:
                    if row is not None:
                        row[timeline.START], row[timeline.PLACE] = timeline._host_now(), -1
                    for count, index, expected, edge, elsewhere in waits:
                        if elsewhere is not None:  # another rank's tiles: they run in its process, beside this one
                            self._await_count(count, index, expected)
                        if int(count[index]) < expected:  # emulated, the producer ran first or never will
                            counted = f"row {index}" if elsewhere is None else \
                                f"rank {elsewhere[0]}'s row {elsewhere[1]}"
                            raise ScheduleTimeout(
                                f"rank {self.rank} timed out waiting on edge {edge}: {self.spec.edges[edge]} "
                                f"(copy engine, {counted}: expected {expected} of its instances done, saw "
                                f"{int(count[index])})")
                    if row is not None:
                        row[timeline.WAITED] = timeline._host_now()
                    target.copy_(source)
                    for signal, slot in signals:
                        signal.view(-1)[slot] = self.epoch
                    if row is not None:
                        row[timeline.END] = timeline._host_now()
            else:
                roles = self._roles(specs.alone(self.spec), enter=call.fold, exit=call.exit, run={spec.name})
                self._launch(1, call.kernel_args, roles, call.options)

    def _await_count(self, count, index: int, expected: int) -> None:
        """Emulated: until another rank's tiles have counted `expected` instances into this rank's
        copy of their row, or the wait's bound (`wait_timeout_s`) has passed."""
        deadline = time.monotonic() + self.wait_timeout_s
        while int(count[index]) < expected and time.monotonic() < deadline:
            time.sleep(0.0005)

    def _launch(self, grid: int, args: dict, roles: dict, options: dict):
        """The persistent kernel through Triton's JIT (compiling on first use); returns the compiled kernel."""
        return self.spec.kernel[(grid,)](**args, **roles, **options)

    def _begin(self, call, captured: bool = False):
        """What every call does first, emulated or not: stage the inputs, zero the counts copy-engine
        chunks wait on, and pass the entry unless the kernel is its own entry. Recorded into a caller's
        graph, the staging buffer's parity is frozen: a graph with an odd number of calls would stage
        into the buffer a peer may still read from the last replay, so such a call first waits for
        every rank at a barrier of its own (one more entry)."""
        if captured and call.staged:
            self._enter(call)
        if self.trace:  # the timeline's origin: stamped by the kernel's first program, by the host emulated
            entry = call.kernel_args[self.spec.entry_trace]
            entry.zero_()
            if self.emulated:
                entry[0, timeline.START] = timeline._host_now()
        for target, source in call.staged:
            target.copy_(source)
        for count in call.counts:
            count.zero_()
        if not call.fold:
            self._enter(call)

    def _enter(self, call):
        """Advance the epoch cell; a program that communicates also passes the entry barrier: every
        rank has staged its inputs and finished reading the last call's."""
        if call.enter_replay is not None:
            call.enter_replay()
            return
        function, args, options = self._entry_launch(call) or (sync.enter, (self._epoch_cell,), {})
        compiled = function[(1,)](*args, **options)
        if self.replay:
            call.enter_replay = Replay(function, compiled, (1,), dict(zip(function.arg_names, args)))

    def _entry_launch(self, call):
        """The entry barrier's kernel, arguments and options for `call` (None: the program does not
        communicate, its entry only advances the epoch)."""
        if not self.spec.distributed:
            return None
        if self.spec.spans_nodes:
            # its second level signals and waits through NVSHMEM: linked with it like the kernel (and
            # its module initialised by the same post-compile hook)
            options = {"extern_libs": call.options["extern_libs"]} if "extern_libs" in call.options else {}
            return sync.barrier_nodes, (*call.barrier, self._epoch_cell, call.diag, self.max_spins), options
        return sync.barrier_all, (*call.barrier, self._epoch_cell, call.diag, self.max_spins), {}

    def _must_meet(self, call) -> bool:
        """Whether `call` is a distributed call never launched (nothing compiled for it yet: a call rebound
        to new tensors keeps its template's compiled kernels) outside a graph capture."""
        return (not call.issued and call.kernel_replay is None and call.enter_replay is None
                and self.spec.distributed and self.heap is not None and not torch.cuda.is_current_stream_capturing())

    def _compile_then_meet(self, call):
        """Before a distributed call's first launch: compile its entry barrier and kernel without
        launching them, then meet every rank on the host. Without it the first rank to finish compiling
        spins at the entry barrier while its peers still compile (an NVSHMEM-linked module takes ~5 s to
        link; eight ranks compiling on one machine take longer), and its wait bound runs out: on one H200
        at world 8 a two-level all-gather's first call timed out at the entry barrier that way."""
        entry = None if call.fold else self._entry_launch(call)
        if entry is not None:
            function, args, options = entry
            function.warmup(*args, grid=(1,), **options)
        if call.grid and call.kernel_replay is None:
            self.spec.kernel.warmup(grid=(call.grid,), **call.kernel_args, **(call.roles or {}), **call.options)
        self.heap.barrier()

    def _issue(self, call, captured: bool = False):
        """One call on a GPU: staging, entry, the copies within this GPU (`goes_first`), then the
        persistent kernel on the current stream beside the other copy-engine chunks on the
        communication stream, joined at the end."""
        compute = torch.cuda.current_stream()
        if self._must_meet(call):
            self._compile_then_meet(call)
        self._begin(call, captured)
        if call.copy_list is None and call.copies:
            from tiledsl.runtime import copy_engine
            ops = [op for ops in call.copies.values() for op in ops]
            first, beside = [op for op in ops if goes_first(op)], [op for op in ops if not goes_first(op)]
            call.copy_list = (
                copy_engine.CopyList(None, first, self._epoch_cell) if first else None,
                copy_engine.CopyList(self._comm_stream_now(), beside, self._epoch_cell) if beside else None)
        first, beside = call.copy_list or (None, None)
        if beside is not None:
            self._comm_stream.wait_stream(compute)  # the copies follow the staging and the entry
        if first is not None:
            first.issue(compute)
        # The kernel goes first: copies may wait on its tiles' counts, and its first launch loads the
        # compiled module, which waits for the device's work, the stream waiting on the counts too.
        if call.kernel_replay is not None:
            call.kernel_replay()
        elif call.grid:
            compiled = self._launch(call.grid, call.kernel_args, call.roles, call.options)
            if self.replay:
                call.kernel_replay = Replay(self.spec.kernel, compiled, (call.grid,),
                                            {**call.kernel_args, **call.roles})
        if beside is not None:
            beside.issue()
            # the next call's staging and barrier must come after this call's copies
            compute.wait_stream(self._comm_stream)

    def _comm_stream_now(self):
        if self._comm_stream is None:
            self._comm_stream = torch.cuda.Stream(device=self.device, priority=-1)
        return self._comm_stream

    def _capture(self, call):
        """Record the call into a CUDA graph and run it; later calls with these tensors replay it, one
        launch from the host. Every argument is the same at every call (the epoch lives on the device),
        so the graph is valid for as long as the tensors are. If capture fails, launch directly."""
        graph = torch.cuda.CUDAGraph()
        try:
            # thread-local: NCCL's watchdog thread may query events while this thread captures
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._issue(call)
        except Exception as error:  # noqa: BLE001 - a capture that fails costs speed, not results
            warnings.warn(f"tiledsl: CUDA graph capture failed ({type(error).__name__}: {error}); "
                          "launching each call directly from now on", stacklevel=3)
            self.graphs = False
            self._issue(call)
            return
        call.graph = graph
        graph.replay()
