"""The launcher behind every generated module: checks the caller's tensors, binds sizes, owns the
symmetric buffers and signals, and runs one call: stage inputs, the entry (epoch cell, barrier),
copy-engine chunks on the communication stream, the persistent kernel on the compute stream, then
the deadline check. The entry is a kernel of its own only where copy-engine chunks need the call's
epoch before the persistent kernel starts; otherwise that kernel does it, one launch fewer a call.

On a GPU every kernel family runs in one launch, concurrently; from the second call with the same
tensors the whole call is replayed from a CUDA graph. Emulated (Triton's interpreter, one
process per rank) the families run one after another in dependency order, each in its own launch: a
legal serialisation of the same schedule, since every edge points forward in that order."""
from __future__ import annotations

import dataclasses
import functools

import torch

from tiledsl import gpus
from tiledsl.runtime import guards, specs, sync, timeline, validate
# ScheduleTimeout is raised by check() below, and callers import it from here
from tiledsl.runtime.issue import (CapacityExceeded, CopyOp, DataError, IndexOutOfRange, Issuing, PreparedCall,
                                   ScheduleTimeout, goes_first)
from tiledsl.runtime.specs import (  # noqa: F401 - generated modules reach these as tds_launch.*
    LAUNCHER_SET, Arg, FamilySpec, GuardSpec, Kind, ProgramSpec, SharedMemoryError, TensorSpec, kernel_options,
    linear, operand_bytes, ordered_instances, pipeline_stages, pow2_at_least, spec_of, unlinear)
from tiledsl.runtime.validate import LaunchError
from tiledsl.topology import Topology

# Tensor sets a program keeps prepared calls (and their CUDA graphs) for. Each keeps its caller tensors
# alive: a loop that allocates new outputs every step should reuse them, or call `release()`.
MAX_PREPARED_CALLS = 64
# Peer-offset tables kept for a staged tensor's caller addresses (a few hundred bytes each)
MAX_MOVED_TABLES = 256
# Spin reads per second of waiting, roughly: they turn `wait_timeout_s` into a bound on spins.
SPINS_PER_SECOND = {"gpu": 2_000_000, "emulated": 5_000}


def _device_scratch() -> None:
    """TMA descriptors made on the device live in global scratch, which Triton asks the allocator set by
    triton.set_allocator for at every launch: a caching-allocator tensor on the launch's stream (inside
    a CUDA graph's capture, from the graph's pool). An allocator the caller set is kept."""
    import triton
    from triton.runtime import _allocation
    if not isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        return

    def scratch(size: int, alignment: int, stream):
        return torch.empty(size, dtype=torch.int8, device="cuda")
    triton.set_allocator(scratch)


@dataclasses.dataclass
class Resources:
    """What a program allocates for one set of sizes. The program's own tensors (symm, local, staged)
    are keyed by their names and nothing else is: the launcher's buffers and tables have fields of
    their own, so any name the language accepts may name a tensor (`shapes`, `diag`, `sig_x`)."""
    tensors: dict = dataclasses.field(default_factory=dict)   # name -> buffer (staged: the two by parity)
    signals: dict = dataclasses.field(default_factory=dict)   # family -> its signal slots
    counts: dict = dataclasses.field(default_factory=dict)    # family -> instances done per first index
    orders: dict = dataclasses.field(default_factory=dict)    # family -> its instances in the order they run
    order_tables: dict = dataclasses.field(default_factory=dict)  # family -> that order, on the device
    traces: dict = dataclasses.field(default_factory=dict)    # family -> its timeline rows
    trace_entry: object = None                               # the entry's timeline row
    barrier: object = None                                   # entry and exit slots of a distributed program
    blocks: dict = dataclasses.field(default_factory=dict)    # tunable block sizes
    shapes: dict = dataclasses.field(default_factory=dict)    # every tensor's shape
    diag: object = None                                      # what a wait that gave up or a guard reports


@dataclasses.dataclass(frozen=True)
class Timelines:
    """A traced call's timeline rows on one rank, int64 [rows, timeline.FIELDS] each."""
    entry: torch.Tensor   # the entry's one row: the trace's origin (the end of the entry barrier)
    families: dict        # family -> a row per instance part


