"""`tiledsl run`: run a program on random inputs and check every output against the torch reference.

Without GPUs (or with --emulate) the ranks are emulated (tools/run_program.py): the generated kernels in
Triton's interpreter, one process per rank. Under torchrun on GPUs the program runs for real
(tools/gpu_run.py)."""
from __future__ import annotations

import os
import sys

import torch

from tiledsl.tools.expect import ExpectationError, load_expectation
from tiledsl.tools.run_program import program_schedule, run_emulated

EMULATED_WORLD = 2  # ranks when `tiledsl run` is given no --world


def main_run(args) -> int:
    """The `tiledsl run` command: print one verdict line per output; 1 on a mismatch."""
    sizes = dict(parse_size(s) for s in (args.size or []))
    gpu = torch.cuda.is_available() and "WORLD_SIZE" in os.environ and not args.emulate
    expect_path = getattr(args, "expect", None)
    if gpu and expect_path:
        print(f"{args.file}: error: --expect runs on emulated ranks only (add --emulate)", file=sys.stderr)
        return 1
    if gpu:
        from tiledsl.tools.gpu_run import run_gpu  # torch.distributed only under torchrun
        verdicts = run_gpu(args.file, sizes, args.seed)
    else:
        try:
            expect = load_expectation(expect_path, program_schedule(args.file).name) if expect_path else None
            verdicts = run_emulated(args.file, args.world or EMULATED_WORLD, sizes, args.seed,
                                    nodes=getattr(args, "nodes", None), expect=expect)
        except ExpectationError as exc:
            print(f"{args.file}: error: {exc}", file=sys.stderr)
            return 1
    if not gpu or torch.distributed.get_rank() == 0:  # under torchrun every rank has the same verdicts
        for verdict in verdicts:
            print(f"{args.file}: {verdict.line()}", flush=True)
    return 0 if all(v.ok for v in verdicts) else 1


def parse_size(text: str) -> tuple[str, int]:
    name, _, value = text.partition("=")
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not name or number <= 0:
        raise ValueError(f"--size takes NAME=POSITIVE_INTEGER, got {text!r}")
    return name, number
