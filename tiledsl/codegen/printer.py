"""Each plan statement prints itself as Triton: one printer per statement kind (body.py), registered here by
the class, and one function (`statements`) that walks a body with body.nested and prints each statement
at its depth. The kernel template calls `statements` for a family's head and body and holds no statement
of its own. A new kind of statement is its class in body.py and its printer here, side by side with
what it `needs` there; tests/codegen/test_printer.py checks that no class lacks one.

The printers live here rather than as methods of the statements: the statements are the plan's data
(they say what to do, in typed fields), and printing them needs the line helpers and the family's
names (lines.py, `renames`), which body.py must not import (the import graph keeps codegen's printing
above its lowering)."""
from __future__ import annotations

import re
from collections.abc import Callable

import sympy

from tiledsl.codegen import body
from tiledsl.codegen.inline import inlined
from tiledsl.codegen.interface import INSTANCE
from tiledsl.codegen.lines import WIDTH, always, comment, kernel_code, plus, wrap
from tiledsl.schedule import ir
from tiledsl.tables import DTYPES, FUNCTIONS

AXES = {1: ("tds_elems",), 2: ("tds_rows", "tds_cols")}  # a tile block's aranges, by its number of axes
COPY_AXES = ("tds_r", "tds_c")                             # a chunk copy's row and column offsets
FIRST, LAST = ir.index_symbol("tds_first"), ir.index_symbol("tds_last")  # a chunk's part: its rows


# ---- the walk --------------------------------------------------------------------------------------

PRINTERS: dict[type, Callable[..., list[str]]] = {}


def prints(kind: type):
    """Registers the printer of statements of `kind`: (statement, indent, family) -> its lines."""
    def register(printer):
        PRINTERS[kind] = printer
        return printer
    return register


def statements(items, indent: str, family) -> str:
    """The statements, one printer's lines after another, those a loop or an if holds indented under it;
    each line ends in a newline (the template's `{{ statements(...) -}}` adds none). A temporary read
    once is printed where it is read (inline.py)."""
    def lines_of(s, depth: int) -> list[str]:
        return PRINTERS[type(s)](s, indent + "    " * depth, family)
    lines = []
    for depth, s in body.nested(inlined(items, lines_of)):
        lines += lines_of(s, depth)
    return "".join(line + "\n" for line in lines)


# ---- names and slots -------------------------------------------------------------------------------

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


# ---- places and operands ---------------------------------------------------------------------------

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
    if isinstance(value, body.Computed):
        return value_of(value.statement)
    return value


def tensor_operand(value) -> str:
    """An operand a method is called on (`.to(...)`, a jit function's `x.to`): a scalar made a float32
    tensor first, since on the GPU's compiler a Python number has no `.to` (generated bodies, seeds 1354,
    1510 and 1762: `bf16(0.5)`); the interpreter gives the same value either way. A value computed in
    place is bracketed whole, the method then applying to all of it (`f32(f16(x))` printed the value's
    dataclass, a NameError at run)."""
    if isinstance(value, body.Scalar):
        return f"tl.cast({operand(value)}, tl.float32)"
    if isinstance(value, body.Computed):
        return f"({unbracketed(operand(value))})"
    return value


def dot_operand(value, like) -> str:
    """An operand of tl.dot, converted to the element type of tensor `like` where that is given."""
    return argument(value) if like is None else f"{operand(value)}.to({like}.dtype.element_ty)"


def expand(statement: body.Arange) -> str:
    if statement.rank < 2:
        return ""
    return "[:, None]" if statement.axis == 0 else "[None, :]"


# how tightly an operator binds, as Python parses it: an operand computed in place needs no brackets
# where it binds tighter, or as tightly on the left (`a * b + c`, `a + b - c`; never `a + (b + c)`,
# which rounds otherwise, nor a comparison in a comparison, which Python chains)
BINDS = {"mul": 3, "add": 2, "sub": 2, **dict.fromkeys(("lt", "le", "gt", "ge", "eq", "ne"), 1)}


