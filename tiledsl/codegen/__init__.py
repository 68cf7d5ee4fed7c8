"""Code generation: `lower(schedule) -> KernelPlan`, then `render(plan) -> str` (a Python module)."""
from tiledsl.codegen.plan import KernelPlan, lower
from tiledsl.codegen.render import render
from tiledsl.codegen.body import LoweringError

__all__ = ["KernelPlan", "LoweringError", "lower", "render"]
