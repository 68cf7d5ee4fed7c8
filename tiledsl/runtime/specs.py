"""What a generated module declares about itself, in one object (`ProgramSpec`: its kernel, the kernel's
arguments, tensors, families, guards, edges and host functions); the launch arithmetic that code
generation and the launcher share (pipeline stages, warps, power-of-two blocks, instance numbering and
order); and TMA's row rule that both judge by."""
from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tiledsl.tables import DTYPES

SHARED_MEMORY_BYTES = 220 * 1024  # per SM on Hopper, less what Triton keeps for itself
SHARED_MEMORY_LIMIT = 227 * 1024  # what one block may take on Hopper: the driver refuses a launch above it


class Kind(str, enum.Enum):
    """What a kernel argument is; the launcher fills each kind its own way."""
    TENSOR = "tensor"              # a tensor's data: the caller's, or one the program owns (symm, local)
    PEERS = "peers"                # element offsets from a tensor to each rank's copy of it (int64[world])
    SIGNALS = "signals"            # a family's signal slots, [world, slots] epochs
    SIGNAL_PEERS = "signal_peers"  # element offsets from the signals to each rank's copy
    ORDER = "order"                # a family's instance numbers in the order it runs them (int32)
    COUNT = "count"                # a family's instances done per first index (the copy engine waits on it)
    COUNT_PEERS = "count_peers"    # element offsets from the counts to each rank's copy (copy engines elsewhere wait)
    DESCRIPTOR = "descriptor"      # a TMA descriptor: a product's operand or target
    SIZE = "size"                  # a param, `rank` or `world`
    EPOCH_CELL = "epoch_cell"      # [this call's epoch, programs finished] (int32)
    DIAG = "diag"                  # where a wait that gives up records rank, edge, instance and epochs
    MAX_SPINS = "max_spins"        # a wait's bound, in reads of its slot
    BARRIER = "barrier"            # the entry barrier's slots, one per rank (per rank of the node, then per node)
    BARRIER_PEERS = "barrier_peers"
    # element offsets to each PE's copy of a tensor, signals or barrier that NVSHMEM reaches: read only by
    # the emulator's stand-ins of NVSHMEM calls (on a GPU, NVSHMEM addresses a PE by itself)
    SHMEM = "shmem"
    SIGNAL_SHMEM = "signal_shmem"
    BARRIER_SHMEM = "barrier_shmem"
    CONST = "const"                # a compile-time size (constexpr)
    BLOCK = "block"                # a launch-time power-of-two block (constexpr)
    # the kernel's roles in this launch (constexprs: a role it does not play is compiled out)
    RUN = "run"                    # whether it runs the family `of` (False: left out, or another launch's)
    ENTER = "enter"                # whether it is the call's entry itself (no entry launch before it)
    EXIT = "exit"                  # whether it ends with a barrier of every rank (peers read inputs in place)
    TRACING = "tracing"            # whether it stamps a timeline
    # a family's spread over the kernel's programs: run-time ints, so that one compile serves every size
    # and world (they change with both)
    START = "start"                # the family's first program
    PROGRAMS = "programs"          # how many programs it has
    TRACE = "trace"                # a family's timeline rows (timeline.py), or the entry's: int64 [instances, 4]


ROLES = (Kind.RUN, Kind.ENTER, Kind.EXIT, Kind.TRACING)
SPREAD = (Kind.START, Kind.PROGRAMS)
CONSTEXPR = (Kind.CONST, Kind.BLOCK, *ROLES)
LAUNCHER_SET = (*ROLES, *SPREAD)  # `role_values` and `Spread.values` give these, not the call's tensors


@dataclass(frozen=True)
class Arg:
    """One argument of a generated kernel (codegen/interface.py describes them all, once)."""
    name: str
    kind: Kind
    of: str | None = None               # the tensor or family it belongs to
    dtype: str | None = None            # element dtype of a pointer or descriptor (a tables.DTYPES name)
    block: tuple[int, ...] = ()         # a descriptor's block shape

    def __post_init__(self):
        object.__setattr__(self, "kind", Kind(self.kind))

    @property
    def constexpr(self) -> bool:
        return self.kind in CONSTEXPR


@dataclass(frozen=True)
class TensorSpec:
    name: str
    role: str
    dtype: str
    staged: bool
    peers: bool
    where: str


