"""The grouped GEMM tile (group_gemm) and AllGather + grouped GEMM (ag_group_gemm) at the three shapes
of bench_moe.py (Mixtral-8x7B, Qwen1.5-MoE, DeepSeek-MoE at M = 8192), each program at the blocks it
now declares and at others given as consts, against the same baselines measured in the same run
(torch._grouped_mm, or a loop of matmuls; NCCL all-gather + it). One short call on one GPU:

    torchrun --nproc-per-node=1 bench/experiments/moe_speed.py      (under 3 minutes on one H200)

Every timed variant's output is checked first and after timing (bench_moe.timed): a wrong one is a
FAIL line and NaN. Rows go to $OUT/moe_speed_world{N}.json; the last lines give each variant's speed-up
over its baseline and the geometric mean per op. MOE_SPEED_ONLY=group_gemm or ag_group_gemm runs one op."""
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))
import bench_moe as moe  # noqa: E402
from common import Verdicts, save  # noqa: E402

from tiledsl.runtime.heap import disable_multicast, open_heap  # noqa: E402

# None: the program's own blocks (group_gemm 128 x 256, ag_group_gemm 128 x 128); 64 x 128 is what both
# declared when the morning's numbers were measured (ag_group_gemm at 64 x 128 shows what the ranged wait
# alone gains). Two compiled kernels an op: each new set of consts is a JIT compile of tens of seconds.
VARIANTS = {
    "group_gemm": [None, {"BM": 64, "BN": 128}],
    "ag_group_gemm": [None, {"BM": 64, "BN": 128}],
}


def main() -> int:
    disable_multicast()
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(24 << 30))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.manual_seed(1212 + rank)
    heap = open_heap()
    verdicts, rows = Verdicts(), []
    use_torch = moe.torch_grouped_ok()
    only = os.environ.get("MOE_SPEED_ONLY", "")
    if rank == 0:
        print(f"world {world}; times in ms; grouped GEMM baseline: "
              f"{'torch._grouped_mm' if use_torch else 'loop of matmuls'}", flush=True)
    for model, (N, K, E, topk) in moe.AG_SHAPES.items():
        for op, row_of in (("group_gemm", moe.group_gemm_row), ("ag_group_gemm", moe.ag_row)):
            if only and only != op:
                continue
            for consts in VARIANTS[op]:
                row = row_of(heap, world, model, N, K, E, topk, verdicts, use_torch, consts)
                row["blocks"] = "declared" if consts is None else f"{consts['BM']}x{consts['BN']}"
                rows.append(row)
                if rank == 0:
                    baseline = row["torch"] if op == "group_gemm" else row["sequential"]
                    print(f"{op:14s} {model:13s} blocks={row['blocks']:8s} tiledsl={row['tiledsl']:.3f} "
                          f"baseline={baseline:.3f} speedup={baseline / row['tiledsl']:.2f}x", flush=True)
    if rank == 0:
        for op in VARIANTS:
            for blocks in dict.fromkeys(r["blocks"] for r in rows if r["op"] == op):
                ratios = [(r["torch"] if op == "group_gemm" else r["sequential"]) / r["tiledsl"]
                          for r in rows if r["op"] == op and r["blocks"] == blocks]
                mean = moe.geomean(ratios)
                worst = min(ratios) if ratios else math.nan
                print(f"summary: {op} blocks={blocks}: geometric mean {mean:.2f}x, worst {worst:.2f}x over "
                      f"{'torch grouped GEMM (target 0.9x)' if op == 'group_gemm' else 'sequential (target 1.15x)'}",
                      flush=True)
        save(f"moe_speed_world{world}", rows)
    code = verdicts.exit_code()
    heap.close()
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
