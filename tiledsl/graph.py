"""Pictures of a schedule: families (tiles, chunks), tensors, the edges between families (labelled with
their index maps) and the dataflow through tensors. `to_dot` gives graphviz text; `draw` writes .dot,
or .png/.svg through graphviz `dot` when it is installed and through matplotlib when it is not."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tiledsl.grammar import ast
from tiledsl.graph_parts import BORDER, FILL, FLOW_COLOR, SYNC_COLOR, Link, Node
from tiledsl.schedule import ir
from tiledsl.tables import DTYPES


def graph_of(schedule: ir.Schedule) -> tuple[list[Node], list[Link]]:
    """The nodes and links of a schedule, labelled with the program's own text where it has one."""
    text = _SourceText(schedule.program)
    nodes = [_tensor_node(t, text) for t in schedule.tensors.values()]
    links: list[Link] = []
    selfwaits: dict[str, list[str]] = {}
    for edge in schedule.edges:
        label = text.edge(edge, schedule.families[edge.consumer])
        if edge.producer == edge.consumer:
            selfwaits.setdefault(edge.consumer, []).append(label)
        else:
            links.append(Link("f:" + edge.producer, "f:" + edge.consumer, "sync", label))
    for family in schedule.families.values():
        nodes.append(_family_node(family, text, selfwaits.get(family.name, [])))
        seen = set()
        for kind, regions in (("read", family.reads), ("write", family.writes)):
            for region in regions:
                if (kind, region.tensor) in seen:
                    continue
                seen.add((kind, region.tensor))
                ends = ("t:" + region.tensor, "f:" + family.name)
                links.append(Link(*(ends if kind == "read" else ends[::-1]), kind))
    return nodes, links


def to_dot(schedule: ir.Schedule) -> str:
    """Graphviz text of the schedule graph, laid out left to right."""
    nodes, links = graph_of(schedule)
    shapes = {"tile": "box", "chunk": "ellipse", "tensor": "note", "symm": "note"}
    out = [f"digraph {_quote(schedule.name)} {{",
           (f"  graph [rankdir=LR, fontname=Helvetica, labelloc=t, label={_quote('program ' + schedule.name)}, "
            "nodesep=0.35, ranksep=0.6];"),
           "  node [fontname=Helvetica, fontsize=11, style=filled];",
           "  edge [fontname=Helvetica, fontsize=10];"]
    for node in nodes:
        bold = node.kind == "symm"
        out.append(f"  {_quote(node.id)} [shape={shapes[node.kind]}, label={_quote(node.text())}, "
                   f"fillcolor={_quote(FILL[node.kind])}, color={_quote(BORDER[node.kind])}"
                   f"{', penwidth=2' if bold else ''}];")
    for link in links:
        if link.kind == "sync":
            style = f"label={_quote(link.label)}, color={_quote(SYNC_COLOR)}, fontcolor={_quote(SYNC_COLOR)}, " \
                    "penwidth=1.6"
        else:
            style = f"style=dashed, color={_quote(FLOW_COLOR)}, arrowsize=0.6"
        out.append(f"  {_quote(link.source)} -> {_quote(link.target)} [{style}];")
    out.append("}")
    return "\n".join(out) + "\n"


def draw(schedule: ir.Schedule, out_path: str | Path) -> str:
    """Write the picture to OUT.dot, OUT.png or OUT.svg; return what drew it ('dot' or 'matplotlib')."""
    out_path = Path(out_path)
    suffix = out_path.suffix.lower()
    if suffix == ".dot":
        out_path.write_text(to_dot(schedule))
        return "graphviz text"
    if suffix not in (".png", ".svg"):
        raise ValueError(f"cannot draw to '{out_path.name}': use .png, .svg or .dot")
    dot = shutil.which("dot")
    if dot is not None:
        done = subprocess.run([dot, f"-T{suffix[1:]}", "-o", str(out_path)], input=to_dot(schedule),
                              text=True, capture_output=True, timeout=60)
        if done.returncode == 0:
            return "dot"
    from tiledsl.graph_matplotlib import draw_matplotlib
    draw_matplotlib(*graph_of(schedule), f"program {schedule.name}", out_path)
    return "matplotlib"


# ---- labels --------------------------------------------------------------------------------------



