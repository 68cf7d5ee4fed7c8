"""The two-level topology in the language and the checker: `node`, `nodes`, `local_rank` and
`local_world` are defined once (ir.RANK_PARTS, the numbering tiledsl.topology uses), a program that
names them is proved at several nodes, and there the transport is enforced: each refusal below is
asserted with its message and site, beside an accepted twin that differs only in what it fixes."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import sympy

from tiledsl.diagnostics import TdsError
from tiledsl.pipeline import run
from tiledsl.schedule import ir
from tiledsl.schedule.meaning import (NODE_TOPOLOGIES, Reach, compile_exprs, default_sizes, instantiate,
                                      notify_reach, size_symbols, target, topologies)
from tiledsl.schedule.witness import AcrossNodes, SignalAcross
from tiledsl.topology import Topology, declared, launched, within_one_machine

ROOT = Path(__file__).resolve().parents[2]
HIER = sorted((ROOT / "programs").glob("hier_*.tds"))


def tds(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def errors(source: str) -> list:
    with pytest.raises(TdsError) as raised:
        run(source, until="check")
    return [d for d in raised.value.diagnostics if d.severity == "error"]


def the_error(source: str, starts: str):
    found = [d for d in errors(source) if d.message.startswith(starts)]
    assert found, f"no error starting {starts!r}: {[d.message for d in errors(source)]}"
    return found[0]


def where(source: str, text: str) -> tuple[int, int]:
    line = next(n for n, line in enumerate(source.splitlines(), 1) if text in line)
    return line, source.splitlines()[line - 1].index(text) + 1


def passes(source: str) -> list:
    return run(source, until="check").warnings


# ---- one definition ------------------------------------------------------------------------------

def test_node_and_local_rank_are_what_the_runtime_numbers_ranks_by():
    """ir.RANK_PARTS (what the checker, kernels, host code and reference evaluate) and Topology (what
    the heap decides peer pointers by) agree on every rank of every topology tried."""
    parts = compile_exprs(tuple(ir.RANK_PARTS.values()), (ir.RANK, ir.LOCAL_WORLD))
    for nodes in range(1, 5):
        for local_world in range(1, 5):
            topology = Topology(nodes, local_world)
            for rank in range(topology.world):
                assert parts(rank, local_world) == (topology.node(rank), topology.local_rank(rank))


def test_the_topology_is_declared_by_tiledsl_nodes_else_by_torchrun_else_one_node():
    assert declared(4, {"TILEDSL_NODES": "2", "LOCAL_WORLD_SIZE": "4"}) == Topology(2, 2)
    assert declared(8, {"LOCAL_WORLD_SIZE": "4"}) == Topology(2, 4)
    assert declared(3, {}) == Topology(1, 3)
    with pytest.raises(ValueError, match="TILEDSL_NODES=2: 3 ranks do not split into 2 nodes"):
        declared(3, {"TILEDSL_NODES": "2"})


def test_the_topology_must_agree_with_where_torchrun_placed_each_rank():
    """A node tiledsl reaches through pointers lies within one machine, pretend nodes included; ranks
    numbered machine by machine. Each refusal beside the launch it is the twin of."""
    two_machines = {"LOCAL_WORLD_SIZE": "2"}
    assert launched(4, 3, {**two_machines, "LOCAL_RANK": "1"}) == Topology(2, 2)
    assert launched(4, 3, {**two_machines, "LOCAL_RANK": "1", "TILEDSL_NODES": "4"}) == Topology(4, 1)
    assert launched(2, 1, {"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1", "TILEDSL_NODES": "2"}) == Topology(2, 1)
    with pytest.raises(ValueError, match=r"TILEDSL_NODES=1 makes nodes of 4 ranks, but a machine holds 2: a node "
                                         r"tiledsl reaches through pointers must lie within one machine \(declare a "
                                         r"multiple of 2 nodes\)"):
        launched(4, 3, {**two_machines, "LOCAL_RANK": "1", "TILEDSL_NODES": "1"})
    with pytest.raises(ValueError, match="rank 3 is local rank 0 of 2 on its machine: tiledsl needs the ranks "
                                         "numbered machine by machine"):
        launched(4, 3, {**two_machines, "LOCAL_RANK": "0"})
    assert launched(4, 3, {}) == Topology(1, 4)  # not under torchrun: what is declared
    within_one_machine([2, 3], {**two_machines, "LOCAL_RANK": "0"})
    with pytest.raises(ValueError, match=r"a process group of ranks \[1, 2\] spans machines of 2 ranks"):
        within_one_machine([2, 1], {**two_machines, "LOCAL_RANK": "0"})


def test_a_program_that_names_the_topology_is_proved_at_several_nodes_and_one_that_does_not_at_one():
    hier = run(HIER[0], until="schedule").schedule
    flat = run(ROOT / "programs" / "allgather.tds", until="schedule").schedule
    assert hier.spans_nodes and not flat.spans_nodes
    assert [str(t) for t in topologies(flat)] == ["1 node x 2", "1 node x 3", "1 node x 4"]
    assert [(t.nodes, t.local_world) for t in topologies(hier)][3:] == list(NODE_TOPOLOGIES)
    assert size_symbols(hier)[-3:] == (ir.WORLD, ir.NODES, ir.LOCAL_WORLD)
    with pytest.raises(ValueError, match="allgather names no topology: it runs within one node"):
        default_sizes(flat, 4, nodes=2)


def test_node_and_local_rank_take_each_ranks_values_in_regions_and_edges():
    schedule = run(ROOT / "programs" / "hier_allgather.tds", until="schedule").schedule
    concrete = instantiate(schedule, 4, {"M": 8, "N": 2}, nodes=2)
    # across[m] on rank r writes G on rank m*local_world + local_rank
    puts = {(concrete.instances[a.instance].rank, concrete.instances[a.instance].index[0]): a.copy
            for a in concrete.accesses if a.write and concrete.instances[a.instance].family == "across"}
    assert puts == {(0, 0): 0, (0, 1): 2, (1, 0): 1, (1, 1): 3, (2, 0): 0, (2, 1): 2, (3, 0): 1, (3, 1): 3}
    # mine[m] on rank r waits on across[node] on rank m*local_world + local_rank
    waits = {(concrete.instances[w.consumer].rank, concrete.instances[w.consumer].index):
             [(concrete.instances[p].rank, concrete.instances[p].index) for p in w.producers]
             for w in concrete.waits if concrete.instances[w.consumer].family == "mine"}
    assert waits[(3, (0,))] == [(1, (1,))] and waits[(2, (1,))] == [(2, (1,))]


def test_a_dep_over_a_set_of_ranks_waits_on_each_of_them():
    schedule = run(ROOT / "programs" / "hier_reduce_scatter.tds", until="schedule").schedule
    edge = next(e for e in schedule.edges if e.consumer == "red")
    assert edge.ranks is ir.RankSet.SET and str(edge.rank_expr) == "local_rank + local_world*s"
    named = target(schedule, edge)
    assert named.over == (edge.rank_var, ir.NODES) and named.exists is sympy.true  # proved < world
    concrete = instantiate(schedule, 6, default_sizes(schedule, 6, nodes=3), nodes=3)
    red = [w for w in concrete.waits if concrete.instances[w.consumer].family == "red"
           and concrete.instances[w.consumer].rank == 4]
    assert red and all(sorted(concrete.instances[p].rank for p in w.producers) == [0, 2, 4] for w in red)


def test_notify_reach_is_how_far_each_familys_waiters_are():
    reach = {p.stem: notify_reach(run(p, until="schedule").schedule) for p in HIER}
    assert reach["hier_allgather"] == {"across": Reach.WORLD, "mine": Reach.NODE}
    assert reach["hier_gemm_rs"] == {"mm": Reach.NODE, "part": Reach.RANK, "send": Reach.WORLD}
    flat = notify_reach(run(ROOT / "programs" / "gemm_rs_pull.tds", until="schedule").schedule)
    assert flat == {"mm": Reach.NODE}  # one node: every rank


# ---- the language --------------------------------------------------------------------------------

ACROSS = tds("""
    program across
    param N
    const BLOCK = 256
    inout X : f32[N]
    tile  add[i in cdiv(N, BLOCK)]: X[i*BLOCK : +BLOCK] = sum(X@(s*local_world + local_rank)[i*BLOCK : +BLOCK] for s in nodes)
