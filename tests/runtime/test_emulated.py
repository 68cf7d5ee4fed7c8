"""Every program on emulated ranks (Triton's interpreter, one process per rank) against the torch
reference, at world 2 and 4; schedules broken on purpose end in named errors, not hangs or garbage;
and `tiledsl run` end to end. Ranks fork from one preloaded server per pytest process, so a run costs
about a second plus its kernels: the sizes below keep the kernels small too."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import types
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from tiledsl.diagnostics import TdsError
from tiledsl.runtime import emulate
from tiledsl.runtime.emulate import run_ranks
from tiledsl.tools.expect import load_expectation
from tiledsl.tools.reference import Reference
from tiledsl.tools.run import main_run
from tiledsl.tools.run_program import (
    EMULATED_DTYPES,
    Verdict,
    compare,
    make_inputs,
    program_schedule,
    run_emulated,
)
from tiledsl.schedule.check import _concrete_findings
from tiledsl.schedule.meaning import compile_exprs, default_sizes, instantiate, size_symbols, size_values

pytestmark = pytest.mark.emulated

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = sorted((ROOT / "programs").glob("*.tds"))
BROKEN = ROOT / "tests" / "schedule" / "broken"
WORLDS = (2, 4)

# Y's last block is never written: the reference leaves it zero, the emulator's poison leaves it NaN.
PARTIAL = textwrap.dedent("""\
    program partial
    param N
    const BLOCK = 4
    in  X : f32[N]
    out Y : f32[N]
    tile cp[i in N / BLOCK - 1]: Y[i*BLOCK : +BLOCK] = X[i*BLOCK : +BLOCK]
""")


def small_sizes(schedule, world: int) -> dict[str, int]:
    """`default_sizes`, with each param halved while the launch conditions hold, the checker still finds
    no error, no index extent falls below 2 (or below its default, where that is smaller), no region
    is cut at a tensor's end that was whole at the default sizes (a tile cut short can drop rows that
    the reference drops too), and the param stays at least twice the first value of every tunable
    (a matmul's k-loop keeps two steps). The interpreter's `tl.dot` takes ~10 ms per block product:
    at default sizes the GEMM programs at world 4 take minutes, here seconds."""
    holds = compile_exprs(tuple(c.holds for c in schedule.conditions), size_symbols(schedule))
    floor = 2 * max((values[0] for values in schedule.tunables.values()), default=1)

    def shape_of(sizes):
        concrete = instantiate(schedule, world, sizes)
        least = {(name, n): min(per_rank[n] for per_rank in extents)
                 for name, extents in concrete.extents.items() for n in range(len(extents[0]))}
        cut = {(a.region.tensor, a.region.span.line, a.region.span.column) for a in concrete.accesses
               if any(stop > n for (_, _, stop), n in zip(a.reach, concrete.shapes[a.region.tensor]))}
        return concrete, least, cut

    sizes = default_sizes(schedule, world)
    _, default_least, default_cut = shape_of(sizes)
    # a capacity keeps its default (as large as the token counts there): random routings then fit it, where
    # a halved one would end the call in CapacityExceeded (test_moe_emulated.py covers that)
    capacities = {s.name for t in schedule.tensors.values() if t.cap is not None for s in t.cap.free_symbols}
    # the k-loop's two steps bind only the params of a contraction's extent (where there is a matmul)
    contracted = _contracted_params(schedule)
    for param in (p for p in schedule.params if p not in capacities):
        while sizes[param] // 2 >= (floor if not contracted or param in contracted else 1):
            smaller = {**sizes, param: sizes[param] // 2}
            if not all(holds(*size_values(schedule, world, smaller))):
                break
            concrete, least, cut = shape_of(smaller)
            if any(least[key] < min(2, n) for key, n in default_least.items()) or not cut <= default_cut:
                break
            if any(d.severity == "error" for _, d in _concrete_findings(concrete)):
                break
            sizes = smaller
    return sizes


def _contracted_params(schedule) -> set[str]:
    """The params in the contracted extent (the left operand's last dimension) of any matmul."""
    import dataclasses

    from tiledsl.schedule import ir
    found: set[str] = set()

    def visit(value) -> None:
        if isinstance(value, ir.MatMul) and isinstance(value.left, ir.Load):
            found.update(s.name for s in value.left.region.shape[-1].free_symbols)
        if dataclasses.is_dataclass(value) and not isinstance(value, ir.Region):
            for field in dataclasses.fields(value):
                item = getattr(value, field.name)
                for part in item if isinstance(item, tuple) else (item,):
                    visit(part)
    for family in schedule.families.values():
        for store in family.stores:
            visit(store.value)
    return found & set(schedule.params)


# ---- every program matches the reference ----------------------------------------------------------

@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"world{w}")
@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.stem)
def test_program_matches_the_reference_on_emulated_ranks(path, world):
    schedule = program_schedule(path)
    verdicts = run_emulated(os.fspath(path), world, sizes=small_sizes(schedule, world))
    outputs = [name for name, t in schedule.tensors.items() if t.role.value in ("out", "inout")]
    assert [v.tensor for v in verdicts] == outputs
    assert all(v.ok for v in verdicts), "\n".join(v.line() for v in verdicts)


