"""The parts of a schedule's picture: boxes (`Node`), the lines between them (`Link`) and their colours,
which graph.py makes from a schedule and writes as graphviz text, and graph_matplotlib.py lays out and
draws where graphviz is not installed."""
from __future__ import annotations

from dataclasses import dataclass, field

SYNC_COLOR, FLOW_COLOR = "#1f4e96", "#9aa5b1"
FILL = {"tile": "#e8f0fb", "chunk": "#e6f4ea", "tensor": "#f7f7f7", "symm": "#fde9cf"}
BORDER = {"tile": "#1f4e96", "chunk": "#2e7d32", "tensor": "#6b7785", "symm": "#d9822b"}


@dataclass
class Node:
    """One box of the picture: `title` (drawn bold) over `lines`."""
    id: str
    kind: str  # tile, chunk, tensor, symm (a symmetric tensor), label (an edge's label), dummy (a bend)
    title: str
    lines: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "\n".join([self.title, *self.lines])


@dataclass
class Link:
    source: str
    target: str
    kind: str  # sync (a family waits on another), read, write
    label: str = ""
