"""Rendering: a kernel plan becomes one Python module (Triton kernels and host launcher) through the
Jinja templates beside this file. Every decision is already in the plan; templates only fill holes."""
from __future__ import annotations

import functools
from pathlib import Path

import jinja2

from tiledsl.codegen.plan import KernelPlan


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    # repr() quotes every user-derived string, so a path or message can never become code
    env.filters["pyrepr"] = repr
    return env


def render(plan: KernelPlan) -> str:
    """The text of the generated module for `plan`."""
    names = list(plan.params) + ["rank", "world"] + list(plan.consts)
    unpack = "\n".join(f"    {n} = tds_env[{n!r}]" for n in names)
    blocks = [b for f in plan.families for b in f.blocks]
    scalar_args = ", ".join([f"tds_a[{n!r}]" for n in plan.params + ["rank", "world", "tds_epoch_cell", "tds_diag", "tds_max_spins"]]
                            + [f"{n}=tds_a[{n!r}]" for n in list(plan.consts) + blocks])
    text = _environment().get_template("module.py.jinja").render(
        name=plan.name, path=plan.path, source_hash=plan.source_hash, version=plan.version,
        tensors=plan.tensors, families=plan.families, kernel_families=plan.kernel_families,
        copy_families=plan.copy_families, signalled=plan.signalled,
        ordered=[f for f in plan.kernel_families if f.ordered],
        counted=[f for f in plan.kernel_families if f.counted],
        matmuls=[f for f in plan.kernel_families if f.matmul], params=plan.params, consts=plan.consts,
        blocks=blocks, edges=plan.edges, param_sources=plan.param_sources, conditions=plan.conditions,
        distributed=plan.distributed, uses_nvshmem=plan.uses_nvshmem, unpack=unpack,
        scalar_args=scalar_args)
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
