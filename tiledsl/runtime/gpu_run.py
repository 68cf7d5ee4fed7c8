"""`tiledsl run` under torchrun on GPUs: the program for real on every rank, checked against the same
torch reference that the emulator uses (computed on each rank's CPU from every rank's inputs)."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from tiledsl.runtime.run_program import TOLERANCE, Verdict, make_inputs, program_schedule
from tiledsl.runtime.reference import Reference


def run_gpu(source: str, sizes: dict, seed: int = 0, calls: int = 2) -> list[Verdict]:
    import tiledsl
    from tiledsl.runtime.heap import disable_multicast, open_heap
    from tiledsl.schedule.meaning import default_sizes

    disable_multicast()
    if not dist.is_initialized():
        dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    schedule = program_schedule(source)
    sizes = {**default_sizes(schedule, world), **sizes}
    inputs = make_inputs(schedule, world, sizes, seed, {})
    expected = Reference(schedule, world, sizes).run(inputs)
    shapes = Reference(schedule, world, sizes).shapes(rank)
    with open_heap() as heap:
        program = tiledsl.compile(source, heap)
        for _ in range(calls):
            args = {}
            for spec in program.callers:
                if spec.role == "out":  # poisoned: an element never written shows up as NaN
                    args[spec.name] = torch.full(shapes[spec.name], float("nan"), dtype=getattr(torch, spec.dtype),
                                                 device="cuda")
                else:
                    args[spec.name] = inputs[rank][spec.name].cuda()
            program(**args)
        verdicts = []
        for spec in program.callers:
            if spec.role not in ("out", "inout"):
                continue
            got, want = args[spec.name].double().cpu(), expected[rank][spec.name]
            error = float("inf") if torch.isnan(got).any() else \
                (got - want).abs().max().item() / (want.abs().max().item() or 1.0)
            worst = torch.tensor([error], device="cuda")
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            note = f", world {world} on GPUs, " + ", ".join(f"{k}={v}" for k, v in sizes.items())
            verdicts.append(Verdict(spec.name, worst.item() <= TOLERANCE[spec.dtype], worst.item(), note))
        dist.barrier()
    return verdicts
