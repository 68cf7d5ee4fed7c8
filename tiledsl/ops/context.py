"""Where tiledsl.ops keeps its state: the settings, the symmetric heap of each process group (given with
`use_heap`, or opened on first use for the default group on a GPU), the library programs compiled for
it (once per heap, program, dtype and consts) and the workspaces of padded calls."""
from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from tiledsl import gpus
from tiledsl.library import program as library_program
from tiledsl.ops.shapes import Buffers, Weights
from tiledsl.runtime.specs import shared_memory_bytes, stage_budget

ENV_TUNE = "TILEDSL_OPS_TUNE"          # 0: never measure (cached choices, else the rule without timings)
ENV_CHECK = "TILEDSL_OPS_CHECK"        # 1: check every call's waits (a host synchronisation per call)
ENV_TIMER = "TILEDSL_OPS_TIMER"        # events (default) or graph: how candidates are timed on a GPU
ENV_CACHE_DIR = "TILEDSL_OPS_CACHE_DIR"  # where tuning choices are kept (default ~/.cache/tiledsl/tuning)

DECLARED = torch.bfloat16  # the dtype the library programs declare; others through dtype_override
SUPPORTED = (torch.float16, torch.bfloat16, torch.float32)
# Emulated, bf16 runs as float32: the interpreter computes bf16 `tl.dot` wrongly (run_program.py does the same).
EMULATED_COMPUTE = {torch.bfloat16: torch.float32}


@dataclass
class Settings:
    """How ops choose and run; `configure(...)` sets these, environment variables give the defaults."""
    tune: bool | None = None      # None: $TILEDSL_OPS_TUNE, else on with a GPU and off emulated
    timer: Callable | None = None  # timer(name, fn) -> seconds; None: CUDA events on a GPU, wall clock on CPU
    cache_dir: str | None = None  # None: $TILEDSL_OPS_CACHE_DIR, else ~/.cache/tiledsl/tuning
    progress: bool = True         # a progress bar on group rank 0 while a bucket is tuned
    check: bool | None = None     # None: $TILEDSL_OPS_CHECK, else each program's first call per shape

    def tuning(self, emulated: bool, tune: bool | None) -> bool:
        if tune is not None:
            return tune
        if self.tune is not None:
            return self.tune
        if os.environ.get(ENV_TUNE) is not None:
            return os.environ[ENV_TUNE].strip().lower() not in ("0", "false", "off", "no", "")
        return not emulated  # emulated timings mean nothing


@dataclass
class HeapEntry:
    """The symmetric heap serving one process group, and how its programs are compiled."""
    heap: object
    group_name: str
    emulated: bool
    consts: dict = field(default_factory=dict)  # overrides of library consts (small tiles when emulated)
    wait_timeout_s: float = 5.0
    opened_here: bool = False  # opened lazily by tiledsl.ops: reset() closes it

    @property
    def kind(self) -> str:
        return type(self.heap).__name__


class State:
    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self.settings = Settings()
        self.heaps: dict[str, HeapEntry] = {}
        self.heap_failures: dict[str, str] = {}  # group name -> why opening a heap failed (not retried)
        self.programs: dict[tuple, object] = {}
        self.first_calls: set = set()  # (program key, shapes) already called once: checked then
        self.buffers = Buffers()
        self.weights = Weights()


STATE = State()


# ---- process groups ---------------------------------------------------------------------------------

def group_name(group) -> str:
    """The name of a process group (None: the default group; a str is taken as a name already)."""
    if isinstance(group, str):
        return group
    if not dist.is_initialized():
        raise RuntimeError("tiledsl.ops needs torch.distributed initialised (init_process_group), as torch's "
                           "collectives do")
    return (group if group is not None else dist.group.WORLD).group_name


def world_size(group) -> int:
    """The size of a process group (None: the default group; a str names one), for the ops whose
    output shape depends on it: torch.compile folds dist.get_world_size of a group into a constant."""
    if isinstance(group, str):
        return world_of(group)
    return dist.get_world_size(group)