def _argument(value, outer: str, position: int) -> str:
    """Argument `position` of function `outer`, computed in place without the brackets it does not need:
    an argument of a call, or an operand that binds tighter than the operator around it."""
    text = operand(value)
    if not isinstance(value, body.Computed):
        return text
    if re.search(r"[(,]\s*\{%d\}\s*[,)]" % position, FUNCTIONS[outer].triton):
        return unbracketed(text)
    inner = value.statement.function if isinstance(value.statement, body.Apply) else None
    if inner in BINDS and outer in BINDS and (
            BINDS[inner] > BINDS[outer] or BINDS[inner] == BINDS[outer] > 1 and position == 0):
        return unbracketed(text)
    return text


def argument(value) -> str:
    """An operand alone between a call's brackets and commas (or after `=`, `+=`): no brackets of its own."""
    return unbracketed(operand(value)) if isinstance(value, body.Computed) else operand(value)


def apply(statement: body.Apply) -> str:
    function = FUNCTIONS[statement.function]
    args = [_argument(a, statement.function, n) for n, a in enumerate(statement.args)]
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


# ---- the printers: values ----------------------------------------------------------------------------

def _k(exprs) -> str:
    return ", ".join(map(kernel_code, exprs))


def _join(items) -> str:
    return ", ".join(map(str, items))


@prints(body.Load)
def _load(s: body.Load, indent: str, family) -> list[str]:
    masked = mask(s.place)
    within = f", mask={masked}, other=0.0" if masked != "None" else ""
    return [wrap(f"{indent}{s.name} = tl.load({base(s.place)} + {offset(s.place)}{within})"
                 + ("" if s.native else ".to(tl.float32)"))]


@prints(body.DescLoad)
def _desc_load(s: body.DescLoad, indent: str, family) -> list[str]:
    reshape = f".reshape({_join(s.shape)})" if s.shape != s.block else ""
    return [wrap(f"{indent}{s.name} = {s.descriptor}.load([{_k(s.at)}]){reshape}"
                 + ("" if s.native else ".to(tl.float32)"))]


@prints(body.MakeDescriptor)
def _make_descriptor(s: body.MakeDescriptor, indent: str, family) -> list[str]:
    return [wrap(f"{indent}{s.name} = tl.make_tensor_descriptor({s.tensor}{plus(s.offset)}, [{_k(s.shape)}], "
                 f"[{_k(s.strides)}], [{_join(s.block)}])")]


@prints(body.Apply)
def _apply(s: body.Apply, indent: str, family) -> list[str]:
    return [wrap(indent + assignment(s))]


# fp8 and bf16 round through floatmath (the interpreter's own conversions round wrongly)
_ROUNDING = {"float8_e4m3fn": "tds_float.round_e4m3", "bfloat16": "tds_float.round_bf16"}


def _cast_value(s: body.Cast) -> str:
    arg = tensor_operand(s.arg)
    if s.dtype in _ROUNDING:
        return f"{_ROUNDING[s.dtype]}({argument(s.arg) if isinstance(s.arg, body.Computed) else arg})"
    if s.dtype == "float32":
        return f"{arg}.to(tl.float32)"
    return f"{arg}.to({cast(s.dtype)}).to(tl.float32)"


@prints(body.Cast)
def _cast(s: body.Cast, indent: str, family) -> list[str]:
    return [wrap(f"{indent}{s.name} = {_cast_value(s)}")]


@prints(body.Zeros)
def _zeros(s: body.Zeros, indent: str, family) -> list[str]:
    return [f"{indent}{s.name} = tl.zeros([{_join(s.blocks)}], tl.float32)"]


@prints(body.Accumulate)
def _accumulate(s: body.Accumulate, indent: str, family) -> list[str]:
    if s.op == "max":
        return [wrap(f"{indent}{s.name} = tl.maximum({s.name}, {argument(s.term)})")]
    return [wrap(f"{indent}{s.name} += {argument(s.term)}")]


@prints(body.Arange)
def _arange(s: body.Arange, indent: str, family) -> list[str]:
    return [f"{indent}{s.name} = tl.arange(0, {s.block}){expand(s)}"]


@prints(body.Assign)
def _assign(s: body.Assign, indent: str, family) -> list[str]:
    return [indent + assignment(s)]


