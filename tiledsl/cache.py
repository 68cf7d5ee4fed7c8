"""Where tiledsl keeps what it makes once and reuses: the generated modules of programs (api.build_module) and
the trimmed NVSHMEM device library (runtime.nvshmem_device). TILEDSL_CACHE, else a folder of this user's in
the system's temporary directory."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    path = Path(os.environ.get("TILEDSL_CACHE", Path(tempfile.gettempdir()) / f"tiledsl-{os.getuid()}"))
    path.mkdir(parents=True, exist_ok=True)
    return path
