"""The generated module of three programs, word for word (tests/codegen/golden/): a change to what the
compiler emits shows up here as a diff a person reads, and is accepted by regenerating the files with
`TILEDSL_UPDATE_GOLDEN=1 python -m pytest tests/codegen/test_golden.py`. Beside them, what every
generated module must be: lines a person can read, no scaffolding for degenerate cases."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tiledsl.pipeline import run

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
# a plain tile, a copy-engine gather feeding a product, and a product counted by the copy engine
# that sends rows to their owners, who reduce after waits on every rank
PROGRAMS = ["copy", "ag_gemm", "gemm_rs_ce"]
EVERY = sorted((ROOT / "programs").glob("*.tds")) + sorted((ROOT / "bench" / "experiments").glob("*.tds"))


def module(path: Path) -> str:
    return run(path.read_text(), path=os.fspath(path.relative_to(ROOT))).module


@pytest.mark.parametrize("name", PROGRAMS)
def test_generated_module_matches_its_golden_file(name):
    text = module(ROOT / "programs" / f"{name}.tds")
    golden = GOLDEN / f"{name}_tds.py"
    if os.environ.get("TILEDSL_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text(), f"regenerate with TILEDSL_UPDATE_GOLDEN=1 if the change is meant: {golden}"


@pytest.mark.parametrize("path", EVERY, ids=lambda p: p.stem)
def test_generated_lines_are_short_and_free_of_degenerate_scaffolding(path):
    text = module(path)
    long = [line for line in text.splitlines() if len(line) > 120]
    assert not long, long
    for pattern in (r"\* 1\b(?!\d)", r"\brange\(0, 1\)", r"\+ 0\b(?!\d)", r"// 1\b(?!\d)", r"\(\(\("):
        assert not re.search(pattern, text), (pattern, [line for line in text.splitlines() if re.search(pattern, line)])


@pytest.mark.parametrize("path", EVERY, ids=lambda p: p.stem)
def test_every_wait_and_notify_names_its_tds_line_and_passes_diagnostics_by_name(path):
    lines = module(path).splitlines()
    for n, line in enumerate(lines):
        if re.search(r"tds_sync\.wait(_shmem)?\(", line) and "tds_barrier" not in line:
            # the whole call, however many lines its arguments take
            end = next(k for k in range(n, len(lines)) if "\n".join(lines[n:k + 1]).count("(")
                       == "\n".join(lines[n:k + 1]).count(")"))
            block = "\n".join(lines[n:end + 1])
            assert "diag=tds_diag" in block and "edge=" in block and "instance=" in block, block
            above = next(lines[k] for k in range(n - 1, -1, -1) if lines[k].strip().startswith("# ")
                         and ".tds:" in lines[k])
            assert " after " in above or " wait " in above, (line, above)  # an edge, or a `wait` in a loop
        if "tds_sync.notify(tds_sig_" in line:
            above = next(lines[k] for k in range(n - 1, -1, -1) if ".tds:" in lines[k])
            assert above.strip().startswith("# for ") and (" after " in above or " wait " in above), (line, above)


def test_let_names_survive_into_the_kernel():
    text = module(ROOT / "programs" / "gemm_rs_ce.tds")
    assert "    Ms = M // world\n" in text  # the let, computed once at the top of the family that uses it
    assert "< Ms)" in text and "rank * Ms" in text


@pytest.mark.parametrize("path", EVERY, ids=lambda p: p.stem)
def test_one_kernel_interface_gives_the_signature_and_each_family_only_what_it_reads(path):
    """tds_ARGS is the kernel's signature; each family's parameters are kernel arguments (or the
    epoch the kernel hands down) and every one of them is used in the family's body."""
    import ast
    text = module(path)
    tree = ast.parse(text)
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    namespace: dict = {}
    exec(compile(ast.Module([n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom, ast.Assign))
                             and (not isinstance(n, ast.Assign) or n.targets[0].id == "tds_ARGS")], []),
                 "<module>", "exec"), namespace)
    names = [a.name for a in namespace["tds_ARGS"]]
    assert [a.arg for a in functions["tds_kernel"].args.args] == names
    for name, function in functions.items():
        if not name.startswith(("tds_tile_", "tds_chunk_")):
            continue
        params = [a.arg for a in function.args.args]
        assert set(params) <= set(names) | {"tds_program", "tds_programs", "tds_epoch"}, (name, params)
        used = {n.id for n in ast.walk(ast.Module(function.body, [])) if isinstance(n, ast.Name)}
        assert set(params) <= used, (name, sorted(set(params) - used))
