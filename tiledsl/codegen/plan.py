"""Lowering: the schedule becomes a kernel plan. One persistent Triton kernel runs every family that
uses SMs: chunk families with a fixed program count first (a program-id range each), then the tile
families, which the remaining programs run one after another in dependency order. Copy-engine chunks
are issued by the host on the communication stream. Every edge becomes waits on single-writer signal
slots (`sig_<producer>[writer rank, instance]`) that count epochs, so calls need no reset between them."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import networkx as nx
import sympy

import tiledsl
from tiledsl.schedule.intcode import code
from tiledsl.codegen.tilecode import LoweringError, TileLowering
from tiledsl.schedule import ir


@dataclass
class Wait:
    """One edge seen from its consumer: wait until the producer instance(s) reached this epoch."""
    edge_id: int
    where: str          # `programs/ag_gemm.tds:16` and the edge's text, for the generated comment
    producer: str
    loops: list[tuple[str, str]]   # (variable, extent) loops over `*` indices and ranks
    writer: str         # kernel code: the rank whose slot is awaited
    instance: str       # kernel code: the producer's linear instance number
    split: int          # parts per producer instance (each signalled alone)
    slots: str          # kernel code: the producer's slots per writer rank (instances * split)


@dataclass
class FamilyPlan:
    name: str
    kind: str           # "tile" or "chunk"
    engine: str         # "sms", "nvshmem", "copy_engine"
    where: str          # `programs/x.tds:14 tile mm[i, j]`
    index_names: list[str]
    extents: list[str]            # kernel code of each index's extent
    count: str                    # kernel code: number of instances
    host_extents: list[str]       # host code of the same
    programs: int | None          # fixed program count, None for the shared rest
    waits: list[Wait]
    notify: str | None            # None, "local" (own rank's slot) or "all" (every rank's slot)
    split: int = 1
    order_keys: list[str] = field(default_factory=list)  # host code, over the indices, rank and world
    lines: list[str] = field(default_factory=list)        # tile statements
    matmul: dict | None = None
    copy: dict | None = None      # chunk: source/target pointer code, shape and offsets
    decode: list[str] = field(default_factory=list)       # kernel lines: linear instance -> indices
    ordered: bool = False         # instances run in the order of an `order` table
    flatten: bool = False         # the persistent loop and the K loop are one pipeline (TMA loads of the
                                  # next tile start during this tile's epilogue)
    blocks: dict[str, str] = field(default_factory=dict)  # launch-time constexpr block sizes (host code)
    counted: bool = False         # each instance also adds one to a count per first index, which
                                  # copy-engine chunks wait on (the stream cannot wait on many slots)
    host_waits: list = field(default_factory=list)  # copy engine: (producer, host code of the awaited
                                                    # count's index, host code of the count to reach, edge)


    @property
    def slots(self) -> str:
        return f"({self.count}) * {self.split}"


@dataclass
class TensorPlan:
    name: str
    role: str
    dtype: str
    shape: list[str]      # host code over params, consts and world
    peers: bool           # the kernel reaches other ranks' copies (needs a peer offset table)
    staged: bool          # a caller tensor read on peers: copied into the heap at each call
    where: str


@dataclass
class KernelPlan:
    name: str
    path: str
    source_hash: str
    version: str
    params: list[str]
    consts: dict[str, int]
    tensors: list[TensorPlan]
    families: list[FamilyPlan]          # in dependency order
    param_sources: dict[str, tuple[str, int, str]]  # param -> (tensor, dim, host code solving it from `value`)
    conditions: list[tuple[str, str]]   # (host code that must be True, message)
    distributed: bool                   # any peer access or cross-rank edge: calls start with a barrier
    uses_nvshmem: bool
    edges: list[str]                    # edge texts by id, for error messages

    @property
    def kernel_families(self) -> list[FamilyPlan]:
        return [f for f in self.families if f.engine != "copy_engine"]

    @property
    def copy_families(self) -> list[FamilyPlan]:
        return [f for f in self.families if f.engine == "copy_engine"]

    @property
    def signalled(self) -> list[FamilyPlan]:
        return [f for f in self.families if f.notify]

    def describe(self) -> str:
        lines = [f"kernel plan for {self.name} ({self.path})", "families in dependency order:"]
        for f in self.families:
            role = f"{f.programs} programs" if f.programs else "the remaining programs"
            if f.engine == "copy_engine":
                role = "host, communication stream"
            lines.append(f"  {f.kind} {f.name} on {f.engine}: {role}; instances {f.count}; notify {f.notify}")
            for w in f.waits:
                lines.append(f"    waits edge {w.edge_id}: {w.where}")
        lines.append("signals: " + ", ".join(f"sig_{f.name}[world, {f.count} * {f.split}]" for f in self.signalled))
        lines.append(f"entry barrier: {self.distributed}; nvshmem: {self.uses_nvshmem}")
        return "\n".join(lines)


def source_line(schedule: ir.Schedule, span) -> str:
    lines = schedule.program.source.splitlines()
    text = lines[span.line - 1].strip() if 0 < span.line <= len(lines) else ""
    return f"{schedule.program.path}:{span.line} {text}"


def lower(schedule: ir.Schedule, consts: dict[str, int] | None = None) -> KernelPlan:
    """Plan the kernel, the signals and the host steps for a checked schedule."""
    consts = {**schedule.consts, **(consts or {})}
    for name, value in (consts or {}).items():
        if name not in schedule.consts:
            raise LoweringError(f"'{name}' is not a const of {schedule.name}; consts: {', '.join(schedule.consts)}")
        if name in schedule.tunables and value not in schedule.tunables[name]:
            raise LoweringError(f"{name}={value} is not one of its choices {list(schedule.tunables[name])}")
    _check_program_counts(schedule, consts)
    order = dependency_order(schedule)
    cross_rank = {e.producer for e in schedule.edges if e.ranks is not ir.RankSet.LOCAL}
    # producers with a waiting kernel family signal epochs; a copy-engine consumer waits on counts
    waited = {e.producer for e in schedule.edges
              if schedule.families[e.consumer].engine.kind is not ir.EngineKind.COPY_ENGINE}
    families = []
    for name in order:
        family = schedule.families[name]
        families.append(plan_family(schedule, family, consts, waited, cross_rank))
    counted = {wait[0] for f in families for wait in f.host_waits}
    for f in families:
        f.counted = f.name in counted
        # a flattened product with a count in its loop loses its software pipeline (Triton 3.9 gives
        # it one shared-memory stage: 64 KB against 147 KB unflattened for gemm_rs_ce)
        f.flatten = f.flatten and not f.counted
    if any(f.kind == "chunk" and f.engine != "copy_engine" for f in families):
        # With a chunk's copy loop in the same kernel, Triton 3.6-3.9 stop pipelining a flattened
        # product (one shared-memory stage in gemm_ar and gemm_rs_push): keep those unflattened.
        for f in families:
            f.flatten = False
    peers = {r.tensor for f in schedule.families.values() for r in f.reads + f.writes if r.owner is not None}
    staged = set(schedule.staged_inputs())
    tensors = [TensorPlan(t.name, t.role.value, t.dtype, [code(s, kernel=False) for s in t.shape],
                          t.name in peers, t.name in staged, source_line(schedule, t.span))
               for t in schedule.tensors.values()]
    distributed = bool(peers) or bool(cross_rank)
    return KernelPlan(
        name=schedule.name, path=schedule.program.path,
        source_hash=hashlib.sha256(schedule.program.source.encode()).hexdigest()[:16],
        version=tiledsl.__version__, params=list(schedule.params), consts=consts, tensors=tensors,
        families=families, param_sources=param_sources(schedule),
        conditions=conditions(schedule), distributed=distributed,
        uses_nvshmem=any(f.engine == "nvshmem" for f in families),
        edges=[source_line(schedule, e.span) for e in schedule.edges])


def _check_program_counts(schedule: ir.Schedule, consts: dict[str, int]) -> None:
    """The checker proved the program counts fit on the GPU with the consts' defaults; counts that
    are expressions of consts (`sms(RED_SMS)`) are checked again with the values built."""
    from tiledsl.schedule.check import SM_COUNT
    on_sms = [f for f in schedule.families.values() if f.engine.kind is not ir.EngineKind.COPY_ENGINE]
    fixed = {f.name: f.engine.count(consts) for f in on_sms if f.engine.programs is not None}
    spare = 1 if any(f.engine.programs is None for f in on_sms) else 0
    if any(n <= 0 for n in fixed.values()) or sum(fixed.values()) > SM_COUNT - spare:
        asks = ", ".join(f"'{name}' {n}" for name, n in fixed.items())
        raise LoweringError(f"with these consts the families ask for {asks} SM programs: each needs at least one, "
                            f"and together at most {SM_COUNT - spare} of the GPU's {SM_COUNT} SMs"
                            + (", one left for sms(rest)" if spare else ""))


def dependency_order(schedule: ir.Schedule) -> list[str]:
    graph = nx.DiGraph()
    graph.add_nodes_from(schedule.families)
    graph.add_edges_from((e.producer, e.consumer) for e in schedule.edges if e.producer != e.consumer)
    position = {name: n for n, name in enumerate(schedule.families)}
    return list(nx.lexicographical_topological_sort(graph, key=position.get))


def plan_family(schedule, family: ir.Family, consts, waited, cross_rank) -> FamilyPlan:
    names = family.index_names
    extents = [code(e) for _, e in family.indices]
    count = " * ".join(f"({e})" for e in extents) or "1"
    notify = None
    if family.name in waited:
        notify = "all" if family.name in cross_rank else "local"
    plan = FamilyPlan(
        name=family.name, kind=family.kind.value, engine=family.engine.kind.value,
        where=source_line(schedule, family.span), index_names=list(names), extents=extents, count=count,
        host_extents=[code(e, kernel=False) for _, e in family.indices], programs=family.engine.count(consts),
        waits=waits_of(schedule, family), notify=notify, split=family.split,
        order_keys=[code(k, kernel=False) for k in family.order] or list(names),
        decode=decode_lines(family), ordered=bool(family.order))
    if family.kind is ir.Kind.TILE and any(isinstance(s.value, ir.MatMul) or _has_matmul(s.value)
                                           for s in family.stores) and len(names) >= 2:
        # products reuse operands through L2: within the user's order, take tiles in groups of GROUP_M rows
        i, j = names[0], names[1]
        plan.order_keys = plan.order_keys[:len(family.order)] + [f"{i} // {GROUP_M}", j, i]
        plan.ordered = True
        # Flattening lets the pipeliner issue the next tile's TMA loads before that tile's wait: only
        # a product that waits on nothing may be flattened (seen on H200: stale rows of A_all otherwise).
        plan.flatten = not plan.waits
    if plan.engine == "copy_engine":
        plan.host_waits = copy_engine_waits(schedule, family)
    if family.kind is ir.Kind.TILE:
        tile = TileLowering(schedule, family, consts).lower()
        plan.lines, plan.matmul = tile.lines, tile.matmul
        plan.blocks = {name: code(size, kernel=False) for name, size in tile.constexpr_blocks.items()}
    else:
        plan.copy = plan_copy(schedule, family)
    return plan


def copy_engine_waits(schedule: ir.Schedule, family: ir.Family) -> list[tuple[str, str, str, int]]:
    """What a copy-engine chunk waits for before its copy: the communication stream waits on one
    count per edge, so an edge must name one row of a kernel family's instances on this rank,
    `mm[i, *]` (or `red[i]`): the producer counts its instances per first index, and the stream
    waits until the row's count reaches its number of instances (counts are zeroed at each call)."""
    waits = []
    for edge_id, edge in enumerate(schedule.edges):
        if edge.consumer != family.name:
            continue
        producer = schedule.families[edge.producer]
        first, rest = edge.index_map[0], edge.index_map[1:]
        if (producer.engine.kind is ir.EngineKind.COPY_ENGINE or edge.ranks is not ir.RankSet.LOCAL
                or first is None or any(m is not None for m in rest)):
            raise LoweringError(
                f"chunk '{family.name}' on the copy engine can wait only on a row of a kernel family on "
                f"its own rank, like `{producer.name}[i{', *' * len(rest)}]`; "
                f"`{edge.producer}` at {source_line(schedule, edge.span)} is not one")
        count = sympy.Mul(*[extent for _, extent in producer.indices[1:]]) * producer.split
        waits.append((producer.name, code(first, kernel=False), code(count, kernel=False), edge_id))
    return waits


