"""What one instance costs: its FLOPs, the bytes it moves in its own GPU's memory and over links
(read from `meaning.instantiate`'s accesses, so exactly the boxes the checker proves), and from those
and the rates, its time on the engine that runs it.

A product tile costs `tile_fixed_us + FLOPs / sm_tflops`, or its operand bytes at its share of the
memory where that is longer (skinny products: the right operand is read once, by the few tiles in
its column). Any other tile or SM chunk streams its bytes at its share of the GPU's memory and of the
links (the rank's link divided among the programs of its family that run at once). A copy-engine
chunk costs its stream operations and its bytes at the link's rate (within the GPU, the copy
engine's)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import sympy

from tiledsl.predict.rates import Rates
from tiledsl.schedule import ir, meaning
from tiledsl.tables import DTYPES


@dataclass(frozen=True)
class Work:
    """One instance's demand."""
    flops: float                          # products only
    local_bytes: float                    # reads and writes of this rank's own copies
    moved: tuple[tuple[int, int, float], ...]  # (from rank, to rank, bytes) over a link
    operand_bytes: float = 0.0            # a product's operands read once (columns and rows of tiles shared)


def scaled(w: Work, share: float) -> Work:
    """A part of an instance's work (a `split` chunk's part)."""
    if share == 1:
        return w
    return Work(w.flops * share, w.local_bytes * share, tuple((a, b, n * share) for a, b, n in w.moved),
                w.operand_bytes * share)


def _itemsize(schedule: ir.Schedule, tensor: str) -> int:
    return DTYPES[schedule.tensors[tensor].dtype].torch.itemsize


def _matmul_regions(family: ir.Family) -> list[tuple[ir.Region, ir.Region]]:
    """(left, right) of each product a tile stores whose operands are loads."""
    found = []

    def walk(value):
        if isinstance(value, ir.MatMul):
            if isinstance(value.left, ir.Load) and isinstance(value.right, ir.Load):
                found.append((value.left.region, value.right.region))
        elif isinstance(value, ir.Map):
            for arg in value.args:
                walk(arg)
        elif isinstance(value, ir.Reduce):
            walk(value.body)
        elif isinstance(value, ir.Transpose):
            walk(value.value)

    for store in family.stores:
        walk(store.value)
    return found


def _block_flops(family: ir.Family):
    """The FLOPs of the products in a tile written as a block (attention), an expression over sizes,
    rank and indices: each product's 2*m*k*n, those in the loop times its extent (their shapes taken
    at the loop's first step). None where the block has no product."""
    shapes: dict[str, tuple] = {}

    def shape(value) -> tuple:
        if isinstance(value, ir.Load):
            return value.region.shape
        if isinstance(value, ir.Local):
            return shapes.get(value.name, ())
        if isinstance(value, ir.Transpose):
            return tuple(reversed(shape(value.value)))
        if isinstance(value, ir.MatMul):
            return (shape(value.left)[-2], shape(value.right)[-1])
        if isinstance(value, ir.Map):
            return max((shape(a) for a in value.args), key=len, default=())
        if isinstance(value, ir.Reduce):
            return shape(value.body)
        return ()

    def flops(value):
        if isinstance(value, ir.MatMul):
            (m, k), n = shape(value.left)[-2:], shape(value.right)[-1]
            return 2 * m * k * n + flops(value.left) + flops(value.right)
        if isinstance(value, ir.Map):
            return sum((flops(a) for a in value.args), sympy.Integer(0))
        if isinstance(value, (ir.Reduce, ir.Transpose)):
            return flops(value.body if isinstance(value, ir.Reduce) else value.value)
        return sympy.Integer(0)

    def walk(statements):
        total = sympy.Integer(0)
        for statement in statements:
            if isinstance(statement, ir.Let):
                total += flops(statement.value)
                shapes[statement.name] = statement.shape
            elif isinstance(statement, ir.Store):
                total += flops(statement.value)
            elif isinstance(statement, ir.Loop):
                for carried in statement.carried:
                    shapes[carried.name] = carried.shape
                steps.append(statement.var)
                total += statement.extent * walk(statement.body)
        return total

    steps: list = []
    total = walk(family.body)
    # sizes named in the block expanded, then the loop's variable at its first step
    return None if total == 0 else family.expand(total).subs({v: 0 for v in steps})


def _unclipped(access: meaning.Access, region: ir.Region) -> list[int]:
    """The sizes of the kept dimensions before clipping at the tensor's bounds (masked tiles compute
    their whole block)."""
    return [stop - first for (first, _, stop), dim in zip(access.reach, region.dims) if dim.kept]


