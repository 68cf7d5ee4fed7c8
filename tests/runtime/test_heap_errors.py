"""What NvshmemHeap says when NVSHMEM cannot grow its heap (nvshmem_malloc's NULL, as on ranks sharing a
GPU whose memory is full): a run-time error naming the tensor, the rank and the heap, where writing through
the NULL would have been an illegal memory access (seen at world 8 on one H200, 2026-12-04)."""
import pytest
import torch

from tiledsl.runtime.heap import NvshmemHeap


class _Null:  # what nvshmem4py hands back for a NULL allocation: a view at address 0
    def numel(self):
        return 4096

    def data_ptr(self):
        return 0


class _FakeNvshmem:
    def __init__(self, result):
        self.result = result

    def tensor(self, shape, dtype):
        return self.result


def _heap(result):
    heap = object.__new__(NvshmemHeap)  # no NVSHMEM here: only what _allocate reads
    heap._nvshmem, heap.rank, heap.world, heap.device = _FakeNvshmem(result), 3, 8, torch.device("cuda", 0)
    return heap


def test_a_null_allocation_is_a_named_error():
    with pytest.raises(RuntimeError, match=r"symmetric \(64, 64\) torch.bfloat16 tensor on rank 3 of 8: its heap "
                                           r"\(NVSHMEM_SYMMETRIC_SIZE=.*\) could not grow"):
        _heap(_Null())._allocate((64, 64), torch.bfloat16)


def test_a_real_allocation_is_returned_as_it_is():
    t = torch.zeros(4)
    assert _heap(t)._allocate((4,), torch.float32) is t
