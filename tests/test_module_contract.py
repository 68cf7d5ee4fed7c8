"""A generated module's contract with the runtime and the tools is one object, its `tds_SPEC`
(runtime/specs.py: ProgramSpec), and the `tds_load` that binds it to a rank: nothing outside code
generation reads another of the module's names, and the module assigns no other global for it to read."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tiledsl.api import build_module
from tiledsl.pipeline import run
from tiledsl.runtime.specs import ProgramSpec, spec_of

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tiledsl"
CONTRACT = {"tds_SPEC", "tds_load"}
PROGRAMS = ["copy", "ag_gemm", "gemm_rs_ce", "moe_dispatch", "hier_allgather"]


def _module_names_read(tree: ast.AST) -> set[str]:
    """The `tds_` names read off an object: `x.tds_X`, `getattr(x, "tds_X")`, `getattr(x, f"tds_{...}")`."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("tds_"):
            found.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and len(node.args) >= 2:
            name = node.args[1]
            text = name.value if isinstance(name, ast.Constant) else \
                name.values[0].value if isinstance(name, ast.JoinedStr) and isinstance(name.values[0], ast.Constant) \
                else None
            if text is not None and text.startswith("tds_"):
                found.add(ast.unparse(name))
    return found


def test_nothing_outside_code_generation_reads_a_module_global_but_its_spec_and_its_load():
    readers = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if PACKAGE / "codegen" in path.parents:
            continue
        names = _module_names_read(ast.parse(path.read_text()))
        if names - CONTRACT:
            readers[str(path.relative_to(ROOT))] = sorted(names - CONTRACT)
    assert readers == {}


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_generated_module_assigns_only_its_spec(name):
    """Its other top-level names are imports and functions (kernels, host functions) the spec holds."""
    source = (ROOT / "programs" / f"{name}.tds").read_text()
    tree = ast.parse(run(source).module)
    assigned = [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets]
    assert assigned == ["tds_SPEC"]
    module = build_module(source)
    spec = spec_of(module)
    assert isinstance(spec, ProgramSpec)
    assert spec.kernel is module.tds_kernel
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    held = {f.__name__ for f in (spec.infer_params, spec.tensor_shapes, spec.conditions, spec.counts, spec.blocks,
                                 spec.orders, *spec.views.values(), *spec.waits.values())}
    host = {f for f in functions if not f.startswith(("tds_tile_", "tds_chunk_", "tds_kernel", "tds_load"))}
    assert host <= held, sorted(host - held)


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_launch_gives_every_argument_of_a_launch_kind_by_its_kind(name):
    """RUN, ENTER, EXIT, TRACING, START and PROGRAMS come from `role_values` and the spread, by each
    argument's kind in the spec (aot.py and the launcher alike), never from its name: exactly the
    arguments of those kinds, each what its kind says."""
    from tiledsl.runtime import specs
    from tiledsl.runtime.specs import LAUNCHER_SET, Kind
    spec = spec_of(build_module((ROOT / "programs" / f"{name}.tds").read_text()))
    env = {"rank": 0, "world": 2, "nodes": 1, "local_world": 2, **spec.consts, **dict.fromkeys(spec.params, 256)}
    kernel = [f.name for f in spec.families if f.engine != "copy_engine"]
    run = set(kernel[:1])
    roles = specs.role_values(spec, run=run, enter=True, exit=False, tracing=True)
    spread = specs.spread(spec, spec.counts(env), 132)
    values = {**roles, **spread.values(spec)}
    assert set(values) == {a.name for a in spec.args if a.kind in LAUNCHER_SET}
    for arg in spec.args:
        expected = {Kind.RUN: arg.of in run, Kind.ENTER: True, Kind.EXIT: False, Kind.TRACING: True,
                    Kind.START: spread.start.get(arg.of), Kind.PROGRAMS: spread.programs.get(arg.of)}
        if arg.kind in LAUNCHER_SET:
            assert values[arg.name] == expected[arg.kind], arg
    # the families' ranges of programs follow one another, and the grid holds them all
    ranges = sorted((spread.start[f], spread.programs[f]) for f in kernel if f not in spread.shared)
    assert [a for a, _ in ranges[:1]] in ([], [0]) and all(a + n == b for (a, n), (b, _) in zip(ranges, ranges[1:]))
    assert spread.grid == sum(spread.fixed.values()) + (spread.rest if spread.shared else 0) <= 132
