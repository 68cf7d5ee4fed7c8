"""Names from a .tds file end up in generated Python, so a .tds file must not be able to smuggle code
into it. Names that Python would read as something else are refused with a diagnostic (never a
traceback); names that are accepted may appear in the generated module, but never where they would
clash with, or stand in for, a name the generated code relies on."""
import ast as pyast
import importlib.util
import re
from pathlib import Path

import pytest

from tiledsl import cli
from tiledsl.diagnostics import TdsError
from tiledsl.pipeline import run

ROOT = Path(__file__).parents[1]
COPY = (ROOT / "programs" / "copy.tds").read_text()
HEAD = "program p\nparam N\nin X : bf16[N]\nout Y : bf16[N]\n"  # lines 1-4


def refused(source, until="check"):
    """The front end refuses `source` with located diagnostics (and nothing else escapes)."""
    with pytest.raises(TdsError) as caught:
        run(source, until=until)
    for diagnostic in caught.value.diagnostics:
        assert diagnostic.span.line >= 0 and diagnostic.span.column >= 0
    return caught.value.diagnostics[0]


# ---- the front end refuses what Python would read as code ------------------------------------------

@pytest.mark.parametrize("line, message", [
    ("in __import__ : bf16[N]", "'__import__' is reserved"),
    ("in __builtins__ : bf16[N]", "'__builtins__' is reserved"),
    ("in os.system : bf16[N]", "unexpected character '.'"),
    ("in lambda : bf16[N]", "'lambda' is a Python keyword"),
    ("param exec, import", "'import' is a Python keyword"),
    ('in X"; import os; " : bf16[N]', "tiledsl has no strings"),
    ("in Z'); import os; (' : bf16[N]", "tiledsl has no strings"),
    ("in Z; import os : bf16[N]", "expected ':' between the tensor's name and its type"),
    ("in Z\nimport os : bf16[N]", "expected ':' between the tensor's name and its type"),
    ("let a = N\nimport os", "unknown statement 'import'"),
    ("in ｅｘｅｃ : bf16[N]", "unexpected character 'ｅ'"),
    ("in Z : __import__[N]", "unknown dtype '__import__'"),
    ("tile cp[i in N]: Y[i] = __import__(X[i])", "unknown function '__import__'"),
    ("tile cp[i in N]: Y[i] = exec(X[i])", "unknown function 'exec'"),
    ("tile cp[i in N]: Y[i] = eval(X[i])", "unknown function 'eval'"),
    ("tile cp[i in N]: Y[i] = os.system(X[i])", "unexpected character '.'"),
    ("tile cp[__class__ in N]: Y[__class__] = X[__class__]", "'__class__' is reserved"),
    ("tile cp[i in N]: Y[i] = sum(X[i] for __dict__ in world)", "'__dict__' is reserved"),
    ("let size = eval(N)", "unknown size function 'eval'"),
    ("const BLOCK = __import__", "unknown name '__import__'"),
    ("chunk g[s in world] on __import__: X -> Y", "unknown engine '__import__'"),
    ("chunk g[s in world] on sms(__import__): X -> Y", "unknown name '__import__'"),
    ("tile cp[i in N]: Y[i] = X[i]\norder cp by __import__", "unknown name '__import__'"),
    ("tile cp[i in N]: Y[i] = X[i]\ncp[i] after cp[i] @ __import__", "unknown name '__import__'"),
    ("tile cp[i in N]: Y[i] = X[i]\ncp[__init__] after cp[0]", "'__init__' is reserved"),
    ("let a = N  # fine\r import os", "a carriage return ('\\r') that does not end a line"),
    ("let a = N  # fine\x00 import os", "control character U+0000"),
    ("let a = N  # fine\u2028import os", "control character U+2028"),
    ("in tds_signal : bf16[N]", "'tds_signal' is reserved"),
    ("in tl : bf16[N]", "'tl' is reserved for the generated code"),
])
def test_code_in_a_name_is_refused_with_a_diagnostic(line, message):
    diagnostic = refused(HEAD + line + "\n")
    assert message in diagnostic.message
    assert diagnostic.span.line >= 5


@pytest.mark.parametrize("header", ['program x"); import os; ("', "program x'); import os; ('",
                                    "program __import__", "program os.system", "program exec;import os"])
def test_code_in_the_program_name_is_refused(header):
    diagnostic = refused(header + "\n" + COPY.split("\n", 3)[3])
    assert diagnostic.span.line == 1 and diagnostic.span.column >= 9


