"""AG+GEMM and GEMM+RS at M=8192 and the (N, K) of five models, under torchrun: tiledsl against torch
sequential (NCCL + cuBLAS) and torch's async-TP, with cuBLAS alone on the per-rank problem (the
time perfect overlap would give). Every rank times; the slowest rank's median is reported."""
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from common import M, SHAPES, save, slowest, time_ms, time_program  # noqa: E402

import tiledsl  # noqa: E402
from tiledsl.collectives import GemmReduceScatter  # noqa: E402
from tiledsl.runtime.heap import disable_multicast, open_heap  # noqa: E402

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
EXPERIMENTS = Path(__file__).resolve().parent / "experiments"


def async_tp(name, fn):
    try:
        return fn()
    except Exception as error:  # noqa: BLE001 - a missing baseline is reported, not fatal
        if dist.get_rank() == 0:
            print(f"  {name}: unavailable ({type(error).__name__}: {str(error)[:200]})", flush=True)
        return float("nan")


def main() -> int:
    disable_multicast()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    heap = open_heap()
    group = dist.group.WORLD.group_name
    try:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group
        enable_symm_mem_for_group(group)
    except Exception:  # noqa: BLE001
        pass
    only = os.environ.get("BENCH_ONLY", "ag_gemm,gemm_rs").split(",")
    # variants of each operation from programs/: the table reports the best and every variant's time is
    # kept; experiments (bench/experiments/) are timed beside them but never count as the best
    ag = {name: tiledsl.compile(PROGRAMS / f"{name}.tds", heap)
          for name in ("ag_gemm", "ag_gemm_push")} if "ag_gemm" in only else None
    # product tiles in groups of 8 rows within each owner's rows, instead of column by column
    ag_experiments = {"ag_gemm_grouped": tiledsl.compile(EXPERIMENTS / "ag_gemm_grouped.tds", heap)} \
        if "ag_gemm" in only else {}
    rs = {name: tiledsl.compile(PROGRAMS / f"{name}.tds", heap)
          for name in ("gemm_rs", "gemm_rs_pull", "gemm_rs_ce")} if "gemm_rs" in only else None
    gemm_rs = GemmReduceScatter(heap)
    rs_experiments = {name: tiledsl.compile(EXPERIMENTS / f"{name}.tds", heap)
                      for name in ("gemm_rs_pull_grouped",)} if "gemm_rs" in only else {}
    rows = []
    for model, (N, K) in SHAPES.items():
        bf16 = dict(device="cuda", dtype=torch.bfloat16)
        if ag is not None:
            A = torch.randn(M // world, K, **bf16)
            B = torch.randn(K, N // world, **bf16)
            C = torch.empty(M, N // world, **bf16)
            full = torch.empty(M, K, **bf16)
            row = {"op": "ag_gemm", "model": model, "world": world, "M": M, "N": N, "K": K}
            for name, program in {**ag, **ag_experiments}.items():
                row[name] = time_program(program, A, B, C)
            row["tiledsl"] = min(row[name] for name in ag)
            row["gemm"] = slowest(time_ms(lambda: torch.matmul(full, B, out=C)))
            row["comm"] = slowest(time_ms(lambda: dist.all_gather_into_tensor(full, A)))

            def sequential():
                dist.all_gather_into_tensor(full, A)
                torch.matmul(full, B, out=C)
            row["sequential"] = slowest(time_ms(sequential))
            row["async_tp"] = slowest(async_tp("fused_all_gather_matmul", lambda: time_ms(
                lambda: torch.ops.symm_mem.fused_all_gather_matmul(A, [B], 0, group))))
            rows.append(row)
            del A, B, C, full
        if rs is not None:
            A = torch.randn(M, K // world, **bf16)
            B = torch.randn(K // world, N, **bf16)
            C = torch.empty(M // world, N, **bf16)
            P = torch.empty(M, N, **bf16)
            row = {"op": "gemm_rs", "model": model, "world": world, "M": M, "N": N, "K": K}
            for name, program in {**rs, **rs_experiments}.items():
                row[name] = time_program(program, A, B, C)
            row["tiledsl"] = min(row[name] for name in rs)
            # what a caller gets from the launcher, which picks by product size (no peeking at times)
            row["launcher_choice"] = gemm_rs.choose(A, B)
            row["launcher"] = row[f"gemm_rs_{'pull' if row['launcher_choice'] == 'pull' else 'ce'}"]
            row["gemm"] = slowest(time_ms(lambda: torch.matmul(A, B, out=P)))
            row["comm"] = slowest(time_ms(lambda: dist.reduce_scatter_tensor(C, P)))

            def sequential_rs():
                torch.matmul(A, B, out=P)
                dist.reduce_scatter_tensor(C, P)
            row["sequential"] = slowest(time_ms(sequential_rs))
            row["async_tp"] = slowest(async_tp("fused_matmul_reduce_scatter", lambda: time_ms(
                lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 0, group))))
            rows.append(row)
            del A, B, C, P
        if rank == 0:
            for row in rows[-2:]:
                variants = ", ".join(f"{k} {v:.3f}" for k, v in row.items() if k.startswith(("ag_gemm", "gemm_rs")))
                chosen = f", launcher picks {row['launcher_choice']}" if "launcher_choice" in row else ""
                print(f"{row['op']:8} {row['model']:13} world {world}: tiledsl {row['tiledsl']:.3f} ms ({variants}{chosen}), "
                      f"sequential {row['sequential']:.3f}, async-TP {row['async_tp']:.3f}, "
                      f"gemm {row['gemm']:.3f}, comm {row['comm']:.3f}", flush=True)
    if rank == 0:
        save(f"overlap_world{world}", {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                       "rows": rows})
    dist.barrier()
    heap.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
