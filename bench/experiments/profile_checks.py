"""Where a GPU check's seconds go (issue 23: the checks at worlds 2, 4 and 8 take ~2000 s on one H200,
where a device call is 600 s): run a script under cProfile on every rank and write rank 0's profile,
sorted by cumulative and by own time, to OUT/profile_rank0.txt.

    torchrun --nproc-per-node=4 bench/experiments/profile_checks.py OUT tests/gpu/all_checks.py --suites nodes

The script runs as __main__ with the rest of the command line as its argv."""
from __future__ import annotations

import cProfile
import io
import os
import pstats
import runpy
import sys
from pathlib import Path


def main() -> None:
    out, script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    profile = cProfile.Profile()
    try:
        profile.runcall(runpy.run_path, script, run_name="__main__")
    except SystemExit:
        pass
    finally:
        if os.environ.get("RANK", "0") == "0":
            text = io.StringIO()
            for order in ("cumulative", "tottime"):
                pstats.Stats(profile, stream=text).sort_stats(order).print_stats(45)
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "profile_rank0.txt").write_text(text.getvalue())


if __name__ == "__main__":
    main()
