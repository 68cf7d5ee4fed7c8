"""The trimmed NVSHMEM device library: made once from the wheel's bitcode, cached, reused, holding what kernels
link (the declared functions, external; the device state), linking the same kernels as the whole library, and
the whole library where it cannot be trimmed (needs nvidia-nvshmem-cu13 where it says so)."""
import os
import re
import warnings
from pathlib import Path

import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tiledsl.runtime import nvshmem_device, nvshmem_library


def _whole_library() -> str:
    try:
        return nvshmem_device.bitcode_path(90)
    except RuntimeError as error:
        pytest.skip(str(error))


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The trimmed library made once into a fresh cache (linking the whole bitcode: a few seconds)."""
    whole = _whole_library()
    cache = tmp_path_factory.mktemp("cache") / "nvshmem"  # where library_path keeps it under TILEDSL_CACHE
    path = nvshmem_library.trimmed(whole, tuple(nvshmem_device.DECLARED), cache, nvshmem_device.DEVICE_STATE)
    return whole, cache, path


@pytest.fixture
def fresh_library_path(monkeypatch, tmp_path):
    """library_path as a new process sees it, its cache in tmp_path."""
    monkeypatch.setenv("TILEDSL_CACHE", str(tmp_path))
    monkeypatch.delenv("TILEDSL_NVSHMEM_TRIM", raising=False)
    nvshmem_device.library_path.cache_clear()
    yield nvshmem_device.library_path
    nvshmem_device.library_path.cache_clear()


def test_the_trimmed_library_defines_every_declared_function_externally_and_holds_the_device_state(made):
    whole, _cache, path = made
    text = path.read_text()
    assert path.suffix == ".ll" and path.stat().st_size < os.path.getsize(whole) / 100  # 59 KB of 31 MB in 3.4.5
    for name in nvshmem_device.DECLARED:
        # external, so that a kernel's declaration resolves to it; what it calls stays internal
        assert re.search(rf"^define [^@]*@{name}\(", text, flags=re.MULTILINE), name
        assert not re.search(rf"^define internal [^@]*@{name}\(", text, flags=re.MULTILINE), name
    assert re.search(r"^define internal .*@_Z\w*nvshmemi_transfer", text, flags=re.MULTILINE)
    assert re.search(rf"^@{nvshmem_device.DEVICE_STATE} = ", text, flags=re.MULTILINE)


def test_the_trimmed_library_is_reused_not_made_again(made, monkeypatch):
    whole, cache, path = made
    written = path.stat().st_mtime_ns

    def relink(*_):
        raise AssertionError("linked the whole library again")
    monkeypatch.setattr(nvshmem_library, "_link_into_declarations", relink)
    again = nvshmem_library.trimmed(whole, tuple(nvshmem_device.DECLARED), cache, nvshmem_device.DEVICE_STATE)
    assert again == path and path.stat().st_mtime_ns == written
    assert [p.name for p in cache.iterdir()] == [path.name]  # no temporary file left beside it


def test_the_cache_key_follows_the_library_file_and_the_functions(tmp_path):
    library = tmp_path / "libnvshmem_device.bc"
    library.write_bytes(b"first")
    key = nvshmem_library._key(str(library), ("nvshmem_quiet", "nvshmem_fence"))
    assert nvshmem_library._key(str(library), ("nvshmem_fence", "nvshmem_quiet")) == key  # order does not matter
    assert nvshmem_library._key(str(library), ("nvshmem_quiet",)) != key
    os.utime(library, ns=(1, 1))
    assert nvshmem_library._key(str(library), ("nvshmem_quiet", "nvshmem_fence")) != key
    library.write_bytes(b"second, longer")
    assert nvshmem_library._key(str(library), ("nvshmem_quiet", "nvshmem_fence")) != key


def test_extern_libs_gives_the_trimmed_library_kept_in_tiledsls_cache(made, fresh_library_path, monkeypatch):
    _whole, cache, path = made
    monkeypatch.setenv("TILEDSL_CACHE", str(cache.parent))
    assert nvshmem_device.extern_libs(90) == {"libnvshmem_device": str(path)}
    assert fresh_library_path(90) == str(path)


def test_trim_0_gives_the_whole_library(fresh_library_path, monkeypatch):
    whole = _whole_library()
    monkeypatch.setenv("TILEDSL_NVSHMEM_TRIM", "0")
    assert fresh_library_path(90) == whole


@pytest.mark.parametrize("library", ["not bitcode", "libdevice"])
def test_a_library_that_cannot_be_trimmed_is_linked_whole_with_one_warning(fresh_library_path, monkeypatch,
                                                                           tmp_path, library):
    """Unreadable as IR, or readable but defining none of the functions (Triton's libdevice): the whole file,
    said once."""
    if library == "libdevice":
        path = str(Path(triton.__file__).parent / "backends" / "nvidia" / "lib" / "libdevice.10.bc")
    else:
        path = str(tmp_path / "libnvshmem_device.bc")
        Path(path).write_bytes(b"not bitcode")
    monkeypatch.setattr(nvshmem_device, "bitcode_path", lambda arch=90: path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fresh_library_path(90) == path
        assert nvshmem_device.extern_libs(90) == {"libnvshmem_device": path}
    assert len(caught) == 1 and "linking the whole NVSHMEM device library" in str(caught[0].message)
    assert not (tmp_path / "nvshmem").exists() or not list((tmp_path / "nvshmem").iterdir())


@triton.jit
def _every_declared_call(dst, src, sig, status, nbytes, epoch):
    me = nvshmem_device.my_pe()
    pe = (me + 1) % nvshmem_device.n_pes()
    nvshmem_device.putmem_signal_block(dst, src, nbytes, sig + me, epoch, nvshmem_device.NVSHMEM_SIGNAL_SET, pe)
    nvshmem_device.getmem_block(dst, src, nbytes, pe)
    nvshmem_device.signal_op(sig, epoch, nvshmem_device.NVSHMEM_SIGNAL_ADD, pe)
    nvshmem_device.fence()
    nvshmem_device.quiet()
    seen = nvshmem_device.signal_wait_until(sig, nvshmem_device.NVSHMEM_CMP_GE, epoch)
    tl.store(status, seen.to(tl.int64))


def test_a_kernel_calling_every_declared_function_compiles_to_the_same_ptx_with_either_library(made):
    """What the GPU runs does not change: the kernel linked with the trimmed library is the one linked with the
    whole library, to the PTX text (programs/hier_*.tds and barrier_nodes too, when this was written)."""
    whole, _cache, path = made
    assert set(nvshmem_device.DECLARED) == {"nvshmemx_putmem_signal_block", "nvshmemx_getmem_block",
                                            "nvshmemx_signal_op", "nvshmem_signal_wait_until", "nvshmem_my_pe",
                                            "nvshmem_n_pes", "nvshmem_fence", "nvshmem_quiet"}  # all called above
    source = ASTSource(fn=_every_declared_call, constexprs={},
                       signature={"dst": "*bf16", "src": "*bf16", "sig": "*u64", "status": "*i64",
                                  "nbytes": "i64", "epoch": "i32"})
    ptx = {}
    for label, library in (("whole", whole), ("trimmed", str(path))):
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                options={"extern_libs": (("libnvshmem_device", library),)})
        ptx[label] = kernel.asm["ptx"]
    assert ".extern .func" not in ptx["trimmed"] and nvshmem_device.DEVICE_STATE in ptx["trimmed"]
    assert ptx["trimmed"] == ptx["whole"]