def waits_of(schedule: ir.Schedule, family: ir.Family) -> list[Wait]:
    waits = []
    for edge_id, edge in enumerate(schedule.edges):
        if edge.consumer != family.name or family.engine.kind is ir.EngineKind.COPY_ENGINE:
            continue  # a copy-engine chunk's waits are the stream's (copy_engine_waits)
        producer = schedule.families[edge.producer]
        loops, index_codes = [], []
        for n, (mapped, (sym, extent)) in enumerate(zip(edge.index_map, producer.indices)):
            if mapped is None:
                var = f"tds_w{edge_id}_{n}"
                loops.append((var, code(extent)))
                index_codes.append(var)
            else:
                index_codes.append(f"({code(mapped)})")
        instance = "0"
        for n, (_, extent) in enumerate(producer.indices):
            instance = index_codes[n] if n == 0 else f"({instance}) * ({code(extent)}) + {index_codes[n]}"
        if edge.ranks is ir.RankSet.EVERY:
            loops.append((f"tds_w{edge_id}_rank", "world"))
            writer = f"tds_w{edge_id}_rank"
        elif edge.ranks is ir.RankSet.AT:
            writer = code(edge.rank_expr)
        else:
            writer = "rank"
        waits.append(Wait(edge_id, source_line(schedule, edge.span), producer.name, loops, writer, instance,
                          producer.split, f"({' * '.join(f'({code(e)})' for _, e in producer.indices) or '1'}) "
                                          f"* {producer.split}"))
    return waits


