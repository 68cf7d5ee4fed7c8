"""`tiledsl build FILE --dump-after plan`: the typed kernel plan as text, one line per decision, with
expressions as sympy writes them (the generated module shows the same plan printed as Triton)."""
from __future__ import annotations

import sympy

from tiledsl.codegen import body
from tiledsl.runtime.specs import ROLES
from tiledsl.schedule import ir


def describe(plan) -> str:
    lines = [f"kernel plan for {plan.name} ({plan.path})"]
    if plan.conditions:
        lines.append("launch conditions: " + "; ".join(str(holds) for holds, _ in plan.conditions))
    for family in plan.families:
        lines += _family(family, plan.interface.families.get(family.name, ()))
    lines.append("kernel arguments: " + ", ".join(
        f"{a.name} ({a.kind.value})" for a in plan.interface.args if a.kind not in ROLES))
    barrier = "two levels (the node by pointers, the other nodes by NVSHMEM)" if plan.distributed and \
        plan.spans_nodes else str(plan.distributed)
    lines.append(f"entry barrier: {barrier}; nvshmem: {plan.uses_nvshmem}"
                 + ("; topology: " + ", ".join(f"{s} = {v}" for s, v in ir.RANK_PARTS.items()) if plan.spans_nodes
                    else ""))
    return "\n".join(lines)


def _family(f, arguments) -> list[str]:
    where = "host, communication stream" if not f.on_sms else \
        f"{f.programs} programs of its own" if f.programs else "the shared programs"
    space = ", ".join(f"{s} < {e}" for s, e in f.indices)
    out = [f"{f.kind} {f.name} on {f.engine} ({where}): [{space}]" + (f", split {f.split}" if f.split > 1 else "")]
    out.append(f"  runs by: {', '.join(map(str, f.order))}" if f.order is not None else "  runs by: instance number")
    if f.lets:
        out.append("  lets: " + ", ".join(f"{s} = {v}" for s, v in f.lets))
    if f.on_sms:
        out.append(f"  receives: {', '.join(arguments)}")
    if f.host is not None:
        for w in f.host.waits:
            loops = "".join(f" for {v} < {e}" for v, e in w.loops)
            written = "" if w.writer is None else f" (rank {w.writer}'s row {w.row}, counted here by its tiles)"
            out.append(f"  stream waits (edge {w.edge}): count_{w.producer}[{w.index}]{written} reaches {w.count}"
                       + loops + ("" if w.exists is sympy.true else f" where {w.exists}"))
        out.append(f"  copy {_region(f.host.source)} -> {_region(f.host.target)}")
    out += ["  " + line for line in _statements(f.head + f.body)]
    if f.notify is not None and f.puts:
        out.append(f"  signal with the put: sig_{f.name}[{f.notify.slot}] on the rank it writes")
    elif f.notify is not None:
        reach = {"local": "this rank", "all": "every rank", "node": "the ranks of this node",
                 "world": "the ranks of this node, and of the other nodes through NVSHMEM signals"}[f.notify.reach]
        ranks = "" if f.notify.first is None or f.notify.reach == "all" else \
            f" ({f.notify.first} .. {f.notify.stop - 1}" + (f"; {f.notify.remote[2]} for {f.notify.remote[0]} < "
                                                             f"{f.notify.remote[1]}" if f.notify.remote else "") + ")"
        out.append(f"  notify {reach}{ranks}: sig_{f.name}[{f.notify.slot}]")
    if f.count_peers is not None:
        first, stop = f.count_peers
        out.append(f"  count row {f.count_row} in the counts of ranks {first} .. {stop - 1}, at this rank's rows "
                   "(copy engines there wait on it)")
    elif f.count_row is not None:
        out.append(f"  count row {f.count_row} (the copy engine waits on it)")
    if f.flatten:
        out.append("  flattened: the persistent loop and the K loop are one pipeline")
    return out


def _region(r) -> str:
    dims = ", ".join(str(start) if size is None else f"{start} : +{size}" for start, size in r.dims)
    owner = "" if r.owner is None else f"@({r.owner})"
    return f"{r.tensor}{owner}[{dims}]"


def _place(p: body.Place) -> str:
    dims = ", ".join(str(d.start) if d.axis is None else f"{d.start} : +{d.block}" for d in p.dims)
    owner = "" if p.owner is None else f"@({p.owner})"
    return f"{p.tensor}{owner}[{dims}]"


def _operand(o) -> str:
    return str(o.value) if isinstance(o, body.Scalar) else o


def _statements(statements) -> list[str]:
    """A line a statement, those a loop or an if holds indented under it (the one walk, body.nested)."""
    return ["  " * depth + DESCRIBE[type(s)](s) for depth, s in body.nested(statements) if DESCRIBE[type(s)]]


