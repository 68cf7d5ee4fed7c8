"""`tiledsl run` under torchrun on GPUs: the program for real on every rank, checked against the same
torch reference that the emulator uses (computed on each rank's CPU from every rank's inputs), on
fresh inputs at every call, every call checked. Ranks may share GPUs (`tiledsl.runtime.placement`):
then the process group is gloo and the answers are as right, though no time means anything."""
from __future__ import annotations

import torch
import torch.distributed as dist

import tiledsl
from tiledsl.runtime import placement
from tiledsl.runtime.heap import open_heap
from tiledsl.tools.reference import Reference
from tiledsl.tools.run_program import (TOLERANCE, Verdict, compare, launch_sizes, left_as_passed, make_inputs,
                                       poison, program_schedule, still_as_passed, valid_rows, written_ranks)
from tiledsl.topology import declared


def run_gpu(source: str, sizes: dict, seed: int = 0, calls: int = 2) -> list[Verdict]:
    place = placement.start()
    rank, world = dist.get_rank(), dist.get_world_size()
    schedule = program_schedule(source)
    nodes = declared(world).nodes if schedule.spans_nodes else 1  # a one-node program is refused on more
    # the defaults, and given sizes the program (or its kernel's TMA rows) cannot run at refused at their line
    sizes = launch_sizes(schedule, world, sizes, {}, nodes)
    shapes = Reference(schedule, world, sizes, nodes=nodes).shapes(rank)
    verdicts, notes = {}, {}
    # an out tensor no instance writes on this rank (a family with `if rank == 0`) keeps what was passed
    written = written_ranks(schedule, world, sizes, {}, nodes)
    with open_heap() as heap:
        program = tiledsl.compile(source, heap)
        args = {spec.name: torch.empty(shapes[spec.name], dtype=getattr(torch, spec.dtype), device="cuda")
                for spec in program.callers}
        # one for every call: symm and local tensors persist
        reference = Reference(schedule, world, sizes, nodes=nodes)
        for call in range(calls):  # fresh inputs every call, in the same tensors, every call checked
            inputs = make_inputs(schedule, world, sizes, seed + 1000 * call, {}, nodes=nodes)
            expected = reference.run(inputs)
            for spec in program.callers:
                if spec.role == "out":  # poisoned: an element never written shows up (NaN, or an int's minimum)
                    args[spec.name].fill_(poison(args[spec.name].dtype))
                else:
                    args[spec.name].copy_(inputs[rank][spec.name])
            program(**args)
            for spec in program.callers:
                if spec.role in ("out", "inout"):
                    error, notes[spec.name] = output_error(schedule, spec.name, rank, world, written,
                                                           args[spec.name].cpu(), expected[rank])
                    worst = torch.tensor([error], dtype=torch.float64, device="cuda")
                    placement.all_reduce(worst, op=dist.ReduceOp.MAX)
                    verdicts[spec.name] = max(verdicts.get(spec.name, 0.0), worst.item())
        dist.barrier()
    where = f"world {world} on {place.gpus} GPU{'s' if place.gpus > 1 else ''}" + (
        " (ranks share GPUs: no speed)" if place.shared else "")
    note = f", {where}, {calls} calls on fresh inputs, " + ", ".join(f"{k}={v}" for k, v in sizes.items())
    dtypes = {spec.name: spec.dtype for spec in program.callers}
    return [Verdict(name, worst <= TOLERANCE[dtypes[name]], worst, note + notes[name])
            for name, worst in verdicts.items()]


def output_error(schedule, name: str, rank: int, world: int, written: dict[str, set[int]], got: torch.Tensor,
                 expected: dict) -> tuple[float, str]:
    """(this rank's error, the verdict's note) for output `name`: against the reference where some
    instance writes this rank's copy (below its count if `upto`), else (an `out` on a rank that a
    family's `if rank == ...` leaves out) 0 if it kept the poison it was passed with, inf if anything
    wrote it; the note says the same on every rank."""
    tensor = schedule.tensors[name]
    kept = tensor.role.value == "out" and len(written[name]) < world
    note = (f"; compared below {tensor.upto}" if tensor.upto is not None else "") + (
        left_as_passed(world, written[name]) if kept else "")
    if kept and rank not in written[name]:
        return (0.0 if still_as_passed(got) else float("inf")), note
    got, want, _ = below_count(schedule, name, got, expected[name], expected)
    return compare(name, [got], [want], tensor.dtype).max_error, note


def below_count(schedule, name: str, got: torch.Tensor, want: torch.Tensor, expected: dict):
    """(got, want, note): an output declared `upto count` only below its count, as emulation compares it
    (the rows past it are unspecified); any other output whole."""
    tensor = schedule.tensors[name]
    if tensor.upto is None:
        return got, want, ""
    valid = valid_rows(want.shape, expected[tensor.upto])
    return torch.where(valid, got.double(), 0.0), torch.where(valid, want.double(), 0.0), \
        f"; compared below {tensor.upto}"
