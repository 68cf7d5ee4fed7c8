"""A readable text form of a Schedule, for `tiledsl build --dump-after schedule`."""
from __future__ import annotations

import sympy

from tiledsl.schedule import ir
from tiledsl.schedule.intcode import code


def describe(schedule: ir.Schedule) -> str:
    """The schedule as text: sizes, tensors, families (index space, engine, regions, what each instance
    computes, order), edges with their index maps, and the launch conditions. Each family and edge
    names its source line."""
    lines = [f"schedule {schedule.name}"]
    if schedule.params:
        lines.append(f"  params  {', '.join(schedule.params)}")
    if schedule.consts:
        lines.append("  consts  " + ", ".join(
            f"{name} = {value}" + (f" (tune {list(schedule.tunables[name])})" if name in schedule.tunables else "")
            for name, value in schedule.consts.items()))
    if schedule.spans_nodes:  # what node and local_rank stand for, and where the checker proves it
        from tiledsl.schedule.meaning import topologies
        lines.append("  topology  " + ", ".join(f"{s} = {v}" for s, v in ir.RANK_PARTS.items())
                     + "; proved at " + ", ".join(str(t) for t in topologies(schedule)))
    lines.append("tensors")
    width = max((len(name) for name in schedule.tensors), default=0)
    for tensor in schedule.tensors.values():
        extra = (f" cap {tensor.cap}" if tensor.cap is not None else "") + \
            (f" upto {tensor.upto}" if tensor.upto else "")
        lines.append(f"  {tensor.role.value:<5} {tensor.name:<{width}} : {tensor.dtype}{_shape(tensor.shape)}{extra}")
    lines.append("families")
    for family in schedule.families.values():
        lines.extend(_family(family))
    lines.append("edges")
    for edge in schedule.edges:
        lines.append(f"  {_edge(schedule, edge):<60} # line {edge.span.line}")
    if not schedule.edges:
        lines.append("  (none)")
    lines.append("launch conditions")
    seen = set()
    for condition in schedule.conditions:
        if condition.message not in seen:
            seen.add(condition.message)
            lines.append(f"  {condition.message:<40} # {condition.holds}, line {condition.span.line}")
    if not seen:
        lines.append("  (none)")
    return "\n".join(lines) + "\n"


def _shape(shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _engine(engine: ir.Engine) -> str:
    if engine.kind is ir.EngineKind.COPY_ENGINE:
        return "copy_engine"
    return f"{engine.kind.value}({'rest' if engine.programs is None else engine.programs})"


def _family(family: ir.Family) -> list[str]:
    space = ", ".join(f"{index} in {extent}" for index, extent in family.indices)
    head = f"{family.kind.value} {family.name}[{space}] on {_engine(family.engine)}"
    if family.split != 1:
        head += f" split {family.split}"
    if family.reduce:
        head += f" reduce {family.reduce}"
    if family.runs_on is not sympy.true:
        head += f" if {code(family.runs_on, kernel=False)}"
    lines = [f"  {head:<60} # line {family.span.line}"]
    for label, regions in (("reads", family.reads), ("writes", family.writes)):
        if regions:
            lines.append(f"    {label:<8}" + ", ".join(region_text(r) for r in regions))
    if family.loops:
        lines.append("    loops   " + ", ".join(f"{var} in {extent}" for var, extent in family.loops))
    if family.body:
        lines.extend(_statements(family.body, "    "))
    else:
        for store in family.stores:
            lines.append(f"    compute {region_text(store.target)} = {value_text(store.value)}"
                         f"   ({store.dtype}{_shape(store.shape)})")
    if family.order:
        lines.append("    order   " + ", ".join(map(str, family.order)))
    return lines


def _statements(statements, indent: str) -> list[str]:
    """A tile's block: its names, its loop (with what it carries) and its stores."""
    lines = []
    for statement in statements:
        if isinstance(statement, ir.SizeLet):
            lines.append(f"{indent}size    {statement.symbol} = {statement.value}")
        elif isinstance(statement, ir.Let):
            lines.append(f"{indent}let     {statement.name} = {value_text(statement.value)}"
                         f"   ({statement.dtype}{_shape(statement.shape)})")
        elif isinstance(statement, ir.Loop):
            carried = ", ".join(f"{c.name} {c.dtype}{_shape(c.shape)}" for c in statement.carried)
            lines.append(f"{indent}loop    {statement.var} in {statement.extent}"
                         + (f"   carries {carried}" if carried else ""))
            lines.extend(_statements(statement.body, indent + "  "))
        else:
            lines.append(f"{indent}compute {region_text(statement.target)} = {value_text(statement.value)}"
                         f"   ({statement.dtype}{_shape(statement.shape)})")
    return lines


def region_text(region: ir.Region) -> str:
    """`X@owner[start : +size, point, ...]`."""
    name = region.tensor if region.owner is None else f"{region.tensor}@{_atom(region.owner)}"
    dims = []
    for dim in region.dims:
        if not dim.kept:
            dims.append(str(dim.start))
        else:
            dims.append(f"{dim.start} : +{dim.size}")
    rows = f" (gathered, {region.rows} rows of {ir.ROW})" if region.rows is not None else ""
    return f"{name}[{', '.join(dims)}]{rows}"


def _atom(expr) -> str:
    text = str(expr)
    return text if isinstance(expr, (sympy.Symbol, sympy.Integer)) else f"({text})"


def value_text(value: ir.Value) -> str:
    if isinstance(value, ir.Load):
        return region_text(value.region)
    if isinstance(value, ir.Scalar):
        return str(value.value)
    if isinstance(value, ir.MatMul):
        return f"({value_text(value.left)} @ {value_text(value.right)})"
    if isinstance(value, ir.Reduce):
        return f"{value.op}({value_text(value.body)} for {value.var} in {value.extent})"
    if isinstance(value, ir.Route):
        part = "" if value.part is None else "[" + ", ".join(f"{d.start} : +{d.size}" for d in value.part) + "]"
        return f"{value.func}({region_text(value.source)}, {value.bins}){part}"
    if isinstance(value, ir.Local):
        return value.name
    if isinstance(value, ir.Iota):
        return f"{'rows' if value.axis == 0 else 'cols'}({value.size})"
    if isinstance(value, ir.Transpose):
        return f"{value_text(value.value)}.T"
    return f"{value.func}({', '.join(value_text(a) for a in value.args)})"


def _edge(schedule: ir.Schedule, edge: ir.Edge) -> str:
    consumer = schedule.families[edge.consumer]
    index = ", ".join("*" if e is None else str(e) for e in edge.index_map)
    text = f"{edge.consumer}[{', '.join(consumer.index_names)}] after {edge.producer}[{index}]"
    if edge.ranks is ir.RankSet.EVERY:
        text += " @ every rank"
    elif edge.ranks is ir.RankSet.AT:
        text += f" @ {_atom(edge.rank_expr)}"
    elif edge.ranks is ir.RankSet.SET:
        text += f" @ ({edge.rank_expr} for {edge.rank_var} in {edge.rank_extent})"
    if edge.loop is not None:
        text += f"   (at each step of {edge.loop})"
    return text