@dataclass(frozen=True)
class FamilySpec:
    name: str
    kind: str
    engine: str
    programs: int | None
    notify: str | None
    split: int
    ordered: bool
    matmul: bool
    counted: bool = False  # instances add one to a count per first index (copy-engine chunks wait on it)
    # ... in every rank's copy of the counts, [world, instances] on the heap: a copy engine elsewhere waits
    count_peers: bool = False
    warps: int = 4         # warps its largest block needs in registers (codegen/blocks.py)
    # its signal slots' dtype, the kernel's (codegen/interface.py: signal_dtype); None where it notifies none
    signal_dtype: str | None = None

    def slots(self, count: int) -> int:
        """Signal slots of one rank's row: one per instance part (at least one: a family may have no
        instance at this world). Slot `instance * split + part` is that part's, single writer."""
        return max(1, count * self.split)


@dataclass(frozen=True)
class GuardSpec:
    """What a guard site reports: a kernel that reports site n gives -3 - n as the edge of its diagnostics."""
    kind: str             # guards.CAPACITY or guards.INDEX
    tensor: str           # the tensor whose element broke its bound
    target: str | None    # what the bound belongs to (a tensor, `histogram()`)
    declared: str         # the declaration, with its .tds position


def no_table(env: dict) -> dict:
    """The blocks or orders of a program with no launch-time blocks or no ordered family."""
    return {}


@dataclass(frozen=True, eq=False)
class ProgramSpec:
    """Everything a generated module tells the runtime and the tools (`module.tds_SPEC`, read through
    `spec_of`): what code generation decided, as data, so that the launcher, graph replay, emulation,
    the trace and the builds for an arch decide none of it again. The host functions take the launch
    environment (params, consts, `rank`, `world`, and `nodes`, `local_world` where the program spans
    nodes)."""
    kernel: object                     # the persistent @triton.jit kernel that runs every family on the SMs
    args: tuple[Arg, ...]              # the kernel's arguments, once: signature, launch, AOT and replay follow
    tensors: tuple[TensorSpec, ...]
    families: tuple[FamilySpec, ...]
    edges: tuple[str, ...]             # each edge's .tds text, by the number a timed-out wait reports
    params: tuple[str, ...]            # sizes read off the caller's tensors
    consts: Mapping[str, int]
    infer_params: Callable[[dict, int], dict]   # (caller tensors' shapes, world) -> the params
    tensor_shapes: Callable[[dict], dict]       # env -> every tensor's shape
    conditions: Callable[[dict], list]          # env -> [(holds, message)]: the launch conditions
    counts: Callable[[dict], dict]              # env -> each family's instances
    blocks: Callable[[dict], dict] = no_table   # env -> launch-time constexpr blocks, by argument name
    orders: Callable[[dict], dict] = no_table   # env -> each ordered family's instances in their order
    # a copy-engine family's (env, tensor(name, owner), instance) -> (source, target) views
    views: Mapping[str, Callable] = field(default_factory=dict)
    # ... and (env, instance) -> [(producer, index of its count, count to reach, edge)], where it waits
    waits: Mapping[str, Callable] = field(default_factory=dict)
    guards: tuple[GuardSpec, ...] = ()
    distributed: bool = False          # it reaches other ranks: an entry barrier, a symmetric heap
    uses_nvshmem: bool = False         # linked with NVSHMEM's device library
    spans_nodes: bool = False          # written for several nodes: it may run on any topology
    device_descriptors: bool = False   # TMA descriptors made on the device: scratch through triton.set_allocator

    @property
    def entry_trace(self) -> str:
        """The kernel argument that holds the entry's timeline row (the trace's origin)."""
        return next(a.name for a in self.args if a.kind is Kind.TRACE and a.of is None)


def spec_of(module) -> ProgramSpec:
    """A generated module's contract with the runtime and the tools."""
    return module.tds_SPEC


# ---- the arguments the launch gives (LAUNCHER_SET), by kind ----------------------------------------

def role_values(spec: ProgramSpec, *, run, enter: bool, exit: bool, tracing: bool) -> dict[str, bool]:
    """The kernel's roles by argument name: RUN of each family in `run` (names), ENTER, EXIT, TRACING.
    What each argument is comes from its kind in the spec, never from its name."""
    plays = {Kind.ENTER: enter, Kind.EXIT: exit, Kind.TRACING: tracing}
    return {a.name: a.of in run if a.kind is Kind.RUN else plays[a.kind] for a in spec.args if a.kind in ROLES}


