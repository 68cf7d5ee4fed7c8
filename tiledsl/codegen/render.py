"""Rendering: a kernel plan becomes one Python module (Triton kernels and host launcher) through the
Jinja templates beside this file. Every decision is already in the plan; the templates, the statement
printer (printer.py) and the few printing filters here turn its expressions and records into text,
and decide nothing."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import jinja2

from tiledsl.codegen import body, printer
from tiledsl.codegen.interface import signal_dtype
from tiledsl.codegen.lines import WIDTH, always, comment, kernel_code, wrap
from tiledsl.codegen.plan import KernelPlan
from tiledsl.codegen.printer import AXES, renames, slot_code
from tiledsl.schedule import ir
from tiledsl.schedule.intcode import code


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    # repr() quotes every user-derived string, so a path or message can never become code
    env.filters.update(pyrepr=repr, k=kernel_code, h=host_code, wrap=wrap, params=params, args=call_args,
                       always=always, slot=slot_code, comment=comment, string=string, tuple_of=tuple_of,
                       params_of=params_of, comprehension=comprehension)
    env.globals["device_descriptors"] = lambda plan: any(  # TMA descriptors made on the device
        isinstance(s, body.MakeDescriptor) for f in plan.kernel_families for s in body.walk(f.head + f.body))
    env.globals["statements"] = printer.statements
    env.globals["signal_dtype"] = signal_dtype
    return env


def render(plan: KernelPlan) -> str:
    """The text of the generated module for `plan`."""
    text = _environment().get_template("module.py.jinja").render(plan=plan, axes_of=axes_of,
                                                                  renames=renames, unpack=unpack(plan))
    return without_unread_names("\n".join(line.rstrip() for line in text.splitlines()) + "\n")


def without_unread_names(text: str) -> str:
    """The module less each host function's names it never reads: every host function starts by naming
    the sizes (`unpack`) and the consts, and keeps only those its own lines use, as a kernel family
    takes only what it reads. Only a plain `name = value` of names, numbers and arithmetic is dropped;
    removing one can leave another unread (a rank's node reads `local_world`), so until none is left."""
    while True:
        lines = text.splitlines(keepends=True)
        drop: set[int] = set()
        for function in ast.parse(text).body:
            if not isinstance(function, ast.FunctionDef) or function.decorator_list:
                continue  # kernels and their families are printed from what they read already
            read = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            for statement in function.body:
                if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                        and isinstance(statement.targets[0], ast.Name) and statement.targets[0].id not in read \
                        and all(isinstance(n, _PURE) for n in ast.walk(statement.value)):
                    drop.update(range(statement.lineno - 1, statement.end_lineno))
        if not drop:
            return text
        text = "".join(line for n, line in enumerate(lines) if n not in drop)


# what a dropped assignment's value may be made of: names, numbers, `tds_env['N']` and arithmetic
_PURE = (ast.Name, ast.Constant, ast.Subscript, ast.BinOp, ast.UnaryOp, ast.Load, ast.operator, ast.unaryop)


# ---- expressions -------------------------------------------------------------------------------------

def host_code(expr, names: dict | None = None) -> str:
    """Host code, which rounds up with `tds_int.cdiv` as the kernel does with `tl.cdiv`."""
    return code(expr, kernel=False, names=names, cdiv="tds_int.cdiv")


def tuple_of(items: list[str]) -> str:
    """A Python tuple of these expressions: `()`, `(a,)` or `(a, b)`."""
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def comprehension(loops) -> str:
    """A host list comprehension's loops: ` for v in range(n)` for each (variable, extent), outermost first."""
    return "".join(f" for {var} in range({host_code(extent)})" for var, extent in loops)


def params_of(names: list) -> str:
    """A lambda's parameters after `lambda`: ` i, j`, or nothing (a family without indices)."""
    return " " + ", ".join(map(str, names)) if names else ""


# ---- blocks --------------------------------------------------------------------------------------------

def axes_of(family) -> list[tuple[str, str]]:
    """(name, arange) of the block axes a tile's loads and stores use: hoisted out of the instance loop."""
    places = [s.place for s in body.walk(family.body)
              if isinstance(s, (body.Load, body.Store)) and s.place.names is None]
    if not places:
        return []
    count = places[0].axes
    out = []
    if not count:  # a tile of one element: no axis
        return out
    for n, name in enumerate(AXES[count]):
        blocks = {d.block for p in places for d in p.dims if d.axis == n}
        if not blocks:  # no load or store runs along it (a product's epilogue reads a bias row only)
            continue
        (block,) = blocks
        expand = "" if count == 1 else ("[:, None]" if n == 0 else "[None, :]")
        out.append((name, f"tl.arange(0, {block}){expand}"))
    return out


# ---- argument lists ------------------------------------------------------------------------------------

def params(names, interface) -> str:
    """A signature's parameters: constexprs marked as such."""
    constexpr = {a.name for a in interface.args if a.constexpr}
    return ", ".join(f"{n}: tl.constexpr" if n in constexpr else n for n in names)


def call_args(names) -> str:
    return ", ".join(names)


# ---- lines ---------------------------------------------------------------------------------------------

def string(text: str, indent: int) -> str:
    """A string literal, as adjacent literals on lines of WIDTH where it is long."""
    pieces, current = [], ""
    for word in text.split(" "):
        candidate = f"{current} {word}" if current else word
        if current and len(repr(candidate)) + indent > WIDTH:
            pieces.append(current + " ")
            current = word
        else:
            current = candidate
    pieces.append(current)
    return ("\n" + " " * indent).join(repr(p) for p in pieces)


def unpack(plan: KernelPlan) -> str:
    """Host functions' first lines: the sizes as local names, and the rank's node and place in it as
    the IR defines them."""
    topology = ["nodes", "local_world"] if plan.spans_nodes else []
    names = list(plan.params) + ["rank", "world"] + topology + list(plan.consts)
    lines = [f"    {n} = tds_env[{n!r}]" for n in names]
    if plan.spans_nodes:
        lines += [f"    {symbol} = {host_code(value)}" for symbol, value in ir.RANK_PARTS.items()]
    return "\n".join(lines)

