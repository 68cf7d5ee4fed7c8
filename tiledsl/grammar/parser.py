"""The parser: .tds text to the frozen syntax tree of `tiledsl.grammar.ast`, or a TdsError whose
diagnostics name the mistake (a named message for the common ones, never a raw token dump)."""
from __future__ import annotations

import difflib
import functools
import keyword
from pathlib import Path

import lark
from lark import Lark, Token, Transformer, v_args

from tiledsl.diagnostics import Diagnostic, TdsError, error
from tiledsl.grammar import ast

MAX_SOURCE_BYTES = 16 * 1024 * 1024
MAX_NESTING = 64  # brackets and operators deeper than this are refused before they reach recursion

STATEMENTS = ("program", "param", "const", "tune", "let", "in", "out", "inout", "symm", "local",
              "chunk", "tile", "order", "place")
TERMINAL_NAMES = {
    "NAME": "a name", "NUMBER": "a number", "_NL": "end of line", "MATMUL": "'@'", "PEER": "'@'",
    "COLON": "':'", "COMMA": "','", "LSQB": "'['", "RSQB": "']'", "LPAR": "'('", "RPAR": "')'",
    "EQUAL": "'='", "PLUS": "'+'", "MINUS": "'-'", "STAR": "'*'", "SLASH": "'/'", "PERCENT": "'%'",
    "SEMICOLON": "';'", "$END": "end of file",
}


@functools.lru_cache(maxsize=1)
def _lark() -> Lark:
    grammar = (Path(__file__).parent / "tiledsl.lark").read_text()
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True)


def parse_file(path: str | Path) -> ast.Program:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TdsError([error(f"cannot read file: {exc.strerror}", ast.Span.none())], str(path)) from None
    return parse(data, str(path))


def parse(source: str | bytes, path: str = "<tds>") -> ast.Program:
    """Parse .tds text (str, or bytes that must be UTF-8) into a Program; raise TdsError on any mistake."""
    text = _decode(source, path)
    _refuse_deep_nesting(text, path)
    try:
        tree = _lark().parse(text)
    except lark.exceptions.UnexpectedInput as exc:
        raise TdsError([_syntax_error(exc, text)], path, text) from None
    builder = _Builder(path, text)
    try:
        program = builder.transform(tree)
    except lark.exceptions.VisitError as exc:
        if isinstance(exc.orig_exc, TdsError):
            raise TdsError(exc.orig_exc.diagnostics, path, text) from None
        raise
    return program


def _decode(source: str | bytes, path: str) -> str:
    if isinstance(source, bytes):
        if len(source) > MAX_SOURCE_BYTES:
            raise TdsError([error(f"file is larger than {MAX_SOURCE_BYTES // 2**20} MiB", ast.Span.none())], path)
        try:
            source = source.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = source[: exc.start].count(b"\n") + 1
            col = exc.start - (source.rfind(b"\n", 0, exc.start) + 1) + 1
            raise TdsError([error(f"this file is not UTF-8 text (byte 0x{source[exc.start]:02x})",
                                  ast.Span(line, col, line, col + 1))], path) from None
    if len(source) > MAX_SOURCE_BYTES:
        raise TdsError([error(f"file is larger than {MAX_SOURCE_BYTES // 2**20} MiB", ast.Span.none())], path)
    return source


def _refuse_deep_nesting(text: str, path: str) -> None:
    """Later stages walk expressions recursively; a bound here keeps them from ever hitting
    Python's recursion limit, whatever the input (deep brackets or a very long operator chain)."""
    for number, line in enumerate(text.splitlines(), 1):
        depth = 0
        operators = 0
        for col, ch in enumerate(line, 1):
            if ch == "#":
                break
            if ch in "([":
                depth += 1
                if depth > MAX_NESTING:
                    raise TdsError([error(f"brackets nested deeper than {MAX_NESTING} levels",
                                          ast.Span(number, col, number, col + 1))], path, text)
            elif ch in ")]":
                depth -= 1
            elif ch in "+-*/%@":
                operators += 1
                if operators > 8 * MAX_NESTING:
                    raise TdsError([error(f"statement has more than {8 * MAX_NESTING} operators",
                                          ast.Span(number, col, number, col + 1),
                                          hint="split it with `let` sizes")], path, text)


def _syntax_error(exc: lark.exceptions.UnexpectedInput, text: str) -> Diagnostic:
    line, col = max(exc.line, 1), max(exc.column, 1)
    span = ast.Span(line, col, line, col + 1)
    lines = text.splitlines()
    line_text = lines[line - 1] if 0 < line <= len(lines) else ""
    if isinstance(exc, lark.exceptions.UnexpectedCharacters):
        char = text[exc.pos_in_stream] if exc.pos_in_stream < len(text) else "?"
        shown = repr(char)
        if char == "@":
            return error("'@' must be followed by a rank (`X@r`) or stand between blanks (`A @ B`)", span)
        return error(f"unexpected character {shown}", span,
                     hint="names are letters, digits and '_'; comments start with '#'")
    if isinstance(exc, lark.exceptions.UnexpectedEOF):
        return error("unexpected end of file: the last statement is incomplete", span)
    token: Token = exc.token
    expected = sorted(getattr(exc, "expected", ()) or ())
    width = max(1, len(str(token))) if token.type != "$END" else 1
    span = ast.Span(line, col, line, col + width)
    if token.type == "$END":
        return error("unexpected end of file: the last statement is incomplete", span)
    first_word = line_text.split()[0] if line_text.split() else ""
    if col == len(line_text) - len(line_text.lstrip()) + 1 and token.type == "NAME" and line > 1 \
            and "NAME" not in expected:
        return _unknown_statement(token, span)
    if token.type == "NAME" and first_word not in STATEMENTS and line_text.lstrip().startswith(str(token)) \
            and "AFTER" in expected:
        return _unknown_statement(token, span)
    if token.type == "_NL":
        opened = _unclosed_bracket(line_text)
        if opened:
            return error(f"'{opened[0]}' opened at column {opened[1]} is not closed on this line",
                         ast.Span(line, opened[1], line, opened[1] + 1),
                         hint="a statement ends at the end of its line; use '\\' to continue it")
        return error(f"the line ends too early: expected {_expected(expected)}", span)
    if token.type in ("MATMUL", "PEER") and "AFTER" in expected:
        return error("an edge reads `consumer[i, j] after producer[...]`; '@' comes after the producer",
                     span)
    if token.type == "EQUAL" and "COLON" in expected:
        return error("expected ':' before the body of the family", span,
                     hint="tile mm[i in M/BM]: C[i*BM : +BM] = ...")
    return error(f"unexpected {_describe(token)}: expected {_expected(expected)}", span)


