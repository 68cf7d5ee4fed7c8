"""What a generated module declares about itself (its tensors and families), and the launch arithmetic
that code generation and the launcher share (pipeline stages, warps, power-of-two blocks, instance
numbering)."""
from __future__ import annotations

import math
from dataclasses import dataclass

SHARED_MEMORY_BYTES = 220 * 1024  # per SM on Hopper, less what Triton keeps for itself


@dataclass(frozen=True)
class TensorSpec:
    name: str
    role: str
    dtype: str
    staged: bool
    peers: bool
    where: str


@dataclass(frozen=True)
class FamilySpec:
    name: str
    kind: str
    engine: str
    programs: int | None
    notify: str | None
    split: int
    ordered: bool
    matmul: bool
    counted: bool = False  # instances add one to a count per first index (copy-engine chunks wait on it)


def pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def linear(index: tuple, extents: tuple) -> int:
    out = 0
    for i, e in zip(index, extents):
        out = out * e + i
    return out


def unlinear(number: int, extents: tuple) -> tuple:
    out = []
    for e in reversed(extents):
        out.append(number % e)
        number //= e
    return tuple(reversed(out))


def kernel_options(module, env) -> dict:
    """num_warps and num_stages: a product gets 8 warps and as many pipeline stages (2 to 4) as shared
    memory holds next to the staging of its TMA-stored block."""
    matmuls = module.tds_matmuls(env)
    if not matmuls:
        return {"num_warps": 4, "num_stages": 2}
    stages = min(pipeline_stages(bm, bn, bk, target is not None) for _, _, bm, bn, bk, target in matmuls.values())
    return {"num_warps": 8, "num_stages": max(2, stages)}


def pipeline_stages(block_m: int, block_n: int, block_k: int, tma_store: bool) -> int:
    """Pipeline stages of bf16 [BM, BK] and [BK, BN] blocks that fit in shared memory (at most 4) next
    to the [BM, BN] staging of a TMA-stored block. Code generation uses a TMA store only where 2 fit."""
    stage_bytes = (block_m * block_k + block_k * block_n) * 2
    staging = block_m * block_n * 2 if tma_store else 0
    return min(4, (SHARED_MEMORY_BYTES - staging) // stage_bytes)
