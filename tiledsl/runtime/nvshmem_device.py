"""NVSHMEM device calls for stock Triton kernels, linked from NVSHMEM's libnvshmem_device bitcode (trimmed to the
functions declared here once, by nvshmem_library: parsing the whole 31 MB at every compile took seconds).

A kernel that calls these is launched with `extern_libs=extern_libs()`, after `init_module_hook()`: each compiled
module needs NVSHMEM's device state copied in (nvshmemx_cumodule_init) before its first launch.
"""
import functools
import os
import sys
import warnings
import weakref

import triton
import triton.language as tl
from triton.language import core

from tiledsl.cache import cache_dir
from tiledsl.runtime import nvshmem_library

# Values of the C enums nvshmemx_signal_op_t and nvshmemx_cmp_type_t in NVSHMEM 3.4.5:
# include/device_host_transport/nvshmem_common_transport.h and nvshmem_constants.h (nvshmem4py's
# bindings/cynvshmem.pxd agrees). constexpr so that kernels can use them as globals.
NVSHMEM_SIGNAL_SET = tl.constexpr(9)
NVSHMEM_SIGNAL_ADD = tl.constexpr(10)
NVSHMEM_CMP_GE = tl.constexpr(5)

_LIBRARY = "libnvshmem_device"
DEVICE_STATE = "nvshmemi_device_state_d"  # the global nvshmemx_cumodule_init fills in


# Declarations, one table: the kernels' calls read it, and so does the trimmed library (nvshmem_library), which
# keeps just these functions. The C prototypes take `void *` / `uint64_t *`; pointers go over as int64 (same
# 64-bit register), so one declaration serves every element type. Functions returning void are declared as
# returning int32, as Triton cannot declare a void extern; the result is never used.
_I32, _I64, _U64 = core.int32, core.int64, core.uint64
DECLARED = {  # name: (argument types, result type)
    "nvshmemx_putmem_signal_block": ((_I64, _I64, _I64, _I64, _U64, _I32, _I32), _I32),
    "nvshmemx_getmem_block": ((_I64, _I64, _I64, _I32), _I32),
    "nvshmemx_signal_op": ((_I64, _U64, _I32, _I32), _I32),
    "nvshmem_signal_wait_until": ((_I64, _I32, _U64), _U64),
    "nvshmem_my_pe": ((), _I32),
    "nvshmem_n_pes": ((), _I32),
    "nvshmem_quiet": ((), _I32),
    "nvshmem_fence": ((), _I32),
}


def _call(name, args, _semantic):
    # Every call has side effects or reads state that NVSHMEM changes behind the compiler's back: never pure.
    types, result = DECLARED[name]
    return core.extern_elementwise("", "", args, {types: (name, result)}, is_pure=False, _semantic=_semantic)


@core.extern
def _putmem_signal_block(dst, src, nbytes, sig_addr, signal, sig_op, pe, _semantic=None):
    return _call("nvshmemx_putmem_signal_block", [dst, src, nbytes, sig_addr, signal, sig_op, pe], _semantic)


@core.extern
def _getmem_block(dst, src, nbytes, pe, _semantic=None):
    return _call("nvshmemx_getmem_block", [dst, src, nbytes, pe], _semantic)


@core.extern
def _signal_op(sig_addr, signal, sig_op, pe, _semantic=None):
    return _call("nvshmemx_signal_op", [sig_addr, signal, sig_op, pe], _semantic)


@core.extern
def _signal_wait_until(sig_addr, cmp, value, _semantic=None):
    return _call("nvshmem_signal_wait_until", [sig_addr, cmp, value], _semantic)


@core.extern
def my_pe(_semantic=None):
    """This PE's number (int32)."""
    return _call("nvshmem_my_pe", [], _semantic)


@core.extern
def n_pes(_semantic=None):
    """The number of PEs (int32)."""
    return _call("nvshmem_n_pes", [], _semantic)


@core.extern
def quiet(_semantic=None):
    """Wait until every put this thread issued has completed at its destination."""
    return _call("nvshmem_quiet", [], _semantic)


@core.extern
def fence(_semantic=None):
    """Order this thread's puts to each PE: those before land before those after."""
    return _call("nvshmem_fence", [], _semantic)


# The casts make any pointer or integer the caller has match the declared argument types exactly: extern calls
# are looked up by exact type, and a literal such as 1 would otherwise arrive as int32.
@triton.jit
def putmem_signal_block(dst_ptr, src_ptr, nbytes, sig_ptr, signal, sig_op, pe):
    """Whole block: copy `nbytes` from local `src_ptr` to `dst_ptr` on PE `pe`, then apply `sig_op` with `signal`
    to the uint64 `sig_ptr` there. `dst_ptr` and `sig_ptr` are this PE's symmetric addresses."""
    _putmem_signal_block(tl.cast(dst_ptr, tl.int64), tl.cast(src_ptr, tl.int64), tl.cast(nbytes, tl.int64),
                         tl.cast(sig_ptr, tl.int64), tl.cast(signal, tl.uint64), tl.cast(sig_op, tl.int32),
                         tl.cast(pe, tl.int32))


