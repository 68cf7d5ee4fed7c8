"""What a generated module declares about itself (its kernel's arguments, tensors and families), and
the launch arithmetic that code generation and the launcher share (pipeline stages, warps,
power-of-two blocks, instance numbering and order), and TMA's row rule that both judge by."""
from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass

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
    ROLE = "role"                  # which programs run which family, and whether the kernel is the entry
    TRACE = "trace"                # a family's timeline rows (timeline.py), or the entry's: int64 [instances, 4]


CONSTEXPR = (Kind.CONST, Kind.BLOCK, Kind.ROLE)


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


def host_table(module, name: str, env: dict) -> dict:
    """`module.tds_blocks(env)` or `module.tds_orders(env)`: a program with no launch-time blocks or no
    ordered family defines no such function, and has none."""
    function = getattr(module, name, None)
    return {} if function is None else function(env)


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


def operand_bytes(module, dtype_override: dict | None = None) -> int:
    """Bytes of an element of the products' operands as the program runs them (declared, or through
    `dtype_override`, declared name -> torch dtype): what kernel_options sizes the pipeline stages by."""
    import torch
    override = dtype_override or {}
    return max((override.get(a.dtype, getattr(torch, a.dtype)).itemsize
                for a in module.tds_ARGS if a.kind is Kind.DESCRIPTOR), default=2)


def kernel_options(module, element_size: int = 2) -> dict:
    """num_warps and num_stages: a product gets 8 warps and as many pipeline stages (2 to 4) as shared
    memory holds next to the staging of its TMA-stored block, for operands of `element_size` bytes (2:
    the bf16 a program declares; 4 when it runs in fp32). Blocks that leave room for fewer than two
    stages are refused here, by name, rather than by the driver at the first launch. Tiles written as
    blocks get the warps their largest block needs (4 or 8) and 2 stages, or the program's const
    `STAGES`: the pipeline depth its author measured best (sp_ag_attention's 128-row tiles took 3.20
    against 4.01 ms on 3 stages rather than 2; bench/NOTES.md, session 12)."""
    descriptors = {a.name: a for a in module.tds_ARGS if a.kind is Kind.DESCRIPTOR}
    products = [f.name for f in module.tds_FAMILIES if f.matmul]
    if not products:
        # one kernel runs every family: as many warps as the most demanding tile needs
        return {"num_warps": max([4] + [getattr(f, "warps", 4) for f in module.tds_FAMILIES]),
                "num_stages": int(module.tds_CONSTS.get(STAGES, 2))}
    stages = []
    for f in products:
        # the last two dimensions of each block (an N-D operand's others are 1)
        (block_m, block_k), block_n = descriptors[f"tds_desc_{f}_a"].block[-2:], descriptors[f"tds_desc_{f}_b"].block[-1]
        tma_store = f"tds_desc_{f}_c" in descriptors
        least = shared_memory_bytes(block_m, block_n, block_k, tma_store, element_size, 2)
        if least > SHARED_MEMORY_LIMIT:
            raise SharedMemoryError(
                f"{f}: blocks [{block_m}, {block_k}] x [{block_k}, {block_n}] of {element_size}-byte elements need "
                f"{least} bytes of shared memory for two pipeline stages{' and the staging of a TMA store' * tma_store},"
                f" more than the {SHARED_MEMORY_LIMIT} an H100/H200 SM offers: compile with a smaller BK or BN "
                "(tiledsl.ops picks them for fp32)")
        stages.append(max(2, pipeline_stages(block_m, block_n, block_k, tma_store, element_size)))
    return {"num_warps": 8, "num_stages": min(stages)}


class SharedMemoryError(ValueError):
    """A product's blocks do not fit in shared memory at the element size it runs with."""


def shared_memory_bytes(block_m: int, block_n: int, block_k: int, tma_store: bool, element_size: int,
                        stages: int) -> int:
    """Shared memory of `stages` pipeline stages of [BM, BK] and [BK, BN] blocks, and the [BM, BN]
    staging of a TMA-stored block."""
    return stages * (block_m * block_k + block_k * block_n) * element_size + \
        (block_m * block_n * element_size if tma_store else 0)


def pipeline_stages(block_m: int, block_n: int, block_k: int, tma_store: bool, element_size: int = 2) -> int:
    """Pipeline stages of [BM, BK] and [BK, BN] blocks that fit in shared memory (at most 4) next to
    the [BM, BN] staging of a TMA-stored block. Code generation uses a TMA store only where 2 fit in bf16."""
    stage_bytes = shared_memory_bytes(block_m, block_n, block_k, False, element_size, 1)
    staging = shared_memory_bytes(block_m, block_n, block_k, tma_store, element_size, 0)
    return min(4, (SHARED_MEMORY_BYTES - staging) // stage_bytes)


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
