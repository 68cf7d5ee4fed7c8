"""The ops whose output shape depends on the group's size carry that size into the traced graph.
On one H200 shared by four ranks, a block of ops compiled at world 2 was taken from torch.compile's
cache at world 4 (same code, same shapes, same group name) with world-2 output shapes: inductor's
size assertion failed ("expected size 4000==2000"). Read inside the fake from the group's name, the
world is no part of the cache key; passed as an argument, it is a constant of the graph."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import tiledsl.ops as ops
from tiledsl.ops import torch_ops

SHAPED = {  # op -> (arguments before group_name, arguments after it, the output's shape at world 4)
    "all_gather_matmul": (((3, 8), (8, 5)), (0, None, None), (12, 5)),
    "matmul_reduce_scatter": (((8, 8), (8, 5)), (0, None, None), (2, 5)),
    "all_gather": (((3, 8),), (0, None, None), (12, 8)),
    "reduce_scatter": (((8, 8),), (0, None, None), (2, 8)),
}


@pytest.mark.parametrize("name", sorted(SHAPED))
def test_the_fake_reads_the_world_it_is_given_not_the_group(name):
    shapes, after, want = SHAPED[name]
    with FakeTensorMode():
        tensors = [torch.empty(s) for s in shapes]
        out = getattr(torch.ops.tiledsl, name)(*tensors, "no such group", *after, 4)
    assert tuple(out.shape) == want


def test_moe_dispatch_fake_reads_the_world_it_is_given():
    with FakeTensorMode():
        recv, count = torch.ops.tiledsl.moe_dispatch(torch.empty(6, 16), torch.zeros(6, 2, dtype=torch.int64),
                                                     3, 5, "no such group", None, None, 8)
    assert tuple(recv.shape) == (3, 8, 5, 16) and tuple(count.shape) == (3, 8)


@pytest.mark.parametrize("name", ["all_gather_matmul", "matmul_reduce_scatter", "all_gather", "reduce_scatter",
                                  "moe_dispatch"])
def test_the_functions_pass_the_group_size(name, monkeypatch):
    seen = []
    monkeypatch.setattr(ops, "group_name", lambda group: "g")
    monkeypatch.setattr(ops, "world_size", lambda group: 6)

    monkeypatch.setattr(torch_ops, "call", lambda op, *args: seen.append((op, args[-1])))
    x = torch.zeros(4, 4)
    args = {"moe_dispatch": (x, torch.zeros(4, 2, dtype=torch.int64), 2, 4)}.get(name, (x, x) if "matmul" in name
                                                                                  else (x,))
    getattr(ops, name)(*args)
    assert seen == [(name, 6)]
