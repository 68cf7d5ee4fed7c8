"""A temporary that one statement reads, printed where it is read: `p = tl.exp2(s * 0.5 - mn)`, not
`tds_mul2 = s * 0.5`, `tds_sub = tds_mul2 - mn`, `p = tl.exp2(tds_sub)`. Only printing does this
(printer.statements): the plan keeps every value a statement of its own, as the interface, the plan's
description and the checks of code generation read it.

A value is printed in place where that computes the same thing at the same cost: it is pure (no load,
no store: moving it past a wait or a store changes nothing), a name the lowering made up (`tds_...`,
never the program's own), named once in the printed code besides (so read once: silu's `x *
tl.sigmoid(x)` names its argument twice), by a later statement of the same list (never into a loop,
where it would be computed at every step), with nothing between that assigns a name it reads; and the
statement that reads it stays short (two lines at most, or the lines it had: a longer value stays named)."""
from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Callable

from tiledsl.codegen import body
from tiledsl.codegen.names import held

PURE = (body.Apply, body.Cast, body.Trans, body.Dot, body.Mask)
# where a statement reads its operands: a Computed value may stand in any of these fields
OPERANDS = {body.Apply: "args", body.Cast: "arg", body.Trans: "arg", body.Dot: ("left", "right"),
            body.Mask: "arg", body.Store: "value", body.DescStore: "value", body.Assign: "value",
            body.Accumulate: "term", body.Full: "value"}
# statements that assign nothing but their `name` (a loop: its variable, its steps theirs): a value may be
# carried past them, where they assign none of the names it reads; past any other kind it is not
PLAIN = PURE + (body.Load, body.DescLoad, body.Assign, body.Full, body.Zeros, body.Accumulate, body.Store,
                body.DescStore, body.Record, body.Fence, body.Wait, body.Arange, body.MakeDescriptor, body.Barrier,
                body.Loop, body.If)
IDENTIFIER = re.compile(r"(?<![\w.])[A-Za-z_]\w*")
MOST_LINES = 2  # a statement that reads values computed in place may wrap once, not more

Lines = Callable[[body.Statement, int], list]  # a statement's printed lines at a depth


def inlined(statements, lines_of: Lines) -> tuple:
    """The statements, each temporary read once printed where it is read (`body.Computed`)."""
    counts = Counter(name for depth, s in body.nested(statements) for line in lines_of(s, depth)
                     for name in IDENTIFIER.findall(line))
    return _inlined(tuple(statements), counts, lines_of, 0)


def _inlined(statements: tuple, counts: Counter, lines_of: Lines, depth: int) -> tuple:
    out = [dataclasses.replace(s, body=_inlined(s.body, counts, lines_of, depth + 1)) if hasattr(s, "body") else s
           for s in statements]
    n = 0
    while n < len(out):
        value = out[n]
        if _temporary(value, counts):
            use = _use(out, n, lines_of, depth)
            if use is not None:
                at, reader = use
                out[at] = reader
                del out[n]
                continue
        n += 1
    return tuple(out)


def _temporary(s, counts: Counter) -> bool:
    """A pure value under a name of the lowering's, that exactly one other place names."""
    return isinstance(s, PURE) and s.name.startswith("tds_") and not held(s.name) and counts[s.name] == 2


def _use(out: list, n: int, lines_of: Lines, depth: int):
    """(where, the reading statement with the value in place of its name), or None where it may not move."""
    value = out[n]
    reads = {name for line in lines_of(value, depth) for name in IDENTIFIER.findall(line)} - {value.name}
    for at in range(n + 1, len(out)):
        s = out[at]
        if any(value.name in IDENTIFIER.findall(line) for d, x in body.nested([s], depth)
               for line in lines_of(x, d)):
            reader = _substituted(s, value)
            if reader is None or _height(lines_of(reader, depth)) > max(MOST_LINES, _height(lines_of(s, depth))):
                return None
            return at, reader
        if _assigns(s) is None or _assigns(s) & reads:
            return None
    return None


def _height(lines: list) -> int:
    return sum(line.count("\n") + 1 for line in lines)


def _assigns(s) -> set[str] | None:
    """The names `s` (and the statements inside it) assign; None where that is not known."""
    names = set()
    for x in body.walk([s]):
        if not isinstance(x, PLAIN):
            return None
        if isinstance(x, body.Loop):
            names.add(x.var.name)
        elif isinstance(getattr(x, "name", None), str):
            names.add(x.name)
    return names


def _substituted(s, value):
    """`s` with `value` computed where it names it (an operand field), or None where it names it elsewhere."""
    fields = OPERANDS.get(type(s))
    if fields is None:
        return None
    changes = {}
    for field in (fields,) if isinstance(fields, str) else fields:
        operand = getattr(s, field)
        if isinstance(operand, tuple):
            if value.name in operand:
                changes[field] = tuple(body.Computed(value) if a == value.name else a for a in operand)
        elif operand == value.name:
            changes[field] = body.Computed(value)
    return dataclasses.replace(s, **changes) if changes else None

