"""AG+GEMM and GEMM+RS at M=8192 and the (N, K) of five models, under torchrun: tiledsl against torch
sequential (NCCL + cuBLAS) and torch's async-TP, with cuBLAS alone on the per-rank problem (the
time perfect overlap would give). The headline is what a user gets: the library's ag_gemm program,
and the GemmReduceScatter launcher's own choice; the best of the library's variants is a column of
its own. Every tiledsl output is checked against torch sequential's before it is timed (a wrong one
is a FAIL line, left out, and the exit code is 1); every figure is timed on random data. Every rank
times; the slowest rank's median is reported."""
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from common import (M, NAN, SHAPES, Verdicts, program_call, rank0, save, slowest, time_checked,  # noqa: E402
                    time_ms)

import tiledsl  # noqa: E402
from tiledsl.collectives import GEMM_RS_PROGRAMS, GemmReduceScatter  # noqa: E402
from tiledsl.runtime.heap import disable_multicast, open_heap  # noqa: E402

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
EXPERIMENTS = Path(__file__).resolve().parent / "experiments"


def async_tp(name, fn):
    try:
        return fn()
    except Exception as error:  # noqa: BLE001 - a missing baseline is reported, not fatal
        if rank0():
            print(f"  {name}: unavailable ({type(error).__name__}: {str(error)[:200]})", flush=True)
        return float("nan")


def best(row, names):
    """The fastest of `names` that ran and was right: (time, name), or (NaN, None)."""
    timed = [(row[name], name) for name in names if math.isfinite(row[name])]
    return min(timed) if timed else (NAN, None)


def ag_gemm_row(model, N, K, world, variants, experiments, verdicts, group):
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    A = torch.randn(M // world, K, **bf16)
    B = torch.randn(K, N // world, **bf16)
    C = torch.empty(M, N // world, **bf16)
    full, want = torch.empty(M, K, **bf16), torch.empty(M, N // world, **bf16)
    dist.all_gather_into_tensor(full, A)  # also the gathered rows cuBLAS alone multiplies: random data
    torch.matmul(full, B, out=want)       # torch sequential's result, which every variant must give
    row = {"op": "ag_gemm", "model": model, "world": world, "M": M, "N": N, "K": K}
    for name, program in {**variants, **experiments}.items():
        row[name] = time_checked(verdicts, f"ag_gemm {model} {name}", program_call(program, A, B, C),
                                 program.check, C, want)
    row["tiledsl"], row["tiledsl_program"] = row["ag_gemm"], "ag_gemm"  # the library's program
    row["best"], row["best_variant"] = best(row, variants)
    row["gemm"] = slowest(time_ms(lambda: torch.matmul(full, B, out=C)))
    row["comm"] = slowest(time_ms(lambda: dist.all_gather_into_tensor(full, A)))

    def sequential():
        dist.all_gather_into_tensor(full, A)
        torch.matmul(full, B, out=C)
    row["sequential"] = slowest(time_ms(sequential))
    row["async_tp"] = slowest(async_tp("fused_all_gather_matmul", lambda: time_ms(
        lambda: torch.ops.symm_mem.fused_all_gather_matmul(A, [B], 0, group))))
    return row


def gemm_rs_row(model, N, K, world, launcher, variants, experiments, verdicts, group):
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    A = torch.randn(M, K // world, **bf16)
    B = torch.randn(K // world, N, **bf16)
    C = torch.empty(M // world, N, **bf16)
    P, want = torch.empty(M, N, **bf16), torch.empty(M // world, N, **bf16)
    torch.matmul(A, B, out=P)  # also the product NCCL alone reduce-scatters: random data
    dist.reduce_scatter_tensor(want, P)  # torch sequential's result, which every variant must give
    row = {"op": "gemm_rs", "model": model, "world": world, "M": M, "N": N, "K": K}
    # what a caller gets: the launcher, which picks by product size (no peeking at times)
    row["tiledsl"] = time_checked(verdicts, f"gemm_rs {model} GemmReduceScatter",
                                  lambda check: launcher(A, B, C, check=check), launcher.check, C, want)
    row["tiledsl_program"] = GEMM_RS_PROGRAMS[launcher.last_program]
    for name, program in {**variants, **experiments}.items():
        row[name] = time_checked(verdicts, f"gemm_rs {model} {name}", program_call(program, A, B, C),
                                 program.check, C, want)
    row["best"], row["best_variant"] = best(row, variants)
    row["gemm"] = slowest(time_ms(lambda: torch.matmul(A, B, out=P)))
    row["comm"] = slowest(time_ms(lambda: dist.reduce_scatter_tensor(C, P)))

    def sequential():
        torch.matmul(A, B, out=P)
        dist.reduce_scatter_tensor(C, P)
    row["sequential"] = slowest(time_ms(sequential))
    row["async_tp"] = slowest(async_tp("fused_matmul_reduce_scatter", lambda: time_ms(
        lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 0, group))))
    return row


def show(row):
    variants = ", ".join(f"{k} {v:.3f}" for k, v in row.items() if k.startswith(("ag_gemm", "gemm_rs")))
    print(f"{row['op']:8} {row['model']:13} world {row['world']}: tiledsl {row['tiledsl']:.3f} ms "
          f"({row['tiledsl_program']}), best variant {row['best']:.3f} ({row['best_variant']}; {variants}), "
          f"sequential {row['sequential']:.3f}, async-TP {row['async_tp']:.3f}, "
          f"gemm {row['gemm']:.3f}, comm {row['comm']:.3f}", flush=True)


def main() -> int:
    disable_multicast()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(rank)
    heap = open_heap()
    group = dist.group.WORLD.group_name
    try:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group
        enable_symm_mem_for_group(group)
    except Exception:  # noqa: BLE001
        pass
    only = os.environ.get("BENCH_ONLY", "ag_gemm,gemm_rs").split(",")
    verdicts = Verdicts()
    # variants of each operation from programs/ (the best of them is reported beside the headline);
    # experiments (bench/experiments/) are timed beside them but never count as the best
    if "ag_gemm" in only:
        ag = {name: tiledsl.compile(PROGRAMS / f"{name}.tds", heap) for name in ("ag_gemm", "ag_gemm_push")}
        # product tiles in groups of 8 rows within each owner's rows, instead of column by column
        ag_experiments = {"ag_gemm_grouped": tiledsl.compile(EXPERIMENTS / "ag_gemm_grouped.tds", heap)}
    if "gemm_rs" in only:
        launcher = GemmReduceScatter(heap)
        # the launcher's own programs: its choice and the variant of that name are one program
        rs = {"gemm_rs": tiledsl.compile(PROGRAMS / "gemm_rs.tds", heap),
              **{GEMM_RS_PROGRAMS[choice]: launcher.program(choice) for choice in GEMM_RS_PROGRAMS}}
        rs_experiments = {name: tiledsl.compile(EXPERIMENTS / f"{name}.tds", heap)
                          for name in ("gemm_rs_pull_grouped", "gemm_rs_fused")}
    rows = []
    for model, (N, K) in SHAPES.items():
        if "ag_gemm" in only:
            rows.append(ag_gemm_row(model, N, K, world, ag, ag_experiments, verdicts, group))
            if rank == 0:
                show(rows[-1])
        if "gemm_rs" in only:
            rows.append(gemm_rs_row(model, N, K, world, launcher, rs, rs_experiments, verdicts, group))
            if rank == 0:
                show(rows[-1])
    if rank == 0:
        save(f"overlap_world{world}", {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                       "wrong": verdicts.wrong, "rows": rows})
    code = verdicts.exit_code()
    dist.barrier()
    heap.close()
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