def work(done: meaning.Concrete) -> list[Work]:
    """Every instance's Work, by position in `done.instances`."""
    schedule = done.schedule
    per: list[list[meaning.Access]] = [[] for _ in done.instances]
    for access in done.accesses:
        per[access.instance].append(access)
    products = {name: _matmul_regions(f) for name, f in schedule.families.items()
                if f.kind is ir.Kind.TILE and meaning.is_product(f)}
    reuse = {name: _reuse(done, schedule.families[name]) for name in products}
    blocks = {}  # tiles written as blocks with products: their FLOPs per instance, compiled
    for name, f in schedule.families.items():
        total = _block_flops(f) if f.kind is ir.Kind.TILE and f.body else None
        symbols = (*meaning.size_symbols(schedule), ir.RANK, *(sym for sym, _ in f.indices))
        if total is not None and total.free_symbols <= set(symbols):  # else: costed by its bytes alone
            blocks[name] = meaning.compile_exprs((total,), symbols)
    values = meaning.size_values(schedule, done.world, done.sizes, done.nodes)
    out = []
    for position, instance in enumerate(done.instances):
        local, moved, flops, operands = 0.0, [], 0.0, 0.0
        by_region = {}
        for access in per[position]:
            if access.empty:
                continue
            nbytes = math.prod(b - a for a, b in zip(access.lo, access.hi)) * _itemsize(schedule, access.region.tensor)
            by_region.setdefault(access.region, []).append((access, nbytes))
            if access.copy == instance.rank:
                local += nbytes
            elif access.write:
                moved.append((instance.rank, access.copy, nbytes))
            else:
                moved.append((access.copy, instance.rank, nbytes))
        for left, right in products.get(instance.family, ()):
            if left not in by_region or right not in by_region:
                continue
            (la, lbytes), (ra, rbytes) = by_region[left][0], by_region[right][0]
            m, k = (_unclipped(la, left) + [1, 1])[:2]
            n = _unclipped(ra, right)[-1]
            flops += 2.0 * m * n * k
            columns, rows = reuse[instance.family]
            operands += lbytes / columns + rbytes / rows
        if instance.family in blocks:  # operands: every byte it moves (no reuse known)
            (flops,) = blocks[instance.family](*values, instance.rank, *instance.index)
            operands = local + sum(n for _, _, n in moved)
        out.append(Work(float(max(0, flops)), local, tuple(moved), operands))
    return out


def _reuse(done: meaning.Concrete, family: ir.Family) -> tuple[int, int]:
    """(tiles along a row, tiles down a column) of a product on rank 0: how many tiles share each left
    and each right operand block (read once from memory, then from L2)."""
    axes = meaning._tile_axes(family)
    if axes is None:
        return 1, 1
    names = [s for s, _ in family.indices]
    extents = done.extents[family.name][0] or done.extents[family.name][-1]
    rows, cols = (extents[names.index(a)] if extents else 1 for a in axes)
    return max(1, cols), max(1, rows)


def duration_us(w: Work, engine: ir.EngineKind, running: int, rates: Rates, topology,
                rank: int, ops: int = 1) -> float:
    """The instance's time on its engine, `running` programs of its family at once on its rank (copy
    engine: `ops` stream operations)."""
    if engine is ir.EngineKind.COPY_ENGINE:
        t = rates.ce_op_us * ops
        if not w.moved:  # within the GPU: a read and a write of each byte copied
            return t + w.local_bytes / 2 / 1e3 / rates.ce_local_gbps
        for src, dst, nbytes in w.moved:  # across: the link's rate (the local end is the same bytes)
            same = topology.same_node(src, dst)
            t += nbytes / 1e3 / (rates.link_gbps if same else rates.ib_link_gbps)
            t += rates.nvlink_latency_us if same else rates.ib_latency_us
        return t
    running = max(1, running)
    hbm = min(rates.sm_hbm_gbps, rates.hbm_gbps / running)
    if w.flops:
        compute = w.flops / (rates.sm_tflops * 1e6)
        memory = w.operand_bytes / 1e3 / hbm
        return rates.tile_fixed_us + max(compute, memory) + _link_us(w, running, rates, topology, rank)
    # tile_fixed_us is a product's (its pipeline's fill, its epilogue): a streaming tile has none
    return max(w.local_bytes / 1e3 / hbm, _link_us(w, running, rates, topology, rank))


def _link_us(w: Work, running: int, rates: Rates, topology, rank: int) -> float:
    """Peer loads and stores at this program's share of its rank's link, in each direction. No latency:
    a program streams its instances' peer loads back to back (many warps in flight), so a link's
    latency is paid where a wait crosses ranks (`simulate._signal_us`), not per instance."""
    if not w.moved:
        return 0.0
    inbound = outbound = 0.0
    for src, dst, nbytes in w.moved:
        same = topology.same_node(src, dst)
        share = min(rates.sm_link_gbps, (rates.link_gbps if same else rates.ib_link_gbps) / running)
        if dst == rank:
            inbound += nbytes / 1e3 / share
        else:
            outbound += nbytes / 1e3 / share
    return max(inbound, outbound)
