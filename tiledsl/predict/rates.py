"""The rates the predictor costs instances with: one set per GPU model, read from a JSON file
(`h200.json` ships; its `sources` say where each figure comes from), any of them overridden by
name (`--link nvlink_gbps=600`). One set per GPU: the predictor is never tuned per program."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

DEFAULT = Path(__file__).with_name("h200.json")


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


def load(path: str | Path | None = None, overrides: dict[str, float] | None = None) -> Rates:
    """The rates in `path` (default: H200's), with `overrides` by field name."""
    data = json.loads(Path(path or DEFAULT).read_text())
    values = {k: v for k, v in data.items() if k in FIELDS}
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
