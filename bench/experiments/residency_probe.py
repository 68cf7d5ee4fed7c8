"""Does a persistent kernel with as many programs as SMs time out because one program is never resident?

A tiledsl kernel hands instances to programs round-robin and its tiles wait on other programs'
instances: all programs must be resident at once. sp_ag_attention at BM=128 BN=64 (one program an
SM) timed out at B=2 P=2048 with 132 programs and passed with 128 on one H200 (session 12 run 2);
ag_group_gemm timed out at Mixtral's size. This runs each with grids of 132, 131, 130 and 128
programs and prints, beside each verdict, how many of the kernel's programs fit on one SM (the
occupancy API, from the compiled kernel's registers and shared memory).

    torchrun --nproc-per-node=1 bench/experiments/residency_probe.py
"""
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from cuda.bindings import driver

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
from harness import start  # noqa: E402

import tiledsl  # noqa: E402

CALLS = 20


def occupancy(program) -> str:
    """Programs of the compiled kernel that fit on one SM, with its registers and shared memory."""
    found = []
    try:
        found += _occupancy(program)
    except Exception as error:  # noqa: BLE001 - a probe's side note
        found.append(f"occupancy unknown ({type(error).__name__}: {error})")
    return "; ".join(found) or "not compiled"


def _occupancy(program) -> list:
    found = []
    for cache in program.spec.kernel.device_caches.values():
        for compiled in cache[0].values():
            threads = compiled.metadata.num_warps * 32
            status, blocks = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                driver.CUfunction(compiled.function), threads, compiled.metadata.shared)
            found.append(f"{blocks} a SM ({compiled.n_regs} registers x {threads} threads, "
                         f"{compiled.metadata.shared} B shared)")
    return found


def trial(label, program, call):
    try:
        for n in range(CALLS):
            call(check=True)
        verdict = f"ran {CALLS} calls"
    except Exception as error:  # noqa: BLE001 - the verdict
        verdict = f"FAILED at call {n}: {type(error).__name__}: {str(error)[:160]}"
    if dist.get_rank() == 0:
        print(f"{label:48s} {verdict}; {occupancy(program)}; copies: {copies(program)}", flush=True)


def copies(program) -> str:
    """How the prepared calls' copy-engine chunks are issued: raw cuMemcpyAsync, or torch's copy_."""
    kinds = {"raw": 0, "torch copy_": 0}
    for call in program._calls.values():
        for op in getattr(call.copy_list, "_ops", []) if call.copy_list is not None else []:
            kinds["raw" if op[1] is not None else "torch copy_"] += 1
    return ", ".join(f"{n} {k}" for k, n in kinds.items())


def main():
    _, world, heap = start(5)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    grids = [int(g) for g in os.environ.get("GRIDS", "").split(",") if g] or [sms, sms - 1, sms - 2, sms - 4]
    for grid in grids:
        program = tiledsl.compile(ROOT / "programs" / "sp_ag_attention.tds", heap, D=128, BM=128, BN=64,
                                  num_sms=grid)
        B, P, H, HKV = 2, 2048, 32, 8
        Q, O = torch.randn(B, 2, P, H, 128, **bf16), torch.empty(B, 2, P, H, 128, **bf16)
        K, V = torch.randn(B, 2, P, HKV, 128, **bf16), torch.randn(B, 2, P, HKV, 128, **bf16)
        trial(f"sp_ag_attention BM=128 BN=64, {grid} programs", program,
              lambda check, p=program: p(Q, K, V, O, check=check))
        program.release()
    T, K, N, E, topk = 8192 // world, 14336, 4096 // world, 8, 2   # Mixtral-8x7B, as bench_moe.py
    A = torch.randn(T, K, **bf16)
    ids = torch.stack([torch.randperm(E, device="cuda")[:topk] for _ in range(T)]).int()
    Bw = torch.randn(E, K, N, **bf16) * K ** -0.5
    C = int(torch.bincount(ids.flatten().long(), minlength=E).max()) * world
    G = torch.empty(world, E, C, N, **bf16)
    count = torch.empty(world, E, device="cuda", dtype=torch.int32)
    for grid in grids[:1] + grids[-1:]:
        program = tiledsl.compile(ROOT / "programs" / "ag_group_gemm.tds", heap, num_sms=grid)
        trial(f"ag_group_gemm Mixtral, {grid} programs", program,
              lambda check, p=program: p(A=A, ids=ids, B=Bw, G=G, count=count, check=check))
        program.release()
    heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
