"""The `tiledsl` command, run in-process: exit codes, what goes to stdout and stderr, and that bad input
never prints a Python traceback."""
import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import tiledsl
from tiledsl import cli
from tiledsl.diagnostics import warning
from tiledsl.grammar.ast import Span

ROOT = Path(__file__).parents[1]
COPY = str(ROOT / "programs" / "copy.tds")
AG_GEMM = str(ROOT / "programs" / "ag_gemm.tds")
BROKEN = "program broken\nparam N\nin X : bf16[N]\nout Y : bf16[N]\ntile cp[i in N]: Y[i] = Z[i]\n"


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def codegen_available() -> bool:
    return importlib.util.find_spec("tiledsl.codegen.render") is not None


needs_codegen = pytest.mark.skipif(not codegen_available(), reason="tiledsl.codegen is not in this build yet")


@pytest.fixture
def broken(tmp_path):
    path = tmp_path / "broken.tds"
    path.write_text(BROKEN)
    return str(path)


# ---- check -----------------------------------------------------------------------------------------

def test_check_prints_ok_for_each_clean_program(capsys):
    programs = sorted(str(p) for p in (ROOT / "programs").glob("*.tds"))
    code, out, err = run_cli(capsys, "check", *programs)
    assert code == 0
    assert out.splitlines() == [f"{p}: ok" for p in programs]


def test_check_refuses_a_program_that_races_with_the_location_and_exits_1(capsys, tmp_path):
    """The twin of the test above: ag_gemm without its edge is refused by the checker, not the parser."""
    path = tmp_path / "ag_gemm.tds"
    source = Path(AG_GEMM).read_text()
    path.write_text(source.replace("mm[i, j] after gather[(i*BM) / Ms]\n", ""))
    line, = [n for n, text in enumerate(source.splitlines(), 1) if text.startswith("tile  mm")]
    column = source.splitlines()[line - 1].index("A_all[") + 1
    code, out, err = run_cli(capsys, "check", str(path))
    assert (code, out) == (1, "")
    assert err.startswith(f"{path}:{line}:{column}: error: race: tile 'mm' reads A_all while chunk 'gather' may "
                          "still write it\n")


def test_check_renders_errors_with_location_and_exits_1(capsys, broken):
    code, out, err = run_cli(capsys, "check", broken)
    assert code == 1
    assert out == ""
    assert err.startswith(f"{broken}:5:25: error: unknown name 'Z'\n")
    assert "    tile cp[i in N]: Y[i] = Z[i]\n" in err and "^" in err


def test_check_goes_on_after_a_bad_file(capsys, broken):
    code, out, err = run_cli(capsys, "check", broken, COPY)
    assert code == 1
    assert out == f"{COPY}: ok\n"
    assert "unknown name 'Z'" in err


def test_check_of_a_missing_file(capsys, tmp_path):
    missing = str(tmp_path / "absent.tds")
    code, out, err = run_cli(capsys, "check", missing)
    assert code == 1
    assert err == f"{missing}: error: cannot read file: No such file or directory\n"


def test_check_of_a_file_not_named_tds_reads_the_file(capsys, tmp_path):
    path = tmp_path / "copy.txt"
    path.write_text(Path(COPY).read_text())
    code, out, _ = run_cli(capsys, "check", str(path))
    assert (code, out) == (0, f"{path}: ok\n")


def test_check_of_a_garbage_file(capsys, tmp_path):
    path = tmp_path / "garbage.tds"
    path.write_bytes(bytes(range(256)) * 4)
    code, out, err = run_cli(capsys, "check", str(path))
    assert code == 1
    assert err == f"{path}:2:118: error: this file is not UTF-8 text (byte 0x80)\n"


def test_check_prints_warnings_and_still_passes(capsys, monkeypatch):
    import tiledsl.schedule.check as check_stage
    monkeypatch.setattr(check_stage, "check", lambda schedule, gpu=None: [warning("an odd but legal order", Span(8, 1, 8, 5))])
    code, out, err = run_cli(capsys, "check", COPY)
    assert code == 0
    assert out == f"{COPY}: ok\n"
    assert err.startswith(f"{COPY}:8:1: warning: an odd but legal order\n")


