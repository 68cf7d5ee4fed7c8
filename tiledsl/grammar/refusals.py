"""What the parser refuses, and how it says so: input limits (size, nesting, control characters,
encoding) checked before parsing, and a named message for each common syntax error instead of a raw
token dump."""
from __future__ import annotations

import difflib
import functools
import re
from pathlib import Path

import lark
from lark import Lark, Token

from tiledsl.diagnostics import Diagnostic, TdsError, error
from tiledsl.grammar import ast

MAX_SOURCE_BYTES = 16 * 1024 * 1024
MAX_NESTING = 64  # brackets deeper than this are refused before they reach recursion
MAX_OPERATORS = 4 * MAX_NESTING  # operators and brackets in one statement: each may deepen the tree
MAX_NAME = 255  # longer names serve no program, only slow down the search for a close match
MAX_TOKENS = 100_000  # words and symbols in one file: a hundred times the largest real program

STATEMENTS = ("program", "param", "const", "tune", "let", "require", "in", "out", "inout", "symm", "local",
              "chunk", "tile", "order", "place")
TERMINAL_NAMES = {
    "NAME": "a name", "NUMBER": "a number", "_NL": "end of line", "MATMUL": "'@'", "PEER": "'@'",
    "COLON": "':'", "COMMA": "','", "LSQB": "'['", "RSQB": "']'", "LPAR": "'('", "RPAR": "')'",
    "EQUAL": "'='", "PLUS": "'+'", "MINUS": "'-'", "STAR": "'*'", "SLASH": "'/'", "PERCENT": "'%'",
    "SEMICOLON": "';'", "_ARROW": "'->'", "COMPARE": "a comparison (== != <= >= < >)", "$END": "end of file",
    "_INDENT": "an indented block", "_DEDENT": "the end of the block",
}


@functools.lru_cache(maxsize=1)
def _lark() -> Lark:
    from tiledsl.grammar.indentation import BlockIndenter
    grammar = (Path(__file__).parent / "tiledsl.lark").read_text()
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True,
                postlex=BlockIndenter())


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


# Python ends a line at a lone '\r' and refuses NUL: in a comment that generated code quotes, either
# could start a statement. Line separators that str.splitlines() knows would shift every line number.
_CONTROL = re.compile("[\x00-\x08\x0b\x0e-\x1f\x7f\x85\u2028\u2029]|\r(?!\n)")


def _refuse_control_characters(text: str, path: str) -> None:
    found = _CONTROL.search(text)
    if found is None:
        return
    line = text.count("\n", 0, found.start()) + 1
    col = found.start() - (text.rfind("\n", 0, found.start()) + 1) + 1
    char = found.group()
    what = "a carriage return ('\\r') that does not end a line" if char == "\r" else \
        f"control character U+{ord(char):04X}"
    raise TdsError([error(f"{what} is not allowed in a .tds file, not even in a comment",
                          ast.Span(line, col, line, col + 1),
                          hint="save the file with \\n or \\r\\n line ends" if char == "\r" else None)], path, text)


def _refuse_oversized(text: str, path: str) -> None:
    """Later stages walk expressions recursively: bounds on nesting and on operators per statement keep
    them from ever hitting Python's recursion limit, whatever the input (deep brackets, long operator
    chains, `X[0][0]...`); a bound on words and symbols per file keeps the time to refuse a huge input
    short. A statement continued with '\\' is counted as one line."""
    depth = operators = tokens = 0
    for number, line in enumerate(text.split("\n"), 1):
        code = line.split("#", 1)[0]
        for match in _TOKENS.finditer(code):
            token, col = match.group(), match.start() + 1
            span = ast.Span(number, col, number, col + min(len(token), 100))
            tokens += 1
            if tokens > MAX_TOKENS:
                raise TdsError([error(f"the program has more than {MAX_TOKENS} words and symbols", span)],
                               path, text)
            if token in ")]":
                depth = max(0, depth - 1)
            elif token in "([" or token in _OPERATORS:
                operators += 1
                depth += token in "(["
                if depth > MAX_NESTING:
                    raise TdsError([error(f"brackets nested deeper than {MAX_NESTING} levels", span)], path, text)
                if operators > MAX_OPERATORS:
                    raise TdsError([error(f"statement has more than {MAX_OPERATORS} operators and brackets", span,
                                          hint="split it with `let` sizes")], path, text)
        if not code.rstrip(" \t\f\r").endswith("\\"):
            depth = operators = 0


