"""Regions and values: what a chunk copies and what a tile computes, with shapes and dtypes checked."""
from __future__ import annotations

import sympy

import difflib

from tiledsl.grammar import ast
from tiledsl.schedule import ir
from tiledsl.schedule.meaning import ragged_count
from tiledsl.tables import BINARY, NAMED, SPELLINGS


def same(a: sympy.Expr, b: sympy.Expr) -> bool:
    return a == b or sympy.simplify(a - b) == 0


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
    return False


class ValueBuilder:
    def __init__(self, builder):
        self.b = builder

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
        split = 1 if decl.split is None else self.b.constant(decl.split, scope, "split")
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
        if engine is not None and engine.kind is ir.EngineKind.NVSHMEM and target.owner is None:
            self.b.fail("an nvshmem put writes another rank's copy: the target must be `X@r[...]`", decl.span)
            return None
        reads = tuple(dict.fromkeys(((source, target) if reduce else (source,)) + tuple(elements)))
        return ir.Family(decl.name.id, ir.Kind.CHUNK, space, engine, reads, (target,), reduce=reduce,
                         split=split, span=decl.span)

    # ---- tiles ----------------------------------------------------------------------------------
    def tile(self, decl: ast.TileDecl, scope, space, engine) -> ir.Family | None:
        stores, reads, loops = [], [], {}
        for assign in decl.body:
            target = self.region(assign.target, scope, writing=True, reads=reads)
            built = self.value(assign.value, scope, reads, loops)
            if target is None or built is None:
                continue
            value, shape, dtype = built
            if not self.routed(assign, value, target, len(decl.body)):
                continue
            if shape and not (len(shape) == len(target.shape) and all(map(same, shape, target.shape))):
                self.b.fail(f"the value has shape {shape_text(shape)} but its target "
                            f"'{target.tensor}' slice has {shape_text(target.shape)}", assign.span)
                continue
            stores.append(ir.Store(target, value, dtype, target.shape))
            ragged = ragged_count(self.b.tensors, target)
            if ragged is not None:  # the instance reads the count to know whether it has valid rows
                count = self.b.tensors[ir.value_tensor(ragged[0])]
                reads.append(ir.Region(count.name, target.owner, tuple(
                    ir.Dim(i, sympy.Integer(1), False) for i in ir.value_index(ragged[0])), target.span))
        return ir.Family(decl.name.id, ir.Kind.TILE, space, engine, tuple(dict.fromkeys(reads)),
                         tuple(s.target for s in stores), stores=tuple(stores), span=decl.span,
                         loops=tuple(loops.items()))

    def value(self, expr: ast.Expr, scope, reads: list, loops: dict):
        """(Value, shape, dtype) of a tile expression, or None after reporting why."""
        if isinstance(expr, ast.Num):
            return ir.Scalar(expr.value), (), "float32"
        if isinstance(expr, ast.Name) and expr.id not in self.b.tensors:
            size = self.b.size(expr, scope)
            return None if size is None else (ir.Scalar(size), (), "float32")
        if isinstance(expr, (ast.Name, ast.Subscript, ast.Peer)):
            region = self.region(expr, scope, reads=reads)
            if region is None:
                return None
            reads.append(region)
            return ir.Load(region), region.shape, self.b.tensors[region.tensor].dtype
        if isinstance(expr, ast.Neg):
            inner = self.value(expr.operand, scope, reads, loops)
            return None if inner is None else (ir.Map("neg", (inner[0],)), inner[1], inner[2])
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
            return None if shape is None else (ir.Map(BINARY[expr.op], (left[0], right[0])), shape, "float32")
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
            return None if body is None else (ir.Reduce(var, extent, body[0]), body[1], "float32")
        self.b.fail("expected a tensor value", expr.span)
        return None

    def matmul(self, expr: ast.BinOp, left, right):
        (a, sa, _), (b, sb, _) = left, right
        if len(sa) != 2 or len(sb) != 2:
            self.b.fail(f"'@' multiplies two matrices; its operands have shapes {shape_text(sa)} and "
                        f"{shape_text(sb)}", expr.span)
            return None
        if not same(sa[1], sb[0]):
            self.b.fail(f"the inner dimensions of '@' differ: {shape_text(sa)} @ {shape_text(sb)}", expr.span,
                        hint=f"{sa[1]} must equal {sb[0]}")
            return None
        if not isinstance(a, ir.Load) or not isinstance(b, ir.Load):
            self.b.fail("'@' multiplies tensor slices directly (epilogues go around the product)", expr.span)
            return None
        return ir.MatMul(a, b), (sa[0], sb[1]), "float32"

    def broadcast(self, sa, sb, span):
        """Shapes aligned at their last dimensions; a dimension of size 1 stretches to the other's (a
        weight per row [BT, 1] against a block [BT, BH]), as in torch."""
        if not sa:
            return sb
        if not sb:
            return sa
        longer, shorter = (sa, sb) if len(sa) >= len(sb) else (sb, sa)
        out = list(longer[:len(longer) - len(shorter)])
        for a, b in zip(longer[len(longer) - len(shorter):], shorter):
            if same(a, b) or b == 1:
                out.append(a)
            elif a == 1:
                out.append(b)
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
                or not self.b.tensors[region.tensor].dtype.startswith(("int", "uint")):
            self.b.fail(f"{call.func}() routes a slice of a local integer tensor", call.args[0].span)
            return None
        shape = (bins,) if call.func == "histogram" else source[1]
        return ir.Route(call.func, region, bins), shape, "int32"

    def routed(self, assign: ast.Assign, value, target: ir.Region, stores: int) -> bool:
        """histogram() and arrival() are whole stores into integer tensors, in tiles of routing stores only."""
        if not isinstance(value, ir.Route) and _routes(value):
            self.b.fail("histogram() and arrival() are whole stores: `slot = arrival(ids, E)`", assign.value.span)
            return False
        if not isinstance(value, ir.Route):
            return True
        tensor = self.b.tensors[target.tensor]
        if not tensor.dtype.startswith(("int", "uint")) or target.rows is not None or target.owner is not None:
            self.b.fail(f"{value.func}() stores into a box of a local integer tensor", assign.target.span)
            return False
        return True

    def call(self, call: ast.Call, scope, reads, loops):
        func = call.func
        if func in ir.ROUTES:
            return self.route(call, scope, reads, loops)
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
            known = sorted(list(NAMED) + list(SPELLINGS))
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
        shape = args[0][1]
        for other in args[1:]:
            shape = None if shape is None else self.broadcast(shape, other[1], call.span)
        return None if shape is None else (ir.Map(func, tuple(a[0] for a in args)), shape, "float32")