def test_small_sizes_give_every_program_at_most_64_instances_a_rank():
    # A new program whose sizes cannot be shrunk would make the suite above slow without failing.
    for path in PROGRAMS:
        schedule = program_schedule(path)
        for world in WORLDS:
            concrete = instantiate(schedule, world, small_sizes(schedule, world))
            # a family of d indices, two steps each (the test below), has 2^d instances a rank: beyond
            # three indices (a grouped GEMM's rank, expert, row and column tiles) the bound doubles per index
            most = max((len(f.indices) for f in schedule.families.values()), default=0)
            assert len(concrete.instances) <= 64 * world * 2 ** max(0, most - 3), (path.name, world, concrete.sizes)


def test_small_sizes_keep_two_steps_of_every_index_and_of_the_k_loop():
    sizes = small_sizes(program_schedule(ROOT / "programs" / "ag_gemm.tds"), 2)
    assert sizes == {"M": 256, "K": 128, "N": 512}  # mm: 2 x 2 tiles of 128 x 256, 2 k-steps of 64


@pytest.mark.parametrize("index", ["((i - 1) / 2) * B + B", "((i - 3) mod (N / B)) * B"])
def test_a_tile_index_with_a_negative_numerator_floors_in_the_kernel(tmp_path, index):
    """Issue 16's program: `/` and `mod` of a negative tile index floor in the kernel as they do in the
    checker and the reference (a tile's index is a plain Python int in the interpreter, whose `//`
    floors, and an i32 on the GPU, whose `//` truncates: both must floor once)."""
    (path := tmp_path / "negdiv.tds").write_text(textwrap.dedent(f"""\
        program negdiv
        param N
        const B = 64
        in  X : f32[N]
        out Y : f32[N]
        tile cp[i in N / B]: Y[i*B : +B] = X[{index} : +B]
        """))
    (verdict,) = run_emulated(os.fspath(path), 2, sizes={"N": 512})
    assert verdict.ok, verdict.line()


def test_a_copy_engine_wait_on_a_row_past_the_producer_waits_on_nothing(tmp_path):
    """Found by the differential test (seed 3094894359): pull[1] names load[2] at N = 6, where load has
    rows 0..1; the stream's waits followed the edge without the meaning's guard and indexed past the
    producer's counts. No instance there means no wait, on the stream as in the kernel."""
    (path := tmp_path / "gen_pull.tds").write_text(textwrap.dedent("""\
        program gen_pull
        param N
        const B3 = 3
        in X : f32[N]
        out Y : f32[N]
        symm T : f32[N]
        tile load[i in cdiv(N, B3)] on sms(2): T[i*B3 : +B3] = X[i*B3 : +B3]
        chunk pull[i in cdiv(N, 4)] on copy_engine: T@rank[i*4 : +4] -> Y[i*4 : +4]
        load[i] after load[i - 1]
        pull[i] after load[(i*4)/B3], load[(i*4 + 3)/B3]
        """))
    (verdict,) = run_emulated(os.fspath(path), 2, sizes={"N": 6})
    assert verdict.ok, verdict.line()


def test_a_constant_stored_by_a_tile_or_a_block_fills_its_region(tmp_path):
    """`Y[...] = 2.5` passed the checker and then failed inside code generation (`1.0.to(...)`, an
    internal error): a constant is stored as a block of it, by a one-block tile and by a block tile."""
    (path := tmp_path / "consts.tds").write_text(textwrap.dedent("""\
        program consts
        param N, M
        const BN = 16
        in  X : f32[N, M]
        out Y : f32[N, M]
        out Z : f32[N, M]
        out W : f32[N]
        tile fill[i in cdiv(N, BN)]: Y[i*BN : +BN, :] = 2.5
        tile blk[i in cdiv(N, BN)]:
            x = X[i*BN : +BN, :]
            W[i*BN : +BN] = 7
            Z[i*BN : +BN, :] = x + rowmax(x)
        """))
    verdicts = run_emulated(os.fspath(path), 2, sizes={"N": 37, "M": 20})
    assert [v.tensor for v in verdicts] == ["Y", "Z", "W"]
    assert all(v.ok for v in verdicts), [v.line() for v in verdicts]


