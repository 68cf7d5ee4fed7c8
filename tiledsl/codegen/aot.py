"""Ahead-of-time compilation of a generated module's kernel for a GPU architecture, on any machine
(Triton compiles to cubin without a GPU), with a resource table: registers, shared memory, spills,
and whether the matrix products became Hopper's wgmma (HGMMA in the SASS)."""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

from tiledsl import gpus
from tiledsl.tables import DTYPES


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


PARAM_AT_BUILD = 4096  # every param of a build without a GPU, unless `sizes` names it


def build_env(spec, sizes: dict | None = None) -> dict:
    """The environment a build for an arch (no GPU, no launch) evaluates the module's blocks in: rank 0
    of 4 on 2 nodes, every param PARAM_AT_BUILD."""
    return {"rank": 0, "world": 4, "nodes": 2, "local_world": 2, **spec.consts,
            **{p: PARAM_AT_BUILD for p in spec.params}, **(sizes or {})}


def compile_kernel(module, arch: str = "sm_90", sizes: dict | None = None, dtype: str | None = None,
                   trace: bool = False, options: dict | None = None, only: str | None = None):
    """Compile the module's kernel for `arch` with every family enabled (or family `only`); returns
    Triton's CompiledKernel. The signature comes from the one list of kernel arguments in the module's
    spec (`ProgramSpec.args`); `dtype` replaces the tensors' own (an fp16 build of a bf16 program, say)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tiledsl.runtime.specs import Kind, kernel_options, operand_bytes, role_values, spec_of

    spec = spec_of(module)
    env = build_env(spec, sizes)
    blocks = spec.blocks(env)
    # every role compiled in: the entry, the exit barrier, the families (or `only`), the trace if asked
    run = {f.name for f in spec.families} if only is None else {only}
    roles = role_values(spec, run=run, enter=True, exit=True, tracing=trace)
    tensors = {t.name for t in spec.tensors}
    # What the JIT assumes on a GPU: torch's allocations are 16-byte aligned, and an integer argument
    # that 16 divides is marked so (rank and the spin bound are never specialised). Without it the
    # compiled loads are not vectorised, nor software-pipelined, as they are at run time.
    aligned = [["tt.divisibility", 16]]
    signature, constexprs, attrs = {}, {}, {}
    for position, arg in enumerate(spec.args):
        if arg.kind is Kind.DESCRIPTOR:
            element = DTYPES[dtype or arg.dtype].signature
            signature[arg.name] = f"tensordesc<{element}[{','.join(map(str, arg.block))}]>"
        elif arg.dtype is not None:  # a pointer
            own = dtype if dtype is not None and arg.kind is Kind.TENSOR and arg.of in tensors else arg.dtype
            signature[arg.name] = "*" + DTYPES[own].signature
            attrs[(position,)] = aligned
        elif arg.kind is Kind.CONST:
            constexprs[arg.name] = spec.consts[arg.name]
        elif arg.kind is Kind.BLOCK:
            constexprs[arg.name] = blocks[arg.name]
        elif arg.name in roles:
            constexprs[arg.name] = roles[arg.name]
        else:
            signature[arg.name] = "i32"
            if arg.kind is Kind.SIZE and arg.name not in ("rank",) and env.get(arg.name, 1) % 16 == 0:
                attrs[(position,)] = aligned
    for name in constexprs:
        signature[name] = "constexpr"
    import torch
    # `options`: num_warps, num_stages as at launch
    # the stages fit the operands as the program declares them (an f32 product: 4-byte elements), as at launch
    element = getattr(torch, dtype).itemsize if dtype else operand_bytes(spec)
    options = {**kernel_options(spec, element, gpus.for_arch(arch).shared_bytes), **(options or {})}
    if spec.uses_nvshmem:
        from tiledsl.runtime import nvshmem_device
        options["extern_libs"] = tuple(nvshmem_device.extern_libs(arch_number(arch)).items())
    source = ASTSource(fn=spec.kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch_number(arch), 32), options=options)


def _cuobjdump() -> str | None:
    try:
        from triton.backends.nvidia import compiler
        path = os.path.join(os.path.dirname(compiler.__file__), "bin", "cuobjdump")
        return path if os.path.exists(path) else None
    except ImportError:
        return None


def report(module, arch: str = "sm_90", sizes: dict | None = None, options: dict | None = None) -> KernelReport:
    kernel = compile_kernel(module, arch, sizes, options=options)
    return _report(module, kernel)


def _report(module, kernel) -> KernelReport:
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
        # ptxas spills into the thread's stack frame (STACK), not LOCAL: a [128, 128] accumulator on 4
        # warps read REG:255 STACK:512 LOCAL:0 (ptxas -v: 596 bytes of spill stores). A Triton kernel has
        # no other use for a stack frame, so both count as spilled bytes.
        found = re.search(r"REG:(\d+)\s+STACK:(\d+).*?LOCAL:(\d+)", usage.stdout)
        if found:
            registers, spills = int(found.group(1)), int(found.group(2)) + int(found.group(3))
    return KernelReport(name=f"{module.__name__}.tds_kernel", registers=registers,
                        shared_bytes=int(kernel.metadata.shared), spill_bytes=spills,
                        hgmma=hgmma, sass=sass, cubin_bytes=len(cubin))
