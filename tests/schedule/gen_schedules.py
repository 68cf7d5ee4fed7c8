"""Small random schedules for the differential test (tests/schedule/test_differential.py).

`schedules()` is a hypothesis strategy of `.tds` programs with one to three tile and chunk families
over 1-D and 2-D f32 tensors: elementwise tiles, copies, sums over every rank's copy, tiles with two
stores, chunks on the copy engine, on SM programs (pulls, puts, `reduce add`) and NVSHMEM puts,
ragged (`cdiv`) and exact index spaces, affine edges (`- 1`, `+ 1`, floor division by a const, `*`,
`min`), edges from a family to itself (on its own rank and on others: rings and chains), to other
ranks and `@ every rank`, families on some ranks only (`if rank == 0`), orders and `split 2`.

Each program is built from a pattern (a local pipeline, an all-reduce, a pull, a put, an all-gather,
a reduce-add, a scan, a store-and-forward ring, a chained broadcast, a reduction to a root) whose edges the generator can state exactly; every dependency is then written
exactly (most of the time, so that a good share of programs is race free), coarsely (`*` and
`@ every rank`), left out, or perturbed, and some edges, self-edges and orders are added at random.
The generator does not decide whether a program is correct: the checkers do."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from hypothesis import strategies as st

WORLDS = (2, 3)  # the worlds the differential test runs at


@dataclass(frozen=True)
class Generated:
    source: str
    # world -> param values to check and run at; None: tiledsl's default_sizes for that world
    sizes: dict | None
    intent: str  # the pattern and what was written inexactly on purpose: a hint for whoever reads a failure

    def sizes_text(self, world: int) -> str:
        return "default sizes" if self.sizes is None else ", ".join(f"{k}={v}" for k, v in self.sizes[world].items())


# ---- the pieces of a program ---------------------------------------------------------------------

@dataclass
class Grid:
    """A family's tiling of a tensor's rows (and, for 2-D tiles, its columns)."""
    rows: str               # "N" or "world * N"
    block: str              # the row block as written: a const name or a number
    size: int               # its value
    exact: bool             # `rows / block` (the launch checks divisibility) instead of `cdiv(rows, block)`
    cols: tuple[str, int] | None = None  # the column block of a `j` index; None: whole rows
    two_d: bool = False
    stop_form: bool = False  # rows as `i*B : (i + 1)*B` (must fit) instead of `i*B : +B` (clipped)

    @property
    def names(self) -> list[str]:
        return ["i", "j"] if self.cols else ["i"]

    def space(self, width: str) -> list[str]:
        rows = f"{self.rows} / {self.block}" if self.exact else f"cdiv({self.rows}, {self.block})"
        out = [f"i in {rows}"]
        if self.cols:
            out.append(f"j in cdiv({width}, {self.cols[0]})")
        return out

    def extent(self, width: str, n: int = 0) -> str:
        return self.space(width)[n].split(" in ", 1)[1]

    def region(self, offset: str = "") -> str:
        start = f"{offset}i*{self.block}"
        rows = (f"{start} : {offset}(i + 1)*{self.block}" if self.stop_form else f"{start} : +{self.block}")
        if not self.two_d:
            return f"[{rows}]"
        cols = f"j*{self.cols[0]} : +{self.cols[0]}" if self.cols else ":"
        return f"[{rows}, {cols}]"


@dataclass
class Dep:
    family: str
    index: list[str]          # one expression per producer index, "*" for all
    ranks: str | None = None  # None: the consumer's rank; "every rank"; or an atom such as "((rank + 1) mod world)"

    def text(self) -> str:
        at = "" if self.ranks is None else f" @ {self.ranks}"
        index = f"[{', '.join(self.index)}]" if self.index else ""  # a family of one instance has no index
        return f"{self.family}{index}{at}"


@dataclass
class Family:
    name: str
    kind: str                 # "tile" or "chunk"
    names: list[str]          # its index names
    space: list[str]          # its index declarations
    body: str                 # after the colon
    engine: str | None = None  # "copy_engine", "sms(2)", "nvshmem(2)" or None (the default)
    split: bool = False
    deps: list[Dep] = field(default_factory=list)
    # the engine this chunk falls back to if it waits on something the copy engine cannot wait on
    fallback: str = "sms(2)"
    guard: str | None = None  # `rank == 0`: the family runs on those ranks only

    def line(self, kernel_families: set[str]) -> str:
        engine = self.engine
        if engine == "copy_engine" and (self.guard or not all(_copy_engine_can_wait(d, kernel_families)
                                                              for d in self.deps)):
            engine = self.fallback  # the host issues a copy-engine chunk on every rank
        on = f" on {engine}" if engine else ""
        split = " split 2" if self.split and engine != "copy_engine" else ""
        guard = f" if {self.guard}" if self.guard else ""
        space = f"[{', '.join(self.space)}]" if self.space else ""
        return f"{self.kind} {self.name}{space}{on}{split}{guard}: {self.body}"


def _copy_engine_can_wait(dep: Dep, kernel_families: set[str]) -> bool:
    """What the copy engine's stream can wait on (tiledsl lowering): a row of a kernel family on its own
    rank, `mm[i, *]`. The generator keeps to it: other waits are a refusal no checker makes."""
    return (dep.family in kernel_families and dep.ranks is None and dep.index[0] != "*"
            and all(i == "*" for i in dep.index[1:]))


VALUES = ["{0}", "{0} * 2.0 + 1.0", "{0} * 0.5", "{0} + 1.0"]
PEERS = ["((rank + 1) mod world)", "((rank + world - 1) mod world)", "((rank + 2) mod world)", "rank"]
# who wrote this rank's copy when the writer on rank r wrote the copy of PEERS[k]
WRITERS = ["((rank + world - 1) mod world)", "((rank + 1) mod world)", "((rank + world - 2) mod world)", None]
WRONG_RANKS = ["every rank", "((rank + 1) mod world)", "(rank - 1)", "(rank + 1)", "0", None]
# a family's wait on its own instances on another rank
SELF_RANKS = ["((rank + world - 1) mod world)", "((rank + 1) mod world)", "(rank - 1)", "every rank"]
# who runs a family that runs on some ranks only
GUARDS = ["rank == 0", "rank == 1", "rank != 0", "rank < world - 1", "rank > 0"]


class Program:
    """A program under construction: declarations as text, families and their dependencies."""

    def __init__(self, rnd: random.Random, two_d: bool):
        self.rnd = rnd
        self.two_d = two_d
        self.width = "N"
        self.params = ["N"]
        self.consts: dict[str, int] = {}
        self.tensors: list[str] = []
        self.families: list[Family] = []
        self.orders: list[str] = []
        self.multiple = {"N": 1}   # each param must be a multiple of this (exact divisions)
        self.least = {"N": 2}      # and at least this
        self.intent: list[str] = []

    # ---- declarations ---------------------------------------------------------------------------
    def shape(self, rows: str) -> str:
        return f"[{rows}, {self.width}]" if self.two_d else f"[{rows}]"

    def tensor(self, role: str, name: str, rows: str = "N") -> str:
        self.tensors.append(f"{role} {name} : f32{self.shape(rows)}")
        return name

    def pick(self, choices):
        return self.rnd.choice(choices)

    def coin(self) -> bool:
        return self.rnd.random() < 0.5

    def chance(self, p: float) -> bool:
        return self.rnd.random() < p

    def block(self) -> tuple[str, int]:
        """A row block: a const (the default sizes are then multiples of it) or a number (ragged)."""
        size = self.pick([2, 3, 4])
        if self.coin():
            name = {2: "B2", 3: "B3", 4: "B4"}[size]
            self.consts[name] = size
            return name, size
        return str(size), size

    def grid(self, rows: str = "N", tile_columns: bool | None = None, exact_ok: bool = True,
             like: Grid | None = None) -> Grid:
        if like is not None and self.chance(0.6):
            return Grid(like.rows if rows == like.rows else rows, like.block, like.size, like.exact, like.cols,
                        self.two_d, like.stop_form)
        block, size = self.block()
        exact = exact_ok and rows == "N" and self.chance(0.3)
        if exact:
            self.multiple["N"] = math.lcm(self.multiple["N"], size)
        cols = None
        if self.two_d and (tile_columns if tile_columns is not None else self.coin()):
            columns = self.pick([2, 3])
            cols = (str(columns), columns)
        stop_form = exact and self.chance(0.3)
        return Grid(rows, block, size, exact, cols, self.two_d, stop_form)

    def family(self, kind: str, name: str, names: list[str], space: list[str], body: str, **kw) -> Family:
        if kind == "tile" and self.chance(0.2):
            kw["engine"] = "sms(2)"
        family = Family(name, kind, names, space, body, **kw)
        self.families.append(family)
        return family

    def chunk_engine(self, puts: bool = False, whole_rows: bool = True, copy_engine: bool = True) -> str:
        choices = ["sms(1)", "sms(2)"] + (["copy_engine", "copy_engine"] if copy_engine else []) + (
            ["nvshmem(1)", "nvshmem(2)"] if puts and whole_rows else [])
        return self.pick(choices)

    def value(self, *regions: str) -> str:
        if len(regions) == 2:
            return self.pick(["{0} + {1}", "{0} * 0.5 + {1}"]).format(*regions)
        return self.pick(VALUES).format(regions[0])

    # ---- dependencies -------------------------------------------------------------------------------
    def depend(self, consumer: Family, exact: list[Dep], coarse: list[Dep] | None = None) -> None:
        """The waits `consumer` needs, written exactly, coarsely, not at all, or perturbed."""
        mode = self.pick(["exact"] * 13 + ["coarse"] * 3 + ["missing"] * 1 + ["perturbed"] * 3)
        if mode == "coarse" and coarse is None:
            mode = "exact"
        if mode == "exact":
            consumer.deps.extend(exact)
        elif mode == "coarse":
            consumer.deps.extend(coarse)
        elif mode == "missing":
            self.intent.append(f"no wait of {consumer.name} on {', '.join(d.family for d in exact)}")
        else:
            deps = [Dep(d.family, list(d.index), d.ranks) for d in exact]
            target = self.rnd.randint(0, len(deps) - 1)
            dep = deps[target]
            how = self.pick(["index", "index", "ranks", "drop"] if len(deps) > 1 else ["index", "index", "ranks"])
            mapped = [k for k, e in enumerate(dep.index) if e != "*"]
            if how == "index" and mapped:
                k = self.pick(mapped)
                dep.index[k] = f"{dep.index[k]} {self.pick(['+ 1', '- 1'])}"
            elif how == "drop":
                del deps[target]
            else:
                dep.ranks = self.pick(WRONG_RANKS)
            consumer.deps.extend(deps)
            self.intent.append(f"perturbed wait of {consumer.name}: {how}")

    def covering(self, consumer: Grid, producer: Grid, consumer_names: list[str] | None = None) -> list[list[str]]:
        """Producer indices whose blocks cover the consumer block, over the consumer's index names (the
        two grids tile the same rows and, where both have a `j`, the same columns)."""
        names = consumer_names or consumer.names
        i = names[0]
        if (consumer.block, consumer.size) == (producer.block, producer.size):
            rows = [i]
        elif producer.size % consumer.size == 0:
            rows = [f"({i}*{consumer.block})/{producer.block}"]
        else:
            clamp = self.coin()
            last = f"{producer.extent(self.width)} - 1"
            rows = []
            for offset in sorted(set(range(0, consumer.size, producer.size)) | {consumer.size - 1}):
                row = f"({i}*{consumer.block} + {offset})/{producer.block}" if offset else \
                    f"({i}*{consumer.block})/{producer.block}"
                rows.append(f"min({row}, {last})" if clamp and offset else row)
        if not producer.cols:
            return [[r] for r in rows]
        if consumer.cols and consumer.cols == producer.cols:
            return [[r, names[1]] for r in rows]
        return [[r, "*"] for r in rows]

    # ---- random extras ------------------------------------------------------------------------------
    def extras(self) -> None:
        ordered = {line.split()[1] for line in self.orders}
        for family in self.families:
            names = family.names
            if not names:
                continue  # one instance: nothing to chain or order
            if family.engine != "copy_engine" and self.chance(0.3):
                index = list(names)
                k = self.rnd.randint(0, len(index) - 1)
                # `(i - 1)/2` floors to -1 at i = 0: no wait there (a truncating division would wait on itself)
                index[k] = self.pick(["{} - 1", "{} - 1", "{} + 1", "({} - 1)/2"]).format(index[k])
                if len(index) > 1 and self.coin():
                    other = 1 - k if len(index) == 2 else (k + 1) % len(index)
                    index[other] = f"{index[other]} {self.pick(['- 1', '+ 1'])}"
                # on its own rank, or on another (a ring's forwarding wait, or a chain's)
                ranks = self.pick([None, None, None] + SELF_RANKS)
                family.deps.append(Dep(family.name, index, ranks))
                self.intent.append(f"self-edge on {family.name}" + (f" @ {ranks}" if ranks else ""))
            if self.chance(0.3) and family.name not in ordered:
                self.orders.append(f"order {family.name} by {self.order_keys(names)}")
        families = self.families
        if len(families) >= 2 and self.chance(0.04):
            early, late = families[0], families[-1]
            early.deps.append(Dep(late.name, ["*"] * len(late.names)))
            self.intent.append("families that wait on each other")
        if len(families) >= 2 and self.chance(0.1):
            late, early = families[-1], families[0]
            index = [self.pick(late.names + ["*", "0"]) for _ in early.names]
            ranks = self.pick(["(rank - 1)", "((rank + 1) mod world)", None])
            late.deps.append(Dep(early.name, index, ranks))
            self.intent.append(f"extra wait of {late.name} on {early.name}")

    def order_keys(self, names: list[str]) -> str:
        if names == ["i"]:
            keys = ["-i", "(i - rank) mod world", "(i + rank) mod world", "i mod 2"]
        elif names == ["i", "j"]:
            keys = ["j, i", "-j", "(i - rank) mod world, -j", "i + j", "-i, j"]
        elif names == ["s"]:
            keys = ["(s - rank) mod world", "-s", "(s + rank) mod world"]
        elif len(names) == 1:  # a ring's steps
            keys = [f"-{names[0]}", f"({names[0]} + rank) mod world", f"{names[0]} mod 2"]
        else:
            first = names[0]
            keys = [f"({first} - rank) mod world", f"{names[1]}, {first}", f"-{names[1]}", f"-{first}"]
        return self.pick(keys)

    # ---- the text -----------------------------------------------------------------------------------
    def source(self, name: str) -> str:
        kernel = {f.name for f in self.families if f.kind == "tile" or f.engine != "copy_engine"}
        # a chunk that falls back from the copy engine to SM programs becomes a kernel family too
        kernel |= {f.name for f in self.families
                   if f.engine == "copy_engine" and not all(_copy_engine_can_wait(d, kernel) for d in f.deps)}
        lines = [f"program {name}", f"param {', '.join(self.params)}"]
        if self.consts:
            lines.append("const " + ", ".join(f"{k} = {v}" for k, v in sorted(self.consts.items())))
        lines += self.tensors
        lines += [f.line(kernel) for f in self.families]
        for f in self.families:
            if f.deps:
                lines.append(f"{f.name}{'[' + ', '.join(f.names) + ']' if f.names else ''} after "
                         f"{', '.join(d.text() for d in f.deps)}")
        lines += self.orders
        return "\n".join(lines) + "\n"


# ---- patterns ------------------------------------------------------------------------------------

def local_chain(p: Program) -> None:
    """X -> T (-> U) -> Y through tiles; T may be symm and read on a peer."""
    role = p.pick(["local", "symm"])
    p.tensor("in", "X")
    p.tensor("out", "Y")
    p.tensor(role, "T")
    g1 = p.grid()
    two_stores = p.chance(0.25)
    body = f"T{g1.region()} = {p.value(f'X{g1.region()}')}"
    if two_stores:
        p.tensor("out", "Y2")
        body += f"; Y2{g1.region()} = {p.value(f'X{g1.region()}')}"
    load = p.family("tile", "load", g1.names, g1.space(p.width), body)
    source, source_grid = load, g1
    if p.chance(0.33):
        p.tensor("local", "U")
        g2 = p.grid(like=g1)
        mid = p.family("tile", "mid", g2.names, g2.space(p.width),
                       f"U{g2.region()} = {p.value(f'T{g2.region()}')}")
        p.depend(mid, [Dep("load", idx) for idx in p.covering(g2, g1)],
                 [Dep("load", ["*"] * len(g1.names))])
        source, source_grid, tensor = mid, g2, "U"
    else:
        tensor = "T"
    g3 = p.grid(like=source_grid)
    peer = None
    if tensor == "T" and role == "symm" and p.coin():
        k = p.rnd.randint(0, len(PEERS) - 1)
        peer = k
        read = f"T@{PEERS[k]}{g3.region()}"
    else:
        read = f"{tensor}{g3.region()}"
    reads = [read] + ([f"X{g3.region()}"] if p.chance(0.25) else [])
    use = p.family("tile", "use", g3.names, g3.space(p.width), f"Y{g3.region()} = {p.value(*reads)}")
    # `load` writes its own copy: the copy `use` reads was written on the rank it names
    ranks = None if peer is None or PEERS[peer] == "rank" else PEERS[peer]
    p.depend(use, [Dep(source.name, idx, ranks) for idx in p.covering(g3, source_grid)],
             [Dep(source.name, ["*"] * len(source_grid.names), "every rank")])


def all_reduce(p: Program) -> None:
    """Y = sum over ranks, straight from the (staged) input or from a symm tensor a tile wrote."""
    g = p.grid()
    if p.coin():
        inout = p.coin()
        if inout:
            p.tensor("inout", "Z")
            p.family("tile", "red", g.names, g.space(p.width), f"Z{g.region()} = sum(Z@s{g.region()} for s in world)")
        else:
            p.tensor("in", "X")
            p.tensor("out", "Y")
            p.family("tile", "red", g.names, g.space(p.width), f"Y{g.region()} = sum(X@s{g.region()} for s in world)")
        return
    p.tensor("in", "X")
    p.tensor("out", "Y")
    p.tensor("symm", "T")
    load = p.family("tile", "load", g.names, g.space(p.width), f"T{g.region()} = {p.value(f'X{g.region()}')}")
    g2 = p.grid(like=g)
    red = p.family("tile", "red", g2.names, g2.space(p.width),
                   f"Y{g2.region()} = sum(T@s{g2.region()} for s in world)")
    p.depend(red, [Dep(load.name, idx, "every rank") for idx in p.covering(g2, g)],
             [Dep(load.name, ["*"] * len(g.names), "every rank")])


def pull(p: Program) -> None:
    """A chunk copies a peer's rows: straight from the staged input, or from a symm tensor a tile wrote."""
    p.tensor("in", "X")
    p.tensor("out", "Y")
    g = p.grid(tile_columns=False) if p.coin() else p.grid()
    k = p.rnd.randint(0, len(PEERS) - 1)
    peer = PEERS[k]
    if p.chance(0.33):
        p.family("chunk", "pull", g.names, g.space(p.width), f"X@{peer}{g.region()} -> Y{g.region()}",
                 engine=p.chunk_engine(), split=p.chance(0.2))
        return
    p.tensor("symm", "T")
    g1 = p.grid(like=g)
    load = p.family("tile", "load", g1.names, g1.space(p.width), f"T{g1.region()} = {p.value(f'X{g1.region()}')}")
    chunk = p.family("chunk", "pull", g.names, g.space(p.width), f"T@{peer}{g.region()} -> Y{g.region()}",
                     engine=p.chunk_engine(), split=p.chance(0.2))
    ranks = None if peer == "rank" else peer
    p.depend(chunk, [Dep(load.name, idx, ranks) for idx in p.covering(g, g1)],
             [Dep(load.name, ["*"] * len(g1.names), "every rank")])