# ---- known limits of the interpreter --------------------------------------------------------------

def test_bf16_runs_as_float32_and_the_verdict_says_so(tmp_path):
    (verdict,) = run_emulated(os.fspath(ROOT / "programs" / "copy.tds"), 2, sizes={"N": 2048})
    assert verdict.ok
    assert "emulated in float32 for bfloat16" in verdict.line()
    (path := tmp_path / "copy_f32.tds").write_text(PARTIAL.replace("N / BLOCK - 1", "cdiv(N, BLOCK)"))
    (f32,) = run_emulated(os.fspath(path), 2, sizes={"N": 10})
    assert f32.ok and "emulated in" not in f32.line()


def test_an_f16_cast_on_the_way_sets_the_tolerance_and_is_not_called_emulation(tmp_path):
    # the f32 output is stored and emulated as f32; only the cast rounds its values, to f16's grain
    (path := tmp_path / "cast.tds").write_text(PARTIAL.replace("N / BLOCK - 1", "cdiv(N, BLOCK)").replace(
        "= X[i*BLOCK : +BLOCK]", "= f16(X[i*BLOCK : +BLOCK]) * 2.0"))
    (verdict,) = run_emulated(os.fspath(path), 1, sizes={"N": 8}, calls=1)
    assert verdict.ok
    assert verdict.line().endswith("; within float16's tolerance, the narrowest dtype on its path)")
    assert "emulated in" not in verdict.line()


def test_an_untested_triton_is_refused_before_any_rank_starts(monkeypatch):
    import triton
    monkeypatch.setattr(triton, "__version__", "3.3.1")
    monkeypatch.setattr(emulate.multiprocessing, "get_context", lambda *_: pytest.fail("a rank was started"))
    with pytest.raises(RuntimeError, match=r"emulation was tested with triton 3\.9; this is triton 3\.3\.1"):
        run_emulated(os.fspath(ROOT / "programs" / "copy.tds"), 2)


def test_a_later_triton_minor_is_not_taken_for_a_tested_one(monkeypatch):
    import triton
    monkeypatch.setattr(triton, "__version__", "3.90.0")  # starts with "3.9", which is tested
    with pytest.raises(RuntimeError, match="this is triton 3.90.0"):
        emulate.check_triton_version()


def test_emulation_leaves_this_process_environment_alone(monkeypatch):
    # Kernels built in this process afterwards (the AOT tests) must not turn into interpreted ones.
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    run_emulated(os.fspath(ROOT / "programs" / "copy.tds"), 2, sizes={"N": 2048})
    assert "TRITON_INTERPRET" not in os.environ


# ---- schedules broken on purpose ------------------------------------------------------------------

def _rank_with_a_family_left_out(heap, source: str, skip: tuple, shapes: list, inputs: list):
    """One rank of a program compiled without the families in `skip`: its consumers must time out."""
    import tiledsl
    from tiledsl.runtime.launch import ScheduleTimeout
    program = tiledsl.compile(source, heap, emulated=True, wait_timeout_s=0.2, skip=skip,
                              dtype_override={k: getattr(torch, v) for k, v in EMULATED_DTYPES.items()})
    args = {spec.name: inputs[heap.rank][spec.name].clone() if spec.name in inputs[heap.rank] else
            torch.full(shapes[heap.rank][spec.name], float("nan")) for spec in program.callers}
    try:
        program(**args)
    except ScheduleTimeout as timeout:
        return f"ScheduleTimeout: {timeout}"
    finally:
        heap.close()
    return "finished"


LEFT_OUT = [
    ("ag_gemm", ("gather",), "mm[i, j] after gather[(i*BM) / Ms]"),
    ("allreduce_two_shot", ("red",), "back[i] after red[((i*BLOCK) mod Ns) / BLOCK] @ ((i*BLOCK) / Ns)"),
]
TIMEOUT = re.compile(r"ScheduleTimeout: rank (?P<rank>\d+) timed out waiting on edge (?P<edge>\d+): (?P<text>.*) "
                     r"\(waiting instance \d+, expected epoch (?P<expected>\d+), saw (?P<seen>\d+)\)")