def test_a_compiler_bug_is_one_line_and_exit_3(capsys, monkeypatch):
    import tiledsl.schedule as schedule

    def broken_stage(program):
        raise ZeroDivisionError("the bug")

    monkeypatch.setattr(schedule, "build_schedule", broken_stage)
    monkeypatch.delenv("TILEDSL_TRACEBACK", raising=False)
    code, out, err = run_cli(capsys, "check", COPY)
    assert code == 3
    assert len(err.splitlines()) == 1
    assert err.startswith("internal error: ZeroDivisionError: the bug (at test_cli.py:")
    monkeypatch.setenv("TILEDSL_TRACEBACK", "1")
    with pytest.raises(ZeroDivisionError):
        cli.main(["check", COPY])


def test_a_compiler_bug_wrapped_by_another_error_names_the_innermost_one(capsys, monkeypatch):
    # Triton's CompilationError reads "at 36:12:"; what the compile refused is the error it wraps
    import tiledsl.schedule as schedule

    def broken_stage(program):
        try:
            raise AssertionError("Loop-carried variable d has initial type int32 but is re-assigned to fp32")
        except AssertionError as why:
            raise RuntimeError("at 36:12:") from why

    monkeypatch.setattr(schedule, "build_schedule", broken_stage)
    monkeypatch.delenv("TILEDSL_TRACEBACK", raising=False)
    code, out, err = run_cli(capsys, "check", COPY)
    assert code == 3 and len(err.splitlines()) == 1
    assert err.startswith("internal error: RuntimeError: at 36:12: (at test_cli.py:")
    assert ", because AssertionError: Loop-carried variable d has initial type int32" in err