def put(p: Program) -> None:
    """A chunk puts this rank's rows into a peer's symm tensor; a tile there copies them out."""
    p.tensor("in", "X")
    p.tensor("out", "Y")
    p.tensor("symm", "U")
    g = p.grid(tile_columns=False) if p.chance(0.67) else p.grid()
    k = p.rnd.randint(0, len(PEERS) - 2)  # a put to this rank itself is a plain copy: left out
    source_tensor = "X"
    load = None
    if p.coin():
        p.tensor(p.pick(["local", "symm"]), "T")
        g1 = p.grid(like=g)
        load = p.family("tile", "load", g1.names, g1.space(p.width),
                        f"T{g1.region()} = {p.value(f'X{g1.region()}')}")
        source_tensor = "T"
    chunk = p.family("chunk", "push", g.names, g.space(p.width),
                     f"{source_tensor}{g.region()} -> U@{PEERS[k]}{g.region()}",
                     engine=p.chunk_engine(puts=True, whole_rows=not g.cols, copy_engine=False),
                     split=p.chance(0.2))
    if load is not None:
        p.depend(chunk, [Dep(load.name, idx) for idx in p.covering(g, g1)], [Dep(load.name, ["*"] * len(g1.names))])
    g3 = p.grid(like=g)
    use = p.family("tile", "use", g3.names, g3.space(p.width), f"Y{g3.region()} = {p.value(f'U{g3.region()}')}")
    p.depend(use, [Dep(chunk.name, idx, WRITERS[k]) for idx in p.covering(g3, g)],
             [Dep(chunk.name, ["*"] * len(g.names), "every rank")])


