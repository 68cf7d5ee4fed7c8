"""Which GPU checks have passed with ranks sharing one GPU, by suite and world, over every log of
tests/gpu/all_checks.py under bench/results (issue 23: every check at worlds 2, 4 and 8): for each suite
and world the checks seen, those that passed in some run, those never passed (with why they were
skipped: out of time, or a path that needs NCCL, which refuses two ranks on one GPU) and the FAIL lines.

    python3 bench/check_coverage.py [LOG...] [-v]     (default: bench/results/**/*.log)
"""
from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = re.compile(r"all checks: world (\d+)")
SUITE_STOPPED = "the suite stopped"  # all_checks.py: a suite that could not go on
VERDICT = re.compile(r"(PASS|FAIL|SKIP) (\w+): (.*?)(?: -- (.*))?$")


def read(logs) -> dict:
    """{(suite, world): {"seen": set, "passed": set, "skipped": {name: why}, "failed": [(log, name, why)]}}"""
    found = defaultdict(lambda: {"seen": set(), "passed": set(), "skipped": {}, "failed": []})
    for log in logs:
        world = None
        for line in Path(log).read_text(errors="replace").splitlines():
            header = HEADER.match(line)
            if header:
                world = int(header.group(1))
            verdict = VERDICT.match(line.rstrip())
            if verdict is None or world is None:
                continue
            kind, suite, name, why = verdict.groups()
            entry = found[(suite, world)]
            if name == SUITE_STOPPED:  # the whole suite's failure: a FAIL line, not a check of its own
                entry["failed"].append((str(log), name, why or ""))
                continue
            entry["seen"].add(name)
            if kind == "PASS":
                entry["passed"].add(name)
            elif kind == "SKIP":
                entry["skipped"][name] = why or ""
            else:
                entry["failed"].append((str(log), name, why or ""))
    return found


def table(found: dict, verbose: bool = False) -> str:
    lines = ["| suite | world | checks | passed | never passed: out of time | never passed: needs NCCL | other "
             "| FAIL lines |", "|---|---|---|---|---|---|---|---|"]
    details = []
    for (suite, world), entry in sorted(found.items()):
        never = sorted(entry["seen"] - entry["passed"])
        why = [entry["skipped"].get(name, "") for name in never]
        late = sum("out of time" in w for w in why)
        nccl = sum("NCCL" in w for w in why)
        lines.append(f"| {suite} | {world} | {len(entry['seen'])} | {len(entry['passed'])} | {late} | {nccl} | "
                     f"{len(never) - late - nccl} | {len(entry['failed'])} |")
        if verbose:
            details += [f"{suite} world {world} never passed: {name} ({entry['skipped'].get(name, 'failed')})"
                        for name in never]
            details += [f"{suite} world {world} FAIL in {log}: {name} -- {why}" for log, name, why in entry["failed"]]
    return "\n".join(lines + details)


def main(argv: list[str]) -> int:
    verbose = "-v" in argv
    logs = [a for a in argv if a != "-v"] or sorted(ROOT.glob("bench/results/**/*.log"))
    print(table(read(logs), verbose))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
