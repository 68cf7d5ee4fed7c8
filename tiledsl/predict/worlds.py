"""Predictions at worlds 8, 16 and 64 (8 GPUs a node) for the AG+GEMM and GEMM+RS shapes of LLaMA-3-70B,
against the sequential baseline: the GEMM alone (predicted by the same simulator, `programs/gemm.tds` at
world 1 with one rank's product) plus NCCL's ring model of the collective at the same link rates. Every
figure is a PREDICTION; nothing here was measured. One CPU command writes the table:

    python -m tiledsl.predict.worlds [-o bench/results/predictions/worlds.md] [--max-world W]

NCCL's ring model (the shape of its tuning model, src/graph/tuning.cc): a ring all-gather or
reduce-scatter of `nbytes` (the gathered output, the scattered input) takes
(W-1)/W * nbytes / busbw + the latency of its W-1 steps, W - nodes of them within a node (NVLink's
latency) and nodes - 1 across (IB's). Within one node busbw is NVLink's per direction; once the ring spans
nodes NCCL runs one channel through each of the node's NICs (one a GPU on H200 machines), so busbw is
min(NVLink, GPUs a node * one NIC's rate)."""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tiledsl import library, pipeline
from tiledsl.predict.rates import Rates, load
from tiledsl.predict.simulate import simulate

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "results" / "predictions" / "worlds.md"
GPUS_A_NODE = 8
# bench/common.py: M = 8192 tokens and SHAPES["LLaMA-3-70B"] = (N, K) of its MLP projection, which
# bench/bench_overlap.py shards as AG+GEMM: A[M/W, K] @ B[K, N/W]; GEMM+RS: A[M, K/W] @ B[K/W, N]
MODEL, M, N, K = "LLaMA-3-70B", 8192, 28672, 8192
BF16 = 2
WORLDS = (8, 16, 64)


def ring_busbw_gbps(nodes: int, rates: Rates) -> float:
    """A ring's bus bandwidth: NVLink's in one node; across nodes, one channel a NIC, all the node's NICs."""
    if nodes == 1:
        return rates.link_gbps
    return min(rates.link_gbps, GPUS_A_NODE * rates.ib_link_gbps)


def ring_latency_us(world: int, nodes: int, rates: Rates) -> float:
    """The W-1 steps of a ring: W - nodes hops within a node, nodes - 1 across."""
    return (world - nodes) * rates.nvlink_latency_us + (nodes - 1) * rates.ib_latency_us


def ring_steps_us(world: int, nodes: int, nbytes: int, rates: Rates) -> float:
    """NCCL's ring all-gather (or reduce-scatter) of `nbytes` at `world` ranks in `nodes` nodes."""
    if world == 1:
        return 0.0
    return (world - 1) / world * nbytes / 1e3 / ring_busbw_gbps(nodes, rates) + ring_latency_us(world, nodes, rates)


@dataclass(frozen=True)
class Case:
    op: str            # "AG+GEMM" or "GEMM+RS"
    program: str       # a file in programs/
    world: int
    nodes: int
    sizes: dict        # the program's params at this world
    gemm: dict         # one rank's product alone: M, K, N of programs/gemm.tds
    collective_bytes: int