@prints(body.Full)
def _full(s: body.Full, indent: str, family) -> list[str]:
    if isinstance(s.value, body.Scalar):
        return [f"{indent}{s.name} = tl.full([{_join(s.blocks)}], {operand(s.value)}, tl.float32)"]
    return [f"{indent}{s.name} = tl.zeros([{_join(s.blocks)}], tl.float32) + {operand(s.value)}"]


@prints(body.Trans)
def _trans(s: body.Trans, indent: str, family) -> list[str]:
    return [wrap(f"{indent}{s.name} = {_trans_value(s)}")]


def _trans_value(s: body.Trans) -> str:
    return f"tl.trans({argument(s.arg)})"


@prints(body.Dot)
def _dot(s: body.Dot, indent: str, family) -> list[str]:
    return [wrap(f"{indent}{s.name} = {_dot_value(s)}")]


def _dot_value(s: body.Dot) -> str:
    ieee = ', input_precision="ieee"' if s.ieee else ""
    return f"tl.dot({dot_operand(s.left, s.convert_left)}, {dot_operand(s.right, s.convert_right)}{ieee})"


@prints(body.Mask)
def _mask(s: body.Mask, indent: str, family) -> list[str]:
    return [wrap(f"{indent}{s.name} = {_mask_value(s)}")]


def _mask_value(s: body.Mask) -> str:
    return f"tl.where({s.along} < {kernel_code(s.bound)}, {argument(s.arg)}, {operand(body.Scalar(s.fill))})"


# the value of each statement inline.py may print where it is read
VALUES = {body.Apply: apply, body.Cast: _cast_value, body.Trans: _trans_value, body.Dot: _dot_value,
          body.Mask: _mask_value}


def value_of(statement) -> str:
    return VALUES[type(statement)](statement)


@prints(body.Product)
def _product(s: body.Product, indent: str, family) -> list[str]:
    at = f"{kernel_code(s.k_start)} + tds_k * {s.block_k}" if s.k_masked else f"tds_k * {s.block_k}"
    desc = f"tds_desc_{s.family}"
    lines = [f"{indent}{s.name} = tl.zeros([{s.block_m}, {s.block_n}], tl.float32)",
             f"{indent}for tds_k in range(0, tl.cdiv({kernel_code(s.k)}, {s.block_k})):"]
    if s.left_at:
        lines.append(wrap(f"{indent}    tds_a = {desc}_a.load([{_k(s.left_at)}, {kernel_code(s.row)}, {at}])"
                          f".reshape({s.block_m}, {s.block_k})"))
    else:
        lines.append(wrap(f"{indent}    tds_a = {desc}_a.load([{kernel_code(s.row)}, {at}])"))
    if s.k_masked:
        lines.append(f"{indent}    # a split of K: the block's columns past this split's range belong to the next "
                     "split")
        lines.append(wrap(f"{indent}    tds_a = tl.where((tds_k * {s.block_k} + tl.arange(0, {s.block_k}))[None, :] < "
                          f"{kernel_code(s.k)}, tds_a, tl.zeros_like(tds_a))"))
    if s.right_at:
        lines.append(wrap(f"{indent}    tds_b = {desc}_b.load([{_k(s.right_at)}, {at}, {kernel_code(s.col)}])"
                          f".reshape({s.block_k}, {s.block_n})"))
    else:
        lines.append(wrap(f"{indent}    tds_b = {desc}_b.load([{at}, {kernel_code(s.col)}])"))
    ieee = ', input_precision="ieee"' if s.ieee else ""
    return lines + [f"{indent}    {s.name} = tl.dot(tds_a, tds_b, {s.name}{ieee})"]


# ---- the printers: stores ----------------------------------------------------------------------------

@prints(body.Store)
def _store(s: body.Store, indent: str, family) -> list[str]:
    return [wrap(f"{indent}tl.store({base(s.place)} + {offset(s.place)}, {operand(s.value)}"
                 f".to({s.place.tensor}.dtype.element_ty), mask={mask(s.place)})")]


@prints(body.DescStore)
def _desc_store(s: body.DescStore, indent: str, family) -> list[str]:
    return [wrap(f"{indent}{s.descriptor}.store([{_k(s.at)}], {operand(s.value)}.reshape({_join(s.block)})"
                 f".to({s.tensor}.dtype.element_ty))")]


