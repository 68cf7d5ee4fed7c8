"""Emulated ranks: the generated kernels run in Triton's interpreter on CPU tensors, one process per
rank, over a symmetric heap in shared memory. Processes, not threads: the interpreter keeps the
program id in global state and undoes its patching of triton.language when any launch ends, so two
ranks in one process would corrupt each other."""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import traceback

import torch

from tiledsl.runtime.heap import SymmetricHeap
from tiledsl.topology import NODES_VARIABLE, Topology

ARENA_BYTES = 256 * 2**20     # per rank; emulated problems are small
ALIGN = 256
# The interpreter semantics we rely on (peer pointer arithmetic, acquire/release atomics, host tensor
# descriptors) were checked with this Triton release. Triton 3.6's interpreter fails with NumPy 2
# (`int()` of a one-element array in `range(...)` bounds), so it is not on the list.
TESTED_TRITON = ("3.9",)
# Ranks fork from a server that imported these once in interpreter mode: importing torch and triton
# afresh costs each rank ~2 s, which dominated a run. The server never runs a kernel or a torch op,
# so a fork of it holds no threads and no interpreter state.
PRELOAD = ["torch", "triton", "triton.language", "tiledsl.api", "tiledsl.pipeline", "tiledsl.schedule.check",
           "tiledsl.codegen", "tiledsl.runtime.launch", "tiledsl.tools.run_program"]


class EmulatedHeap(SymmetricHeap):
    """Every rank's copy lives in one shared-memory arena per rank, at the same offset in each."""

    def __init__(self, rank: int, world: int, arenas: list[torch.Tensor], barrier, topology: Topology | None = None):
        super().__init__(rank, world, torch.device("cpu"), topology)
        self.arenas = arenas
        self._barrier = barrier
        self._next = 0
        self._offset: dict[int, int] = {}

    def barrier(self) -> None:
        self._barrier.wait()

    def _allocate(self, shape, dtype):
        element = torch.empty((), dtype=dtype).element_size()
        nbytes = max(1, int(torch.Size(shape).numel())) * element
        start = self._next
        self._next = (start + nbytes + ALIGN - 1) // ALIGN * ALIGN
        if self._next > ARENA_BYTES:
            raise MemoryError(f"emulated symmetric heap is full ({ARENA_BYTES // 2**20} MiB per rank)")
        # a tensor of no elements (a family with no instances at this world) still takes an element's room
        tensor = self.arenas[self.rank][start:start + nbytes].view(dtype)[:torch.Size(shape).numel()].view(shape)
        self._offset[tensor.data_ptr()] = start
        return tensor

    def _peer(self, t, r):
        start = self._offset[t.data_ptr()]
        return self.arenas[r][start:start + t.numel() * t.element_size()].view(t.dtype).view(t.shape)

    def _release(self, allocations):
        self._next = 0


def check_triton_version() -> None:
    import triton
    if ".".join(triton.__version__.split(".")[:2]) not in TESTED_TRITON:
        raise RuntimeError(f"emulation was tested with triton {', '.join(TESTED_TRITON)}; "
                           f"this is triton {triton.__version__}")


def check_interpreter() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("emulation needs TRITON_INTERPRET=1 before triton is imported")
    check_triton_version()


class RankError(RuntimeError):
    """A rank failed: `kind` names the exception it raised (ScheduleTimeout, LaunchError, ...), so that
    a caller can tell a schedule that timed out from a bug."""

    def __init__(self, rank: int, kind: str, message: str, details: str = ""):
        self.rank, self.kind, self.message = rank, kind, message
        super().__init__(f"rank {rank}: {kind}: {message}" + (f"\n{details}" if details else ""))


def _rank_main(fn, rank, world, arenas, barrier, results, args, topology=None):
    os.environ["TRITON_INTERPRET"] = "1"
    torch.set_num_threads(1)
    try:
        check_interpreter()
        from tiledsl.runtime import interpreter_fixes, sync
        interpreter_fixes.install()
        if not sync.EMULATED:
            raise RuntimeError("this process's forkserver imported triton without TRITON_INTERPRET=1; "
                               "emulated ranks must start it (call run_ranks before other forkserver use)")
        topology = topology or Topology.one_node(world)
        if topology.nodes > 1:  # every arena is mapped here: pointers across nodes are refused by name
            from tiledsl.runtime import node_guard
            node_guard.install(rank, topology)
        heap = EmulatedHeap(rank, world, arenas, barrier, topology)
        results.put((rank, True, fn(heap, *args)))
    except BaseException as error:  # noqa: BLE001 - every failure goes back to the parent
        barrier.abort()  # free ranks stuck in a host barrier with this one
        # the interpreter wraps what a kernel raised (a CrossNodeAccess, say): name that instead
        while type(error).__name__ == "InterpreterError" and error.__cause__ is not None:
            error = error.__cause__
        results.put((rank, False, (type(error).__name__, str(error), traceback.format_exc())))


def run_ranks(fn, world: int, *args, timeout_s: float = 600.0, nodes: int | None = None) -> list:
    """Run `fn(heap, *args)` on `world` emulated ranks, each its own process; return their results.
    The ranks pose as `nodes` nodes (default: TILEDSL_NODES, else one): within a node they reach each
    other through peer pointers, across nodes only through NVSHMEM's stand-ins.

    `fn` must be importable (a module-level function). Raises RuntimeError naming the first rank
    that failed, with its message. Ranks fork from this process's multiprocessing forkserver, which
    the first call starts in interpreter mode with PRELOAD imported: this process should not also
    use the forkserver for work that runs triton on a GPU."""
    if world < 1:
        raise ValueError("world must be at least 1")
    check_triton_version()  # here, before any rank starts, so the message is not a rank's traceback
    topology = Topology.of(world, nodes if nodes is not None else int(os.environ.get(NODES_VARIABLE) or 1))
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    arenas = [_shared_zeros(ARENA_BYTES) for _ in range(world)]
    barrier = context.Barrier(world)
    results = context.Queue()
    procs = [context.Process(target=_rank_main, args=(fn, r, world, arenas, barrier, results, args, topology),
                             daemon=True) for r in range(world)]
    # The forkserver starts with the first rank and keeps the environment it started with; this
    # process keeps its own, so kernels it builds later are not turned into interpreted ones.
    with _interpreter_environment():
        for p in procs:
            p.start()
    out, failures = {}, []
    try:
        for _ in range(world):
            rank, ok, value = results.get(timeout=timeout_s)
            (out.__setitem__(rank, value) if ok else failures.append((rank, value)))
    except queue.Empty:
        failures.append((-1, ("TimeoutError", f"emulated ranks did not finish within {timeout_s:.0f} s", "")))
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    if failures:
        # a rank that timed out first explains the others (they give up once they see it)
        rank, (kind, message, details) = min(failures, key=lambda f: (f[1][0] != "ScheduleTimeout", f[0]))
        if rank < 0:
            raise RuntimeError(message)
        raise RankError(rank, kind, message, details)
    return [out[r] for r in range(world)]


def _shared_zeros(nbytes: int) -> torch.Tensor:
    """Zeroed shared memory whose pages are touched only when used (`zeros().share_memory_()` fills
    and copies every byte: seconds per rank for an arena that is mostly never used)."""
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)  # what share_memory_() allocates with
    if new_shared is None:
        return torch.zeros(nbytes, dtype=torch.uint8).share_memory_()
    return torch.empty(0, dtype=torch.uint8).set_(new_shared(nbytes))  # a fresh shared-memory file reads as zeros


@contextlib.contextmanager
def _interpreter_environment():
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before
