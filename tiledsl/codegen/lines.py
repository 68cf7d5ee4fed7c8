"""How a generated line is written: kernel expressions as Triton, lines wrapped inside their brackets
at WIDTH, comments broken at spaces. The statement printer (printer.py) and the module's templates
(render.py) both write their lines through these."""
from __future__ import annotations

import re

import sympy

from tiledsl.schedule.intcode import code

WIDTH = 110  # generated lines are wrapped to this (and never exceed about 120)


def kernel_code(expr, names: dict | None = None) -> str:
    return code(expr, kernel=True, names=names)


def plus(expr) -> str:
    """` + expr` in kernel code, nothing for 0: an offset added to a pointer."""
    expr = sympy.sympify(expr)
    return "" if expr == 0 else f" + {kernel_code(expr)}"


def always(expr) -> bool:
    return sympy.sympify(expr) is sympy.true


def wrap(line: str, width: int = WIDTH) -> str:
    """A long line broken inside its brackets: at the commas of the outermost bracket first, then at
    ` & `, ` + ` or ` - `, continuations aligned under the bracket they are in. Where a comma deep in
    the line leaves a continuation that cannot break again (`f(a + g(b, c) * d, e)`), the shallowest
    bracket's breaks go first instead."""
    lines = _wrap(line, width, commas_first=True)
    if max(map(len, lines.splitlines())) > width + 10:
        lines = _wrap(line, width, commas_first=False)
    return lines


def _wrap(line: str, width: int, commas_first: bool) -> str:
    if len(line) > width and _break_point(line, width, [], commas_first) is None:
        # an expression outside any bracket (a mask, a guard): bracket it so that it can break
        bare = re.match(r"(\s*(?:if |[\w.]+ = ))(.*?)(:?)$", line)
        if bare:
            line = f"{bare[1]}({bare[2]}){bare[3]}"
    out, rest, opens = [], line, []
    while len(rest) > width:
        cut = _break_point(rest, width, opens, commas_first)
        if cut is None:
            break
        keep, opens = cut
        out.append(rest[:keep].rstrip())
        rest = " " * (opens[-1] + 1) + rest[keep:].lstrip()
    return "\n".join(out + [rest])


def _break_point(line: str, width: int, opens: list[int],
                 commas_first: bool = True) -> tuple[int, list[int]] | None:
    """(where to cut, the brackets open there) for the best break before `width`: a comma before an
    operator, the shallowest bracket first, the furthest right within it. `opens` are the columns of
    the brackets still open from the lines before."""
    opens, best = list(opens), None
    quote, parameters = None, False
    for n, char in enumerate(line[:width + 1]):
        if quote:  # never break inside a string literal
            quote = None if char == quote else quote
            continue
        if line.startswith("lambda ", n):
            parameters = True  # nor between a lambda's parameters
        elif parameters:
            parameters = char != ":"
            continue
        if char in "'\"":
            quote = char
        elif char in "([":
            opens.append(n)
        elif char in ")]":
            if opens:
                opens.pop()
        elif opens:
            for kind, token in enumerate((", ", " & ", " + ", " - ")):
                if line.startswith(token, n):
                    keep = n + 1 if token == ", " else n
                    if keep > opens[-1] + 9:  # a break must leave something on the line
                        comma = min(kind, 1)
                        rank = (comma, len(opens), -keep) if commas_first else (len(opens), comma, -keep)
                        if best is None or rank < best[0]:
                            best = (rank, keep, list(opens))
    return None if best is None else best[1:]


def comment(text: str, indent: str = "") -> str:
    """A `# ...` comment, broken at spaces into lines of WIDTH."""
    words, lines = text.split(" "), [indent + "#"]
    for word in words:
        if len(lines[-1]) + 1 + len(word) > WIDTH and lines[-1].strip() != "#":
            lines.append(indent + "#  ")
        lines[-1] += " " + word
    return "\n".join(lines)
