"""tiledsl.ops against its own torch + NCCL path, in the same run: the tuner's promise ("never slower than
unfused") measured at the shapes of a LLaMA-3-8B layer under tensor parallelism (bf16). For each op and
shape: the first call tunes (measures every path and keeps the fastest); then the tuned call and the
torch path (`impl="torch"`) are each checked against float64 results of every rank's inputs and timed
back to back (median of 10 windows of 20 calls between CUDA events, the two paths' windows taken
in turn, the slowest rank's). A tuned call
more than 5% slower than the torch path prints a SLOWER line; a wrong output a FAIL line (exit 1).

    torchrun --nproc-per-node=2 bench/bench_ops.py
"""
from __future__ import annotations

import math
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "gpu"))
from common import Verdicts, rank0, save, slowest, time_interleaved_ms  # noqa: E402
from ops_checks import expected, fresh  # noqa: E402

import tiledsl.ops as ops  # noqa: E402
from tiledsl.runtime.heap import disable_multicast, open_heap  # noqa: E402

HIDDEN, FFN = 4096, 14336  # LLaMA-3-8B


def shapes(world: int) -> list[tuple[str, str, list[tuple], dict]]:
    """(label, op, this rank's input shapes, kwargs) at a prefill of 8192 tokens and decode batches."""
    rows = 8192 // world
    return [
        ("AG+GEMM up/gate, prefill 8192", "all_gather_matmul", [(rows, HIDDEN), (HIDDEN, 2 * FFN // world)], {}),
        ("AG+GEMM QKV, prefill 8192", "all_gather_matmul", [(rows, HIDDEN), (HIDDEN, 6144 // world)], {}),
        ("GEMM+RS down, prefill 8192", "matmul_reduce_scatter", [(8192, FFN // world), (FFN // world, HIDDEN)], {}),
        ("GEMM+RS out, prefill 8192", "matmul_reduce_scatter", [(8192, HIDDEN // world), (HIDDEN // world, HIDDEN)], {}),
        *[(f"GEMM+AR down, decode {m}", "matmul_all_reduce", [(m, FFN // world), (FFN // world, HIDDEN)], {})
          for m in (1, 16, 128)],
        *[(f"AllReduce {nbytes >> 10} KB", "all_reduce", [(nbytes // 2,)], {}) for nbytes in (8 << 10, 1 << 20)],
        ("AllReduce 64 MB", "all_reduce", [(32 << 20,)], {}),
        ("AllGather 8192x4096 total", "all_gather", [(rows, HIDDEN)], {}),
        ("ReduceScatter 8192x4096", "reduce_scatter", [(8192, HIDDEN)], {}),
        *[(f"AR+RMSNorm, decode {m}", "all_reduce_rmsnorm", [(m, HIDDEN), (m, HIDDEN), (HIDDEN,)], {"eps": 1e-5})
          for m in (1, 128)],
    ]


def main() -> int:
    disable_multicast()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(31 + rank)
    ops.configure(progress=False, cache_dir=os.path.join(tempfile.gettempdir(), f"tiledsl_bench_ops_{os.getpid()}"))
    verdicts, rows = Verdicts(), []
    with open_heap() as heap:
        ops.use_heap(heap)
        for label, op, shape, kwargs in shapes(world):
            tensors = fresh(shape, torch.bfloat16)
            want = expected(op, tensors, kwargs, rank, world)
            fn = getattr(ops, op)
            tuned = fn(*tensors, **kwargs)  # tunes: measures every path, keeps the fastest
            choice = ops.decision(op).choice
            calls = {}
            for name, extra in (("tiledsl", {}), ("torch", {"impl": "torch"})):
                got = fn(*tensors, **kwargs, **extra)
                got = list(got) if isinstance(got, tuple) else [got]
                if all(verdicts.ok(f"{label} {name} output {n}", g, w.float(), 3e-2)
                       for n, (g, w) in enumerate(zip(got, want, strict=True))):
                    calls[name] = (lambda extra=extra: fn(*tensors, **kwargs, **extra))
            # the two paths' windows in turn: when the tuner kept torch, the two are one path, and what
            # differs is the dispatch alone
            measured = time_interleaved_ms(calls) if calls else {}
            times = {name: slowest(measured[name]) if name in measured else math.nan for name in ("tiledsl", "torch")}
            ops.check()
            del tuned
            ratio = times["torch"] / times["tiledsl"]
            rows.append({"label": label, "op": op, "shape": shape, "choice": choice, "tiledsl_ms": times["tiledsl"],
                         "torch_ms": times["torch"], "speedup": ratio})
            if rank0():
                print(f"{label:32} {choice:34} tiledsl {times['tiledsl']:.4f} ms  torch {times['torch']:.4f} ms  "
                      f"{ratio:.2f}x", flush=True)
                if ratio < 1 / 1.05:
                    print(f"SLOWER {label}: the tuned choice {choice} is {1 / ratio:.2f}x the torch path's time",
                          flush=True)
        explained = ops.explain()
        ops.reset()
    if rank0():
        save("ops_world%d" % world, {"rows": rows, "explain": explained})
        finite = [r["speedup"] for r in rows if r["speedup"] == r["speedup"]]
        if finite:
            geomean = math.exp(sum(math.log(r) for r in finite) / len(finite))
            print(f"geomean over the torch path: {geomean:.3f}x ({len(finite)} shapes); "
                  f"{sum(r < 1 / 1.05 for r in finite)} more than 5% slower", flush=True)
    dist.destroy_process_group()
    return verdicts.exit_code()


if __name__ == "__main__":
    sys.exit(main())
