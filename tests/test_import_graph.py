"""tiledsl's import graph stays a DAG of layers (issue 25): read with `ast` from every module under
tiledsl/, every import statement counted, those inside functions too (an import hidden in a function
is still a dependency; hiding one was how the old circle api -> pipeline -> codegen -> runtime -> api
stayed importable).

The layering enforced, lowest first; a package or module may import only from layers below its own
(and from itself):

   0  tables, topology, gpus, library, diagnostics, graph_parts, version, cache   facts, source positions,
      where files are kept: no tiledsl import
   1  grammar; runtime (what generated modules import); graph_matplotlib
   2  schedule
   3  codegen; graph
   4  pipeline
   5  api
   6  tiledsl (the package's __init__: compile and empty, through api inside the functions)
   7  tools (run, reference, expect, trace, build_arch: above the pipeline); collectives
   8  predict
   9  ops
  10  cli
  11  __main__

So grammar -> schedule -> codegen -> pipeline -> api -> tools (each imports the one before), and
codegen imports runtime, never the reverse: runtime may import tables, topology, gpus and cache only.

How an import is read: `from P import m`, m a module, imports P.m, not P (Python runs P's __init__
first whatever imports it; that is not a dependency of the importer on P's contents). So
tiledsl/__init__.py, which every import of tiledsl.* runs, must import nothing of tiledsl at its top.

No import goes against the layering. What a lower layer needs from a higher one travels as data: the
TMA row conditions the lowering decides reach the checker on the schedule (`Schedule.kernel_conditions`,
set by the pipeline from codegen/tma.py), not by schedule/meaning.py importing codegen.
Module cycles are refused too, but for two inside one package (ALLOWED_CYCLES: one recursive descent
written in several files; also checked for staleness).
Pure ast over ~90 files: well under a second."""
from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tiledsl"

LAYERS = [
    ("tables", "topology", "gpus", "library", "diagnostics", "graph_parts", "version", "cache"),
    ("grammar", "runtime", "graph_matplotlib"),
    ("schedule",),
    ("codegen", "graph"),
    ("pipeline",),
    ("api",),
    ("tiledsl",),
    ("tools", "collectives"),
    ("predict",),
    ("ops",),
    ("cli",),
    ("__main__",),
]
RUNTIME_MAY_IMPORT = {"runtime", "tables", "topology", "gpus", "cache"}
# module cycles inside one package, each one recursive descent written in several files
ALLOWED_CYCLES = {
    frozenset({"tiledsl.schedule.values", "tiledsl.schedule.tile_body"}):
        "the value builder hands a tile's body to TileBody, which builds it with the builder's helpers",
    frozenset({"tiledsl.codegen.body", "tiledsl.codegen.blocks", "tiledsl.codegen.device"}):
        "a tile's lowering (body.py) hands block tiles to blocks.py and device values to device.py, "
        "which lower them into body's statements",
}


def modules() -> dict[str, Path]:
    """Every module and package (a directory, with or without __init__.py) under tiledsl/, by name."""
    found = {"tiledsl": PACKAGE / "__init__.py"}
    for path in sorted(PACKAGE.rglob("*")):
        if "__pycache__" in path.parts or not (path.is_dir() or path.suffix == ".py"):
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            continue
        found[".".join(parts)] = path / "__init__.py" if path.is_dir() else path
    return found


def _known(name: str, known) -> str:
    while name not in known:
        name = name.rpartition(".")[0]
    return name


def imports(name: str, path: Path, known) -> list[tuple[int, bool, str]]:
    """(line, inside a function, imported module) for every import of a tiledsl module in `path`."""
    if not path.exists():  # a namespace package: nothing of its own
        return []
    is_package = path.name == "__init__.py"
    found = []

    def visit(statements, in_function: bool) -> None:
        for child in statements:  # imports are statements: only statement bodies are walked
            targets = []
            if isinstance(child, ast.Import):
                targets = [_known(a.name, known) for a in child.names if a.name.split(".")[0] == "tiledsl"]
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[:len(base) - (child.level - 1)]
                    source = ".".join(base + ([child.module] if child.module else []))
                else:
                    source = child.module or ""
                if source.split(".")[0] == "tiledsl":
                    targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else _known(source, known)
                               for a in child.names]
            found.extend((child.lineno, in_function, t) for t in dict.fromkeys(targets) if t != name)
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            for field in ("body", "orelse", "finalbody"):
                visit(getattr(child, field, ()), inner)
            for nested in [*getattr(child, "handlers", ()), *getattr(child, "cases", ())]:
                visit(nested.body, inner)

    visit(ast.parse(path.read_text(), filename=str(path)).body, False)
    return found


