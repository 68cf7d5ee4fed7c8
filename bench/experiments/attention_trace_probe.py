"""Where does sp_ag_attention at BM=128 BN=64 (3 stages) lose its 1.5x against its own loop and waits?

Session 13, run 1 (world 1, B=2, 8192 tokens): the SP program 4.87 ms, attention_local_waits (the same
loop and waits, K and V in torch's memory, no gather) 3.16 ms, the tile alone 3.21 ms: the waits and
the one-stage outer loop cost nothing, so the difference lay in what the SP program does besides: its
copies, which ran at 37 GB/s on the one SM left free (local_copy_probe.py), now before the kernel.
This times each variant untraced, then traces one call of each (GPU clock stamps per instance) and
prints, per variant: the kernel's span, how long tiles waited, when the copies ran, and how busy the
programs were.

    torchrun --nproc-per-node=1 bench/experiments/attention_trace_probe.py
"""
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(ROOT / "bench"))
from common import time_ms  # noqa: E402
from harness import start  # noqa: E402

import tiledsl  # noqa: E402
from tiledsl.tools import trace  # noqa: E402

B, P, H, HKV, D = 2, 4096, 32, 8, 128
BLOCKS = {"BM": 128, "BN": 64, "num_stages": 3}
OUT = Path(os.environ.get("OUT") or ROOT / "bench" / "results")


def describe(label: str, events) -> None:
    tiles = [e for e in events if e.kind == "tile" and e.family == "attn"]
    copies = [e for e in events if e.engine == "copy_engine"]
    span = max(e.end_us for e in tiles) - min(e.start_us for e in tiles)
    busy = sum(e.end_us - e.waited_us for e in tiles)
    waiting = sum(e.waited_us - e.start_us for e in tiles)
    programs = len({e.program for e in tiles})
    durations = sorted(e.end_us - e.waited_us for e in tiles)
    ends = sorted(e.end_us for e in tiles)
    first = min(e.start_us for e in tiles)
    print(f"-- {label}: {len(tiles)} attn tiles on {programs} programs; first start {first:.1f} us, "
          f"last end {ends[-1]:.1f} us, span {span:.1f} us", flush=True)
    print(f"   busy {busy / programs:.1f} us a program (mean), waiting {waiting / programs:.1f} us a program; "
          f"tile time median {durations[len(durations) // 2]:.1f} us, max {durations[-1]:.1f} us; "
          f"95% of tiles ended by {ends[int(0.95 * len(ends))]:.1f} us", flush=True)
    for z in (0, 1):  # z is the second-to-last index: instance = ((b*H + h)*2 + z)*NI + i
        ni = -(-P // BLOCKS["BM"])
        mine = [e.end_us - e.waited_us for e in tiles if (e.instance // ni) % 2 == z]
        if mine:
            print(f"   z={z}: {len(mine)} tiles, mean {statistics.mean(mine):.1f} us", flush=True)
    per_program = {}
    for e in tiles:
        per_program.setdefault(e.program, []).append(e)
    lasts = sorted(max(x.end_us for x in v) for v in per_program.values())
    print(f"   programs end from {lasts[0]:.1f} to {lasts[-1]:.1f} us", flush=True)
    for e in sorted(copies, key=lambda e: e.start_us):
        print(f"   copy {e.family}[{e.instance}] {e.start_us:.1f} -> {e.end_us:.1f} us", flush=True)


def main():
    _, world, heap = start(13)
    assert world == 1, "made for one GPU"
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    Q = torch.randn(B, 2, P, H, D, **bf16)
    K, V = torch.randn(B, 2, P, HKV, D, **bf16), torch.randn(B, 2, P, HKV, D, **bf16)
    O = torch.empty(B, 2, P, H, D, **bf16)
    experiments = ROOT / "bench" / "experiments"
    sp_path, waits_path = ROOT / "programs" / "sp_ag_attention.tds", experiments / "attention_local_waits.tds"
    variants = {
        "sp (default programs)": (sp_path, {}),
        "waits (132 programs)": (waits_path, {}),
    }
    want = None
    for label, (path, options) in variants.items():
        try:
            plain = tiledsl.compile(path, heap, D=D, **BLOCKS, **options)
            ms = time_ms(lambda: plain(Q, K, V, O), warmup=1, reps=20)
            if want is None:
                want = O.clone()
            diff = (O.float() - want.float()).abs().max().item()
            print(f"{label:28s} {ms:.3f} ms (max abs difference from the first: {diff:.3g})", flush=True)
            plain.release()
            traced = tiledsl.compile(path, heap, D=D, trace=True, **BLOCKS, **options)
            for _ in range(3):
                traced(Q, K, V, O)
            events = trace.events(traced)
            describe(label, events)
            name = label.split(" ")[0].strip(",") + "_" + "".join(c for c in label if c.isdigit())
            trace.chrome_trace(events, OUT / f"attn_trace_{name}.json")
            traced.release()
        except Exception as error:  # noqa: BLE001 - one variant's failure must not hide the others
            print(f"{label}: FAILED {type(error).__name__}: {error}", flush=True)
    heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
