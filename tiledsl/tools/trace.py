"""The host half of every rank's timeline (the device stamps are tiledsl/runtime/timeline.py): a call's
buffers turned into events relative to the end of the call's entry barrier on each rank (the moment all
ranks agree on), the ranks merged into one Chrome/Perfetto trace file, and a summary drawn: one lane per
rank and program, compute and communication in their own colours, the time spent waiting hatched, idle
time left blank. `tiledsl trace` runs a program traced, emulated or under torchrun."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

import tiledsl
from tiledsl.runtime import emulate, placement
from tiledsl.runtime.heap import open_heap
from tiledsl.runtime.timeline import START
from tiledsl.schedule.meaning import default_sizes
from tiledsl.tools.reference import Reference
from tiledsl.tools.run_program import EMULATED_DTYPES, launch_sizes, make_inputs, program_schedule
from tiledsl.topology import NODES_VARIABLE, declared

@dataclass(frozen=True)
class Event:
    rank: int
    family: str
    kind: str          # "tile" or "chunk"
    engine: str        # "sms", "nvshmem", "copy_engine"
    instance: int      # linear instance number (times the split, plus the part)
    start_us: float    # from the end of this rank's entry barrier
    waited_us: float   # start + all the time it waited (before its body, and in its loop's steps)
    end_us: float
    sm: int            # -1 on the copy engine
    program: int


def events(program) -> list[Event]:
    """This rank's instances in the last traced call, oldest first."""
    if not program.trace:
        raise RuntimeError("the program was not compiled with trace=True")
    timelines = program.timelines()
    origin = int(timelines.entry[0, START])
    out = []
    for spec in program.spec.families:
        rows = timelines.families[spec.name].cpu()
        for n, (start, waited, end, place) in enumerate(rows.tolist()):
            if start == 0:  # never ran (a family left out, a part past the end)
                continue
            on_copy_engine = place < 0
            out.append(Event(program.rank, spec.name, spec.kind, spec.engine, n, (start - origin) / 1e3,
                             ((waited or start) - origin) / 1e3, (end - origin) / 1e3,
                             -1 if on_copy_engine else place >> 16, -1 if on_copy_engine else place & 0xFFFF))
    return sorted(out, key=lambda e: e.start_us)


def chrome_trace(all_events: list[Event], path) -> None:
    """One Chrome/Perfetto trace (open it at ui.perfetto.dev): a process per rank, a thread per program
    (the copy engine its own), each instance a slice, its wait a slice of its own inside it."""
    trace = []
    for e in all_events:
        lane = "copy engine" if e.sm < 0 else f"program {e.program:3d} (SM {e.sm})"
        common = {"pid": f"rank {e.rank}", "tid": lane, "cat": f"{e.kind},{e.engine}"}
        trace.append({**common, "name": f"{e.family}[{e.instance}]", "ph": "X", "ts": e.start_us,
                      "dur": max(e.end_us - e.start_us, 0.001), "args": {"waited_us": e.waited_us - e.start_us}})
        if e.waited_us > e.start_us:
            trace.append({**common, "name": f"wait {e.family}[{e.instance}]", "ph": "X", "ts": e.start_us,
                          "dur": e.waited_us - e.start_us})
    with open(path, "w") as handle:
        json.dump({"traceEvents": trace, "displayTimeUnit": "ns"}, handle)


def summary(all_events: list[Event]) -> str:
    """Per rank and family: instances, busy time, time waiting, first start and last end."""
    lines = [f"{'rank':>4} {'family':14} {'engine':12} {'instances':>9} {'busy us':>10} {'waiting us':>10} "
             f"{'first us':>9} {'last us':>9}"]
    keys = sorted({(e.rank, e.family, e.engine) for e in all_events})
    for rank, family, engine in keys:
        mine = [e for e in all_events if (e.rank, e.family) == (rank, family)]
        busy = sum(e.end_us - e.waited_us for e in mine)
        waiting = sum(e.waited_us - e.start_us for e in mine)
        lines.append(f"{rank:>4} {family:14} {engine:12} {len(mine):>9} {busy:>10.1f} {waiting:>10.1f} "
                     f"{min(e.start_us for e in mine):>9.1f} {max(e.end_us for e in mine):>9.1f}")
    return "\n".join(lines)


