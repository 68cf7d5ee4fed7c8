"""Copy-engine chunks that wait on kernel tiles (GEMM+ReduceScatter through the copy engine): the
tiles count themselves per row, the stream waits on a row's count, and anything the stream cannot
wait on is refused by the checker at the edge."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tiledsl.diagnostics import TdsError
from tiledsl.pipeline import run
from tiledsl.runtime.emulate import run_ranks
from tiledsl.tools.run_program import EMULATED_DTYPES, run_emulated

ROOT = Path(__file__).resolve().parents[2]
GEMM_RS_CE = ROOT / "programs" / "gemm_rs_ce.tds"


def test_the_product_counts_its_tiles_per_row_and_the_chunk_waits_for_a_whole_row():
    plan = run(GEMM_RS_CE, until="plan").plan
    families = {f.name: f for f in plan.families}
    assert families["mm"].count_row is not None and families["red"].count_row is None
    assert str(families["mm"].count_row) == "i"  # one count per row block, the first index
    assert families["mm"].notify is None  # only the copy engine waits on it: no epoch slots
    wait, = families["send"].host.waits
    assert (wait.producer, str(wait.row), str(wait.count)) == ("mm", "i", "ceiling(N/BN)")
    assert plan.edges[wait.edge].endswith("send[i] after mm[i, *]")


@pytest.mark.emulated
@pytest.mark.parametrize("world", [2, 3])
def test_gemm_rs_through_the_copy_engine_matches_the_reference_on_ragged_sizes(world):
    # N = 296: ragged against BN = 128 and BR, and B's bf16 rows whole 16 bytes, as TMA needs (300 ran only
    # emulated, where bf16 runs as float32; tiledsl run now refuses it as a GPU would)
    verdicts = run_emulated(os.fspath(GEMM_RS_CE), world, sizes={"M": 256 * world, "K": 96, "N": 296},
                            consts={"BM": 64, "BN": 128, "BR": 16}, calls=3)
    assert verdicts and all(v.ok for v in verdicts), "\n".join(v.line() for v in verdicts)


def _rank_without_mm(heap):
    import tiledsl
    from tiledsl.runtime.launch import ScheduleTimeout
    program = tiledsl.compile(os.fspath(GEMM_RS_CE), heap, emulated=True, wait_timeout_s=0.2, skip=("mm",),
                              dtype_override={k: getattr(torch, v) for k, v in EMULATED_DTYPES.items()})
    M, K, N = 256 * heap.world, 64, 256
    try:
        program(torch.randn(M, K), torch.randn(K, N), torch.empty(M // heap.world, N))
        return "finished"
    except ScheduleTimeout as timeout:
        return str(timeout)
    finally:
        heap.close()


@pytest.mark.emulated
def test_a_row_never_counted_makes_the_copy_engine_wait_fail_naming_the_edge():
    line = GEMM_RS_CE.read_text().splitlines().index("send[i] after mm[i, *]") + 1
    for rank, message in enumerate(run_ranks(_rank_without_mm, 2, timeout_s=300)):
        assert message.startswith(f"rank {rank} timed out waiting on edge 0: {GEMM_RS_CE}:{line} send[i] after mm[i, *] "
                                  "(copy engine, row "), message
        assert message.endswith("expected 1 of its instances done, saw 0)"), message


BASE = GEMM_RS_CE.read_text()


@pytest.mark.parametrize("edge, why", [
    ("send[i] after mm[i, *], mm[i, 0]", "a single tile, not a row"),
    ("send[i] after mm[i, *] @ every rank", "other ranks' tiles"),
])
def test_what_the_stream_cannot_wait_on_is_refused_by_the_checker_at_the_edge(edge, why):
    source = BASE.replace("send[i] after mm[i, *]", edge)
    with pytest.raises(TdsError, match=r"chunk 'send' on the copy engine can wait only on a row of a kernel "
                                       r"family on its own rank, like `mm\[i, \*\]`") as refused:
        run(source, until="check")
    (diagnostic,) = [d for d in refused.value.diagnostics if d.severity == "error"]
    assert diagnostic.span.line == source.splitlines().index(edge) + 1 and "on sms" in diagnostic.hint
