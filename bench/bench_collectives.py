"""AllReduce and GEMM+AllReduce under torchrun: tiledsl one-shot, two-shot and auto (the launcher's
choice) against NCCL and torch's symmetric-memory kernels; AllReduce latency from 8 KB to 1 MB and bus
bandwidth (2 (world-1)/world bytes / time) from 1 MB to 256 MB, bf16; GEMM+AllReduce at decode shapes
(M of 1 to 128, N = K = 8192, K sharded over the ranks) against cuBLAS + NCCL. Every rank times; the
slowest rank's median is reported. Timing is back to back (20 calls between two CUDA events, the
median over windows), as a loop runs them; `alone_` columns time one call at a time, synchronised
in between, so that the host's launch cost shows. The one-shot/two-shot crossover printed last is what
tiledsl.collectives.DEFAULT_THRESHOLD_BYTES should be set from (one-shot and two-shot run with the
launch options tiledsl.collectives.ALGORITHM_OPTIONS gives them). Every tiledsl output is checked
against NCCL's before it is timed: a wrong one is a FAIL line, left out, and the exit code is 1."""
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from common import NAN, Verdicts, program_call, save, slowest, time_checked, time_loop_ms, time_ms  # noqa: E402

import tiledsl  # noqa: E402
from tiledsl.collectives import AllReduce  # noqa: E402
from tiledsl.runtime.heap import disable_multicast, open_heap  # noqa: E402

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
# the earlier push-based all-reduces, timed beside the pull-based ones in programs/ (same data)
EXPERIMENTS_DIR = Path(__file__).parent / "experiments"
EXPERIMENTS = {"push_one_shot": EXPERIMENTS_DIR / "allreduce_push.tds",
               "push_two_shot": EXPERIMENTS_DIR / "allreduce_two_shot_push.tds"}
# experiments timed only up to a size: the push programs take 4-19 ms at 256 MB
EXPERIMENT_MAX_BYTES = {"push_one_shot": 16 << 20, "push_two_shot": 1 << 20, "push_one_shot_entry_kernel": 1 << 20}
GEMM_AR_PUSH = EXPERIMENTS_DIR / "gemm_ar_push.tds"
LATENCY_BYTES = [8 << 10 << n for n in range(8)]       # 8 KB .. 1 MB
BANDWIDTH_BYTES = [1 << 20 << 2 * n for n in range(5)]  # 1 MB .. 256 MB
GEMM_M = (1, 8, 32, 64, 128)
GEMM_NK = 8192


_reported = set()


def optional(name, fn):
    """A baseline this torch may lack: NaN and one line saying why, instead of a crash."""
    try:
        return fn()
    except Exception as error:  # noqa: BLE001 - a missing baseline is reported, not fatal
        if dist.get_rank() == 0 and name not in _reported:
            _reported.add(name)
            print(f"  {name}: unavailable ({type(error).__name__}: {str(error)[:160]})", flush=True)
        return NAN


def symm_mem_input(numel, group):
    """A bf16 buffer in torch's symmetric memory, which torch.ops.symm_mem's all-reduces need."""
    from torch.distributed import _symmetric_memory as symm_mem
    x = symm_mem.empty(numel, dtype=torch.bfloat16, device="cuda")
    symm_mem.rendezvous(x, group)
    return x


