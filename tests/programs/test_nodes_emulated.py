"""The two-level programs on emulated ranks posing as several nodes, against their expectations written in
torch (expectations.py): every hierarchical program at 2 nodes x 2 ranks, 2 x 1, 3 x 1 and 1 x 4 (where
it must also equal its one-level counterpart on the same inputs). Each call gets fresh random inputs in the same
tensors, with its outputs poisoned (NaN) first, and both calls are checked.

On several emulated nodes the ranks talk across nodes only through NVSHMEM's stand-ins: a peer pointer
to another node is poisoned by the heap and named by the emulator's guard before it is used, which
the tests at the end show (a program the checker would refuse, built without it)."""
from __future__ import annotations

import importlib.util
import os
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from expectations import EXPECTATIONS  # tests/programs/ is on sys.path, as pytest imports this file

pytestmark = pytest.mark.emulated

PROGRAMS = Path(__file__).resolve().parents[2] / "programs"
EMULATED = {"bfloat16": torch.float32}  # the interpreter's bf16 `tl.dot` is wrong: bf16 runs as float32
TOLERANCE = 1e-5  # float32 against float64, relative to the output's largest magnitude
CALLS = 2
# (world, nodes): 2 nodes x 2 ranks, 2 x 1, 1 x 4, and 3 x 1 (`mod nodes` arithmetic two nodes would hide)
TOPOLOGIES = [(4, 2), (2, 2), (4, 1), (3, 3)]
SMALL = {"BM": 16, "BN": 32}
# the two-level programs move a rank's rows in PIECES parts: 3, which the rows below do not divide, so
# that the last part is short (the defaults, 16 and 64 parts, keep the interpreter busy for minutes)
PIECES = {"PIECES": 3}
# program: (its inputs' shapes, its params at a world, consts, its one-level counterpart). Sizes no tile
# divides where the launch conditions allow; small tiles, so that the GEMMs have several a rank.
CASES = {
    "hier_allgather": (lambda w, M, N: {"X": (M // w, N)}, lambda w: {"M": w * 37, "N": 45}, PIECES, "allgather"),
    "hier_reduce_scatter": (lambda w, M, N: {"X": (M, N)}, lambda w: {"M": w * 45, "N": 300}, PIECES,
                            "reduce_scatter"),
    "hier_allreduce": (lambda w, N: {"X": (N,)}, lambda w: {"N": 3001}, {"BLOCK": 256}, "allreduce_two_shot"),
    "hier_ag_gemm": (lambda w, M, K, N: {"A": (M // w, K), "B": (K, N)}, lambda w: {"M": w * 32, "K": 104, "N": 40},
                     {**SMALL, **PIECES}, "ag_gemm"),
    "hier_gemm_rs": (lambda w, M, K, N: {"A": (M, K), "B": (K, N)}, lambda w: {"M": w * 32, "K": 104, "N": 40},
                     {**SMALL, **PIECES, "BR": 16}, "gemm_rs_pull"),
}
# A get across nodes, whose producer's notify is an NVSHMEM signal: every rank ends with the rows of
# the ranks of its local rank on every node, Y[m] = X on rank m*local_world + local_rank.
COLUMN_GATHER = textwrap.dedent("""\
    program column_gather
    param M, N
    const BR = 16, BN = 32
    in   X : f32[M, N]
    out  Y : f32[nodes, M, N]
    symm G : f32[M, N]
    tile  own[i in cdiv(M, BR), j in cdiv(N, BN)]: G[i*BR : +BR, j*BN : +BN] = X[i*BR : +BR, j*BN : +BN]; \\
          Y[node, i*BR : +BR, j*BN : +BN] = X[i*BR : +BR, j*BN : +BN]
    chunk fetch[k in nodes - 1] on nvshmem(4): \\
          G@(((node + 1 + k) mod nodes)*local_world + local_rank)[:, :] -> Y[(node + 1 + k) mod nodes, :, :]
    fetch[k] after own[*, *] @ (((node + 1 + k) mod nodes)*local_world + local_rank)
""")


def _calls(heap, source, consts: dict, calls: list, out_shapes: dict) -> list:
    """One program on this rank: each call's inputs copied into the same tensors, outputs NaN first;
    every call's outputs as numpy."""
    import tiledsl
    program = tiledsl.compile(source, heap, emulated=True, dtype_override=EMULATED, wait_timeout_s=30.0, **consts)
    mine = calls[0][heap.rank]
    tensors = {n: torch.empty(t.shape) for n, t in mine.items()} | {n: torch.empty(s) for n, s in out_shapes.items()}
    outputs = [spec.name for spec in program.callers if spec.role in ("out", "inout")]
    got = []
    for call in calls:
        for n, t in call[heap.rank].items():
            tensors[n].copy_(torch.from_numpy(t))
        for n in out_shapes:
            tensors[n].fill_(float("nan"))
        program(**tensors)
        # numpy arrays travel back by value; torch tensors would be shared through this process's fds
        got.append({n: tensors[n].numpy().copy() for n in outputs})
    return got


def _rank(heap, jobs: list) -> list:
    """One emulated rank: every job (source, consts, calls, out shapes) in turn, on one heap."""
    results = [_calls(heap, *job) for job in jobs]
    heap.close()
    return results


def _inputs(shapes: dict, world: int, generator) -> list[dict]:
    return [{n: torch.randn(shape, generator=generator) for n, shape in shapes.items()} for _ in range(world)]


def _expected(name: str, inputs: list[dict]) -> list[dict]:
    outputs = EXPECTATIONS[name](**{n: [mine[n] for mine in inputs] for n in inputs[0]})
    return [{n: values[rank] for n, values in outputs.items()} for rank in range(len(inputs))]


def _column_gather(inputs: list[dict], nodes: int) -> list[dict]:
    local = len(inputs) // nodes
    return [{"Y": torch.stack([inputs[m * local + rank % local]["X"].double() for m in range(nodes)])}
            for rank in range(len(inputs))]


@pytest.fixture(scope="module")
def runs():
    """(world, nodes) -> {name: (expected[call][rank], got[rank][call], twin got or None)}, each topology's
    programs in one set of rank processes (spawning ranks costs seconds)."""
    from tiledsl.runtime.emulate import run_ranks
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    done = {}

    def result(world: int, nodes: int):
        if (world, nodes) in done:
            return done[world, nodes]
        generator = torch.Generator().manual_seed(zlib.crc32(f"nodes {world} {nodes}".encode()))
        jobs, expected, names = [], {}, []
        for name, (shapes, params, consts, twin) in CASES.items():
            calls = [_inputs(shapes(world, **params(world)), world, generator) for _ in range(CALLS)]
            want = [_expected(name, call) for call in calls]
            outs = {n: tuple(t.shape) for n, t in want[0][0].items() if n not in calls[0][0]}
            jobs.append((os.fspath(PROGRAMS / f"{name}.tds"), consts, calls, outs))
            names.append((name, None))
            expected[name] = want
            if nodes == 1:  # one node: the one-level program on the same inputs
                twin_consts = {k: v for k, v in consts.items() if k not in PIECES}  # a one-level program has none
                jobs.append((os.fspath(PROGRAMS / f"{twin}.tds"), twin_consts, calls, outs))
                names.append((name, twin))
        calls = [_inputs({"X": (40, 50)}, world, generator) for _ in range(CALLS)]
        jobs.append((COLUMN_GATHER, {}, calls, {"Y": (nodes, 40, 50)}))
        names.append(("column_gather", None))
        expected["column_gather"] = [_column_gather(call, nodes) for call in calls]
        # inputs as numpy, by value: a torch tensor takes one of the fewer than 256 descriptors the forkserver passes
        jobs = [(source, consts, [[{n: t.numpy() for n, t in mine.items()} for mine in call] for call in calls], outs)
                for source, consts, calls, outs in jobs]
        per_rank = run_ranks(_rank, world, jobs, timeout_s=900.0, nodes=nodes)
        found = {}
        for n, (name, twin) in enumerate(names):
            got = [mine[n] for mine in per_rank]
            if twin is None:
                found[name] = [expected[name], got, None]
            else:
                found[name][2] = got
        done[world, nodes] = found
        return found

    yield result
    torch.set_num_threads(threads)


def assert_matches(got: np.ndarray, want: torch.Tensor, what: str) -> None:
    got = torch.from_numpy(got).double()
    assert got.shape == want.shape, f"{what}: shape {list(got.shape)}, expected {list(want.shape)}"
    assert want.numel() and torch.isfinite(want).all(), f"{what}: the expectation is empty or not finite"
    unwritten = int((~torch.isfinite(got)).sum())
    assert unwritten == 0, f"{what}: {unwritten} of {got.numel()} elements not finite (never written?)"
    scale = want.abs().max().item() or 1.0
    error = (got - want).abs().max().item() / scale
    assert error <= TOLERANCE, f"{what}: max error {error:.2e} of scale {scale:.3g}"


CHECKS = [(name, world, nodes) for world, nodes in TOPOLOGIES for name in [*CASES, "column_gather"]]


@pytest.mark.parametrize("name, world, nodes", CHECKS,
                         ids=[f"{n}-{nodes}x{world // nodes}" for n, world, nodes in CHECKS])
def test_program_on_nodes_matches_its_torch_expectation(runs, name, world, nodes):
    expected, got, _ = runs(world, nodes)[name]
    for call in range(CALLS):
        for rank in range(world):
            for tensor, want in expected[call][rank].items():
                assert_matches(got[rank][call][tensor], want,
                               f"{name} {tensor} on rank {rank}, call {call}, {nodes} nodes x {world // nodes}")


@pytest.mark.parametrize("name", list(CASES))
def test_on_one_node_each_hierarchical_program_equals_its_one_level_counterpart(runs, name):
    """1 x 4: the two levels collapse to one; the result is the one-level program's, to rounding (sums
    in another order)."""
    _, got, twin = runs(4, 1)[name]
    assert twin is not None
    for rank in range(4):
        for call in range(CALLS):
            for tensor, mine in got[rank][call].items():
                theirs = twin[rank][call][tensor]
                scale = float(np.abs(theirs).max()) or 1.0
                assert np.isfinite(mine).all() and np.abs(mine - theirs).max() <= 1e-6 * scale, (name, tensor, rank)


# ---- the pretend topology is enforced ------------------------------------------------------------

# A tile that loads another node's copy: the checker refuses it (tests/schedule/test_nodes.py); built
# without the checker, the emulator still names the access.
ACROSS = textwrap.dedent("""\
    program across
    param N
    const BLOCK = 256
    inout X : f32[N]
    tile  add[i in cdiv(N, BLOCK)]: X[i*BLOCK : +BLOCK] = sum(X@(s*local_world + local_rank)[i*BLOCK : +BLOCK] for s in nodes)
""")


def _unchecked_module(source: str, folder: Path):
    """The generated module of `source`, built without the checker."""
    from tiledsl.codegen import lower, render
    from tiledsl.grammar.parser import parse
    from tiledsl.schedule import build_schedule
    path = folder / "tds_unchecked.py"
    path.write_text(render(lower(build_schedule(parse(source)))))
    spec = importlib.util.spec_from_file_location("tds_unchecked", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["tds_unchecked"] = module  # its launcher finds itself there
    spec.loader.exec_module(module)
    return module


def _unchecked_rank(heap, source: str, folder: str):
    module = _unchecked_module(source, Path(folder) / str(heap.rank))
    program = module.tds_load(heap=heap, emulated=True, wait_timeout_s=10.0)
    x = torch.arange(600, dtype=torch.float32) + 1000 * heap.rank
    program(x)
    heap.close()
    return x.numpy().copy()


def test_the_emulator_names_a_peer_pointer_to_another_nodes_memory(tmp_path):
    from tiledsl.runtime.emulate import RankError, run_ranks
    for rank in range(2):
        (tmp_path / str(rank)).mkdir()
    with pytest.raises(RankError) as raised:
        run_ranks(_unchecked_rank, 2, ACROSS, os.fspath(tmp_path), timeout_s=300.0, nodes=2)
    assert raised.value.kind == "CrossNodeAccess"
    assert raised.value.message == ("rank 0 (node 0) loaded from rank 1's memory (node 1) through a peer pointer: "
                                    "across nodes (2 nodes x 1 ranks) only NVSHMEM reaches")


def test_its_twin_on_one_node_reads_the_same_copies_through_pointers(tmp_path):
    from tiledsl.runtime.emulate import run_ranks
    for rank in range(2):
        (tmp_path / str(rank)).mkdir()
    got = run_ranks(_unchecked_rank, 2, ACROSS, os.fspath(tmp_path), timeout_s=300.0, nodes=1)
    # one node: the sum runs over the one node, each rank's own copy
    assert [float(g[1]) for g in got] == [1.0, 1001.0]


def _heap(world: int, nodes: int, rank: int = 0):
    from tiledsl.runtime.emulate import EmulatedHeap, _shared_zeros
    from tiledsl.topology import Topology

    class Alone:  # one process plays the rank: nothing to wait for
        def wait(self):
            pass
    return EmulatedHeap(rank, world, [_shared_zeros(1 << 16) for _ in range(world)], Alone(),
                        Topology.of(world, nodes))


def test_the_heap_gives_no_pointer_to_another_nodes_copy_and_nvshmem_stand_ins_their_own_table():
    from tiledsl.runtime.heap import CrossNodeAccess, poisoned_rank
    heap = _heap(4, 2, rank=1)
    t = heap.alloc((8,), torch.float32)
    assert heap.peer(t, 0).shape == (8,)  # rank 0 shares rank 1's node
    with pytest.raises(CrossNodeAccess, match=r"rank 1 \(node 0\) asked for a pointer to rank 2's memory, on node 1"):
        heap.peer(t, 2)
    offsets = heap.peer_offsets(t).tolist()
    addresses = [t.data_ptr() + 4 * o for o in offsets]
    assert [poisoned_rank(a, 4) for a in addresses] == [None, None, 2, 3]
    shmem = heap.shmem_offsets(t).tolist()
    assert shmem[:2] == offsets[:2] and all(poisoned_rank(t.data_ptr() + 4 * o, 4) is None for o in shmem)


def test_a_program_that_names_no_topology_is_refused_at_launch_on_two_nodes():
    import tiledsl
    from tiledsl.runtime.validate import LaunchError
    with pytest.raises(LaunchError, match="allgather: this launch has 2 nodes x 1 ranks, and the program names no "
                                          "topology"):
        tiledsl.compile(PROGRAMS / "allgather.tds", _heap(2, 2), emulated=False)
    # its twin: the two-level program, and a program that talks to no other rank
    tiledsl.compile(PROGRAMS / "hier_allgather.tds", _heap(2, 2), emulated=False)
    tiledsl.compile(PROGRAMS / "copy.tds", _heap(2, 2), emulated=False)


def test_tiledsl_run_refuses_a_one_node_program_on_two_nodes_before_any_rank_starts(monkeypatch, capsys):
    from tiledsl.cli import main
    from tiledsl.runtime import emulate
    monkeypatch.setattr(emulate, "run_ranks", lambda *_, **__: pytest.fail("ranks were started"))
    assert main(["run", os.fspath(PROGRAMS / "allgather.tds"), "--world", "2", "--nodes", "2"]) == 1
    err = capsys.readouterr().err
    assert "allgather names no topology: it reaches other ranks through peer pointers, which stay within a node" \
        in err and "Traceback" not in err


# ---- inputs on the heap, read in place: the exit barrier in two levels ---------------------------

def _in_place_rank(heap, shape: tuple, calls: int) -> dict:
    """hier_reduce_scatter with X on the heap (tiledsl.empty): peers read it where it is, and the caller
    overwrites it as soon as each call returns, which only the exit barrier makes safe."""
    import tiledsl
    program = tiledsl.compile(PROGRAMS / "hier_reduce_scatter.tds", heap, emulated=True, dtype_override=EMULATED,
                              wait_timeout_s=30.0)
    x = tiledsl.empty(shape, torch.float32, heap=heap)
    y = torch.empty(shape[0] // heap.world, shape[1])
    got = {"Y": [], "staged": [], "exit": [], "barrier": []}
    for call in range(calls):
        x.copy_(torch.randn(shape, generator=torch.Generator().manual_seed(100 * call + heap.rank)))
        y.fill_(float("nan"))
        program(X=x, Y=y)
        prepared = list(program._calls.values())  # one per staging parity
        got["staged"].append(sum(len(p.staged) for p in prepared))
        got["exit"].append(all(p.exit for p in prepared))
        # the two-level barrier's slots: entry (this node's ranks, then the other nodes), then exit's
        got["barrier"].append(prepared[0].kernel_args["tds_barrier"].tolist())
        got["Y"].append(y.numpy().copy())
    heap.close()
    return got


@pytest.mark.parametrize("world, nodes", [(4, 2), (2, 2)], ids=["2x2", "2x1"])
def test_heap_inputs_read_in_place_across_nodes_and_overwritten_after_each_call_stay_right(world, nodes):
    from tiledsl.runtime.emulate import run_ranks
    shape, calls = (world * 45, 300), 3
    per_rank = run_ranks(_in_place_rank, world, shape, calls, timeout_s=600.0, nodes=nodes)
    for call in range(calls):
        inputs = [{"X": torch.randn(shape, generator=torch.Generator().manual_seed(100 * call + r))}
                  for r in range(world)]
        for rank, want in enumerate(_expected("hier_reduce_scatter", inputs)):
            assert_matches(per_rank[rank]["Y"][call], want["Y"], f"Y on rank {rank}, call {call}, {nodes} nodes")
    # nothing copied into the heap: every call passed the exit barrier instead
    assert all(r["staged"] == [0] * calls and r["exit"] == [True] * calls for r in per_rank)
    # and every rank passed it: each slot of entry and exit, from its node and from the other nodes, holds
    # the call's epoch or the next's (a peer may have entered the next call already); slots of a rank's
    # own node are stored through pointers, the rest signalled
    levels = world // nodes + nodes
    for rank in range(world):
        for call in range(calls):
            slots = per_rank[rank]["barrier"][call]
            own = (rank // (world // nodes)) + world // nodes  # the node's own slot is never signalled
            assert len(slots) == 2 * levels and all(slots[s] >= call + 1 for s in range(2 * levels)
                                                    if s not in (own, levels + own)), (rank, call, slots)


# ---- the timeline of a program on nodes ------------------------------------------------------------

def test_tiledsl_trace_stamps_every_instance_of_a_two_level_program_on_two_nodes(tmp_path, capsys):
    """2 nodes x 2: each rank's puts across nodes (nvshmem), its copies of what landed, its pulls within
    the node; each stamped once, its waits inside its span. A one-node program is refused on two nodes."""
    from tiledsl.cli import main
    from tiledsl.tools import trace
    # two parts a copy (each part is stamped, as it is signalled, alone), so that the interpreter is quick
    source = (PROGRAMS / "hier_allgather.tds").read_text()
    assert "PIECES = 64" in source
    found = trace.trace_emulated(source.replace("PIECES = 64", "PIECES = 2"), 4, {"M": 4 * 37, "N": 45}, nodes=2)
    counts = {}
    for e in found:
        counts[e.rank, e.family] = counts.get((e.rank, e.family), 0) + 1
        assert e.start_us <= e.waited_us <= e.end_us, e
    # across[m in nodes], mine[m in nodes], pull[k in local_world - 1, m in nodes], each in 2 parts
    assert counts == {(r, f): 2 * 2 for r in range(4) for f in ("across", "mine", "pull")}
    assert main(["trace", os.fspath(PROGRAMS / "allgather.tds"), "--world", "2", "--nodes", "2",
                 "-o", os.fspath(tmp_path / "t")]) == 1
    err = capsys.readouterr().err
    assert "allgather names no topology" in err and "Traceback" not in err
