"""The trimmed NVSHMEM device library against the whole one (issue 23), no GPU needed: how long Triton's
link_extern_libs takes with each, and whether every NVSHMEM-using program's kernel (and barrier_nodes)
compiles for sm_90 to the same PTX, SASS and cubin with each.

    python bench/experiments/nvshmem_trim.py [PROGRAM ...]      (default: every program that uses NVSHMEM)

Run from the checkout; TRITON_CACHE_DIR is set to a fresh folder so that both libraries are really compiled."""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="nvshmem_trim_triton_")

import triton  # noqa: E402
from triton._C.libtriton import ir, llvm  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from tiledsl import library  # noqa: E402
from tiledsl.api import build_module  # noqa: E402
from tiledsl.codegen.aot import _cuobjdump, compile_kernel  # noqa: E402
from tiledsl.runtime import nvshmem_device, sync  # noqa: E402
from tiledsl.runtime.specs import spec_of  # noqa: E402


def link_seconds(path: str, repeats: int = 5) -> float:
    """Median time of link_extern_libs of `path` into a module that declares every NVSHMEM function tiledsl
    calls (what a kernel that calls them all asks of the library)."""
    with tempfile.TemporaryDirectory() as directory:
        stub = Path(directory) / "declarations.mlir"
        stub.write_text("module {\n" + "".join(f"  llvm.func @{n}()\n" for n in nvshmem_device.DECLARED) + "}\n")
        times = []
        for _ in range(repeats):
            context = ir.context()
            ir.load_dialects(context)
            module = llvm.to_module(ir.parse_mlir_module(str(stub), context), llvm.context())
            began = time.perf_counter()
            llvm.link_extern_libs(module, [path])
            times.append(time.perf_counter() - began)
    return statistics.median(times)


def sass(cubin: bytes) -> str:
    tool = _cuobjdump()
    if tool is None:
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        return subprocess.run([tool, "--dump-sass", handle.name], capture_output=True, text=True).stdout


def kernels(names):
    """(name, a function compiling the kernel) for each NVSHMEM program asked for, then barrier_nodes."""
    for path in sorted(library.programs_dir().glob("*.tds")):
        if names and path.stem not in names:
            continue
        module = build_module(path.read_text())
        if spec_of(module).uses_nvshmem:
            yield path.stem, lambda module=module: compile_kernel(module, "sm_90")
    if not names or "barrier_nodes" in names:
        signature = {"bar_ptr": "*i64", "peers_bar": "*i64", "shmem_bar": "*i64", "rank": "i32", "nodes": "i32",
                     "local_world": "i32", "epoch_cell": "*i32", "diag_ptr": "*i32", "max_spins": "i32"}
        source = ASTSource(fn=sync.barrier_nodes, signature=signature, constexprs={})
        yield "barrier_nodes", lambda: triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                                      options={"extern_libs": nvshmem_device.extern_libs()})


def main(names) -> int:
    whole, trimmed = nvshmem_device.bitcode_path(90), nvshmem_device.library_path(90)
    if trimmed == whole:
        print("the library could not be trimmed (see the warning): nothing to compare")
        return 1
    print(f"whole   {whole} ({os.path.getsize(whole)} B): link_extern_libs {link_seconds(whole):.3f} s")
    print(f"trimmed {trimmed} ({os.path.getsize(trimmed)} B): link_extern_libs {link_seconds(trimmed):.4f} s")
    differing = 0
    for name, build in kernels(names):
        built, seconds = {}, {}
        for label, path in (("whole", whole), ("trimmed", trimmed)):
            nvshmem_device.library_path = lambda arch=90, path=path: path  # what extern_libs() hands Triton
            began = time.perf_counter()
            kernel = build()
            seconds[label] = time.perf_counter() - began
            built[label] = (kernel.asm["ptx"], sass(kernel.asm["cubin"]), kernel.asm["cubin"])
        same = [part for part, a, b in zip(("ptx", "sass", "cubin"), built["whole"], built["trimmed"]) if a == b]
        differing += len(same) < 3
        print(f"{name:22s} compile {seconds['whole']:6.2f} s whole, {seconds['trimmed']:6.2f} s trimmed; "
              f"same: {', '.join(same) or 'nothing'}", flush=True)
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