def gather(p: Program) -> None:
    """All-gather: every rank's rows into one stacked tensor, pulled (copy engine or SMs) or put, then
    copied out by a tile whose blocks need not line up with the ranks' rows."""
    p.tensor("in", "X")
    p.tensor("out", "Y", "world * N")
    pushed = p.chance(0.33)
    p.tensor("symm" if pushed else p.pick(["local", "symm"]), "G", "world * N")
    whole = ", :" if p.two_d else ""
    blocks = not pushed and p.chance(0.25)
    if pushed:
        chunk = p.family("chunk", "put", ["s"], ["s in world"], f"X -> G@s[rank*N : +N{whole}]",
                         engine=p.chunk_engine(puts=True, copy_engine=False), split=p.chance(0.25))
    elif blocks:  # per block of the rank's rows: a ragged last block runs into the next rank's rows
        gb = p.grid(tile_columns=False, exact_ok=True)
        chunk = p.family("chunk", "gather", ["s", "i"], ["s in world"] + gb.space(p.width),
                         f"X@s{gb.region()} -> G{gb.region('s*N + ')}", engine=p.chunk_engine())
    else:
        chunk = p.family("chunk", "gather", ["s"], ["s in world"], f"X@s -> G[s*N : +N{whole}]",
                         engine=p.chunk_engine())
    g = p.grid(rows="world * N")
    use = p.family("tile", "use", g.names, g.space(p.width), f"Y{g.region()} = {p.value(f'G{g.region()}')}")
    first = f"(i*{g.block})/N"
    last = f"(i*{g.block} + {g.size - 1})/N"
    if p.coin():
        last = f"min({last}, world - 1)"
    owners = [first, last]
    if pushed:
        exact = [Dep(chunk.name, ["rank"], f"({o})") for o in owners]
    elif blocks:
        exact = [Dep(chunk.name, [o, "*"]) for o in owners]
    else:
        exact = [Dep(chunk.name, [o]) for o in owners]
    coarse = [Dep(chunk.name, ["*"] * len(chunk.names), "every rank" if pushed else None)]
    p.depend(use, exact, coarse)