def resolve(name: str):
    from torch.distributed.distributed_c10d import _resolve_process_group
    return _resolve_process_group(name)


def world_of(name: str) -> int:
    return dist.get_world_size(resolve(name))


def is_default_group(name: str) -> bool:
    return name == dist.group.WORLD.group_name


def capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


# ---- heaps ------------------------------------------------------------------------------------------

def use_heap(heap, group=None, *, consts: dict | None = None, wait_timeout_s: float = 5.0,
             emulated: bool | None = None) -> None:
    """Serve `group` (default: the default group) with `heap`, whose ranks must be the group's. `consts`
    override library consts (such as `BM=16` for small emulated tiles); `emulated` defaults to whether
    the heap lives on the CPU. Decisions made before for this group are kept."""
    name = group_name(group)
    group_object = resolve(name)
    if (heap.world, heap.rank) != (dist.get_world_size(group_object), dist.get_rank(group_object)):
        raise ValueError(f"the heap is rank {heap.rank} of {heap.world}; the group's rank is "
                         f"{dist.get_rank(group_object)} of {dist.get_world_size(group_object)}")
    emulated = heap.device.type == "cpu" if emulated is None else emulated
    STATE.heaps[name] = HeapEntry(heap, name, emulated, dict(consts or {}), wait_timeout_s)
    STATE.heap_failures.pop(name, None)


def heap_for(name: str, device: torch.device) -> tuple[HeapEntry | None, str | None]:
    """The heap serving group `name` for tensors on `device`, or None and why none does."""
    entry = STATE.heaps.get(name)
    if entry is None:
        if name in STATE.heap_failures:
            return None, STATE.heap_failures[name]
        if device.type != "cuda":
            return None, "no symmetric heap for this group (give one with tiledsl.ops.use_heap)"
        if not is_default_group(name):
            # NVSHMEM initialises once per process, for one set of ranks: only the default group's is opened
            return None, ("no symmetric heap for this subgroup: only the default group's heap is opened "
                          "lazily (give one with tiledsl.ops.use_heap(heap, group))")
        if capturing():
            return None, "no symmetric heap yet, and none is opened during CUDA-graph capture"
        entry = _open_default_heap(name)
        if entry is None:
            return None, STATE.heap_failures[name]
    if entry.heap.device.type != device.type:
        return None, f"the tensors are on {device}, the group's heap on {entry.heap.device}"
    return entry, None


def _open_default_heap(name: str) -> HeapEntry | None:
    from tiledsl.runtime.heap import open_heap
    try:
        heap = open_heap(resolve(name))
    except Exception as error:  # noqa: BLE001 - the torch path still serves the group
        STATE.heap_failures[name] = f"opening a symmetric heap failed ({type(error).__name__}: {error})"
        warnings.warn(f"tiledsl.ops: {STATE.heap_failures[name]}; using torch collectives", stacklevel=4)
        return None
    entry = STATE.heaps[name] = HeapEntry(heap, name, emulated=False, opened_here=True)
    return entry


# ---- programs ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def library_consts(name: str) -> tuple[dict, dict]:
    """A library program's consts (tunables at their default) and its tunables' choices."""
    from tiledsl import pipeline
    schedule = pipeline.run(library_program(name), until="schedule").schedule
    return dict(schedule.consts), {k: tuple(v) for k, v in schedule.tunables.items()}


@functools.lru_cache(maxsize=None)
def const_requires(name: str) -> tuple:
    """A library program's `require` lines over consts alone (`require BR % BT == 0`), as sympy relations:
    a build at consts that break one is refused at that line."""
    from tiledsl import pipeline
    schedule = pipeline.run(library_program(name), until="schedule").schedule
    return tuple(c.holds for c in schedule.conditions
                 if c.holds.free_symbols and {s.name for s in c.holds.free_symbols} <= set(schedule.consts))


