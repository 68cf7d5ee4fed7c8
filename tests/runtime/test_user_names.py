"""The program's names are the program's (issue 25): a tensor may be called like a resource of the
launcher (`shapes`, `diag`, `blocks`, `barrier`, `sig_<family>`) and still run and match, and
`reset()` zeroes the launcher's signals, never a tensor of the program. Emulated at world 2."""
from __future__ import annotations

import textwrap

import pytest
import torch

from tiledsl.runtime.emulate import run_ranks
from tiledsl.tools import trace
from tiledsl.tools.run_program import run_emulated

pytestmark = pytest.mark.emulated

# every tensor named after something Program keeps per set of sizes; `sig_fill` is also the name of
# family fill's signals, and `count_take` that of a copy-engine count
NAMED_LIKE_RESOURCES = textwrap.dedent("""\
    program named_like_resources
    param N
    const B = 2
    in    barrier : f32[N]
    symm  diag : f32[N]
    local shapes : bf16[N]
    symm  sig_fill : f32[N]
    out   blocks : f32[N]
    out   count_take : f32[N]
    tile  fill[i in cdiv(N, B)]: diag[i*B : +B] = barrier[i*B : +B] * 2; shapes[i*B : +B] = barrier[i*B : +B] + 1; \\
          sig_fill[i*B : +B] = barrier[i*B : +B] - 1
    tile  take[i in cdiv(N, B)]: blocks[i*B : +B] = diag@((rank + 1) mod world)[i*B : +B] + shapes[i*B : +B]; \\
          count_take[i*B : +B] = sig_fill@((rank + 1) mod world)[i*B : +B]
    take[i] after fill[i] @ ((rank + 1) mod world), fill[i]
    """)

# a family named `entry` beside the entry's own timeline row, tensors named like the launcher's trace
# rows (`trace_<family>`, `entry_trace`), signals and counts (`sig_x`, `count_x`), and a family `x` whose
# own arguments (tds_trace_x, tds_sig_x) are named like them too
ENTRY_NAMED = textwrap.dedent("""\
    program entry_named
    param N
    const B = 2
    in    trace_entry : f32[N]
    symm  count_x : f32[N]
    local sig_x : f32[N]
    out   trace_x : f32[N]
    out   entry_trace : f32[N]
    tile  entry[i in cdiv(N, B)]: count_x[i*B : +B] = trace_entry[i*B : +B] * 2; sig_x[i*B : +B] = 1
    tile  x[i in cdiv(N, B)]: trace_x[i*B : +B] = count_x@((rank + 1) mod world)[i*B : +B] + sig_x[i*B : +B]
    chunk pull[i in cdiv(N, B)] on copy_engine: count_x@rank[i*B : +B] -> entry_trace[i*B : +B]
    x[i] after entry[i] @ ((rank + 1) mod world), entry[i]
    pull[i] after entry[i]
    """)

# a copy tile into a tensor valid `upto` a count: the copy runs inside the count's condition
UPTO_COPY = textwrap.dedent("""\
    program upto_copy
    param E, C, D
    const BC = 4
    in    count : i32[E] cap C
    in    X     : f32[E, C, D]
    out   Y     : f32[E, C, D] upto count
    tile  cp[e in E, m in cdiv(C, BC)]: Y[e, m*BC : +BC, :] = X[e, m*BC : +BC, :]
    """)


def test_tensors_named_like_the_launchers_resources_run_and_match():
    verdicts = run_emulated(NAMED_LIKE_RESOURCES, 2, {"N": 5})
    assert [v.tensor for v in verdicts] == ["blocks", "count_take"]
    assert all(v.ok for v in verdicts), [v.line() for v in verdicts]


def _rank_reset(heap):
    """One call, then reset(): the symm tensors `diag` and `sig_fill` keep what the call wrote."""
    import tiledsl
    program = tiledsl.compile(NAMED_LIKE_RESOURCES, heap, emulated=True, wait_timeout_s=30.0,
                              dtype_override={"bfloat16": torch.float32})
    n = 5
    program(torch.arange(n, dtype=torch.float32) + heap.rank, torch.empty(n), torch.empty(n))
    tensors = next(iter(program._resources.values())).tensors
    before = {name: tensors[name].numpy().copy() for name in ("diag", "sig_fill")}
    program.reset()
    after = {name: tensors[name].numpy().copy() for name in ("diag", "sig_fill")}
    heap.close()
    return before, after


def test_reset_zeroes_the_launchers_signals_and_not_tensors_named_like_them():
    for rank, (before, after) in enumerate(run_ranks(_rank_reset, 2, timeout_s=300)):
        x = torch.arange(5, dtype=torch.float32) + rank
        torch.testing.assert_close(torch.from_numpy(before["diag"]), 2 * x)
        torch.testing.assert_close(torch.from_numpy(before["sig_fill"]), x - 1)
        for name in before:
            torch.testing.assert_close(torch.from_numpy(after[name]), torch.from_numpy(before[name]))


def test_a_copy_tile_into_an_upto_tensor_runs_and_matches_below_the_count():
    (verdict,) = run_emulated(UPTO_COPY, 2, {"E": 3, "C": 6, "D": 4})
    assert verdict.ok, verdict.line()


def test_a_family_named_entry_and_tensors_named_like_trace_rows_run_and_match():
    verdicts = run_emulated(ENTRY_NAMED, 2, {"N": 5})
    assert [v.tensor for v in verdicts] == ["trace_x", "entry_trace"]
    assert all(v.ok for v in verdicts), [v.line() for v in verdicts]


def test_a_family_named_entry_keeps_its_timeline_apart_from_the_entrys():
    """`entry`'s three instances are stamped in its own rows, the entry's row is the origin: the trace
    kept them in one dict, where the entry's row took the family's place."""
    found = trace.trace_emulated(ENTRY_NAMED, 2, {"N": 5})
    for rank in range(2):
        assert sorted((e.family, e.instance) for e in found if e.rank == rank) == \
            [("entry", 0), ("entry", 1), ("entry", 2), ("pull", 0), ("pull", 1), ("pull", 2),
             ("x", 0), ("x", 1), ("x", 2)]
    assert all(0 <= e.start_us <= e.waited_us <= e.end_us for e in found)
