"""tests/conftest.py's xdist groups: the tests of one shared set of emulated ranks run on one worker."""
from pathlib import Path
from types import SimpleNamespace

from conftest import ROOT, SHARED_SETS, group_of


def _item(module: str, **params):
    return SimpleNamespace(path=ROOT / module, callspec=SimpleNamespace(params=params))


def test_every_module_named_for_a_shared_set_exists():
    assert [m for m in SHARED_SETS if not (ROOT / m).is_file()] == []


def test_a_worlds_tests_share_one_group_and_other_worlds_and_modules_do_not():
    four = {group_of(_item("programs/test_torch_expectations.py", name=n, world=4)) for n in ("ag_gemm", "copy")}
    assert len(four) == 1 and None not in four
    assert group_of(_item("programs/test_torch_expectations.py", name="ag_gemm", world=3)) not in four
    assert group_of(_item("corpus/test_corpus.py", name="ag_gemm", world=4)) not in four
    assert group_of(_item("programs/test_torch_expectations.py")) is None  # no world: no shared set
    assert group_of(_item("ops/test_ops_emulated.py", case="x")) == group_of(_item("ops/test_ops_emulated.py"))
    assert group_of(_item("codegen/test_aot.py", path=Path("programs/gemm.tds"))) == "codegen/test_aot.py::path=gemm"
    assert group_of(_item("schedule/test_bodies.py", first=0, stop=50)) is None


def test_pytest_is_one_whose_test_ids_keep_xdists_group():
    # on pytest 9.2 `--dist loadgroup` silently spreads a group over the workers (pytest-dev/pytest-xdist#1386):
    # each worker would pay for a whole set of emulated ranks again
    import pytest
    assert tuple(int(p) for p in pytest.__version__.split(".")[:2]) < (9, 2), pytest.__version__