def test_file_path_with_a_newline_is_refused(tmp_path, capsys):
    path = tmp_path / "x.tds\nimport os\n#"
    path.write_text(COPY)
    diagnostic = refused(path)
    assert diagnostic.message == "the file name contains a control character (a newline, a tab, ...)"
    assert cli.main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\\n" in err and "Traceback" not in err


# ---- accepted names never clash with the generated code's own names ----------------------------------

def codegen_available() -> bool:
    return importlib.util.find_spec("tiledsl.codegen.render") is not None


needs_codegen = pytest.mark.skipif(not codegen_available(),
                                   reason="tiledsl.codegen.render is not in this build yet (the lead enables it)")


def identifiers(module_text: str) -> set[str]:
    """Every name the module binds or reads (not strings, not comments); a SyntaxError fails the test."""
    names = set()
    for node in pyast.walk(pyast.parse(module_text)):
        if isinstance(node, pyast.Name):
            names.add(node.id)
        elif isinstance(node, pyast.arg):
            names.add(node.arg)
        elif isinstance(node, (pyast.FunctionDef, pyast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, pyast.alias):
            names.add(node.asname or node.name.split(".")[0])
    return names


def renamed(old: str, new: str) -> str:
    """copy.tds with one of its names replaced everywhere but in the comments and the header."""
    code = [line.split("#")[0] for line in COPY.split("\n") if not line.startswith("#")]
    return "\n".join(re.sub(rf"\b{old}\b", new, line) if not line.startswith("program") else line
                     for line in code)


# Names the generated module used for itself when these tests were written; a user name equal to one of
# them shadows it (`sync.wait` on a tensor) or repeats an argument (a SyntaxError). The generated code
# should mangle user names or use only `tds_`-prefixed names of its own (the parser reserves `tds_`).
# Names the generated code once took for itself; it now prefixes its own names with tds_ (refused in
# .tds programs), so each of these must be accepted and never collide.
CLASHING_BEFORE = {"program", "programs", "epoch", "t", "sync", "launch", "itertools", "sys", "pid", "inst", "part",
                   "diag", "max_spins", "TENSORS", "FAMILIES", "infer_params", "tile_cp", "a"}
CLASHING_NOW: set = set()
ACCEPTED = ["exec", "eval", "compile", "open", "print", "input", "getattr", "globals", "os", "subprocess", "self",
            "cls", "builtins", "importlib", "range", "len", "int", "float", *sorted(CLASHING_BEFORE)]


@needs_codegen
@pytest.mark.parametrize("position, old", [("in tensor", "X"), ("out tensor", "Y"), ("param", "N"),
                                           ("const", "BLOCK"), ("index", "i")])
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(
    n in CLASHING_NOW, strict=True, reason="codegen uses this name for itself")) for n in ACCEPTED])
def test_accepted_names_never_stand_in_for_generated_ones(position, old, name):
    own = identifiers(run(renamed(old, "Qz"), until="module").module) - {"Qz"}
    try:
        text = run(renamed(old, name), until="module").module
    except TdsError:
        return  # refused with a diagnostic: fine too
    used = identifiers(text)  # compiles, or this raises SyntaxError (e.g. a repeated argument)
    assert name not in used or name not in own, f"'{name}' ({position}) is also a name of the generated code"


@needs_codegen
def test_a_path_with_quotes_only_changes_string_constants(tmp_path):
    """The .tds path is quoted into the module's header and `where=` strings: with quotes and a
    would-be statement in it, the module has the same statements as with a plain path."""
    plain = tmp_path / "copy.tds"
    hostile = tmp_path / "x'); import os; (\"\"\"'" / "copy.tds"
    hostile.parent.mkdir()
    for path in (plain, hostile):
        path.write_text(COPY)

    def shape(path):
        tree = pyast.parse(run(path, until="module").module)
        for node in pyast.walk(tree):
            if isinstance(node, pyast.Constant) and isinstance(node.value, str):
                node.value = ""
        return pyast.dump(tree)

    assert shape(hostile) == shape(plain)


@needs_codegen
def test_comments_are_never_code_in_the_generated_module():
    """Quotes, brackets and template syntax in a comment stay inert: same statements as without it."""
    noisy = COPY.replace("X[i*BLOCK : +BLOCK]\n", "X[i*BLOCK : +BLOCK]  # \"\"\" ''' {{ 7*7 }} {% if x %} \\\n", 1)
    assert noisy != COPY
    plain_tree, noisy_text = run(COPY, until="module").module, run(noisy, until="module").module
    assert "49" not in noisy_text
    assert pyast.dump(pyast.parse(noisy_text)) == pyast.dump(pyast.parse(plain_tree))
