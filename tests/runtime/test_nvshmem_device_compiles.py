"""NVSHMEM device calls from stock Triton compile and link for sm_90 with no GPU (needs nvidia-nvshmem-cu13)."""
import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tiledsl.runtime import nvshmem_device


@triton.jit
def _put_to_next_pe_then_wait(dst, src, sig, status, nbytes, epoch):
    me = nvshmem_device.my_pe()
    next_pe = (me + 1) % nvshmem_device.n_pes()
    nvshmem_device.putmem_signal_block(dst, src, nbytes, sig + me, epoch, nvshmem_device.NVSHMEM_SIGNAL_SET, next_pe)
    nvshmem_device.fence()
    nvshmem_device.quiet()
    seen = nvshmem_device.signal_wait_until(sig + (me + nvshmem_device.n_pes() - 1) % nvshmem_device.n_pes(),
                                            nvshmem_device.NVSHMEM_CMP_GE, epoch)
    tl.store(status, seen.to(tl.int64))


def test_putmem_signal_and_wait_compile_and_link_for_sm90():
    try:
        libs = nvshmem_device.extern_libs()
    except RuntimeError as error:
        pytest.skip(str(error))
    source = ASTSource(fn=_put_to_next_pe_then_wait, constexprs={},
                       signature={"dst": "*bf16", "src": "*bf16", "sig": "*u64", "status": "*i64",
                                  "nbytes": "i64", "epoch": "i32"})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"extern_libs": libs})
    ptx = kernel.asm["ptx"]
    # Linked, not merely declared: no NVSHMEM function is left for the driver to resolve at load time.
    assert ".extern .func" not in ptx
    # The device state that nvshmemx_cumodule_init fills in is part of the module.
    assert "nvshmemi_device_state_d" in ptx
    assert kernel.asm["cubin"]
