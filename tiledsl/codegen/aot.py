"""Ahead-of-time compilation of a generated module's kernel for a GPU architecture, on any machine
(Triton compiles to cubin without a GPU), with a resource table: registers, shared memory, spills,
and whether the matrix products became Hopper's wgmma (HGMMA in the SASS)."""
from __future__ import annotations

import inspect
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

TL_TYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64", "int32": "i32",
            "int64": "i64", "int8": "i8", "uint8": "u8"}


@dataclass
class KernelReport:
    name: str
    registers: int
    shared_bytes: int
    spill_bytes: int
    hgmma: int          # HGMMA instructions in the SASS (0 where cuobjdump is missing: see `sass`)
    sass: bool          # whether the SASS could be read
    cubin_bytes: int


def arch_number(arch: str) -> int:
    match = re.fullmatch(r"sm_?(\d+)a?", arch)
    if not match:
        raise ValueError(f"unknown architecture {arch!r}; expected e.g. sm_90")
    return int(match.group(1))


def compile_kernel(module, arch: str = "sm_90", sizes: dict | None = None, dtype: str | None = None):
    """Compile `module.tds_kernel` for `arch` with every family enabled; returns Triton's CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = module.tds_kernel
    params = list(inspect.signature(fn.fn).parameters)
    tensors = {t.name: t for t in module.tds_TENSORS}
    families = {f.name: f for f in module.tds_FAMILIES}
    env = {"rank": 0, "world": 4, **module.tds_CONSTS, **{p: 4096 for p in module.tds_PARAMS}, **(sizes or {})}
    blocks = module.tds_blocks(env)
    matmuls = module.tds_matmuls(env)
    signature, constexprs = {}, {}
    for name in params:
        if name in tensors:
            signature[name] = "*" + TL_TYPES[dtype or tensors[name].dtype]
        elif name.startswith("tds_peers_"):
            signature[name] = "*i64"
        elif name.startswith("tds_sig_"):
            producer = families[name[8:]]
            signature[name] = "*i64" if producer.engine == "nvshmem" else "*i32"
        elif name.startswith(("tds_order_", "tds_count_")) or name in ("tds_diag", "tds_epoch_cell", "tds_barrier"):
            signature[name] = "*i32"
        elif name.startswith("tds_desc_"):
            family, side = name[9:].rsplit("_", 1)
            left, right, bm, bn, bk, target = matmuls[family]
            operand, shape = {"a": (left, [bm, bk]), "b": (right, [bk, bn]), "c": (target, [bm, bn])}[side]
            signature[name] = f"tensordesc<{TL_TYPES[dtype or tensors[operand].dtype]}[{shape[0]},{shape[1]}]>"
        elif name in module.tds_CONSTS:
            constexprs[name] = module.tds_CONSTS[name]
        elif name in blocks:
            constexprs[name] = blocks[name]
        elif name.startswith("tds_RUN_") or name == "tds_ENTER":
            constexprs[name] = True
        elif name.startswith("tds_START_"):
            constexprs[name] = 0
        elif name.startswith("tds_PROGRAMS_"):
            constexprs[name] = 132
        else:
            signature[name] = "i32"
    for name in constexprs:
        signature[name] = "constexpr"
    from tiledsl.runtime.specs import kernel_options
    options = kernel_options(module, env)
    if module.tds_USES_NVSHMEM:
        from tiledsl.runtime import nvshmem_device
        options["extern_libs"] = tuple(nvshmem_device.extern_libs(arch_number(arch)).items())
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", arch_number(arch), 32), options=options)


def _cuobjdump() -> str | None:
    try:
        from triton.backends.nvidia import compiler
        path = os.path.join(os.path.dirname(compiler.__file__), "bin", "cuobjdump")
        return path if os.path.exists(path) else None
    except ImportError:
        return None


def report(module, arch: str = "sm_90", sizes: dict | None = None) -> KernelReport:
    kernel = compile_kernel(module, arch, sizes)
    cubin = kernel.asm["cubin"]
    hgmma, sass, registers, spills = 0, False, 0, 0
    tool = _cuobjdump()
    if tool:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
            handle.write(cubin)
            handle.flush()
            dump = subprocess.run([tool, "--dump-sass", handle.name], capture_output=True, text=True, check=False)
            usage = subprocess.run([tool, "--dump-resource-usage", handle.name], capture_output=True, text=True,
                                   check=False)
        if dump.returncode == 0:
            sass = True
            hgmma = dump.stdout.count("HGMMA")
        found = re.search(r"REG:(\d+).*?LOCAL:(\d+)", usage.stdout)
        if found:
            registers, spills = int(found.group(1)), int(found.group(2))
    return KernelReport(name=f"{module.__name__}.tds_kernel", registers=registers,
                        shared_bytes=int(kernel.metadata.shared), spill_bytes=spills,
                        hgmma=hgmma, sass=sass, cubin_bytes=len(cubin))


def compile_report(source, arch: str = "sm_90", consts: dict | None = None) -> str:
    """`tiledsl build FILE --arch sm_90`: compile every kernel and return the table as text."""
    from tiledsl.api import build_module
    module = build_module(source, consts)
    row = report(module, arch)
    header = f"{'kernel':40} {'regs':>5} {'smem':>8} {'spills':>7} {'HGMMA':>6} {'cubin':>8}"
    hgmma = str(row.hgmma) if row.sass else "n/a"
    line = f"{row.name:40} {row.registers:5d} {row.shared_bytes:8d} {row.spill_bytes:7d} {hgmma:>6} {row.cubin_bytes:8d}"
    return f"{header}\n{line}\n(arch {arch})"
