"""Where the program library (`programs/*.tds`) is: the checkout's `programs/` folder, or the copy a
wheel installs under `<prefix>/share/tiledsl/programs`."""
from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent / "programs"


def candidates() -> list[Path]:
    installed = [Path(sysconfig.get_path("data")), Path(sys.prefix)]
    return [CHECKOUT] + [root / "share" / "tiledsl" / "programs" for root in installed]


def programs_dir() -> Path:
    """The first folder that holds the library, or a FileNotFoundError naming where it looked."""
    for folder in candidates():
        if (folder / "allreduce.tds").is_file():
            return folder
    raise FileNotFoundError("tiledsl's program library was not found; looked in "
                            + ", ".join(str(c) for c in candidates()))


def program(name: str) -> Path:
    """The path of library program `name` (`allreduce` or `allreduce.tds`)."""
    path = programs_dir() / (name if name.endswith(".tds") else f"{name}.tds")
    if not path.is_file():
        raise FileNotFoundError(f"no program '{name}' in {path.parent}")
    return path
