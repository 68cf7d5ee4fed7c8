"""Runtime smoke test on 2-4 GPUs. From the repo root: `PYTHONPATH=. torchrun --nproc-per-node=N bench/smoke_runtime.py`

Three ways of writing into peers' symmetric copies and signalling them, each reported by rank 0 as `PASS name` or
`FAIL name: reason`: Triton peer stores with release/acquire flags, the copy engine with stream-written flags, and
NVSHMEM putmem_signal_block from a Triton kernel. Every wait is bounded and a watchdog ends a hung run.
`--torch-symm` runs the first two on torch's symmetric memory instead of NVSHMEM.
"""
import os
import sys
import threading

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from tiledsl.runtime import copy_engine, nvshmem_device
from tiledsl.runtime import placement
from tiledsl.runtime.heap import NvshmemHeap, TorchSymmHeap, disable_multicast, open_heap

ROW = 1024  # elements each rank writes into every peer
SPIN_LIMIT = 1 << 22  # a lost signal then fails its check in seconds instead of hanging the GPU
WATCHDOG_S = 180  # nothing here takes more than a few seconds: past this a wait outside our bounds is hung
EPOCHS = (1, 2)  # two rounds on the same signals with no reset in between: signals count epochs


def payload(rank: int, epoch: int) -> int:
    return 8 * epoch + rank  # small integers, exact in bf16, different every round


@triton.jit
def _wait_for_epoch(sig_ptr, epoch, spin_limit):
    # acquire at system scope: whatever the sender wrote before its release is visible to the loads after this
    seen = tl.atomic_add(sig_ptr, 0, sem="acquire", scope="sys")
    spins = 0
    while (seen < epoch) & (spins < spin_limit):
        seen = tl.atomic_add(sig_ptr, 0, sem="acquire", scope="sys")
        spins += 1
    return seen >= epoch


@triton.jit
def _store_rows_to_peers(data_ptr, data_offsets, sig_ptr, sig_offsets, rank, value, epoch, ROW: tl.constexpr):
    # program p writes this rank's row into rank p's copy, then raises this rank's flag there
    peer = tl.program_id(0)
    row = (tl.zeros([ROW], tl.float32) + value).to(tl.bfloat16)
    tl.store(data_ptr + tl.load(data_offsets + peer) + rank * ROW + tl.arange(0, ROW), row)
    # all threads' stores happen-before the single thread that performs the release below
    tl.debug_barrier()
    tl.atomic_xchg(sig_ptr + tl.load(sig_offsets + peer) + rank, epoch, sem="release", scope="sys")


@triton.jit
def _wait_and_check_rows(data_ptr, sig_ptr, errors_ptr, epoch, value_base, spin_limit, ROW: tl.constexpr,
                         NVSHMEM_WAIT: tl.constexpr):
    # program s waits for rank s's flag, then counts wrong elements in rank s's row; -1 means no flag came
    source = tl.program_id(0)
    arrived = _wait_for_epoch(sig_ptr + source, epoch, spin_limit)
    # Two ifs: the outer one is decided at compile time and keeps NVSHMEM out of kernels not linked with it.
    if NVSHMEM_WAIT:  # noqa: SIM102
        if arrived:  # already satisfied, so NVSHMEM's own (unbounded) wait is exercised without risk of a hang
            nvshmem_device.signal_wait_until(sig_ptr + source, nvshmem_device.NVSHMEM_CMP_GE, epoch)
    row = tl.load(data_ptr + source * ROW + tl.arange(0, ROW)).to(tl.float32)
    wrong = tl.sum((row != value_base + source).to(tl.int32), axis=0)
    tl.store(errors_ptr + source, tl.where(arrived, wrong, -1))


@triton.jit
def _nvshmem_put_rows(data_ptr, source_ptr, sig_ptr, pe_info_ptr, nbytes, epoch, ROW: tl.constexpr):
    # program p: the whole block puts this PE's row into row `me` on PE p and sets flag `me` there
    peer = tl.program_id(0)
    me = nvshmem_device.my_pe()
    nvshmem_device.putmem_signal_block(data_ptr + me * ROW, source_ptr, nbytes, sig_ptr + me, epoch,
                                       nvshmem_device.NVSHMEM_SIGNAL_SET, peer)
    nvshmem_device.quiet()
    if peer == 0:
        tl.store(pe_info_ptr, me)
        tl.store(pe_info_ptr + 1, nvshmem_device.n_pes())


def wait_and_check(heap, data, sig, epoch, **launch_options) -> str | None:
    errors = torch.empty(heap.world, dtype=torch.int32, device=heap.device)
    _wait_and_check_rows[(heap.world,)](data, sig, errors, epoch, payload(0, epoch), SPIN_LIMIT, ROW=ROW,
                                        **launch_options)
    errors = errors.tolist()
    silent = [r for r, e in enumerate(errors) if e < 0]
    wrong = {r: e for r, e in enumerate(errors) if e > 0}
    if silent:
        return f"epoch {epoch}: no signal from ranks {silent}"
    if wrong:
        return f"epoch {epoch}: wrong elements per source rank {wrong}"
    return None


