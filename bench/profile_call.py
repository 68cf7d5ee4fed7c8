"""Where one call's time goes, under torchrun: host time per call, GPU time per call, and the GPU
kernels of a few calls (torch.profiler), for AG+GEMM (copy engine and SM gather) and GEMM+RS."""
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


def host_us(fn, calls=50):
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
    ag_text = (PROGRAMS / "ag_gemm.tds").read_text()
    variants = {"ag_gemm/copy_engine": PROGRAMS / "ag_gemm.tds",
                "ag_gemm/sms": ag_text.replace("on copy_engine", "on sms(16)"),
                "gemm_rs": PROGRAMS / "gemm_rs.tds"}
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    for model in ("LLaMA-7B", "LLaMA-3-70B"):
        N, K = SHAPES[model]
        for name, source in variants.items():
            program = tiledsl.compile(source, heap)
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
                for _ in range(3):
                    program(*args, check=False)
                torch.cuda.synchronize()
            if rank == 0:
                print(f"{model} {name}: host {host:.0f} us/call, GPU {gpu:.3f} ms/call", flush=True)
                table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=6, max_name_column_width=40)
                print("\n".join("   " + line for line in table.splitlines()), flush=True)
            dist.barrier()
    heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
