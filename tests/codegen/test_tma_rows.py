"""TMA's row rule (codegen/tma.py), decided once: the tensors a descriptor reaches are the kernel's own
descriptor arguments, the default sizes meet the rule at every world, an explicit size or const that
breaks it is refused at the tensor's declaration, and the launcher names the dtype it judged."""
from __future__ import annotations

import os
import types
from pathlib import Path

import pytest
import sympy
import torch

from tiledsl import cli
from tiledsl.codegen import lower
from tiledsl.codegen.tma import described, row_conditions
from tiledsl.diagnostics import TdsError
from tiledsl.pipeline import run
from tiledsl.runtime.specs import Arg, Kind, row_multiple, rows_fit
from tiledsl.runtime.validate import LaunchError, _tma_rows
from tiledsl.schedule import ir
from tiledsl.schedule.meaning import default_sizes
from tiledsl.tables import DTYPES

ROOT = Path(__file__).resolve().parents[2]


def schedule_of(name: str):
    path = ROOT / "programs" / f"{name}.tds"
    return run(path.read_text(), until="schedule", path=os.fspath(path.relative_to(ROOT))).schedule


def test_row_multiples_are_sixteen_bytes_of_elements():
    assert [row_multiple(n) for n in (1, 2, 4, 8)] == [16, 8, 4, 2]
    assert rows_fit(8, 2) and not rows_fit(4, 2) and rows_fit(4, 4)


@pytest.mark.parametrize("name", ["gemm_rs", "ag_gemm", "sp_ulysses"])
def test_the_tensors_tma_reaches_are_the_kernels_descriptor_arguments(name):
    schedule = schedule_of(name)
    arguments = {a.of for a in lower(schedule, {}).interface.of_kind(Kind.DESCRIPTOR)}
    assert arguments and set(described(schedule)) == arguments


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("name", ["gemm_rs", "gemm_rs_ce", "gemm_ar"])
def test_default_sizes_give_tma_rows_of_whole_16_bytes_at_every_world(name, world):
    # gemm_rs at world 8 defaulted to K = 4: bf16 rows of 8 bytes, refused by the launcher on GPUs
    schedule = schedule_of(name)
    sizes = default_sizes(schedule, world)
    values = {ir.size_symbol(k): v for k, v in {**schedule.consts, **sizes}.items()} | {ir.WORLD: world}
    for tensor, dtype in described(schedule).items():
        columns = int(sympy.sympify(schedule.tensors[tensor].shape[-1]).subs(values))
        assert rows_fit(columns, DTYPES[dtype].torch.itemsize), (tensor, columns, sizes)


def test_an_explicit_size_breaking_the_rows_is_refused_at_the_tensors_declaration(capsys):
    code = cli.main(["run", "programs/gemm.tds", "--world", "1", "--size", "M=128", "--size", "K=33",
                     "--size", "N=256"])
    err = capsys.readouterr().err
    assert code == cli.ERRORS
    assert "programs/gemm.tds:7:1: error: 'A' is read or written through a TMA descriptor" in err
    assert "K must be a multiple of 8 (bfloat16) (at M=128, K=33, N=256, world 1)" in err
    assert "in  A : bf16[M, K]" in err and "hint: pad the last dimension of 'A' to a multiple of 8" in err


NARROW = """program narrow
param M, N
const BM = 128, BN = 128, D = 36
in  A : bf16[M, D]
in  B : bf16[D, N]
out C : bf16[M, N]

tile mm[i in cdiv(M, BM), j in cdiv(N, BN)]: C[i*BM : +BM, j*BN : +BN] = A[i*BM : +BM, :] @ B[:, j*BN : +BN]
"""


def test_a_const_breaking_the_rows_is_refused_when_the_program_is_checked():
    with pytest.raises(TdsError) as raised:
        run(NARROW, until="check")
    found = [d for d in raised.value.diagnostics if "TMA" in d.message]
    assert len(found) == 1 and found[0].span.line == 4, [d.message for d in raised.value.diagnostics]
    assert "D must be a multiple of 8" in found[0].message and found[0].hint


def test_the_schedule_carries_the_row_conditions_at_the_consts_it_is_built_with():
    # the schedule layer reads them off the schedule (it never imports codegen): set at the build's
    # consts, not left over from the program's (D = 36 breaks the rule, D = 64 meets it at every size)
    def on_d(schedule):
        return [c.message for c in schedule.kernel_conditions if ir.size_symbol("D") in c.holds.free_symbols]

    declared = run(NARROW, until="schedule").schedule
    assert declared.kernel_conditions == row_conditions(declared) and len(on_d(declared)) == 1
    assert on_d(run(NARROW, until="schedule", consts={"D": 64}).schedule) == []


@pytest.mark.parametrize("override, expected", [
    ({}, "its rows are 66 bytes (33 x bfloat16)"),
    ({"bfloat16": torch.float32}, "its rows are 132 bytes (33 x float32; the program declares bfloat16)"),
])
def test_the_launcher_names_the_dtype_it_judged_and_the_declared_one(override, expected):
    program = types.SimpleNamespace(tensors=[types.SimpleNamespace(name="A", where="programs/gemm.tds:7")],
                                    args=[Arg("tds_desc_mm_a", Kind.DESCRIPTOR, "A", "bfloat16", (128, 64))])
    with pytest.raises(LaunchError, match=r"tensor 'A' \(programs/gemm.tds:7\)") as raised:
        _tma_rows(program, {"A": (128, 33)}, {}, override)
    assert expected in str(raised.value)
    _tma_rows(program, {"A": (128, 40)}, {}, override)  # 80 or 160 bytes: whole 16s
