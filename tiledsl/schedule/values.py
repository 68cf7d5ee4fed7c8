"""Regions and values: what a chunk copies and what a tile computes, with shapes and dtypes checked."""
from __future__ import annotations

import sympy

import difflib

from tiledsl.grammar import ast
from tiledsl.schedule import ir
from tiledsl.tables import BINARY, NAMED, SPELLINGS


def same(a: sympy.Expr, b: sympy.Expr) -> bool:
    return a == b or sympy.simplify(a - b) == 0


def shape_text(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


class ValueBuilder:
    def __init__(self, builder):
        self.b = builder

    # ---- regions --------------------------------------------------------------------------------
    def region(self, expr: ast.Expr, scope, writing: bool = False) -> ir.Region | None:
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
        if size.free_symbols & set(scope.indices.values()):
            self.b.fail("a slice's size may not depend on an index (all instances move the same shape)",
                        piece.span)
            return None
        return ir.Dim(start, size, True)

    # ---- chunks ---------------------------------------------------------------------------------
    def chunk(self, decl: ast.ChunkDecl, scope, space, engine) -> ir.Family | None:
        source = self.region(decl.source, scope)
        target = self.region(decl.target, scope, writing=True)
        split = 1 if decl.split is None else self.b.constant(decl.split, scope, "split")
        if source is None or target is None or split is None:
            return None
        if len(source.shape) != len(target.shape) or not all(map(same, source.shape, target.shape)):
            self.b.fail(f"the chunk copies {shape_text(source.shape)} into {shape_text(target.shape)}", decl.span)
            return None
        src_t, dst_t = self.b.tensors[source.tensor], self.b.tensors[target.tensor]
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
        reads = (source, target) if reduce else (source,)
        return ir.Family(decl.name.id, ir.Kind.CHUNK, space, engine, reads, (target,), reduce=reduce,
                         split=split, span=decl.span)

    # ---- tiles ----------------------------------------------------------------------------------
    def tile(self, decl: ast.TileDecl, scope, space, engine) -> ir.Family | None:
        stores, reads, loops = [], [], {}
        for assign in decl.body:
            target = self.region(assign.target, scope, writing=True)
            built = self.value(assign.value, scope, reads, loops)
            if target is None or built is None:
                continue
            value, shape, dtype = built
            if shape and not (len(shape) == len(target.shape) and all(map(same, shape, target.shape))):
                self.b.fail(f"the value has shape {shape_text(shape)} but its target "
                            f"'{target.tensor}' slice has {shape_text(target.shape)}", assign.span)
                continue
            stores.append(ir.Store(target, value, dtype, target.shape))
        return ir.Family(decl.name.id, ir.Kind.TILE, space, engine, tuple(reads),
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
            region = self.region(expr, scope)
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
        if not sa:
            return sb
        if not sb:
            return sa
        longer, shorter = (sa, sb) if len(sa) >= len(sb) else (sb, sa)
        tail = longer[len(longer) - len(shorter):]
        if all(map(same, tail, shorter)):
            return longer
        self.b.fail(f"shapes {shape_text(sa)} and {shape_text(sb)} do not match", span)
        return None

    def call(self, call: ast.Call, scope, reads, loops):
        func = call.func
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
