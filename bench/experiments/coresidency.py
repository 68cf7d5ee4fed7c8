"""How many CTAs can be resident at once, before and after tiledsl opens its heap (NVSHMEM) and runs?

residency_probe.py found that a kernel of one program an SM deadlocks with as many programs as SMs and
runs with one fewer: something holds part of one SM. Here a kernel of CTAS programs of 1024 threads
(two fill an SM's 2048 thread slots) counts its programs in and each waits, bounded, until all have
arrived: it completes only if all are resident at once. Tried at 2 x SMs, 2 x SMs - 1 and - 2,
(a) after torch's CUDA init only, (b) after torch.distributed and tiledsl's heap, (c) after a call of
a tiledsl program, (d) after torch.cuda.synchronize().

    torchrun --nproc-per-node=1 bench/experiments/coresidency.py
"""
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]


@triton.jit
def arrive_all(counter_ptr, done_ptr, expected, max_spins):
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < expected) & (spins < max_spins):
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    tl.atomic_min(done_ptr, seen)


def resident(label):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    verdicts = []
    for ctas in (2 * sms, 2 * sms - 1, 2 * sms - 2):
        counter = torch.zeros(1, dtype=torch.int32, device="cuda")
        done = torch.full((1,), 1 << 30, dtype=torch.int32, device="cuda")
        arrive_all[(ctas,)](counter, done, ctas, 1 << 21, num_warps=32)
        torch.cuda.synchronize()
        verdicts.append(f"{ctas}: {'all resident' if int(done) >= ctas else f'only {int(done)} at once'}")
    print(f"{label:52s} " + "; ".join(verdicts), flush=True)


def main():
    resident("(a) torch's CUDA init only")
    import os
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(4 << 30))
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    from harness import start
    _, world, heap = start(3)
    resident("(b) torch.distributed and tiledsl's heap open")
    import tiledsl
    program = tiledsl.compile(ROOT / "programs" / "sp_ag_attention.tds", heap, D=128)
    B, P, H, HKV = 1, 1024, 8, 2
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    Q, O = torch.randn(B, 2, P, H, 128, **bf16), torch.empty(B, 2, P, H, 128, **bf16)
    K, V = torch.randn(B, 2, P, HKV, 128, **bf16), torch.randn(B, 2, P, HKV, 128, **bf16)
    for _ in range(3):
        program(Q, K, V, O, check=True)
    resident("(c) after three calls of sp_ag_attention")
    torch.cuda.synchronize()
    resident("(d) after torch.cuda.synchronize()")
    program.release()
    heap.close()
    resident("(e) after the heap is closed")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
