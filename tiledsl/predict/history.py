"""Predictions checked against the past: every world-2 and world-4 figure in bench/results whose
commit is known, for the programs the issue names (AG+GEMM, GEMM+RS pulled and by copy engine,
one- and two-shot all-reduce, GEMM+AR), predicted with that commit's program text and the one set of
H200 rates, beside what was measured. One CPU command writes the table:

    python -m tiledsl.predict.history [-o bench/results/predictions/history.md]

Predictions are shared between rows whose program text (comments aside), world and sizes agree."""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tiledsl import pipeline
from tiledsl.predict import load
from tiledsl.predict.simulate import simulate
from tiledsl.schedule import meaning

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
OUT = RESULTS / "predictions" / "history.md"
MAX_INSTANCES = 150_000  # all ranks together; a larger prediction takes minutes here, so it is listed, not run

# (results folder, the commit it measured, how that is known). Folders without a known commit
# (2026-11-29-first, -run5, -run6) and derived ones (2026-11-29-world2-s9/final) are left out.
SOURCES = (
    ("2026-11-29", "ec4abd7", "parent of 5560627, the commit that added these results"),
    ("2026-11-29-world2", "eb4afac", "its README, for overlap_world2.json"),
    ("2026-11-29-world2", "a7b03a8", "its README, for collectives_world2.json"),
    ("2026-11-29-world2-s9/run1-c247f57", "c247f57", "folder name"),
    ("2026-11-29-world2-s9/run2-a8ab4eb", "a8ab4eb", "folder name"),
    ("2026-11-29-world2-s9/run4-d0e9c00", "d0e9c00", "folder name"),
    ("2026-11-29-world2-s9/run5-f7cb877", "f7cb877", "folder name"),
    ("2026-11-29-world2-s9/run6-cbb7cb5", "cbb7cb5", "folder name"),
    ("2026-11-29-world2-s9/run7-5bdb0d8", "5bdb0d8", "folder name"),
    ("2026-11-30-world2-s10/run2-9ddb2d6", "9ddb2d6", "folder name"),
    ("2026-11-30-world2-s10/run3-2db3a83", "2db3a83", "folder name"),
    ("2026-11-30-world2-s10/run4-d18c0b6", "d18c0b6", "folder name"),
    ("2026-11-30-world2-s10/run5-9e3e25c", "9e3e25c", "folder name"),
)
OVERLAP_PROGRAMS = ("ag_gemm", "gemm_rs_pull", "gemm_rs_ce")
COLLECTIVES = {"one_shot": "allreduce", "two_shot": "allreduce_two_shot"}


@dataclass(frozen=True)
class Row:
    source: str
    commit: str
    program: str
    world: int
    case: str              # the model or the message size
    sizes: dict
    measured_ms: float
    predicted_ms: float | None = None
    note: str = ""

    @property
    def error(self) -> float | None:
        return None if self.predicted_ms is None else self.predicted_ms / self.measured_ms - 1


def program_text(commit: str, program: str) -> tuple[str, str] | None:
    """The program's text at `commit` and where it was, or None where it had none."""
    for path in (f"programs/{program}.tds", f"bench/experiments/{program}.tds"):
        found = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path}"], capture_output=True, text=True)
        if found.returncode == 0:
            return found.stdout, path
    return None


def measured_rows() -> list[Row]:
    """Every figure with a known commit, as rows without predictions. Which folder file holds which
    world's figures follows its name (overlap_world2.json, collectives_world4.json)."""
    rows = []
    for folder, commit, how in SOURCES:
        for path in sorted((RESULTS / folder).glob("*_world[24].json")):
            if how.endswith(".json") and not how.endswith(path.name):
                continue  # a folder whose files measured different commits
            data = json.loads(path.read_text())
            for r in data["rows"]:
                rows.extend(_rows_of(folder, commit, r))
    return rows


