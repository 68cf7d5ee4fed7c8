"""The `tiledsl` command: check, build, draw and run .tds programs.

Exit codes: 0 success, 1 the program has errors (diagnostics on stderr) or failed when it ran (a
wait that timed out, named by rank, edge and epochs; a tensor it refused), 2 bad usage or a part of
tiledsl that this build lacks, 3 a bug in tiledsl (one line; TILEDSL_TRACEBACK=1 shows the traceback).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import tiledsl
from tiledsl import pipeline
from tiledsl.codegen.body import LoweringError
from tiledsl.diagnostics import TdsError, error
from tiledsl.grammar.ast import Span

OK, ERRORS, UNAVAILABLE, INTERNAL = 0, 1, 2, 3


def _run_errors() -> tuple[type, ...]:
    """What a program's run can fail with that is the program's or the caller's doing, not a bug."""
    from tiledsl.runtime.issue import ScheduleTimeout
    from tiledsl.runtime.validate import LaunchError
    return ScheduleTimeout, LaunchError


RUN_ERRORS = _run_errors()
GRAPH_FORMATS = (".png", ".svg", ".dot")


class Unavailable(Exception):
    """A stage or command that another part of tiledsl provides, missing from this build."""


def main(argv: list[str] | None = None) -> int:
    """Run one tiledsl command; return its exit code (never raises for bad input)."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors: argparse has printed them
        return exc.code if isinstance(exc.code, int) else UNAVAILABLE
    if args.command is None:
        parser.print_help(sys.stderr)
        return UNAVAILABLE
    return args.handler(args)


# ---- commands ----------------------------------------------------------------------------------

def cmd_check(args) -> int:
    gpu = _gpu(args)
    return max(_guarded(path, _check_one, path, gpu) for path in args.files)


def _check_one(path: str, gpu=None) -> int:
    done = pipeline.run(Path(path), until="check", gpu=gpu)
    _print_warnings(done)
    print(f"{path}: ok")
    return OK


def cmd_build(args) -> int:
    return _guarded(args.file, lambda: _build(args))


def _build(args) -> int:
    until = args.dump_after or "module"
    if args.arch and until != "module":
        return _usage_error("--arch compiles the generated module; it cannot follow --dump-after")
    done = pipeline.run(Path(args.file), until=until, consts=dict(args.define), gpu=_gpu(args))
    _print_warnings(done)
    if args.dump_after:
        print(pipeline.dump(done, args.dump_after))
        return OK
    out = args.output or str(_default_output(args.file))
    if out == "-":
        sys.stdout.write(done.module)
    else:
        _write(out, args.file, lambda: Path(out).write_text(done.module))
        print(f"{args.file}: wrote {out}", file=sys.stderr)
    if args.arch:
        try:
            from tiledsl.tools.build_arch import compile_report
        except ImportError as exc:
            raise Unavailable("ahead-of-time compilation (--arch) is not available in this build") from exc
        print(compile_report(Path(args.file), args.arch, dict(args.define)))
    return OK


def _gpu(args):
    """The GPU a build is checked for (`--gpu`, else the one `--arch` stands for): tiledsl.gpus."""
    from tiledsl import gpus
    return gpus.for_arch(getattr(args, "arch", None), getattr(args, "gpu", None))


def _gpu_name(text: str):
    """`--gpu NAME`: a GPU of tiledsl.gpus' table; an unknown name is a usage error."""
    from tiledsl import gpus
    try:
        return gpus.named(text)
    except gpus.UnknownGPU as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _write(out: str, source: str, write):
    """Run `write`; a file that cannot be written is the user's problem (exit 1), not a compiler bug."""
    try:
        return write()
    except OSError as exc:
        raise TdsError([error(f"cannot write {out}: {exc.strerror or exc}", Span.none())], source) from None


def _default_output(path: str) -> Path:
    source = Path(path)
    return source.with_name(source.stem + "_tds.py")


def cmd_graph(args) -> int:
    suffix = Path(args.output).suffix.lower()
    if suffix not in GRAPH_FORMATS:
        return _usage_error(f"graph output must end in {', '.join(GRAPH_FORMATS)}, not '{args.output}'")

    def draw() -> int:
        from tiledsl.graph import draw as draw_graph
        done = pipeline.run(Path(args.file), until="schedule")
        how = _write(args.output, args.file, lambda: draw_graph(done.schedule, args.output))
        print(f"{args.file}: wrote {args.output} ({how})", file=sys.stderr)
        return OK

    return _guarded(args.file, draw)


def cmd_run(args) -> int:
    def run(path) -> int:
        try:
            from tiledsl.tools.run import main_run
        except ImportError as exc:
            raise Unavailable("`tiledsl run` (the launcher and emulator) is not available yet in this build") from exc
        return main_run(argparse.Namespace(**{**vars(args), "file": path}))

    # each program gets its own verdict; the worst exit code stands for all of them
    return max(_guarded(path, run, path) for path in args.files)


