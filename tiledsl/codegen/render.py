"""Rendering: a kernel plan becomes one Python module (Triton kernels and host launcher) through the
Jinja templates beside this file. Every decision is already in the plan; the templates and the few
printing filters here turn its expressions and records into text, and decide nothing."""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import jinja2
import sympy

from tiledsl.codegen import body
from tiledsl.codegen.interface import EPOCH, Kind, signal_dtype, walk
from tiledsl.codegen.plan import INSTANCE, KernelPlan
from tiledsl.schedule import ir
from tiledsl.schedule.intcode import code
from tiledsl.tables import DTYPES, FUNCTIONS

WIDTH = 110  # generated lines are wrapped to this (and never exceed about 120)
AXES = {1: ("tds_elems",), 2: ("tds_rows", "tds_cols")}  # a tile block's aranges, by its number of axes
COPY_AXES = ("tds_r", "tds_c")                             # a chunk copy's row and column offsets


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    # repr() quotes every user-derived string, so a path or message can never become code
    env.filters.update(pyrepr=repr, k=kernel_code, h=host_code, wrap=wrap, operand=operand, apply=apply,
                       tensor_operand=tensor_operand, assignment=assignment, dot_operand=dot_operand, expand=expand, string_float=lambda x: operand(body.Scalar(x)),
                       offset=offset, mask=mask, base=base, cast=cast, params=params, args=call_args,
                       always=always, plus=plus, slot=slot_code, comment=comment, string=string, bad=bad,
                       wait_call=wait_call, tuple_of=tuple_of, params_of=params_of,
                       comprehension=comprehension)
    env.globals["device_descriptors"] = lambda plan: any(  # TMA descriptors made on the device
        isinstance(s, body.MakeDescriptor) for f in plan.kernel_families for s in walk(f.head + f.body))
    env.globals.update(isinstance=isinstance, body=body, Kind=Kind, EPOCH=EPOCH, INSTANCE=INSTANCE,
                       signal_dtype=signal_dtype, FIRST=ir.index_symbol("tds_first"), LAST=ir.index_symbol("tds_last"))
    return env