@triton.jit
def getmem_block(dst_ptr, src_ptr, nbytes, pe):
    """Whole block: copy `nbytes` from `src_ptr` on PE `pe` (this PE's symmetric address of it) to local
    `dst_ptr`; the bytes are there when it returns."""
    _getmem_block(tl.cast(dst_ptr, tl.int64), tl.cast(src_ptr, tl.int64), tl.cast(nbytes, tl.int64),
                  tl.cast(pe, tl.int32))


@triton.jit
def signal_op(sig_ptr, signal, sig_op, pe):
    """Apply `sig_op` with `signal` to the uint64 at `sig_ptr` (this PE's symmetric address) on PE `pe`.
    A thread-level call: every thread of the program issues it (SET of one value: the same result once
    or many times)."""
    _signal_op(tl.cast(sig_ptr, tl.int64), tl.cast(signal, tl.uint64), tl.cast(sig_op, tl.int32), tl.cast(pe, tl.int32))


@triton.jit
def signal_wait_until(sig_ptr, cmp, value):
    """Wait until the uint64 at local `sig_ptr` compares `cmp` to `value`; returns the value seen (uint64)."""
    return _signal_wait_until(tl.cast(sig_ptr, tl.int64), tl.cast(cmp, tl.int32), tl.cast(value, tl.uint64))


def bitcode_path(arch: int = 90) -> str:
    """libnvshmem_device bitcode from the `nvidia-nvshmem-cu13` wheel: per-arch file (3.8+) or the single one (3.4)."""
    names = (f"{_LIBRARY}_sm_{arch}.bc", f"{_LIBRARY}.bc")
    directories = [os.path.join(entry, "nvidia", "nvshmem", "lib") for entry in sys.path if entry]
    for directory in directories:
        for name in names:
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                return path
    raise RuntimeError(f"NVSHMEM device bitcode ({' or '.join(names)}) not found under nvidia/nvshmem/lib on "
                       f"sys.path; install the `nvidia-nvshmem-cu13` package")


def extern_libs(arch: int = 90) -> dict:
    """The `extern_libs` launch option for kernels that call NVSHMEM."""
    return {_LIBRARY: library_path(arch)}


@functools.lru_cache(maxsize=None)
def library_path(arch: int = 90) -> str:
    """The NVSHMEM device library kernels link: the wheel's bitcode trimmed to the functions in DECLARED
    (nvshmem_library; made once, kept in tiledsl's cache), else the whole of it. TILEDSL_NVSHMEM_TRIM=0 links
    the whole one."""
    whole = bitcode_path(arch)
    if os.environ.get("TILEDSL_NVSHMEM_TRIM", "1") == "0":
        return whole
    try:
        return str(nvshmem_library.trimmed(whole, tuple(DECLARED), cache_dir() / "nvshmem", DEVICE_STATE))
    except Exception as error:  # noqa: BLE001 - whatever failed, the whole library links the same kernels
        warnings.warn(f"tiledsl: linking the whole NVSHMEM device library {whole}, 3-5 s a compile: trimming it "
                      f"failed ({type(error).__name__}: {error})", stacklevel=2)
        return whole


_initialised_kernels = weakref.WeakSet()  # a kernel's module is unloaded when the kernel dies, so forget it then


def _init_nvshmem_module(*, key, fn, compile, **_):
    if not any(name == _LIBRARY for name, _path in compile["extern_libs"]):
        return
    kernel = fn.jit_function.device_caches[compile["device"]][0][key]
    if kernel in _initialised_kernels:
        return
    try:
        from nvshmem import bindings
    except ImportError as error:
        raise RuntimeError(f"kernels calling NVSHMEM need the `nvshmem4py-cu13` package: {error}") from error
    if not references_nvshmem(_ptx(kernel)):
        # linked with NVSHMEM but calling none of it: a constant argument made every call dead (Triton makes
        # an int equal to 1 a constant, so barrier_nodes on one node only synchronises its GPUs), and the
        # linker took no NVSHMEM state along; nvshmemx_cumodule_init would fail on it (status 7)
        _initialised_kernels.add(kernel)
        return
    kernel._init_handles()  # Triton loads the module lazily at first launch; NVSHMEM needs it loaded now
    status = bindings.cumodule_init(int(kernel.module))
    if status:
        raise RuntimeError(f"nvshmemx_cumodule_init failed with status {status} for kernel {fn.name}")
    _initialised_kernels.add(kernel)


def _ptx(kernel) -> str | None:
    try:
        return kernel.asm["ptx"]  # Triton's asm dict may load its entries on access: not .get
    except Exception:  # noqa: BLE001 - unknown: references_nvshmem then assumes NVSHMEM is there
        return None


def references_nvshmem(ptx: str | None) -> bool:
    """Whether a module holds NVSHMEM's device state (what nvshmemx_cumodule_init fills in); True when
    its PTX is unknown, to try."""
    return ptx is None or DEVICE_STATE in ptx


def init_module_hook() -> None:
    """Install (once) a Triton post-compile hook that initialises NVSHMEM in each module linked with it."""
    previous = triton.knobs.runtime.jit_post_compile_hook
    if getattr(previous, "_tiledsl_nvshmem", False):
        return

    def hook(**kwargs):
        # Keep a hook someone else installed working: there is a single slot for it.
        if previous is not None:
            previous(**kwargs)
        _init_nvshmem_module(**kwargs)

    hook._tiledsl_nvshmem = True
    triton.knobs.runtime.jit_post_compile_hook = hook
