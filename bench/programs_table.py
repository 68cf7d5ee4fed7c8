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


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc): torchrun may start its ranks in sessions of their own."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, pending = [], [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def stop(process: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop a torchrun we started and every process below it: SIGTERM (torchrun stops its ranks), then
    SIGKILL to whatever is left after `grace_s`."""
    tree = [process.pid] + _descendants(process.pid)
    for pid in tree:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    for pid in tree + _descendants(process.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_world(world: int, programs: list[str], quiet_s: float, log, limit_s: float = float("inf"),
              save=lambda results: None) -> dict:
    """{program: result} for every program at `world`, restarting past a program whose run died or hung;
    past `limit_s` the run is stopped and the programs left get no result. `save(results)` after every
    program that ends, so that a run cut short keeps what it found."""
    results: dict[str, dict] = {}
    remaining = list(programs)
    ends = time.monotonic() + limit_s
    while remaining and time.monotonic() < ends:
        command = ["torchrun", f"--nproc-per-node={world}", "-m", "tiledsl", "run", *remaining]
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines, last, done = [], time.monotonic(), threading.Event()

        def read():  # a thread of its own: a rank left alive holding the pipe must not block the loop
            for line in process.stdout:
                log.write(line)
                log.flush()
                lines.append(line)
            done.set()
        threading.Thread(target=read, daemon=True).start()
        hung = out_of_time = False
        seen = 0
        while not (done.is_set() and process.poll() is not None):
            time.sleep(0.5)
            now = time.monotonic()
            if len(lines) > seen:
                fresh, seen = lines[seen:], len(lines)
                if any(VERDICT.match(l.rstrip("\n")) or ERROR.match(l.rstrip("\n")) for l in fresh):
                    last = now  # a program ended (or failed): the next one's time starts
                    results.update(parse(lines, remaining)[0])
                    save(results)
            if now - last > quiet_s or now > ends:
                hung, out_of_time = now - last > quiet_s, now > ends
                stop(process)
                done.wait(timeout=5)
                break
        found, index = parse(lines, remaining)
        results.update(found)
        save(results)
        if index >= len(remaining) or (out_of_time and not hung):
            break
        if index and found[remaining[index - 1]]["outputs"] is None:
            # the last program to speak failed on some ranks only: the others may have hung in it while
            # those went on to the next program; that one is not to blame, and runs again in a new torchrun
            remaining = remaining[index:]
            continue
        culprit = remaining[index]
        why = f"no output for {quiet_s:g} s (stopped)" if hung else \
            f"torchrun exited {process.returncode}: " + " | ".join(l.strip() for l in lines[-3:])[:300]
        results[culprit] = {"ok": False, "outputs": None, "errors": [why]}
        save(results)
        remaining = remaining[index + 1:]
    return results


def table(folder: Path, *earlier: Path) -> str:
    """Markdown: one row a program, one column a world, from the runs in `folder` and, for a world not
    run there, from the `earlier` JSON files (the newest of them); each column names its commit."""
    runs = {}
    for path in sorted(earlier, key=lambda p: p.stat().st_mtime) + sorted(folder.glob("programs_world*.json")):
        run = json.loads(path.read_text())
        runs[int(run["world"])] = run
    worlds = sorted(runs)
    programs = sorted({name for run in runs.values() for name in run["results"]})
    gpus = {w: runs[w].get("gpus") for w in worlds}
    head = "| program | " + " | ".join(f"world {w} ({gpus[w]} GPU{'s' if gpus[w] != 1 else ''}, {runs[w].get('commit')})"
                                      for w in worlds) + " |"
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
    return "Every program of programs/ under `torchrun --nproc-per-node=W -m tiledsl run` (ranks sharing the GPUs " \
           "where W is more than their count)\n\n" + "\n".join(rows)


def _commit() -> str:
    """TILEDSL_COMMIT where the caller knows it (a device machine's copy of the tree may carry a stale
    git directory: it once named a commit two behind the one it ran), else git's HEAD."""
    if os.environ.get("TILEDSL_COMMIT"):
        return os.environ["TILEDSL_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=False).stdout.strip() or "?"
    except OSError:
        return "?"


def _write(out: Path, world: int, gpus: int, commit: str, seconds: float, results: dict) -> None:
    (out / f"programs_world{world}.json").write_text(json.dumps(
        {"world": world, "gpus": gpus, "commit": commit, "seconds": round(seconds, 1), "results": results}, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run")
    run.add_argument("--world", type=int, nargs="+", required=True, help="world sizes, one after another")
    run.add_argument("--quiet-s", type=float, default=90.0, help="a program that prints nothing this long is hung")
    run.add_argument("--limit-s", type=float, default=float("inf"),
                     help="all worlds within this long (what one leaves goes to the next); the programs left: not run")
    run.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench" / "results")))
    run.add_argument("files", nargs="*")
    show = commands.add_parser("table", help="the table of FOLDER's runs, and of EARLIER JSON for other worlds")
    show.add_argument("folder")
    show.add_argument("earlier", nargs="*")
    old = commands.add_parser("from-log", help="the JSON of a run from its .out log (a run cut before it wrote one)")
    old.add_argument("log")
    old.add_argument("--world", type=int, required=True)
    old.add_argument("--commit", required=True)
    old.add_argument("--gpus", type=int, required=True)
    old.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.command == "table":
        text = table(Path(args.folder), *(Path(p) for p in args.earlier if Path(p).parent != Path(args.folder)))
        Path(args.folder).mkdir(parents=True, exist_ok=True)
        (Path(args.folder) / "programs_table.md").write_text(text + "\n")
        print(text)
        return 0
    programs = getattr(args, "files", None) or sorted(str(p.relative_to(ROOT)) for p in (ROOT / "programs").glob("*.tds"))
    if args.command == "from-log":
        lines = Path(args.log).read_text().splitlines()
        # in the order the run took them (rotated at another world): first named first
        named = [m["path"] for line in lines if (m := ERROR.match(line)) and m["path"] in programs]
        order = list(dict.fromkeys(named)) + [p for p in programs if p not in named]
        results, _ = parse(lines, order)
        results = {name: result for name, result in results.items() if name in named}
        Path(args.out).mkdir(parents=True, exist_ok=True)
        _write(Path(args.out), args.world, args.gpus, args.commit, 0.0, results)
        print(f"{args.log}: {len(results)} programs, {sum(r['ok'] for r in results.values())} ok")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch
    gpus, commit = torch.cuda.device_count(), _commit()
    ends = time.monotonic() + args.limit_s
    every: dict[int, dict] = {}
    # One world after another, never side by side: NVSHMEM's limited mode (several PEs on a GPU, no MPS)
    # names the shared memory it sets up by the GPU's first PE (/dev/shm/mps_shm_0 in 3.4.5), the same for
    # every job on the machine, and unlinks it at init and exit: two jobs at once would mix their state.
    # Each world has its share of what is left of --limit-s and starts at another place in the list
    # (rotated), so that a limit too short for every program at every world runs each at some world.
    for n, world in enumerate(args.world):
        began = time.monotonic()
        share = (ends - began) / (len(args.world) - n)
        turn = n * len(programs) // len(args.world)
        def save(results, world=world, began=began):
            _write(out, world, gpus, commit, time.monotonic() - began, results)
            (out / "programs_table.md").write_text(table(out) + "\n")  # so far: a run cut short keeps it
        with open(out / f"programs_world{world}.out", "w") as log:
            every[world] = run_world(world, programs[turn:] + programs[:turn], args.quiet_s, log, share, save)
        save(every[world])
    failed = 0
    for world in args.world:
        results = every.get(world, {})
        for name in programs:
            result = results.get(name)
            if result is None:
                print(f"SKIP {Path(name).stem} world {world} -- not run: the time limit came first", flush=True)
                continue
            detail = "; ".join([f"{t}: {v}" for t, v in (result["outputs"] or {}).items()] + result["errors"])
            print(f"{'PASS' if result['ok'] else 'FAIL'} {Path(name).stem} world {world} -- {detail[:400]}", flush=True)
            failed += not result["ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