def consts_for(entry: HeapEntry | None, program: str, tunables: tuple = ()) -> dict:
    """The consts a program runs with: the library's, the heap's overrides, then the path's tunables. The
    heap's overrides are one set for every program (`BR=8` for small emulated tiles), and a program's
    requires may tie its consts together (`require BR % BT == 0` with BT = 16): an override that a
    broken require names is doubled until the requires hold, up to the library's value."""
    consts, _ = library_consts(program)
    overrides = {k: v for k, v in (entry.consts if entry else {}).items() if k in consts}
    chosen = {**consts, **overrides, **dict(tunables)}
    for name in overrides:
        while chosen[name] < consts[name] and any(name in {s.name for s in holds.free_symbols}
                                                  for holds in _broken_requires(program, chosen)):
            chosen[name] = min(2 * chosen[name], consts[name])
    return chosen


def _broken_requires(program: str, consts: dict) -> list:
    return [holds for holds in const_requires(program)
            if not bool(holds.subs({s: consts[s.name] for s in holds.free_symbols}))]


def fitted_blocks(consts: dict, element_size: int, gpu: gpus.GPU = gpus.DEFAULT, choices: dict | None = None) -> dict:
    """A product's blocks (BN, BK) made small enough for two pipeline stages and a TMA store's staging
    in the shared memory a block may take on `gpu` (the one the heap's programs launch on), at
    `element_size`: the library's blocks are chosen for bf16, and an fp32 run of them needs twice the
    room. BN goes to 128 first, then BK to 32, then BN to 64; a tunable only to one of its `choices`
    (the program refuses a build at any other: ag_gemm's BK is 64 or 128)."""
    if not {"BM", "BN", "BK"} <= consts.keys():
        return consts
    fitted, budget, choices = dict(consts), stage_budget(gpu.shared_bytes), choices or {}
    while shared_memory_bytes(fitted["BM"], fitted["BN"], fitted["BK"], True, element_size, 2) > budget:
        for name, least in (("BN", 128), ("BK", 32), ("BN", 64)):
            if fitted[name] > least and fitted[name] // 2 in choices.get(name, (fitted[name] // 2,)):
                fitted[name] //= 2
                break
        else:
            break
    return fitted


def compute_dtype(entry: HeapEntry, dtype: torch.dtype) -> torch.dtype:
    return EMULATED_COMPUTE.get(dtype, dtype) if entry.emulated else dtype


def compiled(entry: HeapEntry, program: str, dtype: torch.dtype, tunables: tuple = (), source: str | None = None,
             options: dict | None = None):
    """The library program `program` (or `source`, a variant of its text) compiled for the heap, in
    `dtype`, with its tunables set; compiled on first use."""
    gpu = gpus.of_launch(getattr(entry.heap, "device", None), entry.emulated)  # as the launcher reads it
    consts = fitted_blocks(consts_for(entry, program, tunables), dtype.itemsize, gpu, library_consts(program)[1])
    options = dict(options or {})
    key = (id(entry.heap), program, source, dtype, tuple(sorted(consts.items())), tuple(sorted(options.items())))
    if key not in STATE.programs:
        import tiledsl
        override = {} if dtype == DECLARED else {str(DECLARED).removeprefix("torch."): dtype}
        # graphs=False: a call's tensors are new at almost every call (functional ops), so the
        # runtime's own graph would seldom replay, and it must not capture inside a caller's graph
        STATE.programs[key] = tiledsl.compile(source or library_program(program), entry.heap,
                                              emulated=entry.emulated, wait_timeout_s=entry.wait_timeout_s,
                                              dtype_override=override, graphs=False, **options, **consts)
    return STATE.programs[key]


def should_check(program, shapes: tuple) -> bool:
    """Whether a call checks its waits on return (a host synchronisation on a GPU): always emulated or
    when asked, otherwise the first call of a program at each set of shapes."""
    if capturing():
        return False
    if program.emulated:
        return True
    setting = STATE.settings.check
    if setting is None:
        setting = os.environ.get(ENV_CHECK, "0").strip() not in ("0", "", "false", "off")
    if setting:
        return True
    key = (id(program), shapes)
    if key in STATE.first_calls:
        return False
    STATE.first_calls.add(key)
    return True