def _wait(s: body.Wait) -> str:
    loops = "".join(f" for {v} < {e}" for v, e in s.loops)
    guard = "" if s.exists == sympy.true else f" if {s.exists}"
    how = " (then NVSHMEM's wait)" if s.shmem else ""
    return f"wait edge {s.edge} ({s.where}): sig_{s.producer}[{s.slot}]{loops}{guard}{how}"


def _copy(s: body.Copy) -> str:
    return f"{'add' if s.reduce else 'copy'} {_place(s.source)} -> {_place(s.target)} ({s.rows} rows" + \
        (f" x {s.cols}" if s.cols is not None else "") + f", blocks {s.block})"


def _dot(s: body.Dot) -> str:
    converted = f", computed operands as {s.convert_left or s.convert_right}'s type" \
        if s.convert_left or s.convert_right else ""
    return f"{s.name} = {_operand(s.left)} @ {_operand(s.right)} (tl.dot{converted}{', IEEE fp32' if s.ieee else ''})"


def _put(s: body.Put) -> str:
    source = s.source + ("" if s.source_owner is None else f"@({s.source_owner})")
    return f"nvshmem put {source}[{s.source_start}:] -> {s.target}@({s.owner})[{s.target_start}:] " \
        f"({s.rows} rows x {s.cols}) with its signal"


def _scan(s: body.Scan) -> str:
    into = [f"{what} {_place(p)}" for what, p in (("arrival", s.arrival), ("histogram", s.histogram)) if p is not None]
    return f"scan {_place(s.source)} into {s.bins} groups, {s.groups} a pass: {', '.join(into)}"


# each statement kind's line in the plan's description (tests/codegen/test_printer.py: every kind has one)
DESCRIBE = {
    body.Load: lambda s: f"{s.name} = load {_place(s.place)}",
    body.DescLoad: lambda s: f"{s.name} = load {s.tensor}[{', '.join(map(str, s.at))}] (TMA, {s.descriptor})",
    body.MakeDescriptor: lambda s: f"{s.name} = TMA descriptor of {s.tensor}, blocks {s.block}",
    body.Apply: lambda s: f"{s.name} = {s.function}({', '.join(map(_operand, s.args))})",
    body.Cast: lambda s: f"{s.name} = {s.dtype}({_operand(s.arg)})",
    body.Zeros: lambda s: f"{s.name} = zeros[{', '.join(map(str, s.blocks))}]",
    body.Accumulate: lambda s: f"{s.name} += {_operand(s.term)}",
    body.Loop: lambda s: f"for {s.var} < {s.extent}:" + (" (not pipelined: its steps wait)" if s.stages else ""),
    body.If: lambda s: f"if {s.condition}:",
    body.Product: lambda s: f"{s.name} = {s.left}[{s.row} : +{s.block_m}, :] @ {s.right}[:, {s.col} : +{s.block_n}] "
                            f"(TMA, K = {s.k} in steps of {s.block_k}{', IEEE fp32' if s.ieee else ''})",
    body.TmaStore: lambda s: f"store {s.tensor}[{s.row}, {s.col}] = {s.value} (TMA)",
    body.Store: lambda s: f"store {_place(s.place)} = {_operand(s.value)}",
    body.DescStore: lambda s: f"store {s.tensor}[{', '.join(map(str, s.at))}] = {_operand(s.value)} "
                              f"(TMA, {s.descriptor})",
    body.Barrier: lambda s: "barrier",
    body.Wait: _wait,
    body.Fence: lambda s: "proxy fence (TMA loads follow)",
    body.Record: None,  # the timeline's stamps, in every instance and compiled out untraced: no decision to show
    body.Copy: _copy,
    body.Get: lambda s: f"nvshmem get {s.source}@({s.owner})[{s.source_start}:] -> {s.target}[{s.target_start}:] "
                        f"({s.rows} rows x {s.cols})",
    body.Put: _put,
    body.Fetch: lambda s: f"{s.name} = device values at {_place(s.place)}" + \
        (f", capped at {s.cap}" if s.cap is not None else ""),
    body.Report: lambda s: f"report guard {s.site} where {s.bad}",
    body.Scan: _scan,
    body.Arange: lambda s: f"{s.name} = 0 .. {s.block} along axis {s.axis} of {s.rank}",
    body.Assign: lambda s: f"{s.name} = {_operand(s.value)}",
    body.Full: lambda s: f"{s.name} = full[{', '.join(map(str, s.blocks))}] of {_operand(s.value)}",
    body.Trans: lambda s: f"{s.name} = {_operand(s.arg)}.T",
    body.Dot: _dot,
    body.Mask: lambda s: f"{s.name} = {_operand(s.arg)} where {s.along} < {s.bound}, else {s.fill}",
}