def cmd_trace(args) -> int:
    def record() -> int:
        from tiledsl.tools import trace
        sizes = dict(_assignment(s) for s in args.size)
        gpu = "WORLD_SIZE" in os.environ and not args.emulate
        found = trace.trace_gpu(args.file, sizes) if gpu else \
            trace.trace_emulated(args.file, args.world, sizes, nodes=args.nodes)
        if found is None:  # a rank other than 0 under torchrun
            return OK
        out = args.output or str(Path(args.file).with_suffix(""))
        _write(out, args.file, lambda: trace.chrome_trace(found, f"{out}.json"))
        trace.draw(found, f"{out}.png")
        print(trace.summary(found))
        print(f"{args.file}: wrote {out}.json (open at ui.perfetto.dev) and {out}.png", file=sys.stderr)
        return OK

    return _guarded(args.file, record)


def cmd_predict(args) -> int:
    def predict() -> int:
        from tiledsl.predict import load, predict as simulate, report
        from tiledsl.predict.rates import parse_override
        from tiledsl.tools.run_program import launch_sizes
        try:
            rates = load(args.rates, dict(parse_override(t) for t in args.link))
        except (ValueError, OSError) as why:
            return _usage_error(str(why))
        consts = dict(args.define)
        schedule = pipeline.run(Path(args.file), until="schedule", consts=consts).schedule
        nodes = args.nodes or 1
        sizes = launch_sizes(schedule, args.world, dict(_assignment(s) for s in args.size), consts, nodes)
        found = simulate(schedule, args.world, {**sizes, **consts}, rates, nodes)
        print(report.text(found))
        if args.output:
            from tiledsl.tools import trace
            _write(args.output, args.file, lambda: report.chrome_trace(found, f"{args.output}.json"))
            trace.draw(report.events(found), f"{args.output}.png")
            print(f"{args.file}: wrote {args.output}.json (predicted; open at ui.perfetto.dev) and "
                  f"{args.output}.png", file=sys.stderr)
        return OK

    return _guarded(args.file, predict)


def cmd_calibrate(args) -> int:
    def calibrate() -> int:
        from tiledsl.predict.calibrate import run_measured
        from tiledsl.predict.measure import CalibrationError
        try:
            return run_measured(args.output, args.base, log=lambda line: print(line, file=sys.stderr))
        except CalibrationError as why:
            print(f"tiledsl calibrate: {why}", file=sys.stderr)
            return UNAVAILABLE
        except ValueError as why:  # --base names no rates file
            return _usage_error(str(why))

    return _guarded("calibrate", calibrate)


# ---- errors: diagnostics, missing parts, bugs ----------------------------------------------------

