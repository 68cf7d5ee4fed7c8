"""From syntax tree to schedule graph: resolve names, turn sizes and index maps into sympy, give every
tile and chunk its regions and every value its shape and dtype. Mistakes are collected, not raised one
by one, so that a user sees all of them at once."""
from __future__ import annotations

import dataclasses
import difflib

import sympy

from tiledsl.diagnostics import Diagnostic, Note, TdsError, error
from tiledsl.grammar import ast
from tiledsl.schedule import ir
from tiledsl.schedule.values import ValueBuilder, same, shape_text
from tiledsl.tables import SPELLINGS

BUILTIN_SIZES = {"world": ir.WORLD, "nodes": ir.NODES, "local_world": ir.LOCAL_WORLD}
# where a rank is known (families, edges, orders): this rank, and its node and place in the node
RANK_NAMES = {"rank": ir.RANK, "node": ir.NODE, "local_rank": ir.LOCAL_RANK}
MAX_ERRORS = 50


class _Scope:
    """The names an expression may use, with what they are. Inside a region's slices a tensor element
    may be read too (a device value): `elements` collects the regions read that way and `rows` the
    size of each gathered read (`ids[t*BT : +BT, k]`); elsewhere they are None and an element is refused."""

    def __init__(self, sizes: dict[str, sympy.Expr], indices: dict[str, sympy.Symbol] | None = None,
                 elements: list | None = None, rows: list | None = None):
        self.sizes = sizes
        self.indices = dict(indices or {})
        self.elements = elements
        self.rows = rows

    def child(self, /, **indices: sympy.Symbol) -> "_Scope":  # `/`: an index may be named `self`
        return _Scope(self.sizes, {**self.indices, **indices}, self.elements, self.rows)

    def reading(self) -> "_Scope":
        """This scope, collecting the tensor elements its expressions read."""
        return _Scope(self.sizes, self.indices, [], [])

    def plain(self) -> "_Scope":
        """This scope, with no tensor elements allowed."""
        return _Scope(self.sizes, self.indices)

    def lookup(self, name: str) -> sympy.Expr | None:
        if name in self.indices:
            return self.indices[name]
        return self.sizes.get(name)

    def names(self) -> list[str]:
        return list(self.sizes) + list(self.indices)


