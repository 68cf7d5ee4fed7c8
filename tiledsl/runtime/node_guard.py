"""The pretend topology, enforced in the emulator: an emulated rank maps every rank's arena, so a peer
pointer to another node's memory would simply work there, and hide a program that a real cluster
cannot run. The heap hands out poisoned offsets for such peers (`heap.POISON_BASE`); this guard
checks every load, store and atomic of Triton's interpreter and names the first one that reaches a
poisoned address, before it is made. NVSHMEM's stand-ins address PEs through their own tables
(`heap.shmem_offsets`), which are not poisoned: across nodes they are the only way through."""
from __future__ import annotations

import inspect

import numpy as np

from tiledsl.runtime.heap import POISON_BASE, POISON_SPAN, CrossNodeAccess
from tiledsl.topology import Topology


def install(rank: int, topology: Topology) -> None:
    """Check every memory access of this process's Triton interpreter (an emulated rank's process)."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    if getattr(builder, "_tiledsl_guard", None) is not None:
        builder._tiledsl_guard = (rank, topology)
        return
    builder._tiledsl_guard = (rank, topology)

    def checked(method, verb, pointer, mask=None):
        signature = inspect.signature(method)

        def run(*args, **kwargs):
            bound = signature.bind(*args, **kwargs).arguments
            masks = None if mask is None else np.asarray(bound[mask].data)
            _check(np.asarray(bound[pointer].data), masks, verb, *builder._tiledsl_guard)
            return method(*args, **kwargs)
        return run

    builder.create_masked_load = checked(builder.create_masked_load, "loaded from", "ptrs", "mask")
    builder.create_masked_store = checked(builder.create_masked_store, "stored into", "ptrs", "mask")
    builder.create_atomic_cas = checked(builder.create_atomic_cas, "made an atomic on", "ptr")
    builder.create_atomic_rmw = checked(builder.create_atomic_rmw, "made an atomic on", "ptr", "mask")


def _check(pointers: np.ndarray, mask: np.ndarray | None, verb: str, rank: int, topology: Topology) -> None:
    addresses = pointers.astype(np.uint64, copy=False).reshape(-1)
    if mask is not None:
        addresses = addresses[np.broadcast_to(mask, pointers.shape).reshape(-1)]
    poisoned = (addresses >= POISON_BASE) & (addresses < POISON_BASE + topology.world * POISON_SPAN)
    if poisoned.any():
        other = int((int(addresses[poisoned][0]) - POISON_BASE) // POISON_SPAN)
        raise CrossNodeAccess(
            f"rank {rank} (node {topology.node(rank)}) {verb} rank {other}'s memory (node {topology.node(other)}) "
            f"through a peer pointer: across nodes ({topology} ranks) only NVSHMEM reaches")
