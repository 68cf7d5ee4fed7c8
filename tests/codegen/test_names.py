"""A value in generated code is named after the program's names (`tds_X` for a load of X), and the
program may use any name the language accepts: no value may shadow a kernel argument, a name of the
kernel template or a module the kernel calls (codegen/names.py)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tiledsl.codegen.names import held, value_name
from tiledsl.pipeline import run

CODEGEN = Path(__file__).resolve().parents[2] / "tiledsl" / "codegen"
# what writes kernel code: the kernel template and the statements' printers
TEMPLATE = (CODEGEN / "templates" / "kernel.py.jinja").read_text() + (CODEGEN / "printer.py").read_text()
# tensor names whose loads would be named like what the generated code holds
NAMES = ["diag", "sync", "timeline", "program", "programs", "t", "inst", "epoch", "max_spins", "elems", "e4",
         "sig_fill", "peers_x", "barrier", "entry_trace", "pid", "r", "k"]


def test_every_name_the_kernel_template_and_the_printers_use_is_held():
    literal = set(re.findall(r"\btds_\w*[A-Za-z0-9]\b", TEMPLATE))
    prefixes = set(re.findall(r"\b(tds_\w+_)[\"'{]", TEMPLATE))  # `"tds_sig_" ~ name`, f"tds_sig_{name}"
    assert {n for n in literal if not held(n)} == set()
    assert {p for p in prefixes if not held(p + "x")} == set()


@pytest.mark.parametrize("hint, name", [("X", "tds_X"), ("diag", "tds_v_diag"), ("sig_fill", "tds_v_sig_fill"),
                                        ("e", "tds_v_e"), ("add", "tds_add")])
def test_a_value_is_named_after_its_hint_unless_that_name_is_held(hint, name):
    taken: set[str] = set()
    assert value_name(hint, taken) == name
    assert value_name(hint, taken) == f"{name}2"  # the second of its kind


def test_no_function_of_a_generated_module_assigns_a_name_it_is_given_or_calls():
    tensors = "\n".join(f"in    {n} : f32[N]" for n in NAMES)
    total = " + ".join(f"{n}[i*B : +B]" for n in NAMES)
    source = f"program shadows\nparam N\nconst B = 4\n{tensors}\nsymm  S : f32[N]\nout   Y : f32[N]\n" \
             f"tile  fill[i in cdiv(N, B)]: S[i*B : +B] = {total}\n" \
             f"tile  take[i in cdiv(N, B)]: Y[i*B : +B] = S@((rank + 1) mod world)[i*B : +B] + {NAMES[0]}[i*B : +B]\n" \
             "take[i] after fill[i] @ ((rank + 1) mod world)\n"
    module = ast.parse(run(source).module)
    top = set()  # the module's own names: imports (tds_sync, tds_timeline, tl), functions, constants
    for node in module.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            top |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, ast.Assign):
            top |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    functions = [n for n in ast.walk(module) if isinstance(n, ast.FunctionDef)]
    assert any(f.name == "tds_tile_fill" for f in functions)
    for function in functions:
        given = {a.arg for a in function.args.args}
        assigned = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        assert not assigned & given, (function.name, assigned & given)
        assert not assigned & top, (function.name, assigned & top)