_TOKENS = re.compile(r"[()\[\]]|[-+*/%@]|\bmod\b|[A-Za-z0-9_.]+|[^\s()\[\]\-+*/%@A-Za-z0-9_.]")
_OPERATORS = {"+", "-", "*", "/", "%", "@", "mod"}
_DOUBLED = {"==": "a tile body assigns with one '='", "//": "'/' floors on indices (and must divide on sizes)",
            "**": "write the product out, or use a `let` size"}
_WORD = re.compile(r"[ \t\f]*([A-Za-z_][A-Za-z0-9_]*)")
# Statement words that cannot appear inside a statement (`in` can: `i in M`).
_STATEMENT_TOKENS = {w.upper(): w for w in STATEMENTS if w != "in"}


def _syntax_error(exc: lark.exceptions.UnexpectedInput, text: str) -> Diagnostic:
    lines = text.split("\n")
    if isinstance(exc, lark.exceptions.UnexpectedEOF) or \
            isinstance(exc, lark.exceptions.UnexpectedToken) and exc.token.type == "$END":
        return _end_of_file(text)
    line, col = max(exc.line, 1), max(exc.column, 1)
    span = ast.Span(line, col, line, col + 1)
    line_text = lines[line - 1] if 0 < line <= len(lines) else ""
    if isinstance(exc, lark.exceptions.UnexpectedCharacters):
        return _unexpected_character(text[exc.pos_in_stream] if exc.pos_in_stream < len(text) else "?", span)
    token: Token = exc.token
    expected = _expected_terminals(exc)
    span = ast.Span(line, col, line, col + max(1, len(str(token))))
    first, first_line, first_col = _statement_word(lines, line)
    if "_INDENT" in expected:  # `tile t[...]:` and no body, on this line or indented below it
        where = _end_of_code_before(lines, line)
        what = "a `for` loop's" if lines[where[0] - 1].lstrip().startswith("for ") else "the tile's"
        return error(f"the line ends too early: {what} body goes after ':' or on the indented lines below it",
                     ast.Span(*where, where[0], where[1] + 1))
    if token.type == "_INDENT":
        return error("this line is indented, but the line before it opens no block", span,
                     hint="only a tile's body (after `tile ...:`) and a loop's (after `for ...:`) are indented")
    if token.type == "_DEDENT":
        return error("the block ends here, in the middle of a statement", span)
    if "PROGRAM" in expected:
        guess = [] if first in STATEMENTS or len(first or "") > MAX_NAME else \
            difflib.get_close_matches(first or "", ["program"], n=1)
        return error("a .tds file starts with `program NAME`", span,
                     hint="did you mean 'program'?" if guess else "program my_kernel")
    in_block = _in_block(lines, first_line)
    if in_block and token.type == "NAME" and first and first not in ("for", "wait") and \
            lines[first_line - 1][first_col - 1 + len(first):col - 1].strip() == "":
        # two words in a row at the start of a block's statement: the first is no statement
        word_span = ast.Span(first_line, first_col, first_line, first_col + len(first))
        if first in STATEMENTS:
            return error(f"'{first}' is a declaration, not a statement of a tile's block: write it unindented, "
                         "after the block", word_span)
        guess = difflib.get_close_matches(first, ["wait", "for"], n=1) if len(first) <= MAX_NAME else []
        return error(f"unknown statement '{first[:40]}' in a tile's block", word_span,
                     hint=f"did you mean '{guess[0]}'?" if guess else
                     "a block's statements are `name = value`, `X[...] = value`, `wait ...` and `for c in n:`")
    if first in STATEMENTS and not in_block and lines[first_line - 1][first_col - 1 + len(first):].startswith("["):
        # `order[i] after ...`: an edge whose consumer is named like a statement word (no declaration
        # has '[' right after its word)
        return error(f"'{first}' is a keyword of the language: a line starting with it is a declaration, "
                     "not an edge", ast.Span(first_line, first_col, first_line, first_col + len(first)),
                     hint=f"a family cannot be named '{first}': rename it, e.g. '{first}_'")
    if first and first not in STATEMENTS and first != "program" and not in_block:
        # Only an edge starts with a name that is no statement word, and an edge's name is followed by '['.
        after_word = lines[first_line - 1][first_col - 1 + len(first):].lstrip(" \t\f")
        if not after_word.startswith("[") or (first_line, first_col) == (line, col):
            return _unknown_statement(first, ast.Span(first_line, first_col, first_line, first_col + len(first)))
    if token.type in _STATEMENT_TOKENS:
        return error(f"'{token}' starts a new statement: write one statement per line", span)
    if "COLON" in expected and not {"RSQB", "RPAR", "COMMA"} & set(expected):
        if first in ("tile", "chunk"):
            return error(f"expected ':' before the body of the {first}", span,
                         hint="tile mm[i in M/BM]: C[i*BM : +BM] = ..." if first == "tile" else
                         "chunk gather[s in world] on copy_engine: A@s -> A_all[s*Ms : +Ms, :]")
        if first in ("in", "out", "inout", "symm", "local"):
            return error("expected ':' between the tensor's name and its type", span,
                         hint=f"{first} X : bf16[M, N]")
    if token.type == "_NL":
        opened = _unclosed_bracket(_logical_line(lines, first_line, line))
        if opened:
            where = _position(lines, first_line, opened[1])
            at = f"column {where[1]}" if where[0] == line else f"{where[0]}:{where[1]}"
            return error(f"'{opened[0]}' opened at {at} is not closed on this line",
                         ast.Span(*where, where[0], where[1] + 1),
                         hint="a statement ends at the end of its line; use '\\' to continue it")
        return error(f"the line ends too early: expected {_expected(expected)}", span)
    if token.type in ("RPAR", "RSQB"):
        opened = _unclosed_bracket("\n".join(lines[first_line - 1: line - 1] + [line_text[: col - 1]]))
        if opened is None:
            return error(f"'{token}' closes nothing: no bracket is open here", span)
        if opened[0] + str(token) not in ("()", "[]"):
            where = _position(lines, first_line, opened[1])
            at = f"column {where[1]}" if where[0] == line else f"{where[0]}:{where[1]}"
            return error(f"'{token}' does not match the '{opened[0]}' opened at {at}", span)
    if token.type in ("MATMUL", "PEER") and "AFTER" in expected:
        return error("an edge reads `consumer[i, j] after producer[...]`; '@' comes after the producer", span)
    if token.type == "COMPARE":  # a comparison outside `require`
        why = _DOUBLED.get(str(token), "sizes are compared only in a `require` line")
        return error(f"'{token}' is not an operator here: {why}", ast.Span(line, col, line, col + len(token)),
                     hint=None if str(token) in _DOUBLED else "a launch condition reads: require N % BLOCK == 0")
    doubled = line_text[col - 2: col] if col >= 2 else ""
    if doubled in _DOUBLED:
        return error(f"'{doubled}' is not an operator: {_DOUBLED[doubled]}", ast.Span(line, col - 1, line, col + 1))
    if "_ARROW" in expected and first == "chunk":
        return error("expected '->' between what the chunk copies and where it copies to", span,
                     hint="chunk gather[s in world] on copy_engine: A@s -> A_all[s*Ms : +Ms, :]")
    if token.type == "LSQB" and expected == ["NAME"] and first in ("in", "out", "inout", "symm", "local"):
        return error("expected the tensor's dtype before its shape", span, hint=f"{first} X : bf16[M, N]")
    if token.type == "COLON" and first in ("tile", "chunk") and "]" not in line_text[: col - 1]:
        return error("an index runs over 0 .. extent-1: write `i in M`, not a range", span)
    hint = None
    if token.type == "NAME":
        words = [_terminal(t) for t in expected if _terminal(t).strip("'").isalpha()]
        guess = difflib.get_close_matches(f"'{token}'", words, n=1) if len(token) <= MAX_NAME else []
        hint = f"did you mean {guess[0]}?" if guess else None
    return error(f"unexpected {_describe(token)}: expected {_expected(expected)}", span, hint=hint)


