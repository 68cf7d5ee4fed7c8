"""The inter-node path under torchrun: the two-level AllGather, ReduceScatter and AllReduce of programs/
against NCCL's, with the same layout (each rank one GPU, the same tensors). Meant for a topology of
several nodes: on one machine TILEDSL_NODES=2 makes its GPUs pose as 2 nodes, and tiledsl's ranks on
different nodes then talk only through NVSHMEM puts and signals (and the two-level entry barrier). At 2
nodes x 1 every byte a rank receives crosses that path, so this is its latency and bandwidth.

On one machine both tiledsl's NVSHMEM and NCCL still move the bytes over NVLink: this measures the
code path (puts with signals, NVSHMEM signals, the barrier's two levels), not InfiniBand. On a cluster,
run it under `torchrun --nnodes N --nproc-per-node G` (TILEDSL_NODES unset) for the real network.

Latency from 8 KB to 1 MB, bandwidth from 1 MB to 256 MB (bf16, the whole gathered, scattered or
reduced tensor); per call with 20 calls back to back between two CUDA events, the median of the
windows, the slowest rank's; algorithm bandwidth = bytes / time, and bus bandwidth as nccl-tests counts
it ((world-1)/world of it for AllGather and ReduceScatter, twice that for AllReduce). Every tiledsl
output is checked against NCCL's before it is timed: a wrong one is a FAIL line, left out, exit code 1.

The programs move a rank's share in pieces, each by its own program (PIECES, PUT_SMS, COPY_SMS); at 1,
16 and 256 MB the same programs are also timed built as before the pieces (one program a copy: PIECES=1,
8 programs a family) and with 16 warps a program (NVSHMEM's block puts use every thread of a program),
so that one run shows what each change is worth. `variant` in the JSON rows names them."""
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from common import NAN, Verdicts, program_call, save, slowest, time_checked, time_loop_ms  # noqa: E402

import tiledsl  # noqa: E402
from tiledsl.runtime.heap import disable_multicast, open_heap  # noqa: E402

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
LATENCY_BYTES = [8 << 10 << 2 * n for n in range(4)]   # 8 KB .. 512 KB
BANDWIDTH_BYTES = [1 << 20 << 2 * n for n in range(5)]  # 1 MB .. 256 MB
COLS = 1024
VARIANT_BYTES = [1 << 20, 16 << 20, 256 << 20]
# variant: (consts per op, compile options); "pieces" is the programs as written
VARIANTS = {
    "one_piece": ({"allgather": {"PIECES": 1, "PUT_SMS": 8, "COPY_SMS": 8},
                   "reduce_scatter": {"PIECES": 1, "PUT_SMS": 8},
                   "allreduce": {"PUT_SMS": 8}}, {}),
    "warps16": ({}, {"num_warps": 16}),
}