def timeouts_with_a_family_left_out(name: str, skip: tuple, world: int = 2) -> list[re.Match]:
    path = ROOT / "programs" / f"{name}.tds"
    schedule = program_schedule(path)
    sizes = small_sizes(schedule, world)
    reference = Reference(schedule, world, sizes)
    inputs = make_inputs(schedule, world, sizes, seed=0, dtype_map=EMULATED_DTYPES)
    messages = run_ranks(_rank_with_a_family_left_out, world, os.fspath(path), skip,
                         [reference.shapes(r) for r in range(world)], inputs, timeout_s=120)
    found = [TIMEOUT.fullmatch(message) for message in messages]
    assert all(found), messages
    return found


@pytest.mark.parametrize("name, skip, edge_text", LEFT_OUT, ids=[n for n, _, _ in LEFT_OUT])
def test_a_family_left_out_makes_every_rank_time_out_naming_the_edge(name, skip, edge_text):
    path = ROOT / "programs" / f"{name}.tds"
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if edge_text in text)
    edges = [n for n, e in enumerate(program_schedule(path).edges) if e.span.line == line]
    for found in timeouts_with_a_family_left_out(name, skip):
        assert int(found["edge"]) in edges
        assert found["text"] == f"{path}:{line} {edge_text}"


def _rank_that_times_out(heap, source: str, skip: tuple, shapes: list, inputs: list):
    """As _rank_with_a_family_left_out, but the timeout leaves the rank as it would under `tiledsl run`."""
    import tiledsl
    program = tiledsl.compile(source, heap, emulated=True, wait_timeout_s=0.2, skip=skip,
                              dtype_override={k: getattr(torch, v) for k, v in EMULATED_DTYPES.items()})
    args = {spec.name: inputs[heap.rank][spec.name].clone() if spec.name in inputs[heap.rank] else
            torch.full(shapes[heap.rank][spec.name], float("nan")) for spec in program.callers}
    program(**args)


def test_a_timeout_under_tiledsl_run_is_an_error_naming_rank_edge_and_epochs_not_an_internal_error(
        capsys, monkeypatch):
    from tiledsl import cli
    path = ROOT / "programs" / "ag_gemm.tds"
    schedule = program_schedule(path)
    sizes = small_sizes(schedule, 2)
    reference = Reference(schedule, 2, sizes)
    inputs = make_inputs(schedule, 2, sizes, seed=0, dtype_map=EMULATED_DTYPES)

    def main_run(args):
        run_ranks(_rank_that_times_out, 2, os.fspath(path), ("gather",), [reference.shapes(r) for r in range(2)],
                  inputs, timeout_s=120)
        return 0

    monkeypatch.setitem(sys.modules, "tiledsl.tools.run", types.SimpleNamespace(main_run=main_run))
    code = cli.main(["run", os.fspath(path)])
    err = capsys.readouterr().err
    assert code == 1, err
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "mm[i, j] after" in text)
    assert re.search(rf"error: ScheduleTimeout on rank \d: rank \d timed out waiting on edge 0: {re.escape(str(path))}:"
                     rf"{line} mm\[i, j\] after gather.* expected epoch 1, saw 0", err), err
    assert "internal error" not in err


@pytest.mark.parametrize("name, skip, edge_text", LEFT_OUT[:1], ids=[n for n, _, _ in LEFT_OUT[:1]])
def test_a_timeout_names_the_rank_that_waited_and_the_epochs(name, skip, edge_text):
    for rank, found in enumerate(timeouts_with_a_family_left_out(name, skip)):
        assert int(found["rank"]) == rank
        assert (found["expected"], found["seen"]) == ("1", "0")  # first call: the signal never came


@pytest.mark.parametrize("broken, what", [("allreduce_overwrite.tds", "race"), ("ring_cycle.tds", "deadlock")])
def test_a_broken_schedule_is_refused_by_the_checker_before_any_rank_runs(monkeypatch, broken, what):
    monkeypatch.setattr(emulate, "run_ranks", lambda *_, **__: pytest.fail("ranks were started"))
    with pytest.raises(TdsError) as raised:
        run_emulated(os.fspath(BROKEN / broken), 2)
    text = raised.value.render()
    expected = re.search(r"# expect: (\d+:\d+) (.*)", (BROKEN / broken).read_text())
    assert f"{BROKEN / broken}:{expected[1]}: error: {expected[2]}" in text
    assert what in expected[2]
    assert "Traceback" not in text