def cases(worlds=WORLDS) -> list[Case]:
    found = []
    for w in worlds:
        nodes = max(1, w // GPUS_A_NODE)
        one = nodes == 1
        found.append(Case("AG+GEMM", "ag_gemm" if one else "hier_ag_gemm", w, nodes,
                          dict(M=M, K=K, N=N // w), dict(M=M, K=K, N=N // w), M * K * BF16))
        found.append(Case("GEMM+RS", "gemm_rs_pull" if one else "hier_gemm_rs", w, nodes,
                          dict(M=M, K=K // w, N=N), dict(M=M, K=K // w, N=N), M * N * BF16))
    return found


@dataclass(frozen=True)
class Row:
    case: Case
    tiledsl_us: float
    gemm_us: float
    nccl_us: float
    instances: int
    seconds: float

    @property
    def sequential_us(self) -> float:
        return self.gemm_us + self.nccl_us


def _predict_us(program: str, world: int, nodes: int, sizes: dict, rates: Rates) -> tuple[float, int]:
    from tiledsl.tools.run_program import launch_sizes
    schedule = pipeline.run(library.program(program), until="schedule").schedule
    full = launch_sizes(schedule, world, sizes, {}, nodes)
    found = simulate(schedule, world, full, rates, nodes)
    return found.total_us, len(found.concrete.instances)


def predict_row(case: Case, rates: Rates) -> Row:
    began = time.monotonic()
    tiledsl_us, instances = _predict_us(case.program, case.world, case.nodes, case.sizes, rates)
    seconds = time.monotonic() - began
    gemm_us, _ = _predict_us("gemm", 1, 1, case.gemm, rates)
    nccl_us = ring_steps_us(case.world, case.nodes, case.collective_bytes, rates)
    return Row(case, tiledsl_us, gemm_us, nccl_us, instances, seconds)


def _dims(sizes: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items())


def table(rows: list[Row]) -> str:
    lines = ["| | op | program | world x nodes | sizes a rank | predicted tiledsl | predicted GEMM alone | "
             "NCCL ring model | predicted sequential | sequential / tiledsl | instances simulated (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r.case
        lines.append(f"| PREDICTION | {c.op} | {c.program} | {c.world} x {c.nodes} | {_dims(c.sizes)} | "
                     f"{r.tiledsl_us:.0f} us | {r.gemm_us:.0f} us | {r.nccl_us:.0f} us | {r.sequential_us:.0f} us | "
                     f"{r.sequential_us / r.tiledsl_us:.2f} | {r.instances} ({r.seconds:.0f} s) |")
    return "\n".join(lines) + "\n"


HEADER = """# Predictions at worlds 8, 16 and 64 (PREDICTIONS, not measurements)

{model}, M = {m} tokens, (N, K) = ({n}, {k}) as in `bench/common.py`, sharded as `bench/bench_overlap.py`
does (AG+GEMM: A[M/W, K] @ B[K, N/W]; GEMM+RS: A[M, K/W] @ B[K/W, N]); 8 GPUs a node. Written by
`python -m tiledsl.predict.worlds` on the CPU with `tiledsl/predict/h200.json`: NVLink {nv:.0f} GB/s a
direction x {nve} = {nvl:.0f} GB/s, {nvlat} us a step; IB {ib:.0f} GB/s a GPU x {ibe} = {ibl:.0f} GB/s,
{iblat} us a step. "predicted tiledsl" is `tiledsl predict` of the program (call, staging and kernel);
"predicted GEMM alone" is `tiledsl predict programs/gemm.tds --world 1` of one rank's product; "NCCL ring
model" is (W-1)/W * bytes / busbw + (W-nodes) * NVLink latency + (nodes-1) * IB latency of the all-gather
(M*K bf16 gathered) or reduce-scatter (M*N bf16 scattered), busbw NVLink's at one node and
min(NVLink, 8 NICs * IB) = {ring:.0f} GB/s once the ring spans nodes (one NCCL channel through each NIC).
A ratio above 1 says tiledsl's overlapped call is predicted faster than the GEMM followed by NCCL.

"""

MODELLED = """
What is and is not modelled. The tiledsl column simulates every instance of every rank of the program's
schedule (the meaning the checker proves) on the lanes that run them, waits released at their producers'
ends plus a signal's latency (each wait's read and each release store paid on its program), tiles costed
from FLOPs and bytes against the H200 rates (calibrated on one GPU, NVLink's efficiency from a world-2
baseline, IB's assumed); the baseline's GEMM uses the same
tile model, so the ratio compares schedules under one set of rates. NCCL is a formula, not a simulation:
its ring at the same effective link rates, one channel a NIC across nodes, with no launch cost, no
protocol choice (LL/LL128/Simple), no tree, PXN or NVLS/SHARP offload, so it is closer to a best case for
a ring under these rates than to what NCCL would measure. Not modelled on either side: contention between
families sharing SMs, HBM or a link beyond each program's fixed share, a ring's forwarding chain inside
tiledsl's own programs, waits inside a tile's loop, IB congestion or a NIC's per-message cost, and rail
topology (every GPU has its own NIC of the same rate). At world 64 AG+GEMM's product is one wave of 128
tiles a rank of ~100 us each, so the predicted call is its communication chain (the puts across nodes,
then the 16 copy programs' shares within the node, in their order) plus one tile: tiledsl's program is
predicted slower than the GEMM followed by NCCL there. Seconds are the simulation's on a busy 2-core CPU.
Nothing in this table has been measured: the predictor is checked only at worlds 2 and 4 on one node
(`history.md`), and the multi-node rows (hier_*) are unchecked against any GPU.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tiledsl.predict.worlds", description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default=str(OUT), help="the markdown table to write")
    parser.add_argument("--max-world", type=int, default=max(WORLDS), help="leave out larger worlds (a quick look)")
    args = parser.parse_args(argv)
    rates = load()
    rows = []
    for case in cases(tuple(w for w in WORLDS if w <= args.max_world)):
        rows.append(predict_row(case, rates))
        r = rows[-1]
        print(f"{case.op} {case.program} {case.world}x{case.nodes}: {r.tiledsl_us:.0f} us against "
              f"{r.sequential_us:.0f} us ({r.instances} instances, {r.seconds:.0f} s)", file=sys.stderr)
    text = HEADER.format(model=MODEL, m=M, n=N, k=K, nv=rates.nvlink_gbps, nve=rates.nvlink_efficiency,
                         nvl=rates.link_gbps, nvlat=rates.nvlink_latency_us, ib=rates.ib_gbps,
                         ibe=rates.ib_efficiency, ibl=rates.ib_link_gbps, iblat=rates.ib_latency_us,
                         ring=ring_busbw_gbps(2, rates))
    text += table(rows) + MODELLED
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
