"""Device facts are inputs (tiledsl.gpus): the checker proves residency for the GPU a build names, and
a launch on a device with fewer SMs than the kernel needs resident is refused by name."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tiledsl import gpus
from tiledsl.cli import main
from tiledsl.diagnostics import TdsError
from tiledsl.pipeline import run

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "runtime"))

COUNTS = """program counts
param N
in    X : f32[N]
symm  S : f32[world, N]
out   Y : f32[N]
chunk a[s in world] on sms(100): X -> S@s[rank, :]
tile  c[i in 1]: Y = S[0, :] + S[1, :]
c[i] after a[rank] @ every rank
"""


def test_the_checker_proves_residency_for_the_gpu_it_is_given():
    run(COUNTS, until="check")  # 100 + 1 of the H200's 132
    run(COUNTS, until="check", gpu="H100-PCIe")  # 114
    with pytest.raises(TdsError) as raised:
        run(COUNTS, until="check", gpu="H20")
    (found,) = [d for d in raised.value.diagnostics if "resident" in d.message]
    assert found.message == "the families ask for 100 resident SM programs, but the H20 has 78 SMs"
    assert found.span.line == 6


def test_check_and_build_take_a_gpu_by_name(tmp_path, capsys):
    path = tmp_path / "counts.tds"
    path.write_text(COUNTS)
    assert main(["check", str(path)]) == 0
    assert main(["check", "--gpu", "h20", str(path)]) == 1
    assert "but the H20 has 78 SMs" in capsys.readouterr().err
    assert main(["build", "--gpu", "H20", str(path), "-o", str(tmp_path / "out.py")]) == 1
    assert main(["check", "--gpu", "B300", str(path)]) == 2
    assert "unknown GPU 'B300'; known: H200, H100" in capsys.readouterr().err


def test_a_launch_where_the_programs_cannot_all_be_resident_is_refused(monkeypatch):
    """gemm_rs_push's `send` runs on sms(16) (at most one program an instance: 8 at world 2's default
    sizes) beside its tiles and reductions on the rest: on a device of 8 SMs (a MIG slice, say) none
    would be left for the tiles that the sends wait for, and the kernel would hang."""
    from test_replay import _prepared

    from tiledsl.runtime.validate import LaunchError
    _prepared("gemm_rs_push", 2, monkeypatch, sms=9)
    with pytest.raises(LaunchError, match=r"the kernel needs 9 resident programs \('send' sms\(8\), 'mm', 'red' 1 "
                                          r"\(sms\(rest\)\)\) but the stand-in GPU .* runs at most 8 at once"):
        _prepared("gemm_rs_push", 2, monkeypatch, sms=8)


def test_of_device_reads_the_sms_from_the_device(monkeypatch):
    class Props:
        multi_processor_count = 114
        name = "NVIDIA H100 PCIe"
        major, minor = 9, 0
        shared_memory_per_block_optin = 232448
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Props())
    gpu = gpus.of_device(0)
    assert (gpu.sms, gpu.arch, gpu.shared_bytes) == (114, "sm_90", 232448)
    assert gpus.resident_refusal({"a": 100}, 13, ["b"], gpu) is None
    assert "needs 115 resident programs" in gpus.resident_refusal({"a": 100}, 15, ["b"], gpu)