def _guarded(path: str, action, *args) -> int:
    """Run one command on one file, turning every failure into a message and an exit code."""
    try:
        return action(*args)
    except TdsError as exc:
        print(exc.render(), file=sys.stderr)
        return ERRORS
    except LoweringError as exc:  # a schedule the checker accepts but code generation cannot emit yet
        print(f"{path}: error: {exc}", file=sys.stderr)
        return ERRORS
    except RUN_ERRORS as exc:  # a wait that timed out, a tensor the program refused: on GPUs
        print(f"{path}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return ERRORS
    except Unavailable as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return UNAVAILABLE
    except ImportError as exc:
        missing = _missing_part(exc)
        if missing is None:
            return _internal(exc)
        print(f"{path}: {missing} is not available in this build", file=sys.stderr)
        return UNAVAILABLE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a compiler bug is reported in one line, not a traceback
        if getattr(exc, "kind", None) in {e.__name__ for e in RUN_ERRORS}:  # an emulated rank's run-time error
            print(f"{path}: error: {exc.kind} on rank {exc.rank}: {exc.message}", file=sys.stderr)
            return ERRORS
        return _internal(exc)


def _missing_part(exc: ImportError) -> str | None:
    """Stages written by other people land at different times: name what is missing."""
    name = exc.name or ""
    if name.startswith("tiledsl.codegen"):
        return "code generation"
    if name.startswith("tiledsl.runtime"):
        return "the runtime"
    if name.startswith("tiledsl.schedule.check") or name.startswith("tiledsl.schedule.meaning"):
        return "the check stage"
    if name.startswith("tiledsl.schedule.describe"):
        return "the schedule printer (--dump-after schedule|check)"
    if name.startswith("tiledsl."):
        return f"'{name}'"
    return None


def _internal(exc: BaseException) -> int:
    if os.environ.get("TILEDSL_TRACEBACK") == "1":
        raise exc
    where = exc.__traceback__
    while where is not None and where.tb_next is not None:
        where = where.tb_next
    site = f" (at {Path(where.tb_frame.f_code.co_filename).name}:{where.tb_lineno})" if where else ""
    message = str(exc).splitlines()[0] if str(exc) else ""
    # Triton's CompilationError says only where ("at 36:12:"); the error it wraps says what
    cause, seen = exc.__cause__ or exc.__context__, 0
    while cause is not None and (cause.__cause__ or cause.__context__) is not None and seen < 8:
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    because = ""
    if cause is not None and str(cause).strip():
        because = f", because {type(cause).__name__}: {str(cause).strip().splitlines()[-1][:300]}"
    print(f"internal error: {type(exc).__name__}: {message[:300]}{site}{because}; "
          "set TILEDSL_TRACEBACK=1 for the traceback", file=sys.stderr)
    return INTERNAL


def _usage_error(message: str) -> int:
    print(f"tiledsl: error: {message}", file=sys.stderr)
    return UNAVAILABLE


def _print_warnings(done: pipeline.Compilation) -> None:
    for warning in done.warnings:
        print(warning.render(done.path, done.source), file=sys.stderr)


# ---- arguments ---------------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _assignment(text: str) -> tuple[str, int]:
    """NAME=VALUE with an integer VALUE, for -D and --size."""
    name, eq, value = text.partition("=")
    if not eq or not _NAME.match(name):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got '{text}'")
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{name}: '{value}' is not a nonnegative integer")
    return name, int(value)


def _size(text: str) -> str:
    """NAME=VALUE for `run --size`, checked here and handed on as written."""
    name, value = _assignment(text)
    if value == 0:  # a param of 0 leaves a tensor with no elements: nothing to run or compare
        raise argparse.ArgumentTypeError(f"{name}: a size must be positive, got 0")
    return text


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return value


EXPECT_HELP = """\
--expect EXPECT.py: the reference computes what the program says; an expectation computes what you
mean it to, in plain torch, so that a program saying something else is caught. EXPECT.py defines a
function named as the program (`program NAME`), or else `expect`:

  def expect(inputs, world, sizes):
      # inputs: {tensor: [rank 0's, rank 1's, ...]} for each in and inout tensor, float64 copies
      # world: the number of ranks; sizes: the params, {"M": 96, "N": 45}
      # returns {tensor: [rank 0's, ...]} for each out and inout tensor, None for a rank's copy
      # that must stay as the caller passed it (a reduce to a root: the other ranks)
      return {"Y": [torch.cat(inputs["X"]) for _ in range(world)]}    # an all-gather

Every call (two, on fresh inputs) is compared, within the output dtype's tolerance.
Example: tiledsl run tests/corpus/swiglu.tds --expect tests/corpus/expectations.py --world 3
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tiledsl", description="Compile .tds programs into distributed GPU kernels that overlap "
                                    "communication with compute.")
    parser.add_argument("--version", action="version", version=f"tiledsl {tiledsl.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    check = commands.add_parser("check", help="check programs for errors, races and deadlocks",
                                description="Parse and check each FILE; print its diagnostics, or 'FILE: ok'.")
    check.add_argument("files", nargs="+", metavar="FILE", help="a .tds program")
    check.add_argument("--gpu", metavar="NAME", type=_gpu_name, help="prove the kernel's programs resident on NAME's SMs "
                                                      "(H200, H100, H100-PCIe, H20, H800; default H200)")
    check.set_defaults(handler=cmd_check)

    build = commands.add_parser("build", help="generate the Python module (Triton kernels and launcher)",
                                description="Compile FILE to a Python module, or show one stage of it.")
    build.add_argument("file", metavar="FILE", help="a .tds program")
    build.add_argument("-o", "--output", metavar="OUT.py",
                       help="where to write the module ('-' for stdout; default: FILE's name + _tds.py)")
    build.add_argument("--dump-after", metavar="STAGE", choices=pipeline.STAGES,
                       help=f"print the result of STAGE ({', '.join(pipeline.STAGES)}) and stop")
    build.add_argument("--arch", metavar="ARCH", help="also compile the kernels for ARCH (e.g. sm_90) and "
                                                      "print their registers, shared memory and spills")
    build.add_argument("--gpu", metavar="NAME", type=_gpu_name, help="the GPU the build is for: its SM count bounds the "
                                                      "resident programs (H200, H100, H100-PCIe, H20, H800; "
                                                      "default: the one ARCH stands for, an H200 for sm_90)")
    build.add_argument("-D", dest="define", metavar="NAME=VALUE", type=_assignment, action="append", default=[],
                       help="set a const or tunable size (repeatable)")
    build.set_defaults(handler=cmd_build)

    graph = commands.add_parser("graph", help="draw the schedule graph",
                                description="Draw FILE's families, tensors and edges.")
    graph.add_argument("file", metavar="FILE", help="a .tds program")
    graph.add_argument("-o", "--output", metavar="OUT", required=True,
                       help="OUT.png or OUT.svg (graphviz `dot` if installed, else matplotlib), or OUT.dot")
    graph.set_defaults(handler=cmd_graph)

    run = commands.add_parser("run", help="run programs on GPUs, or emulated on the CPU",
                              description="Run each FILE on random inputs and compare every output with the torch "
                                          "reference of the program, or with what EXPECT.py computes.",
                              epilog=EXPECT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("files", metavar="FILE", nargs="+", help="a .tds program")
    run.add_argument("--world", type=_positive, default=2, metavar="N",
                     help="number of emulated ranks (default 2; under torchrun, its WORLD_SIZE)")
    run.add_argument("--nodes", type=_positive, default=None, metavar="N",
                     help="the emulated ranks pose as N nodes of world/N ranks (default: TILEDSL_NODES, else 1); "
                          "under torchrun, set TILEDSL_NODES or launch with --nnodes")
    run.add_argument("--size", metavar="NAME=VALUE", type=_size, action="append", default=[],
                     help="a param size (repeatable); the others get small defaults")
    run.add_argument("--emulate", action="store_true", help="run the ranks in Triton's interpreter on the CPU")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    run.add_argument("--expect", metavar="EXPECT.py", help="compare with what this file's function computes "
                                                            "instead of the reference (emulated; see below)")
    run.set_defaults(handler=cmd_run)

    trace = commands.add_parser("trace", help="record every rank's timeline of a call",
                                description="Run FILE traced (emulated, or for real under torchrun) and write "
                                            "OUT.json (Chrome/Perfetto trace) and OUT.png (every rank's lanes).")
    trace.add_argument("file", metavar="FILE", help="a .tds program")
    trace.add_argument("-o", "--output", metavar="OUT", help="output path without suffix (default: FILE's)")
    trace.add_argument("--world", type=_positive, default=2, metavar="N", help="emulated ranks (default 2)")
    trace.add_argument("--nodes", type=_positive, default=None, metavar="N",
                       help="the emulated ranks pose as N nodes (default: TILEDSL_NODES, else 1); under torchrun, "
                            "set TILEDSL_NODES or launch with --nnodes")
    trace.add_argument("--size", metavar="NAME=VALUE", type=_size, action="append", default=[],
                       help="a param size (repeatable)")
    trace.add_argument("--emulate", action="store_true", help="emulate even under torchrun")
    trace.set_defaults(handler=cmd_trace)

    predict = commands.add_parser("predict", help="predict a call's time at any world from the schedule",
                                  description="Simulate FILE's instances on WORLD ranks (SM programs, copy engine, "
                                              "links) with one GPU's rates; print the predicted time, the critical "
                                              "path and each rank's utilisation.")
    predict.add_argument("file", metavar="FILE", help="a .tds program")
    predict.add_argument("--world", type=_positive, default=2, metavar="N", help="ranks (default 2)")
    predict.add_argument("--nodes", type=_positive, default=None, metavar="N", help="nodes the ranks span (default 1)")
    predict.add_argument("--size", metavar="NAME=VALUE", type=_size, action="append", default=[],
                         help="a param size (repeatable); the others get small defaults")
    predict.add_argument("-D", dest="define", metavar="NAME=VALUE", type=_assignment, action="append", default=[],
                         help="set a const or tunable size (repeatable)")
    predict.add_argument("--rates", metavar="FILE.json|MODEL", help="the GPU's rates: a file, or a GPU model "
                                                                    "(its `tiledsl calibrate` file, else a shipped "
                                                                    "one; default: H200's, tiledsl/predict/h200.json)")
    predict.add_argument("--link", metavar="NAME=VALUE", action="append", default=[],
                         help="override one rate (repeatable): nvlink_gbps=900, ib_gbps=25, copy_engines=2, ...")
    predict.add_argument("-o", "--output", metavar="OUT", help="also write OUT.json (Perfetto, marked predicted) "
                                                               "and OUT.png")
    predict.set_defaults(handler=cmd_predict)

    calibrate = commands.add_parser("calibrate", help="measure this GPU's rates for `tiledsl predict`",
                                    description="Measure, on the GPU this machine has, what the predictor's model "
                                                "needs (a call's floor, memory and copy-engine bandwidth, the "
                                                "product tile's rates), each output checked, and write the GPU "
                                                "model's rates file (links keep their documented figures).")
    calibrate.add_argument("-o", "--output", metavar="FILE.json", help="where to write (default: the GPU model's "
                                                                       "file in $TILEDSL_RATES_DIR or "
                                                                       "~/.cache/tiledsl/rates)")
    calibrate.add_argument("--base", metavar="FILE.json", help="the rates the unmeasured figures come from "
                                                               "(default: H200's)")
    calibrate.set_defaults(handler=cmd_calibrate)
    return parser


__all__ = ["main"]