def allreduce_row(allreduce, experiments, numel, world, group, reps, verdicts):
    """Each column: calls back to back (steady state, `time_loop_ms`); `alone_*`: one call at a time,
    synchronised between calls, so the host's launch cost shows. Random data, put back (untimed) before
    every window: each call sums in place, so it starts small (and normal in bf16) to stay finite.
    Every tiledsl column is timed only once one call on that data gave NCCL's float32 sum."""
    windows = 10 if reps >= 30 else 5
    fresh = torch.randn(numel, device="cuda", dtype=torch.bfloat16) * 2.0 ** -100
    x = torch.empty_like(fresh)
    refill = lambda: x.copy_(fresh)  # noqa: E731
    want = fresh.float()
    dist.all_reduce(want)
    nbytes = numel * x.element_size()
    row = {"op": "allreduce", "world": world, "bytes": nbytes, "auto_algorithm": allreduce.choose(x)}
    loop = dict(before=refill, recheck=False, timer=time_loop_ms, windows=windows)
    for algorithm in ("one_shot", "two_shot", None):
        def call(check, algorithm=algorithm):
            allreduce(x, algorithm=algorithm, check=check)
        key = algorithm or "auto"  # auto: what a caller gets, AllReduce's own choice
        row[key] = time_checked(verdicts, f"allreduce {nbytes} B {key}", call, allreduce.check, x, want, **loop)
        if algorithm is None:
            row["alone_auto"] = NAN if math.isnan(row[key]) else slowest(
                time_ms(lambda: call(False), reps=reps, before=refill))
            allreduce.check()
    for key, program in experiments.items():
        if nbytes > EXPERIMENT_MAX_BYTES.get(key, float("inf")):
            row[key] = NAN
            continue
        row[key] = time_checked(verdicts, f"allreduce {nbytes} B {key}", program_call(program, x), program.check,
                                x, want, **loop)
    # out of place from an input allocated on the symmetric heap (tiledsl.empty): nothing staged, the kernel
    # is the whole call (torch's symm_mem all-reduces likewise take their input in symmetric memory)
    heap_x = tiledsl.empty(numel, torch.bfloat16, heap=allreduce.heap)
    heap_x.copy_(fresh)
    y = torch.empty_like(x)
    row["heap_input"] = time_checked(verdicts, f"allreduce {nbytes} B heap_input",
                                     lambda check: allreduce(heap_x, out=y, check=check), allreduce.check, y, want,
                                     timer=time_loop_ms, windows=windows)
    row["best"], row["best_variant"] = best(row, ("one_shot", "two_shot", "heap_input", *experiments))
    row["nccl"] = slowest(time_loop_ms(lambda: dist.all_reduce(x), windows=windows, before=refill))
    row["alone_nccl"] = slowest(time_ms(lambda: dist.all_reduce(x), reps=reps, before=refill))
    symm = optional("symm_mem.empty + rendezvous", lambda: symm_mem_input(numel, group))
    ops = {"symm_mem_one_shot": lambda: torch.ops.symm_mem.one_shot_all_reduce(symm, "sum", group),
           "symm_mem_two_shot": lambda: torch.ops.symm_mem.two_shot_all_reduce_(symm, "sum", group)}
    for key, op in ops.items():
        mine = NAN if not isinstance(symm, torch.Tensor) else optional(
            key, lambda op=op: time_loop_ms(op, windows=windows, before=lambda: symm.copy_(fresh)))
        row[key] = slowest(mine)
    return row


def best(row, names):
    """The fastest of `names` that ran and was right: (time, name), or (NaN, None)."""
    timed = [(row[name], name) for name in names if math.isfinite(row[name])]
    return min(timed) if timed else (NAN, None)


def crossover(rows) -> int | None:
    """The smallest size from which two-shot is at least as fast as one-shot at every larger size."""
    found = None
    for row in sorted(rows, key=lambda r: r["bytes"]):
        if row["two_shot"] <= row["one_shot"]:
            found = found or row["bytes"]
        else:
            found = None
    return found