def peer_stores(heap) -> str | None:
    data = heap.alloc((heap.world, ROW), torch.bfloat16)
    sig = heap.alloc((heap.world,), torch.int32)
    for epoch in EPOCHS:
        _store_rows_to_peers[(heap.world,)](data, heap.peer_offsets(data), sig, heap.peer_offsets(sig), heap.rank,
                                            payload(heap.rank, epoch), epoch, ROW=ROW)
        failure = wait_and_check(heap, data, sig, epoch, NVSHMEM_WAIT=False)
        heap.barrier()  # no rank starts the next round while another still checks this one
        if failure:
            return failure
    return None


def copy_engine_signals(heap) -> str | None:
    data = heap.alloc((heap.world, ROW), torch.bfloat16)
    sig = heap.alloc((heap.world,), torch.int32)
    comm = torch.cuda.Stream(heap.device)
    for epoch in EPOCHS:
        row = torch.full((ROW,), payload(heap.rank, epoch), dtype=torch.bfloat16, device=heap.device)
        comm.wait_stream(torch.cuda.current_stream())  # the copy reads `row`, filled on the current stream
        for peer in range(heap.world):
            flag_address = heap.peer(sig, peer).data_ptr() + heap.rank * sig.element_size()
            copy_engine.copy_and_signal(comm, heap.peer(data, peer)[heap.rank], row, flag_address, epoch)
        failure = wait_and_check(heap, data, sig, epoch, NVSHMEM_WAIT=False)
        if failure is None:  # every flag is up, so these stream-side waits cannot block
            for source in range(heap.world):
                copy_engine.wait_value(torch.cuda.current_stream(), sig.data_ptr() + source * sig.element_size(),
                                       epoch)
            torch.cuda.current_stream().synchronize()
        heap.barrier()
        if failure:
            return failure
    return None


def nvshmem_put_signal(heap) -> str | None:
    nvshmem_device.init_module_hook()
    libs = nvshmem_device.extern_libs()
    data = heap.alloc((heap.world, ROW), torch.bfloat16)
    source = heap.alloc((ROW,), torch.bfloat16)
    sig = heap.alloc((heap.world,), torch.int64)  # NVSHMEM signals are uint64; int64 holds the same bits
    pe_info = torch.zeros(2, dtype=torch.int32, device=heap.device)
    for epoch in EPOCHS:
        source.fill_(payload(heap.rank, epoch))
        _nvshmem_put_rows[(heap.world,)](data, source, sig, pe_info, ROW * source.element_size(), epoch, ROW=ROW,
                                         extern_libs=libs)
        failure = wait_and_check(heap, data, sig, epoch, NVSHMEM_WAIT=True, extern_libs=libs)
        heap.barrier()
        if failure:
            return failure
    if pe_info.tolist() != [heap.rank, heap.world]:
        return f"nvshmem_my_pe/n_pes gave {pe_info.tolist()}, expected {[heap.rank, heap.world]}"
    return None


def report(name: str, failure: str | None) -> bool:
    """Print one PASS/FAIL line on rank 0; whether every rank passed (the same answer on all ranks)."""
    failures = [None] * dist.get_world_size()
    dist.all_gather_object(failures, failure)
    bad = [f"rank {r}: {f}" for r, f in enumerate(failures) if f]
    if dist.get_rank() == 0:
        print(f"FAIL {name}: {'; '.join(bad)}" if bad else f"PASS {name}", flush=True)
    return not bad


def run(name: str, test, heap) -> bool:
    try:
        failure = test(heap)
    except Exception as error:  # noqa: BLE001  (a broken path is a FAIL line, and the other paths still run)
        failure = f"{type(error).__name__}: {error}"
    return report(name, failure)


def start_watchdog(rank: int) -> threading.Timer:
    def expire():
        print(f"FAIL smoke_runtime: rank {rank} still running after {WATCHDOG_S} s", flush=True)
        os._exit(1)

    watchdog = threading.Timer(WATCHDOG_S, expire)
    watchdog.daemon = True
    watchdog.start()
    return watchdog


def main() -> int:
    """The exit code: 1 if any path failed on any rank."""
    disable_multicast()  # before NCCL initialises: it reads NCCL_NVLS_ENABLE once
    place = placement.current()
    torch.cuda.set_device(place.device)
    # ranks sharing a GPU: gloo (NCCL refuses them); else NCCL bound to this rank's GPU, as before
    dist.init_process_group(place.backend, **({} if place.shared else {"device_id": torch.device("cuda", place.device)}))
    placement.settle()
    watchdog = start_watchdog(dist.get_rank())
    heap = TorchSymmHeap() if "--torch-symm" in sys.argv else open_heap()
    if heap.rank == 0:
        print(f"heap {type(heap).__name__}, world {heap.world}", flush=True)
    passed = [run("peer_stores", peer_stores, heap), run("copy_engine_signals", copy_engine_signals, heap)]
    if isinstance(heap, NvshmemHeap):
        passed.append(run("nvshmem_put_signal", nvshmem_put_signal, heap))
    elif heap.rank == 0:
        print(f"SKIP nvshmem_put_signal: the heap is {type(heap).__name__}, not NVSHMEM", flush=True)
    heap.close()
    dist.destroy_process_group()
    watchdog.cancel()
    return 0 if all(passed) else 1


if __name__ == "__main__":
    sys.exit(main())
