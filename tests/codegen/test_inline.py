"""A temporary read once is printed where it is read (codegen/inline.py), and only where that computes
the same values the same number of times: a value stays named where it would move into a loop, past an
assignment of a name it reads, into an argument read twice, or take its reader past two lines."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import sympy

from tiledsl.codegen import body
from tiledsl.codegen.printer import statements
from tiledsl.pipeline import run

ROOT = Path(__file__).resolve().parents[2]
# names of values the lowering made up, numbered (tds_add2) or not, for the values that are pure
TEMPORARY = re.compile(r"\btds_(add|sub|mul|dot|trans|rowmax|rowsum|lt|le|gt|where|exp2|div)\d*\b")


def _printed(*items) -> str:
    return statements(items, "", None)


@pytest.mark.parametrize("name", ["sp_ag_attention", "flash_decode", "sp_ulysses"])
def test_attention_kernels_read_like_the_math(name):
    module = run((ROOT / "programs" / f"{name}.tds").read_text()).module
    kernels = module[:module.index("tds_SPEC = ")]
    left = sorted(set(TEMPORARY.findall(kernels)))
    if name == "flash_decode":  # two values stored: in place, each store would take three lines
        assert left == ["div", "where"]
    else:
        assert left == []
    if name == "sp_ag_attention":
        assert "                p = tl.exp2(s * 0.12751743082459868 - mn)\n" in kernels
        assert "                l = l * alpha + tl.sum(p, axis=1, keep_dims=True)\n" in kernels


def test_a_chain_of_temporaries_becomes_one_expression_with_the_brackets_it_needs():
    printed = _printed(body.Apply("tds_mul", "mul", ("s", body.Scalar(0.5))),
                       body.Apply("tds_sub", "sub", ("tds_mul", "mn")),
                       body.Apply("tds_add", "add", ("a", "b")),
                       body.Apply("tds_add2", "add", ("c", "tds_add")),  # c + (a + b): rounds otherwise
                       body.Apply("p", "exp2", ("tds_sub",)),
                       body.Apply("q", "mul", ("tds_add2", "p")))
    assert printed == "p = tl.exp2(s * 0.5 - mn)\nq = (c + (a + b)) * p\n"


def test_a_value_stays_named_where_moving_it_would_change_what_it_computes_or_how_often():
    into_a_loop = _printed(body.Apply("tds_mul", "mul", ("x", "y")),
                           body.Loop(sympy.Symbol("k"), sympy.Integer(4), (body.Accumulate("acc", "tds_mul"),)))
    assert into_a_loop.startswith("tds_mul = x * y\n")
    past_its_operand = _printed(body.Apply("tds_sub", "sub", ("m", "mn")), body.Assign("m", "mn"),
                                body.Apply("alpha", "exp2", ("tds_sub",)))
    assert past_its_operand == "tds_sub = m - mn\nm = mn\nalpha = tl.exp2(tds_sub)\n"
    read_twice_by_silu = _printed(body.Apply("tds_add", "add", ("x", "y")), body.Apply("z", "silu", ("tds_add",)))
    assert read_twice_by_silu == "tds_add = x + y\nz = tds_add * tl.sigmoid(tds_add)\n"
    read_twice = _printed(body.Apply("tds_add", "add", ("x", "y")), body.Apply("z", "mul", ("tds_add", "tds_add")))
    assert read_twice.startswith("tds_add = x + y\n")
    program_name = _printed(body.Apply("mn", "max", ("m", "x")), body.Apply("z", "exp2", ("mn",)))
    assert program_name == "mn = tl.maximum(m, x)\nz = tl.exp2(mn)\n"


def test_a_value_moves_past_loads_and_waits_but_a_load_never_moves():
    place = body.Place("X", None, (body.Dim(sympy.Integer(0), sympy.Integer(1), sympy.Integer(8), 0, 8),), 1)
    printed = _printed(body.Apply("tds_mul", "mul", ("x", "y")), body.Load("tds_X", place),
                       body.Apply("z", "add", ("tds_mul", "tds_X")))
    assert printed.splitlines()[0].startswith("tds_X = tl.load(")
    assert printed.splitlines()[1] == "z = x * y + tds_X"


def test_the_groups_of_a_scan_are_named_only_where_a_histogram_is_stored():
    for name in ("moe_dispatch", "moe_combine"):
        module = run((ROOT / "programs" / f"{name}.tds").read_text()).module
        for function in module.split("\ndef ")[1:]:
            assert ("tds_g = " in function) == bool(re.search(r"\btds_g\b(?! = )", function)), (name, function[:60])


def test_a_cast_of_a_value_computed_in_place_brackets_it_and_runs(tmp_path):
    """`f32(f16(x)) * 2.0`: the inner cast is printed inside the outer one (it printed the value's
    dataclass, `Computed(statement=Cast(...))`, a NameError at run)."""
    printed = _printed(body.Cast("tds_cast", "float16", "x"), body.Cast("tds_cast2", "float32", "tds_cast"),
                       body.Apply("y", "mul", ("tds_cast2", body.Scalar(2.0))))
    assert printed == "y = (x.to(tl.float16).to(tl.float32)).to(tl.float32) * 2.0\n"
    from tiledsl.tools.run_program import run_emulated
    path = tmp_path / "casts.tds"
    path.write_text("program casts\nparam N\nconst BN = 16\nin X : f32[N]\nout Y : f32[N]\n"
                    "tile t[i in cdiv(N, BN)]: Y[i*BN : +BN] = f32(f16(X[i*BN : +BN])) * 2.0\n")
    verdicts = run_emulated(path.read_text(), world=1)
    assert verdicts and all(v.ok for v in verdicts), [v.line() for v in verdicts]
