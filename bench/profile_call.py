"""Where one call's time goes on every rank, under torchrun: host time per call (and with every launch
through Triton's JIT instead of the relaunch of the compiled kernel), GPU time per call,
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
            jit_path = tiledsl.compile(PROGRAMS / f"{name}.tds", heap, replay=False)
            jit_path(*args)
            host_jit = host_us(lambda: jit_path(*args, check=False))
            jit_path.check()
            host = host_us(lambda: program(*args, check=False))
            gpu = time_ms(lambda: program(*args, check=False))
            program.check()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    program(*args, check=False)
                torch.cuda.synchronize()
            kernels = {e.key[:24]: e.device_time_total / e.count / 1000 for e in prof.key_averages()
                       if e.device_time_total > 0}
            mine = f"rank {rank}: host {host:.0f} us (JIT path {host_jit:.0f}), GPU {gpu:.3f} ms/call; " + ", ".join(
                f"{k} {v:.3f}" for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:4])
            everyone = [None] * world
            dist.all_gather_object(everyone, mine)
            if rank == 0:
                print(f"{model} {name}:", flush=True)
                for line in everyone:
                    print("   " + line, flush=True)
    for numel in (4096, 1 << 20):  # 8 KB and 2 MB of bf16
        # every call sums in place: start tiny (normal in bf16) so that 70 calls at world 4 stay finite
        fresh = torch.randn(numel, **bf16) * 2.0 ** -100
        x = torch.empty_like(fresh)
        line = []
        for name in ("allreduce", "allreduce_two_shot"):
            for replay in (True, False):
                program = tiledsl.compile(PROGRAMS / f"{name}.tds", heap, replay=replay)
                x.copy_(fresh)
                program(x)
                host = host_us(lambda: program(x, check=False))
                gpu = time_ms(lambda: program(x, check=False))
                program.check()
                line.append(f"{name}{'' if replay else ' (JIT path)'} host {host:.0f} us GPU {gpu * 1000:.0f} us")
        everyone = [None] * world
        dist.all_gather_object(everyone, f"rank {rank}: " + "; ".join(line))
        if rank == 0:
            print(f"{numel * 2} B all-reduce (host and GPU time per call):", flush=True)
            for entry in everyone:
                print("   " + entry, flush=True)
    heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
