"""Pictures of the schedule graph: the DOT text names every family, tensor and edge, and the matplotlib
drawing (used when graphviz is absent) writes a picture whose boxes never overlap."""
import re
import shutil
from pathlib import Path

import pytest

from tiledsl import graph, graph_matplotlib
from tiledsl.pipeline import run
from tiledsl.schedule import ir

PROGRAMS = sorted((Path(__file__).parents[1] / "programs").glob("*.tds"))
# a deadlock (red and fix wait on each other), a family waiting on itself, an inout written back, a split
KNOTTED = """program knotted
param M, N
const BM = 128
in  A : bf16[M, N]
inout X : bf16[M, N]
symm S : bf16[world, M, N]
chunk push[s in world] on sms(4) split 2: X -> S@s[rank, :, :]
tile red[i in M/BM]: X[i*BM : +BM, :] = sum(S[s, i*BM : +BM, :] for s in world)
tile fix[i in M/BM]: X[i*BM : +BM, :] = relu(A[i*BM : +BM, :])
red[i] after push[*], push[rank] @ every rank, fix[i]
fix[i] after red[i], fix[i - 1]
"""


def schedule_of(source):
    return run(source, until="schedule").schedule


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.stem)
def test_dot_names_every_family_tensor_and_edge(path):
    schedule = schedule_of(path)
    dot = graph.to_dot(schedule)
    assert dot.startswith(f'digraph "{schedule.name}" {{') and dot.rstrip().endswith("}")
    for family in schedule.families.values():
        shape = "box" if family.kind is ir.Kind.TILE else "ellipse"
        assert re.search(rf'"f:{family.name}" \[shape={shape}, label="{family.kind.value} {family.name}\[', dot)
    for tensor in schedule.tensors.values():
        assert f'"t:{tensor.name}" [shape=note, label="{tensor.name}\\n{tensor.role.value} ' in dot
    source = path.read_text()
    for edge in schedule.edges:
        written = source.splitlines()[edge.span.line - 1][edge.span.column - 1: edge.span.end_column - 1]
        if edge.producer == edge.consumer:  # a wait on the family itself (a ring's hop) is drawn in its node
            node = re.search(rf'"f:{edge.consumer}" \[shape=[a-z]+, label="([^"]*)"', dot).group(1)
            assert re.search(rf'waits: (.*\\n)*.*{edge.consumer}\[[^\]]*\] after {re.escape(written)}', node), node
            continue
        assert re.search(rf'"f:{edge.producer}" -> "f:{edge.consumer}" \[label="{edge.consumer}\[[^"]*\] after '
                         rf'{re.escape(written)}"', dot)


def test_dot_of_ag_gemm_reads_like_the_program():
    dot = graph.to_dot(schedule_of(PROGRAMS[0]))
    assert 'label="mm[i, j] after gather[(i*BM) / Ms]"' in dot
    assert 'label="tile mm[i in world * (Ms/BM), j in cdiv(N, BN)]\\non sms(rest)\\nreads A_all, B -> writes C\\n' \
           'order by ((i*BM)/Ms - rank) mod world, j"' in dot
    assert '"t:A_all" [shape=note, label="A_all\\nsymm bf16[M, K]", fillcolor="#fde9cf"' in dot
    assert '"t:A" -> "f:gather" [style=dashed' in dot and '"f:mm" -> "t:C" [style=dashed' in dot


def test_dot_shows_self_waits_splits_and_every_rank():
    dot = graph.to_dot(schedule_of(KNOTTED))
    assert "waits: fix[i] after fix[i - 1]" in dot
    assert "on sms(4) split 2" in dot
    assert 'label="red[i] after push[rank] @ every rank"' in dot
    assert '"f:red" -> "f:fix"' in dot and '"f:fix" -> "f:red"' in dot


def test_dot_quotes_what_it_labels():
    assert graph._quote('a "b" \\ c\nd') == '"a \\"b\\" \\\\ c\\nd"'


@pytest.mark.parametrize("source", [*PROGRAMS, KNOTTED], ids=[p.stem for p in PROGRAMS] + ["knotted"])
def test_matplotlib_layout_never_overlaps_boxes(source):
    nodes, links = graph.graph_of(schedule_of(source))
    boxes, routed = graph_matplotlib._layout(nodes, links, lambda text, bold: (7.0 * max(map(len, text.split("\n"))),
                                                                    12.0 * (text.count("\n") + 1)))
    assert {n.id for n in nodes} <= set(boxes)
    placed = [b for b in boxes.values() if b.node.kind != "dummy"]
    for k, a in enumerate(placed):
        for b in placed[k + 1:]:
            apart_x = abs(a.x - b.x) >= (a.w + b.w) / 2
            apart_y = abs(a.y - b.y) >= (a.h + b.h) / 2
            assert apart_x or apart_y, (a.node.id, b.node.id)
    for link, chain in zip(links, routed):  # every link runs left to right through consecutive columns
        assert {chain[0], chain[-1]} == {link.source, link.target}
        assert [boxes[n].layer for n in chain] == list(range(boxes[chain[0]].layer, boxes[chain[-1]].layer + 1))


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_matplotlib_writes_a_picture_without_graphviz(tmp_path, monkeypatch, suffix, magic):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    out = tmp_path / f"knotted{suffix}"
    assert graph.draw(schedule_of(KNOTTED), out) == "matplotlib"
    assert out.stat().st_size > 10_000
    assert out.read_bytes().startswith(magic)


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz `dot` is not installed")
def test_graphviz_draws_when_installed(tmp_path):
    out = tmp_path / "ag_gemm.png"
    assert graph.draw(schedule_of(PROGRAMS[0]), out) == "dot"
    assert out.read_bytes().startswith(b"\x89PNG")


def test_dot_file_is_the_dot_text(tmp_path):
    schedule = schedule_of(PROGRAMS[0])
    assert graph.draw(schedule, tmp_path / "g.dot") == "graphviz text"
    assert (tmp_path / "g.dot").read_text() == graph.to_dot(schedule)
