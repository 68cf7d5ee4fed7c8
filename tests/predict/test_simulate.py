"""The simulator on small schedules whose time is worked out by hand below, with round rates (1 GB/s
is 1000 bytes a microsecond): a chain, a pipeline, a ring and one all-gather. Each program is checked
first, so the schedules simulated are ones the checker proves."""
import dataclasses
import json
from pathlib import Path

import pytest

from tiledsl import cli, pipeline
from tiledsl.diagnostics import TdsError
from tiledsl.predict import load, predict, report

ROOT = Path(__file__).parents[2]

# every rate 1 GB/s, every stream operation 1 us, a signal 0.5 us on its rank and 1 us to a peer, an SM
# wait's read and release store free (test_a_wait_and_a_release_cost_their_programs sets them)
RATES = dataclasses.replace(
    load(), sms=8, tile_fixed_us=0.0, hbm_gbps=100.0, sm_hbm_gbps=1.0, ce_local_gbps=1.0, ce_op_us=1.0,
    call_us=10.0, signal_local_us=0.5, wait_us=0.0, release_us=0.0, nvlink_gbps=2.0, nvlink_efficiency=0.5,
    nvlink_latency_us=1.0, sm_link_gbps=1.0, copy_engines=1)

CHAIN = """program chain
param N
in    X : bf16[N]
out   Z : bf16[N]
local Y : bf16[N]
chunk first on copy_engine: X -> Y
chunk second on copy_engine: Y -> Z
second after first
"""

PIPELINE = """program pipe
param N
const B = 1000
in    X : bf16[N]
out   Z : bf16[N]
local Y : bf16[N]
tile a[i in N / B] on sms(1): Y[i*B : +B] = X[i*B : +B]
tile b[i in N / B] on sms(1): Z[i*B : +B] = Y[i*B : +B]
b[i] after a[i]
"""

RING = """program ring
param N
in   X : bf16[N]
out  Y : bf16[world, N]
symm R : bf16[world, N]
chunk start on sms(1): X -> R[rank, :]
chunk hop[t in world - 1] on sms(1): R[(rank - t) mod world, :] -> R@((rank + 1) mod world)[(rank - t) mod world, :]
chunk keep on sms(1): R -> Y
hop[t] after start
hop[t] after hop[t - 1] @ ((rank - 1) mod world)
keep after hop[*] @ ((rank - 1) mod world)
keep after start
"""


def simulated(source: str, world: int, sizes: dict, rates=RATES):
    schedule = pipeline.run(source, until="check").schedule
    return predict(schedule, world, sizes, rates)


def test_chain_of_two_local_copies_on_the_stream_adds_their_operations_and_bytes():
    # first: a copy and a signal (2 ops) + 2000 bytes at 1 GB/s = 4 us; second: its wait and the copy
    # (2 ops) + 2 us, released 0.5 us after first ends: 4.5 + 4 = 8.5 us. (The checker refuses a
    # copy-engine chunk waiting on another, which code generation cannot emit: the stream's model is
    # tested on the schedule.)
    with pytest.raises(TdsError, match="can wait only on rows of a kernel family"):
        pipeline.run(CHAIN, until="check")
    found = predict(pipeline.run(CHAIN, until="schedule").schedule, 2, {"N": 1000}, RATES)
    assert found.kernel_us == pytest.approx(8.5)
    assert found.staging_us == 0.0
    assert found.total_us == pytest.approx(18.5)


def test_pipeline_of_two_families_on_their_own_programs_overlaps_all_but_one_stage():
    # a[i]: 4000 bytes (read and write) at 1 GB/s = 4 us, four of them on program 0, ending at 4, 8, 12, 16;
    # b[i] on program 1 waits for a[i] + 0.5: b[0] 4.5..8.5, then b[i] runs as a[i] is ready: 16.5..20.5
    found = simulated(PIPELINE, 2, {"N": 4000})
    assert found.kernel_us == pytest.approx(20.5)
    ends = sorted(s.end_us for s in found.slots if s.rank == 0 and s.lane == "program 1")
    assert ends == pytest.approx([8.5, 12.5, 16.5, 20.5])


def test_a_wait_and_a_release_cost_their_programs_time_beside_the_signals_latency():
    # as the pipeline above, with each SM wait's read 0.25 us and each release store 0.125 us a waiting
    # rank: a[i] (b[i] on its own rank waits on it) 4.125 us, ending 4.125, 8.25, 12.375, 16.5; b[i]
    # released 0.5 us after a[i] and 4.25 us long (its one wait): b[0] 4.625..8.875, then its program
    # is the later: 13.125, 17.375, 21.625
    rates = dataclasses.replace(RATES, wait_us=0.25, release_us=0.125)
    found = simulated(PIPELINE, 2, {"N": 4000}, rates)
    ends = {lane: sorted(s.end_us for s in found.slots if s.rank == 0 and s.lane == lane)
            for lane in ("program 0", "program 1")}
    assert ends["program 0"] == pytest.approx([4.125, 8.25, 12.375, 16.5])
    assert ends["program 1"] == pytest.approx([8.875, 13.125, 17.375, 21.625])
    assert found.kernel_us == pytest.approx(21.625)


def test_copy_engine_chunks_pay_their_stream_operations_not_the_sm_wait_and_release():
    rates = dataclasses.replace(RATES, wait_us=5.0, release_us=5.0)
    source = (ROOT / "programs" / "allgather.tds").read_text()
    assert simulated(source, 2, {"M": 2000, "N": 1}, rates).kernel_us == pytest.approx(7.0)


