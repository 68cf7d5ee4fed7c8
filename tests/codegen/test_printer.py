"""Each plan statement prints itself (codegen/printer.py) and is walked by one walk (body.nested): a
statement kind without a printer or a description, or a compound statement the walk does not enter,
fails here rather than in a kernel (describe once skipped an If's statements)."""
from __future__ import annotations

import dataclasses

import sympy

from tiledsl.codegen import body
from tiledsl.codegen.describe import DESCRIBE
from tiledsl.codegen.printer import PRINTERS, statements

KINDS = {c for c in vars(body).values() if isinstance(c, type) and issubclass(c, body.Statement)} - {body.Statement}
# the statements that hold statements, in a field named `body` (body.Statement)
COMPOUND = {c for c in KINDS if "body" in {f.name for f in dataclasses.fields(c)}}


def _holding(kind: type, inner: tuple) -> body.Statement:
    """A statement of `kind` holding `inner`, its other fields left empty (a walk reads only `body`)."""
    return kind(**{f.name: inner if f.name == "body" else None for f in dataclasses.fields(kind)
                   if f.default is dataclasses.MISSING})


def test_every_statement_kind_has_one_printer_and_one_description():
    assert KINDS - set(PRINTERS) == set(), "print it in codegen/printer.py (@prints)"
    assert KINDS - set(DESCRIBE) == set(), "describe it in codegen/describe.py (DESCRIBE)"
    assert set(PRINTERS) <= KINDS and set(DESCRIBE) <= KINDS


def test_only_a_field_named_body_holds_statements():
    for kind in KINDS:
        holding = {f.name for f in dataclasses.fields(kind) if "Statement" in str(f.type)}
        assert holding <= {"body"}, (kind.__name__, holding)
    assert COMPOUND >= {body.Loop, body.If}


def test_the_walk_enters_every_compound_statement_one_deeper():
    for kind in COMPOUND:
        inner = body.Barrier()
        outer = _holding(kind, (_holding(kind, (inner,)),))
        assert [(depth, type(s)) for depth, s in body.nested((outer, body.Fence()))] == \
            [(0, kind), (1, kind), (2, body.Barrier), (0, body.Fence)]
        assert inner in list(body.walk((outer,)))


def test_a_compound_statement_prints_its_statements_indented_under_it():
    i = sympy.Symbol("i", integer=True)
    loop = body.Loop(i, sympy.Symbol("n", integer=True), (body.If(i < 3, (body.Barrier(),)),))
    assert statements((loop, body.Fence()), "    ", None).splitlines() == [
        "    for i in range(0, n):",
        "        if i < 3:",
        "            tl.debug_barrier()  # the next store may read back what this one wrote",
        "    tds_sync.fence_async()  # the TMA loads below read what the waits acquired",
    ]


def test_a_statement_inside_an_if_gives_its_family_the_arguments_it_reads():
    place = body.Place("X", sympy.Symbol("r", integer=True), (), 0)
    nested = (body.If(sympy.true, (body.Loop(sympy.Symbol("k"), sympy.Integer(2), (body.Load("tds_X", place),)),)),)
    assert {"X", "tds_peers_X"} <= set().union(*(s.needs("f") for s in body.walk(nested)))
