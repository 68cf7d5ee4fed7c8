"""What every multi-GPU check script shares: starting a rank under torchrun with its symmetric heap,
and recording checks so that every rank runs every check and rank 0 prints one PASS/FAIL line each."""
import os

import torch
import torch.distributed as dist

from tiledsl.runtime.heap import disable_multicast, open_heap


def start(seed: int, backend: str = "nccl"):
    """(rank, world, heap) for this torchrun process; NVLink multicast stays off everywhere."""
    disable_multicast()
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(seed + rank)
    heap = open_heap() if backend == "nccl" else None
    if rank == 0 and heap is not None:
        print(f"heap: {type(heap).__name__}, world {world}", flush=True)
    return rank, world, heap


class Checks:
    """Each check runs on every rank; it passes only if it passed everywhere, and a failure on one rank
    is printed with its message, never hidden by the others' success."""

    def __init__(self):
        self.failures = 0

    def record(self, name: str, check) -> bool:
        """Run one check on every rank and print one PASS/FAIL line. CHECKS_ONLY=TEXT runs only the
        checks whose name contains TEXT (to try one new program first, under a short time limit)."""
        if os.environ.get("CHECKS_ONLY", "") not in name:
            return True
        try:
            check()
            mine = (True, "")
        except Exception as error:  # noqa: BLE001 - reported, not hidden
            mine = (False, f"{type(error).__name__}: {str(error)[:400]}")
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        ok = all(passed for passed, _ in everyone)
        self.failures += not ok
        if dist.get_rank() == 0:
            detail = "" if ok else " -- " + next(message for passed, message in everyone if not passed)
            print(f"{'PASS' if ok else 'FAIL'} {name}{detail}", flush=True)
        return ok

    def finish(self, heap) -> int:
        """Close the heap and the group; the exit code of the script."""
        dist.barrier()
        if dist.get_rank() == 0:
            print(f"{self.failures} failed", flush=True)
        if heap is not None:
            heap.close()
        dist.destroy_process_group()
        return 1 if self.failures else 0