def reduce_add(p: Program) -> None:
    """`reduce add` chunks on SM programs: into an inout tensor, or into a tensor a tile initialises
    (pulled from every rank, or put into every rank), then copied out."""
    p.tensor("in", "X")
    g = p.grid()
    if p.chance(0.33):
        p.tensor("inout", "Z")
        p.family("chunk", "acc", ["s"] + g.names, ["s in world"] + g.space(p.width),
                 f"X@s{g.region()} -> Z{g.region()} reduce add", engine=p.pick(["sms(1)", "sms(2)"]))
        return
    p.tensor("out", "Y")
    pushed = p.coin()
    p.tensor("symm" if pushed else p.pick(["local", "symm"]), "T")
    init = p.family("tile", "init", g.names, g.space(p.width), f"T{g.region()} = {p.value(f'X{g.region()}')}")
    ga = p.grid(like=g)
    if pushed:
        acc = p.family("chunk", "acc", ["s"] + ga.names, ["s in world"] + ga.space(p.width),
                       f"X{ga.region()} -> T@s{ga.region()} reduce add", engine=p.pick(["sms(1)", "sms(2)"]),
                       split=p.chance(0.2))
        p.depend(acc, [Dep(init.name, idx, "s") for idx in p.covering(ga, g, ["i", "j"][:len(ga.names)])],
                 [Dep(init.name, ["*"] * len(g.names), "every rank")])
    else:
        acc = p.family("chunk", "acc", ["s"] + ga.names, ["s in world"] + ga.space(p.width),
                       f"X@s{ga.region()} -> T{ga.region()} reduce add", engine=p.pick(["sms(1)", "sms(2)"]),
                       split=p.chance(0.2))
        p.depend(acc, [Dep(init.name, idx) for idx in p.covering(ga, g)], [Dep(init.name, ["*"] * len(g.names))])
    gu = p.grid(like=ga)
    use = p.family("tile", "use", gu.names, gu.space(p.width), f"Y{gu.region()} = {p.value(f'T{gu.region()}')}")
    p.depend(use, [Dep(acc.name, ["rank" if pushed else "*"] + idx, "every rank" if pushed else None)
                   for idx in p.covering(gu, ga)],
             [Dep(acc.name, ["*"] * len(acc.names), "every rank")])


