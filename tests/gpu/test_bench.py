"""The benchmarks' verdicts, on CPU: an output wrong on one rank leaves that variant out on every rank,
prints a FAIL line and makes the exit code 1 (as does a run that checked nothing); smoke_runtime's
paths report the same way; report.py's tables keep the headline apart from the best variant."""
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _bench_rank(rank, world, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    sys.path.insert(0, str(BENCH))
    import common
    import smoke_runtime

    dist.init_process_group("gloo")
    common.slowest = lambda value: value  # its MAX all-reduce runs on CUDA tensors
    timer = lambda fn, before=None: (fn(), 1.0)[1]  # noqa: E731 - every call "takes" 1 ms
    want = torch.arange(6.0)
    out = torch.empty(6)
    verdicts = common.Verdicts()
    untouched = common.Verdicts()

    def right(check):
        out.copy_(want)

    def wrong_on_rank_1(check):
        out.copy_(want + (rank == 1))

    def unwritten(check):
        pass

    times = [common.time_checked(verdicts, name, call, lambda: None, out, want, timer=timer)
             for name, call in (("right", right), ("wrong on rank 1", wrong_on_rank_1), ("unwritten", unwritten))]
    smoke = [smoke_runtime.run("smoke passes", lambda heap: None, None),
             smoke_runtime.run("smoke fails on rank 1", lambda heap: "bad" if rank == 1 else None, None)]
    results.put((rank, times[0], [t != t for t in times[1:]], verdicts.wrong, verdicts.exit_code(),
                 untouched.exit_code(), smoke))
    dist.destroy_process_group()


def test_a_wrong_output_is_left_out_everywhere_and_fails_the_script(capfd):
    context = mp.get_context("spawn")
    results = context.Queue()
    port = 29500 + (os.getpid() + 501) % 1000
    procs = [context.Process(target=_bench_rank, args=(r, 2, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = sorted(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    for rank in range(2):
        assert got[rank] == (rank, 1.0, [True, True], ["wrong on rank 1", "unwritten"], 1, 1, [True, False])
    out = capfd.readouterr().out
    assert "FAIL wrong on rank 1 -- rank 1: 6 of 6 elements differ" in out
    assert "FAIL unwritten -- rank 0: 6 of 6 elements are NaN or Inf" in out
    # "right" is checked before timing and again after
    assert "4 outputs checked against torch, 2 wrong: wrong on rank 1, unwritten" in out
    assert "0 outputs checked against torch, 0 wrong" in out
    assert "PASS smoke passes" in out and "FAIL smoke fails on rank 1: rank 1: bad" in out


def test_report_shows_the_headline_and_the_best_variant_apart():
    sys.path.insert(0, str(BENCH))
    import report
    row = {"op": "gemm_rs", "model": "m", "N": 1, "K": 2, "tiledsl": 2.0, "tiledsl_program": "gemm_rs_pull",
           "best": 1.0, "best_variant": "gemm_rs_ce", "sequential": 3.0, "async_tp": 3.0, "gemm": 1.0}
    wrong = {**row, "tiledsl": float("nan"), "best": float("nan"), "best_variant": None}
    earlier = {key: value for key, value in row.items() if key not in ("best", "best_variant", "tiledsl_program")}
    lines = report.overlap_table([row, wrong, earlier], "gemm_rs").splitlines()
    assert lines[2] == ("| m (1, 2) | 2.000 (gemm_rs_pull) | 3.000 | 3.000 | 1.000 | 1.50x | 1.50x | 0.50 | "
                        "1.000 (gemm_rs_ce) | 3.00x |")
    assert lines[3] == "| m (1, 2) | - (gemm_rs_pull) | 3.000 | 3.000 | 1.000 | - | - | - | - | - |"
    # a run from before the headline was the user's program: its `tiledsl` was the best variant
    assert lines[4] == "| m (1, 2) | - | 3.000 | 3.000 | 1.000 | - | - | - | 2.000 | 1.50x |"
    assert lines[5] == "| geometric mean | | | | | 1.50x | 1.50x | | | 2.12x |"
