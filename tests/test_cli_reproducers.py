"""The reproducers of issue 24 (bugs 5, 7, 9) and issue 25's crashes through every command: each ends in
a verdict, a positioned diagnostic or a usage error, never a Python traceback, an internal error or
the interpreter's numpy warnings."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiledsl import cli

ROOT = Path(__file__).parents[1]
sys.path.insert(0, os.fspath(ROOT / "tests" / "schedule"))
sys.path.insert(0, os.fspath(ROOT / "tests" / "runtime"))
from test_carried import CLEARED_FIRST, PUSHED  # noqa: E402
from test_hints import BUFFER_REUSED, READ_THEN_OVERWRITE  # noqa: E402
from test_user_names import NAMED_LIKE_RESOURCES, UPTO_COPY  # noqa: E402

COPY = (ROOT / "programs" / "copy.tds").read_text()
REPRODUCERS = {
    "read_then_overwrite": READ_THEN_OVERWRITE, "buffer_reused": BUFFER_REUSED, "pushed": PUSHED,
    "cleared_first": CLEARED_FIRST, "unknown_dtype": COPY.replace("in  X : bf16", "in  X : bf17"),
    "named_like_resources": NAMED_LIKE_RESOURCES, "upto_copy": UPTO_COPY,
}
RUN = ["named_like_resources", "upto_copy", "pushed"]  # accepted ones whose bug showed when they ran


def commands(path: Path, tmp: Path, name: str) -> list[list[str]]:
    found = [["check", str(path)], ["build", str(path), "-o", str(tmp / "out.py")],
             ["build", str(path), "--dump-after", "plan"], ["graph", str(path), "-o", str(tmp / "g.dot")],
             ["run", str(path), "--size", "N=0"]]
    if name in RUN:
        found += [["run", str(path), "--world", "2"], ["trace", str(path), "--world", "2", "-o", str(tmp / "t")]]
    return found


@pytest.mark.parametrize("name", REPRODUCERS)
def test_no_command_prints_a_traceback_or_an_internal_error(capsys, tmp_path, name):
    path = tmp_path / f"{name}.tds"
    path.write_text(REPRODUCERS[name])
    for argv in commands(path, tmp_path, name):
        code = cli.main(argv)
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err and "internal error" not in err, (argv, err)
        assert code in (0, 1, 2), (argv, code, err)
        if code == 1:
            assert f"{path}:" in err and "error:" in err, (argv, err)  # a positioned diagnostic


def test_an_emulated_run_prints_no_numpy_warning(tmp_path):
    """Padded lanes of a ragged tile divide 0 by 0 in the interpreter; that is no news to the user."""
    path = tmp_path / "divide.tds"
    path.write_text("program divide\nparam N\nconst B = 4\nin  X : f32[N]\nin  Z : f32[N]\nout Y : f32[N]\n"
                    "tile t[i in cdiv(N, B)]: Y[i*B : +B] = X[i*B : +B] / Z[i*B : +B]\n")
    done = subprocess.run([sys.executable, "-m", "tiledsl", "run", str(path), "--world", "1", "--size", "N=3"],
                          capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.fspath(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{path}: Y: ok")
    assert "Warning" not in done.stderr, done.stderr


def test_a_block_over_tritons_element_limit_is_refused_at_its_tile_at_build_for_sm_90(capsys, tmp_path):
    """tests/corpus/attention_scores.tds holds K.T over the whole sequence: at the build's sizes (every
    param 4096) its block is 4096 x 4096 elements, past Triton's 2**20; that was an internal error."""
    pytest.importorskip("triton")
    path = ROOT / "tests" / "corpus" / "attention_scores.tds"
    code = cli.main(["build", str(path), "--arch", "sm_90", "-o", str(tmp_path / "out.py")])
    out, err = capsys.readouterr()
    assert code == 1, (code, err)
    assert "internal error" not in err and "Traceback" not in err, err
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if text.startswith("tile probs"))
    assert f"{path}:{line}:1: error: tile 'probs' holds a block of {4096 * 4096} elements" in err, err
    assert f"more than the {2 ** 20} elements" in err and "TRITON_MAX_TENSOR_NUMEL" in err, err