GROUP_M = 8  # rows of tiles taken together by a product: measured 82% -> 99% of cuBLAS at 8192x2048x28672


def _has_matmul(value) -> bool:
    if isinstance(value, ir.MatMul):
        return True
    if isinstance(value, ir.Map):
        return any(_has_matmul(a) for a in value.args)
    return False


def decode_lines(family: ir.Family) -> list[str]:
    """Kernel lines that turn the linear instance number `tds_inst` into the family's indices."""
    lines, rest = [], "tds_inst"
    for n in range(len(family.indices) - 1, -1, -1):
        sym, extent = family.indices[n]
        if n == 0:
            lines.append(f"{sym.name} = {rest}")
        else:
            lines.append(f"{sym.name} = {rest} % ({code(extent)})")
            rest = f"({rest} // ({code(extent)}))"
    return list(reversed(lines))


BLOCK_1D = 8192          # elements per step of a 1-D chunk copy
BLOCK_2D = (64, 256)     # rows x columns per step of a 2-D chunk copy: 32 KB of bf16 in flight


def plan_copy(schedule: ir.Schedule, family: ir.Family) -> dict:
    """A chunk's source and target as kernel pointer arithmetic (SM and nvshmem engines) and as host
    slices (copy engine)."""
    source, target = family.reads[0], family.writes[0]
    fields = {"reduce": family.reduce, "dst_tensor": target.tensor,
              "dst_owner": None if target.owner is None else code(target.owner)}
    bounds = []
    for role, region in (("src", source), ("dst", target)):
        tensor = schedule.tensors[region.tensor]
        offset, index, host_slices, kept = [], [], [], []
        for n, dim in enumerate(region.dims):
            stride = code(sympy.Mul(*tensor.shape[n + 1:]))
            host_start = code(dim.start, kernel=False)
            if dim.kept:
                var = ("tds_r", "tds_c")[len(kept)] if len([d for d in region.dims if d.kept]) == 2 else "tds_r"
                kept.append(dim)
                index.append(f"({code(dim.start)} + {var}) * {stride}")
                bounds.append(f"({code(dim.start)} + {var} < {code(tensor.shape[n])})")
                host_slices.append(f"{host_start} : {host_start} + {code(dim.size, kernel=False)}")
            else:
                offset.append(f"({code(dim.start)}) * {stride}")
                host_slices.append(host_start)
        base = region.tensor
        if region.owner is not None and not (family.engine.kind is ir.EngineKind.NVSHMEM and role == "dst"):
            base = f"({region.tensor} + tl.load(tds_peers_{region.tensor} + {code(region.owner)}))"
        fields[role] = f"({base} + {' + '.join(offset) or '0'})"
        fields[f"{role}_index"] = " + ".join(index)
        fields[f"{role}_host"] = {"tensor": region.tensor, "slices": ", ".join(host_slices),
                                  "owner": None if region.owner is None else code(region.owner, kernel=False)}
        fields[f"{role}_kept"] = kept
    kept = fields["src_kept"]
    if not 1 <= len(kept) <= 2:
        raise LoweringError(f"chunk '{family.name}': regions of {len(kept)} kept dimensions are not supported")
    fields["ndim"] = len(kept)
    fields["rows"] = code(kept[0].size)
    fields["cols"] = code(kept[1].size) if len(kept) == 2 else "1"
    fields["block_rows"], fields["block_cols"] = (BLOCK_2D if len(kept) == 2 else (BLOCK_1D, 1))
    fields["bounds"] = " & ".join(bounds)
    if family.engine.kind is ir.EngineKind.NVSHMEM:
        fields.update(nvshmem_span(schedule, family, source, target))
    return fields


