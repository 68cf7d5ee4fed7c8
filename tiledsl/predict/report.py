"""What a prediction says: the time, the critical path (the chain of instances and waits that ends
last, each step named with the lane or link it waited on), utilisation per rank (SM programs busy,
copy engine busy, link bytes against the link's rate), and the timeline as `tiledsl trace`'s events,
so the same Perfetto file and picture come out, marked as predicted."""
from __future__ import annotations

import json
from dataclasses import dataclass

from tiledsl.predict.simulate import PROGRAM_ORDER, Prediction, Slot
from tiledsl.tools import trace
from tiledsl.tools.trace import Event


@dataclass(frozen=True)
class Step:
    """One instance on the critical path, and why it started when it did."""
    slot: Slot
    name: str       # family[index]@rank
    via: str        # "program order" or "wait on producer@rank over nvlink/local/ib"


def critical_path(prediction: Prediction) -> list[Step]:
    """From the slot that ends last back to one that started at 0: each slot's cause in turn."""
    if not prediction.slots:
        return []
    instances = prediction.concrete.instances
    slot = max(prediction.slots, key=lambda s: (s.end_us, -s.node))
    path = []
    while slot is not None:
        if not slot.lane:  # a split instance's join: the path goes on through its last part
            slot = prediction.node(slot.cause)
            continue
        name = str(instances[slot.position]) + (f" part {slot.part}" if slot.node >= len(instances) else "")
        if slot.cause == PROGRAM_ORDER:
            path.append(Step(slot, name, f"program order on {slot.lane}"))
            slot = prediction.node(slot.ahead) if slot.ahead is not None and slot.start_us > 0 else None
        else:
            producer = prediction.node(slot.cause)
            path.append(Step(slot, name, f"wait on {instances[slot.cause]} over {_link(prediction, producer, slot)}"))
            slot = producer
    return path[::-1]


def _link(prediction: Prediction, producer: Slot, consumer: Slot) -> str:
    if producer.rank == consumer.rank:
        return "a local signal"
    topology = prediction.concrete.topology
    return "NVLink" if topology.same_node(producer.rank, consumer.rank) else "IB"


@dataclass(frozen=True)
class Use:
    rank: int
    sm_busy: float      # the share of (programs x kernel time) spent running instances
    sm_waiting: float   # ... spent released-but-waiting (between lane start and release)
    copy_busy: float    # the copy engine's share of the kernel time
    link_in: float      # bytes in over links / (link rate x kernel time)
    link_out: float


def utilisation(prediction: Prediction) -> list[Use]:
    span = max(prediction.kernel_us, 1e-9)
    rates = prediction.rates
    out = []
    for rank in range(prediction.world):
        mine = [s for s in prediction.slots if s.rank == rank]
        programs = [s for s in mine if s.lane.startswith("program")]
        lanes = max(1, len({s.lane for s in programs}))
        copies = [s for s in mine if s.lane.startswith("copy")]
        inbound = sum(b for s in prediction.slots for src, dst, b in s.moved if dst == rank and src != rank)
        outbound = sum(b for s in prediction.slots for src, dst, b in s.moved if src == rank and dst != rank)
        link = rates.link_gbps * 1e3 * span  # bytes the link could move in the kernel's time
        out.append(Use(rank, sum(s.duration_us for s in programs) / (lanes * span),
                       sum(s.waited_us - s.start_us for s in programs) / (lanes * span),
                       sum(s.duration_us for s in copies) / span, inbound / link, outbound / link))
    return out


def events(prediction: Prediction) -> list[Event]:
    """The slots as `tiledsl trace` events (times from the kernel's start, after the call's fixed cost
    and the staging), so that its Perfetto file and picture can be drawn from a prediction."""
    offset = prediction.rates.call_us + prediction.staging_us
    instances = prediction.concrete.instances
    out = []
    for s in prediction.slots:
        instance = instances[s.position]
        family = prediction.schedule.families[instance.family]
        parts = family.parts(prediction.concrete.sizes)
        number = (s.position - prediction.concrete.ranges[instance.family][instance.rank].start) * parts + s.part
        on_copy = s.lane.startswith("copy")
        program = -1 if on_copy else int(s.lane.split()[-1])
        out.append(Event(s.rank, instance.family, family.kind.value, s.engine, number, offset + s.start_us,
                         offset + s.waited_us, offset + s.end_us, -1 if on_copy else program, program))
    return sorted(out, key=lambda e: (e.start_us, e.rank, e.program))


def chrome_trace(prediction: Prediction, path) -> None:
    """`trace.chrome_trace`'s format, every process named 'rank N (predicted)' and the file's
    metadata saying so."""
    trace.chrome_trace(events(prediction), path)
    with open(path) as handle:
        data = json.load(handle)
    for event in data["traceEvents"]:
        event["pid"] = f"{event['pid']} (predicted)"
    data["otherData"] = {"predicted": True, "program": prediction.schedule.name, "world": prediction.world,
                         "nodes": prediction.nodes, "sizes": prediction.sizes, "gpu": prediction.rates.gpu,
                         "total_us": prediction.total_us}
    with open(path, "w") as handle:
        json.dump(data, handle)


def text(prediction: Prediction, path_steps: int = 12) -> str:
    """The time, the critical path (its last steps where it is long) and the utilisation."""
    p = prediction
    lines = [f"{p.schedule.name} at world {p.world}" + (f" ({p.nodes} nodes)" if p.nodes > 1 else "")
             + f", {', '.join(f'{k}={v}' for k, v in p.sizes.items())} on {p.rates.gpu} (predicted)",
             f"predicted time: {p.total_us:.1f} us = call {p.rates.call_us:.1f} + staging {p.staging_us:.1f} "
             f"+ kernel {p.kernel_us:.1f}"]
    path = critical_path(p)
    waits = [s for s in path if s.via.startswith("wait")]
    busy = sum(s.slot.duration_us for s in path)
    lines.append(f"critical path: {len(path)} instances, {busy:.1f} us running, "
                 f"{p.kernel_us - busy:.1f} us in waits and signals; {len(waits)} waits on it")
    shown = path if len(path) <= path_steps else path[:2] + [None] + path[-(path_steps - 3):]
    for step in shown:
        if step is None:
            lines.append(f"  ... {len(path) - path_steps + 1} more")
            continue
        s = step.slot
        lines.append(f"  {s.waited_us:9.1f} -> {s.end_us:9.1f} us  {step.name:28} after {step.via}")
    lines.append(f"{'rank':>4} {'SMs busy':>9} {'SMs waiting':>11} {'copy engine':>11} {'link in':>8} {'link out':>8}")
    for u in utilisation(p):
        lines.append(f"{u.rank:>4} {u.sm_busy:>9.0%} {u.sm_waiting:>11.0%} {u.copy_busy:>11.0%} "
                     f"{u.link_in:>8.0%} {u.link_out:>8.0%}")
    return "\n".join(lines)
