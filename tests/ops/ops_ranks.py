"""What every emulated tiledsl.ops test rank does first and last: a gloo process group over the emulated
ranks (the torch path's collectives and the tuner's agreement run over it, as NCCL's would on GPUs),
and the rank's emulated heap given to tiledsl.ops, with small tiles so that tiny shapes still span
several tiles and end in ragged ones."""
from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

# BK is one of ag_gemm's tunables fixed here, so each GEMM program is one path (tuning has its own tests)
SMALL_TILES = {"BM": 16, "BN": 32, "BR": 8, "BK": 64, "BLOCK": 64}
TOLERANCE = {torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}  # relative to the largest value


def start(heap, rendezvous: str, **use_heap_options):
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=heap.rank, world_size=heap.world,
                            timeout=datetime.timedelta(seconds=120))
    import tiledsl.ops as ops
    ops.reset()
    # choices are cached beside the rendezvous file, never in the user's cache of earlier runs
    ops.configure(progress=False, cache_dir=os.path.join(os.path.dirname(rendezvous), "tuning"))
    ops.use_heap(heap, **{"consts": SMALL_TILES, "wait_timeout_s": 30.0, **use_heap_options})
    return ops


def stop(heap) -> None:
    import tiledsl.ops as ops
    ops.reset()
    dist.destroy_process_group()
    heap.close()


def as_numpy(t: torch.Tensor):
    """A result by value (numpy crosses the process boundary; a tensor would be shared through fds)."""
    return t.detach().float().numpy().copy()


def relative_error(got, want: torch.Tensor) -> float:
    got = torch.as_tensor(got).double()
    if got.shape != want.shape:
        return float("inf")
    if torch.isnan(got).any():
        return float("inf")
    return (got - want.double()).abs().max().item() / (want.double().abs().max().item() or 1.0)
