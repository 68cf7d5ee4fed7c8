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


@triton.jit
def _get_then_signal(dst, src, sig, nbytes, epoch, pe):
    nvshmem_device.getmem_block(dst, src, nbytes, pe)
    nvshmem_device.signal_op(sig, epoch, nvshmem_device.NVSHMEM_SIGNAL_SET, pe)


def test_getmem_and_signal_op_compile_and_link_for_sm90():
    try:
        libs = nvshmem_device.extern_libs()
    except RuntimeError as error:
        pytest.skip(str(error))
    source = ASTSource(fn=_get_then_signal, constexprs={},
                       signature={"dst": "*bf16", "src": "*bf16", "sig": "*u64", "nbytes": "i64", "epoch": "i32",
                                  "pe": "i32"})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"extern_libs": libs})
    assert ".extern .func" not in kernel.asm["ptx"] and kernel.asm["cubin"]


def test_a_program_written_for_nodes_compiles_with_its_signals_gets_and_two_level_barrier_for_sm90():
    """A get, a notify lowered to NVSHMEM signals for waiters on other nodes, NVSHMEM's wait after the
    spin, and the entry barrier's second level: the kernel links with no NVSHMEM symbol left open. A put
    and a get of a const count too (generated bodies, seed 2007: `BN`, a constexpr, has no `.to`)."""
    import textwrap

    from tiledsl.api import build_module
    from tiledsl.codegen.aot import compile_kernel
    try:
        nvshmem_device.extern_libs()
    except RuntimeError as error:
        pytest.skip(str(error))
    module = build_module(textwrap.dedent("""\
        program column_gather
        param M, N
        const BR = 16, BN = 32
        in   X : f32[M, N]
        out  Y : f32[nodes, M, N]
        symm G : f32[M, N]
        symm H : f32[BR, N]
        tile  own[i in cdiv(M, BR), j in cdiv(N, BN)]: G[i*BR : +BR, j*BN : +BN] = X[i*BR : +BR, j*BN : +BN]; \\
              Y[node, i*BR : +BR, j*BN : +BN] = X[i*BR : +BR, j*BN : +BN]
        chunk fetch[k in nodes - 1] on nvshmem(4): \\
              G@(((node + 1 + k) mod nodes)*local_world + local_rank)[:, :] -> Y[(node + 1 + k) mod nodes, :, :]
        chunk push[j in N / BN] on nvshmem(1): X[0, j*BN : +BN] -> H@((rank + local_world) mod world)[0, j*BN : +BN]
        chunk pull[j in N / BN] on nvshmem(1): G@((rank + local_world) mod world)[0, j*BN : +BN] -> H[1, j*BN : +BN]
        fetch[k] after own[*, *] @ (((node + 1 + k) mod nodes)*local_world + local_rank)
        pull[j] after own[*, *] @ ((rank + local_world) mod world)
    """))
    ptx = compile_kernel(module).asm["ptx"]
    assert ".extern .func" not in ptx and "nvshmemi_device_state_d" in ptx
    # the calls LLVM keeps out of line (the wait's is inlined into the kernel)
    assert "nvshmemx_signal_op" in ptx and "nvshmemx_getmem_block" in ptx and "nvshmemx_putmem_signal_block" in ptx


def test_the_separate_entry_of_a_program_written_for_nodes_links_nvshmem_for_sm90(monkeypatch):
    """Where the kernel is not its own entry (inputs staged, copy-engine chunks), the two-level barrier
    runs as a kernel of its own: launched with the kernel's NVSHMEM library, it links for sm_90 (without
    it ptxas finds nvshmemx_signal_op unresolved)."""
    from types import SimpleNamespace

    from tiledsl.runtime import issue, sync
    try:
        libs = nvshmem_device.extern_libs()
    except RuntimeError as error:
        pytest.skip(str(error))
    launched = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **options: launched.append((grid, args, options))
    monkeypatch.setattr(sync, "barrier_nodes", Recorder())
    issuing = issue.Issuing()
    issuing.spec = SimpleNamespace(distributed=True, spans_nodes=True)
    issuing.replay, issuing._epoch_cell, issuing.max_spins = False, "cell", 7
    call = SimpleNamespace(enter_replay=None, barrier=("bar", "peers", "shmem", 3, 2, 2), diag="diag",
                           options={"extern_libs": libs, "num_warps": 4})
    issuing._enter(call)
    assert launched == [((1,), ("bar", "peers", "shmem", 3, 2, 2, "cell", "diag", 7), {"extern_libs": libs})]
    monkeypatch.undo()
    signature = {"bar_ptr": "*i64", "peers_bar": "*i64", "shmem_bar": "*i64", "rank": "i32", "nodes": "i32",
                 "local_world": "i32", "epoch_cell": "*i32", "diag_ptr": "*i32", "max_spins": "i32"}
    kernel = triton.compile(ASTSource(fn=sync.barrier_nodes, signature=signature, constexprs={}),
                            target=GPUTarget("cuda", 90, 32), options=launched[0][2])
    assert ".extern .func" not in kernel.asm["ptx"] and "nvshmemi_device_state_d" in kernel.asm["ptx"]
