"""Random tile bodies for the differential test of bodies (tests/schedule/test_bodies.py).

`generate(seed)` writes a program of one to three tile families whose bodies are drawn at random:
elementwise chains over the language's functions (tiledsl/tables.py) and casts to every dtype,
broadcast operands of rank 0, 1 and 2 (a scalar element, a vector along the last axis, a row
`[1, n]` or a column `[m, 1]`), products with epilogues (in one go or accumulated over K in a loop),
row reductions and reductions over ranks, masks (`rows(n)`, `cols(n)`) and `where`, blocks with
state carried across a loop, tensors of 1 to 3 dimensions in every dtype the language has, ragged
(`cdiv`) and exact grids, `upto` tensors, and identifiers drawn to collide with the names the
compiler uses (`tds_*`, `tl`, `acc`, `pid`, launcher resources). A third of the programs also carry a
random schedule from gen_schedules.py, so bodies meet chunks, edges and every engine.

Values stay where the reference is defined: an argument of `sqrt` or `log` is made positive, of `exp`
bounded, a divisor kept away from 0, and a cast to a narrow type (fp8, i8, u8) clamped into its range,
because what a kernel and torch make of NaN or an overflowing cast is not what a program means.
Every other choice is free; the generator does not decide whether a program is correct, the compiler
does (accepted: it must run and match; refused: with a positioned error).

`Generated.tags` names the features a program uses, so that a family of bodies that hits a known
compiler bug can be excluded from the main test by name (test_bodies.KNOWN)."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import gen_schedules

WORLDS = (1, 2, 3)

# names the compiler uses itself, in kernels, launchers and the emitted Python: a program may use them
INTERNAL = ["acc", "pid", "shapes", "blocks", "diag", "barrier", "sig_x", "sig_mm", "math", "self", "len", "int",
            "grid", "heap", "stream", "mask", "offs", "ptr", "num_warps", "program_id", "epoch", "tile_mm",
            "chunk_x", "np", "sympy", "args", "kwargs", "ready", "signals", "sizes", "consts", "module", "kernel",
            "launch", "x_ptr", "BLOCK", "world_size", "i_0", "dtype", "device", "cast", "store", "load", "dot",
            "where", "exp", "sig_ready", "flags", "num_programs", "peer_ptr", "base", "numel", "shape", "order"]
LAUNCHER = {"shapes", "blocks", "diag", "barrier", "sig_x", "sig_mm", "sig_ready"}  # issue 24 item 9
# names the language reserves (Python keywords, the generated code's modules, `tds_`): refused with a line
RESERVED = ["tds_x", "tds_acc", "tl", "triton", "torch", "lambda", "None", "def", "range", "float", "__x"]
PLAIN_TENSORS = ["X", "W", "V", "Xb", "R", "S", "Wt", "U", "H"]
PLAIN_LOCALS = ["x", "y", "z", "t", "u", "m", "l", "a", "b"]
FLOATS = ["bf16", "f16", "f32", "f64", "fp8"]
INTS = ["i32", "i64", "i8", "u8"]
UNARY = ["relu", "sigmoid", "silu", "gelu", "tanh", "abs", "neg"]
GUARDED = ["exp", "exp2", "sqrt", "rsqrt", "log", "log2"]   # kept inside their domain
NARROW = {"fp8": 400, "i8": 100, "u8": 200}                  # casts clamped into this range


@dataclass(frozen=True)
class Generated:
    source: str
    sizes: dict | None      # world -> param values; None: tiledsl's default sizes
    intent: str             # the seed and what was drawn: a hint for whoever reads a failure
    tags: frozenset = frozenset()

    def sizes_text(self, world: int) -> str:
        return "default sizes" if self.sizes is None else ", ".join(f"{k}={v}" for k, v in self.sizes[world].items())


@dataclass
class Block:
    """One tile's grid over an output tensor: the slice text per dimension and the block's shape."""
    space: list[str]       # index declarations `i in cdiv(P, BM)`
    names: list[str]       # index names
    slices: list[str]      # per tensor dimension: `i*BM : +BM`, `:` or `b` (a point)
    shape: list[str]       # the kept dimensions' sizes as written (BM, P, 4)


@dataclass
class Value:
    text: str
    rank: int              # dimensions of its shape (0: a scalar)
    kind: str              # "float", "int" or "bool"
    narrow: bool = False   # rounded to a narrow type on the way (fp8, i8, u8)


class Body:
    """A program under construction."""

    def __init__(self, rnd: random.Random, prefix: str):
        self.rnd = rnd
        self.prefix = prefix
        self.used: set[str] = set()
        self.params: list[str] = []
        self.consts: dict[str, int] = {}
        self.tensors: list[str] = []
        self.families: list[str] = []
        self.edges: list[str] = []
        self.tags: set[str] = set()
        self.intent: list[str] = []
        self.exact: dict[str, int] = {}  # param -> what it must be a multiple of (exact grids)

    # ---- choices ----------------------------------------------------------------------------------
    def pick(self, xs):
        return self.rnd.choice(xs)

    def chance(self, p: float) -> bool:
        return self.rnd.random() < p

    def name(self, plain: list[str], colliding: float = 0.08) -> str:
        """A fresh identifier: mostly plain, sometimes one the compiler uses itself, rarely a reserved one."""
        for _ in range(50):
            roll = self.rnd.random()
            if roll < colliding / 8:
                candidate = self.pick(RESERVED)
                tag = "reserved-name"
            elif roll < colliding:
                candidate = self.pick(INTERNAL)
                tag = "resource-name" if candidate in LAUNCHER else "colliding-name"
            else:
                candidate = self.pick(plain)
                candidate = candidate if candidate not in self.used else f"{candidate}{self.rnd.randint(1, 99)}"
                tag = None
            if candidate not in self.used:
                self.used.add(candidate)
                if tag:
                    self.tags.add(tag)
                return candidate
        raise AssertionError("no fresh name")

    def param(self) -> str:
        name = self.name(["P", "Q", "L", "Dm", "Nb"])
        self.params.append(name)
        return name

    def const(self, value: int) -> str:
        name = self.name(["BM", "BN", "BK", "BB", "BL"])
        self.consts[name] = value
        return name

    def dtype(self, floating: bool = False) -> str:
        dtype = self.pick(FLOATS if floating else FLOATS * 3 + INTS)
        self.tags.add(f"dtype-{dtype}")
        return dtype

    def tensor(self, role: str, dims: list[str], dtype: str, extra: str = "") -> str:
        name = self.name(PLAIN_TENSORS)
        self.tensors.append(f"{role} {name} : {dtype}[{', '.join(dims)}]{extra}")
        return name

    def extent(self) -> str:
        """A dimension: a param (bound at launch) or a number."""
        if self.chance(0.7):
            return self.param()
        return str(self.pick([3, 4, 5, 8]))

    # ---- grids ------------------------------------------------------------------------------------
    def grid(self, dims: list[str]) -> Block:
        """How a tile walks a tensor of these dims: the first (and for 3-D sometimes the first two)
        blocked or point-indexed, the last blocked or whole."""
        space, names, slices, shape = [], [], [], []
        letters = iter(["i", "j", "k2", "b"] if not self.chance(0.2) else ["pid", "acc", "offs", "mask"])
        for n, dim in enumerate(dims):
            last = n == len(dims) - 1
            if last and len(dims) > 1 and self.chance(0.5):
                slices.append(":")
                shape.append(dim)
                continue
            if len(dims) == 3 and n == 0 and self.chance(0.6):
                index = next(letters)
                space.append(f"{index} in {dim}")
                names.append(index)
                slices.append(index)        # a point: the block drops this dimension
                self.tags.add("point-index")
                continue
            index = next(letters)
            size = self.pick([2, 4, 8])
            block = self.const(size) if self.chance(0.7) else str(size)
            exact = self.chance(0.25) and dim in self.params
            if exact:
                self.exact[dim] = math.lcm(self.exact.get(dim, 1), size)
            space.append(f"{index} in {dim} / {block}" if exact else f"{index} in cdiv({dim}, {block})")
            names.append(index)
            slices.append(f"{index}*{block} : +{block}")
            shape.append(block)
        if len(shape) == 3:
            self.tags.add("block-3d")
        return Block(space, names, slices, shape)

    # ---- values -----------------------------------------------------------------------------------
    def guard(self, func: str, arg: Value) -> str:
        if func in ("sqrt", "rsqrt", "log", "log2"):
            return f"{func}(abs({arg.text}) + 0.5)"
        return f"{func}(tanh({arg.text}))"   # exp, exp2 of a bounded value

    def cast(self, v: Value) -> Value:
        target = self.pick(FLOATS + INTS)
        self.tags.add(f"cast-{target}")
        if v.kind == "bool":
            return v
        if target in NARROW:
            bound = NARROW[target]
            low = 0 if target == "u8" else -bound
            return Value(f"{target}(max(min({v.text}, {bound}.0), {low}.0))", v.rank, "int" if target in INTS else "float",
                         True)
        return Value(f"{target}({v.text})", v.rank, "int" if target in INTS else "float",
                     v.narrow or target in ("bf16", "f16"))

    def expr(self, leaves: list[Value], depth: int) -> Value:
        """A random elementwise value over the leaves."""
        if depth <= 0 or self.chance(0.2):
            return self.pick(leaves)
        choice = self.pick(["binary"] * 4 + ["unary"] * 3 + ["guarded"] * 2 + ["minmax", "where", "cast", "number"])
        a = self.expr(leaves, depth - 1)
        if a.kind == "bool":
            a = Value(f"where({a.text}, 1.0, 0.0)", a.rank, "float")
        if choice == "binary":
            b = self.expr(leaves, depth - 1)
            if b.kind == "bool":
                b = Value(f"where({b.text}, 1.0, -1.0)", b.rank, "float")
            op = self.pick(["+", "-", "*", "/"])
            self.tags.add(f"op{op}")
            if op == "/":
                return Value(f"({a.text}) / (abs({b.text}) + 1.0)", max(a.rank, b.rank), "float", a.narrow or b.narrow)
            kind = "int" if a.kind == b.kind == "int" and op != "/" else "float"
            return Value(f"({a.text} {op} {b.text})", max(a.rank, b.rank), kind, a.narrow or b.narrow)
        if choice == "unary":
            func = self.pick(UNARY)
            self.tags.add(f"fn-{func}")
            if func == "neg":
                return Value(f"-({a.text})", a.rank, a.kind, a.narrow)
            return Value(f"{func}({a.text})", a.rank, "float", a.narrow)
        if choice == "guarded":
            func = self.pick(GUARDED)
            self.tags.add(f"fn-{func}")
            return Value(self.guard(func, a), a.rank, "float", a.narrow)
        if choice == "minmax":
            b = self.expr(leaves, depth - 1)
            if b.kind == "bool":
                b = Value(f"where({b.text}, 0.5, -0.5)", b.rank, "float")
            func = self.pick(["max", "min"])
            self.tags.add(f"fn-{func}")
            kind = "int" if a.kind == b.kind == "int" else "float"
            return Value(f"{func}({a.text}, {b.text})", max(a.rank, b.rank), kind, a.narrow or b.narrow)
        if choice == "where":
            self.tags.add("where")
            b, c, d = (self.expr(leaves, depth - 1) for _ in range(3))
            b, c, d = (v if v.kind != "bool" else Value(f"where({v.text}, 1.0, 0.0)", v.rank, "float") for v in (b, c, d))
            compare = self.pick(["<", "<=", ">", ">=", "==", "!="]) if not (a.narrow or b.narrow) else \
                self.pick(["<", ">"])
            return Value(f"where({a.text} {compare} {b.text}, {c.text}, {d.text})", max(a.rank, b.rank, c.rank, d.rank),
                         "int" if c.kind == d.kind == "int" else "float", c.narrow or d.narrow)
        if choice == "cast":
            return self.cast(a)
        number = self.pick(["0.5", "2.0", "1.5", "3", "0.25", "1e-3"])
        return Value(f"({a.text} {self.pick(['*', '+', '-'])} {number})", a.rank,
                     "int" if a.kind == "int" and "." not in number and "e" not in number else "float", a.narrow)

    def operands(self, dims: list[str], block: Block, dtype_of=None) -> list[Value]:
        """Loads that broadcast against the block: same-shaped slices of other tensors, a scalar
        element (rank 0), a vector along the last axis (rank 1), a row or a column (rank 2)."""
        rank = len(block.shape)
        out = []
        for _ in range(self.rnd.randint(1, 3)):
            dtype = self.dtype()
            name = self.tensor("in", dims, dtype)
            out.append(Value(f"{name}[{', '.join(block.slices)}]", rank, "int" if dtype in INTS else "float",
                             dtype in ("fp8", "bf16", "f16")))
        for _ in range(self.rnd.randint(0, 3)):
            kind = self.pick(["scalar", "vector", "row", "column", "number"])
            dtype = self.dtype() if self.chance(0.5) else "f32"
            narrow = dtype in ("fp8", "bf16", "f16")
            vkind = "int" if dtype in INTS else "float"
            if kind == "scalar":
                length = self.pick(["1", "4", self.params[0] if self.params else "2"])
                name = self.tensor("in", [length], dtype)
                out.append(Value(f"{name}[{self.pick(['0', f'{length} - 1'])}]", 0, vkind, narrow))
                self.tags.add("broadcast-0")
            elif kind == "vector" and rank >= 1:
                name = self.tensor("in", [dims[-1]], dtype)
                out.append(Value(f"{name}[{block.slices[-1]}]", 1, vkind, narrow))
                self.tags.add("broadcast-1")
            elif kind == "row" and rank >= 2:
                name = self.tensor("in", ["1", dims[-1]], dtype)
                out.append(Value(f"{name}[:, {block.slices[-1]}]", 2, vkind, narrow))
                self.tags.add("broadcast-2")
            elif kind == "column" and rank >= 2:
                kept = [n for n, s in enumerate(block.slices) if ":" in s or s == ":"]
                rows_dim = kept[-2]
                name = self.tensor("in", [dims[rows_dim], "1"], dtype)
                out.append(Value(f"{name}[{block.slices[rows_dim]}, :]", 2, vkind, narrow))
                self.tags.add("broadcast-2")
            else:
                out.append(Value(self.pick(["0.5", "2.0", "-1.0", "3"]), 0, "float"))
        return out

    def masks(self, block: Block, dims: list[str], value: Value) -> Value:
        """A mask from the block's positions (`rows(n)`, `cols(n)`) on a 2-D block."""
        if len(block.shape) != 2:
            return value
        kept = [n for n, s in enumerate(block.slices) if ":" in s]
        self.tags.add("mask")
        axis = self.pick([0, 1])
        n = kept[axis]
        start = block.slices[n].split(" : ")[0] if block.slices[n] != ":" else "0"
        iota = "rows" if axis == 0 else "cols"
        limit = self.pick([dims[n], f"{dims[n]} - 1", "2"])
        at = f"{start} + {iota}({block.shape[axis]})" if start != "0" else f"{iota}({block.shape[axis]})"
        return Value(f"where({at} < {limit}, {value.text}, {self.pick(['0.0', '-1.0', value.text + ' * 0.5'])})",
                     2, value.kind, value.narrow)

    # ---- families ---------------------------------------------------------------------------------
    def family_name(self) -> str:
        return self.name(["ew", "mm", "red", "scan", "norm", "mix"], 0.2)

    def store(self, dims: list[str], block: Block, value: Value, upto: str = "") -> str:
        dtype = self.dtype() if self.chance(0.6) else ("f32" if value.kind != "int" else "i32")
        out = self.tensor(self.pick(["out"] * 4 + ["inout"]), dims, dtype, upto)
        if dtype == "f64":
            self.tags.add("f64-output")
        if dtype in NARROW or (value.kind == "float" and dtype in INTS):
            clamp = NARROW.get(dtype, 1000)
            low = 0 if dtype == "u8" else -clamp
            return f"{out}[{', '.join(block.slices)}] = max(min({value.text}, {clamp}.0), {low}.0)"
        return f"{out}[{', '.join(block.slices)}] = {value.text}"

    def elementwise(self) -> None:
        dims = [self.extent() for _ in range(self.pick([1, 1, 2, 2, 2, 3]))]
        self.tags.add(f"rank-{len(dims)}")
        block = self.grid(dims)
        leaves = self.operands(dims, block)
        value = self.expr(leaves, self.rnd.randint(1, 4))
        if value.rank < len(block.shape):  # the stored value must have the block's shape
            value = Value(f"({value.text}) + {leaves[0].text} * 0.0", len(block.shape), value.kind, value.narrow) \
                if self.chance(0.5) else Value(f"{leaves[0].text} + {value.text}", len(block.shape), "float",
                                                value.narrow or leaves[0].narrow)
        if value.kind == "bool":
            value = Value(f"where({value.text}, 1.0, 0.0)", value.rank, "float")
        if self.chance(0.3):
            value = self.masks(block, dims, value)
        if len(block.shape) == 2 and self.chance(0.3):
            stat = self.pick(["rowmax", "rowsum"])
            self.tags.add(f"fn-{stat}")
            column = block.slices[-1] == ":" and self.coin()
            value = Value(f"{stat}({value.text})" if column else f"{value.text} - {stat}({value.text})",
                          2, "float", value.narrow)
            if column:  # a row statistic [m, 1]: stored into a column
                dims = dims[:-1] + ["1"]
        family = self.family_name()
        self.families.append(f"tile {family}[{', '.join(block.space)}]: {self.store(dims, block, value)}")
        self.intent.append(f"elementwise {family}")

    def coin(self) -> bool:
        return self.chance(0.5)

    def product(self) -> None:
        """A @ B over blocks, with a random epilogue: in one go over all of K, or accumulated in a loop."""
        self.tags.add("product")
        m, n = self.extent(), self.extent()
        k = self.param() if self.chance(0.5) else str(self.pick([8, 16]))
        batched = self.chance(0.25)
        bm, bn = self.const(self.pick([16, 32])), self.const(self.pick([16, 32]))
        dtype = self.dtype(floating=True)
        if dtype == "f64":
            self.tags.add("f64-product")
        lead = [self.extent()] if batched else []
        a = self.tensor("in", lead + [m, k], dtype)
        b = self.tensor("in", lead + [k, n], dtype)
        space = ([f"b in {lead[0]}"] if batched else []) + [f"i in cdiv({m}, {bm})", f"j in cdiv({n}, {bn})"]
        pre = "b, " if batched else ""
        rows, cols = f"i*{bm} : +{bm}", f"j*{bn} : +{bn}"
        block = Block(space, [], ([ "b"] if batched else []) + [rows, cols], [bm, bn])
        family = self.family_name()
        loop = self.chance(0.4)
        extras = self.operands(lead + [m, n], block) if self.chance(0.7) else []
        if extras:
            self.tags.add("epilogue")
            if any(e.rank < 2 and not e.text[0].isdigit() and not e.text.startswith("-") for e in extras):
                self.tags.add("product-broadcast-epilogue")
        product = Value("acc_mm", 2, "float") if loop else Value(
            f"({a}[{pre}{rows}, :] @ {b}[{pre}:, {cols}])", 2, "float")
        value = self.expr([product] + extras, self.rnd.randint(0, 3)) if extras else product
        if value.kind == "bool":
            value = Value(f"where({value.text}, 1.0, 0.0)", 2, "float")
        if value.rank < 2:
            value = Value(f"{product.text} + {value.text}", 2, "float")
        if "acc_mm" not in value.text and loop:
            value = Value(f"acc_mm + {value.text}", 2, "float")
        store = self.store(lead + [m, n], block, value)
        if not loop:
            self.families.append(f"tile {family}[{', '.join(space)}]: {store}")
        else:
            bk = self.const(8)
            acc = self.name(PLAIN_LOCALS, 0.2)
            step = self.name(["c", "kk", "step"], 0.2)
            steps = f"{k} / {bk}" if not k.isdigit() else str(int(k) // 8)
            if k in self.params:
                self.exact[k] = math.lcm(self.exact.get(k, 1), 8)
            lines = [f"tile {family}[{', '.join(space)}]:",
                     f"    {acc} = {self.pick(['0', '0.0'])}",
                     f"    for {step} in {steps}:",
                     f"        {acc} = {acc} + {a}[{pre}{rows}, {step}*{bk} : +{bk}] @ {b}[{pre}{step}*{bk} : +{bk}, {cols}]",
                     f"    {store.replace('acc_mm', acc)}"]
            self.tags.add("carried")
            self.families.append("\n".join(lines))
        self.intent.append(f"product {family}" + (" in a loop" if loop else ""))

    def carried(self) -> None:
        """A block whose loop carries state: a running max, a sum, an online-softmax-like pair."""
        self.tags.add("carried")
        dims = [self.extent() for _ in range(self.pick([1, 2, 2]))]
        steps = self.pick(["3", "2", "param"])
        steps = self.param() if steps == "param" else steps
        block = self.grid(dims)
        dtype = self.dtype()
        series = self.tensor("in", [steps] + dims, dtype)
        # the step's slice of a tensor with one more leading dimension
        family = self.family_name()
        x, m, s = self.name(PLAIN_LOCALS, 0.15), self.name(PLAIN_LOCALS, 0.15), self.name(PLAIN_LOCALS, 0.15)
        step = self.name(["c", "t2", "step"], 0.2)
        leaves = self.operands(dims, block)
        load = Value(x, len(block.shape), "int" if dtype in INTS else "float")
        update = self.expr([load, Value(s, len(block.shape), "float")] + leaves[:1], self.rnd.randint(1, 2))
        if update.kind == "bool":
            update = Value(f"where({update.text}, 1.0, 0.0)", update.rank, "float")
        start_m = self.pick(["-inf", "-1e30", "0"])
        lines = [f"tile {family}[{', '.join(block.space)}]:",
                 f"    {m} = {start_m}; {s} = {self.pick(['0', '0.0', leaves[0].text])}",
                 f"    for {step} in {steps}:",
                 f"        {x} = {series}[{step}, {', '.join(block.slices)}]",
                 f"        {m} = max({m}, {x})",
                 f"        {s} = {s} * 0.5 + tanh({update.text})"]
        final = Value(f"{m} + {s}" if start_m != "-inf" or True else s, len(block.shape), "float")
        lines.append(f"    {self.store(dims, block, final)}")
        self.families.append("\n".join(lines))
        self.intent.append(f"carried {family}")

    def rank_sum(self) -> None:
        """A reduction over every rank's copy of an `in` or `symm` tensor, sum or max."""
        self.tags.add("rank-reduce")
        dims = [self.extent() for _ in range(self.pick([1, 2]))]
        block = self.grid(dims)
        dtype = self.dtype()
        source = self.tensor("in", dims, dtype)
        var = self.name(["s", "r", "q"], 0.2)
        region = f"{source}@{var}[{', '.join(block.slices)}]"
        leaves = [Value(region, len(block.shape), "int" if dtype in INTS else "float", dtype in ("fp8", "bf16", "f16"))]
        inner = self.expr(leaves, self.rnd.randint(0, 2))
        if inner.kind == "bool":
            inner = Value(f"where({inner.text}, 1.0, 0.0)", inner.rank, "float")
        if region not in inner.text:
            inner = Value(f"{region} + {inner.text}", inner.rank, "float")
        how = self.pick(["sum", "sum", "max"])
        value = Value(f"{how}({inner.text} for {var} in world)", len(block.shape), "float")
        family = self.family_name()
        self.families.append(f"tile {family}[{', '.join(block.space)}]: {self.store(dims, block, value)}")
        self.intent.append(f"{how} over ranks {family}")

    def ragged(self) -> None:
        """A tile writing an `upto` tensor: rows of each group valid below its count."""
        self.tags.add("upto")
        groups, width = self.extent(), self.extent()
        cap = self.param() if self.coin() else "8"
        count = self.tensor("in", [groups], "i32", f" cap {cap}")
        block = self.grid([groups, cap, width])
        source = self.tensor("in", [groups, cap, width], self.dtype(floating=True))
        value = self.expr([Value(f"{source}[{', '.join(block.slices)}]", len(block.shape), "float")],
                          self.rnd.randint(0, 2))
        if value.kind == "bool":
            value = Value(f"where({value.text}, 1.0, 0.0)", value.rank, "float")
        family = self.family_name()
        self.families.append(f"tile {family}[{', '.join(block.space)}]: "
                             f"{self.store([groups, cap, width], block, value, f' upto {count}')}")
        self.intent.append(f"upto {family}")

    # ---- text -------------------------------------------------------------------------------------
    def lines(self) -> list[str]:
        out = []
        if self.params:
            out.append(f"param {', '.join(self.params)}")
        if self.consts:
            out.append("const " + ", ".join(f"{k} = {v}" for k, v in self.consts.items()))
        return out + self.tensors


KINDS = ["elementwise"] * 4 + ["product"] * 3 + ["carried"] * 2 + ["rank_sum", "ragged"]


def generate(seed: int) -> Generated:
    """One program, every choice taken from a `random.Random(seed)`."""
    rnd = random.Random(seed)
    body = Body(rnd, "b")
    schedule = gen_schedules.generate(rnd.randrange(2**32)) if rnd.random() < 0.3 else None
    if schedule is not None:
        # the schedule's own names are taken
        body.used |= {"N", "M", "X", "Y", "Y2", "T", "U", "G", "Z", "R", "B", "B2", "B3", "B4", "load", "use",
                      "mid", "red", "pull", "push", "put", "gather", "acc", "init", "scan", "own", "fwd", "seed",
                      "hop", "back", "i", "j", "s", "t"}
        body.tags.add("with-schedule")
    for _ in range(rnd.choice([1, 1, 2, 3])):
        kind = rnd.choice(KINDS)
        getattr(body, kind)()
        body.tags.add(kind)
    if rnd.random() < 0.03:  # a param no shape names: nothing can bind it at launch
        body.param()
        body.tags.add("unused-param")
    name = f"bodies_{seed % 100000}"
    if schedule is None:
        lines = [f"program {name}"] + body.lines() + body.families
        params = body.params
        base_sizes = None
    else:
        head, rest = schedule.source.splitlines(), None
        lines = head[:2] + body.lines() + head[2:] + body.families
        params = body.params
        base_sizes = schedule.sizes
    sizes = None
    if base_sizes is not None or rnd.random() < 0.5:
        sizes = {}
        for world in WORLDS:
            sizes[world] = dict(base_sizes[max(world, 2)]) if base_sizes is not None else {}
            for param in params:
                multiple = body.exact.get(param, 1)
                sizes[world][param] = -(-rnd.randint(1, 11) // multiple) * multiple
        if base_sizes is None and schedule is not None:
            sizes = None
    if schedule is not None and base_sizes is None:
        sizes = None  # the schedule's params take tiledsl's defaults: so do the bodies'
    intent = f"seed {seed}: " + "; ".join(body.intent) + (f"; with {schedule.intent}" if schedule else "")
    return Generated("\n".join(lines) + "\n", sizes, intent, frozenset(body.tags))