@dataclass(frozen=True)
class Spread:
    """Which programs of the grid run each family the kernel runs: a fixed `sms(N)` family a range of
    its own (at most one program an instance part), the `sms(rest)` families the programs left, shared."""
    start: Mapping[str, int]     # each family's first program
    programs: Mapping[str, int]  # ... and how many it has
    grid: int                    # the programs the kernel launches
    rest: int                    # the programs the `sms(rest)` families share (0 where none has an instance)
    shared: tuple[str, ...]      # the `sms(rest)` families

    @property
    def fixed(self) -> dict[str, int]:
        """The `sms(N)` families and the programs each takes."""
        return {name: n for name, n in self.programs.items() if name not in self.shared}

    def values(self, spec: ProgramSpec) -> dict[str, int]:
        """The START and PROGRAMS arguments by name."""
        return {a.name: (self.start if a.kind is Kind.START else self.programs)[a.of]
                for a in spec.args if a.kind in SPREAD}


def spread(spec: ProgramSpec, counts: Mapping[str, int], sms: int) -> Spread:
    """The families' spread over `sms` programs, for the instances `counts` gives (spec.counts)."""
    kernel = [f for f in spec.families if f.engine != "copy_engine"]
    start, programs, first = {}, {}, 0
    for f in kernel:
        if f.programs is not None:
            start[f.name], programs[f.name] = first, max(1, min(f.programs, counts[f.name] * f.split))
            first += programs[f.name]
    shared = tuple(f.name for f in kernel if f.programs is None)
    rest = min(max(1, sms - first), max([counts[f.name] * f.split for f in kernel if f.programs is None] or [0]))
    for name in shared:
        start[name], programs[name] = first, rest
    return Spread(start, programs, first + (rest if shared else 0), rest, shared)


def alone(spec: ProgramSpec) -> Spread:
    """The spread of a launch that runs one family at a time (emulated): one program, the first, for each."""
    kernel = [f.name for f in spec.families if f.engine != "copy_engine"]
    return Spread(dict.fromkeys(kernel, 0), dict.fromkeys(kernel, 1), 1, 1, tuple(kernel))


def pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def linear(index: tuple, extents: tuple) -> int:
    out = 0
    for i, e in zip(index, extents):
        out = out * e + i
    return out


def unlinear(number: int, extents: tuple) -> tuple:
    out = []
    for e in reversed(extents):
        out.append(number % e)
        number //= e
    return tuple(reversed(out))


STAGES = "STAGES"  # a program's const naming the pipeline depth of its tiles' loops (see kernel_options)


def operand_bytes(spec: ProgramSpec, dtype_override: dict | None = None) -> int:
    """Bytes of an element of the products' operands as the program runs them (declared, or through
    `dtype_override`, declared name -> torch dtype): what kernel_options sizes the pipeline stages by."""
    import torch
    override = dtype_override or {}
    return max((override.get(a.dtype, getattr(torch, a.dtype)).itemsize
                for a in spec.args if a.kind is Kind.DESCRIPTOR), default=2)


def kernel_options(spec: ProgramSpec, element_size: int = 2, shared_bytes: int = SHARED_MEMORY_LIMIT) -> dict:
    """num_warps and num_stages: a product gets 8 warps and as many pipeline stages (2 to 4) as shared
    memory holds next to the staging of its TMA-stored block, for operands of `element_size` bytes (2:
    the bf16 a program declares; 4 when it runs in fp32). Blocks that leave room for fewer than two
    stages are refused here, by name, rather than by the driver at the first launch. Tiles written as
    blocks get the warps their largest block needs (4 or 8) and 2 stages, or the program's const
    `STAGES`: the pipeline depth its author measured best (sp_ag_attention's 128-row tiles took 3.20
    against 4.01 ms on 3 stages rather than 2; bench/NOTES.md, session 12). `shared_bytes` is what a
    block may take on the GPU it runs on (tiledsl.gpus: the device's, at launch; Hopper's 227 KB)."""
    descriptors = {a.name: a for a in spec.args if a.kind is Kind.DESCRIPTOR}
    products = [f.name for f in spec.families if f.matmul]
    if not products:
        # one kernel runs every family: as many warps as the most demanding tile needs
        return {"num_warps": max([4] + [f.warps for f in spec.families]),
                "num_stages": int(spec.consts.get(STAGES, 2))}
    stages = []
    for f in products:
        # the last two dimensions of each block (an N-D operand's others are 1)
        (block_m, block_k), block_n = descriptors[f"tds_desc_{f}_a"].block[-2:], descriptors[f"tds_desc_{f}_b"].block[-1]
        tma_store = f"tds_desc_{f}_c" in descriptors
        least = shared_memory_bytes(block_m, block_n, block_k, tma_store, element_size, 2)
        if least > shared_bytes:
            raise SharedMemoryError(
                f"{f}: blocks [{block_m}, {block_k}] x [{block_k}, {block_n}] of {element_size}-byte elements need "
                f"{least} bytes of shared memory for two pipeline stages{' and the staging of a TMA store' * tma_store},"
                f" more than the {shared_bytes} a block may take on this GPU: compile with a smaller BK or BN "
                "(tiledsl.ops picks them for fp32)")
        stages.append(max(2, pipeline_stages(block_m, block_n, block_k, tma_store, element_size,
                                             stage_budget(shared_bytes))))
    return {"num_warps": 8, "num_stages": min(stages)}


