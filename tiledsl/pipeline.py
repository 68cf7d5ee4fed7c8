"""The compiler as a straight line of named stages; `tiledsl build --dump-after STAGE` shows any of them."""
from __future__ import annotations

import pprint
from dataclasses import dataclass, field
from pathlib import Path

from tiledsl.diagnostics import Diagnostic, TdsError
from tiledsl.grammar import ast
from tiledsl.grammar.parser import parse, parse_file

STAGES = ("parse", "schedule", "check", "plan", "module")


@dataclass
class Compilation:
    """What the stages produced so far, and the warnings they reported."""
    path: str
    source: str
    program: ast.Program | None = None
    schedule: object | None = None
    plan: object | None = None
    module: str | None = None
    warnings: list[Diagnostic] = field(default_factory=list)

    def stage(self, name: str):
        return {"parse": self.program, "schedule": self.schedule, "check": self.schedule,
                "plan": self.plan, "module": self.module}[name]


def load(source: str | bytes | Path, path: str | None = None) -> ast.Program:
    """A path (Path, or a str naming an existing .tds file) or the text of a program."""
    if isinstance(source, Path) or (isinstance(source, str) and source.endswith(".tds") and "\n" not in source):
        return parse_file(source)
    return parse(source, path or "<tds>")


def run(source: str | bytes | Path, until: str = "module", consts: dict | None = None,
        path: str | None = None, gpu=None) -> Compilation:
    """Run the stages up to and including `until`; raise TdsError on the first stage with errors. `gpu`
    (a name or a tiledsl.gpus.GPU; the default H200) is what the residency of the kernel's programs is
    proven for."""
    if until not in STAGES:
        raise ValueError(f"unknown stage {until!r}; stages: {', '.join(STAGES)}")
    # parse: text to syntax tree
    program = load(source, path)
    done = Compilation(program.path, program.source, program=program)
    if until == "parse":
        return done
    # schedule: names resolved, shapes and regions typed, edges as index maps
    from tiledsl.schedule import build_schedule
    from tiledsl.schedule.build import at_consts
    done.schedule = build_schedule(program)
    if consts:  # the consts the build sets: what is checked below is what is built
        done.schedule = at_consts(done.schedule, consts)
    # and what the kernel needs of the sizes: TMA's rows, on the tensors the lowering reads through
    # descriptors (decided by code generation, handed down so the schedule layer never imports it)
    from tiledsl.codegen.tma import with_row_conditions
    done.schedule = with_row_conditions(done.schedule)
    if until == "schedule":
        return done
    # check: races, cycles, orphan waits, bounds; errors stop here, warnings travel on
    from tiledsl.schedule.check import check
    diagnostics = check(done.schedule, gpu)
    errors = [d for d in diagnostics if d.severity == "error"]
    if not errors:  # and what code generation can emit: its one rule, refusals at their lines
        from tiledsl.codegen.emittable import refusals
        errors = refusals(done.schedule, consts, gpu=gpu)
    done.warnings = [d for d in diagnostics if d.severity != "error"]
    if errors:
        raise TdsError(errors + done.warnings, program.path, program.source)
    if until == "check":
        return done
    # plan: which programs run which family, signal layout, waits and notifies
    from tiledsl.codegen import LoweringError
    from tiledsl.codegen.emittable import plan_of, refusal
    try:
        done.plan = plan_of(done.schedule, consts, gpu)
    except LoweringError as why:  # what the check stage's refusals did not lower (kept as a backstop)
        raise TdsError([refusal(done.schedule, why)], program.path, program.source) from None
    if until == "plan":
        return done
    # module: the generated Python module (Triton kernels and launcher)
    from tiledsl.codegen import render
    done.module = render(done.plan)
    return done


def dump(compilation: Compilation, stage: str) -> str:
    """A readable text form of one stage's result."""
    value = compilation.stage(stage)
    if isinstance(value, str):
        return value
    if hasattr(value, "describe"):
        return value.describe()
    if stage in ("schedule", "check"):
        from tiledsl.schedule.describe import describe
        return describe(value)
    return pprint.pformat(value, width=110, sort_dicts=False)


__all__ = ["STAGES", "Compilation", "run", "dump", "load", "TdsError"]