def render(plan: KernelPlan) -> str:
    """The text of the generated module for `plan`."""
    text = _environment().get_template("module.py.jinja").render(plan=plan, copy_axes=COPY_AXES, axes_of=axes_of,
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

def kernel_code(expr, names: dict | None = None) -> str:
    return code(expr, kernel=True, names=names)


def host_code(expr, names: dict | None = None) -> str:
    """Host code, which rounds up with `tds_int.cdiv` as the kernel does with `tl.cdiv`."""
    return code(expr, kernel=False, names=names, cdiv="tds_int.cdiv")


def plus(expr) -> str:
    """` + expr` in kernel code, nothing for 0: an offset added to a pointer."""
    expr = sympy.sympify(expr)
    return "" if expr == 0 else f" + {kernel_code(expr)}"


def tuple_of(items: list[str]) -> str:
    """A Python tuple of these expressions: `()`, `(a,)` or `(a, b)`."""
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def comprehension(loops) -> str:
    """A host list comprehension's loops: ` for v in range(n)` for each (variable, extent), outermost first."""
    return "".join(f" for {var} in range({host_code(extent)})" for var, extent in loops)


def params_of(names: list) -> str:
    """A lambda's parameters after `lambda`: ` i, j`, or nothing (a family without indices)."""
    return " " + ", ".join(map(str, names)) if names else ""


def always(expr) -> bool:
    return sympy.sympify(expr) is sympy.true


def renames(family) -> dict[str, str]:
    """A family with one index and one part: its index is its instance number, named as the index."""
    if len(family.indices) == 1 and family.split == 1:
        return {INSTANCE.name: family.indices[0][0].name}
    return {}


def slot_code(expr, family) -> str:
    return kernel_code(expr, renames(family))


SPAN_BLOCK = 4096  # slots a ranged wait reads at once: every pack tile of ag_group_gemm at DeepSeek-MoE in one read


def wait_call(wait: body.Wait, family, indent: str) -> str:
    """The wait on a slot, its diagnostics within three lines of the call: a slot too long for that goes
    on a line of its own first."""
    # a slot NVSHMEM writes: its own wait follows; a split producer's parts: all read at once
    helper = ("wait_parts" if wait.parts > 1 else "wait") + ("_shmem" if wait.shmem else "")
    if helper == "wait" and wait.inline:
        helper = "wait_inline"
    parts = f", PARTS={wait.parts}, BLOCK={1 << (wait.parts - 1).bit_length()}" if wait.parts > 1 else ""
    count = ""
    if wait.span is not None:  # slots a stride apart, a runtime count of them, read SPAN_BLOCK at a time
        helper, parts = "wait_span", f", BLOCK={SPAN_BLOCK}"
        count = f"{slot_code(wait.span, family)}, {slot_code(wait.stride, family)}, "

    def call(slot: str) -> str:
        return wrap(f"{indent}tds_sync.{helper}(tds_sig_{wait.producer} + {slot}, {count}tds_epoch, diag=tds_diag, "
                    f"max_spins=tds_max_spins, rank=rank, edge={wait.edge}, instance={slot_code(INSTANCE, family)}"
                    f"{parts})")
    slot = slot_code(wait.slot, family)
    text = call(slot)
    if "diag=tds_diag" in "\n".join(text.splitlines()[:3]):
        return text
    bound = wrap(f"{indent}tds_waited = {slot}") + "\n" + call("tds_waited")
    # a slot that wraps only inside its own brackets (hier_allreduce's) stays in the call, where it fits
    return bound if all(len(line) <= WIDTH for line in bound.splitlines()) else text


# ---- blocks --------------------------------------------------------------------------------------------

def axes_of(family) -> list[tuple[str, str]]:
    """(name, arange) of the block axes a tile's loads and stores use: hoisted out of the instance loop."""
    places = [s.place for s in walk(family.body) if isinstance(s, (body.Load, body.Store)) and s.place.names is None]
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


def offset(place: body.Place, axis_names=None) -> str:
    """The element offset of a place's block from its base, dimension by dimension: the start (plus
    the block's arange along its axis) times the stride."""
    axis_names = axis_names or (place.names if place.names is not None else AXES.get(place.axes, ()))
    terms = []
    for dim in place.dims:
        if dim.axis is None:
            term = kernel_code(dim.start * dim.stride)
        else:
            index = _index(dim, axis_names)
            term = index if dim.stride == 1 else f"({index}) * {kernel_code(dim.stride)}" if dim.start != 0 \
                else f"{index} * {kernel_code(dim.stride)}"
        if term != "0":
            terms.append(term)
    return " + ".join(terms) or "0"


def mask(places, axis_names=None) -> str:
    """Which elements of the block exist: inside the tensor(s), and inside the region where the block is
    larger than it."""
    places = places if isinstance(places, (list, tuple)) else [places]
    axis_names = axis_names or (places[0].names if places[0].names is not None else AXES.get(places[0].axes, ()))
    parts = []
    for dim in (d for place in places for d in place.dims):
        if dim.axis is None:
            continue
        if dim.clip is not None:
            parts.append(f"({axis_names[dim.axis]} < {kernel_code(dim.clip)})")
        parts.append(f"({_index(dim, axis_names)} < {kernel_code(dim.bound)})")
    for place in places:  # a gathered row whose index is missing or out of range is no row
        parts += [kernel_code(c) if isinstance(c, sympy.Symbol) else f"({kernel_code(c)})" for c in place.valid]
    return " & ".join(dict.fromkeys(parts)) if parts else "None"


def _index(dim: body.Dim, axis_names) -> str:
    along = axis_names[dim.axis]
    return along if dim.start == 0 else f"{kernel_code(dim.start)} + {along}"


def base(place_or_tensor, owner=None) -> str:
    """The tensor, or its copy on `owner` (this rank's pointer plus the owner's offset)."""
    if isinstance(place_or_tensor, body.Place):
        place_or_tensor, owner = place_or_tensor.tensor, place_or_tensor.owner
    if owner is None:
        return place_or_tensor
    return f"{place_or_tensor} + tl.load(tds_peers_{place_or_tensor} + {kernel_code(owner)})"


def bad(report: body.Report) -> str:
    """Where a report's condition holds, within its place's mask."""
    text = f"({kernel_code(report.bad)})"
    if report.within is not None and mask(report.within) != "None":
        text += f" & {mask(report.within)}"
    return text


def operand(value) -> str:
    if isinstance(value, body.Scalar):
        literal = isinstance(value.value, sympy.Basic) and value.value.is_Number and not value.integer
        if isinstance(value.value, (int, float)) or literal:  # a number, `448` as much as `448.0`: a float
            number = float(value.value)
            return f'float("{number}")' if number in (float("inf"), float("-inf")) else repr(number)
        if value.integer:
            text = kernel_code(value.value)
            return text if re.fullmatch(r"\w+", text) else f"({text})"  # `0`, `P`: bracketed, an expression
        return f"({kernel_code(value.value)}).to(tl.float32)"
    return value


def tensor_operand(value) -> str:
    """An operand a method is called on (`.to(...)`, a jit function's `x.to`): a scalar made a float32
    tensor first, since on the GPU's compiler a Python number has no `.to` (generated bodies, seeds 1354,
    1510 and 1762: `bf16(0.5)`); the interpreter gives the same value either way."""
    return f"tl.cast({operand(value)}, tl.float32)" if isinstance(value, body.Scalar) else value


def dot_operand(value, like) -> str:
    """An operand of tl.dot, converted to the element type of tensor `like` where that is given."""
    text = operand(value)
    return text if like is None else f"{text}.to({like}.dtype.element_ty)"


def expand(statement: body.Arange) -> str:
    if statement.rank < 2:
        return ""
    return "[:, None]" if statement.axis == 0 else "[None, :]"


def apply(statement: body.Apply) -> str:
    function = FUNCTIONS[statement.function]
    args = [operand(a) for a in statement.args]
    args += list(function.defaults[len(args) - function.arity[1]:]) if len(args) < function.arity[1] else []
    row = kernel_code(statement.row) if statement.row is not None else None
    return function.triton.format(*args, row=row)


def assignment(statement: body.Apply | body.Assign) -> str:
    """`name = value` as a person writes it: without the brackets an operator's value has for nesting,
    and `acc += x` where the value adds to the name itself."""
    if isinstance(statement, body.Assign):
        return f"{statement.name} = {unbracketed(operand(statement.value))}"
    function = FUNCTIONS[statement.function]
    if function.name == "add" and statement.args[0] == statement.name:
        return f"{statement.name} += {unbracketed(operand(statement.args[1]))}"
    return f"{statement.name} = {unbracketed(apply(statement))}"


def unbracketed(text: str) -> str:
    """`text` less one pair of brackets around all of it (`(a + b)`, not `(a) + (b)`)."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for n, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and n < len(text) - 1:
            return text
    return text[1:-1]


def cast(dtype: str) -> str:
    return DTYPES[dtype].triton


# ---- argument lists ------------------------------------------------------------------------------------

def params(names, interface) -> str:
    """A signature's parameters: constexprs marked as such."""
    constexpr = {a.name for a in interface.args if a.constexpr}
    return ", ".join(f"{n}: tl.constexpr" if n in constexpr else n for n in names)


def call_args(names) -> str:
    return ", ".join(names)


# ---- lines ---------------------------------------------------------------------------------------------

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

