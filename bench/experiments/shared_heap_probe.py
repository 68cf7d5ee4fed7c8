"""What a rank's GPU memory holds where ranks share one GPU (issue 23): after the process group, after the
heap opens, after a heap tensor, after a torch tensor; per rank, from torch and from the driver.

    torchrun --nproc-per-node=8 bench/experiments/shared_heap_probe.py
"""
import os

import torch
import torch.distributed as dist

from tiledsl.runtime import placement
from tiledsl.runtime.heap import open_heap


def show(tag, rank):
    free, total = torch.cuda.mem_get_info()
    print(f"{tag:14s} rank {rank}: NVSHMEM_SYMMETRIC_SIZE={os.environ.get('NVSHMEM_SYMMETRIC_SIZE')} "
          f"torch reserved {torch.cuda.memory_reserved() >> 20} MiB, free on the GPU {free >> 20} of "
          f"{total >> 20} MiB", flush=True)
    dist.barrier()


def main():
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(16 << 30))
    placement.start()
    rank = dist.get_rank()
    show("group", rank)
    heap = open_heap()
    show("heap open", rank)
    t = heap.alloc((1 << 29,), torch.bfloat16)  # 1 GiB
    t.fill_(1)
    show("heap 1 GiB", rank)
    u = torch.ones(1 << 29, dtype=torch.bfloat16, device="cuda")
    show("torch 1 GiB", rank)
    del t, u
    heap.close()
    dist.barrier()


if __name__ == "__main__":
    main()
