"""The parser: .tds text to the frozen syntax tree of `tiledsl.grammar.ast`, or a TdsError whose
diagnostics name the mistake (a named message for the common ones, never a raw token dump: those
and the input limits are in `refusals.py`)."""
from __future__ import annotations

import keyword
from pathlib import Path

import lark
from lark import Token, Transformer, v_args

from tiledsl.diagnostics import TdsError, error
from tiledsl.grammar import ast
from tiledsl.grammar.refusals import (  # the limits are part of the parser's interface: see __all__
    MAX_NAME, MAX_NESTING, MAX_OPERATORS, MAX_SOURCE_BYTES, MAX_TOKENS, _decode, _lark,
    _refuse_control_characters, _refuse_oversized, _syntax_error)


def parse_file(path: str | Path) -> ast.Program:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TdsError([error(f"cannot read file: {exc.strerror}", ast.Span.none())], str(path)) from None
    return parse(data, str(path))


def parse(source: str | bytes, path: str = "<tds>") -> ast.Program:
    """Parse .tds text (str, or bytes that must be UTF-8) into a Program; raise TdsError on any mistake."""
    if not path.isprintable():
        # the path is written into generated code and diagnostics: a newline there could start a statement
        shown = path.encode("unicode_escape").decode("ascii")
        raise TdsError([error("the file name contains a control character (a newline, a tab, ...)",
                              ast.Span.none())], shown)
    text = _decode(source, path)
    _refuse_control_characters(text, path)
    _refuse_oversized(text, path)
    try:
        tree = _lark().parse(text)
    except lark.exceptions.UnexpectedInput as exc:
        raise TdsError([_syntax_error(exc, text)], path, text) from None
    except TdsError as exc:  # the postlexer's: an indentation that matches no block
        raise TdsError(exc.diagnostics, path, text) from None
    builder = _Builder(path, text)
    try:
        program = builder.transform(tree)
    except lark.exceptions.VisitError as exc:
        if isinstance(exc.orig_exc, TdsError):
            raise TdsError(exc.orig_exc.diagnostics, path, text) from None
        raise
    return program


def _span(meta) -> ast.Span:
    if getattr(meta, "empty", True):
        return ast.Span.none()
    return ast.Span(meta.line, meta.column, meta.end_line, meta.end_column)


def _tok_span(token: Token) -> ast.Span:
    return ast.Span(token.line, token.column, token.end_line, token.end_column)


# built-in names of the language, and the Python built-ins that generated code calls
RESERVED = {"rank", "world", "node", "nodes", "local_rank", "local_world", "rest", "every", "sum", "cdiv", "min", "max",
            "range", "sorted", "wait", "inf", "float"}


def identifier_problem(name: str) -> str | None:
    """Why a name cannot be bound (it ends up in generated Python), or None."""
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return f"'{name}' is a Python keyword and cannot name anything here"
    if name.startswith("__") or name.lower().startswith("tds_"):
        return f"'{name}' is reserved (names may not start with '__' or 'tds_')"
    if name in {"tl", "triton", "torch"}:
        return f"'{name}' is reserved for the generated code"
    return None


def check_identifier(token: Token) -> None:
    """Names end up in generated Python: refuse what Python or Triton would read otherwise."""
    problem = identifier_problem(str(token))
    if problem is not None:
        raise TdsError([error(problem, _tok_span(token))])


