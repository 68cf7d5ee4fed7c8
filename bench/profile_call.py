"""Where one call's time goes on every rank, under torchrun: host time per call, GPU time per call,
and each rank's average time in each GPU kernel over a few calls (torch.profiler)."""
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from common import M, SHAPES, time_ms  # noqa: E402

import tiledsl  # noqa: E402
from tiledsl.runtime.heap import disable_multicast, open_heap  # noqa: E402

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"


def host_us(fn, calls=30):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return host


def main():
    disable_multicast()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    heap = open_heap()
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    for model in ("LLaMA-7B", "LLaMA-3-70B"):
        N, K = SHAPES[model]
        for name in ("ag_gemm", "gemm_rs", "gemm_rs_push"):
            program = tiledsl.compile(PROGRAMS / f"{name}.tds", heap)
            if name.startswith("ag_gemm"):
                args = (torch.randn(M // world, K, **bf16), torch.randn(K, N // world, **bf16),
                        torch.empty(M, N // world, **bf16))
            else:
                args = (torch.randn(M, K // world, **bf16), torch.randn(K // world, N, **bf16),
                        torch.empty(M // world, N, **bf16))
            program(*args)
            host = host_us(lambda: program(*args, check=False))
            gpu = time_ms(lambda: program(*args, check=False))
            program.check()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    program(*args, check=False)
                torch.cuda.synchronize()
            kernels = {e.key[:24]: e.device_time_total / e.count / 1000 for e in prof.key_averages()
                       if e.device_time_total > 0}
            mine = f"rank {rank}: host {host:.0f} us, GPU {gpu:.3f} ms/call; " + ", ".join(
                f"{k} {v:.3f}" for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:4])
            everyone = [None] * world
            dist.all_gather_object(everyone, mine)
            if rank == 0:
                print(f"{model} {name}:", flush=True)
                for line in everyone:
                    print("   " + line, flush=True)
    heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
