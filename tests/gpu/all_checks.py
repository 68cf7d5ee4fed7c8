"""Every GPU check suite in ONE process group, one suite after another: the runtime smoke test, the
programs (multigpu_checks), collectives, MoE, attention, tiledsl.ops and the two-level programs (nodes,
on ranks posing as TILEDSL_NODES=2 nodes). One torchrun pays the start-up once; each suite gets a heap of
its own (opened, used, closed) and a share of the time:

    torchrun --nproc-per-node=8 tests/gpu/all_checks.py [--budget-s 170] [--suites moe,ops]

--budget-s S: the suites share S seconds from the start in proportion to WEIGHTS, a suite that ends early
leaving its time to the rest; no check starts past its suite's end (SKIP ... out of time), the first
check of every suite always runs. Where ranks share a GPU the checks run spread over their programs
(harness.Checks). Rank 0 prints every PASS/FAIL/SKIP line with its suite, a table of the suites, and
the summary line last. teardown_check.py stays a script of its own: it judges how processes end."""
import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "bench")]
import harness  # noqa: E402
from harness import Checks, summary_line  # noqa: E402

from tiledsl.runtime import placement  # noqa: E402
from tiledsl.runtime.heap import open_heap  # noqa: E402

# (suite, its module, its share of the time): the weights follow how long each took on one H200
SUITES = [("smoke", "smoke_runtime", 0.3), ("programs", "multigpu_checks", 1.0), ("collectives", "collectives_checks", 1.0),
          ("moe", "moe_checks", 1.2), ("attention", "attention_checks", 1.0), ("ops", "ops_checks", 1.0),
          ("nodes", "nodes_checks", 0.8)]
HEAP_BYTES = 16 << 30  # the most a suite asks for (collectives, MoE, nodes); placement caps it on a shared GPU


def smoke_register(checks, rank, world, heap):
    """bench/smoke_runtime.py's three ways of writing into peers and signalling them, as checks."""
    import smoke_runtime
    from tiledsl.runtime.heap import NvshmemHeap

    def check(test):
        def run():
            failure = test(heap)
            assert failure is None, failure
        return run
    checks.record("peer_stores", check(smoke_runtime.peer_stores))
    checks.record("copy_engine_signals", check(smoke_runtime.copy_engine_signals))
    if isinstance(heap, NvshmemHeap):
        checks.record("nvshmem_put_signal", check(smoke_runtime.nvshmem_put_signal))


def run_suite(name, module_name, rank, world, deadline) -> dict:
    """One suite: its heap (and topology), its checks, its heap closed; what it did."""
    began = time.monotonic()
    module = None if name == "smoke" else __import__(module_name)
    torch.manual_seed(getattr(module, "SEED", 0) + rank)
    nodes_before = os.environ.get("TILEDSL_NODES")
    if name == "nodes":
        os.environ["TILEDSL_NODES"] = "2"  # the ranks pose as two nodes: across them only NVSHMEM reaches
    checks = Checks(deadline=deadline, prefix=f"{name}: ")
    heap = None
    try:
        heap = open_heap()
        if rank == 0 and name == "nodes" and heap is not None:
            print(f"nodes: topology {heap.topology} ranks", flush=True)
        (smoke_register if module is None else module.register)(checks, rank, world, heap)
        checks.run_pending()
    except Exception as error:  # noqa: BLE001 - a suite that cannot start is one FAIL, the others still run
        checks.failures += 1
        checks.ran += 1
        if rank == 0:
            print(f"FAIL {name}: the suite stopped -- {type(error).__name__}: {str(error)[:400]}", flush=True)
    finally:
        if heap is not None:
            heap.close()
        if name == "nodes":
            os.environ.pop("TILEDSL_NODES", None)
            if nodes_before is not None:
                os.environ["TILEDSL_NODES"] = nodes_before
    dist.barrier()
    return {"suite": name, "ran": checks.ran, "failed": checks.failures,
            "skipped": checks.unneeded + checks.late, "late": checks.late, "s": time.monotonic() - began}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget-s", type=float, default=float("inf"), help="all suites within this long")
    parser.add_argument("--suites", default="", help="comma-separated names (default: every suite)")
    args = parser.parse_args()
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(HEAP_BYTES))
    place = placement.start()
    harness.SHARED = place.shared
    rank, world = dist.get_rank(), dist.get_world_size()
    chosen = [s for s in SUITES if not args.suites or s[0] in args.suites.split(",")]
    ends = harness.BEGAN + args.budget_s
    if rank == 0:
        print(f"all checks: world {world}, {place.describe() if place.shared else 'one rank a GPU'}; suites "
              f"{', '.join(s[0] for s in chosen)}; budget {args.budget_s:g} s; calls capped at "
              f"{os.environ.get('CHECKS_CALLS', 'none')}", flush=True)
    done = []
    for n, (name, module_name, weight) in enumerate(chosen):
        left = ends - time.monotonic()
        share = left * weight / sum(w for _, _, w in chosen[n:])  # what earlier suites left goes on
        done.append(run_suite(name, module_name, rank, world, time.monotonic() + share))
    failed = sum(d["failed"] for d in done)
    ran = sum(d["ran"] for d in done)
    if rank == 0:
        print(f"{'suite':<12} {'ran':>4} {'failed':>6} {'skipped':>7} {'late':>5} {'s':>6}")
        for d in done:
            print(f"{d['suite']:<12} {d['ran']:>4} {d['failed']:>6} {d['skipped']:>7} {d['late']:>5} {d['s']:>6.1f}")
        print(summary_line(ran, failed), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed or not ran else 0


if __name__ == "__main__":
    sys.exit(main())
