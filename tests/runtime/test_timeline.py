"""Every rank's timeline (`trace=True`), emulated: every instance appears, stamped in the order it ran,
each wait visible and over only after the producer it waited on had ended; the trace file and the
picture are written; without trace=True the stamps are compiled out of the kernel."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tiledsl.tools import trace

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.emulated
def test_every_instance_is_stamped_in_order_and_waits_end_after_their_producers(tmp_path):
    path = os.fspath(ROOT / "programs" / "gemm_rs_ce.tds")
    M, world = 256 * 2, 2
    found = trace.trace_emulated(path, world, {"M": M, "K": 64, "N": 256})
    by = {(e.rank, e.family, e.instance): e for e in found}
    # mm: M/BM x cdiv(N, BN) tiles per rank; send: one per row block; red: cdiv(M/world, BR) x cdiv(N, BN)
    assert sorted({(f, sum(1 for k in by if k[:2] == (r, f))) for r, f, _ in by}) == \
        [("mm", 4 * 1), ("red", 8 * 1), ("send", 4)]
    for e in found:
        assert e.start_us <= e.waited_us <= e.end_us, e
    # every send waited for its row of mm tiles on its rank: its waits end after that row's last tile
    for e in (e for e in found if e.family == "send"):
        row_end = max(by[(e.rank, "mm", e.instance * 1 + j)].end_us for j in range(1))  # one column of tiles
        assert e.waited_us >= row_end - 1e-3, (e, row_end)
    # every red tile waits for the send of its rows from every rank: the origins differ per rank, so
    # compare within a rank only (its own send)
    for e in (e for e in found if e.family == "red"):
        own_send = (e.rank * (M // world) + (e.instance // 1) * 32) // 128
        assert e.waited_us >= by[(e.rank, "send", own_send)].end_us - 1e-3, e
    out = tmp_path / "trace"
    trace.chrome_trace(found, f"{out}.json")
    trace.draw(found, f"{out}.png")
    events = json.loads(Path(f"{out}.json").read_text())["traceEvents"]
    assert {ev["pid"] for ev in events} == {"rank 0", "rank 1"}
    assert any(ev["name"].startswith("wait red") for ev in events)
    assert Path(f"{out}.png").stat().st_size > 10_000
    assert "busy us" in trace.summary(found)


def test_stamps_are_compiled_out_of_an_untraced_kernel():
    """tds_TRACE is a constexpr: compiled for sm_90 without it, no %globaltimer read is left."""
    from tiledsl.api import build_module
    from tiledsl.codegen.aot import compile_kernel
    module = build_module(ROOT / "programs" / "gemm_rs_pull.tds")
    untraced = compile_kernel(module).asm["ptx"]
    traced = compile_kernel(module, trace=True).asm["ptx"]
    assert "%globaltimer" not in untraced and "%globaltimer" in traced


@pytest.mark.emulated
def test_the_waits_in_a_loops_steps_count_as_the_instances_waiting():
    """sp_ag_attention waits in each step of its loop over pieces, not before its body: the time spent
    there is added to the instance's waiting (before, its stamp 1 came at its start: no wait seen)."""
    path = os.fspath(ROOT / "programs" / "sp_ag_attention.tds")
    found = trace.trace_emulated(path, 2, {"B": 1, "P": 64, "H": 2, "HKV": 1})
    tiles = [e for e in found if e.family == "attn"]
    assert tiles and all(e.start_us < e.waited_us <= e.end_us for e in tiles)


def test_a_loops_step_waits_are_clocked_only_when_traced():
    from tiledsl.api import build_module
    from tiledsl.codegen.aot import compile_kernel
    module = build_module(ROOT / "programs" / "sp_ag_attention.tds", {"BM": 64})
    text = Path(module.__file__).read_text()
    began, waited, ended = text.index("wait_began(tds_TRACE)"), text.index("wait_inline"), text.index("wait_ended(")
    assert began < waited < ended
    assert "%globaltimer" not in compile_kernel(module).asm["ptx"]
