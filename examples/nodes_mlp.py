#!/usr/bin/env python3
"""A sequence-parallel MLP across nodes: Y = reduce_scatter(all_gather(X) @ W1 @ W2), the rows of X and Y
sharded over every rank of every node, W1 by columns and W2 by rows. The two GEMMs are the two-level
programs: hier_ag_gemm starts on its own node's rows while the other nodes' rows cross the network
(NVSHMEM puts), and hier_gemm_rs computes the other nodes' rows first so that their sums cross while it
computes its own. Checked against torch.distributed's all_gather + matmul + reduce_scatter on the same
inputs, and both timed.

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        examples/nodes_mlp.py                                         # a cluster: the topology from torchrun
    TILEDSL_NODES=2 torchrun --nproc-per-node 2 examples/nodes_mlp.py  # one machine posing as 2 nodes
    python examples/nodes_mlp.py --emulate --world 4 --nodes 2         # CPU, emulated ranks

Emulated timings measure the interpreter, not a GPU: the emulated run checks agreement only."""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
# the interpreter's bf16 `tl.dot` is wrong: emulated, bf16 runs as float32, in tiles small enough for it
EMULATED = {"dtype_override": {"bfloat16": torch.float32}, "BM": 16, "BN": 32, "wait_timeout_s": 60.0}
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def programs(heap, emulated: bool):
    import tiledsl
    options = EMULATED if emulated else {}
    return (tiledsl.compile(PROGRAMS / "hier_ag_gemm.tds", heap, emulated=emulated, **options),
            tiledsl.compile(PROGRAMS / "hier_gemm_rs.tds", heap, emulated=emulated, **options,
                            **({"BR": 16} if emulated else {})))


def run(heap, tokens: int, hidden: int, ffn: int, dtype, device, iters: int, emulated: bool) -> dict:
    """Both ways on this rank's shards; the largest difference relative to torch's scale, and times."""
    world, rank = dist.get_world_size(), dist.get_rank()
    ag_gemm, gemm_rs = programs(heap, emulated)
    generator = torch.Generator().manual_seed(rank)
    X = torch.randn(tokens // world, hidden, generator=generator).to(device, dtype)
    W1 = (torch.randn(hidden, ffn // world, generator=generator) / hidden ** 0.5).to(device, dtype)
    W2 = (torch.randn(ffn // world, hidden, generator=generator) / ffn ** 0.5).to(device, dtype)
    H = torch.empty(tokens, ffn // world, device=device, dtype=dtype)
    Y = torch.empty(tokens // world, hidden, device=device, dtype=dtype)

    def with_tiledsl():
        ag_gemm(X, W1, H)
        gemm_rs(H, W2, Y)
        return Y

    def with_torch(exact: bool = False):
        """exact: the products in float32 (the reference); else in `dtype`, as a model would (timed)."""
        work = torch.float32 if exact else dtype
        gathered = torch.empty(tokens, hidden, device=device, dtype=dtype)
        dist.all_gather_into_tensor(gathered, X)
        partial = (gathered.to(work) @ W1.to(work)).to(dtype).to(work) @ W2.to(work)
        out = torch.empty(tokens // world, hidden, device=device, dtype=work)
        dist.reduce_scatter_tensor(out, partial)
        return out

    want = with_torch(exact=True)
    H.fill_(float("nan"))
    Y.fill_(float("nan"))
    got = with_tiledsl().float()
    difference = ((got - want).abs().max() / want.abs().max()).item()  # NaN (never written) stays NaN
    times = {name: timed(fn, device, iters) for name, fn in (("tiledsl", with_tiledsl), ("torch", with_torch))}
    return {"rank": rank, "topology": str(heap.topology), "max_rel_diff": difference, **times}


def timed(fn, device, iters: int) -> float:
    """Milliseconds per call, `iters` calls back to back after one warm-up (0 iters: not timed)."""
    if not iters:
        return float("nan")
    fn()
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    synchronize()
    begin = time.perf_counter()
    for _ in range(iters):
        fn()
    synchronize()
    return (time.perf_counter() - begin) / iters * 1e3


def emulated_rank(heap, rendezvous: str, options: dict) -> dict:
    """One emulated rank (CPU): a gloo group beside the heap for torch's collectives."""
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=heap.rank, world_size=heap.world,
                            timeout=datetime.timedelta(seconds=300))
    try:
        return run(heap, **options, dtype=torch.float32, device=torch.device("cpu"), emulated=True)
    finally:
        dist.destroy_process_group()
        heap.close()


def emulate(world: int, nodes: int, options: dict) -> list[dict]:
    from tiledsl.runtime.emulate import run_ranks
    sys.path.insert(0, str(Path(__file__).parent))
    import nodes_mlp  # this file by its own name: the ranks' processes import it, not __main__
    with tempfile.TemporaryDirectory() as folder:
        return run_ranks(nodes_mlp.emulated_rank, world, os.path.join(folder, "rendezvous"), options,
                         timeout_s=1800, nodes=nodes)


def report(rows: list[dict], dtype) -> str:
    worst = max(r["max_rel_diff"] for r in rows)
    first = rows[0]
    timed = first["tiledsl"] == first["tiledsl"]  # NaN: emulated, not timed
    times = (f"tiledsl {first['tiledsl']:.3f} ms, torch {first['torch']:.3f} ms per MLP (rank 0)" if timed else
             "not timed (emulated)")
    return (f"{first['topology']} ranks: {times}; largest difference {worst:.2e} of the output's scale "
            f"(allowed {TOLERANCE[dtype]:g})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=16384, help="rows of X over all ranks")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--ffn", type=int, default=14336)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--emulate", action="store_true", help="CPU: emulated ranks in Triton's interpreter")
    parser.add_argument("--world", type=int, default=4, help="ranks when emulated")
    parser.add_argument("--nodes", type=int, default=2, help="nodes the emulated ranks pose as")
    args = parser.parse_args(argv)
    if args.emulate:
        sizes = {"tokens": args.world * 32, "hidden": 64, "ffn": args.world * 24, "iters": 0}
        rows = emulate(args.world, args.nodes, sizes)
        dtype = torch.float32
    else:
        from tiledsl.runtime.heap import disable_multicast, open_heap
        disable_multicast()
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        dtype = torch.bfloat16
        with open_heap() as heap:
            mine = run(heap, args.tokens, args.hidden, args.ffn, dtype, torch.device("cuda", local_rank),
                       args.iters, emulated=False)
            rows = [None] * dist.get_world_size()
            dist.all_gather_object(rows, mine)
        dist.destroy_process_group()
        if int(os.environ.get("RANK", 0)):
            return 0 if all(r["max_rel_diff"] <= TOLERANCE[dtype] for r in rows) else 1
    print(report(rows, dtype))
    return 0 if all(r["max_rel_diff"] <= TOLERANCE[dtype] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
