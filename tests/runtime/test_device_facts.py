"""Device facts are inputs (issue 25): a launch spreads the kernel's programs over the SMs of the device
it runs on, read from the device (here a stand-in's count, with no GPU), and refuses by name a kernel
whose programs could not all be resident there: programs that spin on signals deadlock otherwise, and
the checker's proof was made for the GPU the build named (the H200's 132 SMs by default)."""
from __future__ import annotations

import pytest
import torch

from tiledsl.api import build_module
from tiledsl.runtime.emulate import EmulatedHeap
from tiledsl.runtime.launch import LaunchError, Program

# `big` takes 40 programs of its own (it has 1024 instances at N = 4096), `add` shares what is left
FIXED = """program fixed_programs
param N
const B = 4
in  X : f32[N]
out Y : f32[N]
out Z : f32[N]
tile big[i in cdiv(N, B)] on sms(40): Y[i*B : +B] = X[i*B : +B]
tile add[i in cdiv(N, B)]: Z[i*B : +B] = X[i*B : +B] + 1
"""


class _OneRank:
    def wait(self):
        pass  # one rank in this process: allocations need no agreement


def _prepared(monkeypatch, sms: int, n: int = 4096, **options):
    """A call of FIXED prepared for a GPU of `sms` SMs, with no GPU: the launch reads the device's
    properties (torch.cuda.get_device_properties), a stand-in's here."""
    class Properties:
        multi_processor_count = sms
        name = "stand-in GPU"
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Properties())
    monkeypatch.setattr(Program, "_options", lambda self, env: {})
    heap = EmulatedHeap(0, 1, [torch.zeros(2**20, dtype=torch.uint8)], barrier=_OneRank())
    program = Program(build_module(FIXED), heap, emulated=False, **options)
    x = torch.zeros(n)
    return program._prepare({"X": x, "Y": torch.empty(n), "Z": torch.empty(n)}, parity=1)


def test_the_kernel_spreads_over_the_devices_own_sms(monkeypatch):
    for sms, rest in ((64, 24), (132, 92)):
        call = _prepared(monkeypatch, sms)
        assert call.grid == sms
        assert (call.roles["tds_START_big"], call.roles["tds_PROGRAMS_big"]) == (0, 40)
        assert (call.roles["tds_START_add"], call.roles["tds_PROGRAMS_add"]) == (40, rest)


def test_a_fixed_sms_above_the_devices_count_is_refused_naming_the_family_and_the_counts(monkeypatch):
    """A MIG slice or a smaller GPU (an H20 has 78 SMs): the checker passed `sms(40)` for the H200."""
    with pytest.raises(LaunchError, match=r"the kernel needs 41 resident programs \('big' sms\(40\), 'add' 1 "
                                          r"\(sms\(rest\)\)\) but the stand-in GPU \(.*32 SMs.*\) runs at most 32"):
        _prepared(monkeypatch, 32)


def test_a_fixed_sms_capped_by_its_instances_is_what_must_fit(monkeypatch):
    """At N = 64 `big` has 16 instances: 16 programs of its own, and 16 + 1 fit on 32 SMs."""
    call = _prepared(monkeypatch, 32, n=64)
    assert (call.roles["tds_PROGRAMS_big"], call.roles["tds_START_add"], call.roles["tds_PROGRAMS_add"]) == \
        (16, 16, 16)
    assert call.grid == 32


def test_more_programs_than_the_device_has_sms_are_refused(monkeypatch):
    """`num_sms` asks for the shared programs: 200 in all on a device of 132 would not all be resident."""
    with pytest.raises(LaunchError, match=r"the kernel needs 200 resident programs \('big' sms\(40\), 'add' 160 "
                                          r"\(sms\(rest\)\)\) but the stand-in GPU .* runs at most 132 at once"):
        _prepared(monkeypatch, 132, num_sms=200)
    assert _prepared(monkeypatch, 132, num_sms=100).grid == 100


def test_the_pipeline_stages_fit_the_shared_memory_of_the_gpu_it_runs_on():
    """gemm.tds's [128, 64] x [64, 256] bf16 blocks and their TMA-stored [128, 256] block: 3 stages in
    Hopper's 227 KB, 2 in 170 KB, and below the 160 KB two need, a refusal naming the family."""
    from pathlib import Path

    from tiledsl.runtime.specs import SharedMemoryError, kernel_options, spec_of
    spec = spec_of(build_module((Path(__file__).resolve().parents[2] / "programs" / "gemm.tds").read_text()))
    assert kernel_options(spec, 2)["num_stages"] == kernel_options(spec, 2, 227 * 1024)["num_stages"] == 3
    assert kernel_options(spec, 2, 170 * 1024)["num_stages"] == 2
    with pytest.raises(SharedMemoryError, match=r"mm: .* need 163840 bytes .* more than the 102400 a block may take"):
        kernel_options(spec, 2, 100 * 1024)


def _stand_in_device(monkeypatch, sms: int, shared_bytes: int | None = None):
    """torch's view of a current CUDA device of `sms` SMs (and `shared_bytes` a block may opt in to),
    with no GPU: what tiledsl.compile and tiledsl.ops read through gpus.of_launch."""
    class Properties:
        multi_processor_count = sms
        name = "stand-in GPU"
        major, minor = 9, 0
    if shared_bytes is not None:
        Properties.shared_memory_per_block_optin = shared_bytes
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Properties())


def test_compile_proves_residency_for_the_device_it_will_launch_on(monkeypatch):
    """FIXED's `sms(40)` and its sms(rest) family fit the H200's 132 SMs, so the default proof passes;
    compiled for a current device of 32 (a MIG slice), the checker refuses it by name at compile time
    rather than the launcher at the first call; on 64 it is built and loaded."""
    import tiledsl
    from tiledsl.api import launch_gpu
    from tiledsl.diagnostics import TdsError
    from tiledsl.gpus import DEFAULT
    _stand_in_device(monkeypatch, 32)
    assert (launch_gpu(emulated=False).name, launch_gpu(emulated=False).sms) == ("stand-in GPU", 32)
    with pytest.raises(TdsError) as raised:
        tiledsl.compile(FIXED, emulated=False)
    (found,) = [d for d in raised.value.diagnostics if "resident" in d.message]
    assert found.message == "the families ask for 40 resident SM programs, but the stand-in GPU has 32 SMs"
    assert found.span.line == 7
    _stand_in_device(monkeypatch, 64)
    assert tiledsl.compile(FIXED, emulated=False).spec.families  # proven for 64, and loaded
    # emulated, or with no CUDA device to read, the proof is the default GPU's as before
    _stand_in_device(monkeypatch, 32)
    assert launch_gpu(emulated=True) is DEFAULT

    def cpu_device(device=None):  # what torch says of a heap on the CPU
        raise ValueError(f"Expected a cuda device, but got: {device}")
    monkeypatch.setattr(torch.cuda, "get_device_properties", cpu_device)
    heap = EmulatedHeap(0, 1, [torch.zeros(1024, dtype=torch.uint8)], barrier=_OneRank())
    assert launch_gpu(heap, emulated=False) is DEFAULT
