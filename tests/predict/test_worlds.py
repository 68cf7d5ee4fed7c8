"""NCCL's ring model in `tiledsl.predict.worlds` against values worked out by hand, with round rates
(1 GB/s is 1000 bytes a microsecond), and the table's cases against the shapes bench/ uses."""
import dataclasses

import pytest

from tiledsl.predict import load, worlds

# NVLink 200 GB/s x 0.5 = 100 GB/s, 2 us a step; IB 10 GB/s x 0.5 = 5 GB/s, 7 us a step
RATES = dataclasses.replace(load(), nvlink_gbps=200.0, nvlink_efficiency=0.5, nvlink_latency_us=2.0,
                            ib_gbps=10.0, ib_efficiency=0.5, ib_latency_us=7.0)


def test_ring_in_one_node():
    # 8 ranks, 8 MB: 7/8 * 8e6 B / 1e5 B/us = 70 us, 7 steps of 2 us
    assert worlds.ring_steps_us(8, 1, 8_000_000, RATES) == pytest.approx(70.0 + 14.0)


def test_ring_across_nodes_uses_every_nic():
    # 16 ranks in 2 nodes: busbw min(100, 8 NICs * 5) = 40 GB/s; 15/16 * 16e6 B / 4e4 B/us = 375 us;
    # 14 steps within a node at 2 us and 1 across at 7 us
    assert worlds.ring_busbw_gbps(2, RATES) == 40.0
    assert worlds.ring_steps_us(16, 2, 16_000_000, RATES) == pytest.approx(375.0 + 28.0 + 7.0)


def test_ring_across_nodes_bounded_by_nvlink():
    # 8 NICs * 50 GB/s = 400 GB/s is more than NVLink's 100: NVLink bounds it. 64 ranks in 8 nodes, 64 MB:
    # 63/64 * 64e6 / 1e5 = 630 us; 56 steps at 2 us, 7 at 7 us
    fast_ib = dataclasses.replace(RATES, ib_gbps=100.0)
    assert worlds.ring_busbw_gbps(8, fast_ib) == 100.0
    assert worlds.ring_steps_us(64, 8, 64_000_000, fast_ib) == pytest.approx(630.0 + 112.0 + 49.0)


def test_one_rank_moves_nothing():
    assert worlds.ring_steps_us(1, 1, 8_000_000, RATES) == 0.0


def test_cases_shard_as_bench_overlap_does():
    found = {(c.op, c.world): c for c in worlds.cases()}
    ag, rs = found["AG+GEMM", 64], found["GEMM+RS", 64]
    assert (ag.program, ag.nodes, ag.sizes) == ("hier_ag_gemm", 8, dict(M=8192, K=8192, N=448))
    assert ag.collective_bytes == 8192 * 8192 * 2
    assert (rs.program, rs.nodes, rs.sizes) == ("hier_gemm_rs", 8, dict(M=8192, K=128, N=28672))
    assert rs.collective_bytes == 8192 * 28672 * 2
    assert (found["AG+GEMM", 8].program, found["GEMM+RS", 8].program) == ("ag_gemm", "gemm_rs_pull")
