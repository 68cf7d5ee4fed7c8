"""Every program of programs/ run for real at a world size, pass or fail, and the table of them:

    python3 bench/programs_table.py run --world 2 4 8 [--quiet-s 90] [--limit-s S] [--out DIR] [FILE...]
    python3 bench/programs_table.py table DIR        # the table of every world run into DIR

`run` starts `torchrun --nproc-per-node=W -m tiledsl run FILE...` once over all the programs for each
world W, one world after another (one process a rank for all of them: the start-up is paid once), and
reads the verdict lines as they come. A
rank that dies or hangs (no line for --quiet-s seconds: the process group is stopped) costs that
program its verdict only: the programs after it run again in a fresh torchrun. One line a program
(`PASS`/`FAIL`), then DIR/programs_worldW.json. On a machine with fewer GPUs than W the ranks share
GPUs (tiledsl.runtime.placement): right answers, no speed."""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERDICT = re.compile(r"^(?P<path>\S+\.tds): (?P<tensor>\w+): (?P<mark>ok|MISMATCH) \((?P<detail>.*)\)$")
ERROR = re.compile(r"^(?P<path>\S+\.tds): (?P<detail>.*)$")
DIAGNOSTIC = re.compile(r"^(?P<path>\S+\.tds):\d+:\d+: (?P<detail>error: .*)$")


def parse(lines: list[str], programs: list[str]) -> tuple[dict, int]:
    """({program: result}, index of the first program after the last one with a result) from one
    torchrun's output. A program's verdict lines come together when it ends; an error line names its
    file; an internal error names none and belongs to the next program without a result."""
    results: dict[str, dict] = {}

    def after_last() -> int:
        done = [i for i, p in enumerate(programs) if p in results]
        return done[-1] + 1 if done else 0

    def failed(path: str, detail: str) -> None:
        entry = results.setdefault(path, {"ok": False, "outputs": None, "errors": []})
        entry["ok"] = False
        if len(entry["errors"]) < 3 and detail not in entry["errors"]:
            entry["errors"].append(detail[:300])

    internal = None  # the program the last internal error went to, until another program speaks
    for line in lines:
        line = line.rstrip("\n")
        if line.startswith("internal error:"):  # every rank that failed prints one: all go to one program
            if internal is None and after_last() < len(programs):
                internal = programs[after_last()]
            if internal is not None:
                failed(internal, line)
            continue
        internal = None if VERDICT.match(line) or ERROR.match(line) else internal
        if (found := VERDICT.match(line)) and found["path"] in programs:
            entry = results.setdefault(found["path"], {"ok": True, "outputs": {}, "errors": []})
            if entry["outputs"] is not None:
                entry["outputs"][found["tensor"]] = found["mark"] + " (" + found["detail"][:160] + ")"
                entry["ok"] = entry["ok"] and found["mark"] == "ok"
        elif ((found := DIAGNOSTIC.match(line)) or (found := ERROR.match(line))) and found["path"] in programs:
            failed(found["path"], found["detail"])
    for i, path in enumerate(programs[:after_last()]):  # passed over without a word: see the log
        results.setdefault(path, {"ok": False, "outputs": None, "errors": ["no verdict (see the log)"]})
    return results, after_last()


def run_world(world: int, programs: list[str], quiet_s: float, log, limit_s: float = float("inf")) -> dict:
    """{program: result} for every program at `world`, restarting past a program whose run died or hung;
    past `limit_s` the run is stopped and the programs left get no result."""
    results: dict[str, dict] = {}
    remaining = list(programs)
    ends = time.monotonic() + limit_s
    out_of_time = threading.Event()
    while remaining and time.monotonic() < ends:
        command = ["torchrun", f"--nproc-per-node={world}", "-m", "tiledsl", "run", *remaining]
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        lines, last = [], [time.monotonic()]
        hung = threading.Event()

        def watch():
            while process.poll() is None:
                now = time.monotonic()
                if now - last[0] > quiet_s or now > ends:
                    (hung if now - last[0] > quiet_s else out_of_time).set()
                    os.killpg(process.pid, signal.SIGKILL)  # the torchrun we started and its ranks
                    return
                time.sleep(1)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        for line in process.stdout:
            log.write(line)
            log.flush()
            lines.append(line)
            if VERDICT.match(line.rstrip("\n")) or ERROR.match(line.rstrip("\n")):
                last[0] = time.monotonic()  # a program ended (or failed): the next one's time starts
        process.wait()
        watcher.join(timeout=5)
        found, index = parse(lines, remaining)
        results.update(found)
        if index >= len(remaining) or out_of_time.is_set():
            break
        if index and found[remaining[index - 1]]["outputs"] is None:
            # the last program to speak failed on some ranks only: the others may have hung in it while
            # those went on to the next program; that one is not to blame, and runs again in a new torchrun
            remaining = remaining[index:]
            continue
        culprit = remaining[index]
        why = f"no output for {quiet_s:g} s (stopped)" if hung.is_set() else \
            f"torchrun exited {process.returncode}: " + " | ".join(l.strip() for l in lines[-3:])[:300]
        results[culprit] = {"ok": False, "outputs": None, "errors": [why]}
        remaining = remaining[index + 1:]
    return results


