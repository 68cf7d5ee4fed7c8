"""Module import graph of tiledsl: cycles (SCCs) and function-level imports.

`python bench/experiments/import_graph.py ROOT`: `from P import m`, m a module, counts as importing P.m
only (as tests/test_import_graph.py reads it; Python runs P's __init__ first whoever imports it).
With --as-at-7766f63 it also counts P (and a namespace package as its parent), as this script did up to
session 17: that way every `from tiledsl.runtime import x` read as importing tiledsl/__init__.py, and
`from tiledsl.ops import x` inside ops as a cycle with ops/__init__.py."""
import ast, sys, pathlib
old = "--as-at-7766f63" in sys.argv
root = pathlib.Path([a for a in sys.argv[1:] if not a.startswith("--")][0])
pkg = root / "tiledsl"
mods = {}
for p in pkg.rglob("*.py"):
    rel = p.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__": parts = parts[:-1]
    mods[".".join(parts)] = p
def resolve(mod, node, is_pkg):
    out = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = mod.split(".")
            base = base if is_pkg else base[:-1]
            base = base[:len(base) - (node.level - 1)]
            b = ".".join(base + ([node.module] if node.module else []))
        else:
            b = node.module
        if old:
            names = [b] + [b + "." + a.name for a in node.names]
        else:
            names = [b + "." + a.name if b + "." + a.name in mods else b for a in node.names]
    for n in names:
        if not n or not n.startswith("tiledsl"): continue
        while n and n not in mods: n = n.rpartition(".")[0]
        if n: out.append(n)
    return out
edges = {m: set() for m in mods}; inner = []
for m, p in mods.items():
    tree = ast.parse(p.read_text())
    is_pkg = p.name == "__init__.py"
    def walk(node, depth):
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, (ast.Import, ast.ImportFrom)):
                for t in resolve(m, ch, is_pkg):
                    if t != m: edges[m].add(t)
                    if depth: inner.append((m, ch.lineno, t))
            walk(ch, depth + isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)))
    walk(tree, 0)
# tarjan
idx = {}; low = {}; st = []; on = set(); sccs = []; c = [0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in edges[v]:
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        s = []
        while True:
            w = st.pop(); on.discard(w); s.append(w)
            if w == v: break
        sccs.append(s)
for v in mods:
    if v not in idx: sc(v)
big = [s for s in sccs if len(s) > 1]
print("modules", len(mods), "edges", sum(map(len, edges.values())))
print("cyclic SCCs", len(big), "sizes", sorted(map(len, big), reverse=True))
for s in big: print("  ", sorted(s))
print("function-level imports (statements x targets)", len(inner), "distinct statements", len({(m,l) for m,l,_ in inner}))
from collections import Counter
for m, n in Counter(m for m,_,_ in inner).most_common(): print("  ", m, n)
