"""The parser: every program in programs/ parses, and each common mistake gets its own message at the
line and column of the culprit."""
import re
from pathlib import Path

import pytest

from tiledsl.diagnostics import TdsError
from tiledsl.grammar import ast
from tiledsl.grammar.parser import MAX_NESTING, MAX_OPERATORS, parse, parse_file

PROGRAMS = sorted((Path(__file__).parents[2] / "programs").glob("*.tds"))
HEAD = "program p\nparam M, N\nin A : bf16[M, N]\nin B : bf16[N, M]\nout C : bf16[M, M]\n"  # lines 1-5


def first_error(source, path="<tds>"):
    with pytest.raises(TdsError) as caught:
        parse(source, path)
    diagnostic = caught.value.diagnostics[0]
    return diagnostic, caught.value.render()


def at(diagnostic):
    return diagnostic.span.line, diagnostic.span.column


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.stem)
def test_every_program_parses(path):
    program = parse_file(path)
    assert program.name.id == path.stem
    assert program.of(ast.TileDecl) or program.of(ast.ChunkDecl)


def test_program_keeps_spans_and_flattens_const_lists():
    program = parse(HEAD + "const BM = 128, BN = 256\n")
    consts = program.of(ast.ConstDecl)
    assert [c.name.id for c in consts] == ["BM", "BN"]
    assert (consts[1].name.span.line, consts[1].name.span.column) == (6, 17)


def test_backslash_continues_a_statement():
    program = parse(HEAD + "tile mm[i in M]: \\\n    C[i, :] = A[i, :] @ B\n")
    assert program.of(ast.TileDecl)[0].body[0].span.line == 7


def test_a_line_break_without_a_backslash_ends_the_statement():
    # an unindented next line is a statement of its own; an indented one would be the tile's block body
    diagnostic, _ = first_error(HEAD + "tile mm[i in M]: \nC[i, :] = A[i, :] @ B\n")
    assert diagnostic.message.startswith("the line ends too early")
    assert at(diagnostic) == (6, 18)


def test_blanks_decide_between_peer_and_matrix_product():
    program = parse(HEAD + "tile mm[i in M]: C[i, :] = A@i[i, :] @ B\n")
    value = program.of(ast.TileDecl)[0].body[0].value
    assert isinstance(value, ast.BinOp) and value.op == "@"
    assert isinstance(value.left, ast.Subscript) and isinstance(value.left.base, ast.Peer)


@pytest.mark.parametrize("line, word, guess", [
    ("tiel mm[i in M]: C[i, :] = A[i, :] @ B", "tiel", "tile"),
    ("parm K", "parm", "param"),
    ("chunck g[s in world]: A@s -> C[s, :]", "chunck", "chunk"),
    ("    odrer mm by i", "odrer", "order"),
])
def test_unknown_statement_suggests_the_closest_word(line, word, guess):
    diagnostic, _ = first_error(HEAD + line + "\n")
    assert diagnostic.message == f"unknown statement '{word}'"
    assert diagnostic.hint == f"did you mean '{guess}'?"
    assert at(diagnostic) == (6, line.index(word) + 1)


@pytest.mark.parametrize("word", ["foo", "for", "def", "import"])
def test_unknown_statement_without_a_close_word_lists_the_statements(word):
    diagnostic, _ = first_error(HEAD + f"{word} x in y:\n")
    assert diagnostic.message == f"unknown statement '{word}'"
    assert "statements start with one of" in diagnostic.hint
    assert at(diagnostic) == (6, 1)


def test_misspelled_after_in_an_edge():
    diagnostic, _ = first_error(HEAD + "mm[i] aftr g[i]\n")
    assert "expected 'after'" in diagnostic.message
    assert diagnostic.hint == "did you mean 'after'?"
    assert at(diagnostic) == (6, 7)


@pytest.mark.parametrize("line, bracket, column", [
    ("in X : bf16[M, N", "[", 12),
    ("let a = (M + N", "(", 9),
    ("tile mm[i in M]: C[i, :] = relu(A[i, :] @ B", "(", 32),
])
def test_unclosed_bracket_points_at_the_opening(line, bracket, column):
    diagnostic, rendered = first_error(HEAD + line + "\n")
    assert diagnostic.message == f"'{bracket}' opened at column {column} is not closed on this line"
    assert at(diagnostic) == (6, column)
    assert "use '\\' to continue it" in diagnostic.hint
    assert "^" in rendered


def test_unclosed_bracket_on_a_continued_line_names_its_line():
    diagnostic, _ = first_error(HEAD + "let a = (M + \\\n   N\n")
    assert diagnostic.message == "'(' opened at 6:9 is not closed on this line"
    assert at(diagnostic) == (6, 9)


