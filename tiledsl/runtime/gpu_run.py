"""`tiledsl run` under torchrun on GPUs: the program for real on every rank, checked against the same
torch reference that the emulator uses (computed on each rank's CPU from every rank's inputs), on
fresh inputs at every call, every call checked."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from tiledsl.runtime.run_program import TOLERANCE, Verdict, compare, make_inputs, program_schedule
from tiledsl.runtime.reference import Reference
from tiledsl.topology import declared


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
    nodes = declared(world).nodes if schedule.spans_nodes else 1  # a one-node program is refused on more
    sizes = {**default_sizes(schedule, world, nodes=nodes), **sizes}
    shapes = Reference(schedule, world, sizes, nodes=nodes).shapes(rank)
    verdicts = {}
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
                if spec.role == "out":  # poisoned: an element never written shows up as NaN
                    args[spec.name].fill_(float("nan"))
                else:
                    args[spec.name].copy_(inputs[rank][spec.name])
            program(**args)
            for spec in program.callers:
                if spec.role in ("out", "inout"):
                    verdict = compare(spec.name, [args[spec.name].cpu()], [expected[rank][spec.name]], spec.dtype)
                    worst = torch.tensor([verdict.max_error], device="cuda")
                    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
                    verdicts[spec.name] = max(verdicts.get(spec.name, 0.0), worst.item())
        dist.barrier()
    note = f", world {world} on GPUs, {calls} calls on fresh inputs, " + ", ".join(f"{k}={v}" for k, v in sizes.items())
    dtypes = {spec.name: spec.dtype for spec in program.callers}
    return [Verdict(name, worst <= TOLERANCE[dtypes[name]], worst, note) for name, worst in verdicts.items()]