class Builder:
    def __init__(self, program: ast.Program):
        self.program = program
        self.diagnostics: list[Diagnostic] = []
        self.failures = 0
        self.conditions: list[ir.Condition] = []
        self.declared: dict[str, ast.Span] = {}
        self.consts: dict[str, int] = {}
        self.tunables: dict[str, tuple[int, ...]] = {}
        self.sizes: dict[str, sympy.Expr] = dict(BUILTIN_SIZES)
        self.tensors: dict[str, ir.Tensor] = {}
        self.unbuilt: set[str] = set()  # tensors whose declaration has an error, reported there and only there
        self.lets: list[tuple[str, sympy.Expr]] = []
        self.values = ValueBuilder(self)
        self.spans_nodes = False  # a topology name was used
        # `wait` statements in tiles' loops: (tile, dep, scope, loop variable), edges once families exist
        self.pending_waits: list = []

    # ---- diagnostics ----------------------------------------------------------------------------
    def fail(self, message: str, span: ast.Span, hint: str | None = None, notes=()) -> None:
        self.failures += 1
        if len(self.diagnostics) < MAX_ERRORS:  # past that, more errors are noise (and slow to render)
            self.diagnostics.append(error(message, span, hint, tuple(notes)))

    def declare(self, name: ast.Name) -> bool:
        if name.id in self.declared:
            first = self.declared[name.id]
            self.fail(f"'{name.id}' is already declared", name.span,
                      notes=[Note(f"'{name.id}' was first declared here", first)])
            return False
        self.declared[name.id] = name.span
        return True

    def unknown(self, name: ast.Name, candidates) -> None:
        if name.id in self.unbuilt:
            return  # its declaration's error is reported: its uses would only repeat it
        guess = difflib.get_close_matches(name.id, list(candidates), n=1)
        self.fail(f"unknown name '{name.id}'", name.span, hint=f"did you mean '{guess[0]}'?" if guess else None)

    # ---- sizes ----------------------------------------------------------------------------------
    def size(self, expr: ast.Expr, scope: _Scope) -> sympy.Expr | None:
        """An integer expression. `/` floors where an index is involved; between sizes it must divide
        exactly, which becomes a launch-time condition unless sympy proves it."""
        if isinstance(expr, ast.Num):
            if isinstance(expr.value, float):
                self.fail("sizes and indices are integers", expr.span)
                return None
            return sympy.Integer(expr.value)
        if isinstance(expr, ast.Name):
            found = scope.lookup(expr.id)
            if found is not None and expr.id in ir.TOPOLOGY_NAMES:
                self.spans_nodes = True
            if found is None:
                if expr.id in self.tensors:
                    self.fail(f"'{expr.id}' is a tensor; a size or index is needed here", expr.span)
                else:
                    self.unknown(expr, scope.names())
            return found
        if isinstance(expr, ast.Neg):
            inner = self.size(expr.operand, scope)
            return None if inner is None else -inner
        if isinstance(expr, ast.BinOp):
            if expr.op == "@":
                self.fail("'@' (a matrix product) cannot appear in a size or index", expr.span)
                return None
            left, right = self.size(expr.left, scope), self.size(expr.right, scope)
            if left is None or right is None:
                return None
            if expr.op == "+":
                return left + right
            if expr.op == "-":
                return left - right
            if expr.op == "*":
                return left * right
            if right == 0:
                self.fail("division by zero", expr.span)
                return None
            if expr.op == "mod":
                return sympy.Mod(left, right)
            return self.divide(left, right, expr.span, scope)
        if isinstance(expr, ast.Call):
            return self.size_call(expr, scope)
        if isinstance(expr, ast.Subscript) and _tensor_name(expr.base) in self.tensors:
            if scope.elements is None:
                self.fail("a tensor element (a device value) may be read only in the slices of a tile or chunk: "
                          "as an index, a size or a rank", expr.span)
                return None
            return self.values.element(expr, scope)
        self.fail("expected a size or index expression", expr.span)
        return None

    def divide(self, left, right, span, scope) -> sympy.Expr:
        index_symbols = set(scope.indices.values()) | set(RANK_NAMES.values())
        if (left.free_symbols | right.free_symbols) & index_symbols:
            return sympy.floor(left / right)
        quotient = left / right
        if quotient.is_integer is not True:
            self.conditions.append(ir.Condition(
                sympy.Eq(sympy.Mod(left, right), 0), f"{left} must be divisible by {right}", span))
        return quotient

    def size_call(self, call: ast.Call, scope: _Scope) -> sympy.Expr | None:
        arity = {"cdiv": 2, "min": 2, "max": 2}
        if call.func not in arity:
            self.fail(f"unknown size function '{call.func}'", call.span, hint="sizes may use cdiv, min and max")
            return None
        if len(call.args) != arity[call.func]:
            self.fail(f"{call.func}() takes {arity[call.func]} arguments, not {len(call.args)}", call.span)
            return None
        args = [self.size(a, scope) for a in call.args]
        if any(a is None for a in args):
            return None
        if call.func == "cdiv":
            return sympy.ceiling(args[0] / args[1])
        return (sympy.Min if call.func == "min" else sympy.Max)(*args)

    def constant(self, expr: ast.Expr, scope: _Scope, what: str, of_consts: bool = False):
        """A positive integer known at compile time; with `of_consts`, an expression of consts too
        (its value is known once the program is built with its consts)."""
        value = self.size(expr, scope)
        if value is None:
            return None
        consts = {ir.size_symbol(name) for name in self.consts}
        if of_consts and not value.is_Integer and value.free_symbols <= consts:
            if int(value.subs({ir.size_symbol(k): v for k, v in self.consts.items()})) <= 0:
                self.fail(f"{what} must be positive", expr.span)
                return None
            return value
        if not value.is_Integer:
            self.fail(f"{what} must be known at compile time; this depends on {sorted(map(str, value.free_symbols))}",
                      expr.span, hint="consts are known at compile time" if of_consts else None)
            return None
        if int(value) <= 0:
            self.fail(f"{what} must be positive, not {int(value)}", expr.span)
            return None
        return int(value)

    # ---- declarations ---------------------------------------------------------------------------
    def run(self) -> ir.Schedule:
        program = self.program
        params: list[str] = []
        lets_scope = _Scope(self.sizes)
        for decl in program.decls:
            if isinstance(decl, ast.ParamDecl):
                for name in decl.names:
                    if self.declare(name):
                        params.append(name.id)
                        self.sizes[name.id] = ir.size_symbol(name.id)
            elif isinstance(decl, ast.ConstDecl):
                value = self.constant(decl.value, lets_scope, f"const {decl.name.id}")
                if self.declare(decl.name) and value is not None:
                    self.consts[decl.name.id] = value
                    self.sizes[decl.name.id] = ir.size_symbol(decl.name.id)
            elif isinstance(decl, ast.TuneDecl):
                choices = [self.constant(c, lets_scope, f"a choice of {decl.name.id}") for c in decl.choices]
                if self.declare(decl.name) and None not in choices:
                    self.tunables[decl.name.id] = tuple(choices)
                    self.consts[decl.name.id] = choices[0]
                    self.sizes[decl.name.id] = ir.size_symbol(decl.name.id)
            elif isinstance(decl, ast.LetDecl):
                value = self.size(decl.value, lets_scope)
                if self.declare(decl.name) and value is not None:
                    self.sizes[decl.name.id] = value
                    self.lets.append((decl.name.id, value))
            elif isinstance(decl, ast.RequireDecl):
                self.require(decl, lets_scope)
            elif isinstance(decl, ast.TensorDecl):
                self.tensor(decl, lets_scope)
        self.ragged(program)
        families: dict[str, ir.Family] = {}
        values = self.values
        for decl in program.decls:
            if isinstance(decl, (ast.ChunkDecl, ast.TileDecl)) and self.declare(decl.name):
                family = self.family(decl, values)
                if family is not None:
                    families[family.name] = family
        edges = [e for decl in program.of(ast.EdgeDecl) for e in self.edges(decl, families)]
        for tile, dep, scope, loop in self.pending_waits:
            if tile in families:
                edge = self.dep_edge(families[tile], dep, scope, families, loop)
                edges += [edge] if edge is not None else []
        for decl in program.of(ast.OrderDecl):
            self.order(decl, families)
        for decl in program.of(ast.PlaceDecl):
            self.place(decl, families)
        if self.diagnostics:
            raise TdsError(self.diagnostics, program.path, program.source)
        return ir.Schedule(program, tuple(params), dict(self.consts), dict(self.tunables), dict(self.tensors),
                           families, tuple(edges), tuple(self.conditions), tuple(self.lets), self.spans_nodes)

    def require(self, decl: ast.RequireDecl, scope: _Scope) -> None:
        """A launch condition stated by the program: refused now if it can never hold, kept otherwise."""
        left, right = self.size(decl.left, scope), self.size(decl.right, scope)
        if left is None or right is None:
            return
        relation = {"==": sympy.Eq, "!=": sympy.Ne, "<=": sympy.Le, ">=": sympy.Ge, "<": sympy.Lt,
                    ">": sympy.Gt}[decl.op](left, right)
        text = f"{left} {decl.op} {right}"
        if decl.span.end_line == decl.span.line:  # the condition as written, for the launch-time message
            line = self.program.source.splitlines()[decl.span.line - 1]
            text = line[decl.span.column - 1:decl.span.end_column - 1].removeprefix("require").strip() or text
        if relation is sympy.false:
            self.fail(f"'{text}' can never hold", decl.span)
        elif relation is not sympy.true:
            self.conditions.append(ir.Condition(relation, f"{text} is required", decl.span))

    def tensor(self, decl: ast.TensorDecl, scope: _Scope) -> None:
        dtype = SPELLINGS.get(decl.dtype.id)
        if dtype is None:
            guess = difflib.get_close_matches(decl.dtype.id, list(SPELLINGS), n=1)
            self.fail(f"unknown dtype '{decl.dtype.id}'", decl.dtype.span,
                      hint=f"did you mean '{guess[0]}'?" if guess else "dtypes: " + ", ".join(SPELLINGS))
        shape = [self.size(d, scope) for d in decl.shape]
        cap = None
        if decl.cap is not None:
            cap = self.size(decl.cap, scope)
            if dtype is not None and not dtype.startswith(("int", "uint")):
                self.fail(f"`cap` bounds counts: '{decl.name.id}' must be an integer tensor, not {dtype}",
                          decl.cap.span)
                cap = None
        if not self.declare(decl.name):
            return
        if dtype is None or None in shape:
            self.unbuilt.add(decl.name.id)
            return
        self.tensors[decl.name.id] = ir.Tensor(decl.name.id, ir.Role(decl.role), dtype, tuple(shape), decl.span,
                                               cap, decl.upto.id if decl.upto else None)

    def ragged(self, program: ast.Program) -> None:
        """`X : ...[d0, .., dn] upto count`: count is an integer tensor shaped like a prefix of X's
        dimensions, and X has a dimension after it (the one count bounds)."""
        for decl in program.of(ast.TensorDecl):
            tensor = self.tensors.get(decl.name.id)
            if decl.upto is None or tensor is None:
                continue
            count = self.tensors.get(decl.upto.id)
            if count is None:
                self.unknown(decl.upto, self.tensors)
            elif not count.dtype.startswith(("int", "uint")):
                self.fail(f"'{count.name}' gives '{tensor.name}' its valid rows: it must be an integer tensor",
                          decl.upto.span)
            elif len(count.shape) >= len(tensor.shape) or \
                    not all(map(same, count.shape, tensor.shape[:len(count.shape)])):
                self.fail(f"'{tensor.name}' {shape_text(tensor.shape)} cannot be valid up to '{count.name}' "
                          f"{shape_text(count.shape)}: its shape must be the first dimensions of "
                          f"'{tensor.name}', followed by the dimension it bounds", decl.upto.span)
            else:
                continue
            # reported: the rest of the build goes on without it, to report what else is wrong
            self.tensors[tensor.name] = dataclasses.replace(tensor, upto=None)

    def engine(self, engine: ast.Engine | None, kind: ir.Kind, scope: _Scope) -> ir.Engine | None:
        if engine is None:
            default = ir.EngineKind.SMS
            return ir.Engine(default, None if kind is ir.Kind.TILE else 4, ast.Span.none())
        try:
            engine_kind = ir.EngineKind(engine.kind.id)
        except ValueError:
            guess = difflib.get_close_matches(engine.kind.id, [k.value for k in ir.EngineKind], n=1)
            self.fail(f"unknown engine '{engine.kind.id}'", engine.kind.span,
                      hint=f"did you mean '{guess[0]}'?" if guess else "engines: copy_engine, sms(N), nvshmem(N)")
            return None
        if engine_kind is ir.EngineKind.COPY_ENGINE:
            if kind is ir.Kind.TILE:
                self.fail("tiles compute on SMs; the copy engine only copies", engine.span, hint="on sms(rest)")
                return None
            if engine.amount is not None:
                self.fail("the copy engine takes no program count", engine.amount.span)
            return ir.Engine(engine_kind, None, engine.span)
        if isinstance(engine.amount, ast.Name) and engine.amount.id == "rest":
            return ir.Engine(engine_kind, None, engine.span)
        if engine.amount is None:
            return ir.Engine(engine_kind, None if kind is ir.Kind.TILE else 1, engine.span)
        programs = self.constant(engine.amount, scope, "a program count", of_consts=True)
        return None if programs is None else ir.Engine(engine_kind, programs, engine.span)

    def index_space(self, indices, scope: _Scope):
        symbols, space = {}, []
        for var in indices:
            extent = self.size(var.extent, scope)
            if var.name.id in symbols or var.name.id in self.sizes:
                self.fail(f"index '{var.name.id}' shadows another name", var.name.span)
                continue
            symbols[var.name.id] = ir.index_symbol(var.name.id)
            rank = extent.free_symbols & set(RANK_NAMES.values()) if extent is not None else set()
            if rank:
                # signal slots and the checker's proof assume one index space on every rank
                name = min(map(str, rank))
                self.fail(f"an index space may not depend on `{name}`: every rank has the same indices",
                          var.extent.span, hint=f"let the body or an edge depend on {name} instead, or run the "
                                                f"family on some ranks only: `if {name} == 0` before its `:`")
            elif extent is not None:
                space.append((symbols[var.name.id], extent))
        return symbols, tuple(space)

    def family(self, decl, values: ValueBuilder) -> ir.Family | None:
        base = _Scope(self.sizes, RANK_NAMES)
        symbols, space = self.index_space(decl.indices, base)
        scope = base.child(**symbols)
        kind = ir.Kind.TILE if isinstance(decl, ast.TileDecl) else ir.Kind.CHUNK
        engine = self.engine(decl.engine, kind, scope)
        before = self.failures
        if kind is ir.Kind.CHUNK:
            family = values.chunk(decl, scope, space, engine)
        else:
            family = values.tile(decl, scope, space, engine)
        guard = self.guard(decl, base, engine)
        if self.failures > before or engine is None or family is None:
            return None
        return _replace(family, runs_on=guard) if guard is not sympy.true else family

    def guard(self, decl, scope: _Scope, engine: ir.Engine | None) -> sympy.Basic:
        """`if rank == root`: a condition on rank and sizes (not on the family's indices: an index space
        is the same on every rank). Instances exist only where it holds."""
        guard = decl.guard
        if guard is None:
            return sympy.true
        indices = {v.name.id for v in decl.indices}
        named = [n for n in _names(guard.left) + _names(guard.right) if n.id in indices]
        if named:
            self.fail(f"`if` chooses the ranks a family runs on; '{named[0].id}' is one of its indices",
                      named[0].span, hint="an index space is the same on every rank: give the index a smaller "
                                          "extent, or let an edge or the body depend on it")
            return sympy.true
        left, right = self.size(guard.left, scope), self.size(guard.right, scope)
        if left is None or right is None:
            return sympy.true
        holds = {"==": sympy.Eq, "!=": sympy.Ne, "<=": sympy.Le, ">=": sympy.Ge, "<": sympy.Lt,
                 ">": sympy.Gt}[guard.op](left, right)
        if holds is sympy.false:
            self.fail(f"'{decl.name.id}' runs on no rank: the condition never holds", guard.span)
        elif holds is sympy.true:
            return holds
        elif not holds.free_symbols & set(RANK_NAMES.values()):
            self.fail("`if` chooses the ranks a family runs on: the condition must name rank (or node, "
                      "local_rank)", guard.span, hint="a condition on sizes alone is a launch condition: `require`")
        elif engine is not None and engine.kind is ir.EngineKind.COPY_ENGINE:
            self.fail("a copy-engine chunk is issued by the host on every rank; on some ranks only, run it on SM "
                      "programs", guard.span, hint="on sms(4)")
        return holds

    # ---- edges, order, placement ----------------------------------------------------------------
    def edges(self, decl: ast.EdgeDecl, families: dict[str, ir.Family]) -> list[ir.Edge]:
        consumer = self.family_named(decl.consumer, families)
        if consumer is None:
            return []
        if len(decl.bound) != len(consumer.indices):
            self.fail(f"'{consumer.name}' has {len(consumer.indices)} indices, the edge names {len(decl.bound)}",
                      decl.consumer.span)
            return []
        renamed = {b.id: sym for b, (sym, _) in zip(decl.bound, consumer.indices)}
        scope = _Scope(self.sizes, {**RANK_NAMES, **renamed})
        out = [self.dep_edge(consumer, dep, scope, families) for dep in decl.deps]
        return [edge for edge in out if edge is not None]

    def dep_edge(self, consumer: ir.Family, dep: ast.Dep, scope: _Scope, families, loop=None) -> ir.Edge | None:
        """One producer side of an edge, its index map and rank in `scope` (with `loop`, a `wait` in the
        consumer's loop: the scope has the loop's variable and the size names bound before the wait)."""
        producer = self.family_named(dep.family, families)
        if producer is None:
            return None
        if len(dep.index) != len(producer.indices):
            self.fail(f"'{producer.name}' has {len(producer.indices)} indices, this names {len(dep.index)}",
                      dep.span)
            return None
        before = self.failures
        index_map = tuple(None if isinstance(i, ast.AllInstances) else self.size(i, scope) for i in dep.index)
        rank_var = rank_extent = None
        if isinstance(dep.ranks, ast.EveryRank):
            ranks, rank_expr = ir.RankSet.EVERY, None
        elif dep.ranks is None:
            ranks, rank_expr = ir.RankSet.LOCAL, None
        elif isinstance(dep.ranks, ast.RanksFor):
            ranks = ir.RankSet.SET
            rank_var, rank_expr, rank_extent = self.ranks_for(dep.ranks, scope)
        else:
            ranks, rank_expr = ir.RankSet.AT, self.size(dep.ranks, scope)
        if producer.name == consumer.name and loop is not None:
            self.fail("a family may only wait on its own instances before it starts", dep.span)
        if self.failures > before:
            return None
        return ir.Edge(consumer.name, producer.name, index_map, ranks, rank_expr, dep.span, rank_var, rank_extent,
                       loop)

    def ranks_for(self, ranks: ast.RanksFor, scope: _Scope):
        """`(s*local_world + local_rank for s in nodes)`: the variable, the rank over it, its extent."""
        if ranks.var.id in scope.indices or ranks.var.id in self.sizes:
            self.fail(f"'{ranks.var.id}' is already a name here", ranks.var.span)
            return None, None, None
        var = ir.index_symbol(ranks.var.id)
        extent = self.size(ranks.extent, scope)
        if extent is not None and extent.free_symbols - set(BUILTIN_SIZES.values()) - {
                ir.size_symbol(n) for n in self.consts}:
            # the plan loops over it in every waiting instance, as it loops over `every rank`
            self.fail("the ranks' extent must be known from the topology and consts alone", ranks.extent.span,
                      hint="nodes, local_world or world")
            return None, None, None
        return var, self.size(ranks.rank, scope.child(**{ranks.var.id: var})), extent

    def family_named(self, name: ast.Name, families: dict[str, ir.Family]) -> ir.Family | None:
        if name.id not in families:
            if name.id not in self.declared:
                self.unknown(name, families)
            elif name.id in self.tensors or name.id in self.sizes:
                self.fail(f"'{name.id}' is not a tile or chunk family", name.span)
            return None
        return families[name.id]

    def order(self, decl: ast.OrderDecl, families: dict[str, ir.Family]) -> None:
        family = self.family_named(decl.family, families)
        if family is None:
            return
        if family.order:
            self.fail(f"'{family.name}' already has an order", decl.span)
            return
        scope = _Scope(self.sizes, {**RANK_NAMES, **dict(zip(family.index_names, (s for s, _ in family.indices)))})
        keys = tuple(self.size(k, scope) for k in decl.keys)
        if None not in keys:
            families[family.name] = _replace(family, order=keys)

    def place(self, decl: ast.PlaceDecl, families: dict[str, ir.Family]) -> None:
        family = self.family_named(decl.family, families)
        if family is None:
            return
        engine = self.engine(decl.engine, family.kind, _Scope(self.sizes))
        if engine is not None and engine.kind is ir.EngineKind.COPY_ENGINE and family.runs_on is not sympy.true:
            self.fail("a copy-engine chunk is issued by the host on every rank; this one runs on some ranks only "
                      "(`if` at its declaration)", decl.engine.span, hint="on sms(4)")
        elif engine is not None:
            families[family.name] = _replace(family, engine=engine)