def scan(p: Program) -> None:
    """A recurrence along the rows: block i+1 of Y is computed from block i, so each instance waits on
    the one before it (a self-edge), in 2-D one wavefront of column blocks at a time."""
    p.tensor("in", "X")
    p.tensor("out", "Y")
    block, size = p.block()
    p.multiple["N"] = math.lcm(p.multiple["N"], size)
    p.least["N"] = max(p.least["N"], 2 * size)
    cols = p.two_d and p.coin()
    col = p.pick(["2", "3"]) if cols else None
    names = ["i", "j"] if cols else ["i"]
    space = [f"i in N / {block}"] + ([f"j in cdiv({p.width}, {col})"] if cols else [])
    rest = (f", j*{col} : +{col}" if cols else ", :") if p.two_d else ""

    def rows(start):
        return f"[{start} : +{block}{rest}]"
    load = p.family("tile", "load", names, space, f"Y{rows(f'i*{block}')} = X{rows(f'i*{block}')}")
    scan_space = [f"i in N / {block} - 1"] + space[1:]
    body = (f"Y{rows(f'(i + 1)*{block}')} = Y{rows(f'i*{block}')} * 0.5 + X{rows(f'(i + 1)*{block}')}")
    step = p.family("tile", "scan", names, scan_space, body)
    here = names[1:]
    p.depend(step, [Dep(load.name, ["i"] + here), Dep(load.name, ["i + 1"] + here), Dep(step.name, ["i - 1"] + here)])


