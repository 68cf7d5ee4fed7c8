"""Which tests share one expensive set-up, so that pytest-xdist runs them on one worker.

Several modules run one set of emulated ranks (or one sm_90 compile) for many tests, from a fixture
of module scope. Under `pytest -n 2` every worker that runs any of those tests pays for the whole set:
CI's durations showed test_torch_expectations' world-4 set twice (176 and 171 s), world 3 twice (118,
119 s), 2026-12-03. With `--dist loadgroup` (the README's test command and .ci/run) the tests of one
set carry one `xdist_group` and go to one worker; other tests are spread as before. Without xdist the
marks change nothing. pytest 9.2 loses the groups (pytest-dev/pytest-xdist#1386): pyproject.toml keeps
pytest below it."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
# module -> the test parameter whose value picks the shared set (a world, a program); "" where the whole
# module's tests share one (a fixture over every world, or one set of ranks for the module)
SHARED_SETS = {
    "programs/test_torch_expectations.py": "world",
    "programs/test_moe_emulated.py": "world",
    "programs/test_attention_emulated.py": "world",
    "programs/test_collectives_emulated.py": "emulated",  # the fixture's own parameter, the world
    "programs/test_nodes_emulated.py": "",
    "corpus/test_corpus.py": "world",
    "ops/test_ops_emulated.py": "",
    "ops/test_ops_moe_emulated.py": "",
    "ops/test_ops_attention_emulated.py": "",
    "ops/test_ops_subgroup_emulated.py": "",
    "ops/test_ops_tp_block_example.py": "",
    "codegen/test_aot.py": "path",
    "runtime/test_nvshmem_library.py": "",  # the trimmed library, made once (a link of the whole bitcode)
}


def group_of(item) -> str | None:
    """The xdist group of a test: its module and the value of the parameter that picks its shared set."""
    try:
        module = item.path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    if module not in SHARED_SETS:
        return None
    key = SHARED_SETS[module]
    if not key:
        return module
    params = getattr(getattr(item, "callspec", None), "params", {})
    if key not in params:
        return None  # a test of the module that does not use the shared set
    value = params[key]
    return f"{module}::{key}={getattr(value, 'stem', value)}"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marks into the tests' ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
