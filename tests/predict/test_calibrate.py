"""`tiledsl calibrate` (measuring on a GPU) from the CPU's side: what it writes from a measurement, where,
how `tiledsl predict --rates` finds it again, and its refusal on a machine without a GPU. The
measurement itself runs only on a GPU (`bash bench/gpu_all.sh calibrate`)."""
from __future__ import annotations

import json

import pytest
import torch

from tiledsl import cli
from tiledsl.predict import calibrate, measure, rates

MEASURED = {"rates": {"gpu": "NVIDIA H100 80GB HBM3", "sms": 132, "call_us": 6.5, "hbm_gbps": 3000.0,
                      "tile_fixed_us": 1.1, "sm_tflops": 5.0, "products": [{"M": 1, "K": 2, "N": 3, "tiledsl": 0.1}]},
            "sources": {"sms": "the device's", "call_us": "copy.tds", "hbm_gbps": "copy.tds big",
                        "tile_fixed_us, sm_tflops": "gemm.tds"}}


def test_a_measurement_replaces_only_what_it_measured_and_says_how():
    base = json.loads(rates.DEFAULT.read_text())
    out = calibrate.calibrated(base, MEASURED, "2026-12-04")
    assert out["call_us"] == 6.5 and out["hbm_gbps"] == 3000.0 and out["gpu"] == "NVIDIA H100 80GB HBM3"
    assert out["nvlink_gbps"] == base["nvlink_gbps"] and out["sources"]["nvlink_gbps"] == base["sources"]["nvlink_gbps"]
    assert out["sources"]["call_us"].startswith("measured by tiledsl calibrate on 2026-12-04 on an NVIDIA H100")
    assert out["measured_products"] == MEASURED["rates"]["products"]
    assert rates.Rates(**{k: v for k, v in out.items() if k in rates.FIELDS}).sm_tflops == 5.0


def test_the_written_file_is_found_by_its_gpu_model(tmp_path, monkeypatch):
    monkeypatch.setattr(rates, "RATES_DIR", tmp_path)
    monkeypatch.setattr(measure, "measure", lambda log=print: MEASURED)
    lines = []
    assert calibrate.run_measured(None, log=lines.append) == 0
    written = tmp_path / "nvidia-h100-80gb-hbm3.json"
    assert written.is_file() and str(written) in lines[-1]
    assert rates.find("NVIDIA H100 80GB HBM3") == written
    assert rates.load("NVIDIA H100 80GB HBM3").call_us == 6.5
    assert rates.find("H200") == rates.DEFAULT and rates.find(None) == rates.DEFAULT
    with pytest.raises(ValueError, match="no rates file or GPU model named 'B300'"):
        rates.find("B300")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_without_a_gpu_calibrate_says_so_and_exits_unavailable(capsys):
    assert cli.main(["calibrate"]) == cli.UNAVAILABLE
    err = capsys.readouterr().err
    assert "tiledsl calibrate: calibrate measures the GPU it runs on" in err and "Traceback" not in err


def test_the_tile_rates_are_fitted_to_the_measured_products(tmp_path, monkeypatch):
    import math
    sms, call_us, fixed, tflops = 132, 6.5, 1.3, 4.8
    rows = []
    for M, K, N in measure.PRODUCTS:
        waves = math.ceil(math.ceil(M / calibrate.BM) * math.ceil(N / calibrate.BN) / sms)
        us = call_us + waves * (fixed + 2 * calibrate.BM * calibrate.BN * K / 1e6 / tflops)
        rows.append({"M": M, "K": K, "N": N, "tiledsl": us / 1e3})
    found = {"rates": {"gpu": "NVIDIA H200", "sms": sms, "call_us": call_us, "products": rows},
             "sources": {"sms": "the device's", "call_us": "copy.tds"}}
    monkeypatch.setattr(measure, "measure", lambda log=print: found)
    assert calibrate.run_measured(str(tmp_path / "r.json"), log=lambda line: None) == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["tile_fixed_us"] == pytest.approx(fixed, abs=0.01)
    assert data["sm_tflops"] == pytest.approx(tflops, abs=0.01)
    assert "least squares over programs/gemm.tds at 6 products" in data["sources"]["tile_fixed_us, sm_tflops"]


