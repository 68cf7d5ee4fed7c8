"""Drawing a schedule graph without graphviz: a layered left-to-right layout (Sugiyama), measured in
points, drawn with matplotlib. `tiledsl.graph.draw` uses it when graphviz `dot` is not installed."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tiledsl.graph_parts import BORDER, FILL, FLOW_COLOR, SYNC_COLOR, Link, Node

FONT = "DejaVu Sans Mono"
FONT_SIZE, COLUMN_GAP, ROW_GAP, PAD = 9.0, 54.0, 18.0, 7.0


@dataclass
class _Box:
    """A node placed in the picture: center (x, y) with y growing downwards, size (w, h)."""
    node: Node
    layer: int
    w: float
    h: float
    text_size: tuple[float, float, float] = (0.0, 0.0, 0.0)  # title height, lines height, text width
    x: float = 0.0
    y: float = 0.0


def _chains(nodes: list[Node], links: list[Link]) -> list[list[str]]:
    """Each link as the left-to-right chain of boxes it passes (its label included), turned around where
    that breaks a cycle (a write back into an `inout` tensor, a deadlock): the drawing then points the
    arrow at the chain's start."""
    order = {n.id: k for k, n in enumerate(nodes)}
    outgoing: dict[str, list[int]] = {n: [] for n in order}
    for k, link in enumerate(links):
        outgoing[link.source].append(k)
    has_input = {link.target for link in links}
    # A DFS that turns around every link into a node still on its stack leaves no cycle; starting from
    # inputs makes the turned links the ones that go "back", such as writes into an `inout` tensor.
    backwards, state = set(), {}
    for root in sorted(order, key=lambda n: (n in has_input, order[n])):
        if root in state:
            continue
        state[root] = "open"
        stack = [(root, iter(outgoing[root]))]
        while stack:
            node, pending = stack[-1]
            for k in pending:
                target = links[k].target
                if state.get(target) == "open":
                    backwards.add(k)
                elif target not in state:
                    state[target] = "open"
                    stack.append((target, iter(outgoing[target])))
                    break
            else:
                state[node] = "done"
                stack.pop()
    chains = []
    for k, link in enumerate(links):
        chain = [link.source, f"label:{k}", link.target] if link.label else [link.source, link.target]
        chains.append(chain[::-1] if k in backwards else chain)
    return chains


def _layout(nodes: list[Node], links: list[Link], measure) -> tuple[dict[str, _Box], list[list[str]]]:
    import networkx as nx

    chains = _chains(nodes, links)
    by_id = {n.id: n for n in nodes}
    for k, link in enumerate(links):
        if link.label:
            by_id[f"label:{k}"] = Node(f"label:{k}", "label", link.label)
    dag = nx.DiGraph()
    dag.add_nodes_from(by_id)
    for chain in chains:
        dag.add_edges_from(zip(chain, chain[1:]))
    layer: dict[str, int] = {}
    for n in nx.topological_sort(dag):
        layer[n] = max((layer[p] + 1 for p in dag.predecessors(n)), default=0)
    for n in by_id:  # inputs sit just before their first reader, not all in the first column
        if dag.in_degree(n) == 0 and dag.out_degree(n) > 0:
            layer[n] = min(layer[s] for s in dag.successors(n)) - 1
    # long links bend through one invisible box per column they cross
    routed = []
    for k, chain in enumerate(chains):
        full = [chain[0]]
        for a, b in zip(chain, chain[1:]):
            for step in range(layer[a] + 1, layer[b]):
                bend = f"bend:{k}:{a}:{step}"
                by_id[bend], layer[bend] = Node(bend, "dummy", ""), step
                full.append(bend)
            full.append(b)
        routed.append(full)
    boxes = {}
    for n, node in by_id.items():
        boxes[n] = _sized(node, layer[n], measure)
    _order_and_place(boxes, routed)
    return boxes, routed