class Program(Issuing):
    """A compiled program bound to a rank. Call it with the caller's tensors (in, out and inout, in
    declaration order, or by name); it returns the out and inout tensors. What the module's code
    generation decided is read from its one ProgramSpec (`self.spec`)."""

    def __init__(self, module, heap=None, emulated: bool | None = None, wait_timeout_s: float = 5.0,
                 dtype_override: dict | None = None, num_sms: int | None = None, skip: tuple = (), replay: bool = True,
                 graphs: bool = True, num_warps: int | None = None, fold_entry: bool = True, trace: bool = False,
                 num_stages: int | None = None, **consts):
        self.module = module
        self.spec = spec = spec_of(module)
        self.emulated = sync.EMULATED if emulated is None else emulated
        if self.emulated:  # a program emulated in this process, not only in emulated ranks
            from tiledsl.runtime import interpreter_fixes
            interpreter_fixes.install()
        if self.emulated and not sync.EMULATED:
            raise RuntimeError("emulation needs TRITON_INTERPRET=1 set before triton is imported")
        if consts:
            raise LaunchError("consts are fixed when the program is built: pass them to tiledsl.compile()")
        self.heap = heap
        # by name ("bfloat16") or by torch dtype (torch.bfloat16)
        self.dtype_override = {k if isinstance(k, str) else str(k).removeprefix("torch."): v
                               for k, v in (dtype_override or {}).items()}
        mode = "emulated" if self.emulated else "gpu"
        self.wait_timeout_s = wait_timeout_s
        self.max_spins = max(1, int(wait_timeout_s * SPINS_PER_SECOND[mode]))
        self.num_sms = num_sms
        if num_warps is not None and (num_warps < 1 or num_warps & (num_warps - 1) or num_warps > 32):
            raise LaunchError(f"num_warps must be a power of two from 1 to 32, got {num_warps}")
        self.num_warps = num_warps  # None: kernel_options decides (8 with a product, else 4)
        if num_stages is not None and not 1 <= num_stages <= 8:
            raise LaunchError(f"num_stages must be from 1 to 8, got {num_stages}")
        self.num_stages = num_stages  # None: kernel_options decides; a loop whose steps wait keeps 1
        # families left out on purpose, to break a schedule in tests: their consumers must time out
        self.skip = set(skip)
        # relaunch compiled kernels directly after the first call (False: every launch through the JIT)
        self.replay = replay and not self.emulated
        # replay each call from a CUDA graph, captured at the second call with the same tensors
        self.graphs = graphs and not self.emulated
        # let the persistent kernel be the call's entry where it can (False: an entry kernel every call)
        self.fold_entry = fold_entry
        # stamp every instance's start, end of waits and end into a timeline (runtime/timeline.py)
        self.trace = trace
        self._epoch_cell = None  # int32 on the device: the epoch the running call's kernels read
        # staged inputs alternate between two heap copies by epoch parity: one prepared call for each
        self._staging = any(t.staged for t in spec.tensors)
        self.epoch = 0
        self.callers = [t for t in spec.tensors if t.role in ("in", "out", "inout")]
        if spec.device_descriptors:
            _device_scratch()
        if spec.distributed and self.topology.nodes > 1 and not spec.spans_nodes:
            name = (module.__doc__ or "this program").split(":")[0]
            raise LaunchError(
                f"{name}: this launch has {self.topology} ranks, and the program names no topology: it reaches "
                "other ranks through peer pointers and signals, which stay within a node. Use a program written "
                "for nodes (one that names `node`, `local_world`, ...: programs/hier_*.tds), or launch within one "
                "node")
        self._resources: dict = {}
        self._calls: dict = {}
        # a prepared call per binding key (shapes, not addresses): a new set of tensors of those shapes
        # is bound into it (_rebind) instead of being prepared again
        self._templates: dict = {}
        self._moved: dict = {}  # (heap copy's address, offset to the caller's tensor, shmem) -> peer offsets
        # the last call's tensor objects and what they bound to (_bound); it keeps them alive, as the
        # prepared call made for them does
        self._last_bound = None
        self._last_calls = [None, None]  # per staging parity: (the binding's key, its prepared call)
        self._cuda = torch.cuda.is_available()  # asked once: 1.2 us a call otherwise
        self._outs = [t.name for t in self.callers if t.role in ("out", "inout")]
        self._comm_stream = None

    # ---- where it runs ----------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.heap.rank if self.heap is not None else 0

    @property
    def world(self) -> int:
        return self.heap.world if self.heap is not None else 1

    @property
    def topology(self) -> Topology:
        return self.heap.topology if self.heap is not None else Topology.one_node(1)

    @property
    def device(self) -> torch.device:
        if self.heap is not None:
            return self.heap.device
        if self.emulated:
            return torch.device("cpu")
        if not self._cuda:
            raise LaunchError(f"{self.module.__name__}: no GPU here, and the program was loaded for one: set "
                              "TRITON_INTERPRET=1 before importing tiledsl (or pass emulated=True) to run it in "
                              "Triton's interpreter")
        return torch.device("cuda", torch.cuda.current_device())

    # ---- buffers, signals and tables for one set of sizes ---------------------------------------
    def _resources_for(self, env: dict) -> Resources:
        key = tuple(sorted((k, v) for k, v in env.items() if k in self.spec.params))
        if key in self._resources:
            return self._resources[key]
        if self.heap is None and (self.spec.distributed or self.world > 1):
            raise LaunchError("this program communicates: give it a symmetric heap "
                              "(tiledsl.runtime.heap.open_heap() under torchrun)")

        shapes = self.spec.tensor_shapes(env)
        counts = self.spec.counts(env)
        res = Resources()
        for spec in self.spec.tensors:
            dtype = self.dtype_override.get(spec.dtype, getattr(torch, spec.dtype))
            if spec.staged:
                # Staged inputs are written before the entry barrier, while peers may still be reading
                # the previous call's copy: two buffers, alternating by epoch, keep those apart (none
                # for one read where the caller has it, `_reads_own`).
                if not self._reads_own(spec):
                    res.tensors[spec.name] = [self.heap.alloc(shapes[spec.name], dtype) for _ in range(2)]
            elif spec.role == "symm":
                res.tensors[spec.name] = self.heap.alloc(shapes[spec.name], dtype)
            elif spec.role == "local":
                # zero at first, then what each call leaves there for the next, like symm tensors (the
                # reference means the same)
                res.tensors[spec.name] = torch.zeros(shapes[spec.name], dtype=dtype, device=self.device)
        for spec in self.spec.families:
            if spec.count_peers:
                # every rank's rows in every rank's copy: the producer on rank s counts its rows into
                # [s, :] of each rank, where a copy engine waits on them
                res.counts[spec.name] = self._alloc_signals((self.world * counts[spec.name],), torch.int32)
            elif spec.counted:
                # instances done per first index, zeroed at each call (one per instance is room enough)
                res.counts[spec.name] = torch.zeros(counts[spec.name], dtype=torch.int32, device=self.device)
            if spec.notify:
                res.signals[spec.name] = self._alloc_signals((self.world, spec.slots(counts[spec.name])),
                                                             getattr(torch, spec.signal_dtype))
        if self.spec.distributed and self.spec.spans_nodes:
            # two levels: one slot per rank of the node, then one per node (an NVSHMEM signal, 64-bit);
            # entry, then exit slots
            levels = self.topology.local_world + self.topology.nodes
            res.barrier = self._alloc_signals((2 * levels,), torch.int64)
        elif self.spec.distributed:
            res.barrier = self._alloc_signals((2 * self.world,), torch.int32)  # entry, then exit slots
        for name, order in self.spec.orders(env).items():
            res.orders[name] = order
            res.order_tables[name] = torch.tensor(order, dtype=torch.int32, device=self.device)
        res.blocks = self.spec.blocks(env)
        res.shapes = shapes
        res.diag = torch.zeros(sync.DIAG_SIZE, dtype=torch.int32, device=self.device)
        for spec in self.spec.families:  # timeline rows: one per instance part when traced, else one
            rows = counts[spec.name] * spec.split if self.trace else 1
            res.traces[spec.name] = torch.zeros(rows, timeline.FIELDS, dtype=torch.int64, device=self.device)
        res.trace_entry = torch.zeros(1, timeline.FIELDS, dtype=torch.int64, device=self.device)
        if self.trace and not self.emulated and any(f.engine == "copy_engine" for f in self.spec.families):
            # The copy stream stamps with a small kernel: compile and load it now. Its first launch would
            # load its module, which waits for the device, where the kernel waits for the copies (a hang,
            # seen on H200 in bench_trace at ag_gemm).
            for point in (timeline.START, timeline.WAITED, timeline.END):
                timeline.stamp[(1,)](res.trace_entry[0], point)
            torch.cuda.synchronize(self.device)
        self._resources[key] = res
        return res

    def _alloc_signals(self, shape, dtype):
        if self.heap is not None:
            return self.heap.alloc(shape, dtype)
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def _peer_offsets(self, tensor, shared=None, shmem: bool = False):
        """Element offsets from `tensor` to each rank's copy of it, or of `shared` (its staged copy). With
        `shmem`, the table of the emulator's NVSHMEM stand-ins, which reaches other nodes too (on a GPU,
        NVSHMEM addresses PEs itself and reads no table: it gets the pointer table)."""
        if self.heap is None:
            return torch.zeros(1, dtype=torch.int64, device=self.device)
        offsets = self.heap.shmem_offsets if shmem and self.emulated else self.heap.peer_offsets
        if shared is None:
            return offsets(tensor)
        delta, rest = divmod(shared.data_ptr() - tensor.data_ptr(), tensor.element_size())
        if rest:
            raise LaunchError(f"a tensor's address is not a multiple of its element size ({tensor.element_size()})")
        if delta == 0:
            return offsets(shared)
        # The table depends on the two addresses only: kept, a call bound to a caller tensor at an address
        # seen before launches no kernel to make it. Not one made during a capture: its contents exist
        # only when the caller's graph replays.
        key = (shared.data_ptr(), delta, shmem and self.emulated)
        moved = self._moved.get(key)
        if moved is None:
            moved = offsets(shared) + delta
            if self.emulated or not torch.cuda.is_available() or not torch.cuda.is_current_stream_capturing():
                if len(self._moved) >= MAX_MOVED_TABLES:
                    self._moved.clear()
                self._moved[key] = moved
        return moved

    # ---- one call -------------------------------------------------------------------------------
    def __call__(self, *args, check: bool = True, **kwargs):
        """One call. Inside the caller's own CUDA-graph capture (`torch.cuda.graph`) a call that was made
        once before with the same tensors makes no host synchronisation and no host-to-device copy: it
        is recorded into that graph, and its waits stay bounded (`check()` after a replay reports a
        timeout)."""
        # torch.compile calls a program as it is (a graph break: _compiled_call); tiledsl.ops offers custom
        # ops that compile whole. Eagerly the call goes straight in: torch.compiler.disable around every
        # call cost ~4 us of the host's time (its eval-frame switch), a small program's whole GPU time.
        if torch.compiler.is_compiling():
            return self._compiled_call(*args, check=check, **kwargs)
        return self._call(args, kwargs, check)

    @torch.compiler.disable
    def _compiled_call(self, *args, check: bool = True, **kwargs):
        return self._call(args, kwargs, check)

    def _call(self, args, kwargs, check: bool):
        tensors, addresses = self._bound(args, kwargs)
        capturing = not self.emulated and self._cuda and torch.cuda.is_current_stream_capturing()
        # Everything but the epoch depends only on the caller's tensors: prepare it once per set of them,
        # so a steady-state call is a few launches and no Python bookkeeping.
        parity = (self.epoch + 1) % 2 if self._staging else 0
        last = self._last_calls[parity]
        if last is not None and last[0] is addresses and not capturing:
            call = last[1]  # the binding of the last call with this parity: its prepared call, no lookup
            key = None
        else:
            key = (parity,) + addresses
            call = self._calls.get(key)
        if call is None and capturing and self._staging:
            # recorded into the caller's graph the parity is frozen anyway (a barrier guards the staging,
            # see Issuing._begin): a call prepared for the other parity serves as well
            call = self._calls.get((1 - parity,) + key[1:])
        if call is None:
            if len(self._calls) >= MAX_PREPARED_CALLS:
                self._calls.clear()
                self._last_calls = [None, None]
            binding = self._binding_key(tensors, parity)
            template = self._templates.get(binding)
            if template is None and capturing and self._staging:
                template = self._templates.get((1 - parity,) + binding[1:])
            if template is not None:
                call = self._calls[key] = self._rebind(template, tensors)
            elif capturing:
                raise LaunchError(f"{self.module.__name__} is called inside a CUDA-graph capture with tensors of "
                                  "shapes it has not seen: call it once with tensors of these shapes, dtypes and "
                                  "strides before capturing (preparing a call copies its tables to the GPU, which a "
                                  "capture forbids)")
            else:
                call = self._calls[key] = self._templates[binding] = self._prepare(tensors, parity)
        if key is not None and not capturing:  # a staged program alternates between two prepared calls
            self._last_calls[parity] = (addresses, call)
        self.epoch += 1
        if self.emulated:
            self._issue_serialised(call)
        elif capturing:
            self._issue(call, captured=True)  # into the caller's graph, never into one of ours
            call.issued = True
        elif call.graph is not None:
            call.graph.replay()
        elif call.issued and self.graphs:
            self._capture(call)
        else:
            self._issue(call)
            call.issued = True
        if check and not capturing:  # a capture cannot synchronise: check() after replaying the graph
            self.check()
        outs = [tensors[name] for name in self._outs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _bound(self, args, kwargs) -> tuple[dict, tuple]:
        """The caller's tensors by name and the key of their addresses, shapes, strides, dtypes and
        devices. A call with the very tensor objects of the last one, at the same addresses, shapes and
        strides, reuses both: binding by name and building the key cost ~8 us of Python a call (this
        repository's CPU), more than a small program's whole GPU time back to back (issue 27)."""
        objects = args + tuple(kwargs.values())
        last = self._last_bound
        if last is not None and last[0] == tuple(kwargs) and len(last[1]) == len(objects) and \
                all(a is b for a, b in zip(objects, last[1])) and \
                all(t.data_ptr() == p and t.shape == shape and t.stride() == stride
                    for t, (p, shape, stride) in zip(objects, last[2])):
            return last[3], last[4]
        tensors = validate.bind(self.module.__name__, self.callers, args, kwargs)
        addresses = tuple((n, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device) for n, t in tensors.items())
        self._last_bound = (tuple(kwargs), objects, tuple((t.data_ptr(), t.shape, t.stride()) for t in objects),
                            tensors, addresses)
        return tensors, addresses

    def _binding_key(self, tensors, parity: int) -> tuple:
        """What a prepared call depends on besides the caller's addresses: shapes, strides and dtypes, the
        exact address of a tensor on the heap (peers may read it in place), and whether every other
        address is 16-byte aligned (the compiled kernel is specialised on what it first saw)."""
        return (parity,) + tuple(
            (n, tuple(t.shape), t.stride(), t.dtype, t.device,
             t.data_ptr() if self.heap is not None and self.heap.owns(t) else t.data_ptr() % 16 == 0)
            for n, t in tensors.items())

    @functools.cached_property
    def _caller_args(self) -> list:
        """The kernel arguments that follow a caller tensor's address (the tensor, its TMA descriptor, the
        offsets from it to the peers' staged copies): fixed by the module, worked out once."""
        callers = {t.name for t in self.callers}
        return [a for a in self.spec.args if a.of in callers and a.kind in (
            Kind.TENSOR, Kind.DESCRIPTOR, Kind.PEERS, Kind.SHMEM)]

    def _rebind(self, template: "PreparedCall", tensors) -> "PreparedCall":
        """A call with new caller tensors of a template's shapes: the template's sizes, tables, roles and
        compiled kernels, with the new addresses bound. No host-to-device copy and no synchronisation,
        so a functional op's fresh output costs no preparation, and it can be recorded into the caller's
        CUDA graph."""
        args = dict(template.kernel_args)
        for arg in self._caller_args:
            args[arg.name] = self._kernel_arg(arg, template.env, None, tensors, template.shared, template.barrier)
        # a heap tensor read in place has the template's address (the binding key holds it): not staged
        staged = [(copy, tensors[name]) for name, copy in template.shared.items()
                  if copy.data_ptr() != tensors[name].data_ptr()]
        kernel_replay = None if template.kernel_replay is None else template.kernel_replay.rebound(args)
        copies = template.copies
        if copies:  # copy-engine chunks read and write views of the caller's tensors: made again (host only)
            res = self._resources_for(template.env)  # the template's, already there
            views = {**tensors, **{spec.name: res.tensors[spec.name] for spec in self.spec.tensors
                                   if not spec.staged and spec.name in res.tensors}}
            copies = {name: self._copy_ops(spec, template.env, res, views, template.shared)
                      for spec in self.spec.families if (name := spec.name) in copies}
        return dataclasses.replace(template, kernel_args=args, staged=staged, kernel_replay=kernel_replay,
                                   copies=copies, issued=False, graph=None, copy_list=None)

    def _scrub(self, call: "PreparedCall") -> None:
        """Drop a template's references to its caller tensors (a rebinding puts new ones in): released, it
        keeps no caller memory alive."""
        names = [a.name for a in self._caller_args]
        call.kernel_args.update(dict.fromkeys(names, None))
        call.staged = []
        call.copies = dict.fromkeys(call.copies, [])  # which families copy stays known; their views go
        call.copy_list = None
        if call.kernel_replay is not None:
            call.kernel_replay = call.kernel_replay.rebound(dict.fromkeys(names, None))
        call.graph = None

    def _prepare(self, tensors, parity: int) -> "PreparedCall":
        env = validate.sizes(self.spec, self.callers, tensors, self.rank, self.world, self.dtype_override,
                             self.device, self.topology)
        if self._epoch_cell is None:
            # [epoch, programs finished]: the second is the count a kernel that is its own entry keeps
            self._epoch_cell = torch.zeros(2, dtype=torch.int32, device=self.device)
        res = self._resources_for(env)
        # A staged tensor has two faces: this rank's own accesses use the caller's tensor (an inout is
        # written there), peers read the copy staged in the heap at the call's start.
        # An `in` tensor the caller allocated on the heap (tiledsl.empty) is read by peers where it is: no
        # copy, but an exit barrier, so that no rank overwrites it (after returning) while a peer reads it.
        views = dict(tensors)
        shared = {}  # staged tensor -> its heap copy for this parity, or the caller's own heap tensor
        in_place = set()
        for spec in self.spec.tensors:
            if spec.staged and spec.role == "in" and self.heap is not None and self.heap.owns(tensors[spec.name]):
                shared[spec.name] = tensors[spec.name]
                in_place.add(spec.name)
            elif spec.staged and not self._reads_own(spec):
                shared[spec.name] = res.tensors[spec.name][parity]
            elif spec.name in res.tensors:
                views[spec.name] = res.tensors[spec.name]
        # alone (world 1) no peer reads a staged copy, unless the kernel itself reads the tensor through its
        # peer offsets (which lead to the copy); a copy-engine chunk's own-rank source is the caller's tensor
        through_peers = {a.of for a in self.spec.args if a.kind in (Kind.PEERS, Kind.SHMEM)}
        staged = [(shared[name], tensors[name]) for name in shared if name not in in_place
                  and (self.world > 1 or name in through_peers)]
        barrier = ()
        if self.spec.distributed and self.spec.spans_nodes:
            topology = self.topology
            barrier = (res.barrier, self._peer_offsets(res.barrier),
                       self._peer_offsets(res.barrier, shmem=True), self.rank, topology.nodes, topology.local_world)
        elif self.spec.distributed:
            barrier = (res.barrier, self._peer_offsets(res.barrier), self.rank, self.world)
        copies = {spec.name: self._copy_ops(spec, env, res, views, shared)
                  for spec in self.spec.families if spec.engine == "copy_engine" and spec.name not in self.skip}
        beside = any(not goes_first(op) for ops in copies.values() for op in ops)
        spread = None if self.emulated else self._spread(env, copies_beside=beside)
        grid = 0 if spread is None else spread.grid
        fold = self._folds_entry(copies, staged, grid)
        roles = None if spread is None else self._roles(spread, enter=fold, exit=bool(in_place))
        args = self._kernel_args(env, res, views, shared, barrier)
        counts = [res.counts[spec.name] for spec in self.spec.families if spec.counted]
        return PreparedCall(env, res.diag, staged, barrier, args, copies, roles, grid, self._options(env), fold,
                            counts, exit=bool(in_place), shared=shared)

    def _folds_entry(self, copies, staged, grid) -> bool:
        """Whether the persistent kernel can be the call's entry itself (one launch fewer): only when no
        copy-engine chunk needs this call's epoch before the kernel starts and no input is staged. A
        staged input is copied before the entry kernel: staging inside the kernel (each program its
        share, the last one signalling the peers) measured slower at every size, 8 KB one-shot 0.0157
        against 0.0099 ms and 227 against 283 GB/s at 256 MB (bench/results/2026-11-29-world2-s9).
        Emulated, where families launch one by one, only when there is a single one."""
        if copies or staged or not self.fold_entry:
            return False
        if self.emulated:
            return len([f for f in self.spec.families if f.name not in self.skip]) == 1
        return grid > 0

    @functools.cached_property
    def _specs(self) -> dict:
        return {spec.name: spec for spec in self.spec.tensors}

    @functools.cached_property
    def _own_offsets(self) -> torch.Tensor:
        """The peer table of a tensor read where the caller has it (`_reads_own`): one offset, 0; made
        once, not at every rebinding (a functional op's call would launch a fill for it)."""
        return torch.zeros(1, dtype=torch.int64, device=self.device)

    def _reads_own(self, spec) -> bool:
        """Alone (world 1) an `in` tensor that the kernel reads through peer pointers is read where the
        caller has it: the only rank is this one, so its peer table is one offset, 0, and nothing is
        staged (a copy of the whole tensor before the kernel: moe_combine_direct's Y, 470 MB at 4096
        tokens). Not one NVSHMEM reads: NVSHMEM addresses the heap only."""
        return self.world == 1 and spec.staged and spec.role == "in" and not any(
            a.of == spec.name and a.kind is Kind.SHMEM for a in self.spec.args)

    def _kernel_args(self, env, res, views, shared, barrier) -> dict:
        """Every argument of the kernel but its roles, by name, from the module's one list of them."""
        return {arg.name: self._kernel_arg(arg, env, res, views, shared, barrier) for arg in self.spec.args
                if arg.kind not in LAUNCHER_SET}

    def _kernel_arg(self, arg, env, res, views, shared, barrier):
        kind = arg.kind
        if kind is Kind.TENSOR:
            return views[arg.of]
        if kind is Kind.PEERS:
            if arg.of not in shared and self._reads_own(self._specs[arg.of]):
                return self._own_offsets  # rank 0 is this one: the tensor itself
            return self._peer_offsets(views[arg.of], shared.get(arg.of))
        if kind is Kind.SIGNALS:
            return res.signals[arg.of]
        if kind is Kind.SIGNAL_PEERS:
            return self._peer_offsets(res.signals[arg.of])
        if kind is Kind.SHMEM:
            return self._peer_offsets(views[arg.of], shared.get(arg.of), shmem=True)
        if kind is Kind.SIGNAL_SHMEM:
            return self._peer_offsets(res.signals[arg.of], shmem=True)
        if kind is Kind.BARRIER_SHMEM:
            return barrier[2]
        if kind is Kind.ORDER:
            return res.order_tables[arg.of]
        if kind is Kind.COUNT:
            return res.counts[arg.of]
        if kind is Kind.COUNT_PEERS:
            return self._peer_offsets(res.counts[arg.of])
        if kind is Kind.DESCRIPTOR:
            from triton.tools.tensor_descriptor import TensorDescriptor
            return TensorDescriptor.from_tensor(views[arg.of], list(arg.block))
        if kind in (Kind.SIZE, Kind.CONST):
            return env[arg.name]
        if kind is Kind.BLOCK:
            return res.blocks[arg.name]
        if kind is Kind.EPOCH_CELL:
            return self._epoch_cell
        if kind is Kind.DIAG:
            return res.diag
        if kind is Kind.MAX_SPINS:
            return self.max_spins
        if kind is Kind.BARRIER:
            return barrier[0]
        if kind is Kind.BARRIER_PEERS:
            return barrier[1]
        if kind is Kind.TRACE:
            return res.traces[arg.of] if arg.of else res.trace_entry
        raise LaunchError(f"no value for kernel argument {arg.name} of kind {kind}")

    def _spread(self, env, copies_beside: bool) -> specs.Spread:
        """Which programs run each family (`copies_beside`: copy-engine chunks run beside the kernel).
        Refused where they cannot all be resident on this device: the checker's proof is for another's."""
        spread = specs.spread(self.spec, self.spec.counts(env), self.num_sms or self._default_programs(copies_beside))
        refusal = gpus.resident_refusal(spread.fixed, spread.rest, list(spread.shared), self._gpu)
        if refusal is not None:
            raise LaunchError(f"{self.module.__name__}: {refusal}")
        return spread

    def _roles(self, spread: specs.Spread, enter: bool, exit: bool, run=None) -> dict:
        """The values of the arguments the launch gives (RUN, ENTER, EXIT, TRACING, START, PROGRAMS), by
        name: every family but those left out runs, or those of `run`."""
        run = {f.name for f in self.spec.families} - self.skip if run is None else run
        roles = specs.role_values(self.spec, run=run, enter=enter, exit=exit, tracing=self.trace)
        return {**roles, **spread.values(self.spec)}

    @functools.cached_property
    def _gpu(self) -> gpus.GPU:
        """The device's facts (its SM count), read once, as tiledsl.compile read them for the proof; a
        launch emulated or prepared with no CUDA at all (the runtime's tests with stand-in kernels)
        assumes the default GPU's."""
        try:
            return gpus.of_launch(self.device, self.emulated)
        except LaunchError:  # no device at all
            return gpus.DEFAULT

    def _default_programs(self, copies_beside: bool) -> int:
        """Programs of a kernel when the caller names none: one an SM, and one fewer where copy-engine
        chunks run beside it. Each of those signals its waiters on this rank by a 4-byte copy within
        this GPU, which the driver runs as a kernel on an SM: with a program on every SM holding all
        its registers (sp_ag_attention at BM=128, ag_group_gemm at Mixtral's size) that copy never
        started and the kernel's waits timed out (bench/experiments/local_copy_probe.py, NOTES session
        13; session 12's residency_probe.py found the one program too many)."""
        sms = self._gpu.sms
        return max(1, sms - 1) if copies_beside else sms

    def _options(self, env) -> dict:
        try:  # emulated there is no shared memory (and bf16 runs as fp32 there, on the blocks chosen for bf16)
            options = kernel_options(self.spec, 2, gpus.DEFAULT.shared_bytes) if self.emulated else \
                kernel_options(self.spec, self._operand_bytes(), self._gpu.shared_bytes)
        except SharedMemoryError as error:
            raise LaunchError(str(error)) from None
        if self.num_warps is not None:
            options["num_warps"] = self.num_warps
        if self.num_stages is not None:
            options["num_stages"] = self.num_stages
        if self.spec.uses_nvshmem and not self.emulated:
            from tiledsl.runtime import nvshmem_device
            nvshmem_device.init_module_hook()
            options["extern_libs"] = nvshmem_device.extern_libs()
        return options

    def _operand_bytes(self) -> int:
        """Bytes of an element of the products' operands as this program runs them (declared, or overridden)."""
        return operand_bytes(self.spec, self.dtype_override)

    def _copy_ops(self, spec, env, res, views, shared) -> list:
        """A CopyOp (target, source, signals, waits, timeline row, local) for each instance in order.
        Signals are (tensor, slot) pairs when emulated and device addresses of the slots the epoch is
        copied into on a GPU; waits are (count tensor, index, count to reach, edge, and where another
        rank's tiles keep it, (that rank, its row)) when emulated and (device address, count) on a
        GPU. A wait on the stream has no bound, but the tiles it counts never hang (their own waits
        are bounded), so every count completes; on a GPU, families left out on purpose (`skip`) are
        not waited on (emulated, the wait fails by name)."""
        touched = []  # the owners of the views one instance takes, to tell a copy within this GPU

        def tensor(name, owner):
            touched.append(owner)
            if owner is None or owner == self.rank:
                return views[name]
            return self.heap.peer(shared.get(name, views[name]), owner)

        signals = res.signals.get(spec.name)
        # a waiter on this rank (a local edge) reads this rank's slot; one elsewhere, its own copy (of
        # this node: the checker refuses a wait on a copy-engine chunk from another node)
        node = [r for r in range(self.world) if self.topology.same_node(self.rank, r)]
        ranks = [] if signals is None else [self.rank] if spec.notify == "local" else \
            node if spec.notify == "node" else list(range(self.world))
        view_of = self.spec.views[spec.name]
        waits_of = self.spec.waits.get(spec.name)
        count_of = self.spec.counts(env)
        count = count_of[spec.name]
        counted_peers = {f.name: f.count_peers for f in self.spec.families}
        ops = []
        for instance in res.orders[spec.name]:
            touched.clear()
            source, target = view_of(env, tensor, instance)
            local = all(owner is None or owner == self.rank for owner in touched)
            slot = self.rank * spec.split * count + instance * spec.split
            copies = [(self._signal_view(signals, r), slot) for r in ranks]
            row = res.traces[spec.name][instance * spec.split] if self.trace else None
            # emulated, a count another rank's tiles keep is awaited (that rank runs beside this one);
            # one of this rank's tiles is complete already or never will be
            waits = [(res.counts[producer], index, expected, edge,
                      divmod(index, count_of[producer]) if counted_peers[producer]
                      and index // count_of[producer] != self.rank else None)
                     for producer, index, expected, edge in (waits_of(env, instance) if waits_of else [])
                     if producer not in self.skip or self.emulated]
            if not self.emulated:
                copies = [view.data_ptr() + view.element_size() * slot for view, slot in copies]
                waits = [(c.data_ptr() + c.element_size() * index, expected) for c, index, expected, _, _ in waits]
            ops.append(CopyOp(target, source, copies, waits, row, local))
        return ops

    def _guard_error(self, res: Resources, diag, site: int) -> Exception:
        """The error a guard site reported: a count above its cap, or an index out of its range."""
        guard = self.spec.guards[site]
        shape = res.shapes[guard.tensor]
        rank, element = int(diag[sync.DIAG_RANK]), guards.unflatten(int(diag[sync.DIAG_INSTANCE]), shape)
        bound, value = int(diag[sync.DIAG_EXPECTED]), int(diag[sync.DIAG_SEEN])
        if guard.kind == guards.CAPACITY:
            return guards.capacity_error(rank, guard.tensor, element, value, bound, guard.declared)
        return guards.index_error(rank, guard.tensor, element, value, bound, guard.target, guard.declared)

    def timelines(self) -> Timelines:
        """The last traced call's timeline rows on this rank (runtime/timeline.py): the entry's, and each
        family's apart from it (a family may be called `entry`)."""
        if not self.trace or not self._resources:
            raise RuntimeError("no traced call yet: compile with trace=True and call the program")
        res = next(reversed(self._resources.values()))
        if not self.emulated:
            torch.cuda.synchronize(self.device)
        return Timelines(res.trace_entry, dict(res.traces))

    def _signal_view(self, signals, r):
        return signals if r == self.rank else self.heap.peer(signals, r)

    def release(self, *tensors: torch.Tensor) -> None:
        """Drop the prepared calls (caller tensors, CUDA graphs, launch arguments) kept for the tensor sets
        this program was called with: all of them, or only those that hold one of `tensors` (the next
        call with any of them prepares it again)."""
        self._last_bound, self._last_calls = None, [None, None]
        if not tensors:
            dropped = list(self._calls.values())
            self._calls.clear()
        else:
            pointers = {t.data_ptr() for t in tensors}
            dropped = [self._calls.pop(k) for k in [k for k in self._calls
                                                    if any(entry[1] in pointers for entry in k[1:])]]
        templates = {id(t) for t in self._templates.values()}
        for call in dropped:
            if id(call) in templates:
                self._scrub(call)

    def reset(self) -> None:
        """Collective, on every rank: after a call failed (a ScheduleTimeout, an exception between its
        launches), put the ranks back in step. Waits for this rank's work, then with every rank zeroes
        the epochs, signals, counts and diagnostics, and drops the prepared calls and their graphs."""
        if not self.emulated:
            torch.cuda.synchronize(self.device)
        if self.heap is not None:
            self.heap.barrier()
        for res in self._resources.values():
            for value in [*res.signals.values(), *res.counts.values(), res.barrier, res.diag]:
                if value is not None:
                    value.zero_()
        if self._epoch_cell is not None:
            self._epoch_cell.zero_()
        self.epoch = 0
        self._calls.clear()
        self._templates.clear()
        self._last_bound, self._last_calls = None, [None, None]
        if self.heap is not None:
            self.heap.barrier()  # no rank starts a call before every rank's slots are zero

    # ---- deadline ------------------------------------------------------------------------------
    def check(self) -> None:
        """Wait for this rank's work and raise ScheduleTimeout if a wait gave up."""
        for res in self._resources.values():
            diag = res.diag.cpu().clone()  # on a CPU, .cpu() is the buffer itself, zeroed below
            if int(diag[sync.DIAG_FLAG]):
                res.diag.zero_()
                edge = int(diag[sync.DIAG_EDGE])
                if edge <= sync.GUARD_EDGE:
                    raise self._guard_error(res, diag, sync.GUARD_EDGE - edge)
                what = "the entry barrier" if edge == sync.BARRIER_EDGE else "the exit barrier" \
                    if edge == sync.EXIT_EDGE else f"edge {edge}: {self.spec.edges[edge]}"
                raise ScheduleTimeout(
                    f"rank {int(diag[sync.DIAG_RANK])} timed out waiting on {what} "
                    f"(waiting instance {int(diag[sync.DIAG_INSTANCE])}, expected epoch "
                    f"{int(diag[sync.DIAG_EXPECTED])}, saw {int(diag[sync.DIAG_SEEN])})")


__all__ = ["Program", "ProgramSpec", "Arg", "Kind", "TensorSpec", "FamilySpec", "GuardSpec", "LaunchError",
           "ScheduleTimeout", "DataError", "CapacityExceeded", "IndexOutOfRange", "linear", "unlinear",
           "ordered_instances", "pow2_at_least", "kernel_options", "pipeline_stages"]