def _expected_terminals(exc) -> list[str]:
    """What the parser could take where it failed. The contextual lexer's own error lists what it could
    lex there, which the postlexer widens with the line end: the parse table says what is grammatical."""
    state = getattr(exc, "state", None)
    try:
        return sorted(t for t in state.parse_conf.parse_table.states[state.position] if t.isupper())
    except (AttributeError, KeyError, TypeError):
        return sorted(getattr(exc, "expected", ()) or ())


def _in_block(lines: list[str], line: int) -> bool:
    """Whether `line` is a statement of a tile's (or loop's) block: the nearest line of code above it
    that is indented less ends with ':'."""
    def indent(text: str) -> int:
        return len(text) - len(text.lstrip(" \t\f"))
    own = indent(lines[line - 1])
    if own == 0:
        return False
    for number in range(line - 1, 0, -1):
        code = lines[number - 1].split("#", 1)[0].rstrip()
        if code.strip() and indent(code) < own:
            return code.endswith(":")
    return False


def _end_of_code_before(lines: list[str], line: int) -> tuple[int, int]:
    """Where the last line of code before `line` ends (its line end's column), skipping blank lines and
    comment lines."""
    for number in range(line - 1, 0, -1):
        if lines[number - 1].split("#", 1)[0].strip():
            return number, len(lines[number - 1].rstrip("\r")) + 1
    return max(1, line - 1), 1


