"""`tiledsl run FILE --expect EXPECT.py`: outputs checked against what the author means, in torch.

The reference (tools/reference.py) computes what the program says, from the same schedule that code
generation reads: a program that says something else than its author meant agrees with it. An
expectation is written by the author in plain torch from what the program is for, and sees only the
inputs. EXPECT.py defines a function named as the program (`program NAME`), or else `expect`:

    def expect(inputs, world, sizes):
        # inputs: {tensor: [rank 0's, rank 1's, ...]} for every in and inout tensor, float64 copies
        #         of what each rank was passed (integer tensors as passed)
        # world:  the number of ranks; sizes: the params, {"M": 96, ...}
        # returns {tensor: [rank 0's, ...]} for every out and inout tensor; None for a rank's copy that
        #         the program must leave as the caller passed it (a root collective's other ranks)
        gathered = torch.cat(inputs["X"])
        return {"Y": [gathered for _ in range(world)]}
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch



@dataclass(frozen=True)
class Expectation:
    function: object
    where: str          # "EXPECT.py:NAME", for the verdict line

    def __call__(self, inputs: dict, world: int, sizes: dict) -> dict:
        return self.function(inputs, world, sizes)


def load_expectation(path: str, program: str) -> Expectation:
    """The function of EXPECT.py named as the program, else its `expect`."""
    file = Path(path)
    if not file.is_file():
        raise ExpectationError(f"{path}: no such file")
    spec = importlib.util.spec_from_file_location(f"tds_expect_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's file: say where it failed, no traceback
        raise ExpectationError(f"{path}: failed to load: {type(exc).__name__}: {exc}") from None
    for name in (program, "expect"):
        if callable(getattr(module, name, None)):
            return Expectation(getattr(module, name), f"{file.name}:{name}")
    raise ExpectationError(f"{path}: defines neither `{program}` nor `expect` "
                           "(a function of inputs, world, sizes; `tiledsl run --help`)")


class ExpectationError(Exception):
    """An EXPECT.py that cannot be loaded or whose result does not fit the program's outputs."""


def expected_outputs(expect: Expectation, schedule, inputs: list[dict], world: int, sizes: dict,
                     shapes: list[dict]) -> list[dict]:
    """Every rank's expected outputs of one call, [rank] -> {tensor: float64 tensor or None}, checked
    against the program's out and inout tensors and their shapes."""
    given = {name: [_wide(mine[name]) for mine in inputs] for name in inputs[0]}
    try:
        found = expect(given, world, dict(sizes))
    except Exception as exc:  # noqa: BLE001 - the user's code: one line, where it failed
        raise ExpectationError(f"{expect.where} raised {type(exc).__name__}: {exc}") from None
    outputs = [n for n, t in schedule.tensors.items() if t.role.value in ("out", "inout")]
    if not isinstance(found, dict) or set(found) != set(outputs):
        got = sorted(found) if isinstance(found, dict) else type(found).__name__
        raise ExpectationError(f"{expect.where} returned {got}; the program's out and inout tensors are "
                               f"{', '.join(outputs)}")
    result = [{} for _ in range(world)]
    for name in outputs:
        values = found[name]
        if not isinstance(values, (list, tuple)) or len(values) != world:
            raise ExpectationError(f"{expect.where}: {name} must be a list of {world} tensors, one per rank")
        for rank, value in enumerate(values):
            if value is None and schedule.tensors[name].role.value == "inout":
                raise ExpectationError(f"{expect.where}: {name} is inout: rank {rank}'s value cannot be None")
            if value is not None:
                value = torch.as_tensor(value).double()
                if tuple(value.shape) != tuple(shapes[rank][name]):
                    raise ExpectationError(f"{expect.where}: {name} on rank {rank} has shape {list(value.shape)}; "
                                           f"the program's is {list(shapes[rank][name])}")
            result[rank][name] = value
    return result


def _wide(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.double() if tensor.is_floating_point() else tensor.clone()

