"""Symmetric heap: tensors with one copy per rank, each copy addressable from every rank of the node.

Generated kernels reach rank r's copy as `ptr + peer_offsets[r] + idx`. `open_heap` uses NVSHMEM (nvshmem4py) and
falls back to torch's symmetric memory. NVLink multicast is never used: it can take the shared host down.

Across nodes there are no peer pointers (`tiledsl.topology`): `peer` refuses a rank of another node, and a
peer offset to one points into poisoned addresses, which the emulator names (`node_guard.py`) and a GPU
faults on, so that one machine posing as several nodes (TILEDSL_NODES) cannot talk across them by pointer.
Only NVSHMEM's calls reach there; the emulator's stand-ins for them read `shmem_offsets`.
"""
import atexit
import os

import torch
import torch.distributed as dist

from tiledsl.runtime import placement
# where callers have always found it (README: before `init_process_group`); placement.start calls it too
from tiledsl.runtime.placement import disable_multicast
from tiledsl.topology import Topology, declared, launched, within_one_machine

# A peer offset to a rank of another node points into addresses no allocation uses: rank r's at
# POISON_BASE + r * POISON_SPAN onwards (bytes), so that the emulator can name the rank reached. 16 TiB
# lies above the brk heap and below the mmap area of a Linux process, and outside the device memory
# a GPU maps: an access there faults.
POISON_BASE = 1 << 44
POISON_SPAN = 1 << 36


class CrossNodeAccess(RuntimeError):
    """A peer pointer to another node's memory was asked for or used: across nodes only NVSHMEM reaches."""


def poisoned_rank(address: int, world: int) -> int | None:
    """The rank whose poisoned peer address this is, or None for an ordinary address."""
    if POISON_BASE <= address < POISON_BASE + world * POISON_SPAN:
        return (address - POISON_BASE) // POISON_SPAN
    return None