def test_a_rates_file_written_before_a_field_existed_takes_the_shipped_figure_for_it(tmp_path):
    shipped = json.loads(rates.DEFAULT.read_text())
    older = {k: v for k, v in shipped.items() if k not in ("wait_us", "release_us")}
    older["call_us"] = 7.5
    path = tmp_path / "older.json"
    path.write_text(json.dumps(older))
    found = rates.load(path)
    assert found.call_us == 7.5  # the file's own figure
    assert (found.wait_us, found.release_us) == (shipped["wait_us"], shipped["release_us"])
    assert rates.load(path, {"wait_us": 2.0}).wait_us == 2.0


class Clock:
    """torch.cuda's synchronize, Event and a CUDA graph's capture and replay, on a clock (ms) that a
    copy moves 0.005 ms when issued from Python and 0.001 ms when replayed from a graph."""

    def __init__(self, capture_fails=False):
        self.now, self.capturing, self.captured, self.capture_fails = 0.0, False, [], capture_fails

    def synchronize(self):
        pass

    def Event(self, enable_timing=False):  # noqa: N802 - torch.cuda's name
        clock = self

        class Event:
            def record(self):
                self.at = clock.now

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return end.at - self.at
        return Event()

    def copy(self):
        if self.capturing:
            self.captured.append(1)
        else:
            self.now += 0.005

    def CUDAGraph(self):  # noqa: N802
        if self.capture_fails:
            raise RuntimeError("operation not permitted when stream is capturing")
        clock = self

        class Graph:
            def replay(self):
                clock.now += 0.001 * len(clock.captured)
        return Graph()

    def graph(self, graph):
        import contextlib
        clock = self

        @contextlib.contextmanager
        def capture():
            clock.capturing = True
            yield
            clock.capturing = False
        return capture()


@pytest.mark.parametrize("fails", [False, True])
def test_a_stream_operation_is_timed_replayed_from_a_graph_and_the_python_issued_figure_kept_only_as_a_fallback(
        monkeypatch, fails):
    clock = Clock(capture_fails=fails)
    for name in ("synchronize", "Event", "CUDAGraph", "graph"):
        monkeypatch.setattr(torch.cuda, name, getattr(clock, name))
    lines = []
    us, source = measure._stream_op_us(clock.copy, lines.append)
    assert lines == ["ce_op_us issued from Python: 5.00 us a copy"]
    if fails:
        assert us == 5.0 and "its capture in a CUDA graph failed: operation not permitted" in source
    else:
        assert us == pytest.approx(1.0) and len(clock.captured) == measure.OPS_A_GRAPH
        assert source.startswith("100 4-byte cuMemcpyAsync within the GPU captured in one CUDA graph")


def test_the_wait_probe_is_a_schedule_the_checker_proves_and_its_figure_is_kept_beside_the_rates():
    from tiledsl import pipeline
    checked = pipeline.run(measure.WAIT_CHAIN, until="check").schedule
    assert [(e.producer, e.consumer) for e in checked.edges] == [("step", "step")]
    base = json.loads(rates.DEFAULT.read_text())
    found = {"rates": {**MEASURED["rates"], "wait_release_us": 0.8},
             "sources": {**MEASURED["sources"], "wait_release_us": "the chain"}}
    out = calibrate.calibrated(base, found, "2026-12-04")
    assert out["measured_wait_release_us"] == 0.8 and "wait_release_us" not in rates.FIELDS
    assert (out["wait_us"], out["release_us"]) == (base["wait_us"], base["release_us"])  # set by hand
