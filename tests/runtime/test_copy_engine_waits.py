"""Copy-engine chunks that wait on kernel tiles (GEMM+ReduceScatter through the copy engine; the LM
head with gathered logits, whose copy engine waits on every tile of a peer): the tiles count
themselves per row, the stream waits on a row's count in its own GPU's memory (a peer's tiles count
into it through peer pointers), and anything the stream cannot wait on is refused by the checker at
the edge."""
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
LM_HEAD = ROOT / "tests" / "corpus" / "lm_head_gather.tds"


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


def _outcome(heap, program, *tensors) -> str:
    """One call on an emulated rank: "finished", or the message of the ScheduleTimeout it ended in."""
    from tiledsl.runtime.launch import ScheduleTimeout
    try:
        program(*tensors)
        return "finished"
    except ScheduleTimeout as timeout:
        return str(timeout)
    finally:
        heap.close()


def _rank_without_mm(heap):
    import tiledsl
    program = tiledsl.compile(os.fspath(GEMM_RS_CE), heap, emulated=True, wait_timeout_s=0.2, skip=("mm",),
                              dtype_override={k: getattr(torch, v) for k, v in EMULATED_DTYPES.items()})
    M, K, N = 256 * heap.world, 64, 256
    return _outcome(heap, program, torch.randn(M, K), torch.randn(K, N), torch.empty(M // heap.world, N))


@pytest.mark.emulated
def test_a_row_never_counted_makes_the_copy_engine_wait_fail_naming_the_edge():
    line = GEMM_RS_CE.read_text().splitlines().index("send[i] after mm[i, *]") + 1
    for rank, message in enumerate(run_ranks(_rank_without_mm, 2, timeout_s=300)):
        assert message.startswith(f"rank {rank} timed out waiting on edge 0: {GEMM_RS_CE}:{line} send[i] after mm[i, *] "
                                  "(copy engine, row "), message
        assert message.endswith("expected 1 of its instances done, saw 0)"), message


BASE = GEMM_RS_CE.read_text()


@pytest.mark.parametrize("edge, names", [
    ("send[i] after mm[i, *], mm[i, 0]", "part of a row"),
    ("send[i] after mm[i, *], mm[*, 0]", "part of a row"),
])
def test_what_the_stream_cannot_wait_on_is_refused_by_the_checker_at_the_edge(edge, names):
    source = BASE.replace("send[i] after mm[i, *]", edge)
    with pytest.raises(TdsError, match=r"chunk 'send' on the copy engine can wait only on rows of a kernel "
                                       r"family, like `mm\[i, \*\]` or `mm\[\*, \*\]`; this edge names "
                                       + names) as refused:
        run(source, until="check")
    (diagnostic,) = [d for d in refused.value.diagnostics if d.severity == "error"]
    assert diagnostic.span.line == source.splitlines().index(edge) + 1 and "on sms" in diagnostic.hint


def test_a_wait_on_every_tile_of_a_peer_counts_into_each_ranks_copy_and_waits_on_each_row_of_that_rank():
    plan = run(LM_HEAD, until="plan").plan
    families = {f.name: f for f in plan.families}
    mm = families["mm"]
    assert str(mm.count_row) == "i" and [str(r) for r in mm.count_peers] == ["0", "world"]
    wait, = families["gather"].host.waits
    assert [(str(v), str(e)) for v, e in wait.loops] == [("tds_row", "ceiling(T/BT)")]
    # rank s's rows of mm, in this rank's copy of the counts: [s, row], the family's instances apart
    assert (str(wait.writer), str(wait.row), str(wait.count)) == ("s", "tds_row", "ceiling(V/(BV*world))")
    assert wait.index == wait.writer * wait.slots + wait.row
    assert plan.edges[wait.edge].endswith("gather[s] after mm[*, *] @ s")
    # gemm_rs_ce waits on its own rank's rows only: its counts stay this rank's (no peers, no writer)
    rs = run(GEMM_RS_CE, until="plan").plan
    assert next(f for f in rs.families if f.name == "mm").count_peers is None
    assert next(f for f in rs.families if f.name == "send").host.waits[0].writer is None


def _lm_head_without_rank1_mm(heap):
    import tiledsl
    program = tiledsl.compile(os.fspath(LM_HEAD), heap, emulated=True, wait_timeout_s=0.3,
                              skip=("mm",) if heap.rank == 1 else ())
    T, D, V = 20, 24, 40 * heap.world
    return _outcome(heap, program, torch.randn(T, D), torch.randn(D, V // heap.world), torch.empty(T, V))


@pytest.mark.emulated
def test_a_peer_whose_tiles_never_count_makes_the_copy_engine_wait_there_time_out_naming_the_edge():
    """Rank 1 runs no mm: rank 0's copy of Lg@1 waits (emulated: until its bound) and fails by name;
    its own rank's rows were counted, so gather[0] passed."""
    line = LM_HEAD.read_text().splitlines().index("gather[s] after mm[*, *] @ s") + 1
    first, second = run_ranks(_lm_head_without_rank1_mm, 2, timeout_s=300)
    # the first of rank 1's rows (cdiv(T, BT) = 2 of them) of cdiv(V / world, BV) = 2 tiles each
    assert first == (f"rank 0 timed out waiting on edge 0: {LM_HEAD}:{line} gather[s] after mm[*, *] @ s "
                     "(copy engine, rank 1's row 0: expected 2 of its instances done, saw 0)"), first
    assert second.startswith("rank 1 timed out waiting on edge 0"), second