class SymmetricHeap:
    """Tensors allocated collectively, the same shape on every rank; `peer(t, r)` is rank r's copy of `t`."""

    rank: int
    world: int
    device: torch.device
    topology: Topology

    def __init__(self, rank: int, world: int, device: torch.device, topology: Topology | None = None):
        self.rank, self.world, self.device = rank, world, device
        self.topology = topology or Topology.one_node(world)
        if self.topology.world != world:
            raise ValueError(f"a topology of {self.topology} ranks for a world of {world}")
        self._allocations: dict[int, torch.Tensor] = {}  # data_ptr -> tensor returned by alloc
        self._offsets: dict[tuple[int, int], torch.Tensor] = {}  # (data_ptr, element size) -> peer_offsets
        self._closed = False

    def alloc(self, shape, dtype) -> torch.Tensor:
        """Collective: every rank calls in the same order. Returns this rank's copy, zero-filled."""
        if self._closed:
            raise RuntimeError("alloc on a closed symmetric heap")
        tensor = self._allocate(tuple(shape), dtype)
        tensor.zero_()
        # The zero-fill is only enqueued; a peer that wrote into this copy before it ran would be wiped out.
        # The barrier makes every rank's copy zero before any rank can start writing into it.
        self.barrier()
        self._allocations[tensor.data_ptr()] = tensor
        return tensor

    def peer(self, t: torch.Tensor, r: int) -> torch.Tensor:
        """Rank r's copy of symmetric tensor `t`, as a tensor on this rank's device; a rank of this node."""
        if not self.topology.same_node(self.rank, r):
            raise CrossNodeAccess(
                f"rank {self.rank} (node {self.topology.node(self.rank)}) asked for a pointer to rank {r}'s memory, "
                f"on node {self.topology.node(r)}: across nodes ({self.topology} ranks) only NVSHMEM reaches")
        return self._peer(self._symmetric(t), r)

    def peer_offsets(self, t: torch.Tensor) -> torch.Tensor:
        """int64 [world] on t.device: element offset from `t` to each rank's copy, for `ptr + offsets[r] + idx`;
        to a rank of another node, into poisoned addresses."""
        key = (self._symmetric(t).data_ptr(), t.element_size(), "peers")
        if key not in self._offsets:
            offsets = [self._element_offset(t, r) if self.topology.same_node(self.rank, r) else
                       (POISON_BASE + r * POISON_SPAN - t.data_ptr()) // t.element_size() for r in range(self.world)]
            self._offsets[key] = torch.tensor(offsets, dtype=torch.int64, device=t.device)
        return self._offsets[key]

    def shmem_offsets(self, t: torch.Tensor) -> torch.Tensor:
        """Element offsets from `t` to every rank's copy, other nodes' too: what the emulator's stand-ins of
        NVSHMEM calls address PEs by (NVSHMEM itself needs none). Emulated heaps only."""
        key = (self._symmetric(t).data_ptr(), t.element_size(), "shmem")
        if key not in self._offsets:
            offsets = [self._element_offset(t, r) for r in range(self.world)]
            self._offsets[key] = torch.tensor(offsets, dtype=torch.int64, device=t.device)
        return self._offsets[key]

    def _element_offset(self, t: torch.Tensor, r: int) -> int:
        delta = self._peer(t, r).data_ptr() - t.data_ptr()
        assert delta % t.element_size() == 0, f"rank {r}'s copy is not {t.element_size()}-byte aligned to ours"
        return delta // t.element_size()

    def owns(self, t: torch.Tensor) -> bool:
        """Whether `t` is one of this heap's tensors (from `alloc`, or `tiledsl.empty`), whole and contiguous:
        peers can read it where it is."""
        kept = self._allocations.get(t.data_ptr())
        return kept is not None and t.is_contiguous() and t.shape == kept.shape and t.dtype == kept.dtype

    def barrier(self) -> None:
        """Host-side barrier across ranks, after all work already enqueued on the current stream is done."""
        raise NotImplementedError

    def close(self) -> None:
        """Free everything this heap allocated; idempotent. Tensors from `alloc` and `peer` are dangling after."""
        if self._closed:
            return
        self._closed = True
        allocations = list(self._allocations.values())
        self._allocations.clear()
        self._offsets.clear()
        self._release(allocations)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _symmetric(self, t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in self._allocations or not t.is_contiguous():
            raise ValueError("expected a tensor returned by this heap's alloc() (or a contiguous view starting at it)")
        return t

    # What a backend provides: allocate one symmetric tensor, view a peer's copy, free all its tensors.
    def _allocate(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def _peer(self, t: torch.Tensor, r: int) -> torch.Tensor:
        raise NotImplementedError

    def _release(self, allocations: list[torch.Tensor]) -> None:
        raise NotImplementedError


class _ProcessGroupHeap(SymmetricHeap):
    """A heap whose ranks are the ranks of an initialised torch.distributed process group, one GPU each."""

    def __init__(self, group=None):
        disable_multicast()  # before NVSHMEM or torch's symmetric memory initialise and read it
        if not dist.is_initialized():
            raise RuntimeError("a symmetric heap needs torch.distributed initialised first (init_process_group)")
        self.group = group if group is not None else dist.group.WORLD
        self.placement = placement.settle()  # this rank's GPU: its own, or one it shares with other ranks
        local_rank = self.placement.device
        world = dist.get_world_size(self.group)
        # TILEDSL_NODES, else torchrun's LOCAL_WORLD_SIZE: the nodes of this launch (of the world group)
        if world == dist.get_world_size():
            topology = launched(world, dist.get_rank())
        else:
            within_one_machine(dist.get_process_group_ranks(self.group))
            topology = Topology.one_node(world)
        super().__init__(dist.get_rank(self.group), world, torch.device("cuda", local_rank), topology)

    def barrier(self) -> None:
        torch.cuda.current_stream(self.device).synchronize()
        dist.barrier(self.group)

    def _quiesce(self) -> None:
        """Before freeing: no rank may free memory that a peer's kernels or copies still touch."""
        torch.cuda.synchronize(self.device)
        if dist.is_initialized():  # at interpreter exit the process group may already be gone
            dist.barrier(self.group)


def _size_bytes(text: str) -> int:
    """NVSHMEM_SYMMETRIC_SIZE as NVSHMEM reads it (a number of bytes, or with a K/M/G/T suffix); its
    default, 1 GiB, where unset or unreadable."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = text.strip().upper().removesuffix("B")
    number, unit = (text[:-1], units[text[-1]]) if text[-1:] in units else (text, 1)
    try:
        return int(float(number) * unit)
    except ValueError:
        return 1 << 30


def _memory_now(device) -> str:
    try:
        free, total = torch.cuda.mem_get_info(device)
        held = torch.cuda.memory_reserved(device)
    except (RuntimeError, AssertionError) as error:  # no CUDA here: say so rather than hide the first error
        return f"the GPU's free memory is unknown ({error})"
    return f"the GPU has {free / 2**30:.1f} of {total / 2**30:.1f} GiB free, torch's allocator holds {held / 2**30:.1f} GiB"


def _import_nvshmem():
    try:
        import nvshmem.core
        from cuda.core import Device
    except ImportError as error:
        raise RuntimeError(f"NvshmemHeap needs the `nvshmem4py-cu13` and `cuda-python` packages ({error})") from error
    return nvshmem.core, Device


class NvshmemHeap(_ProcessGroupHeap):
    """Symmetric tensors from NVSHMEM (nvshmem4py), bootstrapped by a unique id sent over the process group."""

    def __init__(self, group=None):
        nvshmem_core, Device = _import_nvshmem()
        super().__init__(group)
        if self.placement.shared:  # every PE on a GPU has a heap of its own there
            wanted = _size_bytes(os.environ.get("NVSHMEM_SYMMETRIC_SIZE", ""))
            os.environ["NVSHMEM_SYMMETRIC_SIZE"] = str(placement.heap_bytes(wanted, self.placement))
        self._nvshmem = nvshmem_core
        uid = [nvshmem_core.get_unique_id() if self.rank == 0 else None]
        dist.broadcast_object_list(uid, src=dist.get_global_rank(self.group, 0), group=self.group)
        nvshmem_core.init(device=Device(self.device.index), uid=uid[0], rank=self.rank, nranks=self.world,
                          initializer_method="uid")
        # NVSHMEM prints errors at exit for symmetric memory still allocated when it is finalised.
        atexit.register(self.close)

    def _allocate(self, shape, dtype):
        tensor = self._nvshmem.tensor(shape, dtype=dtype)
        if tensor is None or (tensor.numel() and tensor.data_ptr() == 0):
            # nvshmem_malloc's NULL: the heap could not grow (`cuMemCreate failed` above), e.g. where ranks
            # sharing a GPU have filled it. Writing through it would be an illegal memory access.
            raise RuntimeError(
                f"NVSHMEM could not allocate a symmetric {tuple(shape)} {dtype} tensor on rank {self.rank} of "
                f"{self.world}: its heap (NVSHMEM_SYMMETRIC_SIZE={os.environ.get('NVSHMEM_SYMMETRIC_SIZE', 'default')}) "
                f"could not grow; {_memory_now(self.device)}")
        return tensor

    def _peer(self, t, r):
        # Asked for our own PE, nvshmem4py hands back the allocation itself with its reference count raised,
        # so free_tensor would then never reach zero and never call nvshmem_free.
        return t if r == self.rank else self._nvshmem.get_peer_tensor(t, r)

    def _release(self, allocations):
        atexit.unregister(self.close)
        self._quiesce()
        for tensor in allocations:  # free_tensor is collective: every rank frees in alloc order
            self._nvshmem.free_tensor(tensor)
        self._nvshmem.finalize()


class TorchSymmHeap(_ProcessGroupHeap):
    """Symmetric tensors from torch.distributed._symmetric_memory, CUDA backend (peer mappings, no multicast)."""

    def __init__(self, group=None):
        from torch.distributed import _symmetric_memory as symm_mem

        super().__init__(group)
        if self.placement.shared:
            raise RuntimeError(f"{self.placement.describe()}: torch's symmetric memory refuses ranks that share a GPU "
                               "(allocations from overlapping devices); install nvshmem4py-cu13, whose NVSHMEM runs "
                               "several ranks on one GPU, or launch one rank a GPU")
        self._symm_mem = symm_mem
        symm_mem.set_backend("CUDA")  # a no-op when CUDA is already the backend
        symm_mem.enable_symm_mem_for_group(self.group.group_name)  # gives rendezvous the group's store; idempotent
        self._handles: dict[int, object] = {}  # data_ptr -> _SymmetricMemory handle of that allocation

    def _allocate(self, shape, dtype):
        tensor = self._symm_mem.empty(shape, dtype=dtype, device=self.device)
        self._handles[tensor.data_ptr()] = self._symm_mem.rendezvous(tensor, self.group.group_name)
        return tensor

    def _peer(self, t, r):
        return self._handles[t.data_ptr()].get_buffer(r, tuple(t.shape), t.dtype)

    def _release(self, allocations):
        self._quiesce()
        # Dropping the last references hands the memory back to torch's symmetric-memory pool.
        self._handles.clear()


def open_heap(group=None) -> SymmetricHeap:
    """The symmetric heap for `group` (default: the world): NVSHMEM if nvshmem4py imports, else torch's,
    which reaches the ranks of one node only."""
    disable_multicast()
    try:
        import nvshmem.core  # noqa: F401  (only probing whether nvshmem4py is installed)
    except ImportError:
        if placement.shared():
            raise RuntimeError(f"{placement.current().describe()}: only NVSHMEM runs several ranks on one GPU "
                               "(pip install nvshmem4py-cu13); torch's symmetric memory refuses them") from None
        if dist.is_initialized() and declared(dist.get_world_size()).nodes > 1:
            raise RuntimeError(f"{declared(dist.get_world_size())} ranks: across nodes tiledsl needs NVSHMEM "
                               "(pip install nvshmem4py-cu13)") from None
        return TorchSymmHeap(group)
    return NvshmemHeap(group)