def draw(all_events: list[Event], path) -> None:
    """A PNG: one row of lanes per rank (programs, and the copy engine on top), each instance a bar in
    its family's colour, its wait hatched; gaps are idle time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = list(dict.fromkeys(e.family for e in all_events))
    colours = {f: plt.get_cmap("tab10")(n % 10) for n, f in enumerate(families)}
    lanes = sorted({(e.rank, e.program) for e in all_events}, key=lambda lane: (lane[0], -lane[1]))
    row = {lane: n for n, lane in enumerate(lanes)}
    figure, axes = plt.subplots(figsize=(12, 1.5 + 0.12 * len(lanes)))
    for e in all_events:
        y = row[(e.rank, e.program)]
        axes.broken_barh([(e.start_us, max(e.waited_us - e.start_us, 0))], (y, 0.9), facecolors="none",
                         edgecolors=colours[e.family], hatch="////", linewidth=0)
        axes.broken_barh([(e.waited_us, max(e.end_us - e.waited_us, 0.01))], (y, 0.9), facecolors=colours[e.family])
    ticks = [n for n, (rank, program) in enumerate(lanes) if program in (-1, 0) or n == 0]
    axes.set_yticks([t + 0.45 for t in ticks])
    axes.set_yticklabels([f"rank {lanes[t][0]} " + ("copy engine" if lanes[t][1] < 0 else f"program {lanes[t][1]}")
                          for t in ticks], fontsize=7)
    axes.set_xlabel("us since the entry barrier (hatched: waiting)")
    axes.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colours[f], label=f) for f in families],
                loc="upper right", fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# ---- `tiledsl trace` -------------------------------------------------------------------------------

def _traced_rank(heap, source: str, sizes: dict, calls: int, dtype_map: dict, timeout_s: float, nodes: int):
    """One emulated rank: the program traced, `calls` calls on random inputs, the last call's events."""
    override = {k: getattr(torch, v) for k, v in dtype_map.items()}
    program = tiledsl.compile(source, heap, emulated=True, trace=True, dtype_override=override,
                              wait_timeout_s=timeout_s)
    schedule = program_schedule(source)
    shapes = Reference(schedule, heap.world, sizes, nodes=nodes).shapes(heap.rank)
    for call in range(calls):
        inputs = make_inputs(schedule, heap.world, sizes, call, dtype_map, nodes=nodes)[heap.rank]
        program(**{s.name: inputs[s.name] if s.name in inputs else
                   torch.empty(shapes[s.name], dtype=override.get(s.dtype, getattr(torch, s.dtype)))
                   for s in program.callers})
    found = events(program)
    heap.close()
    return found


def trace_emulated(source: str, world: int, sizes: dict, calls: int = 1, nodes: int | None = None) -> list[Event]:
    """Every rank's events of the last of `calls` emulated calls, the ranks posing as `nodes` nodes
    (default TILEDSL_NODES, else one)."""
    nodes = nodes if nodes is not None else int(os.environ.get(NODES_VARIABLE) or 1)
    schedule = program_schedule(source)
    sizes = launch_sizes(schedule, world, sizes, {}, nodes)
    per_rank = emulate.run_ranks(_traced_rank, world, source, sizes, calls, EMULATED_DTYPES, 20.0, nodes, nodes=nodes)
    return [e for rank in per_rank for e in rank]


def trace_gpu(source: str, sizes: dict, calls: int = 3) -> list[Event] | None:
    """Under torchrun: every rank runs the program traced; rank 0 gets every rank's events."""
    placement.start()  # ranks sharing a GPU: gloo, and the trace shows their kernels taking turns
    rank, world = dist.get_rank(), dist.get_world_size()
    schedule = program_schedule(source)
    nodes = declared(world).nodes if schedule.spans_nodes else 1  # a one-node program is refused on more
    sizes = {**default_sizes(schedule, world, nodes=nodes), **sizes}
    shapes = Reference(schedule, world, sizes, nodes=nodes).shapes(rank)
    with open_heap() as heap:
        program = tiledsl.compile(source, heap, trace=True)
        inputs = make_inputs(schedule, world, sizes, 0, {}, nodes=nodes)[rank]
        args = {s.name: inputs[s.name].cuda() if s.name in inputs else
                torch.empty(shapes[s.name], dtype=getattr(torch, s.dtype), device="cuda") for s in program.callers}
        for _ in range(calls):
            program(**args)
        mine = events(program)
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
    return [e for each in gathered for e in each] if rank == 0 else None
