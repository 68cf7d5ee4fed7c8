"""The program library is found from a checkout and from an installed wheel."""
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tiledsl import library

ROOT = Path(__file__).resolve().parents[1]


def test_a_checkout_finds_its_own_programs_folder():
    assert library.programs_dir() == ROOT / "programs"
    assert library.program("allreduce") == library.program("allreduce.tds") == ROOT / "programs" / "allreduce.tds"


def test_an_installed_library_is_found_when_there_is_no_checkout(tmp_path, monkeypatch):
    installed = tmp_path / "share" / "tiledsl" / "programs"
    installed.mkdir(parents=True)
    (installed / "allreduce.tds").write_text((ROOT / "programs" / "allreduce.tds").read_text())
    monkeypatch.setattr(library, "CHECKOUT", tmp_path / "no-checkout")
    monkeypatch.setattr(library.sys, "prefix", str(tmp_path))
    assert library.programs_dir() == installed
    with pytest.raises(FileNotFoundError, match="no program 'nothing'"):
        library.program("nothing")


def test_a_missing_library_names_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setattr(library, "CHECKOUT", tmp_path / "no-checkout")
    monkeypatch.setattr(library.sys, "prefix", str(tmp_path))
    monkeypatch.setattr(library.sysconfig, "get_path", lambda name: str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no-checkout"):
        library.programs_dir()


def test_the_wheel_carries_every_program(tmp_path):
    # build with the installed setuptools where there is one (fast, offline), else in isolation
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q",
                    "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("tiledsl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    carried = {Path(n).name for n in names if "/data/share/tiledsl/programs/" in n}
    assert carried == {p.name for p in (ROOT / "programs").glob("*.tds")}
    assert any(n.endswith("tiledsl/grammar/tiledsl.lark") for n in names)
