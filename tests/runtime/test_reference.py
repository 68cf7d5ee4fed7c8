"""The torch reference that emulated and GPU runs are compared with, on tensors small enough to work
out by hand: if it were wrong in the same way as the kernels, every check would pass."""
from __future__ import annotations

from pathlib import Path

import torch

from tiledsl.pipeline import run
from tiledsl.schedule.meaning import instantiate
from tiledsl.tools.reference import Reference

PROGRAMS = Path(__file__).resolve().parents[2] / "programs"


def schedule(name: str):
    return run(PROGRAMS / f"{name}.tds", until="check").schedule


def tensor(*values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_copy_gives_every_rank_its_own_input():
    reference = Reference(schedule("copy"), world=2, sizes={"N": 3})
    out = reference.run([{"X": tensor(1, 2, 3)}, {"X": tensor(-4, 5, 0.5)}])
    assert out[0]["Y"].tolist() == [1, 2, 3]
    assert out[1]["Y"].tolist() == [-4, 5, 0.5]


def test_copy_rounds_what_it_stores_to_the_declared_dtype_unless_emulation_widens_it():
    x = [{"X": tensor(1 + 2**-10, 3)}]  # 1 + 2^-10 is not a bf16: 7 fraction bits round it to 1
    assert Reference(schedule("copy"), 1, {"N": 2}).run(x)[0]["Y"].tolist() == [1, 3]
    widened = Reference(schedule("copy"), 1, {"N": 2}, dtype_map={"bfloat16": "float32"}).run(x)
    assert widened[0]["Y"].tolist() == [1 + 2**-10, 3]


def test_allreduce_leaves_the_sum_over_ranks_on_every_rank():
    reference = Reference(schedule("allreduce"), world=2, sizes={"N": 4})
    out = reference.run([{"X": tensor(1, 2, 3, 4)}, {"X": tensor(10, 20, 30, 40)}])
    for rank in range(2):
        assert out[rank]["X"].tolist() == [11, 22, 33, 44]


def test_allreduce_at_three_ranks():
    reference = Reference(schedule("allreduce"), world=3, sizes={"N": 2})
    out = reference.run([{"X": tensor(1, 2)}, {"X": tensor(3, 4)}, {"X": tensor(5, -6)}])
    assert [out[r]["X"].tolist() for r in range(3)] == [[9, 0]] * 3


def test_reduce_scatter_gives_rank_r_the_sum_of_row_block_r():
    reference = Reference(schedule("reduce_scatter"), world=2, sizes={"M": 4, "N": 2})
    assert reference.shapes(0) == {"X": (4, 2), "Y": (2, 2)}
    x0 = torch.tensor([[1, 2], [3, 4], [5, 6], [7, 8]], dtype=torch.float64)
    x1 = torch.tensor([[10, 20], [30, 40], [50, 60], [70, 80]], dtype=torch.float64)
    out = reference.run([{"X": x0}, {"X": x1}])
    assert out[0]["Y"].tolist() == [[11, 22], [33, 44]]
    assert out[1]["Y"].tolist() == [[55, 66], [77, 88]]


def test_allgather_stacks_every_ranks_rows_in_rank_order():
    reference = Reference(schedule("allgather"), world=2, sizes={"M": 2, "N": 3})
    out = reference.run([{"X": tensor([1, 2, 3])}, {"X": tensor([4, 5, 6])}])
    assert out[0]["Y"].tolist() == out[1]["Y"].tolist() == [[1, 2, 3], [4, 5, 6]]


def test_gemm_multiplies_a_by_b():
    a = torch.tensor([[1, 2], [3, 4]], dtype=torch.float64)
    b = torch.tensor([[1, 0, 2], [0, 1, -1]], dtype=torch.float64)
    out = Reference(schedule("gemm"), 1, {"M": 2, "K": 2, "N": 3}).run([{"A": a, "B": b}])
    assert out[0]["C"].tolist() == [[1, 2, 0], [3, 4, 2]]


def test_ag_gemm_multiplies_the_gathered_rows():
    b = torch.tensor([[1, 1], [0, 2]], dtype=torch.float64)
    inputs = [{"A": torch.tensor([[1, 2]], dtype=torch.float64), "B": b},
              {"A": torch.tensor([[3, 4]], dtype=torch.float64), "B": b}]
    # mm[i in M/BM] has no instance unless BM divides M: one-row tiles
    out = Reference(schedule("ag_gemm"), 2, {"M": 2, "K": 2, "N": 2}, consts={"BM": 1}).run(inputs)
    for rank in range(2):
        assert out[rank]["C"].tolist() == [[1, 5], [3, 11]]


def test_shapes_follow_the_world():
    sizes = {"M": 4, "N": 2}
    assert Reference(schedule("reduce_scatter"), 2, sizes).shapes(1)["Y"] == (2, 2)
    assert Reference(schedule("reduce_scatter"), 4, sizes).shapes(1)["Y"] == (1, 2)


def test_a_last_block_past_the_end_is_cut_to_the_tensor():
    # BLOCK = 2 over N = 5: three instances, the last covering one element
    reference = Reference(schedule("copy"), 1, {"N": 5}, consts={"BLOCK": 2})
    assert instantiate(reference.schedule, 1, {"N": 5, "BLOCK": 2}).extents["cp"] == [(3,)]
    assert reference.run([{"X": tensor(1, 2, 3, 4, 5)}])[0]["Y"].tolist() == [1, 2, 3, 4, 5]


def test_a_peer_reads_the_copy_staged_at_the_call_start_not_what_its_owner_wrote_since():
    """allreduce reads X@s and overwrites X: rank 1 must sum rank 0's X as it was when the call
    began, even though the reference runs rank 0's tiles (which overwrite X) first."""
    reference = Reference(schedule("allreduce"), world=3, sizes={"N": 2})
    out = reference.run([{"X": tensor(1, 2)}, {"X": tensor(10, 20)}, {"X": tensor(100, 200)}])
    assert [out[rank]["X"].tolist() for rank in range(3)] == [[111, 222]] * 3


def test_a_peer_reads_a_symm_tensor_as_its_owner_wrote_it_in_this_call():
    """The twin of the test above: only caller tensors are staged. gemm_ar's red reads each rank's
    product Q@s after its mm wrote it, so C is the sum of the products, not of Q's values at the start."""
    a = [torch.tensor([[1, 2]], dtype=torch.float64), torch.tensor([[5, 6]], dtype=torch.float64)]
    b = [torch.tensor([[3], [4]], dtype=torch.float64), torch.tensor([[7], [8]], dtype=torch.float64)]
    reference = Reference(schedule("gemm_ar"), world=2, sizes={"M": 1, "K": 2, "N": 1})
    out = reference.run([{"A": a[rank], "B": b[rank]} for rank in range(2)])
    assert [out[rank]["Q"].tolist() for rank in range(2)] == [[[11]], [[83]]]
    assert [out[rank]["C"].tolist() for rank in range(2)] == [[[94]], [[94]]]


def test_a_float_stored_into_an_integer_tensor_converts_toward_zero_as_the_kernel_does():
    # found by tests/schedule/test_bodies.py (seed 2): the reference kept 0.62 where the kernel stored 0
    source = ("program trunc\nparam N\nin X : f32[N]\nout Y : i32[N]\n"
              "tile t[i in cdiv(N, 2)]: Y[i*2 : +2] = X[i*2 : +2] * 0.5\n")
    out = Reference(run(source, until="check").schedule, 1, {"N": 4}).run([{"X": tensor(1.25, -3, 7, 0.5)}])
    assert out[0]["Y"].tolist() == [0, -1, 3, 0]
