"""Launch-time validation: the caller's tensors bound by name and checked against the program's
declarations before anything runs, so that a wrong tensor is named at its source."""
from __future__ import annotations

import torch

from tiledsl.runtime.specs import ROW_BYTES, row_refusal, rows_fit


class LaunchError(ValueError):
    """A caller's tensor or size does not fit the program; the message names which and why."""


def bind(program_name: str, callers, args, kwargs) -> dict[str, torch.Tensor]:
    """The caller's tensors by name, from positional and keyword arguments."""
    names = [t.name for t in callers]
    if len(args) > len(names):
        raise LaunchError(f"{program_name} takes {len(names)} tensors ({', '.join(names)}), "
                          f"got {len(args)}")
    bound = dict(zip(names, args))
    for name, value in kwargs.items():
        if name not in names:
            raise LaunchError(f"unknown tensor '{name}'; the program takes {', '.join(names)}")
        if name in bound:
            raise LaunchError(f"tensor '{name}' given twice")
        bound[name] = value
    missing = [n for n in names if n not in bound]
    if missing:
        raise LaunchError(f"missing tensor(s) {', '.join(missing)}; the program takes {', '.join(names)}")
    for spec in callers:
        if not isinstance(bound[spec.name], torch.Tensor):
            raise LaunchError(f"'{spec.name}' must be a torch.Tensor, got {type(bound[spec.name]).__name__}")
    return bound

def sizes(program, callers, tensors: dict[str, torch.Tensor], rank: int, world: int, dtype_override: dict,
          device, topology=None) -> dict:
    """The program's sizes (`program`: its ProgramSpec) from the tensors' shapes, after checking every
    tensor against its declaration: dimensions, launch conditions, shape, dtype, contiguity and device,
    each failure naming the tensor."""
    nodes, local_world = (topology.nodes, topology.local_world) if topology is not None else (1, world)
    shapes = {n: tuple(t.shape) for n, t in tensors.items()}
    ranks_of = {name: len(shape) for name, shape in program.tensor_shapes(_dummy_env(program, world)).items()}
    for spec in callers:
        expected_rank = ranks_of[spec.name]
        if len(shapes[spec.name]) != expected_rank:
            raise LaunchError(f"tensor '{spec.name}' ({spec.where}): expected {expected_rank} dimensions, "
                              f"got shape {list(shapes[spec.name])}")
    env = {"rank": rank, "world": world, "nodes": nodes, "local_world": local_world, **program.consts}
    try:
        env.update(program.infer_params(shapes, world))
    except ZeroDivisionError:
        raise LaunchError("a tensor has a zero-sized dimension") from None
    for ok, message in program.conditions(env):
        if not ok:
            detail = ", ".join(f"{p}={env[p]}" for p in program.params)
            raise LaunchError(f"{message}; got {detail}, world={world}")
    expected = program.tensor_shapes(env)
    for spec in callers:
        tensor = tensors[spec.name]
        want_dtype = dtype_override.get(spec.dtype, getattr(torch, spec.dtype))
        if tuple(tensor.shape) != tuple(expected[spec.name]):
            raise LaunchError(f"tensor '{spec.name}' ({spec.where}): expected shape {list(expected[spec.name])}, "
                              f"got {list(tensor.shape)}")
        if tensor.dtype != want_dtype:
            raise LaunchError(f"tensor '{spec.name}' ({spec.where}): expected dtype {want_dtype}, got {tensor.dtype}")
        if not tensor.is_contiguous():
            raise LaunchError(f"tensor '{spec.name}' ({spec.where}): must be contiguous (call .contiguous())")
        if tensor.device != device:
            raise LaunchError(f"tensor '{spec.name}' ({spec.where}): expected device {device}, "
                              f"got {tensor.device}")
    _tma_rows(program, expected, tensors, dtype_override)
    return env


def _tma_rows(program, shapes: dict, tensors: dict, dtype_override: dict) -> None:
    """A matrix product reads its operands (and may write its result) through TMA descriptors, which
    need rows of a multiple of 16 bytes and 16-byte aligned bases (runtime/specs.py, the rule that
    `tiledsl run` and the default sizes meet too): say so before Triton asserts."""
    where = {t.name: t.where for t in program.tensors}
    for arg in program.args:
        if arg.kind != "descriptor":
            continue
        # judged in the dtype the tensor has here (a dtype override's), named as tables.DTYPES names it
        dtype = dtype_override.get(arg.dtype, getattr(torch, arg.dtype))
        name = str(dtype).removeprefix("torch.")
        columns = shapes[arg.of][-1]
        if not rows_fit(columns, dtype.itemsize):
            raise LaunchError(row_refusal(arg.of, where[arg.of], columns, name, arg.dtype))
        if arg.of in tensors and tensors[arg.of].data_ptr() % ROW_BYTES:
            raise LaunchError(f"tensor '{arg.of}' ({where[arg.of]}): its data must start at a 16-byte aligned address "
                              "(a TMA descriptor reads it); pass a tensor that does not start mid-allocation")

def _dummy_env(program, world: int) -> dict:
    """Sizes that only serve to count each tensor's dimensions."""
    env = {"rank": 0, "world": max(1, world), "nodes": 1, "local_world": max(1, world), **program.consts}
    env.update({p: world * 4096 for p in program.params})
    return env