@pytest.mark.parametrize("line", ["let a = M)", "let a = M + N]"])
def test_closing_bracket_with_nothing_open(line):
    diagnostic, _ = first_error(HEAD + line + "\n")
    assert "closes nothing" in diagnostic.message
    assert at(diagnostic) == (6, len(line))


def test_closing_bracket_of_a_continued_statement():
    program = parse(HEAD + "let a = (M + \\\n   N)\n")
    assert program.of(ast.LetDecl)[0].span.end_line == 7
    diagnostic, _ = first_error(HEAD + "let a = (M + \\\n   N]\n")
    assert diagnostic.message == "']' does not match the '(' opened at 6:9"
    assert at(diagnostic) == (7, 5)


def test_mismatched_closing_bracket():
    diagnostic, _ = first_error(HEAD + "let a = (M + N]\n")
    assert diagnostic.message == "']' does not match the '(' opened at column 9"
    assert at(diagnostic) == (6, 15)


@pytest.mark.parametrize("line, column, what", [
    ("tile mm[i in M] C[i, :] = A[i, :] @ B", 17, "tile"),
    ("tile mm[i in M] on sms(rest) C[i, :] = A[i, :] @ B", 30, "tile"),
    ("tile mm[i in M] = C[i, :]", 17, "tile"),
    ("chunk g[s in world] on copy_engine A@s -> C[s, :]", 36, "chunk"),
])
def test_missing_colon_before_a_family_body(line, column, what):
    diagnostic, _ = first_error(HEAD + line + "\n")
    assert diagnostic.message == f"expected ':' before the body of the {what}"
    assert at(diagnostic) == (6, column)
    assert diagnostic.hint.startswith(what)


def test_missing_colon_in_a_tensor_declaration():
    diagnostic, _ = first_error(HEAD + "symm S bf16[M]\n")
    assert diagnostic.message == "expected ':' between the tensor's name and its type"
    assert at(diagnostic) == (6, 8)
    assert diagnostic.hint == "symm X : bf16[M, N]"


def test_missing_dtype_in_a_tensor_declaration():
    diagnostic, _ = first_error(HEAD + "out D : [M]\n")
    assert diagnostic.message == "expected the tensor's dtype before its shape"
    assert at(diagnostic) == (6, 9)


@pytest.mark.parametrize("body", ["A => C", "A C"])
def test_chunk_needs_an_arrow(body):
    diagnostic, _ = first_error(HEAD + f"chunk g[s in world]: {body}\n")
    assert diagnostic.message == "expected '->' between what the chunk copies and where it copies to"
    assert at(diagnostic) == (6, 24)


def test_range_as_an_index_extent():
    diagnostic, _ = first_error(HEAD + "tile mm[i in 0:M]: C[i, :] = A[i, :] @ B\n")
    assert diagnostic.message.startswith("an index runs over 0 .. extent-1")
    assert at(diagnostic) == (6, 15)


@pytest.mark.parametrize("line, doubled", [("tile mm[i in M]: C[i, :] == A[i, :] @ B", "=="),
                                           ("let a = M // 2", "//"), ("let a = M ** 2", "**")])
def test_python_operators_that_tiledsl_lacks(line, doubled):
    diagnostic, _ = first_error(HEAD + line + "\n")
    assert diagnostic.message.startswith(f"'{doubled}' is not an operator")
    assert at(diagnostic) == (6, line.index(doubled) + 1)


def test_two_statements_on_one_line():
    diagnostic, _ = first_error(HEAD + "param K param L\n")
    assert diagnostic.message == "'param' starts a new statement: write one statement per line"
    assert at(diagnostic) == (6, 9)


def test_edge_with_at_before_after():
    diagnostic, _ = first_error(HEAD + "mm[i] @ every rank after g[i]\n")
    assert "'@' comes after the producer" in diagnostic.message
    assert at(diagnostic) == (6, 7)


@pytest.mark.parametrize("rank, bracketed", [("(rank - 1) mod world", "((rank - 1) mod world)"),
                                              ("rank + 1", "(rank + 1)"), ("2 * s mod world", "((2 * s) mod world)")])
def test_rank_after_at_is_a_whole_expression(rank, bracketed):
    """`@ (rank - 1) mod world`, as issue 24 writes a ring's edge, means what the bracketed form does."""
    def ranks(text):
        edge = parse(HEAD + f"red[i] after mm[i] @ {text}\n").decls[-1]
        return re.sub(r"span=Span\([^)]*\)", "", repr(edge.deps[0].ranks))
    assert ranks(rank) == ranks(bracketed)
    assert "mod" in ranks("(rank - 1) mod world") and "'-'" in ranks("(rank - 1) mod world")