""")


def test_an_index_space_may_not_depend_on_the_node():
    source = ACROSS.replace("cdiv(N, BLOCK)]", "cdiv(N, BLOCK) + node]")
    with pytest.raises(TdsError) as raised:
        run(source, until="schedule")
    (found,) = raised.value.diagnostics
    assert found.message == "an index space may not depend on `node`: every rank has the same indices"
    # its twin: the number of nodes is a size, the same on every rank
    family = run(ACROSS.replace("cdiv(N, BLOCK)]", "cdiv(N, BLOCK) + nodes]"), until="schedule").schedule.families
    assert ir.NODES in family["add"].indices[0][1].free_symbols


@pytest.mark.parametrize("name", ["node", "nodes", "local_rank", "local_world"])
def test_topology_names_are_built_in_and_cannot_be_declared(name):
    with pytest.raises(TdsError, match=f"'{name}' is a built-in name and cannot be declared"):
        run(f"program p\nparam {name}\n", until="schedule")


def test_the_extent_of_a_set_of_ranks_is_known_from_the_topology_and_consts():
    source = tds("""
        program p
        param N
        symm X : f32[N]
        out  Y : f32[N]
        tile a[i in N]: X[i : +1] = 1.0
        tile b[i in N]: Y[i : +1] = sum(X@(s*local_world + local_rank)[i : +1] for s in nodes)
        b[i] after a[i] @ (s*local_world + local_rank for s in N)
    """)
    with pytest.raises(TdsError) as raised:
        run(source, until="schedule")
    assert raised.value.diagnostics[0].message == "the ranks' extent must be known from the topology and consts alone"


# ---- the transport, refused and accepted twins ---------------------------------------------------

def test_a_tile_that_loads_another_nodes_copy_is_refused_with_a_hint():
    found = the_error(ACROSS, "across nodes: tile 'add' loads X on rank 1 (node 1) through a peer pointer, at "
                              "add[0] on rank 0 (node 0); pointers reach only the ranks of a node (at N=512, "
                              "2 nodes x 1 ranks)")
    assert (found.span.line, found.span.column) == where(ACROSS, "X@(s*local_world")
    assert found.hint.startswith("across nodes only NVSHMEM moves data: put it into a `symm` buffer")
    assert found.witness == AcrossNodes(found.witness.at, found.witness.instance, "X", 1, False)
    assert found.witness.at.nodes == 2


def test_its_twin_reading_the_peers_of_its_own_node_passes():
    assert passes(ACROSS.replace("s*local_world + local_rank)", "node*local_world + s)")
                  .replace("for s in nodes", "for s in local_world")) == []


PUSH = tds("""
    program column
    param M, N
    in   X : bf16[M / world, N]
    symm Y : bf16[M, N]
    out  Z : bf16[nodes, M / world, N]
    let Ms = M / world
    chunk send[m in nodes] on sms(4): X -> Y@(m*local_world + local_rank)[rank*Ms : +Ms, :]
    tile  use[m in nodes]: Z[m, :, :] = Y[(m*local_world + local_rank)*Ms : +Ms, :]
    use[m] after send[node] @ (m*local_world + local_rank)
