"""Does a copy issued on a side stream make progress while a persistent kernel holds every SM?

tiledsl's copy-engine chunks are cuMemcpyAsync on a communication stream, then a 4-byte copy of the
epoch cell into the signal slot, while the persistent kernel's tiles spin on that slot. If the driver
runs one of these copies as a kernel on the SMs (and not on a copy engine), it cannot start while the
spinning kernel fills every SM, and the call times out. This script fills every SM (two CTAs of 1024
threads each: all 2048 thread slots), lets each CTA spin on a flag, and issues one kind of copy
followed by a write of the flag by the stream's front end (cuStreamWriteValue32: no SM), for:
  local contiguous (cuMemcpyAsync within this GPU), 4-byte (the signal copy), local strided through
  torch's copy_ (a kernel), local strided through cuMemcpy2DAsync, and a peer copy where there is a
  second GPU. Prints, per kind, whether the kernel saw the flag before its bounded spin gave up.

    python3 bench/experiments/copy_starvation.py
"""
import time

import torch
import triton
import triton.language as tl
from cuda.bindings import driver


@triton.jit
def spin(flag_ptr, seen_ptr, max_spins):
    spins = 0
    seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    while (seen == 0) & (spins < max_spins):
        seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
        spins += 1
    tl.atomic_max(seen_ptr, seen)


def check(result, what):
    status = result[0] if isinstance(result, tuple) else result
    if status != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {status.name}")


def memcpy2d(dst: torch.Tensor, src: torch.Tensor, stream):
    """rows x width bytes from a strided 2-D view into another (both row-major with a row stride)."""
    p = driver.CUDA_MEMCPY2D()
    p.srcMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
    p.dstMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
    p.srcDevice = driver.CUdeviceptr(src.data_ptr())
    p.dstDevice = driver.CUdeviceptr(dst.data_ptr())
    p.srcPitch = src.stride(0) * src.element_size()
    p.dstPitch = dst.stride(0) * dst.element_size()
    p.WidthInBytes = src.shape[1] * src.element_size()
    p.Height = src.shape[0]
    check(driver.cuMemcpy2DAsync(p, driver.CUstream(stream.cuda_stream)), "cuMemcpy2DAsync")


def trial(name, issue, sms, priority=0):
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    seen = torch.zeros(1, dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream(priority=priority)
    torch.cuda.synchronize()
    began = time.perf_counter()
    spin[(2 * sms,)](flag, seen, 1 << 22, num_warps=32)
    time.sleep(0.05)  # the kernel is resident and spinning before the copy is issued
    issue(side)
    check(driver.cuStreamWriteValue32(driver.CUstream(side.cuda_stream), driver.CUdeviceptr(flag.data_ptr()), 1,
                                      driver.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT),
          "cuStreamWriteValue32")
    torch.cuda.synchronize()
    took = time.perf_counter() - began
    verdict = "progressed" if seen.item() == 1 else "STARVED (the kernel gave up first)"
    print(f"{name:44s} {verdict:36s} {took * 1e3:8.1f} ms", flush=True)


def graph_trial(name, graph, sms):
    """As trial, the copy replayed from a CUDA graph on a side stream."""
    def issue(side):
        with torch.cuda.stream(side):
            graph.replay()
    trial(name, issue, sms)


def main():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}: {sms} SMs; every SM filled with two 1024-thread CTAs", flush=True)
    big = torch.randn(64 << 20, device="cuda")
    out = torch.empty_like(big)
    cell = torch.ones(1, dtype=torch.int32, device="cuda")
    slot = torch.zeros(1, dtype=torch.int32, device="cuda")
    grid = torch.randn(4096, 2048, device="cuda")
    into = torch.empty(4096, 1024, device="cuda")

    def raw(dst, src, nbytes):
        return lambda s: check(driver.cuMemcpyAsync(driver.CUdeviceptr(dst.data_ptr()),
                                                    driver.CUdeviceptr(src.data_ptr()), nbytes,
                                                    driver.CUstream(s.cuda_stream)), "cuMemcpyAsync")

    def torch_copy(s):
        with torch.cuda.stream(s):
            into.copy_(grid[:, :1024], non_blocking=True)

    trial("nothing (the flag write alone)", lambda s: None, sms)
    trial("cuMemcpyAsync 4 B within the GPU (signal)", raw(slot, cell, 4), sms)
    trial("cuMemcpyAsync 256 MB within the GPU", raw(out, big, big.numel() * 4), sms)
    trial("torch copy_ strided within the GPU", torch_copy, sms)
    trial("cuMemcpy2DAsync strided within the GPU", lambda s: memcpy2d(into, grid[:, :1024], s), sms)
    # tiledsl replays a call's copies from a CUDA graph: the same copies as graph memcpy nodes
    for name, op in (("graph: cuMemcpyAsync 4 B within the GPU", raw(slot, cell, 4)),
                     ("graph: cuMemcpyAsync 256 MB within the GPU", raw(out, big, big.numel() * 4))):
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.graph(graph, stream=side):
            op(side)
        graph_trial(name, graph, sms)
    # as tiledsl issues them: on a stream of high priority (-1), and between buffers of NVSHMEM's heap
    trial("priority -1: cuMemcpyAsync 4 B", raw(slot, cell, 4), sms, priority=-1)
    trial("priority -1: cuMemcpyAsync 256 MB", raw(out, big, big.numel() * 4), sms, priority=-1)
    try:
        import torch.distributed as dist
        import os
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(2 << 30))
        dist.init_process_group("nccl")
        from tiledsl.runtime.heap import disable_multicast, open_heap
        disable_multicast()
        heap = open_heap()
        a, b = heap.alloc((64 << 20,), torch.float32), heap.alloc((64 << 20,), torch.float32)
        a.normal_()
        c, d = heap.alloc((64,), torch.int32), heap.alloc((64,), torch.int32)
        c.fill_(1)
        for priority in (0, -1):
            trial(f"heap, priority {priority}: cuMemcpyAsync 4 B", raw(d[5:6], c[:1], 4), sms, priority)
            trial(f"heap, priority {priority}: 4 B from a torch tensor", raw(d[7:8], cell, 4), sms, priority)
            trial(f"heap, priority {priority}: cuMemcpyAsync 256 MB", raw(b, a, a.numel() * 4), sms, priority)
        heap.close()
    except Exception as error:  # noqa: BLE001 - the heap's trials are a side note
        print(f"heap trials not run: {type(error).__name__}: {error}", flush=True)
    if torch.cuda.device_count() > 1:
        torch.cuda.set_device(1)
        peer = torch.empty_like(big)
        torch.cuda.set_device(0)
        trial("cuMemcpyAsync 256 MB to the peer GPU", raw(peer, big, big.numel() * 4), sms)


if __name__ == "__main__":
    main()
