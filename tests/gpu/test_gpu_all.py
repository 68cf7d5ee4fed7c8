"""bench/gpu_all.sh's verdict, on CPU: `python3` and `torchrun` are stubs on PATH that print what each
test asks for and exit with its code, so the script's counting and summary run for real."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STUB = """#!/usr/bin/env bash
if [ "$1" = "-c" ]; then  # the script asks for the GPU count, then the versions
  case $2 in *device_count*) echo "${STUB_GPUS:-2}" ;; *) echo "torch stub triton stub" ;; esac
  exit 0
fi
for arg in "$@"; do case $arg in *.py) name=$(basename "$arg" .py) ;; esac; done
[ -n "${TILEDSL_NODES:-}" ] && echo "TILEDSL_NODES=$TILEDSL_NODES"
[ -n "${CHECKS_CALLS:-}" ] && echo "CHECKS_CALLS=$CHECKS_CALLS CHECKS_BUDGET_S=$CHECKS_BUDGET_S"
for arg in "$@"; do case $arg in --nproc-per-node=*) echo "ranks ${arg#*=}" ;; esac; done
echo "args: $*"
[ -n "${STUB_SLEEP:-}" ] && sleep "$STUB_SLEEP"
cat "$STUBS/$name.out" 2>/dev/null
exit "$(cat "$STUBS/$name.rc" 2>/dev/null || echo 0)"
"""


def gpu_all(tmp_path, stages, outputs=None, codes=None, old_logs=None, **environ):
    """Run gpu_all.sh on `stages` with stubbed scripts: `outputs` and `codes` by script name."""
    bin_dir, stubs, out = tmp_path / "bin", tmp_path / "stubs", tmp_path / "out"
    for folder in (bin_dir, stubs, out):
        folder.mkdir(exist_ok=True)
    for tool in ("python3", "torchrun"):
        (bin_dir / tool).write_text(STUB)
        (bin_dir / tool).chmod(0o755)
    for name, text in (outputs or {}).items():
        (stubs / f"{name}.out").write_text(text)
    for name, code in (codes or {}).items():
        (stubs / f"{name}.rc").write_text(str(code))
    for name, text in (old_logs or {}).items():
        (out / name).write_text(text)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUBS": str(stubs), "OUT": str(out), **environ}
    env.pop("CHECKS_ONLY", None)
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu_all.sh"), *stages], env=env, capture_output=True,
                          text=True, timeout=120)
    return done.returncode, done.stdout


CLEAN = {"smoke_runtime": "PASS peer_stores\nPASS copy_engine_signals\n",
         "multigpu_checks": "PASS a\nPASS b\n2 run, 0 failed\n"}


def test_a_clean_run_passes_and_ends_with_the_table(tmp_path):
    code, out = gpu_all(tmp_path, ["checks", "gemm"], CLEAN)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[-1] == "ok: 0 FAIL lines, 0 stages exited non-zero"
    assert lines[-5].split() == ["stage", "exit", "PASS", "FAIL", "SKIP", "s"]
    assert [line.split()[:4] for line in lines[-4:-1]] == [
        ["smoke_runtime", "0", "2", "0"], ["checks_world2", "0", "2", "0"], ["gemm_tile", "0", "0", "0"]]


@pytest.mark.parametrize("line", ["FAIL allreduce N=1000 -- UserWarning: ignored", "FAIL x: warn"])
def test_a_fail_line_fails_the_run_and_is_shown_even_from_a_script_that_exits_0(tmp_path, line):
    code, out = gpu_all(tmp_path, ["checks"], {**CLEAN, "multigpu_checks": f"PASS a\n{line}\n"})
    assert code == 1
    assert out.count(line) == 2  # under its stage, and in the summary
    assert f"checks_world2: {line}" in out
    assert out.splitlines()[-1] == "FAILED: 1 FAIL lines, 0 stages exited non-zero"


def test_every_fail_line_is_shown(tmp_path):
    many = "".join(f"FAIL check {n}\n" for n in range(60))
    code, out = gpu_all(tmp_path, ["checks"], {**CLEAN, "multigpu_checks": many})
    assert code == 1 and all(f"checks_world2: FAIL check {n}\n" in out for n in range(60))


def test_a_script_that_exits_nonzero_fails_the_run(tmp_path):
    code, out = gpu_all(tmp_path, ["gemm"], {"bench_gemm": "Traceback\nRuntimeError: boom\n"}, {"bench_gemm": 1})
    assert code == 1 and "!! gemm_tile exited 1" in out and "RuntimeError: boom" in out
    assert out.splitlines()[-1] == "FAILED: 0 FAIL lines, 1 stages exited non-zero"


def test_fail_lines_of_an_earlier_run_left_in_out_do_not_count(tmp_path):
    code, out = gpu_all(tmp_path, ["checks"], CLEAN, old_logs={"overlap_world2.log": "FAIL old\n"})
    assert code == 0 and "FAIL old" not in out


def test_an_unknown_stage_fails(tmp_path):
    code, out = gpu_all(tmp_path, ["checks", "nonsense"], CLEAN)
    assert code == 1 and "unknown stage nonsense" in out


def test_the_moe_stage_runs_its_checks_then_its_benchmark(tmp_path):
    outputs = {"moe_checks": "PASS moe_dispatch T=128\n1 run, 0 failed\n", "bench_moe": "3 outputs checked\n"}
    code, out = gpu_all(tmp_path, ["moe"], outputs)
    assert code == 0, out
    assert [line.split()[:4] for line in out.splitlines()[-3:-1]] == [
        ["moe_checks_world2", "0", "1", "0"], ["moe_world2", "0", "0", "0"]]


def test_the_nodes_stage_runs_the_checks_and_the_benchmark_on_gpus_posing_as_two_nodes(tmp_path):
    stub = ('PASS hier_allgather\nPASS topology 2 nodes x 1 ranks: no pointer to another node\n2 run, 0 failed\n')
    code, out = gpu_all(tmp_path, ["nodes"], {"nodes_checks": stub, "bench_nodes": "3 outputs checked against "
                                                                                   "torch, 0 wrong\n"})
    assert code == 0, out
    assert [line.split()[:4] for line in out.splitlines()[-4:-1]] == [
        ["nodes_checks_world2", "0", "2", "0"], ["nodes_world2", "0", "0", "0"], ["nodes_mlp_world2", "0", "0", "0"]]
    # the stage asks for the pretend topology: TILEDSL_NODES reaches every script
    for log in ("nodes_checks_world2.log", "nodes_world2.log", "nodes_mlp_world2.log"):
        assert (tmp_path / "out" / log).read_text().startswith("TILEDSL_NODES=2\n")


def test_the_attention_stage_runs_its_checks_then_its_benchmark_at_world_2(tmp_path):
    outputs = {"attention_checks": "PASS sp_ag_attention\nPASS flash_decode\n2 run, 0 failed\n",
               "bench_attention": "12 outputs checked against torch, 0 wrong\n"}
    code, out = gpu_all(tmp_path, ["attention"], outputs)
    assert code == 0, out
    assert [line.split()[:4] for line in out.splitlines()[-3:-1]] == [
        ["attention_checks_world2", "0", "2", "0"], ["attention_world2", "0", "0", "0"]]
    code, out = gpu_all(tmp_path, ["attention"], {**outputs, "bench_attention": "FAIL decode B=1 kv=1024\n"})
    assert code == 1 and "attention_world2: FAIL decode B=1 kv=1024" in out


def test_one_gpu_runs_every_suite_in_one_torchrun_a_world_at_2_4_8_then_the_teardown(tmp_path):
    outputs = {"all_checks": "PASS programs: a -- 1.0 s\nSKIP ops: b -- needs NCCL\n1 run, 0 failed\n"}
    code, out = gpu_all(tmp_path, ["checks"], outputs, STUB_GPUS="1")
    assert code == 0, out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] and "_world" in line.split()[0]]
    assert [row[0] for row in rows if len(row) == 6] == ["checks_world2", "checks_world4", "checks_world8",
                                                         "teardown_world2"], out
    assert ["checks_world8", "0", "1", "0", "1"] == next(r[:5] for r in rows if r[0] == "checks_world8")
    log = (tmp_path / "out" / "checks_world8.log").read_text()
    assert "ranks 8" in log and "CHECKS_CALLS=3" in log  # fewer calls at world 8
    # the worlds share the time after the teardown's 100 s: 28, 32 and 40% of 380 s, less 15 s of start-up
    assert "--budget-s 91" in (tmp_path / "out" / "checks_world2.log").read_text()
    assert "--budget-s 137" in log


def test_past_its_deadline_no_run_starts_and_the_run_is_not_ok(tmp_path):
    code, out = gpu_all(tmp_path, ["checks"], {}, STUB_GPUS="1", SHARED_CHECKS_S="30", STUB_SLEEP="6")
    assert code == 1
    assert "not started, the deadline has come" in out and out.splitlines()[-1].endswith("not started (deadline)")
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.split()[:1] and "_world" in
            line.split()[0] and len(line.split()) == 6}
    assert rows["checks_world2"] == "0" and rows["teardown_world2"] == "late", out


def test_the_programs_stage_runs_every_world_then_prints_the_table(tmp_path):
    outputs = {"programs_table": "PASS allreduce world 2 -- Y: ok\nPASS allreduce world 8 -- Y: ok\n"}
    code, out = gpu_all(tmp_path, ["programs"], outputs, STUB_GPUS="1", PROGRAM_WORLDS="2 8")
    assert code == 0, out
    assert [line.split()[:4] for line in out.splitlines()[-2:-1]] == [["programs", "0", "2", "0"]], out
    assert "ranks" not in (tmp_path / "out" / "programs.log").read_text()  # one driver, which starts the torchruns


def test_the_latency_and_ws_stages_run_at_world_1_and_print_their_tables(tmp_path):
    code, out = gpu_all(tmp_path, ["latency", "ws"], {
        "latency_probe": "moe T=128 dispatch 59.4 us a call\nTABLE moe T=128 dispatch+combine = d + c 118.5\n",
        "ws_probe": "| variant | ms | of cuDNN | verdict |\n| masked | 0.800 | 0.66x | right |\n"}, STUB_GPUS="1")
    assert code == 0, out
    assert "TABLE moe T=128 dispatch+combine = d + c 118.5" in out
    assert "| masked | 0.800 | 0.66x | right |" in out
    rows = {line.split()[0]: line.split()[1:3] for line in out.splitlines()[-3:-1]}
    assert rows == {"latency_world1": ["0", "0"], "ws_probe": ["0", "0"]}


def test_the_calibrate_stage_measures_the_rates_into_out(tmp_path):
    code, out = gpu_all(tmp_path, ["calibrate"], STUB_GPUS="1")
    assert code == 0, out
    assert f"args: -m tiledsl calibrate -o {tmp_path / 'out' / 'rates_measured.json'}" in (tmp_path / "out" /
                                                                                          "calibrate.log").read_text()
    assert out.splitlines()[-2].split()[:2] == ["calibrate", "0"]


def test_the_ops_profile_stage_runs_at_world_1_and_prints_its_table(tmp_path):
    table = "PASS ops dispatch\n| call | GPU us | host us |\n| ops dispatch | 90.1 | 80.2 |\n"
    code, out = gpu_all(tmp_path, ["ops_profile"], {"ops_host_profile": table}, STUB_GPUS="1")
    assert code == 0, out
    assert "| ops dispatch | 90.1 | 80.2 |" in out
    assert "ranks 1" in (tmp_path / "out" / "ops_profile_world1.log").read_text()
    assert out.splitlines()[-2].split()[:3] == ["ops_profile_world1", "0", "1"]
