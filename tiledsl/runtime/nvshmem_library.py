"""NVSHMEM's device library trimmed to the functions tiledsl's kernels call, made once and cached.

Triton parses each extern library whole for every compile (link_extern_libs: parseIRFile, then a LinkOnlyNeeded
link): NVSHMEM 3.4's 31 MB libnvshmem_device.bc costs 3-5 s a compile. Linking it once, with Triton's own LLVM,
into a module that only declares those functions keeps all that a kernel can take from it (the functions, their
callees, and the globals they use or that @llvm.compiler.used keeps, the device state among them), ~60 KB of text
IR that the same LLVM parses back at each compile.
"""
import hashlib
import os
import re
import tempfile
from pathlib import Path

import triton

_RECIPE = 1  # part of the cache key: bump when the way the file is made changes


def trimmed(library: str, functions, cache: Path, state: str) -> Path:
    """The trimmed copy of `library` holding `functions` (names) and the global `state`, made unless cached in
    `cache` for this library file and this Triton."""
    path = cache / f"{Path(library).stem}.{_key(library, functions)}.ll"
    if path.is_file():
        return path
    text = _link_into_declarations(library, functions)
    for name in functions:
        text, found = re.subn(rf"^define (?:internal )?(.*?@{re.escape(name)}\()", r"define \1", text,
                              flags=re.MULTILINE)
        if found != 1:
            raise RuntimeError(f"{library} defines {name} {found} times once linked, expected once")
    if not re.search(rf"^@{re.escape(state)} = ", text, flags=re.MULTILINE):
        raise RuntimeError(f"{library} linked for {', '.join(functions)} brings no @{state}")
    cache.mkdir(parents=True, exist_ok=True)
    # Every rank of a machine may make it at once: each writes its own file, and the last rename wins with the
    # same text; a reader never sees a partial one.
    handle, temporary = tempfile.mkstemp(dir=cache, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.chmod(temporary, 0o644)  # mkstemp's 0600 would keep it from whoever else shares the folder
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    return path


def _key(library: str, functions) -> str:
    """What the file depends on: the library file, the functions asked for, and the LLVM that prints and later
    parses it (Triton's version and its native library's file)."""
    from triton._C import libtriton
    parts = [_RECIPE, triton.__version__, *sorted(functions)]
    for name in (library, libtriton.__file__):
        status = os.stat(name)
        parts += [os.path.realpath(name), status.st_size, status.st_mtime_ns]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _link_into_declarations(library: str, functions) -> str:
    """The library linked, as Triton links it into a kernel, into a module that only declares `functions`,
    printed. Triton leaves every function it linked in `internal` (it takes external definitions for kernels):
    the caller makes the declared ones external again so that a kernel's declarations resolve to them, while
    their callees stay internal and come along, as they did from the whole library."""
    from triton._C.libtriton import ir, llvm
    # The declarations' types need not match the library's: the linker resolves by name, as it does for a
    # kernel's (which declares `void *` arguments as i64).
    declarations = "".join(f"  llvm.func @{name}()\n" for name in functions)
    context = ir.context()
    ir.load_dialects(context)
    with tempfile.TemporaryDirectory() as directory:
        stub = os.path.join(directory, "declarations.mlir")
        Path(stub).write_text(f"module {{\n{declarations}}}\n")
        module = ir.parse_mlir_module(stub, context)
    llvm_context = llvm.context()
    linked = llvm.to_module(module, llvm_context)
    if linked is None:
        raise RuntimeError("Triton could not translate the declarations to LLVM IR")
    llvm.link_extern_libs(linked, [library])
    return str(linked)
