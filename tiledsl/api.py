"""`tiledsl.compile`: a .tds program to a callable bound to this rank."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

from tiledsl import gpus, pipeline
from tiledsl.cache import cache_dir


def build_module(source, consts: dict | None = None, gpu: gpus.GPU | str | None = None):
    """Generate, write and import the module of a program (Triton reads kernel source from files), its
    programs' residency proven for `gpu` (tiledsl.gpus; the default H200)."""
    compilation = pipeline.run(source, until="module", consts=consts, gpu=gpu)
    text = compilation.module
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    name = f"tds_{compilation.program.name.id}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    path = cache_dir() / f"{name}.py"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return load_built(path)


def load_built(path):
    """Import a module that `build_module` wrote, by its path: emulated ranks load what their parent
    built instead of each running the pipeline again."""
    path = Path(path)
    name = path.stem
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def compile(source, heap=None, *, emulated: bool | None = None, wait_timeout_s: float = 5.0,  # noqa: A001
            dtype_override: dict | None = None, num_sms: int | None = None, skip: tuple = (), replay: bool = True,
            graphs: bool = True, num_warps: int | None = None, fold_entry: bool = True, trace: bool = False,
            num_stages: int | None = None, **consts):
    """Compile a program (a path to a .tds file, or its text) and bind it to this rank.

    `heap` is the symmetric heap shared with the other ranks (`tiledsl.runtime.heap.open_heap()` under
    torchrun); `consts` override the program's consts and tunables (`BK=128`). The result is called
    with the program's in/out/inout tensors and returns its out/inout tensors. A wait that runs past
    `wait_timeout_s` raises ScheduleTimeout naming the rank, edge and epoch.

    On a GPU the first call with a set of tensors launches through Triton's JIT; the second records
    the call in a CUDA graph (with staged inputs, one per staging buffer), which later calls replay (`graphs=False`: relaunch the compiled kernels
    directly instead; `replay=False` too: every launch through the JIT, to compare or to rule the
    fast paths out). `num_warps` overrides the warps per program (8 with a matrix product or a
128-row block, else 4), `num_stages` the software pipeline's depth of the loops that may be pipelined.
    The persistent kernel passes the entry barrier itself unless copy-engine chunks need the epoch
    first (`fold_entry=False`: a separate entry kernel every call, to compare). `trace=True` stamps
    every instance's start, end of waits and end on the GPU clock (tiledsl.runtime.timeline; a Perfetto
    trace and a PNG of every rank's lanes: tiledsl.tools.trace); without it the stamps are compiled out.
    The checker proves that the kernel's programs can all be resident at once on the device it will
    launch on (`launch_gpu`: that device's SM count), and refuses by name a program whose could not."""
    module = build_module(source, consts, launch_gpu(heap, emulated))
    return module.tds_load(heap=heap, emulated=emulated, wait_timeout_s=wait_timeout_s,
                       dtype_override=dtype_override, num_sms=num_sms, skip=skip, replay=replay,
                       graphs=graphs, num_warps=num_warps, fold_entry=fold_entry, trace=trace,
                       num_stages=num_stages)


def launch_gpu(heap=None, emulated: bool | None = None) -> gpus.GPU:
    """The GPU a program compiled here will launch on, which the checker proves its residency for: the
    heap's device, else the current CUDA device, read as the launcher reads it (gpus.of_launch); the
    default GPU emulated or with no CUDA. A device too small fails at compile time, by name, rather
    than at the first launch."""
    if emulated is None:
        from tiledsl.runtime import sync
        emulated = sync.EMULATED
    return gpus.of_launch(getattr(heap, "device", None), emulated)


def empty(shape, dtype=None, heap=None):
    """A tensor on the symmetric heap (collective: every rank calls with the same shape and dtype, in the
    same order), for inputs peers read: a program reads it where it is instead of copying it into the
    heap at each call (`allreduce_out.tds`, `AllReduce(heap)(x, out=y)`), and waits at an exit barrier
    instead, so that the caller may overwrite it as soon as the call returns."""
    import torch
    if heap is None:
        raise ValueError("tiledsl.empty needs the symmetric heap to allocate on: empty(shape, dtype, heap=heap)")
    return heap.alloc(tuple(shape) if not isinstance(shape, int) else (shape,), dtype or torch.bfloat16)
