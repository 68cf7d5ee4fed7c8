"""The kernel's arguments, described once. The kernel signature, each family's parameter list (only
what the family reads), the launcher's arguments, the sm_90 ahead-of-time signature, graph replay and
emulation are all produced from this one list (`args` of a generated module's ProgramSpec)."""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from tiledsl.codegen.body import DescLoad, DescStore, Dim, Fetch, Loop, MakeDescriptor, TmaStore, walk
from tiledsl.codegen.names import EPOCH
# generated modules describe their arguments with the runtime's own records: one definition of each
from tiledsl.runtime.specs import SPREAD, Arg, Kind

# a family's linear instance number and, split, its part: the names every kernel binds (plan.py uses them)
INSTANCE = sympy.Symbol("tds_inst", integer=True, nonnegative=True)
PART = sympy.Symbol("tds_part", integer=True, nonnegative=True)


EPOCH_CELL = "tds_epoch_cell"


@dataclass(frozen=True)
class KernelInterface:
    args: tuple[Arg, ...]                     # the kernel's, in order
    families: dict[str, tuple[str, ...]]      # each family's parameters after (program, programs), in order

    def named(self, name: str) -> Arg:
        return next(a for a in self.args if a.name == name)

    def of_kind(self, kind: Kind) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.kind is kind)

    @property
    def unspecialized(self) -> tuple[str, ...]:
        """The arguments the JIT must not specialise on (a value of 1, or one 16 divides): the rank, the
        spin bound and the families' spread over programs, where the kernel has them, so that every rank,
        and every size and world, runs one compile (a spread is 1 at small sizes, 16 divides it at others)."""
        return tuple(a.name for a in self.args if a.kind is Kind.MAX_SPINS or a.name == "rank" or a.kind in SPREAD)


def interface_of(plan) -> KernelInterface:
    """The arguments of `plan`'s kernel and which of them each family receives."""
    args: list[Arg] = []
    for t in plan.tensors:
        args.append(Arg(t.name, Kind.TENSOR, t.name, t.dtype))
        if t.peers:
            args.append(Arg(f"tds_peers_{t.name}", Kind.PEERS, t.name, "int64"))
        if t.shmem:
            args.append(Arg(f"tds_shmem_{t.name}", Kind.SHMEM, t.name, "int64"))
    for f in plan.families:
        if f.notify is not None:
            args.append(Arg(f"tds_sig_{f.name}", Kind.SIGNALS, f.name, signal_dtype(f)))
            if f.notify.every_rank and not f.puts:
                args.append(Arg(f"tds_sigpeers_{f.name}", Kind.SIGNAL_PEERS, f.name, "int64"))
            if f.puts or f.notify.remote is not None:
                args.append(Arg(f"tds_sigshmem_{f.name}", Kind.SIGNAL_SHMEM, f.name, "int64"))
    kernel_families = [f for f in plan.families if f.on_sms]
    args += [Arg(f"tds_order_{f.name}", Kind.ORDER, f.name, "int32") for f in kernel_families if f.order is not None]
    for f in kernel_families:
        if f.count_row is not None:
            args.append(Arg(f"tds_count_{f.name}", Kind.COUNT, f.name, "int32"))
        if f.count_peers is not None:
            args.append(Arg(f"tds_countpeers_{f.name}", Kind.COUNT_PEERS, f.name, "int64"))
    dtypes = {t.name: t.dtype for t in plan.tensors}
    for f in kernel_families:
        if f.product is not None:
            p = f.product
            block_k = plan.consts[p.block_k] if isinstance(p.block_k, str) else p.block_k
            # an N-D operand's block is 1 in its leading dimensions (the points the product reads)
            args.append(Arg(f"tds_desc_{f.name}_a", Kind.DESCRIPTOR, p.left, dtypes[p.left],
                            (1,) * len(p.left_at) + (p.block_m, block_k)))
            args.append(Arg(f"tds_desc_{f.name}_b", Kind.DESCRIPTOR, p.right, dtypes[p.right],
                            (1,) * len(p.right_at) + (block_k, p.block_n)))
            if f.tma_target is not None:
                store = next(s for s in walk(f.body) if isinstance(s, TmaStore))
                args.append(Arg(f"tds_desc_{f.name}_c", Kind.DESCRIPTOR, f.tma_target, dtypes[f.tma_target],
                                (1,) * len(store.at) + (p.block_m, p.block_n)))
        # a block tile's TMA loads and stores: one descriptor a tensor and block, over the whole tensor
        described = {}
        made = {s.name for s in walk(f.head + f.body) if isinstance(s, MakeDescriptor)}  # on the device
        for s in walk(f.body):
            if getattr(s, "descriptor", None) in made:
                continue
            if isinstance(s, (DescLoad, DescStore)):
                described.setdefault(s.descriptor, Arg(s.descriptor, Kind.DESCRIPTOR, s.tensor, dtypes[s.tensor],
                                                       s.block))
        args += list(described.values())
    args += [Arg(p, Kind.SIZE) for p in plan.params] + [Arg("rank", Kind.SIZE), Arg("world", Kind.SIZE)]
    if plan.spans_nodes:
        args += [Arg("nodes", Kind.SIZE), Arg("local_world", Kind.SIZE)]
    args += [Arg(EPOCH_CELL, Kind.EPOCH_CELL, dtype="int32"), Arg("tds_diag", Kind.DIAG, dtype="int32"),
             Arg("tds_max_spins", Kind.MAX_SPINS)]
    if plan.distributed:
        # across nodes the barrier's second level is an NVSHMEM signal: 64-bit slots
        args += [Arg("tds_barrier", Kind.BARRIER, dtype="int64" if plan.spans_nodes else "int32"),
                 Arg("tds_barrier_peers", Kind.BARRIER_PEERS, dtype="int64")]
        if plan.spans_nodes:
            args.append(Arg("tds_barrier_shmem", Kind.BARRIER_SHMEM, dtype="int64"))
    args += [Arg(c, Kind.CONST) for c in plan.consts]
    args += [Arg(name, Kind.BLOCK) for f in plan.families for name, _ in f.blocks]
    args += [Arg(f"tds_trace_{f.name}", Kind.TRACE, f.name, "int64") for f in kernel_families]
    args.append(Arg("tds_entry_trace", Kind.TRACE, None, "int64"))
    args += [Arg("tds_ENTER", Kind.ENTER), Arg("tds_EXIT", Kind.EXIT), Arg("tds_TRACE", Kind.TRACING)]
    for f in kernel_families:
        args += [Arg(f"tds_RUN_{f.name}", Kind.RUN, f.name), Arg(f"tds_START_{f.name}", Kind.START, f.name),
                 Arg(f"tds_PROGRAMS_{f.name}", Kind.PROGRAMS, f.name)]
    order = {a.name: n for n, a in enumerate(args)}
    order[EPOCH] = order[EPOCH_CELL]
    families = {f.name: tuple(sorted(_needs(f, plan), key=order.__getitem__)) for f in kernel_families}
    # an argument that nothing reads is left out of the signature and the launch: a product's operands
    # are read through the descriptors the host makes of them, a copy-engine chunk's tensors by the host
    read = _kernel_reads(plan) | {EPOCH_CELL if n == EPOCH else n for names in families.values() for n in names}
    return KernelInterface(tuple(a for a in args if a.name in read), families)