""")


def test_an_sm_chunk_that_stores_into_another_nodes_copy_is_refused():
    found = the_error(PUSH, "across nodes: chunk 'send' on SMs stores into Y on rank 1 (node 1) through a peer "
                            "pointer, at send[1] on rank 0 (node 0)")
    assert (found.span.line, found.span.column) == where(PUSH, "Y@(m*local_world")
    assert found.hint.startswith("run it on nvshmem(N)")


def test_its_twin_on_nvshmem_passes():
    """The same chunk as an NVSHMEM put, waited on by the ranks it writes to."""
    assert passes(PUSH.replace("on sms(4)", "on nvshmem(4)")) == []


def test_a_copy_engine_chunk_across_nodes_is_refused_and_within_the_node_passes():
    source = tds("""
        program gather
        param M, N
        in  X : bf16[M / world, N]
        out Y : bf16[M, N]
        let Ms = M / world
        chunk pull[s in world] on copy_engine: X@s -> Y[s*Ms : +Ms, :]
        order pull by (s - rank) mod world
    """).replace("order pull by (s - rank) mod world", "order pull by (s - local_rank) mod world")
    found = the_error(source, "across nodes: chunk 'pull' on the copy engine loads X on rank 1 (node 1)")
    assert (found.span.line, found.span.column) == where(source, "X@s")
    assert found.hint.startswith("run it on nvshmem(N)")
    within = tds("""
        program gather
        param M, N
        in  X : bf16[M / world, N]
        out Y : bf16[M, N]
        let Ms = M / world
        chunk pull[s in local_world] on copy_engine: X@(node*local_world + s) -> Y[(node*local_world + s)*Ms : +Ms, :]
    """)
    assert passes(within) == []


def test_a_put_that_reads_its_source_on_another_node_is_refused_and_from_its_own_passes():
    source = tds("""
        program relay
        param M, N
        in   X : bf16[M, N]
        symm Y : bf16[nodes, M, N]
        out  Z : bf16[nodes, M, N]
        chunk put[m in nodes] on nvshmem(2): X@((rank + local_world) mod world) -> Y@(m*local_world + local_rank)[node, :, :]
        tile  use[m in nodes]: Z[m, :, :] = Y[m, :, :]
        use[m] after put[node] @ (m*local_world + local_rank)
    """)
    found = the_error(source, "across nodes: nvshmem chunk 'put' loads X on rank 1 (node 1) through a peer pointer")
    assert (found.span.line, found.span.column) == where(source, "X@((rank")
    assert found.hint == "a put reads its source on its own node, a get writes its target there"
    assert passes(source.replace("X@((rank + local_world) mod world)", "X@(node*local_world + (rank + 1) mod "
                                                                       "local_world)")) == []


GET = tds("""
    program column_gather
    param M, N
    const BR = 16, BN = 32
    in   X : f32[M, N]
    out  Y : f32[nodes, M, N]
    symm G : f32[M, N]
    tile  own[i in cdiv(M, BR), j in cdiv(N, BN)]: \\
          G[i*BR : +BR, j*BN : +BN] = X[i*BR : +BR, j*BN : +BN]; Y[node, i*BR : +BR, j*BN : +BN] = X[i*BR : +BR, j*BN : +BN]
    chunk fetch[k in nodes - 1] on nvshmem(4): \\
          G@(((node + 1 + k) mod nodes)*local_world + local_rank)[:, :] -> Y[(node + 1 + k) mod nodes, :, :]
    fetch[k] after own[*, *] @ (((node + 1 + k) mod nodes)*local_world + local_rank)
