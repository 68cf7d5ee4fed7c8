"""Indentation to tokens: a tile's block body and a loop's body are the lines indented under them,
as in Python. The postlexer turns a deeper line into _INDENT and a shallower one into _DEDENTs, and
ends every block with a line end, so that the grammar separates top-level declarations with line
ends whether or not a block came before (and a file may end inside a block, without a last newline)."""
from __future__ import annotations

from lark import Token
from lark.indenter import Indenter

from tiledsl.diagnostics import TdsError, error
from tiledsl.grammar import ast

TAB = 8  # a tab indents to the next multiple of 8, as Python counts it


class BlockIndenter(Indenter):
    NL_type = "_NL"
    INDENT_type = "_INDENT"
    DEDENT_type = "_DEDENT"
    # a line end inside brackets is an error of its own (refusals.py names the bracket): no tracking
    OPEN_PAREN_types: list = []
    CLOSE_PAREN_types: list = []
    tab_len = TAB

    def handle_NL(self, token: Token, opens: bool = False):  # noqa: N802 - lark's name
        """`opens`: the line ends with ':', so a deeper next line starts its block. A deeper line
        anywhere else changes nothing (a program may indent a declaration as it likes)."""
        yield token
        last = token.rsplit("\n", 1)[1]
        if "#" in last:
            return  # a comment line at the end of the file: no line follows, its indentation means nothing
        indent = len(last.replace("\t", " " * TAB).replace("\f", ""))
        if indent > self.indent_level[-1]:
            if opens:
                self.indent_level.append(indent)
                yield Token.new_borrow_pos(self.INDENT_type, last, token)
            return
        dedented = False
        while indent < self.indent_level[-1]:
            self.indent_level.pop()
            dedented = True
            yield Token.new_borrow_pos(self.DEDENT_type, last, token)
        if indent != self.indent_level[-1]:
            line = token.end_line
            raise TdsError([error(f"this line is indented by {indent}, which matches no block around it "
                                  f"(blocks here are indented by {', '.join(map(str, self.indent_level))})",
                                  ast.Span(line, 1, line, max(2, indent + 1)),
                                  hint="indent a block's lines alike, as in Python")])
        if dedented and indent == 0:
            yield Token.new_borrow_pos(self.NL_type, "\n", token)  # ends the tile: the next declaration follows

    def _process(self, stream):
        token = previous = None
        for token in stream:
            if token.type == self.NL_type:
                yield from self.handle_NL(token, previous is not None and previous.type == "COLON")
            else:
                yield token
            previous = token
        if len(self.indent_level) > 1:
            if token is not None and token.type != self.NL_type:
                yield Token.new_borrow_pos(self.NL_type, "\n", token)  # the last line of the file ends a block
            while len(self.indent_level) > 1:
                self.indent_level.pop()
                yield Token.new_borrow_pos(self.DEDENT_type, "", token)
            yield Token.new_borrow_pos(self.NL_type, "\n", token)