def rows_for(nbytes: int, world: int) -> int:
    """Rows per rank of a bf16 [rows * world, COLS] tensor of about `nbytes`."""
    return max(1, nbytes // 2 // COLS // world)


def allgather_row(program, nbytes, world, verdicts):
    rows = rows_for(nbytes, world)
    X = torch.randn(rows, COLS, device="cuda", dtype=torch.bfloat16)
    Y, want = (torch.empty(rows * world, COLS, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dist.all_gather_into_tensor(want, X)
    row = {"op": "allgather", "bytes": Y.numel() * 2}
    row["tiledsl"] = time_checked(verdicts, f"hier_allgather {row['bytes']} B", program_call(program, X, Y),
                                  program.check, Y, want, timer=time_loop_ms, tol=0.0)
    row["nccl"] = slowest(time_loop_ms(lambda: dist.all_gather_into_tensor(want, X)))
    return row


def reduce_scatter_row(program, nbytes, world, verdicts):
    rows = rows_for(nbytes, world)
    X = torch.randn(rows * world, COLS, device="cuda", dtype=torch.bfloat16)
    Y, out = (torch.empty(rows, COLS, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    want = torch.empty(rows, COLS, device="cuda")
    dist.reduce_scatter_tensor(want, X.float())
    row = {"op": "reduce_scatter", "bytes": X.numel() * 2}
    row["tiledsl"] = time_checked(verdicts, f"hier_reduce_scatter {row['bytes']} B", program_call(program, X, Y),
                                  program.check, Y, want, timer=time_loop_ms)
    row["nccl"] = slowest(time_loop_ms(lambda: dist.reduce_scatter_tensor(out, X)))
    return row


def allreduce_row(program, nbytes, world, verdicts):
    # each call sums in place: start small (and normal in bf16), put back before every window
    fresh = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16) * 2.0 ** -100
    X = torch.empty_like(fresh)
    refill = lambda: X.copy_(fresh)  # noqa: E731
    want = fresh.float()
    dist.all_reduce(want)
    row = {"op": "allreduce", "bytes": X.numel() * 2}
    row["tiledsl"] = time_checked(verdicts, f"hier_allreduce {row['bytes']} B", program_call(program, X),
                                  program.check, X, want, before=refill, recheck=False, timer=time_loop_ms)
    row["nccl"] = slowest(time_loop_ms(lambda: dist.all_reduce(X), before=refill))
    return row


def bandwidths(row, world) -> dict:
    """GB/s: algorithm bandwidth (bytes / time) and bus bandwidth (nccl-tests' factor)."""
    bus = (world - 1) / world * (2 if row["op"] == "allreduce" else 1)
    out = {}
    for key in ("tiledsl", "nccl"):
        algbw = row["bytes"] / 1e6 / row[key] if row[key] == row[key] else NAN
        out[f"{key}_algbw"], out[f"{key}_busbw"] = algbw, algbw * bus
    return out


def main() -> int:
    disable_multicast()
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(16 << 30))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(rank)  # every rank its own data: a sum of equal copies hides a rank read twice
    heap = open_heap()
    verdicts = Verdicts()
    ops = ("allgather", "reduce_scatter", "allreduce")
    programs = {op: tiledsl.compile(PROGRAMS / f"hier_{op}.tds", heap) for op in ops}
    variants = {(name, op): tiledsl.compile(PROGRAMS / f"hier_{op}.tds", heap, **options, **consts.get(op, {}))
                for name, (consts, options) in VARIANTS.items() for op in ops}
    rows = {"allgather": allgather_row, "reduce_scatter": reduce_scatter_row, "allreduce": allreduce_row}
    if rank == 0:
        print(f"world {world} as {heap.topology} ranks (TILEDSL_NODES={os.environ.get('TILEDSL_NODES', 'unset')}); "
              "times in ms per call, back to back; bandwidth in GB/s", flush=True)
    results = []
    runs = [(op, "pieces", nbytes) for op in rows for nbytes in LATENCY_BYTES + BANDWIDTH_BYTES]
    runs += [(op, name, nbytes) for op in rows for name in VARIANTS for nbytes in VARIANT_BYTES]
    for op, variant, nbytes in runs:
        program = programs[op] if variant == "pieces" else variants[variant, op]
        row = {**rows[op](program, nbytes, world, verdicts), "world": world, "nodes": heap.topology.nodes,
               "variant": variant}
        row.update(bandwidths(row, world))
        results.append(row)
        if rank == 0:
            kind = "latency" if nbytes in LATENCY_BYTES else "bandwidth"
            kind = kind if variant == "pieces" else variant
            print(f"{op:<15} {kind:<9} {row['bytes']:>10} B: tiledsl {row['tiledsl']:.4f} ms "
                  f"({row['tiledsl_busbw']:.0f} GB/s bus), nccl {row['nccl']:.4f} ms "
                  f"({row['nccl_busbw']:.0f} GB/s bus), nccl/tiledsl {row['nccl'] / row['tiledsl']:.2f}x",
                  flush=True)
    if rank == 0:
        save(f"nodes_world{world}", {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                     "topology": str(heap.topology), "wrong": verdicts.wrong, "rows": results})
    code = verdicts.exit_code()
    dist.barrier()
    heap.close()
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
