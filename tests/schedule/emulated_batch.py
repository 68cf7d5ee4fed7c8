"""Many programs on one set of emulated ranks: one `run_ranks` call per world for a whole batch, since
starting the rank processes costs more than running a small program. Each rank compiles and runs
every program of the batch in turn; a program that fails (a timed-out wait, say) is recorded and the
next one runs, in lockstep with the other ranks (a host barrier after each program)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tiledsl.runtime.emulate import run_ranks
from tiledsl.tools.reference import Reference
from tiledsl.tools.run_program import EMULATED_DTYPES, Verdict, as_numpy, compare, make_inputs, poison, valid_rows, written_ranks

CALLS = 2  # calls per program, each on fresh inputs


@dataclass
class Job:
    """One program at one world: what every rank gets, and what its outputs must be."""
    source: str
    shapes: list[dict]      # per rank: every tensor's shape
    inputs: list[list]      # per call, per rank: the caller's in and inout tensors
    expected: list[list]    # per call, per rank: every tensor after the call (float64)
    outputs: list[str]      # the out and inout tensors, compared after each call
    dtypes: dict[str, str]  # of the outputs, as emulated
    compared: dict[str, list[int]]  # per output, the ranks whose copy some instance writes (the others
    # keep what the caller passed: NaN here); every rank for inout tensors
    upto: dict[str, str] = None     # per output declared `upto count`: count (elements past it are unspecified)


def job(schedule, source: str, world: int, sizes: dict, seed: int = 0) -> Job:
    reference = Reference(schedule, world, sizes, {}, EMULATED_DTYPES)
    inputs = [make_inputs(schedule, world, sizes, seed + call, EMULATED_DTYPES) for call in range(CALLS)]
    expected = [reference.run(given) for given in inputs]
    outputs = [n for n, t in schedule.tensors.items() if t.role.value in ("out", "inout")]
    dtypes = {n: EMULATED_DTYPES.get(schedule.tensors[n].dtype, schedule.tensors[n].dtype) for n in outputs}
    written = written_ranks(schedule, world, sizes, {})
    compared = {n: [r for r in range(world) if r in written[n] or schedule.tensors[n].role.value == "inout"]
                for n in outputs}
    upto = {n: schedule.tensors[n].upto for n in outputs if schedule.tensors[n].upto is not None}
    return Job(source, [reference.shapes(rank) for rank in range(world)], inputs, expected, outputs, dtypes,
               compared, upto)


def run_batch(jobs: list[Job], world: int, wait_timeout_s: float = 2.0) -> list[list[Verdict] | str]:
    """Per job: a verdict per output and call, or the error that stopped it (with the rank)."""
    # numpy arrays travel by value: torch tensors would take a file descriptor each
    payload = [(j.source, j.shapes, [[{k: as_numpy(t) for k, t in rank.items()} for rank in call] for call in j.inputs])
               for j in jobs]
    # every wait is bounded, so a rank ends; the bound here only catches a crashed rank process
    results = run_ranks(_run_programs, world, payload, wait_timeout_s,
                        timeout_s=120 + len(jobs) * CALLS * (wait_timeout_s * 3 + 10))
    verdicts = []
    for n, j in enumerate(jobs):
        errors = [f"rank {rank}: {results[rank][n]}" for rank in range(world) if isinstance(results[rank][n], str)]
        if errors:
            verdicts.append("; ".join(errors))
            continue
        found = []
        for call in range(CALLS):
            for name in j.outputs:
                ranks = j.compared[name]
                touched = [rank for rank in range(world) if rank not in ranks
                           and not _untouched(torch.from_numpy(results[rank][n][call][name]))]
                if touched:  # written on a rank where no instance writes it
                    found.append(Verdict(name, False, float("inf"), f", call {call + 1}; written on rank {touched[0]}, "
                                                                    "where no instance writes it"))
                    continue
                if not ranks:
                    continue
                got = [torch.from_numpy(results[rank][n][call][name]) for rank in ranks]
                want = [j.expected[call][rank][name] for rank in ranks]
                if j.upto and name in j.upto:  # compared below the count only, as `tiledsl run` does
                    valid = [valid_rows(w.shape, j.expected[call][rank][j.upto[name]]) for w, rank in zip(want, ranks)]
                    got = [torch.where(v, g.double(), 0.0) for g, v in zip(got, valid)]
                    want = [torch.where(v, w, 0.0) for w, v in zip(want, valid)]
                verdict = compare(name, got, want, j.dtypes[name], f", call {call + 1}")
                if not torch.isfinite(torch.cat([g.double().flatten() for g in got])).all():
                    verdict.ok = False  # NaN (never written) or Inf: a failure whatever the tolerance says
                found.append(verdict)
        verdicts.append(found)
    return verdicts


def _untouched(tensor: torch.Tensor) -> bool:
    """Whether an output still holds the poison it was passed (NaN, or an integer type's least value)."""
    if tensor.is_floating_point():
        return bool(torch.isnan(tensor.double()).all())
    return bool((tensor == poison(tensor.dtype)).all())


def _run_programs(heap, payload, wait_timeout_s):
    """One emulated rank: each program compiled and called on poisoned outputs; the error if any. Once a
    call failed on any rank, the program's later calls are skipped on every rank (a failed wait costs
    its whole bound: calling again would only wait again)."""
    import tiledsl
    override = {k: getattr(torch, v) for k, v in EMULATED_DTYPES.items()}
    failed = heap.alloc((len(payload),), torch.int32)  # set on every rank by a rank whose call failed
    results = []
    for number, (source, shapes, inputs) in enumerate(payload):
        outputs, error = [], None
        try:
            program = tiledsl.compile(source, heap, emulated=True, dtype_override=override,
                                      wait_timeout_s=wait_timeout_s)
        except Exception as failure:  # noqa: BLE001 - reported against the program, the batch goes on
            program, error = None, f"{type(failure).__name__}: {failure}"
        for given in inputs if program is not None else ():
            args = {}
            for spec in program.callers:
                dtype = override.get(spec.dtype, getattr(torch, spec.dtype))
                if spec.role == "out":
                    args[spec.name] = torch.full(shapes[heap.rank][spec.name], poison(dtype), dtype=dtype)
                else:
                    args[spec.name] = torch.from_numpy(given[heap.rank][spec.name]).to(dtype)
            try:
                program(**args)
            except Exception as failure:  # noqa: BLE001
                error = f"{type(failure).__name__}: {failure}"
                for rank in range(heap.world):
                    heap.peer(failed, rank)[number] = 1
            outputs.append({s.name: as_numpy(args[s.name]) for s in program.callers
                            if s.role in ("out", "inout")})
            heap.barrier()
            if int(failed[number]):
                error = error or "another rank failed"
                break
        heap.barrier()
        results.append(error if error is not None else outputs)
    heap.close()
    return results
