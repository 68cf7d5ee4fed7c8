"""How fast does a copy within one GPU run beside a persistent kernel that fills the SMs?

Session 13 (attention_trace_probe.py, world 1): sp_ag_attention's eight copy-engine chunks of 8 MB
each took 212 us apiece (40 GB/s) beside its kernel of 131 programs, one SM left free, and the kernel
timed out with 132. 40 GB/s is about what one SM copies. This times eight 8 MB cuMemcpyAsync (torch
memory into the symmetric heap, as the SP program's gather) alone, and beside attention_local at
BM=128 (one CTA an SM, every register) launched with 132, 131 and 128 programs, and says when the
copies ended against the kernel's end.

    torchrun --nproc-per-node=1 bench/experiments/local_copy_probe.py
"""
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from cuda.bindings import driver

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
from harness import start  # noqa: E402

import tiledsl  # noqa: E402

B, P, H, HKV, D = 2, 4096, 32, 8, 128
COPIES, COPY_BYTES = 8, 8 << 20


def copy(kind, stream, d, s):
    """One contiguous copy of `s` into `d` on `stream`, through the driver call `kind` names."""
    handle = driver.CUstream(stream.cuda_stream)
    size = s.numel() * s.element_size()
    if kind == "cuMemcpyAsync":
        result = driver.cuMemcpyAsync(driver.CUdeviceptr(d.data_ptr()), driver.CUdeviceptr(s.data_ptr()), size, handle)
    elif kind == "cuMemcpy2DAsync":  # 4096 rows of 2 KB
        p = driver.CUDA_MEMCPY2D()
        p.srcMemoryType = p.dstMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
        p.srcDevice, p.dstDevice = driver.CUdeviceptr(s.data_ptr()), driver.CUdeviceptr(d.data_ptr())
        p.srcPitch = p.dstPitch = p.WidthInBytes = size // 4096
        p.Height = 4096
        result = driver.cuMemcpy2DAsync(p, handle)
    else:  # cuMemcpyPeerAsync, this context to itself
        context = driver.cuCtxGetCurrent()[1]
        result = driver.cuMemcpyPeerAsync(driver.CUdeviceptr(d.data_ptr()), context, driver.CUdeviceptr(s.data_ptr()),
                                          context, size, handle)
    if result[0] != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{kind}: {result[0].name}")


def copies_on(stream, dsts, srcs, kind="cuMemcpyAsync"):
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(len(dsts) + 1)]
    with torch.cuda.stream(stream):
        marks[0].record()
        for n, (d, s) in enumerate(zip(dsts, srcs)):
            copy(kind, stream, d, s)
            marks[n + 1].record()
    return marks


def main():
    _, world, heap = start(17)
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    Q = torch.randn(B, 2, P, H, D, **bf16)
    K, V = torch.randn(B, 2, P, HKV, D, **bf16), torch.randn(B, 2, P, HKV, D, **bf16)
    O = torch.empty(B, 2, P, H, D, **bf16)
    srcs = [torch.randn(COPY_BYTES // 2, **bf16) for _ in range(COPIES)]
    dsts = [heap.alloc((COPY_BYTES // 2,), torch.bfloat16) for _ in range(COPIES)]
    side = torch.cuda.Stream()
    kinds = ("cuMemcpyAsync", "cuMemcpy2DAsync", "cuMemcpyPeerAsync")
    for kind in kinds:
        for _ in range(3):
            marks = copies_on(side, dsts, srcs, kind)
        torch.cuda.synchronize()
        each = [marks[n].elapsed_time(marks[n + 1]) * 1e3 for n in range(COPIES)]
        print(f"{kind} alone: {sum(each):.1f} us for {COPIES} x 8 MB ({COPIES * COPY_BYTES / sum(each) / 1e3:.0f} "
              f"GB/s), each {min(each):.1f}-{max(each):.1f} us", flush=True)
    for programs in (132, 131, 128, 120):
        local = tiledsl.compile(ROOT / "bench" / "experiments" / "attention_local.tds", heap, D=D, BM=128, BN=64,
                                num_stages=3, num_sms=programs, wait_timeout_s=20.0)
        local(Q, K, V, O)
        torch.cuda.synchronize()
        for kind in kinds if programs >= 131 else kinds[:1]:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            local(Q, K, V, O, check=False)
            end.record()
            side.wait_event(begin)
            marks = copies_on(side, dsts, srcs, kind)
            torch.cuda.synchronize()
            kernel = begin.elapsed_time(end) * 1e3
            done = begin.elapsed_time(marks[-1]) * 1e3
            each = [marks[n].elapsed_time(marks[n + 1]) * 1e3 for n in range(COPIES)]
            print(f"{programs} programs, {kind}: kernel {kernel:.0f} us; copies began "
                  f"{begin.elapsed_time(marks[0]) * 1e3:.0f} us and ended {done:.0f} us after the kernel's start, "
                  f"{COPIES * COPY_BYTES / sum(each) / 1e3:.0f} GB/s, each {min(each):.1f}-{max(each):.1f} us",
                  flush=True)
        local.check()
        local.release()
    heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
