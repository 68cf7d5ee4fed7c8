"""Where the ranks of a launch run: which GPU each rank uses, which process-group backend carries the host's
collectives, and whether ranks share GPUs. One place decides; the heap, `tiledsl run`, `tiledsl trace`,
the GPU checks and the benchmarks ask it.

A launch with more ranks on a machine than it has GPUs (`torchrun --nproc-per-node=8` on one GPU) puts
local rank r on GPU r % count: NVSHMEM runs several PEs on one GPU ("multiple processes per GPU"; without
MPS in its limited mode, which refuses its host collectives, team barriers, fcollect, alltoall and
wait_until_on_stream, none of which tiledsl calls). NCCL refuses two ranks on one GPU, so the process group
is gloo, and the host collectives below send CUDA tensors through the CPU. Kernels of ranks that share a
GPU take turns on it: the answers are right, the times mean nothing, and the benchmarks refuse to run.

The ranks of a machine are numbered by torchrun's LOCAL_RANK of LOCAL_WORLD_SIZE where it sets them and
they agree with each other, else by the global rank of the world (one machine)."""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Placement:
    rank: int
    world: int
    local_rank: int    # this rank's number on its machine
    local_world: int   # ranks on this machine
    gpus: int          # GPUs this process sees (CUDA_VISIBLE_DEVICES applies)

    @property
    def device(self) -> int:
        """The GPU this rank runs on."""
        return self.local_rank % self.gpus

    @property
    def shared(self) -> bool:
        """Whether ranks of this machine share GPUs (more ranks than GPUs)."""
        return self.local_world > self.gpus

    @property
    def per_gpu(self) -> int:
        """The most ranks on one GPU of this machine."""
        return -(-self.local_world // self.gpus)

    @property
    def backend(self) -> str:
        """The process-group backend: NCCL refuses two ranks on one GPU."""
        return "gloo" if self.shared else "nccl"

    def describe(self) -> str:
        return (f"{self.local_world} ranks share {self.gpus} GPU{'s' if self.gpus > 1 else ''} (rank r on GPU "
                f"r % {self.gpus}, up to {self.per_gpu} a GPU)")


def decide(rank: int, world: int, gpus: int, environ=None) -> Placement:
    """The placement of `rank` of `world` on a machine with `gpus` GPUs (pure: environ gives LOCAL_RANK and
    LOCAL_WORLD_SIZE, which are used only when they are whole numbers that agree with rank and world)."""
    if gpus < 1:
        raise RuntimeError(f"rank {rank} of {world} found no GPU (torch.cuda.device_count() is {gpus}); "
                           "run emulated instead: `tiledsl run --emulate --world N FILE`")
    environ = os.environ if environ is None else environ
    local_rank, local_world = rank, world
    try:
        given_rank, given_world = int(environ["LOCAL_RANK"]), int(environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        pass
    else:
        if 0 <= given_rank < given_world <= world and world % given_world == 0 and rank % given_world == given_rank:
            local_rank, local_world = given_rank, given_world
    return Placement(rank, world, local_rank, local_world, gpus)


_told = False


def current(environ=None) -> Placement:
    """This process's placement: the rank and world of the initialised process group, else of torchrun's
    RANK and WORLD_SIZE, else one rank."""
    environ = os.environ if environ is None else environ
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = int(environ.get("RANK", 0)), int(environ.get("WORLD_SIZE", 1))
    return decide(rank, world, torch.cuda.device_count(), environ)


# NVLink SHARP / multicast off in every library that could reach for it; read once, when each library initialises.
_NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def disable_multicast() -> None:
    """Set the env vars that keep NCCL, torch and NVSHMEM off multicast; call before `init_process_group`."""
    for name, value in _NO_MULTICAST_ENV.items():
        os.environ.setdefault(name, value)


def start(backend: str | None = None) -> Placement:
    """Initialise the process group where nobody has (NCCL, or gloo where ranks share GPUs), put this rank
    on its GPU, and say once, on rank 0, when ranks share GPUs. Refuses a group of NCCL alone on shared
    GPUs by name (NCCL would hang or fail at its first collective)."""
    disable_multicast()  # before NCCL or NVSHMEM initialise: they read it once
    if not dist.is_initialized():
        env = current()
        dist.init_process_group(backend or env.backend)
    return settle()


def settle(group=None) -> Placement:
    """Put this rank on its GPU (the process group initialised), refuse NCCL alone on shared GPUs, and
    say once that ranks share GPUs."""
    place = current()
    if place.shared and "gloo" not in str(dist.get_backend(group)):
        raise RuntimeError(f"{place.describe()}, and the process group is {dist.get_backend(group)}: NCCL "
                           "refuses two ranks on one GPU; initialise it with dist.init_process_group('gloo') (or "
                           "leave that to tiledsl), or launch one rank a GPU")
    torch.cuda.set_device(place.device)
    tell(place)
    return place


def tell(place: Placement, stream=None) -> None:
    """Say once, on rank 0, that ranks share GPUs and what that means."""
    global _told
    if _told or not place.shared:
        return
    _told = True
    if place.rank == 0:
        print(f"tiledsl: {place.describe()}: outputs are right, but the ranks' kernels take turns on a GPU, so no "
              "time means anything; NVSHMEM runs several PEs on one GPU (limited without MPS), and NCCL and "
              "torch's symmetric memory refuse to", file=stream or sys.stderr, flush=True)


def shared() -> bool:
    """Whether this process's ranks share GPUs."""
    return torch.cuda.is_available() and current().shared


def refuse_timing(what: str) -> None:
    """Benchmarks call this first: no speed figure ever comes from ranks that share a GPU."""
    if shared():
        place = current()
        raise SystemExit(f"{what}: refused: {place.describe()}; their kernels take turns on the GPU, so a time "
                         "measured here means nothing. Run the correctness checks instead "
                         "(bash bench/gpu_all.sh checks), or launch one rank a GPU.")


def heap_bytes(wanted: int, place: Placement | None = None) -> int:
    """The symmetric heap a rank may ask NVSHMEM for: `wanted`, or on a shared GPU at most its share of
    half the GPU's memory (every PE on a GPU has a heap of its own there)."""
    place = place or current()
    if not place.shared:
        return wanted
    total = torch.cuda.get_device_properties(place.device).total_memory
    return min(wanted, total // 2 // place.per_gpu // (1 << 20) * (1 << 20))


# ---- host collectives on any backend ---------------------------------------------------------------
# What the runtime and the checks need, for CUDA tensors too: on gloo (ranks sharing GPUs) each goes through
# the CPU, element types as raw bytes where nothing is summed (gloo lacks some, e.g. fp8), and sums in float32
# or wider.

def through_cpu(group=None) -> bool:
    return "nccl" not in str(dist.get_backend(group)) or shared()


def _via_cpu(t: torch.Tensor, group=None) -> bool:
    return t.is_cuda and through_cpu(group)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor's bytes as uint8 rows, one a row of dimension 0 (a 0-d tensor as one row)."""
    t = t.reshape(1) if t.dim() == 0 else t
    return t.reshape(t.shape[0], math.prod(t.shape[1:])).view(torch.uint8)


def _summable(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype in (torch.float32, torch.float64, torch.int32, torch.int64) else t.float()


def all_reduce(t: torch.Tensor, op=dist.ReduceOp.SUM, group=None) -> None:
    """In place, as dist.all_reduce."""
    if not _via_cpu(t, group):
        dist.all_reduce(t, op=op, group=group)
        return
    host = _summable(t.cpu())
    dist.all_reduce(host, op=op, group=group)
    t.copy_(host)


def all_gather(parts: list[torch.Tensor], t: torch.Tensor, group=None) -> None:
    """As dist.all_gather: parts[r] gets rank r's t."""
    if not _via_cpu(t, group):
        dist.all_gather(parts, t.contiguous(), group=group)
        return
    mine = t.contiguous().cpu()
    host = [torch.empty_like(mine) for _ in parts]
    dist.all_gather([_bytes(h) for h in host], _bytes(mine), group=group)
    for part, got in zip(parts, host, strict=True):
        part.copy_(got)


def all_gather_into_tensor(out: torch.Tensor, t: torch.Tensor, group=None) -> None:
    """As dist.all_gather_into_tensor: every rank's t, concatenated along dimension 0."""
    if not _via_cpu(t, group):
        dist.all_gather_into_tensor(out, t.contiguous(), group=group)
        return
    world = dist.get_world_size(group)
    parts = list(out.view(world, *t.shape).unbind(0)) if out.is_contiguous() else None
    if parts is None:
        raise ValueError("all_gather_into_tensor needs a contiguous output")
    all_gather(parts, t, group)


def reduce_scatter_tensor(out: torch.Tensor, t: torch.Tensor, op=dist.ReduceOp.SUM, group=None) -> None:
    """As dist.reduce_scatter_tensor: rank r gets the sum over ranks of t's r-th share of dimension 0
    (through the CPU: the whole sum, then this rank's share)."""
    if not _via_cpu(t, group):
        dist.reduce_scatter_tensor(out, t.contiguous(), op=op, group=group)
        return
    host = _summable(t.contiguous().cpu()).clone()
    dist.all_reduce(host, op=op, group=group)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    out.copy_(host.view(world, *out.shape)[rank])


def broadcast(t: torch.Tensor, src: int = 0, group=None) -> None:
    """In place, as dist.broadcast from global rank `src`."""
    if not _via_cpu(t, group):
        dist.broadcast(t, src, group=group)
        return
    host = t.contiguous().cpu()
    dist.broadcast(_bytes(host), src, group=group)
    t.copy_(host)


def all_to_all_single(out: torch.Tensor, t: torch.Tensor, out_splits=None, in_splits=None, group=None) -> None:
    """As dist.all_to_all_single, splits in rows of dimension 0."""
    if not _via_cpu(t, group):
        dist.all_to_all_single(out, t.contiguous(), out_splits, in_splits, group=group)
        return
    host_in, host_out = t.contiguous().cpu(), torch.empty(out.shape, dtype=out.dtype)
    dist.all_to_all_single(_bytes(host_out), _bytes(host_in), out_splits, in_splits, group=group)
    out.copy_(host_out)
