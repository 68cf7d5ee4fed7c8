"""The rates the predictor costs instances with: one set per GPU model, read from a JSON file
(`h200.json` ships; its `sources` say where each figure comes from), any of them overridden by
name (`--link nvlink_gbps=600`). One set per GPU: the predictor is never tuned per program."""
from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT = Path(__file__).with_name("h200.json")
SHIPPED = {"NVIDIA H200": DEFAULT}
# where `tiledsl calibrate` writes a GPU model's measured rates, one file a model
RATES_DIR = Path(os.environ.get("TILEDSL_RATES_DIR", Path.home() / ".cache" / "tiledsl" / "rates"))


@dataclass(frozen=True)
class Rates:
    gpu: str
    sms: int                  # SM programs a persistent kernel runs (one an SM)
    tile_fixed_us: float      # a product tile's cost besides its FLOPs (prologue, epilogue, store)
    sm_tflops: float          # one SM's product rate, TFLOP/s
    hbm_gbps: float           # the GPU's own memory, shared by the SMs that read it at once
    sm_hbm_gbps: float        # one SM's share can be no more than this
    ce_local_gbps: float      # a copy-engine copy within the GPU
    ce_op_us: float           # each operation (wait, copy, signal) on the communication stream
    call_us: float            # a call's fixed cost: launch and the entry barrier
    signal_local_us: float    # a signal seen on its own rank
    wait_us: float            # an SM wait's first acquire read of its slot (system scope), set or not
    release_us: float         # an SM producer's release store (system scope) into one waiting rank's slot
    nvlink_gbps: float        # per direction, per GPU (NVSwitch: a GPU's port, whichever peer)
    nvlink_efficiency: float  # the share of nvlink_gbps that loads, stores and copies reach
    nvlink_latency_us: float  # a signal (or the first bytes) crossing to a peer of the node
    sm_link_gbps: float       # one SM's peer loads or stores can be no faster than this
    copy_engines: int         # copies a rank's communication stream runs at once
    ib_gbps: float            # per direction, per GPU, across nodes
    ib_efficiency: float
    ib_latency_us: float

    @property
    def link_gbps(self) -> float:
        return self.nvlink_gbps * self.nvlink_efficiency

    @property
    def ib_link_gbps(self) -> float:
        return self.ib_gbps * self.ib_efficiency


FIELDS = tuple(f.name for f in dataclasses.fields(Rates))


def model_file(gpu: str) -> Path:
    """The file `tiledsl calibrate` writes for the GPU model `gpu` ("NVIDIA H200" -> nvidia-h200.json)."""
    return RATES_DIR / (re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-") + ".json")


def find(name: str | Path | None) -> Path:
    """A rates file: `name` itself if it is one, else the GPU model it names (its calibrated file in
    RATES_DIR first, then a shipped one: "H200"), else H200's shipped file for None."""
    if name is None:
        return DEFAULT
    if Path(name).is_file():
        return Path(name)
    text = str(name)
    shipped = {k.upper(): path for k, path in SHIPPED.items()}
    for gpu in (text, f"NVIDIA {text}"):
        calibrated = model_file(gpu)
        if calibrated.is_file():
            return calibrated
        if gpu.upper() in shipped:
            return shipped[gpu.upper()]
    known = sorted({*SHIPPED, *(p.stem for p in RATES_DIR.glob("*.json"))}) if RATES_DIR.is_dir() else sorted(SHIPPED)
    raise ValueError(f"no rates file or GPU model named {text!r}: give a rates .json, or one of {', '.join(known)} "
                     f"(`tiledsl calibrate` on a GPU writes its model's file into {RATES_DIR})")


def load(path: str | Path | None = None, overrides: dict[str, float] | None = None) -> Rates:
    """The rates in `path` (a file or a GPU model, `find`; default: H200's), with `overrides` by field name.
    A field the file lacks (one written before the field existed) is the shipped H200 file's."""
    data = json.loads(find(path).read_text())
    shipped = json.loads(DEFAULT.read_text())
    values = {k: data.get(k, shipped[k]) for k in FIELDS}
    for name, value in (overrides or {}).items():
        if name not in FIELDS or name == "gpu":
            raise ValueError(f"no rate named {name!r}; rates: {', '.join(f for f in FIELDS if f != 'gpu')}")
        values[name] = type(values[name])(value)
    return Rates(**values)


def parse_override(text: str) -> tuple[str, float]:
    """NAME=VALUE for `--link`."""
    name, eq, value = text.partition("=")
    try:
        return name, float(value) if eq else float("nan")
    except ValueError:
        raise ValueError(f"expected NAME=NUMBER, got {text!r}") from None
