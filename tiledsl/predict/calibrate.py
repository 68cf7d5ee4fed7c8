"""The product tile's rates refitted from measured figures, on the CPU: least squares over the rows of
a `gemm_tile.json` (tiledsl's product tile alone on one GPU, communication off) of

    time = call_us + waves * (tile_fixed_us + 2 * BM * BN * K / sm_tflops)

with waves = ceil(tiles / sms), as the persistent kernel runs them. Writes a rates file with the two
refitted and every other rate copied from the base file:

    python -m tiledsl.predict.calibrate [bench/results/2026-11-29/gemm_tile.json] [-o rates.json]

Measuring on a GPU (the copy engine's and SM stores' bandwidth, a call's floor) is a later step."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from tiledsl.predict.rates import DEFAULT

ROOT = Path(__file__).resolve().parents[2]
TILE_JSON = ROOT / "bench" / "results" / "2026-11-29" / "gemm_tile.json"
BM, BN = 128, 256  # the blocks of ag_gemm's and gemm_rs's product tiles, which gemm_tile.json timed


def fit_tile(rows: list[dict], sms: int, call_us: float) -> tuple[float, float]:
    """(tile_fixed_us, sm_tflops) minimising the squared error over `rows` (M, K, N, tiledsl in ms)."""
    sxx = sxy = syy = sx = sy = 0.0  # least squares of b = t0 * waves + waves * flops / rate, two unknowns
    for r in rows:
        waves = math.ceil(math.ceil(r["M"] / BM) * math.ceil(r["N"] / BN) / sms)
        x1, x2, b = waves, waves * 2.0 * BM * BN * r["K"] / 1e6, r["tiledsl"] * 1e3 - call_us
        sxx += x1 * x1
        sxy += x1 * x2
        syy += x2 * x2
        sx += x1 * b
        sy += x2 * b
    det = sxx * syy - sxy * sxy
    fixed, per_mflop = (sx * syy - sy * sxy) / det, (sxx * sy - sxy * sx) / det
    return fixed, 1.0 / per_mflop  # MFLOP per us is TFLOP/s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tiledsl.predict.calibrate", description=__doc__.splitlines()[0])
    parser.add_argument("tiles", nargs="?", default=str(TILE_JSON), help="a gemm_tile.json")
    parser.add_argument("--base", default=str(DEFAULT), help="the rates file the others come from")
    parser.add_argument("-o", "--output", help="where to write the rates (default: print them)")
    args = parser.parse_args(argv)
    base = json.loads(Path(args.base).read_text())
    rows = [r for r in json.loads(Path(args.tiles).read_text())["rows"] if r.get("tiledsl")]
    fixed, rate = fit_tile(rows, base["sms"], base["call_us"])
    base.update(tile_fixed_us=round(fixed, 2), sm_tflops=round(rate, 2))
    text = json.dumps(base, indent=2) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    print(f"tile_fixed_us {fixed:.2f}, sm_tflops {rate:.2f} ({rate * base['sms']:.0f} TFLOP/s a GPU) from "
          f"{len(rows)} rows of {args.tiles}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