@prints(body.TmaStore)
def _tma_store(s: body.TmaStore, indent: str, family) -> list[str]:
    where = f"{kernel_code(s.row)}, {kernel_code(s.col)}"
    if not s.at:
        return [f"{indent}tds_desc_{s.family}_c.store([{where}], {s.value}.to({s.tensor}.dtype.element_ty))"]
    ones = ", ".join(["1"] * len(s.at))
    return [wrap(f"{indent}tds_desc_{s.family}_c.store([{_k(s.at)}, {where}], {s.value}.reshape({ones}, "
                 f"{s.block[0]}, {s.block[1]}).to({s.tensor}.dtype.element_ty))")]


@prints(body.Barrier)
def _barrier(s: body.Barrier, indent: str, family) -> list[str]:
    return [f"{indent}tl.debug_barrier()  # the next store may read back what this one wrote"]


# ---- the printers: control, waits and the timeline -------------------------------------------------

@prints(body.Loop)
def _loop(s: body.Loop, indent: str, family) -> list[str]:
    """The loop's header: its body follows one deeper (`statements`)."""
    extent = kernel_code(s.extent)
    if s.stages is not None:
        return [f"{indent}# each step waits first: not software-pipelined, which would load a step's blocks before "
                "its wait", wrap(f"{indent}for {s.var} in tl.range(0, {extent}, num_stages={s.stages}):")]
    if s.specialize:
        return [wrap(f"{indent}for {s.var} in tl.range(0, {extent}, warp_specialize=True):")]
    return [wrap(f"{indent}for {s.var} in range(0, {extent}):")]


@prints(body.If)
def _if(s: body.If, indent: str, family) -> list[str]:
    """The test: its body follows one deeper (`statements`)."""
    return [wrap(f"{indent}if {kernel_code(s.condition)}:")]


@prints(body.Wait)
def _wait(w: body.Wait, indent: str, family) -> list[str]:
    """The edge it waits for, then its guard and its loops around the call (a guard that reads a loop's
    variable inside them)."""
    lines = [comment(w.where, indent)]
    guarded = not always(w.exists)
    outside = guarded and not w.guard_in_loop
    if outside:
        lines.append(wrap(f"{indent}if {kernel_code(w.exists)}:"))
    for n, (var, extent) in enumerate(w.loops):
        lines.append(f"{indent}{'    ' * (outside + n)}for {var} in range(0, {kernel_code(extent)}):")
    inner = indent + "    " * (outside + len(w.loops))
    if guarded and w.guard_in_loop:
        lines.append(wrap(f"{inner}if {kernel_code(w.exists)}:"))
        inner += "    "
    return lines + [wait_call(w, family, inner)]


@prints(body.Fence)
def _fence(s: body.Fence, indent: str, family) -> list[str]:
    return [f"{indent}tds_sync.fence_async()  # the TMA loads below read what the waits acquired"]


@prints(body.Record)
def _record(s: body.Record, indent: str, family) -> list[str]:
    if s.point == body.STEP_WAIT_BEGINS:
        return [f"{indent}tds_wait_began = tds_timeline.wait_began(tds_TRACE)"]
    row = f"tds_trace_{family.name} + {slot_code(family.row * 4, family)}"
    call = f"wait_ended({row}, tds_wait_began)" if s.point == body.STEP_WAIT_ENDS else f"record({row}, {s.point})"
    return [f"{indent}if tds_TRACE:", f"{indent}    tds_timeline.{call}"]


# ---- the printers: chunks and device values ---------------------------------------------------------

def _part(rows, split: int, indent: str) -> list[str]:
    """A part of `split` of `rows` rows: tds_first .. tds_last."""
    if split == 1:
        return [f"{indent}tds_first, tds_last = 0, {kernel_code(rows)}"]
    return [f"{indent}tds_step = tl.cdiv({kernel_code(rows)}, {split})",
            f"{indent}tds_first = tl.minimum(tds_part * tds_step, {kernel_code(rows)})",
            f"{indent}tds_last = tl.minimum(tds_first + tds_step, {kernel_code(rows)})"]


