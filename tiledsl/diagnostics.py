"""Diagnostics: every problem in a .tds program is reported as `FILE:LINE:COL: error: message`,
then the source line with a caret under the culprit, then an optional hint and related sites."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Span:
    """A source range: 1-based line and column of its first character, and its end. Every syntax node
    keeps one (tiledsl.grammar.ast, which names it too); defined here, where diagnostics point with it."""
    line: int
    column: int
    end_line: int
    end_column: int

    @staticmethod
    def none() -> "Span":
        return Span(0, 0, 0, 0)


@dataclass(frozen=True)
class Note:
    """A second site that explains the first (the other side of a race, a step of a cycle)."""
    message: str
    span: Span


@dataclass(frozen=True)
class Diagnostic:
    severity: str  # "error" stops the build; "warning" is printed and the build goes on
    message: str
    span: Span
    hint: str | None = None
    notes: tuple[Note, ...] = field(default_factory=tuple)
    # what a refusal proves, as data (tiledsl.schedule.witness): a second checker can confirm it
    witness: object = field(default=None, compare=False)

    def render(self, path: str, source: str) -> str:
        lines = [_located(path, source, self.span, f"{self.severity}: {self.message}")]
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        for note in self.notes:
            lines.append(_located(path, source, note.span, f"note: {note.message}"))
        return "\n".join(lines)


def _located(path: str, source: str, span: Span, text: str) -> str:
    if span.line <= 0:
        return f"{path}: {text}"
    head = f"{path}:{span.line}:{span.column}: {text}"
    source_lines = source.splitlines()
    if span.line > len(source_lines):
        return head
    line = source_lines[span.line - 1]
    # Long lines (a 10 MB line is valid input) are cut around the caret so that output stays readable.
    start = max(0, span.column - 60)
    shown = line[start:start + 120].expandtabs(1)
    width = span.end_column - span.column if span.end_line == span.line and span.end_column > span.column else 1
    caret = " " * (span.column - 1 - start) + "^" * max(1, min(width, 120 - (span.column - 1 - start)))
    prefix = "..." if start else ""
    return f"{head}\n    {prefix}{shown}\n    {' ' * len(prefix)}{caret}"


class TdsError(Exception):
    """Raised by a stage that found errors; carries every diagnostic that stage collected."""

    def __init__(self, diagnostics: list[Diagnostic], path: str = "<tds>", source: str = ""):
        self.diagnostics = list(diagnostics)
        self.path = path
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        return "\n".join(d.render(self.path, self.source) for d in self.diagnostics)


def error(message: str, span: Span, hint: str | None = None, notes: tuple[Note, ...] = (),
          witness: object = None) -> Diagnostic:
    return Diagnostic("error", message, span, hint, tuple(notes), witness)


def warning(message: str, span: Span, hint: str | None = None, notes: tuple[Note, ...] = ()) -> Diagnostic:
    return Diagnostic("warning", message, span, hint, tuple(notes))