def _sized(node: Node, layer: int, measure) -> _Box:
    if node.kind == "dummy":
        return _Box(node, layer, 0.0, 8.0)
    title_w, title_h = measure(node.title, bold=node.kind != "label")
    lines_w, lines_h = measure("\n".join(node.lines), bold=False) if node.lines else (0.0, 0.0)
    text_w, text_h = max(title_w, lines_w), title_h + lines_h
    if node.kind == "chunk":  # the text block must fit inside the ellipse: (w_t/w)^2 + (h_t/h)^2 <= 1
        w, h = 1.25 * text_w + 14, 1.7 * text_h + 8
    else:
        w, h = text_w + 2 * PAD, text_h + 2 * PAD
    return _Box(node, layer, w, h, (title_h, lines_h, text_w))


def _order_and_place(boxes: dict[str, _Box], routed: list[list[str]]) -> None:
    """Order each column to cut crossings (barycenters), then set y (aligned with neighbours, no
    overlaps) and x (columns as wide as their widest box)."""
    depth = max(b.layer for b in boxes.values()) + 1
    columns: list[list[str]] = [[] for _ in range(depth)]
    for n in dict.fromkeys(n for chain in routed for n in chain):
        columns[boxes[n].layer].append(n)
    for n, box in boxes.items():
        if n not in columns[box.layer]:
            columns[box.layer].append(n)
    pairs = {(a, b) for chain in routed for a, b in zip(chain, chain[1:])}
    before = {n: [a for a, b in pairs if b == n] for n in boxes}
    after = {n: [b for a, b in pairs if a == n] for n in boxes}

    def crossings(cols) -> int:
        pos = {n: k for col in cols for k, n in enumerate(col)}
        spans = sorted((pos[a], pos[b]) for a, b in pairs)
        return sum(1 for i, (a1, b1) in enumerate(spans) for a2, b2 in spans[i + 1:] if a1 < a2 and b1 > b2)

    best = [list(c) for c in columns]
    best_count = crossings(best)
    for sweep in range(8):
        sequence = range(1, depth) if sweep % 2 == 0 else range(depth - 2, -1, -1)
        for layer in sequence:
            pos = {n: k for col in columns for k, n in enumerate(col)}
            side = before if sweep % 2 == 0 else after
            key = {n: (sum(pos[m] for m in side[n]) / len(side[n]) if side[n] else pos[n]) for n in columns[layer]}
            columns[layer].sort(key=lambda n: key[n])
        count = crossings(columns)
        if count < best_count:
            best, best_count = [list(c) for c in columns], count
    # y: stack each column, then pull every box towards its neighbours without breaking the order
    for col in best:
        top = -sum(boxes[n].h + ROW_GAP for n in col) / 2
        for n in col:
            boxes[n].y = top + boxes[n].h / 2
            top += boxes[n].h + ROW_GAP
    for sweep in range(12):
        for col in (best if sweep % 2 == 0 else best[::-1]):
            wanted = []
            for n in col:
                near = before[n] + after[n]
                wanted.append(sum(boxes[m].y for m in near) / len(near) if near else boxes[n].y)
            for n, y in zip(col, _spread(wanted, [boxes[n].h for n in col])):
                boxes[n].y = y
    left = 0.0
    for col in best:
        width = max(boxes[n].w for n in col)
        for n in col:
            boxes[n].x = left + width / 2
        left += width + COLUMN_GAP