def _names(expr: ast.Expr) -> list[ast.Name]:
    """Every name an expression mentions, in order."""
    if isinstance(expr, ast.Name):
        return [expr]
    found = []
    for value in vars(expr).values():
        for item in value if isinstance(value, tuple) else (value,):
            if hasattr(item, "__dataclass_fields__") and not isinstance(item, ast.Span):
                found += _names(item)
    return found


def _tensor_name(base: ast.Expr) -> str | None:
    """The tensor a subscript reads: `ids` in `ids[t, k]` and in `sent@s[e]`."""
    if isinstance(base, ast.Peer):
        base = base.base
    return base.id if isinstance(base, ast.Name) else None


def _replace(family: ir.Family, **changes) -> ir.Family:
    import dataclasses
    return dataclasses.replace(family, **changes)


def build_schedule(program: ast.Program) -> ir.Schedule:
    """Resolve and type a parsed program; raise TdsError with every mistake found."""
    return Builder(program).run()


def at_consts(schedule: ir.Schedule, consts: dict[str, int]) -> ir.Schedule:
    """The schedule with the consts a build sets (`-D`, tiledsl.compile's keywords) in place of the
    program's values, so that the checker proves what is built: a `require` or a bound that holds at
    the defaults may not at these. Names that are no const are left to the lowering (build options
    such as TMA, or a mistake it names). A const must stay positive, but a switch (declared 0 or 1) may
    be set to 0."""
    given = {name: value for name, value in consts.items() if name in schedule.consts}
    if not given:
        return schedule
    declared = {decl.name.id: decl.name.span for decl in schedule.program.decls
                if isinstance(decl, (ast.ConstDecl, ast.TuneDecl))}
    # a const declared 0 or 1 is a switch (sp_ulysses' CAUSAL = 1, full attention at 0); any other a size
    switch = {name for name, value in schedule.consts.items() if value in (0, 1)}
    wrong = [error(f"{name} = {value} is set at build time, but a const must be a positive integer"
                   + (" (or 0, for a switch declared 0 or 1)" if name in switch else ""), declared[name])
             for name, value in given.items() if value < 0 or (value == 0 and name not in switch)]
    if wrong:
        raise TdsError(wrong, schedule.program.path, schedule.program.source)
    # kernel conditions derived at the old consts would be stale: the pipeline derives them after this
    return dataclasses.replace(schedule, consts={**schedule.consts, **given}, kernel_conditions=())