def table(folder: Path) -> str:
    """Markdown: one row a program, one column a world."""
    runs = {int(p.stem.removeprefix("programs_world")): json.loads(p.read_text())
            for p in sorted(folder.glob("programs_world*.json"))}
    worlds = sorted(runs)
    programs = sorted({name for run in runs.values() for name in run["results"]})
    gpus = {w: runs[w].get("gpus") for w in worlds}
    head = "| program | " + " | ".join(f"world {w} ({gpus[w]} GPU{'s' if gpus[w] != 1 else ''})" for w in worlds) + " |"
    rows = [head, "|---|" + "---|" * len(worlds)]
    for name in programs:
        cells = []
        for w in worlds:
            result = runs[w]["results"].get(name)
            if result is None:
                cells.append("not run")
            elif result["ok"]:
                cells.append("ok")
            else:
                bad = [f"{t}: {v.split(' (')[0]}" for t, v in (result["outputs"] or {}).items() if not v.startswith("ok")]
                cells.append("FAIL " + "; ".join(bad + result["errors"])[:200].replace("|", "/"))
        rows.append(f"| {Path(name).stem} | " + " | ".join(cells) + " |")
    passed = {w: sum(r["ok"] for r in runs[w]["results"].values()) for w in worlds}
    rows.append("| **passed** | " + " | ".join(f"{passed[w]} of {len(runs[w]['results'])}" for w in worlds) + " |")
    commit = next((run.get("commit") for run in runs.values() if run.get("commit")), "?")
    return f"Every program of programs/ under `torchrun --nproc-per-node=W -m tiledsl run`, commit {commit}\n\n" + \
        "\n".join(rows)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=False).stdout.strip() or os.environ.get("TILEDSL_COMMIT", "?")
    except OSError:
        return os.environ.get("TILEDSL_COMMIT", "?")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run")
    run.add_argument("--world", type=int, nargs="+", required=True, help="world sizes, one after another")
    run.add_argument("--quiet-s", type=float, default=90.0, help="a program that prints nothing this long is hung")
    run.add_argument("--limit-s", type=float, default=float("inf"),
                     help="all worlds within this long (an equal share each); the programs left: not run")
    run.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench" / "results")))
    run.add_argument("files", nargs="*")
    show = commands.add_parser("table")
    show.add_argument("folder")
    args = parser.parse_args()
    if args.command == "table":
        text = table(Path(args.folder))
        (Path(args.folder) / "programs_table.md").write_text(text + "\n")
        print(text)
        return 0
    programs = args.files or sorted(str(p.relative_to(ROOT)) for p in (ROOT / "programs").glob("*.tds"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch
    gpus = torch.cuda.device_count()
    began = time.monotonic()
    every: dict[int, dict] = {}
    # One world after another, never side by side: NVSHMEM's limited mode (several PEs on a GPU, no MPS)
    # names the shared memory it sets up by the GPU's first PE (/dev/shm/mps_shm_0 in 3.4.5), the same for
    # every job on the machine, and unlinks it at init and exit: two jobs at once would mix their state.
    # Each world has an equal share of --limit-s and starts at another place in the list (rotated), so
    # that a limit too short for every program at every world still runs each program at some world.
    share = args.limit_s / len(args.world)
    for n, world in enumerate(args.world):
        turn = n * len(programs) // len(args.world)
        with open(out / f"programs_world{world}.out", "w") as log:
            every[world] = run_world(world, programs[turn:] + programs[:turn], args.quiet_s, log, share)
    ok = True
    for world in args.world:
        results = every.get(world, {})
        for name in programs:
            result = results.setdefault(name, {"ok": False, "outputs": None, "errors": [
                f"not run: the time limit of {args.limit_s:g} s came first"]})
            detail = "; ".join([f"{t}: {v}" for t, v in (result["outputs"] or {}).items()] + result["errors"])
            print(f"{'PASS' if result['ok'] else 'FAIL'} {Path(name).stem} world {world} -- {detail[:400]}", flush=True)
            ok = ok and result["ok"]
        (out / f"programs_world{world}.json").write_text(json.dumps(
            {"world": world, "gpus": gpus, "commit": _commit(), "seconds": round(time.monotonic() - began, 1),
             "results": results}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