def nvshmem_span(schedule, family, source, target) -> dict:
    """An nvshmem put moves one contiguous byte range: whole rows of row-major tensors."""
    out = {}
    for role, region in (("src", source), ("dst", target)):
        tensor = schedule.tensors[region.tensor]
        kept = [n for n, d in enumerate(region.dims) if d.kept]
        inner = kept[1:]
        for n in inner + list(range(kept[-1] + 1, len(region.dims))):
            dim = region.dims[n]
            if dim.start != 0 or dim.size != tensor.shape[n]:
                raise LoweringError(f"chunk '{family.name}' on nvshmem must move whole rows of '{region.tensor}' "
                                    "(a contiguous range)")
        start = sum((d.start * sympy.Mul(*tensor.shape[n + 1:]) for n, d in enumerate(region.dims)), sympy.Integer(0))
        out[role] = f"({region.tensor} + {code(start)})"
    return out


def param_sources(schedule: ir.Schedule) -> dict[str, tuple[str, int, str]]:
    """For each param, a caller tensor dimension that determines it, with host code solving for it."""
    value = sympy.Symbol("tds_value", integer=True, positive=True)
    found = {}
    for tensor in schedule.tensors.values():
        if tensor.role not in (ir.Role.IN, ir.Role.OUT, ir.Role.INOUT):
            continue
        for dim, extent in enumerate(tensor.shape):
            unknown = [p for p in schedule.params if p not in found and sympy.Symbol(p, integer=True, positive=True)
                       in extent.free_symbols]
            others = {s.name for s in extent.free_symbols} - set(schedule.consts) - {"world"}
            if len(unknown) != 1 or others != set(unknown):
                continue
            param = sympy.Symbol(unknown[0], integer=True, positive=True)
            solutions = sympy.solve(sympy.Eq(extent, value), param)
            if len(solutions) == 1:
                found[unknown[0]] = (tensor.name, dim, code(solutions[0], kernel=False))
    missing = [p for p in schedule.params if p not in found]
    if missing:
        raise LoweringError(f"cannot infer {', '.join(missing)} from the shapes of the caller's tensors")
    return found


def conditions(schedule: ir.Schedule) -> list[tuple[str, str]]:
    out, seen = [], set()
    for cond in schedule.conditions:
        holds = cond.holds
        if isinstance(holds, sympy.Eq) and isinstance(holds.lhs, sympy.Mod) and holds.rhs == 0:
            text = f"({code(holds.lhs.args[0], kernel=False)}) % ({code(holds.lhs.args[1], kernel=False)}) == 0"
        else:  # a `require` of another form
            text = code(holds, kernel=False)
        if text not in seen:
            seen.add(text)
            out.append((text, f"{cond.message} ({schedule.program.path}:{cond.span.line})"))
    return out