def _end_of_file(text: str) -> Diagnostic:
    code = "\n".join(line.split("#", 1)[0] for line in text.split("\n")).rstrip()
    if not code:
        return error("the file is empty: a .tds file starts with `program NAME`", ast.Span.none())
    line = code.count("\n") + 1
    col = len(code) - (code.rfind("\n") + 1) + 1
    return error("unexpected end of file: the last statement is incomplete", ast.Span(line, col, line, col + 1))


def _unexpected_character(char: str, span: ast.Span) -> Diagnostic:
    if char == "@":
        return error("'@' must be followed by a rank (`X@r`) or stand between blanks (`A @ B`)", span)
    if char in "\"'":
        return error(f"unexpected {char!r}: tiledsl has no strings", span)
    shown = repr(char) if char.isprintable() else f"{char!r} (U+{ord(char):04X})"
    return error(f"unexpected character {shown}", span,
                 hint="names are letters, digits and '_'; comments start with '#'")


def _statement_word(lines: list[str], line: int) -> tuple[str | None, int, int]:
    """The first word of the statement that line `line` belongs to, its line and column."""
    start = line
    while start > 1 and lines[start - 2].split("#", 1)[0].rstrip(" \t\f\r").endswith("\\"):
        start -= 1
    match = _WORD.match(lines[start - 1]) if 0 < start <= len(lines) else None
    if match is None:
        return None, start, 1
    return match.group(1), start, match.start(1) + 1


def _logical_line(lines: list[str], first: int, last: int) -> str:
    """Lines first..last joined, continuation backslashes kept so that columns can be mapped back."""
    return "\n".join(lines[first - 1: last])


def _position(lines: list[str], first: int, offset: int) -> tuple[int, int]:
    """Line and column of the 1-based `offset` into _logical_line(lines, first, ...)."""
    line = first
    while offset > len(lines[line - 1]) + 1 and line < len(lines):
        offset -= len(lines[line - 1]) + 1
        line += 1
    return line, offset


def _unknown_statement(word: str, span: ast.Span) -> Diagnostic:
    guess = difflib.get_close_matches(word, STATEMENTS + ("after",), n=1) if len(word) <= MAX_NAME else []
    word = word if len(word) <= 40 else word[:20] + "..."
    hint = f"did you mean '{guess[0]}'?" if guess else "statements start with one of: " + ", ".join(STATEMENTS)
    return error(f"unknown statement '{word}'", span, hint=hint)


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
    text = str(token) if len(token) <= 40 else token[:20] + "..."
    if token.type == "NAME":
        return f"name '{text}'"
    if token.type == "NUMBER":
        return f"number {text}"
    if token.type == "_NL":
        return "end of line"
    return f"'{token}'"


def _terminal(term: str) -> str:
    """How a terminal reads in a message: 'after', '->', a name."""
    if term in TERMINAL_NAMES:
        return TERMINAL_NAMES[term]
    try:
        pattern = _lark().get_terminal(term).pattern
    except KeyError:
        return term.lower()
    return f"'{pattern.value}'" if pattern.type == "str" else term.lower()


def _expected(expected: list[str]) -> str:
    names = []
    for term in expected:
        name = _terminal(term)
        if name not in names:
            names.append(name)
    if len(names) > 6:
        names = names[:6] + ["..."]
    return ", ".join(names) if names else "something else"
