"""Device values (MoE's sizes and indices read on the device) beside the topology (`node`, `local_rank`,
`local_world`): the two meet in one meaning. A MoE program names no topology, so it is proved and run
within one node; a program that names both is proved at every topology the checker takes, with its
capacities at the worst case there, refused where it reads a count through a pointer on another node,
and runs emulated on two nodes against the reference."""
from __future__ import annotations

from pathlib import Path

import pytest

from tiledsl.diagnostics import TdsError
from tiledsl.pipeline import run
from tiledsl.schedule.meaning import MAX_INSTANCES, _worst_case_capacities, default_sizes, topologies

PROGRAMS = Path(__file__).resolve().parents[2] / "programs"
MOE_PROGRAMS = ("moe_dispatch", "moe_combine", "ag_group_gemm", "moe_gemm_rs", "group_gemm")

# moe_dispatch within each node: the experts of a node's ranks receive only that node's tokens
DISPATCH_IN_NODE = """\
program dispatch_in_node
param T, H, K, E, C
const BT = 4
let   NE = E * local_world
in    X     : f32[T, H]
in    ids   : i32[T, K]
out   recv  : f32[E, local_world, C, H] upto count
out   count : i32[E, local_world] cap C
out   slot  : i32[T, K]
symm  sent  : i32[NE] cap C
symm  got   : i32[E, local_world] cap C
symm  send  : f32[NE, C, H]
tile  route: slot = arrival(ids, NE); sent = histogram(ids, NE)
tile  pack[t in cdiv(T, BT), k in K]: send[ids[t*BT : +BT, k], slot[t*BT : +BT, k], :] = X[t*BT : +BT, :]
chunk tell[d in local_world] on sms(1): sent[d*E : +E] -> got@(node*local_world + d)[:, local_rank]
chunk pull[s in local_world, e in E] on sms(4): \\
      send@(node*local_world + s)[local_rank*E + e, 0 : +got[e, s], :] -> recv[e, s, 0 : +got[e, s], :]
tile  keep: count = got
pack[t, k] after route
tell[d] after route
pull[s, e] after tell[local_rank] @ (node*local_world + s), pack[*, *] @ (node*local_world + s)
keep after tell[local_rank] @ (node*local_world + s for s in local_world)
"""


@pytest.mark.parametrize("name", MOE_PROGRAMS)
def test_a_moe_program_names_no_topology_so_it_is_proved_and_sized_within_one_node(name):
    schedule = run(PROGRAMS / f"{name}.tds", until="check").schedule
    assert not schedule.spans_nodes
    assert [t.nodes for t in topologies(schedule)] == [1, 1, 1]
    with pytest.raises(ValueError, match="names no topology"):
        default_sizes(schedule, 4, nodes=2)


def test_device_values_and_the_topology_are_proved_together_at_every_topology():
    done = run(DISPATCH_IN_NODE, until="check")
    assert done.warnings == []
    schedule = done.schedule
    checked = topologies(schedule)
    assert any(t.nodes > 1 and t.local_world > 1 for t in checked), checked
    for topology in checked:
        sizes = default_sizes(schedule, topology.world, nodes=topology.nodes)
        # every token's k distinct experts may all be one expert's: each capacity holds all T rows, the
        # bins (E * local_world experts) counted at this topology
        assert sizes["C"] >= sizes["T"], (topology, sizes)
        raised = _worst_case_capacities(schedule, topology.world, {**sizes, "C": 1}, MAX_INSTANCES, topology.nodes)
        assert raised == sizes | {"C": sizes["T"]}, (topology, raised)


def test_counts_told_through_a_pointer_to_another_node_are_refused():
    refused = DISPATCH_IN_NODE.replace("got@(node*local_world + d)[:, local_rank]", "got@d[:, local_rank]")
    with pytest.raises(TdsError) as raised:
        run(refused, until="check")
    found = [d for d in raised.value.diagnostics if d.severity == "error"
             and d.message.startswith("across nodes: chunk 'tell' on SMs stores into got on rank")]
    assert found, [d.message for d in raised.value.diagnostics]
    line = next(n for n, text in enumerate(refused.splitlines(), 1) if text.startswith("chunk tell"))
    assert (found[0].span.line, found[0].span.column) == (line, refused.splitlines()[line - 1].index("got@d") + 1)


@pytest.mark.emulated
def test_dispatch_within_each_node_runs_emulated_on_two_nodes_of_two_ranks(tmp_path):
    from tiledsl.tools.run_program import run_emulated
    source = tmp_path / "dispatch_in_node.tds"
    source.write_text(DISPATCH_IN_NODE)
    # T = 6 rows a rank, no tile divides it; C = T: no routing exceeds capacity
    verdicts = run_emulated(source, 4, {"T": 6, "H": 5, "K": 2, "E": 2, "C": 6}, nodes=2, timeout_s=300.0)
    assert sorted(v.tensor for v in verdicts) == ["count", "recv", "slot"]
    assert all(v.ok for v in verdicts), [v.line() for v in verdicts]
