"""What code generation can emit, decided in one place: the lowering itself. The checker runs it on
every schedule it accepts (pipeline's check stage) and reports its refusals as positioned errors with
hints, so that an accepted program always builds and no LoweringError reaches a user later. The plan
is kept for the build that follows (a lowering is the slowest part of checking some programs)."""
from __future__ import annotations

from tiledsl import gpus
from tiledsl.codegen.body import LoweringError
from tiledsl.codegen.plan import KernelPlan, lower
from tiledsl.diagnostics import Diagnostic, error
from tiledsl.schedule import ir

# the plans of the last few (path, source, consts) checked: the same text always lowers to the same plan
_PLANS: dict[tuple, KernelPlan] = {}
_KEPT = 64


def refusals(schedule: ir.Schedule, consts: dict | None = None, gpu=None) -> list[Diagnostic]:
    """Why code generation cannot emit `schedule` (with `consts`, for `gpu`): one positioned error, or none."""
    try:
        plan_of(schedule, consts, gpu)
    except LoweringError as why:
        return [refusal(schedule, why)]
    return []


def plan_of(schedule: ir.Schedule, consts: dict | None = None, gpu=None) -> KernelPlan:
    """The kernel plan of `schedule` (raises LoweringError), lowered once per program text, consts and
    GPU (tiledsl.gpus: its SM count bounds the programs)."""
    key = (schedule.program.path, schedule.program.source, tuple(sorted((consts or {}).items())),
           gpus.named(gpu).name)
    if key not in _PLANS:
        plan = lower(schedule, consts, gpu=gpu)
        while len(_PLANS) >= _KEPT:
            del _PLANS[next(iter(_PLANS))]
        _PLANS[key] = plan
    return _PLANS[key]


def refusal(schedule: ir.Schedule, why: LoweringError) -> Diagnostic:
    return error(str(why), why.span if why.span is not None else schedule.program.name.span, why.hint)
