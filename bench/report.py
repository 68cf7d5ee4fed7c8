"""Tables (markdown) and a plot (PNG) from the JSON that the GPU benchmarks wrote:
`python bench/report.py bench/results/2026-11-29` writes RESULTS.md and overlap.png beside them."""
import json
import math
import sys
from pathlib import Path


def geomean(values):
    values = [v for v in values if v and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def ratio(a, b) -> str:
    return f"{a / b:.2f}x" if math.isfinite(a / b) else "-"


def percent(a, b) -> str:
    return f"{100 * a / b:.0f}%" if math.isfinite(a / b) else "-"


def ms(value) -> str:
    return f"{value:.3f}" if math.isfinite(value) else "-"


def best_cell(r) -> str:
    """The best variant's time and name; runs before the headline was the user's program stored the
    best of the variants as `tiledsl` and named none."""
    if "best" not in r:
        return ms(r["tiledsl"])
    return f"{ms(r['best'])} ({r['best_variant']})" if r["best_variant"] else "-"


def headline(r) -> float:
    """What a user gets; NaN for runs that stored only the best of the variants."""
    return r["tiledsl"] if "best" in r else float("nan")


def overlap_table(rows, op):
    lines = ["| model (N, K) | tiledsl (program) | sequential | async-TP | cuBLAS alone | vs sequential | vs async-TP "
             "| overlap eff. | best variant | best vs sequential |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    mine = [r for r in rows if r["op"] == op]
    for r in mine:
        mean = headline(r)
        best = r.get("best", r["tiledsl"])
        program = f" ({r['tiledsl_program']})" if "tiledsl_program" in r else ""
        lines.append(f"| {r['model']} ({r['N']}, {r['K']}) | {ms(mean)}{program} | {r['sequential']:.3f} | "
                     f"{r['async_tp']:.3f} | {r['gemm']:.3f} | {ratio(r['sequential'], mean)} | "
                     f"{ratio(r['async_tp'], mean)} | {ratio(r['gemm'], mean).rstrip('x')} | {best_cell(r)} | "
                     f"{ratio(r['sequential'], best)} |")
    lines.append(f"| geometric mean | | | | | {ratio(geomean([r['sequential'] / headline(r) for r in mine]), 1)} | "
                 f"{ratio(geomean([r['async_tp'] / headline(r) for r in mine]), 1)} | | | "
                 f"{ratio(geomean([r['sequential'] / r.get('best', r['tiledsl']) for r in mine]), 1)} |")
    return "\n".join(lines)


def gemm_table(rows):
    lines = ["| problem (M x K x N) | world | cuBLAS ms | tiledsl ms | tiledsl / cuBLAS speed | best variant ms "
             "| best / cuBLAS speed |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        mean = headline(r)
        best = r.get("best", r["tiledsl"])
        lines.append(f"| {r['op']} {r['model']} {r['M']}x{r['K']}x{r['N']} | {r['world']} | {r['cublas']:.3f} | "
                     f"{ms(mean)} | {percent(r['cublas'], mean)} | {best_cell(r)} | {percent(r['cublas'], best)} |")
    return "\n".join(lines)


def collectives_tables(data):
    rows = data["rows"]
    push = "push_two_shot" in rows[0]  # runs that also timed the earlier push programs
    alone = "alone_auto" in rows[0]  # runs that timed back to back, and one call at a time beside it
    best = "best" in rows[0]
    heap = "heap_input" in rows[0]  # runs that timed the out-of-place one-shot on an input in the heap
    lines = ["| AllReduce bytes | tiledsl auto (AllReduce's choice) | one-shot | two-shot | NCCL | symm_mem one-shot "
             "| symm_mem two-shot |" + (" tiledsl, input on the heap (out=) |" if heap else "")
             + (" best variant |" if best else "")
             + (" push two-shot (earlier program) |" if push else "")
             + (" one call alone: auto / NCCL |" if alone else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if heap else "") + ("---|" if best else "")
             + ("---|" if push else "")
             + ("---|" if alone else "")]
    for r in (r for r in rows if r["op"] == "allreduce"):
        size = f"{r['bytes'] // 1024} KB" if r["bytes"] < 2**20 else f"{r['bytes'] // 2**20} MB"
        bw = r["bytes"] >= 2**20
        cell = (lambda k: "-" if not math.isfinite(r[k]) else f"{r[k]:.3f} ms"
                + (f" ({r['busbw'][k]:.0f} GB/s)" if bw and k in r["busbw"] else ""))
        lines.append(f"| {size} | {cell('auto')} ({r['auto_algorithm']}) | {cell('one_shot')} | {cell('two_shot')} | "
                     f"{cell('nccl')} | {cell('symm_mem_one_shot')} | {cell('symm_mem_two_shot')} |"
                     + (f" {cell('heap_input')} |" if heap else "")
                     + (f" {cell(r['best_variant'])} ({r['best_variant']}) |" if best and r['best_variant'] else
                        " - |" if best else "")
                     + (f" {cell('push_two_shot')} |" if push else "")
                     + (f" {r['alone_auto']:.3f} / {r['alone_nccl']:.3f} ms |" if alone else ""))
    gemm = [r for r in rows if r["op"] == "gemm_ar"]
    if gemm:
        pushed = "tiledsl_push" in gemm[0]
        best = "best" in gemm[0]
        lines += ["", "| GEMM+AllReduce M (N = K = 8192) | tiledsl | matmul + NCCL all_reduce | speed-up |"
                  + (" best variant |" if best else "") + (" push version (earlier program) |" if pushed else "")
                  + (" one call alone: tiledsl / sequential |" if "alone_tiledsl" in gemm[0] else ""),
                  "|---|---|---|---|" + ("---|" if best else "") + ("---|" if pushed else "")
                  + ("---|" if "alone_tiledsl" in gemm[0] else "")]
        for r in gemm:
            lines.append(f"| {r['M']} | {ms(r['tiledsl'])} | {r['sequential']:.3f} | "
                         f"{ratio(r['sequential'], r['tiledsl'])} |"
                         + (f" {best_cell(r)} |" if best else "")
                         + (f" {ms(r['tiledsl_push'])} |" if pushed else "")
                         + (f" {ms(r['alone_tiledsl'])} / {r['alone_sequential']:.3f} |"
                            if "alone_tiledsl" in r else ""))
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
            series = {"tiledsl": "tiledsl (what a user gets)", "best": "tiledsl, best variant",
                      "sequential": "torch sequential", "async_tp": "torch async-TP",
                      "gemm": "cuBLAS alone (perfect overlap)"}
            width = 0.16
            for k, (key, label) in enumerate(series.items()):
                times = {"tiledsl": [headline(r) for r in mine],
                         "best": [r.get("best", r["tiledsl"]) for r in mine]}.get(key, [r.get(key) for r in mine])
                speed = [r["sequential"] / t for r, t in zip(mine, times, strict=True)]
                ax.bar([i + (k - 2) * width for i in range(len(mine))], speed, width, label=label)
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
           "baselines measured in the same run, on random data. tiledsl is what a user gets (the library's program, "
           "or the launcher's choice); the best of the library's variants, picked after timing, is a column of its "
           "own. Overlap efficiency = cuBLAS alone on the per-rank problem / tiledsl."]
    wrong = [name for path in sorted(folder.glob("*.json")) for name in json.loads(path.read_text()).get("wrong", [])]
    if wrong:
        out += ["", f"**Left out, output wrong:** {', '.join(wrong)}"]
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
