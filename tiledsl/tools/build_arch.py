"""`tiledsl build FILE --arch sm_90`: every kernel of a program compiled for an architecture on any
machine (codegen/aot.py), its resource table, and the positioned errors of a kernel that cannot be
compiled (a block over Triton's element limit) or launched (shared memory), at the tile responsible."""
from __future__ import annotations

import re

from tiledsl import gpus, pipeline
from tiledsl.api import build_module
from tiledsl.codegen.aot import PARAM_AT_BUILD, build_env, compile_kernel, report
from tiledsl.diagnostics import TdsError, error
from tiledsl.runtime.specs import spec_of


def compile_report(source, arch: str = "sm_90", consts: dict | None = None) -> str:
    """`tiledsl build FILE --arch sm_90`: compile every kernel and return the table as text."""
    row = checked_report(source, build_module(source, consts), arch, consts)
    header = f"{'kernel':40} {'regs':>5} {'smem':>8} {'spills':>7} {'HGMMA':>6} {'cubin':>8}"
    hgmma = str(row.hgmma) if row.sass else "n/a"
    line = f"{row.name:40} {row.registers:5d} {row.shared_bytes:8d} {row.spill_bytes:7d} {hgmma:>6} {row.cubin_bytes:8d}"
    return f"{header}\n{line}\n(arch {arch})"


def checked_report(source, module, arch: str = "sm_90", consts: dict | None = None):
    """The resource table (aot.report) of `module`, built from `source`, for `arch`; a kernel that cannot be
    compiled (a block over Triton's element limit) or launched (shared memory) is a TdsError at the tile
    responsible. What `tiledsl build --arch` reports, and what the generated bodies' compiles judge."""
    try:
        row = report(module, arch)
    except Exception as why:  # noqa: BLE001 - only Triton's element limit is ours to word; the rest re-raises
        if _too_many_elements(why) is None:
            raise
        raise _block_too_large(source, module, arch, consts) from why
    if row.shared_bytes > gpus.for_arch(arch).shared_bytes:
        raise _too_much_shared_memory(source, module, arch, consts, row.shared_bytes)
    return row


NUMEL = re.compile(r"numel \((\d+)\) exceeds triton maximum tensor numel \((\d+)\)")


def _too_many_elements(why: BaseException) -> tuple[int, int] | None:
    """(elements, limit) where Triton refused a block over TRITON_MAX_TENSOR_NUMEL (2**20), anywhere in
    the chain of causes (the CompilationError wraps the ValueError)."""
    while why is not None:
        found = NUMEL.search(str(why))
        if found:
            return int(found.group(1)), int(found.group(2))
        why = why.__cause__ or why.__context__
    return None


def _block_too_large(source, module, arch: str, consts):
    """The error of a tile whose block holds more elements than one Triton tensor may (a block over a
    whole dimension, `K.T` across a 4096-long sequence), at that tile: each tile compiled alone."""
    done = pipeline.run(source, until="check", consts=consts)
    spec = spec_of(module)
    found = {}
    for family in spec.families:
        if family.kind != "tile":
            continue
        try:
            compile_kernel(module, arch, only=family.name)
        except Exception as why:  # noqa: BLE001 - as above
            found[family.name] = _too_many_elements(why)
            if found[family.name] is None:
                raise
    name = next(iter(found), None)
    elements, limit = found[name] if name else (None, 1 << 20)
    family = done.schedule.families.get(name)
    blocks = [str(v) for k, v in spec.blocks(build_env(spec)).items() if name and k.startswith(f"tds_BLOCK_{name}_")]
    sizes = ", ".join(f"{p}={PARAM_AT_BUILD}" for p in spec.params)
    what = (f"tile '{name}' holds a block of {elements} elements (its blocks {' x '.join(blocks)} at {sizes})"
            if family is not None else "a block of the kernel is too large")
    span = family.span if family is not None else done.schedule.program.name.span
    return TdsError([error(f"{what}, more than the {limit} elements one Triton tensor may hold "
                           f"(TRITON_MAX_TENSOR_NUMEL): the kernel cannot be compiled", span,
                           "a block over a whole dimension (`K.T`, `X[i*B : +B, :]`) holds all of it at once; "
                           "loop over that dimension in steps (`for k in cdiv(S, BK):`) with blocks of BK")],
                    done.path, done.source)


def _too_much_shared_memory(source, module, arch: str, consts, total: int):
    """The error of a kernel that cannot launch for its shared memory, at the tile that takes the most
    (each tile's own compile: a kernel holds the largest of its families' needs)."""
    done = pipeline.run(source, until="check", consts=consts)
    families = {f.name: f for f in spec_of(module).families}
    tiles = [name for name, f in families.items() if f.kind == "tile"]
    need = {name: total if len(tiles) == 1 else int(compile_kernel(module, arch, only=name).metadata.shared)
            for name in tiles}
    worst = max(need, key=need.get) if need else None
    family = done.schedule.families.get(worst)
    product = family is not None and families[worst].matmul
    hint = ("smaller blocks: a smaller BK or BN (-D BK=64)" if product else
            "smaller blocks, or split K: a block that reads a whole dimension (`A[i*BM : +BM, :]`) holds all of it "
            "at once; loop over it in steps: `acc = 0`, `for k in cdiv(K, BK):`, "
            "`acc = acc + A[i*BM : +BM, k*BK : +BK] @ B[k*BK : +BK, j*BN : +BN]`")
    what = f"tile '{worst}' needs {need[worst]} bytes" if family is not None else f"the kernel needs {total} bytes"
    span = family.span if family is not None else done.schedule.program.name.span
    gpu = gpus.for_arch(arch)
    return TdsError([error(f"{what} of shared memory on {arch}, more than the {gpu.shared_bytes} one block may use "
                           f"on {gpu.name}: the kernel could not launch", span, hint)], done.path, done.source)