def _rows_of(folder: str, commit: str, r: dict) -> list[Row]:
    world = r["world"]
    out = []
    if r["op"] in ("ag_gemm", "gemm_rs"):
        for program in OVERLAP_PROGRAMS:
            if not program.startswith(r["op"]) or not _finite(r.get(program)):
                continue
            # the benchmark's per-rank shapes (bench/bench_overlap.py): B's columns, or A's columns, sharded
            sizes = (dict(M=r["M"], K=r["K"], N=r["N"] // world) if r["op"] == "ag_gemm"
                     else dict(M=r["M"], K=r["K"] // world, N=r["N"]))
            out.append(Row(folder, commit, program, world, r["model"], sizes, r[program]))
    elif r["op"] == "allreduce":
        for key, program in COLLECTIVES.items():
            if _finite(r.get(key)):
                out.append(Row(folder, commit, program, world, _bytes(r["bytes"]), dict(N=r["bytes"] // 2), r[key]))
    elif r["op"] == "gemm_ar" and _finite(r.get("tiledsl")):
        # bench/bench_collectives.py: K sharded over the ranks
        out.append(Row(folder, commit, "gemm_ar", world, f"M={r['M']}", dict(M=r["M"], K=r["K"] // world, N=r["N"]),
                       r["tiledsl"]))
    return out


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _bytes(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} KB"


def predict_rows(rows: list[Row], rates, log=None) -> list[Row]:
    """Each row with its prediction (or a note saying why there is none)."""
    memo: dict = {}
    out = []
    for n, row in enumerate(rows):
        found = program_text(row.commit, row.program)
        if found is None:
            out.append(_with(row, note=f"no {row.program}.tds at {row.commit}"))
            continue
        text, where = found
        key = (_meaningful(text), row.world, tuple(sorted(row.sizes.items())))
        if key not in memo:
            memo[key] = _predict(text, where, row, rates)
            if log:
                print(f"[{n + 1}/{len(rows)}] {row.program} world {row.world} {row.case}: {memo[key]}", file=log,
                      flush=True)
        value = memo[key]
        out.append(_with(row, predicted_ms=value) if isinstance(value, float) else _with(row, note=value))
    return out


def _with(row: Row, **changes) -> Row:
    return Row(**{**row.__dict__, **changes})


def _meaningful(text: str) -> str:
    """The program without its comments: rows whose programs differ only there share a prediction."""
    lines = [line.split("#")[0].rstrip() for line in text.splitlines()]
    return hashlib.sha256("\n".join(line for line in lines if line).encode()).hexdigest()


def _predict(text: str, where: str, row: Row, rates) -> float | str:
    try:
        schedule = pipeline.run(text, until="schedule", path=where).schedule
    except Exception as why:  # noqa: BLE001 - an old program today's parser refuses: say so in the table
        return f"today's parser refuses {where} at {row.commit}: {str(why).splitlines()[0][:80]}"
    sizes = {**row.sizes}
    total = sum(math.prod(meaning._extents(schedule, f, row.world, sizes, rank))
                for f in schedule.families.values() for rank in range(row.world))
    if total > MAX_INSTANCES:
        return f"not run: {total} instances (over {MAX_INSTANCES})"
    return simulate(schedule, row.world, sizes, rates).total_us / 1e3


def table(rows: list[Row]) -> str:
    done = [r for r in rows if r.error is not None]
    lines = ["# Predicted against measured (bench/results), one set of H200 rates",
             "",
             "Written by `python -m tiledsl.predict.history` (CPU only). Each prediction simulates the program "
             "text of the commit that was measured (`git show COMMIT:programs/P.tds`) with "
             "`tiledsl/predict/h200.json`; no constant is set per row. Error = predicted / measured - 1.",
             "",
             _summary(done),
             "",
             "| results folder | commit | program | world | case | predicted ms | measured ms | error |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        predicted = f"{r.predicted_ms:.4f}" if r.predicted_ms is not None else r.note
        error = f"{r.error:+.0%}" if r.error is not None else ""
        lines.append(f"| {r.source} | {r.commit} | {r.program} | {r.world} | {r.case} | {predicted} | "
                     f"{r.measured_ms:.4f} | {error} |")
    return "\n".join(lines) + "\n"


GRAPHS = "321b374"  # from this commit on a call is replayed from a CUDA graph (a call's floor: call_us)


def replayed(commit: str) -> bool:
    """Whether `commit` replays calls from CUDA graphs (has GRAPHS in its history): the call's fixed cost
    the rates assume. Before, a call went through the host's launch path at every call."""
    found = subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", GRAPHS, commit])
    return found.returncode == 0


def _summary(done: list[Row]) -> str:
    if not done:
        return "No row was predicted."
    lines = ["| program | world | calls from a CUDA graph | rows | within 15% | median abs. error | worst |",
             "|---|---|---|---|---|---|---|"]
    graphs = {c: replayed(c) for c in {r.commit for r in done}}
    groups: dict = {}
    for r in done:
        groups.setdefault((r.program, r.world, graphs[r.commit]), []).append(r)
    for (program, world, graph), found in sorted(groups.items()):
        lines.append(f"| {program} | {world} | {'yes' if graph else f'no (before {GRAPHS})'} | "
                     + _counts(found) + f" | {_worst(found)} |")
    lines.append("| all | | | " + _counts(done) + " | |")
    lines.append("| all | | yes | " + _counts([r for r in done if graphs[r.commit]]) + " | |")
    return "\n".join(lines)


def _counts(rows: list[Row]) -> str:
    errors = [abs(r.error) for r in rows]
    return f"{len(rows)} | {sum(e <= 0.15 for e in errors)} | {statistics.median(errors):.0%}"


def _worst(rows: list[Row]) -> str:
    worst = max(rows, key=lambda r: abs(r.error))
    return f"{worst.error:+.0%} ({worst.case})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tiledsl.predict.history", description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default=str(OUT), help=f"where to write the table (default {OUT})")
    parser.add_argument("--rates", help="the rates file (default: H200's)")
    args = parser.parse_args(argv)
    rows = predict_rows(measured_rows(), load(args.rates), log=sys.stderr)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table(rows))
    print(f"wrote {out}: {sum(r.error is not None for r in rows)} of {len(rows)} rows predicted", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