def test_tight_matmul_is_a_peer_copy_and_the_builder_says_so():
    from tiledsl.pipeline import run
    with pytest.raises(TdsError) as caught:
        run(HEAD + "tile mm[i in M]: C[i, :] = A[i, :]@B\n", until="schedule")
    diagnostic = caught.value.diagnostics[0]
    assert "'A@B' with no blanks names rank B's copy of A" in diagnostic.message
    assert diagnostic.hint == "A @ B"
    assert at(diagnostic) == (6, 28)


def test_line_ending_after_a_tight_at():
    diagnostic, _ = first_error(HEAD + "tile mm[i in M]: C[i, :] = A@\n")
    assert diagnostic.message.startswith("the line ends too early")
    assert at(diagnostic) == (6, 30)


def test_missing_header():
    diagnostic, _ = first_error("param M\n")
    assert diagnostic.message == "a .tds file starts with `program NAME`"
    assert at(diagnostic) == (1, 1)


def test_misspelled_header():
    diagnostic, _ = first_error("# a comment first\nprogramm p\n")
    assert diagnostic.message == "a .tds file starts with `program NAME`"
    assert diagnostic.hint == "did you mean 'program'?"
    assert at(diagnostic) == (2, 1)


@pytest.mark.parametrize("source, line, column", [
    (HEAD + "tile mm[i in M]: C[i, :] = ", 6, 27),
    ("program", 1, 8),
    (HEAD + "let a = M +   # the rest is missing", 6, 12),
])
def test_unexpected_end_of_file_points_after_the_last_word(source, line, column):
    diagnostic, _ = first_error(source)
    assert diagnostic.message == "unexpected end of file: the last statement is incomplete"
    assert at(diagnostic) == (line, column)


@pytest.mark.parametrize("source", ["", "\n\n", "# only a comment\n"])
def test_empty_file_is_a_whole_file_problem(source):
    diagnostic, _ = first_error(source)
    assert diagnostic.message.startswith("the file is empty")
    assert diagnostic.span.line == 0


def test_non_utf8_bytes_are_located():
    diagnostic, rendered = first_error(b"program p\nparam M, \xff\n")
    assert diagnostic.message == "this file is not UTF-8 text (byte 0xff)"
    assert at(diagnostic) == (2, 10)
    assert rendered.startswith("<tds>:2:10: error:")


@pytest.mark.parametrize("char, message", [
    ("$", "unexpected character '$'"),
    ('"', "unexpected '\"': tiledsl has no strings"),
    ("\u00a0", "unexpected character '\\xa0' (U+00A0)"),
])
def test_unexpected_characters(char, message):
    diagnostic, _ = first_error(HEAD + f"let a = M {char} N\n")
    assert diagnostic.message == message
    assert at(diagnostic) == (6, 11)


@pytest.mark.parametrize("char, what", [
    ("\r", "a carriage return ('\\r') that does not end a line"),
    ("\x00", "control character U+0000"),
    ("\x1b", "control character U+001B"),
    ("\u2028", "control character U+2028"),
])
def test_control_characters_are_refused_even_in_comments(char, what):
    diagnostic, _ = first_error(HEAD + f"let a = M  # note{char}import os\n")
    assert diagnostic.message == f"{what} is not allowed in a .tds file, not even in a comment"
    assert at(diagnostic) == (6, 18)


def test_crlf_line_ends_are_accepted():
    program = parse(HEAD.replace("\n", "\r\n") + "let a = M\r\n")
    assert program.of(ast.LetDecl)[0].span.line == 6


def test_deep_nesting_is_refused_at_the_first_bracket_too_deep():
    line = "let a = " + "(" * 100 + "M" + ")" * 100
    diagnostic, _ = first_error(HEAD + line + "\n")
    assert diagnostic.message == f"brackets nested deeper than {MAX_NESTING} levels"
    assert at(diagnostic) == (6, 9 + MAX_NESTING)


def test_deep_nesting_across_continued_lines_is_refused():
    diagnostic, _ = first_error(HEAD + "let a = " + "(\\\n" * 100 + "M" + ")" * 100 + "\n")
    assert diagnostic.message == f"brackets nested deeper than {MAX_NESTING} levels"
    assert diagnostic.span.line == 6 + MAX_NESTING


@pytest.mark.parametrize("line", [
    "let a = " + " + ".join(["M"] * 400),
    "let a = " + " mod ".join(["M"] * 400),
    "let a = " + "-" * 400 + "M",
    "tile t[i in M]: C[0, 0] = A" + "[0]" * 400,
    "tile t[i in M]: C[0, 0] = A" + "@0" * 400,
])
def test_too_many_operators_are_refused(line):
    diagnostic, _ = first_error(HEAD + line + "\n")
    assert diagnostic.message == f"statement has more than {MAX_OPERATORS} operators and brackets"
    assert diagnostic.span.line == 6 and diagnostic.span.column > 9
    assert diagnostic.hint == "split it with `let` sizes"