class SharedMemoryError(ValueError):
    """A product's blocks do not fit in shared memory at the element size it runs with."""


def stage_budget(shared_bytes: int = SHARED_MEMORY_LIMIT) -> int:
    """Shared memory a product's pipeline stages and staging may fill on a GPU whose blocks may take
    `shared_bytes` (tiledsl.gpus): what Triton keeps for itself comes off the device's as off Hopper's,
    and no more than on Hopper is counted on (220 KB of its 227)."""
    return min(SHARED_MEMORY_BYTES, shared_bytes - (SHARED_MEMORY_LIMIT - SHARED_MEMORY_BYTES))


def shared_memory_bytes(block_m: int, block_n: int, block_k: int, tma_store: bool, element_size: int,
                        stages: int) -> int:
    """Shared memory of `stages` pipeline stages of [BM, BK] and [BK, BN] blocks, and the [BM, BN]
    staging of a TMA-stored block."""
    return stages * (block_m * block_k + block_k * block_n) * element_size + \
        (block_m * block_n * element_size if tma_store else 0)


def pipeline_stages(block_m: int, block_n: int, block_k: int, tma_store: bool, element_size: int = 2,
                    budget: int = SHARED_MEMORY_BYTES) -> int:
    """Pipeline stages of [BM, BK] and [BK, BN] blocks that fit in `budget` bytes of shared memory (at
    most 4) next to the [BM, BN] staging of a TMA-stored block. Code generation uses a TMA store only
    where 2 fit in bf16."""
    stage_bytes = shared_memory_bytes(block_m, block_n, block_k, False, element_size, 1)
    staging = shared_memory_bytes(block_m, block_n, block_k, tma_store, element_size, 0)
    return min(4, (budget - staging) // stage_bytes)


def ordered_instances(extents, key) -> list[int]:
    """Instance numbers sorted by `key(*index)`: the order a family runs its instances in."""
    return [linear(index, tuple(extents))
            for index in sorted(itertools.product(*map(range, extents)), key=lambda i: key(*i))]


# ---- TMA's row rule -------------------------------------------------------------------------------
# A tensor read or written through a TMA descriptor needs rows (its last dimension) of a multiple of 16
# bytes and a 16-byte aligned start: cuTensorMapEncodeTiled refuses anything else, and Triton asserts
# "strides must be 16-byte aligned". Which tensors go through descriptors is code generation's choice
# (codegen/tma.py: `described`, and `row_conditions` for the sizes the checker and `tiledsl run` choose
# or accept); the rule itself, and the launcher's refusal (validate.py), are here.

ROW_BYTES = 16  # a descriptor's row stride and start address: multiples of this


def row_multiple(itemsize: int) -> int:
    """The elements a TMA-read row must be a multiple of (8 for bf16, 4 for float32, 16 for fp8)."""
    return ROW_BYTES // math.gcd(ROW_BYTES, itemsize)


def rows_fit(columns: int, itemsize: int) -> bool:
    return columns * itemsize % ROW_BYTES == 0


def row_refusal(tensor: str, where: str, columns: int, dtype: str, declared: str) -> str:
    """The launcher's message for rows of `columns` elements of `dtype` (a tables.DTYPES name, the
    tensor's own; `declared` where the program declares another, run through a dtype override)."""
    itemsize = DTYPES[dtype].torch.itemsize
    running = f"; the program declares {declared}" if declared != dtype else ""
    return (f"tensor '{tensor}' ({where}): its rows are {columns * itemsize} bytes ({columns} x {dtype}{running}); "
            f"it is read or written through a TMA descriptor, which needs rows of a multiple of {ROW_BYTES} "
            f"bytes: pad the last dimension to a multiple of {row_multiple(itemsize)}, or call tiledsl.ops, "
            "which pads")