""")


def test_a_get_reads_another_nodes_copy_and_its_producers_notify_is_lowered_to_an_nvshmem_signal():
    assert passes(GET) == []
    plan = run(GET, until="plan").plan
    own = next(f for f in plan.families if f.name == "own")
    assert own.notify.reach == "world" and own.notify.remote is not None
    fetch = next(f for f in plan.families if f.name == "fetch")
    assert [w.shmem for w in fetch.waits] == [True]
    assert "nvshmem get G@(" in plan.describe() and "then NVSHMEM's wait" in plan.describe()
    text = run(GET, until="module").module
    assert "tds_sync.signal(tds_sig_own" in text and "tds_sync.get(Y" in text and "tds_sync.wait_shmem(" in text


def test_its_twin_on_sms_is_refused():
    found = the_error(GET.replace("on nvshmem(4)", "on sms(4)"), "across nodes: chunk 'fetch' on SMs loads G on")
    assert found.hint.startswith("run it on nvshmem(N)")


def test_an_nvshmem_chunk_puts_or_gets_and_never_copies_within_one_rank():
    source = GET.replace("G@(((node + 1 + k) mod nodes)*local_world + local_rank)[:, :] -> Y[", "G[:, :] -> Y[")
    with pytest.raises(TdsError) as raised:
        run(source, until="schedule")
    assert raised.value.diagnostics[0].message.startswith("an nvshmem chunk puts data into another rank's copy")


def test_a_wait_across_nodes_on_a_copy_engine_chunk_is_refused():
    """The copy engine signals by copying the epoch through peer pointers: not to another node."""
    source = tds("""
        program stage
        param M, N
        const BM = 16
        in   X : f32[M, N]
        symm S : f32[M, N]
        symm Y : f32[nodes, M, N]
        out  Z : f32[nodes, M, N]
        tile  prep[i in M / BM]: S[i*BM : +BM, :] = X[i*BM : +BM, :]
        chunk copy[i in M / BM] on copy_engine: S[i*BM : +BM, :] -> S[i*BM : +BM, :]
        copy[i] after prep[i]
        chunk send[m in nodes] on nvshmem(2): S -> Y@(m*local_world + local_rank)[node, :, :]
        send[m] after copy[*] @ (((node + 1) mod nodes)*local_world + local_rank)
        tile  show[m in nodes]: Z[m, :, :] = Y[m, :, :]
        show[m] after send[node] @ (m*local_world + local_rank)
    """)
    found = the_error(source, "across nodes: send[0] on rank 0 (node 0) waits on copy[0] on rank 1 (node 1), a "
                              "copy-engine chunk, which signals through peer pointers")
    assert (found.span.line, found.span.column) == where(source, "copy[*] @")
    assert isinstance(found.witness, SignalAcross)
    # its twin waits on the copy of its own rank, which the copy engine signals there
    assert passes(source.replace(" @ (((node + 1) mod nodes)*local_world + local_rank)\n", "\n")) == []


def test_a_copy_engine_wait_on_tiles_of_another_node_is_refused_and_within_the_node_passes():
    """A tile counts itself into the waiting copy engine's memory through a peer pointer: not on
    another node. Within the node, the count reaches only the node's ranks (codegen/plan.py)."""
    source = tds("""
        program pull_tiles
        param T, V
        const BT = 16
        in   X : f32[T, V]
        symm L : f32[T, V]
        out  Y : f32[local_world, T, V]
        tile mk[i in cdiv(T, BT)]: L[i*BT : +BT, :] = X[i*BT : +BT, :] * 2
        chunk pull[s in local_world] on copy_engine: L@(node*local_world + s) -> Y[s, :, :]
        pull[s] after mk[*] @ (node*local_world + s)
    """)
    across = source.replace("mk[*] @ (node*local_world + s)\n",
                            "mk[*] @ (node*local_world + s), mk[*] @ (((node + 1) mod nodes)*local_world + s)\n")
    found = the_error(across, "across nodes: pull[0] on rank 0 (node 0), a copy-engine chunk, waits on mk[0] on "
                              "rank 1 (node 1), whose count of instances done reaches the stream's memory only "
                              "through peer pointers")
    assert (found.span.line, found.span.column) == where(across, "mk[*] @ (((node")
    assert isinstance(found.witness, SignalAcross) and "on sms(N)" in found.hint
    assert passes(source) == []
    mk = next(f for f in run(source, until="plan").plan.families if f.name == "mk")
    assert [str(r) for r in mk.count_peers] == ["local_world*node", "local_world*(node + 1)"]