@prints(body.Copy)
def _copy(s: body.Copy, indent: str, family) -> list[str]:
    lines = _part(s.rows, s.split, indent)
    inside = mask([s.source, s.target], COPY_AXES)
    lines.append(f"{indent}for tds_r0 in range(tds_first, tds_last, {s.block[0]}):")
    if s.cols is None:
        lines += [f"{indent}    tds_r = tds_r0 + tl.arange(0, {s.block[0]})",
                  wrap(f"{indent}    tds_inside = (tds_r < tds_last) & {inside}")]
        inner = indent + "    "
    else:
        lines += [f"{indent}    for tds_c0 in range(0, {kernel_code(s.cols)}, {s.block[1]}):",
                  f"{indent}        tds_r = tds_r0 + tl.arange(0, {s.block[0]})[:, None]",
                  f"{indent}        tds_c = tds_c0 + tl.arange(0, {s.block[1]})[None, :]",
                  wrap(f"{indent}        tds_inside = (tds_r < tds_last) & (tds_c < {kernel_code(s.cols)}) & {inside}")]
        inner = indent + "        "
    lines.append(wrap(f"{inner}tds_block = tl.load({base(s.source)} + {offset(s.source, COPY_AXES)}, mask=tds_inside)"))
    target = f"{base(s.target)} + {offset(s.target, COPY_AXES)}"
    if s.reduce:  # accumulations from several ranks commute (the checker lets them overlap) only if each add is atomic
        return lines + [wrap(f'{inner}tl.atomic_add({target}, tds_block, mask=tds_inside, sem="relaxed", scope="sys")')]
    return lines + [wrap(f"{inner}tl.store({target}, tds_block, mask=tds_inside)")]


def _rows_moved(s: body.Put | body.Get, indent: str) -> tuple[list[str], sympy.Expr, sympy.Expr]:
    """(the part's lines, its first row, its elements) of a put's or get's whole rows."""
    if s.split == 1:
        return [], sympy.Integer(0), s.rows * s.cols
    return _part(s.rows, s.split, indent), FIRST, (LAST - FIRST) * s.cols


@prints(body.Put)
def _put(s: body.Put, indent: str, family) -> list[str]:
    lines, first, count = _rows_moved(s, indent)
    # NVSHMEM addresses the target symmetrically: this rank's pointer names the owner's copy
    return lines + [wrap(
        f"{indent}tds_sync.put_signal({s.target}{plus(s.target_start + first * s.cols)}, "
        f"{base(s.source, s.source_owner)}{plus(s.source_start + first * s.cols)}, {kernel_code(count)}, "
        f"tds_sig_{s.family} + {slot_code(family.notify.slot, family)}, tds_epoch, {kernel_code(s.owner)}, "
        f"tds_shmem_{s.target}, tds_sigshmem_{s.family}, 1024)")]


@prints(body.Get)
def _get(s: body.Get, indent: str, family) -> list[str]:
    lines, first, count = _rows_moved(s, indent)
    # NVSHMEM addresses the source symmetrically: this rank's copy of it names the owner's
    return lines + [wrap(
        f"{indent}tds_sync.get({s.target}{plus(s.target_start + first * s.cols)}, "
        f"{s.source}{plus(s.source_start + first * s.cols)}, {kernel_code(count)}, {kernel_code(s.owner)}, "
        f"tds_shmem_{s.source}, rank, 1024)")]


@prints(body.Fetch)
def _fetch(s: body.Fetch, indent: str, family) -> list[str]:
    """A device value: one element, or one per row of the block (with the rows that have one)."""
    at = f"{base(s.place)} + {offset(s.place)}"
    if s.exists is not None:
        lines = [wrap(f"{indent}{s.exists} = {mask(s.place)}"),
                 wrap(f"{indent}{s.name} = tl.load({at}, mask={s.exists}, other=0)")]
    else:
        lines = [wrap(f"{indent}{s.name} = tl.load({at})")]
    if s.cap is not None:
        lines.append(wrap(f"{indent}{s.name} = tds_sync.capped({s.name}, {kernel_code(s.cap)}, tds_diag, rank, "
                          f"{s.site}, {offset(s.place)})"))
    return lines


@prints(body.Report)
def _report(s: body.Report, indent: str, family) -> list[str]:
    return [wrap(f"{indent}tds_sync.report(tds_diag, rank, {s.site}, {bad(s)}, {offset(s.element)}, "
                 f"{kernel_code(s.value)}, {kernel_code(s.bound)})")]