def ring(p: Program) -> None:
    """A store-and-forward ring (an all-gather): at step t every rank passes on the block it received at
    step t - 1 (at step 0 its own), pushing it into the next rank's copy or pulling it from the previous
    rank's, by tiles or SM chunks, in row tiles or whole blocks. A step waits on the previous rank's
    step before it: a family's wait on itself on another rank, written exactly (most of the time),
    reversed, on the same step (a cycle around the ring), the wrong way round, without `mod world`,
    on every rank, or not at all; sometimes ordered backwards."""
    p.tensor("in", "X")
    p.tensor("out", "Y", "world * N")
    p.tensor("symm", "R", "world * N")
    push, chunk = p.coin(), p.coin()
    block, size = p.block()
    whole = chunk and p.coin()  # a chunk may move a rank's whole block: no index but the step
    if not whole:  # a row tile never runs into the next rank's block
        p.multiple["N"] = math.lcm(p.multiple["N"], size)
    width = ", :" if p.two_d else ""
    names, space = (["t"], ["t in world - 1"]) if whole else (["t", "i"], ["t in world - 1", f"i in N / {block}"])
    rows = (lambda at: f"[{at}*N : +N{width}]") if whole else (lambda at: f"[{at}*N + i*{block} : +{block}{width}]")
    p.family("tile", "own", names[1:], space[1:], f"R{rows('rank')} = X{rows('0')}" if whole else
             f"R{rows('rank')} = X[i*{block} : +{block}{width}]")
    previous = "((rank + world - 1) mod world)"
    if push:
        at = "((rank - t) mod world)"
        source, target = f"R{rows(at)}", f"R@((rank + 1) mod world){rows(at)}"
    else:
        at = "((rank - 1 - t) mod world)"
        source, target = f"R@{previous}{rows(at)}", f"R{rows(at)}"
    if chunk:
        fwd = p.family("chunk", "fwd", names, space, f"{source} -> {target}", engine=p.pick(["sms(1)", "sms(2)"]))
    else:
        fwd = p.family("tile", "fwd", names, space, f"{target} = {source}")
    own_index = names[1:]
    fwd.deps.append(Dep("own", own_index, None if push else previous))
    step = ["t - 1"] + names[1:]
    how = p.pick(["exact"] * 12 + ["missing", "reversed", "same", "backwards", "linear", "every", "order"])
    if how == "exact":
        fwd.deps.append(Dep("fwd", step, previous))
    elif how == "reversed":
        fwd.deps.append(Dep("fwd", ["t + 1"] + names[1:], previous))
    elif how == "same":
        fwd.deps.append(Dep("fwd", list(names), previous))
    elif how == "backwards":
        fwd.deps.append(Dep("fwd", step, "((rank + 1) mod world)"))
    elif how == "linear":
        fwd.deps.append(Dep("fwd", step, "(rank - 1)"))
    elif how == "every":
        fwd.deps.append(Dep("fwd", step, "every rank"))
    elif how == "order":
        fwd.deps.append(Dep("fwd", step, previous))
        p.orders.append(f"order fwd by {p.pick(['-t', '(t + rank) mod world', 'i, t' if not whole else '-t'])}")
    if how != "exact":
        p.intent.append(f"ring wait: {how}")
    g = p.grid(rows="world * N", tile_columns=False)
    use = p.family("tile", "use", g.names, g.space(p.width), f"Y{g.region()} = {p.value(f'R{g.region()}')}")
    use.deps += [Dep("own", ["*"] * len(own_index)), Dep("fwd", ["*"] * len(names), previous if push else None)]