def test_a_program_that_names_no_topology_is_checked_within_one_node_only():
    """ag_gemm reads every rank's A by the copy engine: fine on one node, and it names no topology, so
    it is not proved at several (the launcher refuses it there)."""
    assert passes((ROOT / "programs" / "ag_gemm.tds").read_text()) == []


@pytest.mark.parametrize("path", HIER, ids=lambda p: p.stem)
def test_every_hierarchical_program_checks_at_three_nodes_of_two_too(path):
    """3 x 2 is not among the checker's own topologies (its cost); proved here once."""
    from tiledsl.schedule.check import _concrete_findings
    schedule = run(path, until="check").schedule
    for sizes in (default_sizes(schedule, 6, nodes=3),):
        concrete = instantiate(schedule, 6, sizes, nodes=3)
        assert [d.message for _, d in _concrete_findings(concrete) if d.severity == "error"] == []


# Refused twins of the two-level programs: one dependency each made to forget the nodes. On one node
# every twin is the program itself (m, s and the node are 0 there), so each race below exists only
# across nodes, and is found there, with its witness at several nodes.
FORGETFUL = {
    "hier_allgather": ("mine[m] after across[node] @ (m*local_world + local_rank)",
                       "mine[m] after across[node] @ (local_rank)",
                       "race: chunk 'mine' reads G while chunk 'across' may still write it"),
    "hier_reduce_scatter": ("red[i, j] after send[node] @ (s*local_world + local_rank for s in nodes)",
                            "red[i, j] after send[node] @ (local_rank)",
                            "race: tile 'red' reads R while chunk 'send' may still write it"),
    "hier_allreduce": ("tot[i] after across[node, i] @ (s*local_world + local_rank for s in nodes)",
                       "tot[i] after across[node, i] @ (local_rank)",
                       "race: tile 'tot' reads Q while chunk 'across' may still write it"),
    "hier_ag_gemm": ("mm[i, j] after share[local_rank, ((i*BM) / Ms) / local_world]",
                     "mm[i, j] after share[local_rank, 0]",
                     "race: tile 'mm' reads A_all while chunk 'share' may still write it"),
    "hier_gemm_rs": ("send[m] after part[m, *, *]", "send[m] after part[0, *, *]",
                     "race: chunk 'send' reads S while tile 'part' may still write it"),
}


@pytest.mark.parametrize("name", sorted(FORGETFUL))
def test_a_two_level_program_that_forgets_the_other_nodes_in_a_dependency_is_refused(name):
    from tiledsl.schedule.check import _concrete_findings
    old, new, message = FORGETFUL[name]
    source = (ROOT / "programs" / f"{name}.tds").read_text()
    assert source.count(old) == 1
    twin = source.replace(old, new)
    schedule = run(twin, until="schedule").schedule
    for world in (2, 3, 4):  # one node: nothing to find
        concrete = instantiate(schedule, world, default_sizes(schedule, world), nodes=1)
        assert [d.message for _, d in _concrete_findings(concrete) if d.severity == "error"] == []
    found = the_error(twin, message)
    assert found.witness.at.nodes >= 2, found.witness
    read = message.split(" reads ")[1].split(" ")[0]  # the error points at the read of that tensor
    assert twin.splitlines()[found.span.line - 1][found.span.column - 1:].startswith(read), found.span