@v_args(meta=True)
class _Builder(Transformer):
    """Builds AST nodes from the parse tree, and nothing else."""

    def __init__(self, path: str, source: str):
        super().__init__()
        self.path = path
        self.source = source

    def NAME(self, token):  # noqa: N802 - lark calls terminal callbacks by terminal name
        if len(token) > MAX_NAME:
            raise TdsError([error(f"name '{token[:20]}...' is longer than {MAX_NAME} characters",
                                  ast.Span(token.line, token.column, token.line, token.column + 20))])
        return token

    def _name(self, token: Token, declared: bool = False) -> ast.Name:
        if declared:
            check_identifier(token)
            if str(token) in RESERVED:
                raise TdsError([error(f"'{token}' is a built-in name and cannot be declared",
                                      _tok_span(token))])
        return ast.Name(str(token), _tok_span(token))

    # program
    def start(self, meta, children):
        header, *decls = children
        return ast.Program(header, tuple(decls), self.path, self.source, _span(meta))

    def header(self, meta, children):
        return self._name(children[0], declared=True)

    # sizes
    def param_decl(self, meta, names):
        return ast.ParamDecl(tuple(self._name(n, True) for n in names), _span(meta))

    def const_decl(self, meta, items):
        return items[0] if len(items) == 1 else _Many(items)

    def const_item(self, meta, children):
        return ast.ConstDecl(self._name(children[0], True), children[1], _span(meta))

    def tune_decl(self, meta, children):
        return ast.TuneDecl(self._name(children[0], True), tuple(children[1:]), _span(meta))

    def let_decl(self, meta, children):
        return ast.LetDecl(self._name(children[0], True), children[1], _span(meta))

    def require_decl(self, meta, children):
        return ast.RequireDecl(children[0], str(children[1]), children[2], _span(meta))

    # tensors
    def tensor_decl(self, meta, children):
        role, name, dtype, *shape, cap, upto = children
        return ast.TensorDecl(role, self._name(name, True), self._name(dtype), tuple(shape), _span(meta),
                              cap.value if cap else None, upto.value if upto else None)

    def cap(self, meta, children):
        return _Suffix(children[0])

    def upto(self, meta, children):
        return _Suffix(self._name(children[0]))

    def role_in(self, meta, _):
        return "in"

    def role_out(self, meta, _):
        return "out"

    def role_inout(self, meta, _):
        return "inout"

    def role_symm(self, meta, _):
        return "symm"

    def role_local(self, meta, _):
        return "local"

    # families
    def chunk_decl(self, meta, children):
        name, indices, engine, split, guard, source, target, reduce = children
        return ast.ChunkDecl(self._name(name, True), indices or (), engine, split, source, target, reduce,
                             _span(meta), guard)

    def tile_decl(self, meta, children):
        name, indices, engine, guard, *body = children
        if len(body) == 1 and isinstance(body[0], _Block):
            body = body[0].statements
        return ast.TileDecl(self._name(name, True), indices or (), engine, tuple(body), _span(meta), guard)

    def guard(self, meta, children):
        return ast.Guard(children[0], str(children[1]), children[2], _span(meta))

    def instances(self, meta, children):
        return children[0]

    def block(self, meta, statements):
        return _Block(tuple(statements))

    def for_stmt(self, meta, children):
        var, extent, block = children
        return ast.For(self._name(var, True), extent, block.statements, _span(meta))

    def wait_stmt(self, meta, deps):
        return ast.Wait(tuple(deps), _span(meta))

    def index_list(self, meta, children):
        return tuple(children)

    def index_var(self, meta, children):
        return ast.IndexVar(self._name(children[0], True), children[1], _span(meta))

    def engine(self, meta, children):
        return ast.Engine(self._name(children[0]), children[1], _span(meta))

    def split(self, meta, children):
        return children[0]

    def reduce(self, meta, children):
        return self._name(children[0])

    def assign(self, meta, children):
        return ast.Assign(children[0], children[1], _span(meta))

    # edges, order, placement
    def consumer(self, meta, children):
        return children[0]  # a NAME, or a statement word's token: the family's name either way

    def edge_decl(self, meta, children):
        consumer, bound, *deps = children
        return ast.EdgeDecl(self._name(consumer), bound or (), tuple(deps), _span(meta))

    def bound(self, meta, children):
        return tuple(self._name(t, True) for t in children)

    def dep(self, meta, children):
        family, index, ranks = children
        return ast.Dep(self._name(family), index or (), ranks.value if ranks else None, _span(meta))

    def dep_indices(self, meta, children):
        return tuple(children)

    def all_instances(self, meta, _):
        return ast.AllInstances(_span(meta))

    def every_rank(self, meta, children):
        return _Ranks(ast.EveryRank(_span(meta)))

    def at_rank(self, meta, children):
        return _Ranks(children[-1])

    def ranks_for(self, meta, children):
        rank, var, extent = children[-3:]
        return _Ranks(ast.RanksFor(rank, self._name(var, True), extent, _span(meta)))

    def order_decl(self, meta, children):
        return ast.OrderDecl(self._name(children[0]), tuple(children[1:]), _span(meta))

    def place_decl(self, meta, children):
        return ast.PlaceDecl(self._name(children[0]), children[1], _span(meta))

    # expressions
    def _binop(self, op, meta, children):
        return ast.BinOp(op, children[0], children[-1], _span(meta))

    def add(self, meta, children):
        return self._binop("+", meta, children)

    def sub(self, meta, children):
        return self._binop("-", meta, children)

    def mul(self, meta, children):
        return self._binop("*", meta, children)

    def div(self, meta, children):
        return self._binop("/", meta, children)

    def mod(self, meta, children):
        return self._binop("mod", meta, children)

    def matmul(self, meta, children):
        return self._binop("@", meta, children)

    def neg(self, meta, children):
        return ast.Neg(children[0], _span(meta))

    def number(self, meta, children):
        text = str(children[0])
        try:
            value = float(text) if any(c in text for c in ".eE") else int(text)
        except ValueError:  # more digits than int() accepts
            value = float("inf")
        # sizes are 64-bit integers; a value (a tile's -1e30) may be any finite float
        if isinstance(value, int) and not -2**63 <= value < 2**63 or value in (float("inf"), -float("inf")):
            raise TdsError([error(f"number {text[:20]}{'...' if len(text) > 20 else ''} is too large "
                                  "(numbers fit in 64 bits)", _span(meta))])
        return ast.Num(value, _span(meta))

    def name(self, meta, children):
        return self._name(children[0])

    def call(self, meta, children):
        func, *args = children
        return ast.Call(str(func), tuple(a for a in args if a is not None), _span(meta))

    def rank_sum(self, meta, children):
        body, var, extent = children
        return ast.RankSum(body, self._name(var, True), extent, _span(meta))

    def reduction(self, meta, children):
        func, body, var, extent = children
        if str(func) not in REDUCTIONS:
            raise TdsError([error(f"'{func}(... for ...)' is no reduction; reductions: {', '.join(REDUCTIONS)}",
                                  _tok_span(func))])
        return ast.RankSum(body, self._name(var, True), extent, _span(meta), op=str(func))

    def compare(self, meta, children):
        return ast.Compare(str(children[1]), children[0], children[2], _span(meta))

    def transpose(self, meta, children):
        return ast.Transpose(children[0], _span(meta))

    def subscript(self, meta, children):
        return ast.Subscript(children[0], tuple(children[1:]), _span(meta))

    def peer(self, meta, children):
        return ast.Peer(children[0], children[-1], _span(meta))

    def index(self, meta, children):
        return ast.Index(children[0], _span(meta))

    def span(self, meta, children):
        return ast.Range(children[0], children[1], None, _span(meta))

    def sized(self, meta, children):
        return ast.Range(children[0], None, children[1], _span(meta))

    def full(self, meta, _):
        return ast.Range(None, None, None, _span(meta))

    def __default__(self, data, children, meta):
        raise TdsError([error(f"internal: no builder for rule {data}", _span(meta))])

    def transform(self, tree):
        program = super().transform(tree)
        decls = []
        for decl in program.decls:
            decls.extend(decl.items if isinstance(decl, _Many) else [decl])
        return ast.Program(program.name, tuple(decls), program.path, program.source, program.span)


REDUCTIONS = ("sum", "max")


class _Block:
    """An indented block's statements, flattened into the tile or loop that owns it."""

    def __init__(self, statements):
        self.statements = statements


class _Many:
    """`const BM = 128, BN = 256` declares several constants; flattened after the transform."""

    def __init__(self, items):
        self.items = items


class _Ranks:
    def __init__(self, value):
        self.value = value


class _Suffix:
    """A tensor declaration's optional `cap C` or `upto count`, told apart from its shape."""

    def __init__(self, value):
        self.value = value


__all__ = ["parse", "parse_file", "TdsError", "RESERVED", "check_identifier", "MAX_NAME", "MAX_NESTING",
           "MAX_OPERATORS", "MAX_SOURCE_BYTES", "MAX_TOKENS"]