def chain(p: Program) -> None:
    """A chained broadcast from rank 0: `seed` runs on rank 0 only, `hop` on the others, each block
    taken from the rank before as soon as it has it (a wait on itself on the previous rank, which
    the guard on rank 0 starts); then every rank copies the blocks out. Sometimes the guards are
    missing or wrong, or a wait is."""
    p.tensor("in", "X")
    p.tensor("out", "Y")
    p.tensor("symm", "B")
    g = p.grid()
    previous = p.pick(["(rank - 1)", "((rank + world - 1) mod world)"])
    seed = p.family("tile", "seed", g.names, g.space(p.width), f"B{g.region()} = {p.value(f'X{g.region()}')}")
    seed.guard = "rank == 0"
    if p.coin():
        hop = p.family("chunk", "hop", g.names, g.space(p.width), f"B@{previous}{g.region()} -> B{g.region()}",
                       engine=p.pick(["sms(1)", "sms(2)"]))
    else:
        hop = p.family("tile", "hop", g.names, g.space(p.width), f"B{g.region()} = B@{previous}{g.region()}")
    hop.guard = p.pick(["rank != 0"] * 6 + ["rank > 0", "rank != 1", None])
    if hop.guard in ("rank != 1", None):
        p.intent.append(f"hop guard: {hop.guard}")
    if p.chance(0.15):
        seed.guard = p.pick(["rank == 1", None])
        p.intent.append(f"seed guard: {seed.guard}")
    hop.deps.append(Dep("seed", list(g.names), previous))
    if p.chance(0.85):
        hop.deps.append(Dep("hop", list(g.names), previous))
    else:
        p.intent.append("no wait of hop on the previous rank's hop")
    g2 = p.grid(like=g)
    use = p.family("tile", "use", g2.names, g2.space(p.width), f"Y{g2.region()} = {p.value(f'B{g2.region()}')}")
    p.depend(use, [Dep(f, idx) for f in ("seed", "hop") for idx in p.covering(g2, g)],
             [Dep(f, ["*"] * len(g.names)) for f in ("seed", "hop")])