def unit(module: str) -> str:
    """The package or top-level module that `module` belongs to: tiledsl.codegen.tma -> codegen."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "tiledsl"


@functools.cache
def graph():
    known = modules()
    return known, {m: imports(m, p, known) for m, p in known.items()}


def test_every_unit_has_a_layer():
    known, _ = graph()
    layered = {u for layer in LAYERS for u in layer}
    assert {unit(m) for m in known} <= layered, sorted({unit(m) for m in known} - layered)


def test_runtime_imports_only_tables_topology_gpus_and_cache():
    """What generated modules import (tiledsl.runtime) imports nothing of the compiler or the tools."""
    known, edges = graph()
    wrong = [f"{m}:{line} imports {t}" for m, found in edges.items() if unit(m) == "runtime"
             for line, _, t in found if unit(t) not in RUNTIME_MAY_IMPORT]
    assert not wrong, "tiledsl.runtime imports above itself:\n" + "\n".join(wrong)


def test_the_package_init_imports_only_layer_0_at_its_top():
    """Every `import tiledsl.X` runs tiledsl/__init__.py first: at its top it must not load the compiler."""
    known, edges = graph()
    wrong = [f"tiledsl/__init__.py:{line} imports {t}" for line, inside, t in edges["tiledsl"]
             if not inside and unit(t) not in LAYERS[0]]
    assert not wrong, "\n".join(wrong)


def test_imports_go_down_the_layers():
    known, edges = graph()
    layer = {u: n for n, names in enumerate(LAYERS) for u in names}
    wrong = []
    for m, found in sorted(edges.items()):
        for line, _, t in found:
            if unit(t) == unit(m) or layer[unit(t)] < layer[unit(m)]:
                continue
            wrong.append(f"{known[m].relative_to(ROOT)}:{line}: {m} (layer {layer[unit(m)]}, {unit(m)}) imports "
                         f"{t} (layer {layer[unit(t)]}, {unit(t)})")
    assert not wrong, "imports against the layering (tests/test_import_graph.py's docstring):\n" + "\n".join(wrong)


def _cycles(nodes, edges) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def test_the_package_graph_has_no_cycle():
    known, edges = graph()
    between = defaultdict(set)
    where = {}
    for m, found in edges.items():
        for line, _, t in found:
            if unit(t) != unit(m):
                between[unit(m)].add(unit(t))
                where.setdefault((unit(m), unit(t)), f"{m}:{line} -> {t}")
    cycles = _cycles(sorted(between), between)
    shown = [" <-> ".join(c) + ": " + "; ".join(where[(a, b)] for a in c for b in c if (a, b) in where)
             for c in cycles]
    assert not cycles, "package-level import cycles:\n" + "\n".join(shown)


def test_the_module_graph_has_no_cycle_but_those_allowed():
    """Not only packages: no two modules import each other, directly or round a loop, functions included,
    but for ALLOWED_CYCLES, each inside one package."""
    known, edges = graph()
    targets = {m: {t for _, _, t in found} for m, found in edges.items()}
    found = _cycles(sorted(known), targets)
    assert all(len({unit(m) for m in c}) == 1 for c in ALLOWED_CYCLES)
    cycles = [c for c in found if frozenset(c) not in ALLOWED_CYCLES]
    shown = []
    for c in cycles:
        inside = set(c)
        shown.append(", ".join(c) + "\n    " + "\n    ".join(
            f"{m}:{line} -> {t}" for m in c for line, _, t in edges[m] if t in inside))
    assert not cycles, "module import cycles:\n" + "\n".join(shown)
    stale = set(ALLOWED_CYCLES) - {frozenset(c) for c in found}
    assert not stale, f"allowed cycles no longer present, remove them from ALLOWED_CYCLES: {stale}"