class _SourceText:
    """What the program says about each family, tensor and edge, as written (lets not expanded)."""

    def __init__(self, program: ast.Program):
        self.lines = program.source.splitlines()
        self.decls = {d.name.id: d for d in program.decls if isinstance(d, (ast.TileDecl, ast.ChunkDecl,
                                                                          ast.TensorDecl))}
        self.edge_decls = program.of(ast.EdgeDecl)
        self.orders = program.of(ast.OrderDecl)

    def of(self, span: ast.Span) -> str | None:
        if span.line <= 0 or span.end_line > len(self.lines):
            return None
        if span.line == span.end_line:
            piece = self.lines[span.line - 1][span.column - 1: span.end_column - 1]
        else:
            piece = "\n".join([self.lines[span.line - 1][span.column - 1:], *self.lines[span.line: span.end_line - 1],
                               self.lines[span.end_line - 1][: span.end_column - 1]])
        return " ".join(piece.replace("\\\n", " ").split()) or None

    def indices(self, family: ir.Family) -> str:
        decl = self.decls.get(family.name)
        written = [self.of(v.span) for v in decl.indices] if decl is not None and hasattr(decl, "indices") else []
        if len(written) == len(family.indices) and None not in written:
            return ", ".join(written)
        return ", ".join(f"{s} in {_sympy(e)}" for s, e in family.indices)

    def edge(self, edge: ir.Edge, consumer: ir.Family) -> str:
        for decl in self.edge_decls:
            for dep in decl.deps:
                if dep.span == edge.span and self.of(dep.span):
                    bound = ", ".join(b.id for b in decl.bound)
                    return f"{decl.consumer.id}[{bound}] after {self.of(dep.span)}"
        written = self.of(edge.span)  # a `wait` inside a tile's block: its own text, as written
        if written:
            return f"{consumer.name}[{', '.join(consumer.index_names)}] after {written}"
        index = ", ".join("*" if e is None else _sympy(e) for e in edge.index_map)
        ranks = {ir.RankSet.LOCAL: "", ir.RankSet.EVERY: " @ every rank"}.get(edge.ranks, f" @ {edge.rank_expr}")
        if edge.ranks is ir.RankSet.SET:
            ranks = f" @ ({edge.rank_expr} for {edge.rank_var} in {edge.rank_extent})"
        return f"{consumer.name}[{', '.join(consumer.index_names)}] after {edge.producer}[{index}]{ranks}"

    def order(self, family: ir.Family) -> str:
        for decl in self.orders:
            if decl.family.id == family.name and all(self.of(k.span) for k in decl.keys):
                return ", ".join(self.of(k.span) for k in decl.keys)
        return ", ".join(_sympy(k) for k in family.order)

    def shape(self, tensor: ir.Tensor) -> str:
        decl = self.decls.get(tensor.name)
        written = [self.of(e.span) for e in decl.shape] if isinstance(decl, ast.TensorDecl) else []
        if len(written) == len(tensor.shape) and None not in written:
            return ", ".join(written)
        return ", ".join(_sympy(e) for e in tensor.shape)


def _tensor_node(tensor: ir.Tensor, text: _SourceText) -> Node:
    kind = "symm" if tensor.role is ir.Role.SYMM else "tensor"
    dtype = DTYPES[tensor.dtype].spellings[0]  # bfloat16 -> bf16, the shortest spelling
    return Node("t:" + tensor.name, kind, tensor.name, [f"{tensor.role.value} {dtype}[{text.shape(tensor)}]"])


def _family_node(family: ir.Family, text: _SourceText, selfwaits: list[str]) -> Node:
    engine = family.engine.kind.value
    if family.engine.kind is not ir.EngineKind.COPY_ENGINE:
        engine += f"({'rest' if family.engine.programs is None else family.engine.programs})"
    extras = [f"split {family.split}"] if family.split != 1 else []
    extras += [f"reduce {family.reduce}"] if family.reduce else []
    lines = [f"on {' '.join([engine, *extras])}"]
    reads = sorted({r.tensor for r in family.reads})
    writes = sorted({r.tensor for r in family.writes})
    lines.append(f"reads {', '.join(reads) or '-'} -> writes {', '.join(writes) or '-'}")
    if family.order:
        lines.append("order by " + text.order(family))
    lines += [f"waits: {w}" for w in selfwaits]
    title = f"{family.kind.value} {family.name}[{text.indices(family)}]"
    return Node("f:" + family.name, family.kind.value, title, lines)


def _sympy(expr) -> str:
    return str(expr).replace("**", "^")


def _quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'

__all__ = ["to_dot", "draw", "graph_of", "Node", "Link"]
