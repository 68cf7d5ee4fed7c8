"""Lowering: a checked schedule becomes a typed kernel plan. One persistent Triton kernel runs every
family that uses SMs: families with a fixed program count get a program-id range each, the others share
the remaining programs and run one after another in the family sequence. Copy-engine chunks are issued
by the host on the communication stream. Every edge becomes waits on single-writer signal slots
(`sig_<producer>[writer rank, instance * split + part]`) that count epochs, so calls need no reset.

What runs, in which order and what each edge waits for is the schedule's meaning
(`schedule/meaning.py`), read here as it is read by the checker and the reference. The plan holds
sympy expressions and small records, never code; the templates print it (`render.py`)."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from dataclasses import dataclass, field

import sympy

from tiledsl import gpus
from tiledsl.codegen.body import (Fence, If, LoweringError, Product, Put, Record, Statement, Wait, chunk_body,
                                  tile_body, walk)
from tiledsl.codegen.device import DeviceValues, GuardSite, Sites
from tiledsl.codegen.interface import INSTANCE, PART, KernelInterface, interface_of
from tiledsl.schedule import ir, meaning
from tiledsl.version import __version__


@dataclass(frozen=True)
class Notify:
    """After an instance: its slot holds this call's epoch, on this rank or on every rank (a waiter
    elsewhere reads its own copy of the signals): through peer pointers on ranks `first` .. `stop`-1,
    and where waiters sit on other nodes (`remote`), through an NVSHMEM signal on each of their ranks."""
    every_rank: bool
    slot: sympy.Expr
    edges: tuple[str, ...] = ()  # the edges that wait on it (`file:line` and text)
    first: sympy.Expr | None = None  # every_rank: the ranks reached through pointers, the node's
    stop: sympy.Expr | None = None
    # the other nodes' ranks: (loop variable, its extent, the rank it names), each signalled by NVSHMEM
    remote: tuple[sympy.Symbol, sympy.Expr, sympy.Expr] | None = None

    @property
    def reach(self) -> str:
        """What the launcher is told: "local", "all" (the one node), "node" or "world"."""
        if not self.every_rank:
            return "local"
        if self.remote is not None:
            return "world"
        return "node" if self.first is not None and self.first != 0 else "all"


@dataclass(frozen=True)
class HostRegion:
    """A region as the host slices it: (start, size) per dimension, size None for a point index."""
    tensor: str
    owner: sympy.Expr | None
    dims: tuple[tuple[sympy.Expr, sympy.Expr | None], ...]


@dataclass(frozen=True)
class HostWait:
    """The communication stream waits until `producer`'s count of row `row` reaches `count`, where
    `exists` (the row is one of the producer's: otherwise the edge names nothing and there is no wait),
    once for each value of `loops` (`mm[*, *]`: every row; `@ every rank`: every writer). A producer
    some copy engine of another rank waits on counts in every rank's copy, one row list per writer
    rank (`writer`, `slots` rows apart); None: only its own rank's."""
    edge: int
    producer: str
    row: sympy.Expr
    count: sympy.Expr
    exists: sympy.Basic = sympy.true
    writer: sympy.Expr | None = None
    slots: sympy.Expr | None = None
    loops: tuple[tuple[sympy.Symbol, sympy.Expr], ...] = ()

    @property
    def index(self) -> sympy.Expr:
        """The count's element on this rank."""
        return self.row if self.writer is None else self.writer * self.slots + self.row


@dataclass(frozen=True)
class HostCopy:
    """A copy-engine chunk instance: one cuMemcpyAsync of `source` into `target`, after its waits."""
    source: HostRegion
    target: HostRegion
    waits: tuple[HostWait, ...]


@dataclass(frozen=True)
class Family:
    name: str
    kind: str                                            # "tile" or "chunk"
    engine: str                                          # "sms", "nvshmem" or "copy_engine"
    where: str                                           # `file:line` and the declaration's text
    indices: tuple[tuple[sympy.Symbol, sympy.Expr], ...]  # kernel extents (let names kept)
    host_extents: tuple[sympy.Expr, ...]                 # the same over params, consts and world
    split: int                                           # parts per instance, each signalled alone
    programs: int | None                                 # a fixed program count; None: the shared rest
    order: tuple[sympy.Expr, ...] | None                 # host: what it runs by; None: instance number order
    flatten: bool                # the persistent loop and the K loop are one pipeline
    body: tuple[Statement, ...]  # its waits first, then what it computes
    notify: Notify | None
    count_row: sympy.Expr | None  # after each instance, one more in this row's count (copy engine waits)
    host: HostCopy | None
    product: Product | None
    tma_target: str | None
    blocks: tuple[tuple[str, sympy.Expr], ...] = ()      # launch-time constexpr blocks and the sizes they cover
    head: tuple[Statement, ...] = ()                     # once per program, before its instances (aranges)
    lets: tuple[tuple[sympy.Symbol, sympy.Expr], ...] = ()  # let names its kernel code uses, in order
    warps: int = 4                                       # warps its largest block needs (codegen/blocks.py)
    # `if rank == root`: the ranks its programs run it on (over rank, params, consts, world and topology
    # sizes: what the kernel's dispatch has); true on every rank
    runs_on: sympy.Basic = sympy.true
    # ranks first .. stop-1 (every rank of the node) keep the row's count too, in their copies at this
    # rank's rows: a copy engine there waits on it (schedule/transport.py refuses one on another node)
    count_peers: tuple[sympy.Expr, sympy.Expr] | None = None

    @property
    def count(self) -> sympy.Expr:
        return sympy.Mul(*(extent for _, extent in self.indices))

    @property
    def host_count(self) -> sympy.Expr:
        return sympy.Mul(*self.host_extents)

    @property
    def row(self) -> sympy.Expr:
        """This instance's part among the family's slots: its signal slot on a rank, its timeline row."""
        return INSTANCE * self.split + (PART if self.split > 1 else 0)

    @property
    def slots(self) -> sympy.Expr:
        """Signal slots per writer rank."""
        return self.count * self.split

    @property
    def waits(self) -> tuple[Wait, ...]:
        return tuple(s for s in walk(self.body) if isinstance(s, Wait))

    @property
    def on_sms(self) -> bool:
        return self.engine != "copy_engine"

    @property
    def puts(self) -> bool:
        """An NVSHMEM put, which signals with its data (the other families notify after each instance)."""
        return any(isinstance(s, Put) for s in walk(self.body))

    @property
    def decode(self) -> tuple[tuple[sympy.Symbol, sympy.Expr], ...]:
        """Each index from the linear instance number `tds_inst` (the last index varies fastest)."""
        out, inner = [], sympy.Integer(1)
        for n in range(len(self.indices) - 1, -1, -1):
            symbol, extent = self.indices[n]
            value = sympy.floor(INSTANCE / inner) if inner != 1 else INSTANCE
            out.append((symbol, value if n == 0 else sympy.Mod(value, extent)))
            inner = inner * extent
        return tuple(reversed(out))


@dataclass(frozen=True)
class Tensor:
    name: str
    role: str
    dtype: str
    shape: tuple[sympy.Expr, ...]  # over params, consts and world
    peers: bool                    # the kernel reaches other ranks' copies (a peer offset table)
    staged: bool                   # a caller tensor read on peers: copied into the heap at each call
    where: str
    shmem: bool = False            # NVSHMEM puts into or gets from other ranks' copies (its stand-ins' PE table)


@dataclass(frozen=True)
class KernelPlan:
    name: str
    path: str
    source_hash: str
    version: str
    params: tuple[str, ...]
    consts: dict[str, int]
    tensors: tuple[Tensor, ...]
    families: tuple[Family, ...]                          # in the family sequence
    param_sources: dict[str, tuple[str, int, sympy.Expr]]  # param -> (tensor, dim, its value over tds_value)
    conditions: tuple[tuple[sympy.Expr, str], ...]         # (must hold, message)
    distributed: bool                                      # peer access or a cross-rank edge: an entry barrier
    uses_nvshmem: bool
    edges: tuple[str, ...]                                 # edge texts by number, for error messages
    interface: KernelInterface = field(default=None)
    guards: tuple[GuardSite, ...] = ()                     # what each guard site reports (codegen/device.py)
    # written for several nodes: topology sizes are arguments, and the entry barrier has two levels
    spans_nodes: bool = False

    @property
    def kernel_families(self) -> tuple[Family, ...]:
        return tuple(f for f in self.families if f.on_sms)

    @property
    def copy_families(self) -> tuple[Family, ...]:
        return tuple(f for f in self.families if not f.on_sms)

    def describe(self) -> str:
        from tiledsl.codegen.describe import describe
        return describe(self)


VALUE = sympy.Symbol("tds_value", integer=True, positive=True)  # a tensor dimension, solved for a param


def source_line(schedule: ir.Schedule, span) -> str:
    lines = schedule.program.source.splitlines()
    text = " ".join(lines[span.line - 1].split("#")[0].split()) if 0 < span.line <= len(lines) else ""
    return f"{schedule.program.path}:{span.line} {text}"


def lower(schedule: ir.Schedule, consts: dict[str, int] | None = None, gpu=None) -> KernelPlan:
    """Plan the kernel, the signals and the host steps for a checked schedule (its program counts
    resident on `gpu`, tiledsl.gpus: the default H200's)."""
    consts = {**schedule.consts, **(consts or {})}
    from tiledsl.codegen.blocks import BUILD_OPTIONS
    for name, value in consts.items():
        if name not in schedule.consts and name not in BUILD_OPTIONS:  # how block tiles are built: any program
            raise LoweringError(f"'{name}' is not a const of {schedule.name}; consts: {', '.join(schedule.consts)}")
        if name in schedule.tunables and value not in schedule.tunables[name]:
            raise LoweringError(f"{name}={value} is not one of its choices {list(schedule.tunables[name])}")
    _check_program_counts(schedule, consts, gpus.named(gpu))
    for tensor in schedule.tensors.values():
        if tensor.dtype == "float64":
            # tiles compute in float32 and tl.dot has no f64 product on Hopper: an f64 program would
            # run, rounded to float32 on the way, and look right
            raise LoweringError(f"tensor '{tensor.name}' is f64, which code generation does not emit: tiles "
                                "compute in float32", tensor.span,
                                "declare it f32 (or bf16), and convert to float64 in torch where it is needed")
    schedule = _resolve_splits(schedule, consts)
    kernel = let_names(schedule)
    cross_rank = {e.producer for e in schedule.edges if e.ranks is not ir.RankSet.LOCAL}
    reach = meaning.notify_reach(schedule)
    # producers with a waiting kernel family signal epochs; a copy-engine consumer waits on counts
    waited = {e.producer for e in schedule.edges
              if schedule.families[e.consumer].engine.kind is not ir.EngineKind.COPY_ENGINE}
    counted = {e.producer for e in schedule.edges
               if schedule.families[e.consumer].engine.kind is ir.EngineKind.COPY_ENGINE}
    sm_chunks = any(f.kind is ir.Kind.CHUNK and f.engine.kind is not ir.EngineKind.COPY_ENGINE
                    for f in schedule.families.values())
    families = []
    sites = Sites(schedule)
    for name in meaning.family_sequence(schedule):
        family = schedule.families[name]
        notify = None
        if name in waited or family.puts:  # a put always signals
            notify = _notify(schedule, family, kernel, name in cross_rank, reach.get(name))
        try:
            families.append(_family(schedule, family, consts, kernel, notify, name in counted, sm_chunks, reach,
                                    sites))
        except LoweringError as why:  # reported at the family's line where the raise names no site
            raise why if why.span is not None else LoweringError(str(why), family.span, why.hint) from None
    # an NVSHMEM put's target and a get's source are reached by NVSHMEM, not through a peer pointer
    nvshmem = [f for f in schedule.families.values() if f.engine.kind is ir.EngineKind.NVSHMEM]
    shmem = {f.writes[0] if f.puts else f.reads[0] for f in nvshmem}
    peers = {r.tensor for f in schedule.families.values() for r in f.reads + f.writes if r.owner is not None
             and r not in shmem}
    puts = {r.tensor for r in shmem}
    staged = set(schedule.staged_inputs())
    tensors = tuple(Tensor(t.name, t.role.value, t.dtype, t.shape, t.name in peers, t.name in staged,
                           source_line(schedule, t.span), t.name in puts) for t in schedule.tensors.values())
    plan = KernelPlan(
        name=schedule.name, path=schedule.program.path,
        source_hash=hashlib.sha256(schedule.program.source.encode()).hexdigest()[:16],
        version=__version__, params=tuple(schedule.params), consts=consts, tensors=tensors,
        families=tuple(families), param_sources=param_sources(schedule), conditions=conditions(schedule),
        distributed=bool(peers) or bool(cross_rank),
        uses_nvshmem=any(f.engine == "nvshmem" or (f.notify is not None and f.notify.remote is not None)
                         for f in families) or (schedule.spans_nodes and (bool(peers) or bool(cross_rank))),
        edges=tuple(source_line(schedule, e.span) for e in schedule.edges), guards=tuple(sites.sites),
        spans_nodes=schedule.spans_nodes)
    return KernelPlan(**{**plan.__dict__, "interface": interface_of(plan)})


def _notify(schedule: ir.Schedule, family: ir.Family, kernel, cross_rank: bool, reach) -> Notify:
    """Where a family's signal goes: its own rank, the ranks of the node (every rank of a program that
    runs within one node) through peer pointers, and the other nodes' ranks through NVSHMEM signals."""
    slot = ir.RANK * _slots(family, kernel) + INSTANCE * family.split + (PART if family.split > 1 else 0)
    edges = tuple(source_line(schedule, e.span) for e in schedule.edges if e.producer == family.name)
    if not cross_rank or family.puts:
        return Notify(cross_rank, slot, edges)  # a put's signal goes with its data, to the rank it writes
    if not schedule.spans_nodes:
        return Notify(True, slot, edges, sympy.Integer(0), ir.WORLD)  # every rank is the one node's
    first = ir.NODE * ir.LOCAL_WORLD
    remote = None
    if reach is meaning.Reach.WORLD:
        # the ranks of the next nodes in turn: world - local_world of them
        peer = ir.index_symbol("tds_remote")
        remote = (peer, ir.WORLD - ir.LOCAL_WORLD, sympy.Mod(first + ir.LOCAL_WORLD + peer, ir.WORLD))
    return Notify(True, slot, edges, first, (ir.NODE + 1) * ir.LOCAL_WORLD, remote)


def _family(schedule, family: ir.Family, consts, kernel, notify, counted: bool, sm_chunks: bool,
            reach: dict, sites) -> Family:
    on_sms = family.engine.kind is not ir.EngineKind.COPY_ENGINE
    product = tma_target = None
    body: tuple = ()
    blocks: tuple = ()
    head: tuple = ()
    warps = 4
    every = tuple(_waits(schedule, family, kernel, reach)) if on_sms else ()
    # a `wait` in the tile's loop waits at the top of each step; the family's edges before it starts
    waits = tuple(w for w in every if schedule.edges[w.edge].loop is None)
    step_waits = tuple(w for w in every if schedule.edges[w.edge].loop is not None)
    if family.kind is ir.Kind.TILE:
        tile = tile_body(schedule, family, consts, kernel, step_waits, sites)
        body, product, tma_target, blocks = tile.statements, tile.product, tile.tma_target, tile.blocks
        body = _past_valid(schedule, family, kernel, sites, body)
        head, warps = tile.head, tile.warps
    elif on_sms:
        body = chunk_body(schedule, family, kernel, sites)
    # a product's TMA loads read what its waits acquired, through another proxy: a fence between them
    body = waits + ((Fence(),) if waits and product is not None else ()) + body
    if on_sms:  # timeline stamps, compiled out unless traced
        body = (Record(0),) + body[:len(waits)] + (Record(1),) + body[len(waits):] + (Record(2),)
    # Flattening lets the pipeliner issue the next tile's TMA loads before that tile's wait: only a
    # product that waits on nothing may be flattened (seen on H200: stale rows of A_all otherwise). A
    # count in a flattened loop, or a chunk's copy loop in the same kernel, stops Triton 3.6-3.9 from
    # pipelining it at all (one shared-memory stage: 64 KB against 147 KB for gemm_rs_ce).
    flatten = product is not None and not waits and not counted and not sm_chunks
    ordered = meaning.ordered(schedule, family) or not on_sms
    built = Family(
        name=family.name, kind=family.kind.value, engine=family.engine.kind.value,
        where=source_line(schedule, family.span),
        indices=tuple((s, kernel(e)) for s, e in family.indices),
        host_extents=tuple(e for _, e in family.indices), split=family.split,
        programs=family.engine.count(consts),
        order=meaning.order_keys(schedule, family) if ordered else None, flatten=flatten, body=body,
        notify=notify,
        count_row=(kernel(family.indices[0][0]) if family.indices else sympy.Integer(0)) if counted else None,
        host=None if on_sms else _host_copy(schedule, family), product=product, tma_target=tma_target,
        blocks=blocks, head=head, warps=warps, runs_on=meaning.runs_at(family, ir.RANK),
        count_peers=_count_ranks(schedule) if counted and counts_peers(schedule, family.name) else None)
    return Family(**{**built.__dict__, "lets": _lets_used(schedule, built, kernel)})


def _past_valid(schedule, family: ir.Family, kernel, sites, body: tuple) -> tuple:
    """A tile whose writes may all lie past the valid rows of a tensor declared `upto` a count runs its
    body only where they do not (meaning.runs_when), after fetching the counts."""
    condition = meaning.runs_when(schedule, family)
    if condition is sympy.true:
        return body
    fetches: list = []
    names: list[str] = []
    values = DeviceValues(schedule, kernel, sites, lambda hint: names.append(f"tds_valid_{hint}{len(names) or ''}")
                          or names[-1], consts={})
    condition = values.read(kernel(condition), fetches)
    return (*fetches, If(condition, body))


def _slots(family: ir.Family, kernel) -> sympy.Expr:
    return kernel(sympy.Mul(*(e for _, e in family.indices))) * family.split


def _waits(schedule: ir.Schedule, family: ir.Family, kernel, reach: dict):
    for number, edge in enumerate(schedule.edges):
        if edge.consumer != family.name:
            continue
        producer = schedule.families[edge.producer]
        target = meaning.target(schedule, edge)
        # a slot NVSHMEM writes (a put's signal, or a signal from another node): NVSHMEM's own wait
        # follows, where the program runs on several nodes
        shmem = schedule.spans_nodes and (producer.puts or reach.get(producer.name) is meaning.Reach.WORLD)
        loops, index = [], []
        for mapped, (symbol, extent) in zip(target.index, producer.indices):
            if mapped is None:
                # not a name the family's own loop uses (an index named t would be tds_t, its loop's)
                var = ir.index_symbol(f"tds_{symbol.name}" + ("_" if symbol.name in ("t", "inst", "part") else ""))
                loops.append((var, kernel(extent)))
                index.append(var)
            else:
                index.append(kernel(mapped))
        writer = target.rank
        if writer is None:
            writer = ir.index_symbol("tds_rank")
            loops.append((writer, ir.WORLD))
        elif target.over is not None:  # `@ (r for s in n)`: one wait on each of those ranks
            loops.append((target.over[0], kernel(target.over[1])))
        # `*` over a run of the producer's indices names slots a fixed stride apart (consecutive where
        # the run is the last indices, which vary fastest): one ranged wait reads them a vector at a
        # time (sync.wait_span) instead of one loop step each, which cost every GEMM tile of
        # ag_group_gemm one round trip per pack instance, and every reduction tile of moe_gemm_rs
        # (`mm[rank, *, *, n]`) one per expert and row block
        span, stride = sympy.Integer(1), sympy.Integer(1)
        end, run = _star_run(target.index, loops, target.exists) if not shmem else (0, 0)
        if run and end < len(producer.indices) and producer.split > 1:
            run = 0  # an instance's parts are consecutive slots: a run of them is not one stride apart
        for n in range(end - run, end):
            span = span * kernel(producer.indices[n][1])
            loops.remove((index[n], kernel(producer.indices[n][1])))
            index[n] = sympy.Integer(0)
        for n in range(end, len(producer.indices)) if run else ():
            stride = stride * kernel(producer.indices[n][1])
        instance = sympy.Integer(0)
        for i, (_, extent) in zip(index, producer.indices):
            instance = instance * kernel(extent) + i
        # the producer's parts are consecutive slots, read at once (sync.wait_parts)
        slot = kernel(writer) * _slots(producer, kernel) + instance * producer.split
        # a producer with an `if` has instances on the writer's rank only where it holds there
        exists = sympy.And(kernel(target.exists), meaning.runs_at(producer, writer))
        yield Wait(number, source_line(schedule, edge.span), producer.name, tuple(loops), slot,
                   exists, shmem, producer.split,
                   (span * producer.split if stride == 1 else span) if run else None, stride)


def _star_run(mapped: tuple, loops: list, exists) -> tuple[int, int]:
    """(end, length) of the last run of consecutive producer indices an edge names with `*` (and its
    existence test does not read), indices end - length .. end - 1: their instances are slots one
    stride apart, the stride being the instances of the indices after the run. (0, 0) where none."""
    used = sympy.sympify(exists).free_symbols
    star = iter(reversed([var for var, _ in loops[:sum(m is None for m in mapped)]]))
    end, length = 0, 0
    for n in reversed(range(len(mapped))):
        if mapped[n] is not None:
            if length:
                break
            continue
        if next(star) in used:
            break
        end, length = (n + 1 if not length else end), length + 1
    return end, length


def counts_peers(schedule: ir.Schedule, producer: str) -> bool:
    """Whether a copy-engine chunk waits on `producer`'s instances of another rank: the producer then
    counts each instance in every rank's copy of its counts (at its own rank's rows), so that the
    stream there waits on a count in its own GPU's memory, as it does for its own rank's tiles."""
    return any(e.producer == producer and e.ranks is not ir.RankSet.LOCAL
               and schedule.families[e.consumer].engine.kind is ir.EngineKind.COPY_ENGINE for e in schedule.edges)


def _count_ranks(schedule: ir.Schedule) -> tuple[sympy.Expr, sympy.Expr]:
    """The ranks whose copies of a count this rank's tiles reach through peer pointers: its node's."""
    if not schedule.spans_nodes:
        return sympy.Integer(0), ir.WORLD
    return ir.NODE * ir.LOCAL_WORLD, (ir.NODE + 1) * ir.LOCAL_WORLD


def _host_copy(schedule: ir.Schedule, family: ir.Family) -> HostCopy:
    """A copy-engine chunk's copy and the waits of the stream before it: the stream can wait on one
    count at a time, so an edge must name whole rows of a kernel family's instances, `mm[i, *]` (or
    `red[i]`), or all of them, `mm[*, *]`, on this rank or others (`@ s`, `@ every rank`): the
    producer counts its instances per first index, and the stream waits until each row's count
    reaches its number of instances (counts are zeroed at each call). A count kept for other ranks
    (`counts_peers`) is written by the producer's rank into this rank's copy; zeroing it at the next
    call cannot lose an increment, because this call's wait on it saw every one."""
    waits = []
    for number, edge in enumerate(schedule.edges):
        if edge.consumer != family.name:
            continue
        producer = schedule.families[edge.producer]
        # a family of one instance (no index list) is its own row 0
        first, rest = (edge.index_map[0], edge.index_map[1:]) if edge.index_map else (sympy.Integer(0), ())
        if producer.engine.kind is ir.EngineKind.COPY_ENGINE or any(m is not None for m in rest):
            raise LoweringError(
                f"chunk '{family.name}' on the copy engine can wait only on rows of a kernel family, like "
                f"`{producer.name}[i{', *' * len(rest)}]` or `{producer.name}[*{', *' * len(rest)}]`; this edge "
                f"names " + ("a copy-engine chunk" if producer.engine.kind is ir.EngineKind.COPY_ENGINE
                             else "part of a row"),
                edge.span,
                "run the chunk on SMs (`on sms(4)`), which may wait on any instances, or wait on rows of a "
                "tile family: index the chunk like the tile's first index")
        target = meaning.target(schedule, edge)
        loops = []
        if first is None:  # `*` at the first index: every row, one wait each
            first = ir.index_symbol("tds_row")
            loops.append((first, producer.indices[0][1]))
        writer = target.rank
        if writer is None:  # `@ every rank`
            writer = ir.index_symbol("tds_writer")
            loops.append((writer, ir.WORLD))
        elif target.over is not None:  # `@ (r for s in n)`: one wait on each of those ranks
            loops.append(target.over)
        count = sympy.Mul(*[extent for _, extent in producer.indices[1:]]) * producer.split
        exists = sympy.And(target.exists, meaning.runs_at(producer, writer))
        peers = counts_peers(schedule, producer.name)
        waits.append(HostWait(number, producer.name, first, count, exists, writer if peers else None,
                              sympy.Mul(*[e for _, e in producer.indices]) if peers else None, tuple(loops)))

    def region(r: ir.Region) -> HostRegion:
        return HostRegion(r.tensor, r.owner, tuple((d.start, d.size if d.kept else None) for d in r.dims))
    return HostCopy(region(family.reads[0]), region(family.writes[0]), tuple(waits))


# ---- let names in kernel code ----------------------------------------------------------------------

def let_names(schedule: ir.Schedule):
    """A function that rewrites a kernel expression with the program's `let` names where that makes
    it shorter: `floor(BM*i*world/M)` becomes `floor(BM*i/Ms)` for `let Ms = M / world`. Exact: a let
    stands for its value, and the kernel computes that value once at the top of each family."""
    rules = []
    for name, value in schedule.lets:
        symbol = ir.size_symbol(name)
        solved = {}
        for param in sorted(value.free_symbols, key=str):
            if param.name not in schedule.params:
                continue
            try:
                solution = sympy.solve(sympy.Eq(value, symbol), param)
            except NotImplementedError:  # a let sympy cannot invert (a ceiling): matched as written only
                continue
            if len(solution) == 1:
                solved = {param: solution[0]}
                break
        rules.append((symbol, value, solved))

    @functools.lru_cache(maxsize=None)
    def kernel(expr) -> sympy.Expr:
        expr = sympy.sympify(expr)
        for symbol, value, solved in rules:
            if not expr.free_symbols & value.free_symbols:
                continue
            candidates = [expr.subs(value, symbol)]
            if solved:
                candidates.append(candidates[0].subs(solved))
            best = min(candidates, key=sympy.count_ops)
            if sympy.count_ops(best) < sympy.count_ops(expr):
                expr = best
        return expr
    return kernel


def let_values(schedule: ir.Schedule, kernel) -> list[tuple[sympy.Symbol, sympy.Expr]]:
    """Each let's symbol and its value in kernel terms (earlier lets by name), after the topology's
    `node` and `local_rank` as what they stand for, where the program names the topology."""
    out = list(ir.RANK_PARTS.items()) if schedule.spans_nodes else []
    for name, value in schedule.lets:
        symbol = ir.size_symbol(name)
        rewritten = value
        for earlier, earlier_value in out:
            if earlier in ir.RANK_PARTS:
                continue
            original = dict(schedule.lets)[earlier.name]
            rewritten = rewritten.subs(original, earlier)
        out.append((symbol, rewritten))
    return out


def _lets_used(schedule: ir.Schedule, family: Family, kernel) -> tuple[tuple[sympy.Symbol, sympy.Expr], ...]:
    from tiledsl.codegen.interface import symbols_of
    values = let_values(schedule, kernel)
    wanted = symbols_of(family) & {s for s, _ in values}
    for symbol, value in reversed(values):  # a let used by a used let is used too
        if symbol in wanted:
            wanted |= value.free_symbols & {s for s, _ in values}
    return tuple((s, v) for s, v in values if s in wanted)


# ---- host side -------------------------------------------------------------------------------------

def _resolve_splits(schedule: ir.Schedule, consts: dict[str, int]) -> ir.Schedule:
    """The schedule with every `split` a number: a split written over consts (`split PIECES`) takes the
    values built. The meaning does not depend on it (an instance is complete when all its parts are)."""
    if all(isinstance(f.split, int) for f in schedule.families.values()):
        return schedule
    families = {name: dataclasses.replace(f, split=f.parts(consts)) for name, f in schedule.families.items()}
    return dataclasses.replace(schedule, families=families)


def _check_program_counts(schedule: ir.Schedule, consts: dict[str, int], gpu: gpus.GPU) -> None:
    """The checker proved the program counts fit on the GPU with the consts' defaults; counts that
    are expressions of consts (`sms(RED_SMS)`) are checked again with the values built."""
    on_sms = [f for f in schedule.families.values() if f.engine.kind is not ir.EngineKind.COPY_ENGINE]
    fixed = {f.name: f.engine.count(consts) for f in on_sms if f.engine.programs is not None}
    spare = 1 if any(f.engine.programs is None for f in on_sms) else 0
    if any(n <= 0 for n in fixed.values()) or sum(fixed.values()) > gpu.sms - spare:
        asks = ", ".join(f"'{name}' {n}" for name, n in fixed.items())
        raise LoweringError(f"with these consts the families ask for {asks} SM programs: each needs at least one, "
                            f"and together at most {gpu.sms - spare} of the {gpu.name}'s {gpu.sms} SMs"
                            + (", one left for sms(rest)" if spare else ""))


def param_sources(schedule: ir.Schedule) -> dict[str, tuple[str, int, sympy.Expr]]:
    """For each param, a caller tensor dimension that determines it, and the param's value over that
    dimension's size (`tds_value`)."""
    found = {}
    for tensor in schedule.tensors.values():
        if tensor.role not in (ir.Role.IN, ir.Role.OUT, ir.Role.INOUT):
            continue
        for dim, extent in enumerate(tensor.shape):
            unknown = [p for p in schedule.params if p not in found and ir.size_symbol(p) in extent.free_symbols]
            others = {s.name for s in extent.free_symbols} - set(schedule.consts) - {"world"}
            if len(unknown) != 1 or others != set(unknown):
                continue
            solutions = sympy.solve(sympy.Eq(extent, VALUE), ir.size_symbol(unknown[0]))
            if len(solutions) == 1:
                found[unknown[0]] = (tensor.name, dim, solutions[0])
    missing = [p for p in schedule.params if p not in found]
    if missing:
        raise LoweringError(f"cannot infer {', '.join(missing)} from the shapes of the caller's tensors")
    return found


def conditions(schedule: ir.Schedule) -> tuple[tuple[sympy.Expr, str], ...]:
    out, seen = [], set()
    for condition in schedule.conditions:
        if condition.holds not in seen:
            seen.add(condition.holds)
            out.append((condition.holds, f"{condition.message} ({schedule.program.path}:{condition.span.line})"))
    return tuple(out)