# ---- what a family reads ---------------------------------------------------------------------------

def _kernel_reads(plan) -> set[str]:
    """What the kernel reads itself (kernel.py.jinja), beside what it hands its families: the epoch,
    the entry's timeline row, the roles, the ranks each family runs on and the entry and exit barriers."""
    names = {EPOCH_CELL, "tds_entry_trace", "tds_ENTER", "tds_EXIT", "tds_TRACE"}
    for f in plan.families:
        if f.on_sms:
            names.update(f"tds_{role}_{f.name}" for role in ("RUN", "START", "PROGRAMS"))
            names.update(s.name for s in f.runs_on.free_symbols)
    if plan.distributed:
        names.update({"tds_barrier", "tds_barrier_peers", "rank", "tds_diag", "tds_max_spins"})
        names.update({"tds_barrier_shmem", "nodes", "local_world"} if plan.spans_nodes else {"world"})
    return names


def signal_dtype(family) -> str:
    """NVSHMEM writes 64-bit signals (a put's, or a signal from another node); other slots are 32-bit
    (an NVSHMEM family's are 64-bit all the same: one rule for the launcher, which knows the engine)."""
    return "int64" if family.engine == "nvshmem" or family.notify.remote is not None else "int32"


def _local_symbols(family) -> set[str]:
    """Names a family binds itself: its indices, instance and part, its loops' variables, the device
    values it fetches and the blocks it computes."""
    bound = {s for s, _ in family.indices} | {INSTANCE, PART}
    bound |= {var for w in family.waits for var, _ in w.loops}
    bound |= {s.var for s in walk(family.body) if isinstance(s, Loop)}
    bound |= {e for s in walk(family.body) if isinstance(s, Fetch) for e in (s.name, s.exists) if e is not None}
    if family.notify is not None and family.notify.remote is not None:
        bound.add(family.notify.remote[0])
    names = {s.name for s in bound}
    return names | {s.name for s in walk(family.body) if isinstance(getattr(s, "name", None), str)}


def _exprs(value):
    """Every sympy expression inside a plan value (dataclasses, tuples)."""
    if isinstance(value, sympy.Basic):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _exprs(item)
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            if isinstance(value, Dim) and value.axis is None and name == "bound":
                continue  # a point's dimension is not masked: its bound is printed nowhere
            yield from _exprs(getattr(value, name))


def symbols_of(family) -> set[sympy.Symbol]:
    """The size symbols (params, consts, world, rank, lets) a family's kernel code reads."""
    parts = (family.indices, family.head, family.body, family.notify, family.count_row, family.count_peers)
    found = set().union(*(e.free_symbols for e in _exprs(parts)))
    local = _local_symbols(family)  # its own names, a tile's size names (Assign) among them
    return {s for s in found if s.name not in local}


def _needs(family, plan) -> set[str]:
    """The arguments a family's printed code reads: what each of its statements declares it reads (a
    descriptor the family makes on the device is none), what its notify and counts read, and its sizes."""
    statements = list(walk(family.head + family.body))
    made = {s.name for s in statements if isinstance(s, MakeDescriptor)}
    names = set().union(*(s.needs(family.name) for s in statements)) - made
    if family.notify is not None and not family.puts:
        names.update({f"tds_sig_{family.name}", EPOCH})
        if family.notify.every_rank:
            names.add(f"tds_sigpeers_{family.name}")
        if family.notify.remote is not None:
            names.add(f"tds_sigshmem_{family.name}")
    if family.order is not None:
        names.add(f"tds_order_{family.name}")
    if family.count_row is not None:
        names.add(f"tds_count_{family.name}")
    if family.count_peers is not None:
        names.update({f"tds_countpeers_{family.name}", "rank"})
    lets = {s for s, _ in family.lets}
    symbols = symbols_of(family) | set().union(*(v.free_symbols for _, v in family.lets))
    names.update(s.name for s in symbols - lets)
    return names


__all__ = ["Arg", "Kind", "KernelInterface", "interface_of", "symbols_of", "walk", "EPOCH"]
