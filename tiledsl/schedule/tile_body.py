"""What a tile computes, from its body's statements: stores into tensors, local names, and one loop
whose steps may wait and whose state is carried from step to step.

Names follow Python: `x = value` binds x (again, if it was bound), a read sees the latest binding. A
name bound before the loop and rebound in it is the loop's carried state: its first binding is the
initial value, its binding at the end of a step the next step's, and after the loop it holds the last
step's (an empty loop leaves the initial value). A name bound to an integer size expression (`at =
i*BM + rank*P`) is a size: slices, the loop's extent and waits may use it. Stores come before or after
the loop, never in it; a step's `wait` comes before anything the step reads."""
from __future__ import annotations

import sympy

from tiledsl.grammar import ast
from tiledsl.grammar.parser import RESERVED, identifier_problem
from tiledsl.schedule import ir
from tiledsl.schedule.values import INTEGER, integral, same, shape_text


# generated bodies, seed 1782: a block's `range = 0` shadowed the Python built-in its kernel's loops call
_BUILT_IN = "'{}' is a built-in name (the language's, or a Python built-in the kernel calls); a tile's block cannot bind it"


class TileBody:
    """Builds one tile family from its declaration (`ValueBuilder.tile`)."""

    def __init__(self, values, decl: ast.TileDecl, scope):
        self.v, self.b, self.decl = values, values.b, decl
        self.scope = scope
        self.carried = _carried_names(decl.body)
        self.statements: list = []      # ir statements, in order
        self.accesses: list = []        # (region, write, phase)
        self.loops: dict = {}           # reduction variables (`s` of sum(... for s in world))
        self.loop_vars: set = set()
        self.waits: list = []           # (ast.Dep, scope, loop variable): edges the builder resolves
        self.step_locals: set[str] = set()
        self.size_names: set[str] = set()
        self.stepping: tuple | None = None   # (variable, extent) while the loop's body is built

    # ---- statements ---------------------------------------------------------------------------------
    def build(self, space, engine) -> ir.Family:
        self.v.locals, self.v.gone = {}, {}
        phase = ir.Phase.ENTRY
        for statement in self.decl.body:
            if isinstance(statement, ast.For):
                if any(isinstance(s, ir.Loop) for s in self.statements):
                    self.b.fail("a tile has one loop", statement.span,
                                hint="a second loop, or one inside another, is not supported yet")
                    continue
                self.loop(statement)
                phase = ir.Phase.EXIT
            elif isinstance(statement, ast.Wait):
                self.b.fail("`wait` waits at a step of a loop; a tile waits before it starts through an edge "
                            "declaration", statement.span,
                            hint=f"{self.decl.name.id}[{', '.join(v.name.id for v in self.decl.indices)}] "
                                 "after producer[...]")
            else:
                self.assign(statement, phase, self.statements)
        stores = tuple(s for s in self.statements if isinstance(s, ir.Store))
        body = tuple(self.statements) if any(not isinstance(s, ir.Store) for s in self.statements) else ()
        reads = [r for r, write, _ in self.accesses if not write]
        writes = [r for r, write, _ in self.accesses if write]
        phases = ()
        if any(isinstance(s, ir.Loop) for s in body):
            phases = tuple(p for _, write, p in self.accesses if not write) + \
                tuple(p for _, write, p in self.accesses if write)
        self.v.locals, self.v.gone = {}, {}
        return ir.Family(self.decl.name.id, ir.Kind.TILE, space, engine, tuple(reads), tuple(writes),
                         stores=stores, span=self.decl.span, loops=tuple(self.loops.items()), body=body,
                         phases=phases)

    def assign(self, assign: ast.Assign, phase: ir.Phase, out: list) -> None:
        target = assign.target
        if isinstance(target, ast.Name) and target.id not in self.b.tensors:
            self.bind(target, assign, phase, out)
            return
        if phase is ir.Phase.STEP:
            self.b.fail("a tile stores before or after its loop, not in it", assign.span,
                        hint="carry the value across the loop and store it after")
            return
        reads: list = []  # a region written through an index (`Y[ids[...], :]`) reads the index
        region = self.v.region(target, self.scope, writing=True, reads=reads)
        built = self.v.value(assign.value, self.scope, reads, self.loops)
        if region is None or built is None:
            return
        value, shape, dtype = built
        if not self.v.routed(assign.value.span, value, region) or not self.v.fits(shape, region, assign.span):
            return
        count = self.v.count_read(region)
        if count is not None:  # the instance reads the count to know which of its rows are valid
            reads.append(count)
        self.record(reads, phase)
        self.accesses.append((region, True, phase))
        out.append(ir.Store(region, value, dtype, region.shape))

    def bind(self, name: ast.Name, assign: ast.Assign, phase: ir.Phase, out: list) -> None:
        """`name = value`: a size where the value is an integer expression of sizes (never for carried
        state), else a value named in the tile."""
        if not self.bindable(name):
            return
        reads: list = []
        built = self.v.value(assign.value, self.scope, reads, self.loops)
        if built is None:
            return
        value, shape, dtype = built
        if not self.v.routed(assign.value.span, value, None):
            return
        if phase is ir.Phase.STEP:
            self.step_locals.add(name.id)
        if isinstance(value, ir.Scalar) and not isinstance(value.value, float) and integral(dtype) \
                and name.id not in self.carried and name.id not in self.v.locals:
            self.size(name, sympy.sympify(value.value), out)
            return
        if self.scope.lookup(name.id) is not None and name.id not in self.v.locals:
            self.b.fail(f"'{name.id}' names a size here and cannot also name a value", name.span,
                        hint="give the value another name")
            return
        self.record(reads, phase)
        self.v.locals[name.id] = (shape, dtype)
        out.append(ir.Let(name.id, value, shape, dtype))

    def size(self, name: ast.Name, value: sympy.Expr, out: list) -> None:
        """A size name: one that depends on the instance or the step is kept as a symbol (the kernel
        computes it once, and generated code reads like the program); one of sizes alone is its value."""
        if name.id in self.size_names:
            self.b.fail(f"'{name.id}' is already a size of this tile; a size name is bound once", name.span,
                        hint="give it another name")
            return
        self.size_names.add(name.id)
        instance = set(self.scope.indices.values()) | self.loop_vars | {ir.RANK}
        if not value.free_symbols & instance:
            self.scope = self.scope.child(**{name.id: value})
            return
        symbol = sympy.Symbol(name.id, integer=True, nonnegative=True) if self.nonnegative(value) else \
            sympy.Symbol(name.id, integer=True)
        self.scope = self.scope.child(**{name.id: symbol})
        out.append(ir.SizeLet(symbol, value))

    def nonnegative(self, value: sympy.Expr) -> bool:
        """Whether a size is never negative, knowing rank < world and the loop's variable below its
        extent: then the kernel floors its divisions with plain `//` (tiledsl/schedule/intcode.py)."""
        spare = sympy.Symbol("tds_spare", integer=True, nonnegative=True)
        probe = value.xreplace({ir.WORLD: ir.RANK + 1 + spare})
        if self.stepping is not None:
            rest = sympy.Symbol("tds_rest", integer=True, nonnegative=True)
            probe = probe.xreplace({self.stepping[0]: self.stepping[1] - 1 - rest})
        return bool(probe.is_nonnegative)

    def bindable(self, name: ast.Name) -> bool:
        problem = identifier_problem(name.id)  # a block's names are Python names in the kernel
        if problem is not None:
            self.b.fail(problem, name.span)
            return False
        if name.id in self.b.sizes or name.id in ("rank", "inf") or name.id in self.b.declared:
            what = "a tensor" if name.id in self.b.tensors else "a size" if name.id in self.b.sizes else \
                "built in" if name.id in ("rank", "inf") else "declared in the program"
            self.b.fail(f"'{name.id}' is {what}; a tile's block binds names of its own", name.span)
            return False
        if name.id in RESERVED:
            self.b.fail(_BUILT_IN.format(name.id), name.span)
            return False
        if name.id in {v.name.id for v in self.decl.indices} or name.id in {str(v) for v in self.loop_vars}:
            self.b.fail(f"'{name.id}' is an index here and cannot be rebound", name.span)
            return False
        return True

    def record(self, reads: list, phase: ir.Phase) -> None:
        self.accesses.extend((region, False, phase) for region in reads)

    # ---- the loop ---------------------------------------------------------------------------------
    def loop(self, statement: ast.For) -> None:
        """The tile's loop, whose steps are the nodes its waits attach to."""
        missing = [n for n in self.carried if n not in self.v.locals]
        for n in missing:  # rebound in the loop but never bound before it: a step's own name
            self.carried.discard(n)
        built = self.carrying(statement, self.carried, self.steps, stepped=True)
        if built is not None:
            self.statements.append(built)
        self.v.gone = {n: f"'{n}' is bound in the loop's steps; after the loop only names bound before it "
                          "(carried) hold a value" for n in self.step_locals - set(self.v.locals)}

    def inner(self, statement: ast.For, out: list) -> None:
        """A loop inside a step of the tile's loop: no waits (its accesses happen at the step's node,
        over all its values), its own carried state (names bound before it and rebound in it)."""
        carried = set(self.v.locals) & _bound(statement.body)
        before = set(self.v.locals)
        built = self.carrying(statement, carried, self.inner_steps, stepped=False)
        if built is not None:
            out.append(built)
            self.loops[built.var] = built.extent  # the step's accesses cover every value of its variable
        inside = _bound(statement.body) - before
        self.v.gone = {**self.v.gone, **{n: f"'{n}' is bound in the inner loop; after it only names bound "
                                            "before it (carried) hold a value" for n in inside}}

    def carrying(self, statement: ast.For, carried: set[str], build, stepped: bool) -> ir.Loop | None:
        """A loop and the state it carries, its body built by `build(statements, out)`."""
        extent = self.b.size(statement.extent, self.scope)
        name = statement.var.id
        problem = identifier_problem(name) or (_BUILT_IN.format(name) if name in RESERVED else None)
        if problem is not None:
            self.b.fail(problem, statement.var.span)
            return None
        if self.scope.lookup(name) is not None or name in self.v.locals or name in self.b.tensors:
            self.b.fail(f"loop variable '{name}' shadows another name", statement.var.span)
            return None
        if extent is None:
            return None
        var = ir.index_symbol(name)
        self.loop_vars.add(var)
        before_scope, before_locals, before_stepping = self.scope, dict(self.v.locals), self.stepping
        # Carried state may start as a scalar (`m = -inf`) and take its shape from its update: a first
        # pass, quiet, finds the shapes the updates give; the second, with them, is the one that counts.
        shapes = {n: before_locals[n] for n in carried}
        for attempt in range(2):
            quiet = attempt == 0
            mark = (len(self.b.diagnostics), self.b.failures, len(self.accesses), len(self.waits))
            sizes_before = set(self.size_names)
            self.scope = before_scope.child(**{name: var})
            if stepped:
                self.stepping = (var, extent)
            self.v.locals = {**before_locals, **shapes}
            body: list = []
            build(statement.body, body)
            updated = {n: self.v.locals[n] for n in carried if n in self.v.locals}
            if quiet:
                self.size_names = sizes_before
                del self.b.diagnostics[mark[0]:]
                self.b.failures = mark[1]
                del self.accesses[mark[2]:]
                del self.waits[mark[3]:]
                shapes = {n: (_wider(shapes[n][0], updated[n][0]), updated[n][1]) for n in updated}
        state = []
        for n in sorted(carried):
            start, end = before_locals[n], self.v.locals[n]
            if not (len(start[0]) == 0 or _same_shape(start[0], end[0])) or not _same_shape(shapes[n][0], end[0]):
                self.b.fail(f"'{n}' is carried across the loop, but it starts with shape {shape_text(start[0])} "
                            f"and the loop rebinds it with shape {shape_text(end[0])}", statement.span,
                            hint="a carried value keeps one shape (a scalar start is broadcast to it)")
            state.append(ir.Carried(n, end[0], end[1], start[1] if start[1] != end[1] else ""))
        # after the loop: carried names hold their last value; the steps' own names are gone
        self.scope, self.stepping = before_scope, before_stepping
        self.v.locals = {**before_locals, **{c.name: (c.shape, c.dtype) for c in state}}
        return ir.Loop(var, extent, tuple(body), tuple(state), statement.span)

    def steps(self, statements, out: list) -> None:
        reading = False  # whether this step has read anything yet: its waits must come first
        for statement in statements:
            if isinstance(statement, ast.For):
                count = len(out)
                self.inner(statement, out)
                reading |= len(out) > count
            elif isinstance(statement, ast.Wait):
                if reading:
                    self.b.fail("a step waits before it reads anything: move `wait` up, above the values it "
                                "protects", statement.span)
                    continue
                self.waits.extend((dep, self.scope, self.stepping[0]) for dep in statement.deps)
            else:
                count = len(out)
                self.assign(statement, ir.Phase.STEP, out)
                reading |= any(not isinstance(s, ir.SizeLet) for s in out[count:])  # a size name reads nothing

    def inner_steps(self, statements, out: list) -> None:
        for statement in statements:
            if isinstance(statement, ast.For):
                self.b.fail("a loop two deep inside a tile's loop is not supported yet", statement.span)
            elif isinstance(statement, ast.Wait):
                self.b.fail("`wait` goes in a step of the tile's loop, not in a loop inside it", statement.span,
                            hint="wait at the top of the step, for everything the inner loop reads")
            else:
                self.assign(statement, ir.Phase.STEP, out)


def _carried_names(body) -> set[str]:
    """Names bound before the tile's loop and bound again in it."""
    before, carried = set(), set()
    for statement in body:
        if isinstance(statement, ast.For):
            carried |= before & _bound(statement.body)
            break
        if isinstance(statement, ast.Assign) and isinstance(statement.target, ast.Name):
            before.add(statement.target.id)
    return carried


def _bound(statements) -> set[str]:
    """Names the statements bind, in loops inside them too."""
    names = set()
    for s in statements:
        if isinstance(s, ast.Assign) and isinstance(s.target, ast.Name):
            names.add(s.target.id)
        elif isinstance(s, ast.For):
            names |= _bound(s.body)
    return names


def _same_shape(a, b) -> bool:
    return len(a) == len(b) and all(map(same, a, b))


def _wider(start, update):
    """The carried shape a first pass settles on: the update's (a scalar start broadcasts to it)."""
    return update if update else start


__all__ = ["TileBody", "INTEGER"]
