"""How the checker names things in its messages: families, instances, sizes and index tuples."""
from __future__ import annotations

from tiledsl.grammar import ast
from tiledsl.schedule import ir
from tiledsl.schedule.meaning import Concrete, Instance
from tiledsl.schedule.witness import At, Point


def declared(schedule: ir.Schedule, tensor: str) -> str:
    """`file:line` and the declaration of a tensor as written, comment included: what the bound means."""
    span = schedule.tensors[tensor].span
    lines = schedule.program.source.splitlines()
    text = " ".join(lines[span.line - 1].split()) if 0 < span.line <= len(lines) else tensor
    return f"{schedule.program.path}:{span.line} `{text}`"


def family_text(schedule: ir.Schedule, name: str) -> str:
    return f"{schedule.families[name].kind.value} '{name}'"


def sizes_text(concrete: Concrete) -> str:
    world = f"world={concrete.world}" if concrete.nodes == 1 else f"{concrete.topology} ranks"
    return ", ".join([f"{p}={concrete.sizes[p]}" for p in concrete.schedule.params] + [world])


def at(instance) -> str:
    return f"{instance.family}[{', '.join(map(str, instance.index))}] on rank {instance.rank}"


def index_text(index) -> str:
    return "[" + ", ".join("*" if i is None else str(i) for i in index) + "]"


def site(family: ir.Family, span: ast.Span) -> ast.Span:
    return span if span.line > 0 else family.span


def point(instance: Instance) -> Point:
    return Point(instance.family, tuple(instance.index), instance.rank)


def where(concrete: Concrete) -> At:
    return At(concrete.world, tuple(sorted(concrete.sizes.items())), concrete.nodes)


def on_node(concrete: Concrete, rank: int) -> str:
    """`rank 2 (node 1)`."""
    return f"rank {rank} (node {concrete.topology.node(rank)})"