def test_sizes_the_program_cannot_run_at_are_reported_at_the_line_that_needs_them(monkeypatch):
    monkeypatch.setattr(emulate, "run_ranks", lambda *_, **__: pytest.fail("ranks were started"))
    path = ROOT / "programs" / "ag_gemm.tds"
    with pytest.raises(TdsError) as raised:
        run_emulated(os.fspath(path), 2, sizes={"M": 100})
    (diagnostic,) = raised.value.diagnostics
    assert diagnostic.message.startswith("M/world must be divisible by BM (at M=100, ")
    assert path.read_text().splitlines()[diagnostic.span.line - 1].startswith("tile  mm[")
    with pytest.raises(TdsError, match="no param named Q; the params are M, K, N"):
        run_emulated(os.fspath(path), 2, sizes={"Q": 3})


# ---- the comparison is not vacuous ----------------------------------------------------------------

def test_an_output_never_written_is_a_mismatch_end_to_end(tmp_path):
    (path := tmp_path / "partial.tds").write_text(PARTIAL)
    (verdict,) = run_emulated(os.fspath(path), 2, sizes={"N": 12})
    assert not verdict.ok
    assert "Y: MISMATCH" in verdict.line()
    assert "16 elements never written (still NaN)" in verdict.line()  # 4 per rank and call


def test_compare_tolerates_rounding_and_nothing_more():
    want = [torch.tensor([1.0, -2.0, 4.0]), torch.tensor([0.0, 0.0, 0.0])]
    assert compare("Y", [w.clone() for w in want], want, "float32").ok
    assert compare("Y", [want[0] + 1e-4, want[1]], want, "float32").ok  # 2.5e-5 relative to max |4|
    off = compare("Y", [want[0], torch.tensor([0.0, 1e-2, 0.0])], want, "float32")
    assert not off.ok and off.max_error == pytest.approx(1e-2)  # an all-zero rank is measured absolutely
    assert compare("Y", [want[0] * 1.01, want[1]], want, "bfloat16").ok
    assert not compare("Y", [want[0] * 1.01, want[1]], want, "float32").ok


def test_compare_calls_a_single_nan_a_mismatch():
    want = [torch.ones(4), torch.ones(4)]
    poisoned = torch.ones(4)
    poisoned[2] = float("nan")
    verdict = compare("C", [torch.ones(4), poisoned], want, "bfloat16", ", world 2")
    assert not verdict.ok
    assert verdict.line() == "C: MISMATCH (max relative error inf, world 2; 1 elements NaN (never written, or " \
                             "computed so))"


def test_compare_tells_a_nan_computed_from_one_never_written_by_what_the_program_stores():
    want = [torch.ones(4), torch.ones(4)]
    got = [torch.tensor([1.0, float("nan"), 1.0, 1.0]), torch.tensor([float("nan")] * 2 + [1.0] * 2)]
    stored = [torch.ones(4, dtype=torch.bool), torch.tensor([True, False, True, True])]
    verdict = compare("C", got, want, "float32", ", world 2", stored)
    assert verdict.line() == "C: MISMATCH (max relative error inf, world 2; 2 elements computed as NaN, " \
                             "1 elements never written (still NaN))"


def test_a_nan_the_kernel_computes_is_not_called_never_written_end_to_end(tmp_path):
    # log of a negative input is NaN in the kernel; the author meant log|x|: every element is written
    (path := tmp_path / "logs.tds").write_text(PARTIAL.replace("N / BLOCK - 1", "N / BLOCK").replace(
        "= X[i*BLOCK : +BLOCK]", "= log(X[i*BLOCK : +BLOCK])"))
    (meant := tmp_path / "logs_expect.py").write_text(
        "def expect(inputs, world, sizes):\n    return {'Y': [x.abs().log() for x in inputs['X']]}\n")
    (verdict,) = run_emulated(os.fspath(path), 1, sizes={"N": 8}, calls=1,
                              expect=load_expectation(os.fspath(meant), "partial"))
    assert not verdict.ok
    negative = int((make_inputs(program_schedule(path.read_text()), 1, {"N": 8}, 0, EMULATED_DTYPES)[0]["X"] < 0).sum())
    assert negative and f"; {negative} elements computed as NaN)" in verdict.line()
    assert "never written" not in verdict.line()