def _scan_ids(s: body.Scan, indent: str, start: str, stop: str, step: int) -> list[str]:
    """A step's `step` ids of the region, from `start` to `stop`."""
    lines = [f"{indent}for tds_s0 in range({start}, {stop}, {step}):",
             f"{indent}    tds_s = tds_s0 + tl.arange(0, {step})"]
    if s.cols is None:
        lines.append(f"{indent}    tds_r = tds_s")
    else:
        cols = kernel_code(s.cols)
        lines += [f"{indent}    tds_r = tds_s // {cols}", f"{indent}    tds_c = tds_s % {cols}"]
    return lines + [f"{indent}    tds_inside = tds_s < {stop}",
                    wrap(f"{indent}    tds_id = tl.load({base(s.source)} + {offset(s.source, COPY_AXES)}, "
                         "mask=tds_inside, other=0)")]


@prints(body.Scan)
def _scan(s: body.Scan, indent: str, family) -> list[str]:
    """histogram() and arrival() of a region of ids, a tl.histogram per step into the pass's groups. An
    arrival numbers `step` ids at a time: an id's number is the count of its group before the step
    (gathered from the running histogram) plus the ids equal to it earlier in the step (a [step, step]
    comparison), so a step's work does not grow with the groups."""
    bins, groups = kernel_code(s.bins), s.groups
    outside = wrap(f"{indent}        tds_sync.report(tds_diag, rank, {s.site}, tds_inside & ((tds_id < 0) | "
                   f"(tds_id >= {bins})), {offset(s.source, COPY_AXES)}, tds_id, {bins})")
    lines = [f"{indent}for tds_g0 in range(0, {bins}, {groups}):",
             f"{indent}    tds_seen = tl.zeros([{groups}], tl.int32)"]
    if s.histogram is not None:  # the groups' ids, where the histogram is stored
        lines.append(f"{indent}    tds_g = tds_g0 + tl.arange(0, {groups})")
    if s.arrival is None or s.first is not None:  # ids only counted
        counted = kernel_code(s.count if s.arrival is None else s.first)
        lines += _scan_ids(s, indent + "    ", "0", counted, s.count_step)
        lines += [outside] if s.arrival is None else []
        lines += [f"{indent}        tds_ours = tds_inside & (tds_id >= tds_g0) & (tds_id < tds_g0 + {groups})",
                  f"{indent}        tds_seen += tl.histogram(tds_id - tds_g0, {groups}, mask=tds_ours)"]
    if s.arrival is not None:
        start = "0" if s.first is None else kernel_code(s.first)
        lines += _scan_ids(s, indent + "    ", start, kernel_code(s.count if s.stop is None else s.stop), s.step)
        lines += [outside,
                  f"{indent}        tds_mine = tds_inside & (tds_id >= tds_g0) & (tds_id < tds_g0 + {groups})",
                  f"{indent}        tds_earlier = (tds_id[:, None] == tds_id[None, :]) & tds_inside[None, :] & \\",
                  f"{indent}            (tl.arange(0, {s.step})[None, :] < tl.arange(0, {s.step})[:, None])",
                  f"{indent}        tds_base = tl.gather(tds_seen, tl.where(tds_mine, tds_id - tds_g0, 0), 0)",
                  wrap(f"{indent}        tl.store({base(s.arrival)} + {offset(s.arrival, COPY_AXES)}, "
                       "tds_base + tl.sum(tds_earlier.to(tl.int32), axis=1), mask=tds_mine)"),
                  f"{indent}        tds_seen += tl.histogram(tds_id - tds_g0, {groups}, mask=tds_mine)"]
    if s.histogram is not None:
        names = ["tds_g"]
        if s.cap is not None:
            lines.append(wrap(f"{indent}    tds_sync.report(tds_diag, rank, {s.cap_site}, (tds_seen > "
                              f"{kernel_code(s.cap)}) & (tds_g < {bins}), {offset(s.histogram, names)}, tds_seen, "
                              f"{kernel_code(s.cap)})"))
        lines.append(wrap(f"{indent}    tl.store({base(s.histogram)} + {offset(s.histogram, names)}, tds_seen, "
                          f"mask={mask(s.histogram, names)})"))
    return lines
