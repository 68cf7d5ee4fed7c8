"""A copy-engine chunk with no index list is one instance: its launcher code is valid Python (no
`lambda : (,)`), and it runs, on its own and as what a tile on the next rank waits for."""
from __future__ import annotations

import pytest
import torch

from tiledsl.pipeline import run
from tiledsl.runtime.emulate import run_ranks

ALONE = """\
program ce_alone
param N
in  X : f32[N]
out Y : f32[N]
chunk send on copy_engine: X -> Y[0 : +N]
"""

# rank r's Z is twice rank r-1's X, which the copy engine put into rank r's Y
TO_PEER = """\
program ce_to_peer
param M, N
const BR = 32
in  X : f32[M, N]
symm Y : f32[M, N]
out Z : f32[M, N]
chunk send on copy_engine: X -> Y@((rank + 1) mod world)[:, :]
tile cp[i in cdiv(M, BR)]: Z[i*BR : +BR, :] = Y[i*BR : +BR, :] * 2
cp[i] after send @ ((rank - 1) mod world)
"""


@pytest.mark.parametrize("source", [ALONE, TO_PEER], ids=["alone", "to_peer"])
def test_a_chunk_without_indices_renders_valid_python(source):
    compile(run(source).module, "chunk_tds.py", "exec")


def _rank(heap):
    import tiledsl
    out = {}
    torch.manual_seed(heap.rank)
    x = torch.randn(100)
    y = torch.full((100,), float("nan"))
    tiledsl.compile(ALONE, heap, emulated=True)(x, y)
    out["alone"] = torch.equal(y, x)
    xs = [torch.Generator().manual_seed(r) for r in range(heap.world)]
    mine = torch.randn(70, 40, generator=xs[heap.rank])
    previous = torch.randn(70, 40, generator=xs[(heap.rank - 1) % heap.world])
    z = torch.full((70, 40), float("nan"))
    tiledsl.compile(TO_PEER, heap, emulated=True)(mine, z)
    out["to_peer"] = torch.equal(z, previous * 2)
    heap.close()
    return out


@pytest.mark.emulated
def test_a_chunk_without_indices_copies_once_on_every_rank():
    for rank, out in enumerate(run_ranks(_rank, 2, timeout_s=300)):
        assert out == {"alone": True, "to_peer": True}, (rank, out)