def test_compare_fails_on_nan_or_inf_in_the_reference_and_on_inf_got():
    want = [torch.ones(4)]
    for bad in (float("nan"), float("inf")):
        broken = torch.ones(4)
        broken[1] = bad
        verdict = compare("C", [torch.ones(4)], [broken], "float32")
        assert not verdict.ok and "the reference holds NaN or Inf" in verdict.line()
    infinite = torch.ones(4)
    infinite[0] = float("inf")
    verdict = compare("C", [infinite], want, "float32")
    assert not verdict.ok and "1 elements Inf" in verdict.line()
    # a NaN on a later copy is not hidden by an earlier copy's error
    late = torch.ones(4)
    late[3] = float("nan")
    assert not compare("C", [torch.ones(4) * 1.5, late], [torch.ones(4), torch.ones(4)], "bfloat16").ok


def test_every_call_runs_on_fresh_inputs_and_is_checked(monkeypatch):
    """A rank that hands back the first call's outputs on the second call (what a wait that let a
    consumer through too early would read) is caught: each call has its own inputs and reference."""
    from tiledsl.tools import run_program
    path = ROOT / "programs" / "copy.tds"
    schedule = program_schedule(path)

    def stale_ranks(fn, world, source, consts, shapes, calls, dtype_map, timeout_s, built=None, nodes=None):
        given = [torch.as_tensor(call[0]["X"]) for call in calls]
        assert len(calls) == 2 and not torch.equal(*given)  # fresh inputs
        first_call = [{n: torch.as_tensor(v) for n, v in mine.items()} for mine in calls[0]]
        first = [Reference(schedule, world, {"N": 2048}).run(first_call)[rank] for rank in range(world)]
        return [[{"Y": first[rank]["Y"].float().numpy()}] * 2 for rank in range(world)]

    monkeypatch.setattr("tiledsl.runtime.emulate.run_ranks", stale_ranks)
    verdict, = run_program.run_emulated(os.fspath(path), 2, sizes={"N": 2048}, calls=2)
    assert not verdict.ok and "2 calls on fresh inputs" in verdict.line()


def test_compare_calls_a_wrong_shape_a_mismatch():
    verdict = compare("C", [torch.ones(2, 3)], [torch.ones(3, 2)], "float32")
    assert not verdict.ok and "shape [2, 3], expected [3, 2]" in verdict.line()


def test_verdict_line_format():
    assert Verdict("X", True, 1.5e-8, ", world 4, N=8").line() == "X: ok (max relative error 1.50e-08, world 4, N=8)"


# ---- `tiledsl run` --------------------------------------------------------------------------------

def test_tiledsl_run_prints_one_verdict_per_output_and_exits_0():
    path = ROOT / "programs" / "allreduce_rmsnorm.tds"  # two outputs, R and Y
    done = subprocess.run([sys.executable, "-m", "tiledsl", "run", os.fspath(path), "--world", "2",
                           "--size", "T=3", "--size", "D=40", "--emulate"],
                          capture_output=True, text=True, check=False, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [re.match(rf"{re.escape(os.fspath(path))}: (\w+): ok \(", line)[1] for line in lines] == ["R", "Y"]
    assert all("world 2, T=3, D=40" in line for line in lines)


def test_tiledsl_run_exits_1_on_a_mismatch(capsys, tmp_path):
    from tiledsl.cli import main
    (path := tmp_path / "partial.tds").write_text(PARTIAL)
    assert main(["run", os.fspath(path), "--world", "2", "--size", "N=8"]) == 1
    assert capsys.readouterr().out.startswith(f"{path}: Y: MISMATCH (max relative error inf")


def test_tiledsl_run_of_a_broken_schedule_shows_the_diagnostic_and_exits_1(capsys):
    from tiledsl.cli import main
    assert main(["run", os.fspath(BROKEN / "ring_cycle.tds"), "--world", "2"]) == 1
    err = capsys.readouterr().err
    assert "error: deadlock: a cycle of waits" in err and "Traceback" not in err


def test_main_run_takes_sizes_as_text_and_defaults_the_world(capsys):
    args = Namespace(file=os.fspath(ROOT / "programs" / "copy.tds"), world=None, size=["N=1024"], emulate=True,
                     seed=3)
    assert main_run(args) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{args.file}: Y: ok (max relative error 0.00e+00, world 2, N=1024, 2 calls on fresh inputs; "
        "emulated in float32 for bfloat16)"]
