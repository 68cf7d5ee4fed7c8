"""Tables (markdown) and a plot (PNG) from the JSON that the GPU benchmarks wrote:
`python bench/report.py bench/results/2026-11-29` writes RESULTS.md and overlap.png beside them."""
import json
import math
import sys
from pathlib import Path


def geomean(values):
    values = [v for v in values if v and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def overlap_table(rows, op):
    lines = ["| model (N, K) | tiledsl | sequential | async-TP | cuBLAS alone | vs sequential | vs async-TP | overlap eff. |",
             "|---|---|---|---|---|---|---|---|"]
    mine = [r for r in rows if r["op"] == op]
    for r in mine:
        lines.append(f"| {r['model']} ({r['N']}, {r['K']}) | {r['tiledsl']:.3f} | {r['sequential']:.3f} | "
                     f"{r['async_tp']:.3f} | {r['gemm']:.3f} | {r['sequential'] / r['tiledsl']:.2f}x | "
                     f"{r['async_tp'] / r['tiledsl']:.2f}x | {r['gemm'] / r['tiledsl']:.2f} |")
    lines.append(f"| geometric mean | | | | | {geomean([r['sequential'] / r['tiledsl'] for r in mine]):.2f}x | "
                 f"{geomean([r['async_tp'] / r['tiledsl'] for r in mine]):.2f}x | |")
    return "\n".join(lines)


def gemm_table(rows):
    lines = ["| problem (M x K x N) | world | cuBLAS ms | tiledsl ms | tiledsl / cuBLAS speed |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['op']} {r['model']} {r['M']}x{r['K']}x{r['N']} | {r['world']} | {r['cublas']:.3f} | "
                     f"{r['tiledsl']:.3f} | {100 * r['fraction_of_cublas']:.0f}% |")
    return "\n".join(lines)


def collectives_tables(data):
    rows = data["rows"]
    push = "push_two_shot" in rows[0]  # runs that also timed the earlier push programs
    alone = "alone_auto" in rows[0]  # runs that timed back to back, and one call at a time beside it
    lines = ["| AllReduce bytes | tiledsl one-shot | two-shot | auto (choice) | NCCL | symm_mem one-shot | symm_mem two-shot |"
             + (" push two-shot (earlier program) |" if push else "") + (" one call alone: auto / NCCL |" if alone else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if push else "") + ("---|" if alone else "")]
    for r in (r for r in rows if r["op"] == "allreduce"):
        size = f"{r['bytes'] // 1024} KB" if r["bytes"] < 2**20 else f"{r['bytes'] // 2**20} MB"
        bw = r["bytes"] >= 2**20
        cell = (lambda k: f"{r[k]:.3f} ms" + (f" ({r['busbw'][k]:.0f} GB/s)" if bw else "")) 
        lines.append(f"| {size} | {cell('one_shot')} | {cell('two_shot')} | {cell('auto')} ({r['auto_algorithm']}) | "
                     f"{cell('nccl')} | {cell('symm_mem_one_shot')} | {cell('symm_mem_two_shot')} |"
                     + (f" {cell('push_two_shot')} |" if push else "")
                     + (f" {r['alone_auto']:.3f} / {r['alone_nccl']:.3f} ms |" if alone else ""))
    gemm = [r for r in rows if r["op"] == "gemm_ar"]
    if gemm:
        pushed = "tiledsl_push" in gemm[0]
        lines += ["", "| GEMM+AllReduce M (N = K = 8192) | tiledsl | matmul + NCCL all_reduce | speed-up |"
                  + (" push version (earlier program) |" if pushed else "")
                  + (" one call alone: tiledsl / sequential |" if "alone_tiledsl" in gemm[0] else ""),
                  "|---|---|---|---|" + ("---|" if pushed else "") + ("---|" if "alone_tiledsl" in gemm[0] else "")]
        for r in gemm:
            lines.append(f"| {r['M']} | {r['tiledsl']:.3f} | {r['sequential']:.3f} | {r['sequential'] / r['tiledsl']:.2f}x |"
                         + (f" {r['tiledsl_push']:.3f} |" if pushed else "")
                         + (f" {r['alone_tiledsl']:.3f} / {r['alone_sequential']:.3f} |" if "alone_tiledsl" in r else ""))
    return "\n".join(lines)


def plot(folder, worlds):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(worlds), 2, figsize=(12, 4.2 * len(worlds)), squeeze=False)
    for row, (world, rows) in enumerate(worlds.items()):
        for col, op in enumerate(("ag_gemm", "gemm_rs")):
            ax = axes[row][col]
            mine = [r for r in rows if r["op"] == op]
            names = [r["model"] for r in mine]
            series = {"tiledsl": "tiledsl", "sequential": "torch sequential", "async_tp": "torch async-TP",
                      "gemm": "cuBLAS alone (perfect overlap)"}
            width = 0.2
            for k, (key, label) in enumerate(series.items()):
                speed = [r["sequential"] / r[key] for r in mine]
                ax.bar([i + (k - 1.5) * width for i in range(len(mine))], speed, width, label=label)
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_xticks(range(len(mine)), names, rotation=15)
            ax.set_ylabel("speed-up over torch sequential")
            ax.set_title(f"{'AllGather+GEMM' if op == 'ag_gemm' else 'GEMM+ReduceScatter'}, world {world}, M=8192")
            if row == 0 and col == 0:
                ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "overlap.png", dpi=110)


def main(folder):
    folder = Path(folder)
    worlds = {}
    for w in (4, 2, 8):
        path = folder / f"overlap_world{w}.json"
        if path.exists():
            worlds[w] = json.loads(path.read_text())["rows"]
    out = [f"# Benchmark results ({folder.name})", "", "Times in ms, median of 30 CUDA-event timings, slowest rank; "
           "baselines measured in the same run. Overlap efficiency = cuBLAS alone on the per-rank problem / tiledsl."]
    for w, rows in worlds.items():
        for op, title in (("ag_gemm", "AllGather + GEMM"), ("gemm_rs", "GEMM + ReduceScatter")):
            out += ["", f"## {title}, world {w}", "", overlap_table(rows, op)]
    gemm = folder / "gemm_tile.json"
    if gemm.exists():
        out += ["", "## GEMM tile alone (communication off) vs cuBLAS, one H200", "",
                gemm_table(json.loads(gemm.read_text())["rows"])]
    for w in (4, 2, 8):
        path = folder / f"collectives_world{w}.json"
        if path.exists():
            data = json.loads(path.read_text())
            how = ("per call, 20 calls back to back between two CUDA events, median of the windows"
                   if "alone_auto" in data["rows"][0] else "per call, one call at a time")
            out += ["", f"## Collectives, world {w} (times in ms {how}; bus bandwidth from 1 MB)", "",
                    collectives_tables(data)]
    (folder / "RESULTS.md").write_text("\n".join(out) + "\n")
    if worlds:
        plot(folder, worlds)
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results")
