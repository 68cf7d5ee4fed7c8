"""Every rank's timeline of AG+GEMM and GEMM+RS at the five LLaMA shapes (M = 8192), and what tracing
costs: each program timed untraced and traced in the same run (median of 30 CUDA-event timings of the
slowest rank), then one traced call written as a Perfetto trace and a PNG per shape, with a text
summary of where each rank's time went. Run under torchrun:

    torchrun --nproc-per-node=2 bench/bench_trace.py

TRACE_MODELS=LLaMA-3-70B,Qwen2-72B picks shapes (all five by default); after TRACE_BUDGET_S seconds
(default 270) the shapes left are skipped by name, so a device call's limit never loses the finished
ones; each case's results are written as soon as it ends, with the seconds each phase took.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SHAPES, M, time_ms  # noqa: E402

import tiledsl  # noqa: E402
from tiledsl.tools import trace  # noqa: E402
from tiledsl.runtime.heap import disable_multicast, open_heap  # noqa: E402

OUT = Path(os.environ.get("OUT", Path(__file__).resolve().parent / "results"))
PROGRAMS = Path(__file__).resolve().parents[1] / "programs"


def slowest(ms: float) -> float:
    value = torch.tensor([ms], device="cuda")
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value.item()


def main() -> int:
    disable_multicast()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(7 + rank)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    rows, failures = [], 0
    models = [m for m in os.environ.get("TRACE_MODELS", ",".join(SHAPES)).split(",") if m]
    unknown = set(models) - set(SHAPES)
    if unknown:
        raise SystemExit(f"TRACE_MODELS: no shape named {', '.join(sorted(unknown))} (known: {', '.join(SHAPES)})")
    budget_s, start = float(os.environ.get("TRACE_BUDGET_S", "270")), time.monotonic()
    with open_heap() as heap:
        for model in models:
            N, K = SHAPES[model]
            # every rank agrees whether to go on (rank 0's clock decides)
            over = torch.tensor([time.monotonic() - start > budget_s], device="cuda", dtype=torch.int32)
            dist.broadcast(over, 0)
            if over.item():
                if rank == 0:
                    print(f"SKIP {model}: past the {budget_s:.0f} s budget (TRACE_MODELS={model} runs it)", flush=True)
                continue
            cases = {
                "ag_gemm": (lambda: (torch.randn(M // world, K, **bf16), torch.randn(K, N // world, **bf16),
                                     torch.empty(M, N // world, **bf16))),
                "gemm_rs_ce" if N * M * 2 >= 256 << 20 else "gemm_rs_pull":
                    (lambda: (torch.randn(M, K // world, **bf16), torch.randn(K // world, N, **bf16),
                              torch.empty(M // world, N, **bf16))),
            }
            for name, make in cases.items():
                args = make()
                phase = time.monotonic()
                plain = tiledsl.compile(PROGRAMS / f"{name}.tds", heap)
                traced = tiledsl.compile(PROGRAMS / f"{name}.tds", heap, trace=True)
                plain(*args)
                expected = args[-1].clone()
                args[-1].fill_(float("nan"))
                traced(*args)
                seconds = {"compile_and_first_calls": time.monotonic() - phase}
                ok = torch.isfinite(args[-1]).all().item() and torch.allclose(args[-1].float(), expected.float(),
                                                                               rtol=2e-2, atol=1e-1)
                ok = slowest(0.0 if ok else 1.0) == 0.0
                failures += not ok
                if rank == 0:
                    print(f"{'PASS' if ok else 'FAIL'} traced {name} {model} matches untraced", flush=True)
                phase = time.monotonic()
                untraced_ms = slowest(time_ms(lambda: plain(*args, check=False)))
                traced_ms = slowest(time_ms(lambda: traced(*args, check=False)))
                plain.check()
                traced.check()
                seconds["timing"] = time.monotonic() - phase
                phase = time.monotonic()
                traced(*args)  # the call the timeline shows
                mine = trace.events(traced)
                gathered = [None] * world if rank == 0 else None
                dist.gather_object(mine, gathered, dst=0)
                if rank == 0:
                    found = [e for each in gathered for e in each]
                    stem = OUT / f"trace_{name}_{model}"
                    trace.chrome_trace(found, f"{stem}.json")
                    trace.draw(found, f"{stem}.png")
                    (OUT / f"trace_{name}_{model}.txt").write_text(trace.summary(found) + "\n")
                    seconds["trace_files"] = time.monotonic() - phase
                    rows.append({"program": name, "model": model, "untraced_ms": untraced_ms, "traced_ms": traced_ms,
                                 "overhead": traced_ms / untraced_ms - 1, "seconds": seconds})
                    (OUT / "trace_overhead.json").write_text(json.dumps(rows, indent=1))  # kept if a limit stops us
                    print(f"{name:13} {model:13} untraced {untraced_ms:.4f} ms traced {traced_ms:.4f} ms "
                          f"overhead {100 * (traced_ms / untraced_ms - 1):+.1f}% "
                          f"({', '.join(f'{k} {v:.0f} s' for k, v in seconds.items())})", flush=True)
                plain.release()
                traced.release()
                del args
                torch.cuda.empty_cache()
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