def to_root(p: Program) -> None:
    """A reduction on one rank only (`if rank == R`): into an out tensor left unwritten elsewhere, or
    into a symm tensor that every rank then reads from the root (an all-reduce through a root), whose
    wait names the root, another rank, or every rank."""
    p.tensor("in", "X")
    p.tensor("out", "Y")
    g = p.grid()
    root = p.pick(["0", "1", "world - 1"])
    if p.coin():
        red = p.family("tile", "red", g.names, g.space(p.width), f"Y{g.region()} = sum(X@s{g.region()} for s in world)")
        red.guard = p.pick([f"rank == {root}"] * 4 + GUARDS)
        return
    p.tensor("symm", "T")
    red = p.family("tile", "red", g.names, g.space(p.width), f"T{g.region()} = sum(X@s{g.region()} for s in world)")
    red.guard = f"rank == {root}"
    g2 = p.grid(like=g)
    back = p.family("tile", "back", g2.names, g2.space(p.width), f"Y{g2.region()} = {p.value(f'T@({root}){g2.region()}')}")
    wrong = "0" if root != "0" else "1"
    p.depend(back, [Dep("red", idx, f"({p.pick([root] * 6 + [wrong])})") for idx in p.covering(g2, g)],
             [Dep("red", ["*"] * len(g.names), "every rank")])


PATTERNS = [local_chain, local_chain, all_reduce, pull, put, gather, reduce_add, scan, ring, chain, to_root]


def generate(seed: int) -> Generated:
    """One program, every choice taken from a `random.Random(seed)`."""
    rnd = random.Random(seed)
    two_d = rnd.random() < 0.35
    p = Program(rnd, two_d)
    if two_d and p.coin():
        p.width = str(p.pick([3, 4, 5]))
    elif two_d:
        p.width = "M"
        p.params.append("M")
        p.multiple["M"], p.least["M"] = 1, 2
    pattern = p.pick(PATTERNS)
    pattern(p)
    p.extras()
    p.intent.insert(0, f"seed {seed}: {pattern.__name__}" + (" 2-D" if two_d else ""))
    sizes = None
    if rnd.random() < 0.4:  # sizes of our own, often ragged; otherwise tiledsl's default sizes
        sizes = {}
        for world in WORLDS:
            sizes[world] = {}
            for param in p.params:
                least, multiple = p.least[param], p.multiple[param]
                value = rnd.randint(least, max(least, 9))
                sizes[world][param] = -(-value // multiple) * multiple
    return Generated(p.source(f"gen_{pattern.__name__}"), sizes, "; ".join(p.intent))


def schedules() -> st.SearchStrategy[Generated]:
    """Generated programs. Hypothesis draws a seed and a `random.Random` makes every choice: hypothesis's
    own draws lean towards their simplest values, which would make most programs alike (as in
    tests/grammar/test_fuzz.py). `generate(seed)` rebuilds a program from the seed its intent names."""
    return st.integers(0, 2**32 - 1).map(generate)


def batches(size: int) -> st.SearchStrategy[list[Generated]]:
    """`size` programs from consecutive seeds: distinct examples are distinct batches (a list of
    `schedules()` repeats the simplest seeds from one example to the next)."""
    return st.integers(0, 2**32 // size - 1).map(lambda first: [generate(first * size + k) for k in range(size)])
