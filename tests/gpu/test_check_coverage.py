"""bench/check_coverage.py on CPU: the table it makes from all_checks.py logs (a check passed in any run
counts; one never passed is counted by why it was skipped; FAIL lines are kept with their log)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import check_coverage  # noqa: E402

RUN1 = """all checks: world 2, 2 ranks share 1 GPU
PASS nodes: a -- 1.0 s
SKIP nodes: b -- out of time
SKIP ops: c via torch -- needs NCCL, which refuses two ranks on one GPU
FAIL ops: d -- AssertionError: wrong
"""
RUN2 = """all checks: world 2, 2 ranks share 1 GPU
PASS nodes: b -- 2.0 s
PASS ops: d -- 1.0 s
all checks: world 8, 8 ranks share 1 GPU
SKIP nodes: a -- out of time
"""


def test_a_check_passed_in_any_run_counts_and_the_rest_are_counted_by_why(tmp_path):
    (tmp_path / "1.log").write_text(RUN1)
    (tmp_path / "2.log").write_text(RUN2)
    found = check_coverage.read([tmp_path / "1.log", tmp_path / "2.log"])
    assert found[("nodes", 2)]["passed"] == {"a", "b"}
    assert found[("nodes", 8)]["passed"] == set() and found[("nodes", 8)]["skipped"] == {"a": "out of time"}
    rows = check_coverage.table(found, verbose=True).splitlines()
    assert "| nodes | 8 | 1 | 0 | 1 | 0 | 0 | 0 |" in rows
    assert "| ops | 2 | 2 | 1 | 0 | 1 | 0 | 1 |" in rows
    assert any(r.startswith("ops world 2 FAIL in") and r.endswith("d -- AssertionError: wrong") for r in rows)


def test_a_suite_that_stopped_is_a_fail_line_not_a_check(tmp_path):
    (tmp_path / "1.log").write_text("all checks: world 8, 8 ranks share 1 GPU\nPASS ops: a -- 1.0 s\n"
                                    "FAIL ops: the suite stopped -- RuntimeError: gloo\n")
    found = check_coverage.read([tmp_path / "1.log"])
    assert found[("ops", 8)]["seen"] == {"a"}
    assert "| ops | 8 | 1 | 1 | 0 | 0 | 0 | 1 |" in check_coverage.table(found).splitlines()
