"""The predictor's rates for a GPU, measured on it (`tiledsl calibrate`) or refitted from figures
measured before (on the CPU). The product tile's two rates are least squares over timed products of
programs/gemm.tds of

    time = call_us + waves * (tile_fixed_us + 2 * BM * BN * K / sm_tflops)

with waves = ceil(tiles / sms), as the persistent kernel runs them.

    tiledsl calibrate [-o FILE]      on a GPU: measure what one GPU can show (measure.py) and write
                                     the rates, by default to the GPU model's file in the rates folder
                                     (rates.RATES_DIR), which `tiledsl predict --rates MODEL` reads
    python -m tiledsl.predict.calibrate [bench/results/2026-11-29/gemm_tile.json] [-o rates.json]
                                     refit the tile's two rates from a gemm_tile.json, the rest copied

Links between GPUs (NVLink, IB) cannot be measured on one GPU: they stay the base file's documented
figures, which a user overrides with `--link NAME=VALUE`."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from tiledsl.predict.rates import DEFAULT, FIELDS

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


def calibrated(base: dict, measured: dict, when: str) -> dict:
    """The rates file `base` (its every field and source) with what `measure.measure()` found put in:
    each measured field's source says when, on which GPU and how; the rest keep theirs."""
    rates, sources = measured["rates"], measured["sources"]
    out = {**base, **{k: v for k, v in rates.items() if k in FIELDS}}
    said = f"measured by tiledsl calibrate on {when} on an {rates['gpu']}"
    out["sources"] = {**base.get("sources", {}), **{k: f"{said}: {v}" for k, v in sources.items()}}
    for key in [k for k in out["sources"] if k not in sources and k.split(",")[0] in rates]:
        del out["sources"][key]  # a base source of a field measured under a joint key
    out["measured_products"] = rates.get("products", [])
    if "wait_release_us" in rates:  # not a rate: the two it informs (wait_us, release_us) are set by hand
        out["measured_wait_release_us"] = rates["wait_release_us"]
    return out


def run_measured(output: str | None, base_path: str | None = None, log=print) -> int:
    """`tiledsl calibrate`: measure this GPU, write its model's rates file (or `output`)."""
    import datetime

    from tiledsl.predict.measure import measure
    from tiledsl.predict.rates import find, model_file
    measured = measure(log=log)
    found, rows = measured["rates"], measured["rates"].get("products", [])
    if len(rows) >= 2:  # two unknowns
        fixed, rate = fit_tile(rows, found["sms"], found.get("call_us", 0.0))
        found["tile_fixed_us"], found["sm_tflops"] = round(fixed, 2), round(rate, 2)
        measured["sources"]["tile_fixed_us, sm_tflops"] = (
            f"least squares over programs/gemm.tds at {len(rows)} products (BM={BM}, BN={BN}): time = call_us + "
            "waves * (tile_fixed_us + 2*BM*BN*K / sm_tflops)")
    base = json.loads(find(base_path).read_text())
    data = calibrated(base, measured, datetime.date.today().isoformat())
    path = Path(output) if output else model_file(data["gpu"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    changed = ", ".join(f"{k} {base.get(k)} -> {data[k]}" for k in FIELDS if k in measured["rates"] and k != "gpu")
    log(f"{data['gpu']}: wrote {path} ({changed}); `tiledsl predict --rates {path}` uses it")
    return 0


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
