"""The simulator: every rank's instances placed on the lanes that run them, as the kernel and the host
place them (the SM programs of a persistent kernel: a family with a program count gets its own,
the others share the rest and run in the family sequence, program p taking slots p, p + P, ... of its
family's order; copy-engine chunks on the communication stream in the rank's serial order), each
started when its lane is free and its waits are released (the producers' ends, plus a signal's
latency to this rank), and run for its cost (`cost.py`). Lanes are fixed and costs do not depend on
the times, so the times are one pass over a topological order of lane order plus waits: exact for
this model, deterministic, and the same instances and waits the checker proves (`meaning.instantiate`)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from tiledsl.predict import cost
from tiledsl.predict.rates import Rates
from tiledsl.schedule import ir, meaning

PROGRAM_ORDER = -1  # a slot's cause: it started when its lane got to it


@dataclass
class Slot:
    """One instance (or one part of a `split` one) as the simulation ran it."""
    position: int      # the instance, in concrete.instances
    rank: int
    lane: str          # "program 12" or "copy engine 0"; "" for a split instance's end (all its parts done)
    engine: str
    duration_us: float
    start_us: float = 0.0   # its lane got to it
    waited_us: float = 0.0  # its waits were released (>= start)
    end_us: float = 0.0
    cause: int = PROGRAM_ORDER  # the producer whose signal released it last, or PROGRAM_ORDER
    moved: tuple = ()           # (from rank, to rank, bytes) over links
    ahead: int | None = None    # the slot before it on its lane
    node: int = -1              # its number among all slots: the instance's position, or a part's past them
    part: int = 0


@dataclass
class Prediction:
    schedule: ir.Schedule
    world: int
    nodes: int
    sizes: dict[str, int]
    rates: Rates
    concrete: meaning.Concrete
    slots: list[Slot]                      # what ran on lanes
    staging_us: float                      # staged inputs copied to the heap before the kernel
    lanes: dict[int, list[str]] = field(default_factory=dict)  # rank -> its lanes
    joins: dict[int, Slot] = field(default_factory=dict)  # a split instance -> its end, when its last part ends

    def node(self, number: int) -> Slot:
        """A slot or join by its node number."""
        if number < len(self.concrete.instances) and number in self.joins:
            return self.joins[number]
        return self._by_node[number]

    @functools.cached_property
    def _by_node(self) -> dict[int, Slot]:
        return {s.node: s for s in self.slots}

    @property
    def kernel_us(self) -> float:
        return max((s.end_us for s in self.slots), default=0.0)

    @property
    def total_us(self) -> float:
        """What a timed call takes: its fixed cost, the staging and the kernel's slowest rank."""
        return self.rates.call_us + self.staging_us + self.kernel_us


def simulate(schedule: ir.Schedule, world: int, sizes: dict[str, int], rates: Rates, nodes: int = 1) -> Prediction:
    """Predict one call of `schedule` at `world` ranks in `nodes` nodes and these param (and const) sizes."""
    done = meaning.instantiate(schedule, world, sizes, nodes)
    if done.sequence is None:
        raise ValueError(f"{schedule.name}: its families wait on each other; no rank can run them in sequence")
    works = cost.work(done)
    topology = done.topology
    waits: list[list[meaning.Wait]] = [[] for _ in done.instances]
    for wait in done.waits:
        waits[wait.consumer].append(wait)
    waiting_ranks: dict[int, set[int]] = {}  # producer -> the ranks that wait on it
    for wait in done.waits:
        for producer in wait.producers:
            waiting_ranks.setdefault(producer, set()).add(done.instances[wait.consumer].rank)
    # a chunk split in k parts runs them as k slots of its family's programs (instance * k + part), each
    # a k-th of its work; its waiters wait for all of them (its join)
    parts = {name: f.parts(done.sizes) for name, f in schedule.families.items()}
    units: list[tuple[int, int]] = [(p, 0) for p in range(len(done.instances))]  # (instance, part)
    part_nodes: dict[int, list[int]] = {}
    for position, instance in enumerate(done.instances):
        if parts[instance.family] > 1:
            part_nodes[position] = list(range(len(units), len(units) + parts[instance.family]))
            units.extend((position, j) for j in range(parts[instance.family]))
    slots: list[Slot | None] = [None] * len(units)
    queues: list[list[int]] = []
    lanes: dict[int, list[str]] = {}
    for rank in range(world):
        for lane, queue, running in _lanes(done, rank, rates, part_nodes):
            lanes.setdefault(rank, []).append(lane)
            queues.append(queue)
            for node in queue:
                position, part = units[node]
                family = schedule.families[done.instances[position].family]
                share = cost.scaled(works[position], 1 / parts[family.name])
                # the stream's operations for a copy: its wait, the copy, a signal to each rank waiting on it
                ops = 1 + bool(waits[position]) + len(waiting_ranks.get(position, ()))
                duration = cost.duration_us(share, family.engine.kind, running[family.name], rates, topology, rank,
                                            ops)
                if family.engine.kind is not ir.EngineKind.COPY_ENGINE:  # the stream's are in `ops`
                    duration += _sync_us(len(waits[position]), len(waiting_ranks.get(position, ())), rates)
                slots[node] = Slot(position, rank, lane, family.engine.kind.value, duration, moved=share.moved,
                                   node=node, part=part)
    joins = {}
    for position, found in part_nodes.items():
        joins[position] = slots[position] = Slot(position, done.instances[position].rank, "", "", 0.0, node=position)
    node_waits = [waits[position] if position not in part_nodes or node != position else []
                  for node, (position, _) in enumerate(units)]
    _run(done, slots, queues, node_waits, part_nodes, rates)
    staging = _staging_us(done, rates)
    return Prediction(schedule, world, nodes, done.sizes, rates, done,
                      [s for s in slots if s is not None and s.lane], staging, lanes, joins)


