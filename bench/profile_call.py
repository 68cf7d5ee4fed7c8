"""Where one call's time goes on every rank, under torchrun: host time per call and time per call
(CUDA events, host and GPU) with each launch path: CUDA-graph replay, direct relaunch of the compiled
kernels, and every launch through Triton's JIT; and each rank's average time in each GPU kernel over a few calls (torch.profiler)."""
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


MODES = {"graph": {}, "direct": {"graphs": False}, "JIT": {"graphs": False, "replay": False}}


def modes(name, heap, args, prepare=lambda: None):
    """Host and GPU microseconds per call with each launch path (CUDA graph, direct relaunch, JIT)."""
    cells = []
    for mode, options in MODES.items():
        program = tiledsl.compile(PROGRAMS / f"{name}.tds", heap, **options)
        prepare()
        program(*args)
        program(*args)  # the second call records the CUDA graph
        host = host_us(lambda: program(*args, check=False))
        gpu = time_ms(lambda: program(*args, check=False)) * 1000
        program.check()
        cells.append(f"{mode} host {host:.0f} / total {gpu:.0f} us")
    return program, ", ".join(cells)


def show(title, mine, world):
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        print(title, flush=True)
        for line in everyone:
            print("   " + line, flush=True)


def main():
    disable_multicast()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    heap = open_heap()
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    for model in ("LLaMA-7B", "LLaMA-3-70B"):
        N, K = SHAPES[model]
        for name in ("ag_gemm", "gemm_rs", "gemm_rs_pull"):
            if name.startswith("ag_gemm"):
                args = (torch.randn(M // world, K, **bf16), torch.randn(K, N // world, **bf16),
                        torch.empty(M, N // world, **bf16))
            else:
                args = (torch.randn(M, K // world, **bf16), torch.randn(K // world, N, **bf16),
                        torch.empty(M // world, N, **bf16))
            program, cells = modes(name, heap, args)
            program = tiledsl.compile(PROGRAMS / f"{name}.tds", heap, graphs=False)  # kernels show by name
            program(*args)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    program(*args, check=False)
                torch.cuda.synchronize()
            program.check()
            kernels = {e.key[:24]: e.device_time_total / e.count / 1000 for e in prof.key_averages()
                       if e.device_time_total > 0}
            show(f"{model} {name}:", f"rank {rank}: {cells}; GPU ms: " + ", ".join(
                f"{k} {v:.3f}" for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:4]), world)
    for numel in (4096, 1 << 20):  # 8 KB and 2 MB of bf16
        # every call sums in place: start tiny (normal in bf16) so that 100 calls at world 4 stay finite
        fresh = torch.randn(numel, **bf16) * 2.0 ** -120
        x = torch.empty_like(fresh)
        for name in ("allreduce", "allreduce_two_shot"):
            _, cells = modes(name, heap, (x,), prepare=lambda: x.copy_(fresh))
            show(f"{numel * 2} B {name}:", f"rank {rank}: {cells}", world)
    heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