def _spread(wanted: list[float], heights: list[float]) -> list[float]:
    """Positions closest to `wanted` (least squares) that keep their order with ROW_GAP between boxes:
    isotonic regression (pool adjacent violators) on the positions less their minimal offsets."""
    offsets = [0.0]
    for a, b in zip(heights, heights[1:]):
        offsets.append(offsets[-1] + (a + b) / 2 + ROW_GAP)
    blocks: list[list[float]] = []  # [mean, count]
    for w, off in zip(wanted, offsets):
        blocks.append([w - off, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, c2 = blocks.pop()
            m1, c1 = blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    flat = [m for m, c in blocks for _ in range(int(c))]
    return [z + off for z, off in zip(flat, offsets)]


def draw_matplotlib(nodes: list[Node], links: list[Link], title: str, out_path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    probe = Figure(dpi=150)
    renderer = FigureCanvasAgg(probe).get_renderer()

    def measure(text: str, bold: bool) -> tuple[float, float]:
        """Width and height in points, with a margin for hinting at other resolutions."""
        artist = probe.text(0, 0, text, family=FONT, size=FONT_SIZE, weight="bold" if bold else "normal")
        extent = artist.get_window_extent(renderer)
        artist.remove()
        return extent.width * 72 / 150 * 1.05 + 2, extent.height * 72 / 150

    boxes, routed = _layout(nodes, links, measure)
    x0 = min(b.x - b.w / 2 for b in boxes.values()) - 12
    x1 = max(b.x + b.w / 2 for b in boxes.values()) + 12
    y0 = min(b.y - b.h / 2 for b in boxes.values()) - 12
    y1 = max(b.y + b.h / 2 for b in boxes.values()) + 12
    fig = Figure(figsize=((x1 - x0) / 72, (y1 - y0) / 72), dpi=72)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(x0, x1)
    ax.set_ylim(-y1, -y0)  # y grows downwards in the layout
    ax.set_axis_off()
    _draw_links(ax, boxes, routed, links)
    for box in boxes.values():
        _draw_box(ax, box)
    ax.text((x0 + x1) / 2, -y0 + 8, title, ha="center", va="bottom", size=12, weight="bold", family=FONT)
    _legend(fig)
    inches = max(x1 - x0, y1 - y0) / 72
    fig.savefig(out_path, dpi=min(150.0, 9000 / max(inches, 1.0)), bbox_inches="tight", pad_inches=0.25,
                facecolor="white")


def _draw_box(ax, box: _Box) -> None:
    from matplotlib.patches import Ellipse, FancyBboxPatch, Polygon

    kind, x, y, w, h = box.node.kind, box.x, -box.y, box.w, box.h
    if kind == "dummy":
        return
    left, bottom = x - w / 2, y - h / 2
    if kind == "chunk":
        ax.add_patch(Ellipse((x, y), w, h, facecolor=FILL[kind], edgecolor=BORDER[kind], lw=1.3, zorder=3))
    elif kind in ("tensor", "symm"):
        fold = 8
        corners = [(left, bottom), (left + w, bottom), (left + w, bottom + h - fold), (left + w - fold, bottom + h),
                   (left, bottom + h)]
        ax.add_patch(Polygon(corners, facecolor=FILL[kind], edgecolor=BORDER[kind],
                             lw=2.0 if kind == "symm" else 1.1, zorder=3))
        ax.add_patch(Polygon([(left + w - fold, bottom + h), (left + w - fold, bottom + h - fold),
                              (left + w, bottom + h - fold)], closed=False, fill=False, edgecolor=BORDER[kind],
                             lw=1.0, zorder=3))
    elif kind == "label":
        ax.add_patch(FancyBboxPatch((left, bottom), w, h, boxstyle="round,pad=0,rounding_size=5",
                                    facecolor="white", edgecolor=SYNC_COLOR, lw=0.6, zorder=4))
    else:
        ax.add_patch(FancyBboxPatch((left, bottom), w, h, boxstyle="round,pad=0,rounding_size=4",
                                    facecolor=FILL[kind], edgecolor=BORDER[kind], lw=1.3, zorder=3))
    title_h, lines_h, _ = box.text_size
    top = y + (title_h + lines_h) / 2
    color = SYNC_COLOR if kind == "label" else "#1a1a1a"
    ax.text(x, top, box.node.title, ha="center", va="top", family=FONT, size=FONT_SIZE, color=color,
            weight="normal" if kind == "label" else "bold", zorder=5)
    if box.node.lines:
        ax.text(x, top - title_h, "\n".join(box.node.lines), ha="center", va="top", multialignment="center",
                family=FONT, size=FONT_SIZE, color="#333333", zorder=5)


def _draw_links(ax, boxes: dict[str, _Box], routed: list[list[str]], links: list[Link]) -> None:
    """Each link leaves its left box on the right side and enters its right box on the left side; ports
    are spread along a side so that links sharing a box do not share a point. Curves are S-shaped
    Beziers between columns and straight lines through them."""
    from matplotlib.patches import FancyArrowPatch
    from matplotlib.path import Path as MplPath

    ports: dict[tuple[str, str], list[int]] = {}
    for k, chain in enumerate(routed):
        ports.setdefault((chain[0], "out"), []).append(k)
        ports.setdefault((chain[-1], "in"), []).append(k)
    port_y: dict[tuple[int, str], float] = {}
    for (n, side), ks in ports.items():
        other = (lambda k: boxes[routed[k][1]].y) if side == "out" else (lambda k: boxes[routed[k][-2]].y)
        ks.sort(key=other)
        for slot, k in enumerate(ks):
            port_y[(k, side)] = boxes[n].y + boxes[n].h * 0.6 * ((slot + 0.5) / len(ks) - 0.5)
    for k, chain in enumerate(routed):
        first, last = boxes[chain[0]], boxes[chain[-1]]
        points = [(_side_x(first, port_y[(k, "out")], +1), port_y[(k, "out")])]
        for n in chain[1:-1]:
            box = boxes[n]
            half = box.w / 2 if box.node.kind == "label" else _column_half(boxes, box)
            points += [(box.x - half, box.y), (box.x + half, box.y)]
        points.append((_side_x(last, port_y[(k, "in")], -1), port_y[(k, "in")]))
        verts, codes = [(points[0][0], -points[0][1])], [MplPath.MOVETO]
        for p, q in zip(points, points[1:]):
            if abs(q[1] - p[1]) < 0.5 or q[0] - p[0] < 1:
                verts.append((q[0], -q[1]))
                codes.append(MplPath.LINETO)
            else:
                mid = (p[0] + q[0]) / 2
                verts += [(mid, -p[1]), (mid, -q[1]), (q[0], -q[1])]
                codes += [MplPath.CURVE4] * 3
        link = links[k]
        backwards = chain[0] != link.source
        sync = link.kind == "sync"
        ax.add_patch(FancyArrowPatch(path=MplPath(verts, codes), arrowstyle="<|-" if backwards else "-|>",
                                     mutation_scale=12 if sync else 9, lw=1.6 if sync else 0.9,
                                     linestyle="-" if sync else (0, (4, 3)),
                                     color=SYNC_COLOR if sync else FLOW_COLOR, zorder=2 if sync else 1))


def _side_x(box: _Box, y: float, side: int) -> float:
    """Where a horizontal line at height y meets the box's left (-1) or right (+1) side."""
    if box.node.kind == "chunk":
        t = min(1.0, abs(y - box.y) / (box.h / 2))
        return box.x + side * box.w / 2 * (1 - t * t) ** 0.5
    return box.x + side * box.w / 2


def _column_half(boxes: dict[str, _Box], bend: _Box) -> float:
    return max(b.w for b in boxes.values() if b.layer == bend.layer) / 2


def _legend(fig) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor=FILL["tile"], edgecolor=BORDER["tile"], label="tile family (compute)"),
        Line2D([], [], marker="o", markersize=11, linestyle="none", markerfacecolor=FILL["chunk"],
               markeredgecolor=BORDER["chunk"], label="chunk family (communication)"),
        Patch(facecolor=FILL["tensor"], edgecolor=BORDER["tensor"], label="tensor (in, out, inout, local)"),
        Patch(facecolor=FILL["symm"], edgecolor=BORDER["symm"], lw=2, label="symm tensor (symmetric heap)"),
        Line2D([], [], color=SYNC_COLOR, lw=1.6, label="edge: consumer waits on producer instances"),
        Line2D([], [], color=FLOW_COLOR, lw=0.9, linestyle=(0, (4, 3)), label="data: reads / writes"),
    ]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, frameon=False,
               prop={"family": FONT, "size": 8})


__all__ = ["draw_matplotlib"]
