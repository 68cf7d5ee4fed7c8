"""Skinny products (M = 1 to 128 rows) written directly in Triton, to find the tile that streams a
decode layer's weights at cuBLAS's pace before code generation emits it (issue 27).

The weights B [K, N] are read once: 2 K N bytes, e.g. 134 MB at N = K = 8192, 37 us at 3.6 TB/s.
One program streams one [K-range, BN] strip of B; a program keeps STAGES blocks of [BK, BN] in flight
(cp.async pipelining of plain loads, 16-byte vectors along N), and the product of its [BM, BK] rows of
A runs on the tensor cores (mma for BM of 16 or 32, wgmma from 64). With N / BN strips fewer than
the SMs, the K range is split: SPLIT programs per strip add their fp32 partial sums into a workspace
and the last of them to finish (a per-tile counter, reset by that last one) writes C. One launch.

`Skinny(M, N, K, config)(A, B, C)` computes C = A @ B; `configs(M, N, K, sms)` lists the ones worth
timing at a shape. Round 1 of bench/experiments/latency_probe.py (commit 5f30c8c) timed them against
torch.matmul on one H200: within 1.1x of cuBLAS up to M = 64 at most shapes, 1.8-2x at M = 128 (a 64-row
block streams B twice); gemm_ar_skinny.tds is this tile as a tiledsl program."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class Config:
    BM: int
    BN: int
    BK: int
    split: int
    stages: int
    warps: int = 4

    def __str__(self):
        return f"BM{self.BM}_BN{self.BN}_BK{self.BK}_S{self.split}_st{self.stages}_w{self.warps}"


@triton.jit
def skinny_kernel(A, B, C, W, counters, M, N, K, K_PER_SPLIT, SPLIT,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    # SPLIT is a plain argument: Triton specialises the value 1 on its own (one compile for unsplit
    # products, one for split ones, whatever the split)
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    k_first = pid_s * K_PER_SPLIT
    k_last = tl.minimum(k_first + K_PER_SPLIT, K)
    acc = tl.zeros([BM, BN], tl.float32)
    for k in tl.range(k_first, k_last, BK, num_stages=STAGES):
        a = tl.load(A + rm[:, None] * K + (k + rk)[None, :], mask=(rm[:, None] < M) & ((k + rk)[None, :] < K),
                    other=0.0)
        b = tl.load(B + (k + rk)[:, None] * N + rn[None, :], mask=((k + rk)[:, None] < K) & (rn[None, :] < N),
                    other=0.0)
        acc = tl.dot(a, b, acc)
    inside = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT == 1:
        tl.store(C + rm[:, None] * N + rn[None, :], acc.to(C.dtype.element_ty), mask=inside)
    else:
        # fp32 partials: the last split of this tile to arrive sums them (its acquire sees the others')
        tl.atomic_add(W + rm[:, None] * N + rn[None, :], acc, mask=inside, sem="relaxed")
        tl.debug_barrier()  # every thread's partial sums are in before the one counter update releases them
        tile = pid_m * tl.num_programs(0) + pid_n
        arrived = tl.atomic_add(counters + tile, 1, sem="acq_rel")
        if arrived == SPLIT - 1:
            total = tl.load(W + rm[:, None] * N + rn[None, :], mask=inside, other=0.0, cache_modifier=".cg")
            tl.store(C + rm[:, None] * N + rn[None, :], total.to(C.dtype.element_ty), mask=inside)
            tl.store(W + rm[:, None] * N + rn[None, :], tl.zeros([BM, BN], tl.float32), mask=inside)
            tl.atomic_xchg(counters + tile, 0, sem="relaxed")


class Skinny:
    """C = A @ B with one config; the workspace and counters are kept (zero between calls)."""

    def __init__(self, M: int, N: int, K: int, config: Config, device="cuda"):
        self.M, self.N, self.K, self.config = M, N, K, config
        c = config
        steps = math.ceil(K / c.BK)
        self.k_per_split = math.ceil(steps / c.split) * c.BK
        self.grid = (math.ceil(N / c.BN), math.ceil(K / self.k_per_split), math.ceil(M / c.BM))
        tiles = self.grid[0] * self.grid[2]
        self.W = torch.zeros(M, N, device=device, dtype=torch.float32) if c.split > 1 else torch.empty(1, device=device)
        self.counters = torch.zeros(max(tiles, 1), device=device, dtype=torch.int32)

    def __call__(self, A, B, C):
        c = self.config
        skinny_kernel[self.grid](A, B, C, self.W, self.counters, self.M, self.N, self.K, self.k_per_split,
                                 self.grid[1], BM=c.BM, BN=c.BN, BK=c.BK, STAGES=c.stages,
                                 num_warps=c.warps, num_stages=c.stages)
        return C


def row_block(M: int) -> int:
    """16 rows for the mma of M <= 16, else the power of two that covers M, at most 64."""
    return min(64, max(16, triton.next_power_of_2(M)))


def configs(M: int, N: int, K: int, sms: int) -> list[Config]:
    """A few configs per shape: strips of 64 or 128 columns, BK 128 on 4 stages or 256 on 3, and the
    K range split so that the programs fill the SMs about twice (each split keeps at least 4 steps)."""
    BM = row_block(M)
    out = []
    for BN, BK, stages in ((64, 128, 4), (128, 128, 4), (64, 256, 3)):
        tiles = math.ceil(N / BN) * math.ceil(M / BM)
        most = max(1, K // (4 * BK))
        split = max(1, min(most, math.ceil(2 * sms / tiles)))
        out.append(Config(BM, BN, BK, split, stages))
    return list(dict.fromkeys(out))