def test_a_missing_stage_is_named_and_exits_2(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tiledsl.schedule.check", None)
    code, out, err = run_cli(capsys, "check", COPY)
    assert code == 2
    assert err == f"{COPY}: the check stage is not available in this build\n"


# ---- version, help, usage ----------------------------------------------------------------------------

def test_version(capsys):
    code, out, _ = run_cli(capsys, "--version")
    assert (code, out) == (0, f"tiledsl {tiledsl.__version__}\n")


@pytest.mark.parametrize("command", [[], ["check"], ["build"], ["graph"], ["run"]])
def test_help_of_every_command(capsys, command):
    code, out, _ = run_cli(capsys, *command, "--help")
    assert code == 0
    assert out.startswith(f"usage: tiledsl {' '.join(command)}".rstrip())


def test_no_command_prints_usage_and_exits_2(capsys):
    code, _, err = run_cli(capsys)
    assert code == 2
    assert err.startswith("usage: tiledsl")


@pytest.mark.parametrize("argv", [["check"], ["build", COPY, "--dump-after", "lex"], ["build", COPY, "-D", "BM"],
                                  ["build", COPY, "-D", "BM=big"], ["graph", COPY], ["run", COPY, "--world", "0"],
                                  ["run", COPY, "--size", "N"], ["frobnicate"]])
def test_usage_errors_exit_2(capsys, argv):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert "error:" in err


def test_python_dash_m_tiledsl_version():
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-m", "tiledsl", "--version"], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)
    assert (done.returncode, done.stdout) == (0, f"tiledsl {tiledsl.__version__}\n")


# ---- build -----------------------------------------------------------------------------------------

def test_build_dump_after_parse(capsys):
    code, out, _ = run_cli(capsys, "build", COPY, "--dump-after", "parse")
    assert code == 0
    assert out.startswith("Program(name=Name(id='copy'")


@pytest.mark.parametrize("stage", ["schedule", "check"])
def test_build_dump_after_schedule_and_check(capsys, stage):
    code, out, _ = run_cli(capsys, "build", AG_GEMM, "--dump-after", stage)
    assert code == 0
    assert "gather" in out and "mm" in out and "A_all" in out


def test_build_dump_after_stops_at_the_first_error(capsys, broken):
    code, out, err = run_cli(capsys, "build", broken, "--dump-after", "check")
    assert (code, out) == (1, "")
    assert "unknown name 'Z'" in err


@needs_codegen
def test_build_writes_the_module_next_to_the_program(capsys, tmp_path):
    source = tmp_path / "copy.tds"
    source.write_text(Path(COPY).read_text())
    code, out, err = run_cli(capsys, "build", str(source))
    assert code == 0
    written = tmp_path / "copy_tds.py"
    assert err == f"{source}: wrote {written}\n"
    compile(written.read_text(), str(written), "exec")


@needs_codegen
def test_build_to_stdout_with_a_const(capsys):
    code, out, _ = run_cli(capsys, "build", COPY, "-o", "-", "-D", "BLOCK=512")
    assert code == 0
    assert out.startswith("# Generated by tiledsl")
    assert "512" in out


CONSTS = ("program consts\nparam N\nconst B = 4, S = 2\nrequire B % S == 0\nin X : f32[N]\nout Y : f32[N]\n"
          "in Z : f32[2, 8]\nout T : f32[2, 8]\ntile t[i in N/B]: Y[i*B : +B] = X[i*B : +B]\n"
          "tile u[i in 2]: T[i, 0 : B] = Z[i, 0 : +B]\n")


@pytest.mark.parametrize("define, line, message", [
    ("S=3", 4, "error: B % S == 0 is required, and it is not (B = 4, S = 3)"),
    ("B=0", 3, "error: B = 0 is set at build time, but a const must be a positive integer"),
    ("B=16", 10, "error: out of bounds: dimension 1 of 'T' has size 8"),
])
def test_build_checks_the_program_at_the_consts_it_builds_with(capsys, tmp_path, define, line, message):
    path = tmp_path / "consts.tds"
    path.write_text(CONSTS)
    assert run_cli(capsys, "build", str(path), "-o", "-")[0] == 0  # at the program's own consts
    code, out, err = run_cli(capsys, "build", str(path), "-o", "-", "-D", define)
    assert code == 1 and out == ""
    assert err.startswith(f"{path}:{line}:") and message in err


@needs_codegen
def test_build_to_an_unwritable_place_is_an_error_not_a_bug(capsys, tmp_path):
    out = tmp_path / "no" / "such" / "dir" / "x.py"
    code, _, err = run_cli(capsys, "build", COPY, "-o", str(out))
    assert code == 1
    assert err == f"{COPY}: error: cannot write {out}: No such file or directory\n"


def test_build_without_codegen_says_so(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tiledsl.codegen", None)
    code, out, err = run_cli(capsys, "build", COPY, "-o", str(tmp_path / "x.py"))
    assert code == 2
    assert err == f"{COPY}: code generation is not available in this build\n"
    assert not (tmp_path / "x.py").exists()


@needs_codegen
def test_build_arch_prints_the_compile_report(capsys, monkeypatch, tmp_path):
    seen = {}

    def compile_report(source, arch, consts=None):
        seen.update(source=source, arch=arch, consts=consts)
        return "kernel  regs\ntds_kernel  32"

    monkeypatch.setitem(sys.modules, "tiledsl.tools.build_arch", types.SimpleNamespace(compile_report=compile_report))
    code, out, _ = run_cli(capsys, "build", COPY, "-o", str(tmp_path / "x.py"), "--arch", "sm_90", "-D", "BLOCK=256")
    assert code == 0
    assert out == "kernel  regs\ntds_kernel  32\n"
    assert seen == {"source": Path(COPY), "arch": "sm_90", "consts": {"BLOCK": 256}}


@needs_codegen
def test_build_arch_without_the_compiler_report_says_so(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tiledsl.tools.build_arch", None)
    code, _, err = run_cli(capsys, "build", COPY, "-o", str(tmp_path / "x.py"), "--arch", "sm_90")
    assert code == 2
    assert "ahead-of-time compilation (--arch) is not available in this build" in err


# ---- graph -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".dot", ".png", ".svg"])
def test_graph_writes_each_format(capsys, tmp_path, suffix):
    out_path = tmp_path / f"ag_gemm{suffix}"
    code, _, err = run_cli(capsys, "graph", AG_GEMM, "-o", str(out_path))
    assert code == 0
    assert out_path.stat().st_size > 0
    assert err.startswith(f"{AG_GEMM}: wrote {out_path} (")
    if suffix == ".dot":
        assert out_path.read_text().startswith('digraph "ag_gemm" {')


def test_graph_to_an_unwritable_place_is_an_error(capsys, tmp_path):
    out = tmp_path / "no" / "x.dot"
    code, _, err = run_cli(capsys, "graph", COPY, "-o", str(out))
    assert code == 1
    assert err == f"{COPY}: error: cannot write {out}: No such file or directory\n"


def test_graph_refuses_an_unknown_format(capsys, tmp_path):
    code, _, err = run_cli(capsys, "graph", COPY, "-o", str(tmp_path / "x.jpg"))
    assert code == 2
    assert "graph output must end in .png, .svg, .dot" in err


def test_graph_of_a_broken_program_shows_its_errors(capsys, broken, tmp_path):
    code, _, err = run_cli(capsys, "graph", broken, "-o", str(tmp_path / "x.dot"))
    assert code == 1
    assert "unknown name 'Z'" in err


# ---- run -------------------------------------------------------------------------------------------

def test_run_hands_its_arguments_to_the_runtime(capsys, monkeypatch):
    seen = {}

    def main_run(args):
        seen.update(vars(args))
        return 0

    monkeypatch.setitem(sys.modules, "tiledsl.tools.run", types.SimpleNamespace(main_run=main_run))
    code, _, _ = run_cli(capsys, "run", COPY, "--world", "4", "--size", "N=4096", "--size", "M=8", "--emulate",
                         "--seed", "7")
    assert code == 0
    assert {k: seen[k] for k in ("file", "world", "size", "emulate", "seed")} == {
        "file": COPY, "world": 4, "size": ["N=4096", "M=8"], "emulate": True, "seed": 7}


def test_run_without_the_runtime_says_so(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tiledsl.tools.run", None)
    code, _, err = run_cli(capsys, "run", COPY)
    assert code == 2
    assert "`tiledsl run` (the launcher and emulator) is not available yet in this build" in err


@pytest.mark.parametrize("command", ["run", "trace"])
def test_a_size_of_zero_is_refused_as_usage_naming_the_param(capsys, command):
    """`--size N=0` leaves tensors with no elements: refused by name, before anything runs (issue 24, bug 9)."""
    code, out, err = run_cli(capsys, command, COPY, "--size", "N=0")
    assert code == 2
    assert err.splitlines()[-1] == f"tiledsl {command}: error: argument --size: N: a size must be positive, got 0"
    assert "internal error" not in err


def test_an_unknown_dtype_is_the_only_error_not_the_uses_of_its_tensor(capsys, tmp_path):
    path = tmp_path / "dtype.tds"
    path.write_text(Path(COPY).read_text().replace("in  X : bf16[N]", "in  X : bf17[N]"))
    code, _, err = run_cli(capsys, "check", str(path))
    assert code == 1
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert errors == [f"{path}:5:9: error: unknown dtype 'bf17'"]
    assert "hint: did you mean 'bf16'?" in err


REDUCE_TO_ROOT = str(ROOT / "tests" / "corpus" / "reduce_to_root.tds")


@pytest.mark.emulated
def test_run_expect_catches_a_program_that_means_something_else_than_its_author(capsys, tmp_path):
    """The program sums onto rank 0; an author who meant the mean sees a MISMATCH, where the reference
    (the program's own meaning) agrees with the program; an expectation of the sum passes."""
    meant = tmp_path / "mean.py"
    meant.write_text("def expect(inputs, world, sizes):\n"
                     "    return {'Y': [sum(inputs['X']) / world] + [None] * (world - 1)}\n")
    code, out, _ = run_cli(capsys, "run", REDUCE_TO_ROOT, "--size", "N=300", "--expect", str(meant))
    assert code == 1 and "Y: MISMATCH" in out and "against mean.py:expect" in out
    summed = tmp_path / "sum.py"
    summed.write_text("def reduce_to_root(inputs, world, sizes):\n"   # named as the program: found first
                      "    return {'Y': [sum(inputs['X'])] + [None] * (world - 1)}\n"
                      "def expect(inputs, world, sizes):\n    raise AssertionError('not this one')\n")
    code, out, _ = run_cli(capsys, "run", REDUCE_TO_ROOT, "--size", "N=300", "--expect", str(summed))
    assert code == 0 and "Y: ok" in out and "against sum.py:reduce_to_root" in out


@pytest.mark.parametrize("text, message", [
    ("def expect(inputs, world, sizes):\n    return {'Z': []}\n", "returned ['Z']; the program's out and inout tensors are Y"),
    ("def expect(inputs, world, sizes):\n    return {'Y': [inputs['X'][0][:3]] * world}\n", "Y on rank 0 has shape [3]"),
    ("def expect(inputs, world, sizes):\n    return {'Y': [inputs['X'][0]]}\n", "Y must be a list of 2 tensors"),
    ("def expect(inputs, world, sizes):\n    return {'Y': 1 / 0}\n", "raised ZeroDivisionError"),
    ("def other(inputs, world, sizes):\n    pass\n", "defines neither `reduce_to_root` nor `expect`"),
    ("syntax error(\n", "failed to load: SyntaxError"),
])
def test_run_expect_reports_a_bad_expectation_in_one_line_before_any_rank_runs(capsys, tmp_path, text, message):
    path = tmp_path / "bad.py"
    path.write_text(text)
    code, _, err = run_cli(capsys, "run", REDUCE_TO_ROOT, "--size", "N=300", "--expect", str(path))
    assert code == 1 and message in err, err


def test_run_help_documents_the_expect_interface(capsys):
    code, out, _ = run_cli(capsys, "run", "--help")
    assert code == 0 and "--expect EXPECT.py" in out and "def expect(inputs, world, sizes):" in out


@pytest.mark.parametrize("source, world, line, column, message", [
    # checked at worlds 2-4, each right only there: a peer that is rank -1 at world 1, a row 4 of 4 at world 5
    ("program p\nparam N\nin X : f32[N]\nout Y : f32[N]\ntile cp[i in N/4]: Y[i*4 : +4] = X@(world - 2)[i*4 : +4]\n",
     1, 5, 34, "error: no such rank: cp[0] on rank 0 reads 'X'@-1, but ranks are 0..0 (at N=8, world=1)"),
    ("program p\nparam N\nin X : f32[N]\nout Y : f32[N]\nsymm S : f32[4, N]\n"
     "chunk push[s in world] on sms(1): X -> S@s[rank, :]\n"
     "tile add[i in N/4]: Y[i*4 : +4] = sum(S[s, i*4 : +4] for s in world)\nadd[i] after push[*] @ every rank\n",
     5, 7, 41, "error: out of bounds: dimension 0 of 'S' has size 4, but add[0] on rank 0 reads it from 4 (at N=20, "
               "world=5)"),
])
def test_run_proves_the_program_at_its_own_world_before_any_rank_starts(capsys, tmp_path, source, world, line,
                                                                        column, message):
    path = tmp_path / "p.tds"
    path.write_text(source)
    assert run_cli(capsys, "check", str(path))[0] == 0
    code, out, err = run_cli(capsys, "run", str(path), "--emulate", "--world", str(world))
    assert code == 1 and out == ""
    assert err.startswith(f"{path}:{line}:{column}: {message}\n")


def test_run_at_a_world_where_the_sizes_divide_by_zero_is_an_error_naming_the_world(capsys, tmp_path):
    path = tmp_path / "p.tds"
    path.write_text("program p\nparam N\nlet P = N / (world - 1)\nin X : f32[N]\nout Y : f32[N]\n"
                    "tile cp[i in P]: Y[i : +1] = X[i : +1]\n")
    code, out, err = run_cli(capsys, "run", str(path), "--emulate", "--world", "1")
    assert code == 1 and out == ""
    assert err.startswith(f"{path}:1:9: error: the program's sizes divide by zero at world 1\n")


def test_predict_takes_its_consts_through_the_same_checks_as_build(capsys):
    code, out, err = run_cli(capsys, "predict", COPY, "-D", "BLOCK=0")
    assert code == 1 and out == ""
    assert "error: BLOCK = 0 is set at build time, but a const must be a positive integer" in err.splitlines()[0]