def _lanes(done: meaning.Concrete, rank: int, rates: Rates, part_nodes: dict[int, list[int]]):
    """(lane name, its slots in the order it runs them, programs running each family at once)."""

    def slots(order: list[int]) -> list[int]:  # a split instance is its parts, one after another
        return [n for p in order for n in part_nodes.get(p, (p,))]

    schedule = done.schedule
    families = [schedule.families[name] for name in done.sequence]
    kernel = [f for f in families if f.engine.kind is not ir.EngineKind.COPY_ENGINE]
    copies = [f for f in families if f.engine.kind is ir.EngineKind.COPY_ENGINE]
    # one SM is left free where copy-engine chunks run beside the kernel (launch._default_programs)
    sms = rates.sms - 1 if copies else rates.sms
    most = {f.name: max(len(r) for r in done.ranges[f.name]) for f in kernel}
    running, start = {}, 0
    for f in kernel:
        count = f.engine.count(done.sizes)
        if count is None:
            continue
        programs = max(1, min(count, most[f.name] * f.parts(done.sizes)))
        order = slots(done.in_order(f.name, rank))
        running[f.name] = min(programs, len(order))
        for p in range(programs):
            yield f"program {start + p}", order[p::programs], running
        start += programs
    shared = [f for f in kernel if f.engine.count(done.sizes) is None]
    if shared:
        rest = min(max(1, sms - start), max(most[f.name] * f.parts(done.sizes) for f in shared))
        orders = [slots(done.in_order(f.name, rank)) for f in shared]
        for f, order in zip(shared, orders):
            running[f.name] = min(rest, len(order))
        for p in range(rest):
            yield f"program {start + p}", [x for order in orders for x in order[p::rest]], running
    if copies:
        serial = slots([x for f in copies for x in done.in_order(f.name, rank)])
        for f in copies:
            running[f.name] = 1
        engines = max(1, rates.copy_engines)
        for c in range(engines):
            yield f"copy engine {c}", serial[c::engines], running


def _run(done: meaning.Concrete, slots: list, queues: list[list[int]], waits, part_nodes: dict, rates: Rates) -> None:
    """Start, release and end of every slot: a pass over a topological order of lane order and waits
    (a split instance's join ends when the last of its parts does)."""
    topology = done.topology
    before = [None] * len(slots)  # the slot ahead on the same lane
    after: list[list[int]] = [[] for _ in slots]
    pending = [0] * len(slots)
    for queue in queues:
        for first, then in zip(queue, queue[1:]):
            before[then] = first
            slots[then].ahead = first
            after[first].append(then)
            pending[then] += 1
    for position, found in enumerate(waits):
        for wait in found:
            for producer in wait.producers:
                after[producer].append(position)
                pending[position] += 1
    for position, found in part_nodes.items():
        for part in found:
            after[part].append(position)
            pending[position] += 1
    ready = [p for p, n in enumerate(pending) if n == 0 and slots[p] is not None]
    seen = 0
    while ready:
        position = ready.pop()
        seen += 1
        slot = slots[position]
        slot.start_us = slots[before[position]].end_us if before[position] is not None else 0.0
        slot.waited_us, slot.cause = slot.start_us, PROGRAM_ORDER
        if position in part_nodes:
            last = max(part_nodes[position], key=lambda n: slots[n].end_us)
            slot.start_us = slot.waited_us = slots[last].end_us
            slot.cause = last
        for wait in waits[position]:
            for producer in wait.producers:
                released = slots[producer].end_us + _signal_us(topology, slots[producer].rank, slot.rank, rates)
                if released > slot.waited_us:
                    slot.waited_us, slot.cause = released, producer
        slot.end_us = slot.waited_us + slot.duration_us
        for then in after[position]:
            pending[then] -= 1
            if pending[then] == 0:
                ready.append(then)
    if seen < sum(s is not None for s in slots):
        raise ValueError("the lanes' order and the waits have a cycle: the kernel would not finish")


def _sync_us(waits: int, waiting_ranks: int, rates: Rates) -> float:
    """What an SM instance's own synchronisation costs its program (runtime/sync.py): each of its
    waits reads its slot once with an acquire at system scope, even when the signal is already there,
    and once its stores are done it writes a release store at system scope into the slot of each rank
    that waits on it. Paid on the program's time, unlike a signal's latency, which only delays the
    waiter."""
    return waits * rates.wait_us + waiting_ranks * rates.release_us


def _signal_us(topology, producer_rank: int, consumer_rank: int, rates: Rates) -> float:
    if producer_rank == consumer_rank:
        return rates.signal_local_us
    return rates.nvlink_latency_us if topology.same_node(producer_rank, consumer_rank) else rates.ib_latency_us


def _staging_us(done: meaning.Concrete, rates: Rates) -> float:
    """Caller tensors read on peers are copied to the symmetric heap at the call's start: one copy
    operation each."""
    staged = done.schedule.staged_inputs()
    nbytes = sum(cost._itemsize(done.schedule, name) * _elements(done.shapes[name]) for name in staged)
    return len(staged) * rates.ce_op_us + nbytes / 1e3 / rates.ce_local_gbps


def _elements(shape) -> int:
    total = 1
    for n in shape:
        total *= n
    return total
