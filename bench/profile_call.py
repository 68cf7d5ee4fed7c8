"""Where one call's time goes on every rank, under torchrun: host time per call and time per call
(CUDA events, host and GPU) with each launch path: CUDA-graph replay, direct relaunch of the compiled
kernels, and every launch through Triton's JIT; and each rank's average time in each GPU kernel over a few calls (torch.profiler).
Each launch path's output is checked against torch's first (a wrong one is a FAIL line, not timed, and
the exit code is 1)."""
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from common import M, NAN, SHAPES, Verdicts, host_us, time_ms  # noqa: E402

import tiledsl  # noqa: E402
from tiledsl.runtime.heap import disable_multicast, open_heap  # noqa: E402

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"


MODES = {"graph": {}, "direct": {"graphs": False}, "JIT": {"graphs": False, "replay": False}}


def modes(name, heap, args, out, want, verdicts, prepare=None):
    """Host and GPU microseconds per call with each launch path (CUDA graph, direct relaunch, JIT), each
    timed once its first call's `out` matched `want`; `prepare()` (default: NaN into `out`) comes first."""
    prepare = prepare or (lambda: out.fill_(NAN))
    cells = []
    for mode, options in MODES.items():
        program = tiledsl.compile(PROGRAMS / f"{name}.tds", heap, **options)
        prepare()
        program(*args)
        if not verdicts.ok(f"{name} {mode}", out, want):
            cells.append(f"{mode} wrong")
            continue
        program(*args)  # the second call records the CUDA graph
        host = host_us(lambda: program(*args, check=False), calls=30)
        gpu = time_ms(lambda: program(*args, check=False)) * 1000
        program.check()
        cells.append(f"{mode} host {host:.0f} / total {gpu:.0f} us")
    return program, ", ".join(cells)


def show(title, mine, world):
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        print(title, flush=True)
        for line in everyone:
            print("   " + line, flush=True)


def main() -> int:
    disable_multicast()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(rank)
    heap = open_heap()
    verdicts = Verdicts()
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    for model in ("LLaMA-7B", "LLaMA-3-70B"):
        N, K = SHAPES[model]
        for name in ("ag_gemm", "gemm_rs", "gemm_rs_pull"):
            if name.startswith("ag_gemm"):
                args = (torch.randn(M // world, K, **bf16), torch.randn(K, N // world, **bf16),
                        torch.empty(M, N // world, **bf16))
                gathered = torch.empty(M, K, **bf16)
                dist.all_gather_into_tensor(gathered, args[0])
                want = gathered @ args[1]
            else:
                args = (torch.randn(M, K // world, **bf16), torch.randn(K // world, N, **bf16),
                        torch.empty(M // world, N, **bf16))
                want = torch.empty(M // world, N, **bf16)
                dist.reduce_scatter_tensor(want, args[0] @ args[1])
            program, cells = modes(name, heap, args, args[2], want, verdicts)
            program = tiledsl.compile(PROGRAMS / f"{name}.tds", heap, graphs=False)  # kernels show by name
            program(*args)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    program(*args, check=False)
                torch.cuda.synchronize()
            program.check()
            verdicts.ok(f"{name} profiled", args[2], want)
            kernels = {e.key[:24]: e.device_time_total / e.count / 1000 for e in prof.key_averages()
                       if e.device_time_total > 0}
            show(f"{model} {name}:", f"rank {rank}: {cells}; GPU ms: " + ", ".join(
                f"{k} {v:.3f}" for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:4]), world)
    for numel in (4096, 1 << 20):  # 8 KB and 2 MB of bf16
        # every call sums in place: start tiny (normal in bf16) so that 100 calls at world 4 stay finite
        fresh = torch.randn(numel, **bf16) * 2.0 ** -120
        x = torch.empty_like(fresh)
        want = fresh.float()
        dist.all_reduce(want)  # one call's sum
        for name in ("allreduce", "allreduce_two_shot"):
            _, cells = modes(name, heap, (x,), x, want, verdicts, prepare=lambda: x.copy_(fresh))
            show(f"{numel * 2} B {name}:", f"rank {rank}: {cells}", world)
    code = verdicts.exit_code()
    heap.close()
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