def test_pipeline_critical_path_names_the_wait_and_then_the_program_order():
    found = simulated(PIPELINE, 2, {"N": 4000})
    path = report.critical_path(found)
    assert path[0].name.startswith("a[0]") and path[-1].name.startswith("b[3]")
    assert any(step.via.startswith("wait on a[") for step in path)
    assert found.slots[0].end_us <= path[-1].slot.end_us


def test_ring_hop_pays_a_link_latency_per_step():
    # start: 4000 local bytes = 4 us; hop[0] released at 4.5, 2000 bytes local and 2000 over the link
    # (each 2 us, at once) ends 6.5; hop[t] waits for hop[t-1] on the previous rank + 1 us: each step
    # 3 us, hop[2] ends at 12.5 on world 4; keep (16000 bytes, 16 us) after the previous rank's last
    # hop + 1 us: 13.5 + 16 = 29.5
    found = simulated(RING, 4, {"N": 1000})
    passes = sorted(s.end_us for s in found.slots if s.rank == 0 and s.lane == "program 1")
    assert passes == pytest.approx([6.5, 9.5, 12.5])
    assert found.kernel_us == pytest.approx(29.5)
    links = [s.via for s in report.critical_path(found) if s.via.startswith("wait")]
    assert any("over NVLink" in via for via in links)


def test_one_allgather_copies_its_own_rows_then_pulls_the_peer():
    # own rows first: one op + 2000 bytes within the GPU = 3 us; the peer's: one op + 2000 bytes at
    # 1 GB/s + 1 us of latency = 4 us: 7 us. X is read on the peer: staged, one op + 2 us = 3 us
    source = (ROOT / "programs" / "allgather.tds").read_text()
    found = simulated(source, 2, {"M": 2000, "N": 1})
    assert found.kernel_us == pytest.approx(7.0)
    assert found.staging_us == pytest.approx(3.0)
    assert found.total_us == pytest.approx(20.0)
    assert all(u.copy_busy == pytest.approx(1.0) for u in report.utilisation(found))


def test_predict_command_writes_a_perfetto_file_marked_predicted(tmp_path, capsys):
    out = tmp_path / "pred"
    code = cli.main(["predict", str(ROOT / "programs" / "allgather.tds"), "--world", "2", "--size", "M=256",
                     "--size", "N=64", "--link", "nvlink_gbps=900", "-o", str(out)])
    printed, err = capsys.readouterr()
    assert code == 0, err
    assert "predicted time:" in printed and "critical path:" in printed
    data = json.loads((tmp_path / "pred.json").read_text())
    assert data["otherData"]["predicted"] is True
    assert {e["pid"] for e in data["traceEvents"]} == {"rank 0 (predicted)", "rank 1 (predicted)"}


def test_predict_command_refuses_an_unknown_rate(capsys):
    code = cli.main(["predict", str(ROOT / "programs" / "copy.tds"), "--link", "warp_speed=9"])
    assert code == 2
    assert "no rate named 'warp_speed'" in capsys.readouterr().err


def test_calibrate_recovers_the_tile_rates_that_made_the_times():
    from tiledsl.predict.calibrate import BM, BN, fit_tile
    fixed, rate, sms, call = 2.0, 4.0, 132, 10.0
    rows = []
    for M, K, N in [(8192, 1024, 11008), (8192, 4096, 2752), (8192, 8192, 14336), (4096, 2048, 512)]:
        waves = -(-(-(-M // BM) * -(-N // BN)) // sms)
        rows.append({"M": M, "K": K, "N": N, "tiledsl": (call + waves * (fixed + 2 * BM * BN * K / 1e6 / rate)) / 1e3})
    assert fit_tile(rows, sms, call) == pytest.approx((fixed, rate))


SPLIT = """program halves
param N
in    X : bf16[N]
out   Z : bf16[N]
local Y : bf16[N]
chunk a on sms(2) split 2: X -> Y
chunk b on sms(1): Y -> Z
b after a
"""


def test_split_chunk_runs_its_parts_on_programs_at_once_and_signals_when_both_are_done():
    # a: 8000 bytes (read and write) in two parts of 4000 on two programs at 1 GB/s: both 0..4 us;
    # b waits for both (+0.5) and moves 8000 bytes on one program: 4.5 + 8 = 12.5 (16.5 unsplit)
    found = simulated(SPLIT, 2, {"N": 2000})
    assert found.kernel_us == pytest.approx(12.5)
    parts = [s for s in found.slots if s.rank == 0 and s.duration_us == pytest.approx(4.0)]
    assert sorted(s.lane for s in parts) == ["program 0", "program 1"]
    assert report.critical_path(found)[-1].via.startswith("wait on a[]@rank0")


def test_products_in_a_tile_block_count_their_flops_per_step():
    # one instance, a loop of 3 steps each a [16, 32] @ [32, 8] product: 3 * 2*16*32*8 FLOPs
    from tiledsl.predict import cost
    source = """program steps
param K
in  A : bf16[16, 32]
in  B : bf16[K, 32, 8]
out C : bf16[16, 8]
tile mm:
    acc = 0
    for t in K:
        acc = acc + A[:, :] @ B[t, :, :]
    C[:, :] = acc
"""
    schedule = pipeline.run(source, until="check").schedule
    flops = cost._block_flops(schedule.families["mm"])
    assert int(flops.subs({s: 3 for s in flops.free_symbols})) == 3 * 2 * 16 * 32 * 8