def _unknown_statement(token: Token, span: ast.Span) -> Diagnostic:
    guess = difflib.get_close_matches(str(token), STATEMENTS + ("after",), n=1)
    hint = f"did you mean '{guess[0]}'?" if guess else "statements start with one of: " + ", ".join(STATEMENTS)
    return error(f"unknown statement '{token}'", span, hint=hint)


def _unclosed_bracket(line: str) -> tuple[str, int] | None:
    stack = []
    for col, ch in enumerate(line, 1):
        if ch == "#":
            break
        if ch in "([":
            stack.append((ch, col))
        elif ch in ")]" and stack:
            stack.pop()
    return stack[-1] if stack else None


def _describe(token: Token) -> str:
    if token.type == "NAME":
        return f"name '{token}'"
    if token.type == "NUMBER":
        return f"number {token}"
    if token.type == "_NL":
        return "end of line"
    return f"'{token}'"


def _expected(expected: list[str]) -> str:
    names = []
    for term in expected:
        name = TERMINAL_NAMES.get(term)
        if name is None:
            name = f"'{term.lower()}'" if term.isalpha() else term
        if name not in names:
            names.append(name)
    if len(names) > 6:
        names = names[:6] + ["..."]
    return ", ".join(names) if names else "something else"


def _span(meta) -> ast.Span:
    if getattr(meta, "empty", True):
        return ast.Span.none()
    return ast.Span(meta.line, meta.column, meta.end_line, meta.end_column)


def _tok_span(token: Token) -> ast.Span:
    return ast.Span(token.line, token.column, token.end_line, token.end_column)


RESERVED = {"rank", "world", "rest", "every", "sum", "cdiv", "min", "max"}


def check_identifier(token: Token) -> None:
    """Names end up in generated Python: refuse what Python or Triton would read otherwise."""
    name = str(token)
    span = _tok_span(token)
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        raise TdsError([error(f"'{name}' is a Python keyword and cannot name anything here", span)])
    if name.startswith("__") or name.startswith("tds_"):
        raise TdsError([error(f"'{name}' is reserved (names may not start with '__' or 'tds_')", span)])
    if name in {"tl", "triton", "torch"}:
        raise TdsError([error(f"'{name}' is reserved for the generated code", span)])


@v_args(meta=True)
class _Builder(Transformer):
    """Builds AST nodes from the parse tree, and nothing else."""

    def __init__(self, path: str, source: str):
        super().__init__()
        self.path = path
        self.source = source

    def NAME(self, token):  # noqa: N802 - lark calls terminal callbacks by terminal name
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

    # tensors
    def tensor_decl(self, meta, children):
        role, name, dtype, *shape = children
        return ast.TensorDecl(role, self._name(name, True), self._name(dtype), tuple(shape), _span(meta))

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
        name, indices, engine, split, source, target, reduce = children
        return ast.ChunkDecl(self._name(name, True), indices, engine, split, source, target, reduce, _span(meta))

    def tile_decl(self, meta, children):
        name, indices, engine, *body = children
        return ast.TileDecl(self._name(name, True), indices, engine, tuple(body), _span(meta))

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
    def edge_decl(self, meta, children):
        consumer, *rest = children
        bound = tuple(self._name(t, True) for t in rest if isinstance(t, Token))
        deps = tuple(c for c in rest if isinstance(c, ast.Dep))
        return ast.EdgeDecl(self._name(consumer), bound, deps, _span(meta))

    def dep(self, meta, children):
        family, *rest = children
        ranks = rest.pop()
        return ast.Dep(self._name(family), tuple(rest), ranks.value if ranks else None, _span(meta))

    def all_instances(self, meta, _):
        return ast.AllInstances(_span(meta))

    def every_rank(self, meta, children):
        return _Ranks(ast.EveryRank(_span(meta)))

    def at_rank(self, meta, children):
        return _Ranks(children[-1])

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
        value = float(text) if any(c in text for c in ".eE") else int(text)
        return ast.Num(value, _span(meta))

    def name(self, meta, children):
        return self._name(children[0])

    def call(self, meta, children):
        func, *args = children
        return ast.Call(str(func), tuple(a for a in args if a is not None), _span(meta))

    def rank_sum(self, meta, children):
        body, var, extent = children
        return ast.RankSum(body, self._name(var, True), extent, _span(meta))

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


class _Many:
    """`const BM = 128, BN = 256` declares several constants; flattened after the transform."""

    def __init__(self, items):
        self.items = items


class _Ranks:
    def __init__(self, value):
        self.value = value


__all__ = ["parse", "parse_file", "TdsError", "RESERVED", "check_identifier"]