def gemm_ar_row(program, variants, M, world, verdicts):
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    A = torch.randn(M, GEMM_NK // world, **bf16)
    B = torch.randn(GEMM_NK // world, GEMM_NK, **bf16)
    C = torch.empty(M, GEMM_NK, **bf16)
    product = A @ B  # what NCCL alone sums, put back before each window (each call doubles it)
    want = A.float() @ B.float()
    dist.all_reduce(want)
    row = {"op": "gemm_ar", "world": world, "M": M, "N": GEMM_NK, "K": GEMM_NK}
    tag = f"gemm_ar M={M}"
    row["tiledsl"] = time_checked(verdicts, f"{tag} gemm_ar", program_call(program, A, B, C), program.check, C, want,
                                  timer=time_loop_ms)
    row["alone_tiledsl"] = time_checked(verdicts, f"{tag} gemm_ar one call alone", program_call(program, A, B, C),
                                        program.check, C, want)
    for key, variant in variants.items():
        row[f"tiledsl_{key}"] = time_checked(verdicts, f"{tag} {key}", program_call(variant, A, B, C), variant.check,
                                             C, want, timer=time_loop_ms)
    row["best"], best_key = best(row, ("tiledsl", *(f"tiledsl_{key}" for key in variants)))
    row["best_variant"] = best_key and ("gemm_ar" if best_key == "tiledsl" else best_key.removeprefix("tiledsl_"))
    row["gemm"] = slowest(time_loop_ms(lambda: torch.matmul(A, B, out=C)))
    row["nccl"] = slowest(time_loop_ms(lambda: dist.all_reduce(C), before=lambda: C.copy_(product)))

    def sequential():
        torch.matmul(A, B, out=C)
        dist.all_reduce(C)
    row["sequential"] = slowest(time_loop_ms(sequential))
    row["alone_sequential"] = slowest(time_ms(sequential))
    return row


def main() -> int:
    disable_multicast()
    # staging buffers are world times the message, per size: more than NVSHMEM's 1 GiB default heap
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(16 << 30))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(rank)  # every rank its own data: a sum of equal copies hides a rank read twice
    heap = open_heap()
    group = dist.group.WORLD.group_name
    try:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group
        enable_symm_mem_for_group(group)
    except Exception:  # noqa: BLE001 - older torch: the symm_mem baselines report themselves unavailable
        pass
    verdicts = Verdicts()
    allreduce = AllReduce(heap)
    experiments = {key: tiledsl.compile(path, heap) for key, path in EXPERIMENTS.items()}
    # the entry folded into the kernel (the default where no input is staged) against a separate entry
    # kernel, on the push one-shot (programs with staged inputs never fold: measured slower)
    experiments["push_one_shot_entry_kernel"] = tiledsl.compile(EXPERIMENTS["push_one_shot"], heap, fold_entry=False)
    # one-shot at 8192 elements a tile instead of 2048
    experiments["one_shot_block8192"] = tiledsl.compile(PROGRAMS / "allreduce.tds", heap, num_warps=16, BLOCK=8192)
    # two-shot with a larger block and more warps per program, to choose defaults from
    experiments["two_shot_block32768_warps16"] = tiledsl.compile(PROGRAMS / "allreduce_two_shot.tds", heap,
                                                                 BLOCK=32768, num_warps=16)
    rows = []
    if rank == 0:
        print(f"world {world}; auto threshold {allreduce.threshold_bytes} bytes; times in ms, busbw in GB/s",
              flush=True)
    for nbytes in sorted(set(LATENCY_BYTES + BANDWIDTH_BYTES)):
        numel = nbytes // 2
        row = allreduce_row(allreduce, experiments, numel, world, group, 30 if nbytes <= 16 << 20 else 10, verdicts)
        factor = 2 * (world - 1) / world * nbytes / 1e6  # bytes per ms -> GB/s
        row["busbw"] = {k: factor / row[k] for k in ("one_shot", "two_shot", "auto", "heap_input", *experiments,
                                                      "nccl", "symm_mem_one_shot", "symm_mem_two_shot")}
        rows.append(row)
        if rank == 0:
            kind = "latency" if nbytes in LATENCY_BYTES else "busbw"
            cells = ", ".join(f"{k} {row[k]:.4f}" + (f" ({row['busbw'][k]:.0f} GB/s)" if kind == "busbw" else "")
                              for k in ("one_shot", "two_shot", "auto", "heap_input", *experiments, "nccl",
                                        "symm_mem_one_shot", "symm_mem_two_shot"))
            print(f"allreduce {nbytes:>10} B [{row['auto_algorithm']}]: {cells} ms; best variant "
                  f"{row['best_variant']}; one call alone: auto {row['alone_auto']:.4f}, nccl {row['alone_nccl']:.4f}",
                  flush=True)
    threshold = crossover(rows)
    gemm_ar = tiledsl.compile(PROGRAMS / "gemm_ar.tds", heap)
    # the earlier push program, and the entry kernel instead of the folded entry
    gemm_ar_variants = {"push": tiledsl.compile(GEMM_AR_PUSH, heap),
                        "entry_kernel": tiledsl.compile(PROGRAMS / "gemm_ar.tds", heap, fold_entry=False)}
    for M in GEMM_M:
        row = gemm_ar_row(gemm_ar, gemm_ar_variants, M, world, verdicts)
        rows.append(row)
        if rank == 0:
            print(f"gemm_ar M={M:<4} N=K={GEMM_NK} world {world}: tiledsl {row['tiledsl']:.4f} ms (push {row['tiledsl_push']:.4f}, "
                  f"entry kernel {row['tiledsl_entry_kernel']:.4f}), "
                  f"sequential {row['sequential']:.4f}, gemm {row['gemm']:.4f}, nccl {row['nccl']:.4f}; one call alone: "
                  f"tiledsl {row['alone_tiledsl']:.4f}, sequential {row['alone_sequential']:.4f}", flush=True)
    if rank == 0:
        print(f"one-shot/two-shot crossover: {threshold} bytes (DEFAULT_THRESHOLD_BYTES is "
              f"{allreduce.threshold_bytes})", flush=True)
        save(f"collectives_world{world}", {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                           "threshold_bytes": allreduce.threshold_bytes, "crossover_bytes": threshold,
                                           "wrong": verdicts.wrong, "rows": rows})
    code = verdicts.exit_code()
    dist.barrier()
    heap.close()
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
