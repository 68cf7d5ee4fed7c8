"""Regions and values: what a chunk copies and what a tile computes, with shapes and dtypes checked."""
from __future__ import annotations

import sympy

import difflib

from tiledsl.grammar import ast
from tiledsl.schedule import ir
from tiledsl.schedule.meaning import ragged_count
from tiledsl.tables import BINARY, COMPARISONS, FUNCTIONS, INTEGER_CLOSED, NAMED, SPELLINGS

INTEGER = "int32"  # the dtype of sizes, indices and masks' positions inside a tile
BOOL = "bool"      # of a comparison: only `where` takes it
FLOAT = "float32"  # of everything a tile computes


def same(a: sympy.Expr, b: sympy.Expr) -> bool:
    return a == b or sympy.simplify(a - b) == 0


def one(size) -> bool:
    """A dimension of size 1 as written (a row statistic's, `rows(n)`'s second): no algebra needed."""
    return sympy.sympify(size) == 1


def squeezed(shape) -> tuple:
    """A shape without its dimensions of size 1: [BM, 1] stores into a region of shape [BM]."""
    return tuple(d for d in shape if not one(d))


def integral(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def shape_text(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def growing(size: sympy.Expr, value) -> bool:
    """Whether `size` never shrinks as the device value grows: it appears only through sums, products by
    positive numbers or sizes, min, max and floor, never subtracted (checked on the expression's form)."""
    def polarity(e, sign: int) -> bool:
        if e == value:
            return sign > 0
        if value not in e.atoms(type(value)):
            return True
        if isinstance(e, (sympy.Add, sympy.Min, sympy.Max)):
            return all(polarity(a, sign) for a in e.args)
        if isinstance(e, sympy.floor):
            return polarity(e.args[0], sign)
        if isinstance(e, sympy.Mul):
            factors = [a for a in e.args if value not in a.atoms(type(value))]
            inner = [a for a in e.args if value in a.atoms(type(value))]
            coeff = sympy.Mul(*factors)
            if len(inner) != 1 or not (coeff.is_positive or coeff.is_negative):
                return False
            return polarity(inner[0], sign if coeff.is_positive else -sign)
        return False
    return polarity(sympy.sympify(size), 1)


def _routes(value) -> bool:
    """Whether a value holds a routing function anywhere."""
    if isinstance(value, ir.Route):
        return True
    if isinstance(value, ir.Map):
        return any(_routes(a) for a in value.args)
    if isinstance(value, ir.Reduce):
        return _routes(value.body)
    if isinstance(value, ir.Transpose):
        return _routes(value.value)
    return False


def _children(e):
    if isinstance(e, ast.BinOp):
        return (e.left, e.right)
    if isinstance(e, ast.Neg):
        return (e.operand,)
    if isinstance(e, ast.Call):
        return e.args
    return ()
class ValueBuilder:
    def __init__(self, builder):
        self.b = builder
        # the value names of the tile being built (tile_body.py binds them): name -> (shape, dtype)
        self.locals: dict[str, tuple[tuple, str]] = {}
        self.gone: dict[str, str] = {}  # names that no longer hold a value here, and why

    # ---- regions --------------------------------------------------------------------------------
    def region(self, expr: ast.Expr, scope, writing: bool = False, reads: list | None = None) -> ir.Region | None:
        """The region `expr` names. Its slices and rank may read tensor elements (device values): the
        regions they read are appended to `reads`."""
        outer = scope
        scope = scope.reading()
        found = self._region(expr, scope, writing)
        if found is None:
            return None
        found = self.device_valued(found, scope, expr)
        if found is not None and scope.elements:
            if reads is None or outer.elements is not None:
                self.b.fail("this region cannot read a tensor element here", expr.span)
                return None
            reads.extend(scope.elements)
        return found

    def _region(self, expr: ast.Expr, scope, writing: bool) -> ir.Region | None:
        base, slices, owner = expr, (), None
        if isinstance(expr, ast.Subscript):
            base, slices = expr.base, expr.slices
        if isinstance(base, ast.Peer):
            rank = base.rank.base if isinstance(base.rank, ast.Subscript) else base.rank
            if isinstance(rank, ast.Name) and rank.id in self.b.tensors:
                left = base.base.base if isinstance(base.base, ast.Subscript) else base.base
                left = left.id if isinstance(left, ast.Name) else "X"
                self.b.fail(f"'{left}@{rank.id}' with no blanks names rank {rank.id}'s copy of {left}, but "
                            f"'{rank.id}' is a tensor: a matrix product needs blanks around '@'", base.span,
                            hint=f"{left} @ {rank.id}")
                return None
            if isinstance(base.base, ast.Subscript):
                self.b.fail("a peer's copy is named before the slice: `X@r[a : b]`, not `X[a : b]@r`", base.span)
                return None
            owner = self.b.size(base.rank, scope)
            if owner is None:
                return None
            base = base.base
        if not isinstance(base, ast.Name):
            if isinstance(base, ast.Subscript) and isinstance(expr, ast.Subscript):
                self.b.fail("`X@r` (no blanks) names rank r's copy; a matrix product needs blanks: `A @ B`",
                            expr.span)
            else:
                self.b.fail("expected a tensor or a slice of one", expr.span)
            return None
        tensor = self.b.tensors.get(base.id)
        if tensor is None:
            if base.id in self.b.sizes or base.id in scope.indices:
                self.b.fail(f"'{base.id}' is a size, not a tensor", base.span)
            else:
                self.b.unknown(base, self.b.tensors)
            return None
        if owner is not None and tensor.role in (ir.Role.OUT, ir.Role.LOCAL):
            self.b.fail(f"'{tensor.name}' is `{tensor.role.value}`: only `symm` and `in` tensors have copies "
                        "that other ranks can reach", base.span, hint=f"declare it `symm {tensor.name} : ...`")
            return None
        if owner is not None and writing and tensor.role is not ir.Role.SYMM:
            self.b.fail(f"only `symm` tensors can be written on another rank, and '{tensor.name}' is "
                        f"`{tensor.role.value}`", base.span)
            return None
        if writing and tensor.role is ir.Role.IN:
            self.b.fail(f"'{tensor.name}' is an `in` tensor and cannot be written", base.span,
                        hint="declare it `inout` or `out`")
            return None
        if slices and len(slices) != len(tensor.shape):
            self.b.fail(f"'{tensor.name}' has {len(tensor.shape)} dimensions, the slice names {len(slices)}",
                        expr.span)
            return None
        dims = []
        for n, extent in enumerate(tensor.shape):
            dim = self.dim(slices[n], extent, scope) if slices else ir.Dim(sympy.Integer(0), extent, True)
            if dim is None:
                return None
            dims.append(dim)
        return ir.Region(tensor.name, owner, tuple(dims), expr.span)

    def device_valued(self, region: ir.Region, scope, expr) -> ir.Region | None:
        """Where device values may stand in a region, and its gathered rows. A size may read counts of a
        `cap`ped tensor, growing with each (the checker proves the region at capacity, the largest it
        gets); a point index and the rank may read elements of a gathered read (`ids[t*BT : +BT, k]`,
        one per row); a range's start may not (a box the checker can bound)."""
        rows = [size for size, _ in scope.rows]
        if rows and not all(same(r, rows[0]) for r in rows[1:]):
            self.b.fail(f"the gathered reads in this region have different lengths: {', '.join(map(str, rows))}",
                        expr.span)
            return None
        for dim in region.dims:
            for value in ir.device_values(dim.size):
                if ir.ROW in value.free_symbols:
                    self.b.fail("a size reads one element, not a gathered range", expr.span)
                    return None
                cap = self.b.tensors[ir.value_tensor(value)].cap
                if cap is None:
                    self.b.fail(f"a size read from '{ir.value_tensor(value)}' needs a bound: declare it with "
                                f"`cap C`", expr.span, hint="the checker proves the schedule at that capacity")
                    return None
                if not growing(dim.size, value):
                    self.b.fail(f"this size must grow with {ir.value_tensor(value)}[...] (sums, min and max of it, "
                                "never subtracted): the checker proves it at capacity", expr.span)
                    return None
            if dim.kept and ir.device_values(dim.start):
                self.b.fail("a range's start may not read a tensor element: use a point index (one per gathered "
                            "row) or a size", expr.span)
                return None
        gathered = {v for d in region.dims for v in ir.device_values(d.start)} | ir.device_values(region.owner)
        if rows and not any(ir.ROW in v.free_symbols for v in gathered):
            self.b.fail("a gathered read must index a point of this region", expr.span)
            return None
        return ir.Region(region.tensor, region.owner, region.dims, region.span, rows[0] if rows else None)

    def element(self, expr: ast.Subscript, scope) -> sympy.Expr | None:
        """`got[e, s]` (one element, the same for the whole region) or `ids[t*BT : +BT, k]` (a gathered
        read: one element per row) inside a region's slices: an application of the tensor's element
        function, whose region is recorded as read."""
        index = self._region(expr, scope.plain(), writing=False)
        if index is None:
            return None
        tensor = self.b.tensors[index.tensor]
        if not tensor.dtype.startswith(("int", "uint")):
            self.b.fail(f"'{tensor.name}' is {tensor.dtype}: only integer tensors can give sizes and indices",
                        expr.span)
            return None
        if tensor.role in (ir.Role.OUT, ir.Role.INOUT, ir.Role.LOCAL) and index.owner is not None:
            self.b.fail(f"'{tensor.name}' is `{tensor.role.value}`: its elements cannot be read on another rank",
                        expr.span)
            return None
        kept = [d for d in index.dims if d.kept]
        if len(kept) > 1:
            self.b.fail("a gathered read takes one range of the index tensor (one element per row)", expr.span)
            return None
        args = []
        for dim in index.dims:
            args.append(dim.start + ir.ROW if dim.kept else dim.start)
        if kept:
            scope.rows.append((kept[0].size, expr.span))
        scope.elements.append(index)
        owner = index.owner if index.owner is not None else ir.RANK
        return ir.element(tensor.name)(owner, *args)

    def dim(self, piece, extent, scope) -> ir.Dim | None:
        if isinstance(piece, ast.Index):
            at = self.b.size(piece.at, scope)
            return None if at is None else ir.Dim(at, sympy.Integer(1), False)
        start = sympy.Integer(0) if piece.start is None else self.b.size(piece.start, scope)
        if start is None:
            return None
        if piece.size is not None:
            size = self.b.size(piece.size, scope)
        elif piece.stop is not None:
            stop = self.b.size(piece.stop, scope)
            size = None if stop is None else sympy.simplify(stop - start)
        else:
            size = extent
        if size is None:
            return None
        if size.is_number and size <= 0:
            self.b.fail(f"this slice is empty (size {size})", piece.span)
            return None
        static = size.subs({v: 0 for v in ir.device_values(size)})  # what the size is besides its device values
        if static.free_symbols & set(scope.indices.values()):
            self.b.fail("a slice's size may not depend on an index (all instances move the same shape)",
                        piece.span)
            return None
        return ir.Dim(start, size, True)

    # ---- chunks ---------------------------------------------------------------------------------
    def chunk(self, decl: ast.ChunkDecl, scope, space, engine) -> ir.Family | None:
        elements: list = []
        source = self.region(decl.source, scope, reads=elements)
        target = self.region(decl.target, scope, writing=True, reads=elements)
        split = 1 if decl.split is None else self.b.constant(decl.split, scope, "split", of_consts=True)
        if source is None or target is None or split is None:
            return None
        if len(source.shape) != len(target.shape) or not all(map(same, source.shape, target.shape)):
            self.b.fail(f"the chunk copies {shape_text(source.shape)} into {shape_text(target.shape)}", decl.span)
            return None
        src_t, dst_t = self.b.tensors[source.tensor], self.b.tensors[target.tensor]
        if source.rows is not None or target.rows is not None:
            self.b.fail("a chunk copies a box; gathered rows are read and written by tiles", decl.span)
            return None
        if dst_t.cap is not None and (src_t.cap is None or not same(src_t.cap, dst_t.cap)):
            self.b.fail(f"'{dst_t.name}' holds counts up to {dst_t.cap}: a chunk may copy into it only from a tensor "
                        f"with the same `cap`", decl.span, hint="a tile's store into it is checked instead")
            return None
        if src_t.dtype != dst_t.dtype:
            self.b.fail(f"the chunk copies {src_t.dtype} into {dst_t.dtype}; chunks do not convert", decl.span,
                        hint="convert in a tile")
            return None
        reduce = None
        if decl.reduce is not None:
            if decl.reduce.id != "add":
                self.b.fail(f"unknown reduction '{decl.reduce.id}'", decl.reduce.span, hint="reduce add")
                return None
            if engine is not None and engine.kind is not ir.EngineKind.SMS:
                self.b.fail("only SM programs can reduce into the target", decl.reduce.span, hint="on sms(N)")
                return None
            reduce = "add"
        if engine is not None and engine.kind is ir.EngineKind.NVSHMEM and target.owner is None and source.owner is None:
            self.b.fail("an nvshmem chunk puts data into another rank's copy (`X -> Y@r[...]`) or gets another "
                        "rank's copy into this rank's (`X@r[...] -> Y`)", decl.span)
            return None
        reads = tuple(dict.fromkeys(((source, target) if reduce else (source,)) + tuple(elements)))
        return ir.Family(decl.name.id, ir.Kind.CHUNK, space, engine, reads, (target,), reduce=reduce,
                         split=split, span=decl.span)

    # ---- tiles ----------------------------------------------------------------------------------
    def tile(self, decl: ast.TileDecl, scope, space, engine) -> ir.Family | None:
        from tiledsl.schedule.tile_body import TileBody
        body = TileBody(self, decl, scope)
        family = body.build(space, engine)
        self.b.pending_waits.extend((family.name, *wait) for wait in body.waits)
        return family

    def fits(self, shape, target: ir.Region, span) -> bool:
        """A value stores into a region of its shape (dimensions of size 1 aside); a scalar into any."""
        if not shape or (len(squeezed(shape)) == len(squeezed(target.shape))
                         and all(map(same, squeezed(shape), squeezed(target.shape)))):
            return True
        self.b.fail(f"the value has shape {shape_text(shape)} but its target "
                    f"'{target.tensor}' slice has {shape_text(target.shape)}", span)
        return False

    def count_read(self, target: ir.Region) -> ir.Region | None:
        """The count a store into a ragged region reads: the instance skips rows past it, so it reads the
        count to know whether it has valid rows (meaning.ragged_count says which count bounds the region)."""
        ragged = ragged_count(self.b.tensors, target)
        if ragged is None:
            return None
        count = self.b.tensors[ir.value_tensor(ragged[0])]
        return ir.Region(count.name, target.owner, tuple(
            ir.Dim(i, sympy.Integer(1), False) for i in ir.value_index(ragged[0])), target.span)

    def sized(self, expr: ast.Expr, scope) -> bool:
        """Whether an expression is a size: integer arithmetic (+ - * / mod, cdiv, min, max) of sizes,
        indices and the tile's size names, with a name in it (`1 / 3` is a value, a third)."""
        def walk(e) -> bool:
            if isinstance(e, ast.Num):
                return isinstance(e.value, int)
            if isinstance(e, ast.Name):
                return e.id not in self.locals and e.id not in self.b.tensors and scope.lookup(e.id) is not None
            if isinstance(e, ast.Neg):
                return walk(e.operand)
            if isinstance(e, ast.BinOp):
                return e.op != "@" and walk(e.left) and walk(e.right)
            if isinstance(e, ast.Call):
                return e.func in ("cdiv", "min", "max") and len(e.args) == 2 and all(map(walk, e.args))
            return False

        def named(e) -> bool:
            return isinstance(e, ast.Name) or any(named(c) for c in _children(e))
        return walk(expr) and named(expr)

    def value(self, expr: ast.Expr, scope, reads: list, loops: dict):
        """(Value, shape, dtype) of a tile expression, or None after reporting why."""
        if not isinstance(expr, ast.Name) and self.sized(expr, scope):
            size = self.b.size(expr, scope)
            return None if size is None else (ir.Scalar(size), (), INTEGER)
        if isinstance(expr, ast.Num):
            return ir.Scalar(expr.value), (), FLOAT if isinstance(expr.value, float) else INTEGER
        if isinstance(expr, ast.Name) and expr.id in self.locals:
            shape, dtype = self.locals[expr.id]
            return ir.Local(expr.id), shape, dtype
        if isinstance(expr, ast.Name) and expr.id in self.gone and scope.lookup(expr.id) is None:
            self.b.fail(self.gone[expr.id], expr.span)
            return None
        if isinstance(expr, ast.Name) and expr.id == "inf":
            return ir.Scalar(float("inf")), (), FLOAT
        if isinstance(expr, ast.Name) and expr.id not in self.b.tensors:
            size = self.b.size(expr, scope)
            return None if size is None else (ir.Scalar(size), (), INTEGER)
        if isinstance(expr, ast.Subscript) and isinstance(expr.base, ast.Call) and expr.base.func in ir.ROUTES:
            return self.route_part(expr, scope, reads, loops)
        if isinstance(expr, (ast.Name, ast.Subscript, ast.Peer)):
            region = self.region(expr, scope, reads=reads)
            if region is None:
                return None
            reads.append(region)
            return ir.Load(region), region.shape, self.b.tensors[region.tensor].dtype
        if isinstance(expr, ast.Neg):
            inner = self.value(expr.operand, scope, reads, loops)
            if inner is not None and isinstance(inner[0], ir.Scalar) and isinstance(inner[0].value, (int, float)):
                return ir.Scalar(-inner[0].value), (), inner[2]  # -inf, -1e30: a number, not a negation
            return None if inner is None else (ir.Map("neg", (inner[0],)), inner[1], inner[2])
        if isinstance(expr, ast.Transpose):
            inner = self.value(expr.operand, scope, reads, loops)
            if inner is None:
                return None
            if len(inner[1]) != 2:
                self.b.fail(f"'.T' transposes a 2-D value; this one has shape {shape_text(inner[1])}", expr.span)
                return None
            return ir.Transpose(inner[0]), (inner[1][1], inner[1][0]), inner[2]
        if isinstance(expr, ast.Compare):
            left = self.value(expr.left, scope, reads, loops)
            right = self.value(expr.right, scope, reads, loops)
            if left is None or right is None:
                return None
            shape = self.broadcast(left[1], right[1], expr.span)
            return None if shape is None else (ir.Map(BINARY[expr.op], (left[0], right[0])), shape, BOOL)
        if isinstance(expr, ast.BinOp):
            if expr.op == "mod":
                self.b.fail("'mod' applies to sizes and indices, not to tensor values", expr.span)
                return None
            left = self.value(expr.left, scope, reads, loops)
            right = self.value(expr.right, scope, reads, loops)
            if left is None or right is None:
                return None
            if expr.op == "@":
                return self.matmul(expr, left, right)
            shape = self.broadcast(left[1], right[1], expr.span)
            if shape is None or not self.numbers(expr.span, left, right):
                return None
            func = BINARY[expr.op]
            dtype = INTEGER if func in INTEGER_CLOSED and integral(left[2]) and integral(right[2]) else FLOAT
            return ir.Map(func, (left[0], right[0])), shape, dtype
        if isinstance(expr, ast.Call):
            return self.call(expr, scope, reads, loops)
        if isinstance(expr, ast.RankSum):
            extent = self.b.size(expr.extent, scope)
            var = ir.index_symbol(expr.var.id)
            if extent is None:
                return None
            if expr.var.id in scope.indices:
                self.b.fail(f"'{expr.var.id}' is already an index here", expr.var.span)
                return None
            loops[var] = extent
            body = self.value(expr.body, scope.child(**{expr.var.id: var}), reads, loops)
            return None if body is None else (ir.Reduce(var, extent, body[0], expr.op), body[1], FLOAT)
        self.b.fail("expected a tensor value", expr.span)
        return None

    def numbers(self, span, *args) -> bool:
        """Arithmetic takes numbers: a comparison's booleans go only into `where`."""
        if any(a[2] == BOOL for a in args):
            self.b.fail("a comparison gives booleans, which only `where(condition, a, b)` takes", span)
            return False
        return True

    def matmul(self, expr: ast.BinOp, left, right):
        (a, sa, da), (b, sb, db) = left, right
        if len(sa) != 2 or len(sb) != 2:
            self.b.fail(f"'@' multiplies two matrices; its operands have shapes {shape_text(sa)} and "
                        f"{shape_text(sb)}", expr.span)
            return None
        if not same(sa[1], sb[0]):
            self.b.fail(f"the inner dimensions of '@' differ: {shape_text(sa)} @ {shape_text(sb)}", expr.span,
                        hint=f"{sa[1]} must equal {sb[0]}")
            return None
        if da != db:
            # tl.dot multiplies operands of one type: a computed float32 block against a bf16 slice would
            # be rounded silently on one side; the program says which
            self.b.fail(f"'@' multiplies {da} by {db}: its operands must have one dtype", expr.span,
                        hint=f"cast the {'left' if da == FLOAT else 'right'} one, e.g. "
                             f"{(db if da == FLOAT else da).replace('bfloat16', 'bf16')}(p) @ V[...]")
            return None
        if integral(da) or da == BOOL:
            self.b.fail(f"'@' multiplies floating-point values, not {da}", expr.span)
            return None
        return ir.MatMul(a, b), (sa[0], sb[1]), FLOAT

    def broadcast(self, sa, sb, span):
        """Trailing dimensions match, or one of them is 1 (a row statistic [m, 1] against [m, n]; a weight
        per row [BT, 1] against a block [BT, BH]), as in torch."""
        if not sa:
            return sb
        if not sb:
            return sa
        longer, shorter = (sa, sb) if len(sa) >= len(sb) else (sb, sa)
        tail = longer[len(longer) - len(shorter):]
        out = list(longer[:len(longer) - len(shorter)])
        for a, b in zip(tail, shorter):
            if one(b):
                out.append(a)
            elif one(a):  # before `same`: simplify is slow, and a size 1 against a symbol is no equality
                out.append(b)
            elif same(a, b):
                out.append(a)
            else:
                self.b.fail(f"shapes {shape_text(sa)} and {shape_text(sb)} do not match", span)
                return None
        return tuple(out)

    def route(self, call: ast.Call, scope, reads, loops):
        """histogram(ids, n) and arrival(ids, n): the routing of a region of ids to n groups."""
        if len(call.args) != 2:
            self.b.fail(f"{call.func}(ids, n) takes the ids and the number of groups", call.span)
            return None
        source = self.value(call.args[0], scope, reads, loops)
        bins = self.b.size(call.args[1], scope.plain())
        if source is None or bins is None:
            return None
        region = source[0].region if isinstance(source[0], ir.Load) else None
        if region is None or region.rows is not None or region.owner is not None \
                or not integral(self.b.tensors[region.tensor].dtype):
            self.b.fail(f"{call.func}() routes a slice of a local integer tensor", call.args[0].span)
            return None
        shape = (bins,) if call.func == "histogram" else source[1]
        return ir.Route(call.func, region, bins), shape, INTEGER

    def route_part(self, expr: ast.Subscript, scope, reads, loops):
        """`arrival(ids, n)[a : +m, :]`: a box of the arrival of the whole region (ir.Route.part)."""
        call = expr.base
        if call.func != "arrival":
            self.b.fail("only arrival() may be sliced: a part of the numbering of the whole region", expr.span)
            return None
        found = self.route(call, scope, reads, loops)
        if found is None:
            return None
        route, shape, dtype = found
        if len(expr.slices) != len(shape):
            self.b.fail(f"the arrival has {len(shape)} dimensions, the slice names {len(expr.slices)}", expr.span)
            return None
        part = []
        for piece, extent in zip(expr.slices, shape):
            dim = self.dim(piece, extent, scope.plain())
            if dim is None:
                return None
            if not dim.kept:
                self.b.fail("a part of an arrival keeps its dimensions: slice with `a : +m` or `:`", piece.span)
                return None
            part.append(dim)
        route = ir.Route(route.func, route.source, route.bins, tuple(part))
        return route, route.shape, dtype

    def routed(self, span, value, target: ir.Region | None) -> bool:
        """histogram() and arrival() are whole stores into integer tensors (`target` None: a value named
        in a tile's block, which they cannot be)."""
        if not _routes(value):
            return True
        if not isinstance(value, ir.Route) or target is None:
            self.b.fail("histogram() and arrival() are whole stores: `slot = arrival(ids, E)`", span)
            return False
        tensor = self.b.tensors[target.tensor]
        if not integral(tensor.dtype) or target.rows is not None or target.owner is not None:
            self.b.fail(f"{value.func}() stores into a box of a local integer tensor", target.span)
            return False
        return True

    def call(self, call: ast.Call, scope, reads, loops):
        func = call.func
        if func in ir.ROUTES:
            return self.route(call, scope, reads, loops)
        if func in ("rows", "cols"):
            return self.iota(call, scope)
        args = [self.value(a, scope, reads, loops) for a in call.args]
        if any(a is None for a in args):
            return None
        if func in SPELLINGS:
            if len(args) != 1:
                self.b.fail(f"the cast {func}() takes one argument", call.span)
                return None
            return ir.Map("cast:" + SPELLINGS[func], (args[0][0],)), args[0][1], SPELLINGS[func]
        function = NAMED.get(func)
        if function is None:
            known = sorted(list(NAMED) + list(SPELLINGS) + ["rows", "cols"])
            guess = difflib.get_close_matches(func, known, n=1)
            self.b.fail(f"unknown function '{func}'", call.span,
                        hint=f"did you mean '{guess[0]}'?" if guess else "functions: " + ", ".join(known))
            return None
        low, high = function.arity
        if not low <= len(args) <= high:
            count = str(low) if low == high else f"{low} to {high}"
            self.b.fail(f"{func}() takes {count} argument{'s' if high > 1 else ''}, not {len(args)}", call.span)
            return None
        if function.rows:
            x_shape, w_shape = args[0][1], args[1][1]
            if not x_shape or len(w_shape) != 1 or not same(w_shape[0], x_shape[-1]):
                self.b.fail(f"{func}(x, weight) needs weight of shape [{x_shape[-1] if x_shape else '?'}], "
                            f"got {shape_text(w_shape)}", call.span)
                return None
            return ir.Map(func, tuple(a[0] for a in args)), x_shape, "float32"
        if function.reduces:
            if len(args[0][1]) != 2 or not self.numbers(call.span, args[0]):
                if len(args[0][1]) != 2:
                    self.b.fail(f"{func}() reduces each row of a 2-D value; this one has shape "
                                f"{shape_text(args[0][1])}", call.span)
                return None
            return ir.Map(func, (args[0][0],), call.span), (args[0][1][0], sympy.Integer(1)), FLOAT
        if func == "where":
            if args[0][2] != BOOL:
                self.b.fail("where(condition, a, b) takes a comparison first: where(k <= q, s, -inf)", call.span)
                return None
            choices = args[1:]
        else:
            choices = args
        if not self.numbers(call.span, *choices):
            return None
        shape = args[0][1]
        for other in args[1:]:
            shape = None if shape is None else self.broadcast(shape, other[1], call.span)
        dtype = INTEGER if func in INTEGER_CLOSED and all(integral(a[2]) for a in choices) else FLOAT
        return None if shape is None else (ir.Map(func, tuple(a[0] for a in args)), shape, dtype)

    def iota(self, call: ast.Call, scope):
        """`rows(n)`: the column [n, 1] of 0 .. n-1; `cols(n)`: the row [1, n]."""
        if len(call.args) != 1:
            self.b.fail(f"{call.func}(n) takes one size", call.span)
            return None
        size = self.b.size(call.args[0], scope)
        if size is None:
            return None
        if size.free_symbols & set(scope.indices.values()):
            self.b.fail(f"{call.func}(n): n is a block's size, which may not depend on an index", call.span)
            return None
        axis = 0 if call.func == "rows" else 1
        shape = (size, sympy.Integer(1)) if axis == 0 else (sympy.Integer(1), size)
        return ir.Iota(size, axis), shape, INTEGER


def value_shape(value: ir.Value, names: dict) -> tuple:
    """The shape of an IR value, given the shapes of the tile's names: what the builder gave it (its
    operands broadcast, a row reduction [m, 1], a product [m, n]), for code generation to read back."""
    if isinstance(value, ir.Load):
        return value.region.shape
    if isinstance(value, ir.Scalar):
        return ()
    if isinstance(value, ir.Local):
        return tuple(names[value.name])
    if isinstance(value, ir.Iota):
        return (value.size, sympy.Integer(1)) if value.axis == 0 else (sympy.Integer(1), value.size)
    if isinstance(value, ir.Transpose):
        inner = value_shape(value.value, names)
        return (inner[1], inner[0])
    if isinstance(value, ir.MatMul):
        return (value_shape(value.left, names)[0], value_shape(value.right, names)[1])
    if isinstance(value, ir.Reduce):
        return value_shape(value.body, names)
    if not value.func.startswith("cast:") and FUNCTIONS[value.func].reduces:
        return (value_shape(value.args[0], names)[0], sympy.Integer(1))
    if not value.func.startswith("cast:") and FUNCTIONS[value.func].rows:
        return value_shape(value.args[0], names)
    shape: tuple = ()
    for arg in value.args:
        other = value_shape(arg, names)
        if len(other) > len(shape):
            shape, other = other, shape
        tail = shape[len(shape) - len(other):]
        merged = tuple(b if one(a) else a for a, b in zip(tail, other))
        shape = shape[:len(shape) - len(other)] + merged
    return shape