@pytest.mark.parametrize("name", ["lambda", "class", "import", "None", "True", "match",
                                  "__import__", "__builtins__", "tds_signal", "tl", "triton", "torch"])
def test_names_that_generated_python_would_misread_are_refused(name):
    diagnostic, _ = first_error(HEAD + f"in {name} : bf16[M]\n")
    assert at(diagnostic) == (6, 4)
    assert name in diagnostic.message
    if name.startswith("__") or name.startswith("tds_"):
        assert "reserved" in diagnostic.message
    elif name in ("tl", "triton", "torch"):
        assert "reserved for the generated code" in diagnostic.message
    else:
        assert "Python keyword" in diagnostic.message


@pytest.mark.parametrize("decl, column", [("param rank", 7), ("let world = 4", 5), ("const sum = 2", 7),
                                          ("program cdiv", 9)])
def test_built_in_names_cannot_be_declared(decl, column):
    source = decl + "\n" if decl.startswith("program") else HEAD + decl + "\n"
    diagnostic, _ = first_error(source)
    assert "built-in name" in diagnostic.message
    assert diagnostic.span.column == column


def test_keyword_as_an_index_or_a_reduction_variable():
    diagnostic, _ = first_error(HEAD + "tile t[if in M]: C[if, :] = A[if, :] @ B\n")
    assert "'if' is a Python keyword" in diagnostic.message
    assert at(diagnostic) == (6, 8)


def test_numbers_beyond_64_bits_are_refused():
    diagnostic, _ = first_error(HEAD + "let a = " + "9" * 5000 + "\n")
    assert "is too large" in diagnostic.message
    assert at(diagnostic) == (6, 9)


def test_file_name_with_a_newline_is_refused(tmp_path):
    path = tmp_path / "evil\nimport os.tds"
    path.write_text("program p\n")
    with pytest.raises(TdsError) as caught:
        parse_file(path)
    assert "control character" in caught.value.diagnostics[0].message
    assert "\n" not in caught.value.path


def test_missing_file_is_a_diagnostic(tmp_path):
    with pytest.raises(TdsError) as caught:
        parse_file(tmp_path / "absent.tds")
    assert caught.value.render().endswith("error: cannot read file: No such file or directory")


def test_every_error_is_rendered_with_location_caret_and_hint():
    _, rendered = first_error(HEAD + "parm K\n", "prog.tds")
    assert rendered == ("prog.tds:6:1: error: unknown statement 'parm'\n"
                        "    parm K\n"
                        "    ^^^^\n"
                        "  hint: did you mean 'param'?")


@pytest.mark.parametrize("word", ["local", "tile", "order", "param", "require", "place", "program"])
def test_a_family_named_like_a_statement_word_can_start_its_edges(word):
    # tests/corpus/vocab_max.tds names a tile `local`; an edge to it starts with that word, which the
    # lexer reads as the keyword at a line's start: the edge rule takes it as the consumer's name
    source = ("program p\nparam N\nin X : f32[N]\nout Y : f32[N]\nsymm S : f32[N]\n"
              f"tile {word}[i in N/4]: S[i*4 : +4] = X[i*4 : +4]\n"
              f"tile two[i in N/4]: Y[i*4 : +4] = S[i*4 : +4]\n"
              f"two[i] after {word}[i]\n{word}[i] after two[i]\norder {word} by i\n")
    edges = parse(source).of(ast.EdgeDecl)
    assert [e.consumer.id for e in edges] == ["two", word]
    assert (edges[1].consumer.span.line, edges[1].consumer.span.column) == (9, 1)


def test_an_edge_from_a_python_keyword_names_the_keyword():
    diagnostic, _ = first_error(HEAD + "in[i] after mm[i]\n")
    assert at(diagnostic) == (6, 1)
    assert "'in' is a keyword of the language" in diagnostic.message and "not an edge" in diagnostic.message
    assert diagnostic.hint == "a family cannot be named 'in': rename it, e.g. 'in_'"


def test_an_edge_to_a_family_named_local_orders_its_reads():
    from tiledsl.pipeline import run
    source = ("program p\nparam N\nin X : f32[N]\nout Y : f32[N]\nsymm S : f32[N]\n"
              "tile two[i in N/4]: S[i*4 : +4] = X[i*4 : +4]\n"
              "tile local[i in N/4]: Y[i*4 : +4] = S[i*4 : +4]\n")
    with pytest.raises(TdsError, match="race"):
        run(source, until="check")
    assert not run(source + "local[i] after two[i]\n", until="check").warnings
