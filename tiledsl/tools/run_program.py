"""A program on emulated ranks, on random inputs, every output checked against the torch reference
(tools/reference.py) or an expectation (tools/expect.py): the generated kernels in Triton's interpreter,
one process per rank. The inputs, sizes, tolerances and comparisons here are also what a run on GPUs
(tools/gpu_run.py) checks by; `tiledsl run` itself is tools/run.py."""
from __future__ import annotations

import os
from dataclasses import dataclass

import sympy
import torch

import tiledsl
from tiledsl import pipeline
from tiledsl.api import build_module, load_built
from tiledsl.codegen.tma import row_conditions
from tiledsl.diagnostics import TdsError, error
from tiledsl.runtime import emulate
from tiledsl.schedule import ir
from tiledsl.schedule.check import check_at
from tiledsl.schedule.meaning import compile_exprs, default_sizes, instantiate, size_symbols, size_values
from tiledsl.tables import DTYPES
from tiledsl.tools.expect import expected_outputs
from tiledsl.tools.reference import Reference, evaluate
from tiledsl.topology import NODES_VARIABLE

# Emulation runs bf16 tensors as float32. Triton 3.9's interpreter multiplied bf16 bit patterns in `tl.dot`
# (triton-lang/triton#11584); runtime/interpreter_fixes.py now widens them, so bf16 runs right emulated
# too (`tiledsl run` with this map emptied: ag_gemm, gemm_rs, allreduce, sp_ag_attention, moe_dispatch ok
# at world 2, 2026-12-03), but the emulated tests build float32 inputs by this map: moving them is open.
EMULATED_DTYPES = {"bfloat16": "float32"}
TOLERANCE = {name: dtype.tolerance for name, dtype in DTYPES.items()}


@dataclass
class Verdict:
    tensor: str
    ok: bool
    max_error: float
    note: str

    def line(self) -> str:
        mark = "ok" if self.ok else "MISMATCH"
        return f"{self.tensor}: {mark} (max relative error {self.max_error:.2e}{self.note})"


def make_inputs(schedule, world: int, sizes: dict, seed: int, dtype_map: dict, consts: dict | None = None,
                nodes: int = 1) -> list[dict]:
    """Random inputs for every rank: normal values, for an integer tensor of ids values its uses accept
    (`id_bounds`), distinct along each row where a row can hold distinct ones (a top-k), and for counts
    declared with a cap values 0 .. cap."""
    reference = Reference(schedule, world, sizes, consts, nodes=nodes)
    generator = torch.Generator().manual_seed(seed)
    bounds = {name: evaluate(bound, reference.env) for name, bound in id_bounds(schedule).items()}
    inputs = []
    for rank in range(world):
        shapes = reference.shapes(rank)
        tensors = {}
        for name, tensor in schedule.tensors.items():
            if tensor.role.value in ("in", "inout"):
                dtype = getattr(torch, dtype_map.get(tensor.dtype, tensor.dtype))
                if name in bounds:
                    tensors[name] = random_ids(shapes[name], bounds[name], generator).to(dtype)
                elif tensor.cap is not None:  # counts given by the caller: 0 .. cap, as declared
                    cap = evaluate(tensor.cap, reference.env)
                    tensors[name] = torch.randint(0, cap + 1, tuple(shapes[name]), generator=generator).to(dtype)
                else:
                    tensors[name] = torch.randn(shapes[name], generator=generator).to(dtype)
        inputs.append(tensors)
    return inputs


def id_bounds(schedule) -> dict:
    """The integer inputs used as ids, and the bound each use puts on them: routed into n groups
    (`histogram(ids, n)`), or a point index into a dimension (its extent), or copied by a chunk into
    a tensor so used; the smallest of them."""
    found: dict = {}

    def bound(tensor: str, value) -> None:
        found[tensor] = value if tensor not in found else sympy.Min(found[tensor], value)

    for family in schedule.families.values():
        for store in family.stores:
            if isinstance(store.value, ir.Route):
                bound(store.value.source.tensor, store.value.bins)
        for region in family.reads + family.writes:
            shape = schedule.tensors[region.tensor].shape
            for n, dim in enumerate(region.dims):
                for value in ir.device_values(dim.start):
                    if dim.start == value:
                        bound(ir.value_tensor(value), shape[n])
    for _ in schedule.families:  # ids copied on by chunks take their copies' bounds
        for family in schedule.families.values():
            source, target = family.reads[0].tensor if family.reads else None, family.writes[0].tensor
            if family.kind is ir.Kind.CHUNK and target in found and found.get(source) != found[target]:
                bound(source, found[target])
    return {name: value for name, value in found.items() if schedule.tensors[name].role.value in ("in", "inout")}


def random_ids(shape, bound: int, generator) -> torch.Tensor:
    """Ids below `bound`, distinct along the last dimension where it is no longer than the bound."""
    if len(shape) >= 1 and shape[-1] <= bound:
        rows = int(torch.Size(shape[:-1]).numel())
        return torch.rand(rows, bound, generator=generator).argsort(dim=1)[:, :shape[-1]].reshape(shape)
    return torch.randint(0, bound, tuple(shape), generator=generator)


def _emulated_rank(heap, source: str, consts: dict, shapes: list[dict], calls: list[list[dict]], dtype_map: dict,
                   timeout_s: float, built: str | None = None):
    """One emulated rank: compile in the interpreter, then one call per input set, each on fresh inputs
    copied into the same tensors (so later calls take the prepared path) with poisoned outputs;
    returns every call's outputs."""
    outputs = _emulated_calls(heap, source, consts, shapes, calls, dtype_map, timeout_s, built)
    heap.close()
    return outputs


def _emulated_ranks(heap, jobs: list[tuple]):
    """One emulated rank running several programs in turn on one heap (`run_together`)."""
    outputs = [_emulated_calls(heap, *job) for job in jobs]
    heap.close()
    return outputs


def _emulated_calls(heap, source: str, consts: dict, shapes: list[dict], calls: list[list[dict]], dtype_map: dict,
                    timeout_s: float, built: str | None = None):
    """`_emulated_rank`'s work; `built`: the path of the module the parent built (api.build_module)."""
    override = {k: getattr(torch, v) for k, v in dtype_map.items()}
    options = {"emulated": True, "dtype_override": override, "wait_timeout_s": timeout_s}
    program = load_built(built).tds_load(heap=heap, **options) if built else \
        tiledsl.compile(source, heap, **options, **consts)
    shapes = shapes[heap.rank]
    args = {spec.name: torch.empty(shapes[spec.name], dtype=override.get(spec.dtype, getattr(torch, spec.dtype)))
            for spec in program.callers}
    outputs = []
    for inputs in calls:
        for spec in program.callers:
            if spec.role == "out":
                args[spec.name].fill_(poison(args[spec.name].dtype))  # an element never written shows up
            else:
                args[spec.name].copy_(torch.as_tensor(inputs[heap.rank][spec.name]))
        program(**args)
        # numpy arrays travel back by value; torch tensors would be shared through this process's fds
        outputs.append({s.name: as_numpy(args[s.name]) for s in program.callers if s.role in ("out", "inout")})
    return outputs


def as_numpy(tensor: torch.Tensor):
    """A copy as a numpy array; fp8 and bf16, which numpy lacks, as the float32 values they hold (exactly)."""
    if tensor.is_floating_point() and (tensor.element_size() == 1 or tensor.dtype == torch.bfloat16):
        tensor = tensor.float()
    return tensor.numpy().copy()


def poison(dtype: torch.dtype) -> float | int:
    """What outputs hold before a call: NaN, or for integers their most negative value (no count or
    index is negative, so an element left so was never written)."""
    return float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min


def still_as_passed(got: torch.Tensor) -> bool:
    """Whether an output holds only the poison it was passed with (NaN, or an integer's minimum)."""
    if got.dtype.is_floating_point:
        return bool(torch.isnan(got.double()).all())
    return bool((got == poison(got.dtype)).all())


def left_as_passed(world: int, written: set[int]) -> str:
    """The verdict's note for an output that some ranks do not write: which ranks must keep it as passed."""
    kept = [r for r in range(world) if r not in written]
    return f"; left as passed on rank{'s' if len(kept) > 1 else ''} {', '.join(map(str, kept))}"


def program_schedule(source: str, consts: dict | None = None):
    """The checked schedule, at the consts the run builds with."""
    return pipeline.run(source, until="check", consts=consts).schedule


def run_emulated(source: str, world: int, sizes: dict | None = None, seed: int = 0, calls: int = 2,
                 consts: dict | None = None, timeout_s: float = 20.0, nodes: int | None = None,
                 expect=None) -> list[Verdict]:
    """Run a program on `world` emulated ranks (in `nodes` nodes: default TILEDSL_NODES, else one), `calls`
    times on fresh random inputs each, and compare every call's outputs with the reference, or with
    `expect(inputs, world, sizes)` where given (tiledsl.tools.expect). Fresh inputs matter: a wait
    that let a consumer through too early on a later call would otherwise read the last call's
    identical data and pass."""
    run = EmulatedRun.prepare(source, world, sizes, seed, calls, consts, timeout_s, nodes, expect)
    return run.verdicts(emulate.run_ranks(_emulated_rank, world, *run.job(), nodes=run.nodes))


def run_together(runs: list["EmulatedRun"], timeout_s: float = 600.0) -> list:
    """Several prepared runs of one world (and topology) in one set of rank processes, each program in
    turn: the ranks pay once for starting. Returns each run's verdicts, or the exception it failed with;
    a failure stops the set, so then each run is repeated alone to lay it at its program's door."""
    if not runs:
        return []
    try:
        per_rank = emulate.run_ranks(_emulated_ranks, runs[0].world, [run.job() for run in runs], timeout_s=timeout_s,
                             nodes=runs[0].nodes)
    except RuntimeError as failure:
        if len(runs) == 1:
            return [failure]
        return [found for run in runs for found in run_together([run], timeout_s)]
    return [run.verdicts([mine[n] for mine in per_rank]) for n, run in enumerate(runs)]


@dataclass
class EmulatedRun:
    """One program at one world, ready to run: its sizes, every call's inputs and expected outputs
    (None for a rank's copy that nothing should write)."""
    source: str
    schedule: object
    world: int
    nodes: int
    sizes: dict
    consts: dict
    calls: int
    timeout_s: float
    inputs: list          # [call][rank] -> {tensor: value}
    expected: list        # the same indices; a value None: this rank's copy is not written
    shapes: list          # [rank] -> {tensor: shape}
    against: str          # what the outputs are compared with, for the verdict line
    built: str            # the generated module's path (api.build_module), which every rank imports
    covered: list         # [call][rank] -> {output: bool tensor}, the elements some instance stores to

    @classmethod
    def prepare(cls, source: str, world: int, sizes: dict | None = None, seed: int = 0, calls: int = 2,
                consts: dict | None = None, timeout_s: float = 20.0, nodes: int | None = None,
                expect=None) -> "EmulatedRun":
        consts = consts or {}
        schedule = program_schedule(source, consts)
        nodes = nodes if nodes is not None else int(os.environ.get(NODES_VARIABLE) or 1)
        sizes = launch_sizes(schedule, world, sizes or {}, consts, nodes)
        inputs = [make_inputs(schedule, world, sizes, seed + 1000 * call, EMULATED_DTYPES, consts, nodes)
                  for call in range(calls)]
        reference = Reference(schedule, world, sizes, consts, EMULATED_DTYPES, nodes)
        shapes = [reference.shapes(rank) for rank in range(world)]
        outputs = [n for n, t in schedule.tensors.items() if t.role.value in ("out", "inout")]
        # the reference runs with an expectation too: which elements the program's meaning writes tells a
        # NaN the kernel computed from one nothing wrote
        results, covered = [], []
        for each in inputs:
            results.append(reference.run(each))
            covered.append([{n: mine[n] for n in outputs} for mine in reference.written])
        if expect is None:
            written = written_ranks(schedule, world, sizes, consts, nodes)
            expected = [[{n: got[n] if rank in written[n] or schedule.tensors[n].role.value != "out" else None
                          for n in outputs} for rank, got in enumerate(each)] for each in results]
            against = ""
        else:
            expected = [expected_outputs(expect, schedule, each, world, sizes, shapes) for each in inputs]
            against = f"; against {expect.where}"
        built = build_module(source, consts).__file__  # once here, not once a rank; a build error before any rank
        return cls(os.fspath(source), schedule, world, nodes, sizes, consts, calls, timeout_s, inputs, expected,
                   shapes, against, built, covered)

    def job(self) -> tuple:
        """`_emulated_calls`'s arguments after the heap."""
        # inputs as numpy, by value: a torch tensor takes a file descriptor to the ranks, and the
        # forkserver passes fewer than 256 (run_together sends every program of a world at once)
        inputs = [[{n: as_numpy(t) for n, t in mine.items()} for mine in call] for call in self.inputs]
        return self.source, self.consts, self.shapes, inputs, EMULATED_DTYPES, self.timeout_s, self.built

    def verdicts(self, results: list) -> list[Verdict]:
        """Every output's verdict from every rank's results (`results[rank][call][tensor]`)."""
        schedule, world, calls, expected = self.schedule, self.world, self.calls, self.expected
        verdicts = []
        for name, tensor in schedule.tensors.items():
            if tensor.role.value not in ("out", "inout"):
                continue
            untouched = [rank for rank in range(world) if expected[0][rank][name] is None]
            if untouched:
                # no instance writes this rank's copy (a family with `if rank == ...`): it keeps what the
                # caller passed, the poison here; the other ranks are compared
                left = [rank for rank in untouched for call in range(calls)
                        if not still_as_passed(torch.from_numpy(results[rank][call][name]))]
                if left:
                    verdicts.append(Verdict(name, False, float("inf"), f", world {world}; written on rank "
                                                                        f"{left[0]}, where nothing should write it"))
                    continue
                if len(untouched) == world:
                    verdicts.append(Verdict(name, True, 0.0, f", world {world}; no rank writes it"))
                    continue
            emulated = EMULATED_DTYPES.get(tensor.dtype, tensor.dtype)
            dtype = rounded_dtype(schedule, name, emulated)
            where = f"world {world}" if self.nodes == 1 else f"{self.nodes} nodes x {world // self.nodes}"
            note = f", {where}, {', '.join(f'{k}={v}' for k, v in self.sizes.items())}"
            if calls > 1:
                note += f", {calls} calls on fresh inputs"
            if emulated != tensor.dtype:
                note += f"; emulated in {emulated} for {tensor.dtype}"
            if dtype != emulated:  # the output itself is not stored so: a cast on the way rounds its values
                note += f"; within {dtype}'s tolerance, the narrowest dtype on its path"
            ranks = [rank for rank in range(world) if rank not in untouched]
            if untouched:
                note += left_as_passed(world, set(ranks))
            got = [torch.from_numpy(results[rank][call][name]) for call in range(calls) for rank in ranks]
            want = [expected[call][rank][name] for call in range(calls) for rank in ranks]
            stored = [self.covered[call][rank][name] for call in range(calls) for rank in ranks]
            if tensor.upto is not None:  # elements past the valid rows are unspecified: not compared
                counts = [self._count(call, rank, tensor.upto, results) for call in range(calls) for rank in ranks]
                valid = [valid_rows(w.shape, c) for w, c in zip(want, counts)]
                got = [torch.where(v, g.double(), 0.0) for g, v in zip(got, valid)]
                want = [torch.where(v, w.double(), 0.0) for w, v in zip(want, valid)]
                note += f"; compared below {tensor.upto}"
            verdicts.append(compare(name, got, want, dtype, note + self.against, stored))
        return verdicts

    def _count(self, call: int, rank: int, name: str, results: list) -> torch.Tensor:
        """The count an `upto` output is valid below: expected, else (an input) as passed."""
        want = self.expected[call][rank].get(name)
        return want if want is not None else torch.as_tensor(self.inputs[call][rank][name])


def written_ranks(schedule, world: int, sizes: dict, consts: dict, nodes: int = 1) -> dict[str, set[int]]:
    """Per tensor, the ranks whose copy some instance writes (the schedule's meaning at these sizes)."""
    concrete = instantiate(schedule, world, {**consts, **sizes}, nodes)
    written: dict[str, set[int]] = {name: set() for name in schedule.tensors}
    for access in concrete.accesses:
        if access.write:
            written[access.region.tensor].add(access.copy)
    return written


def valid_rows(shape, count: torch.Tensor) -> torch.Tensor:
    """Where a tensor declared `upto count` is valid: along the dimension after count's, below count."""
    prefix = count.dim()
    along = torch.arange(shape[prefix]).view(*([1] * prefix), -1, *([1] * (len(shape) - prefix - 1)))
    return (along < count.view(*count.shape, *([1] * (len(shape) - prefix)))).expand(shape)


def rounded_dtype(schedule, tensor: str, dtype: str) -> str:
    """The dtype whose tolerance an output is judged by: its own, or a coarser one that a tile rounds to
    on the way (`bf16(p) @ V`), in the family writing it or upstream of it (sp_ulysses's attention
    rounds into Os, which a copy puts in O): a float32 kernel and a float64 reference round a few
    elements to neighbouring bf16 values there, an error of bf16's size in the output."""
    coarsest, seen, pending = dtype, set(), [tensor]
    while pending:
        written = pending.pop()
        for family in schedule.families.values():
            if (family.name, written) in seen or not any(r.tensor == written for r in family.writes):
                continue
            seen.add((family.name, written))
            pending.extend(r.tensor for r in family.reads)
            for cast in _casts(family, written):
                if TOLERANCE.get(cast, 0.0) > TOLERANCE.get(coarsest, 0.0):
                    coarsest = cast
    return coarsest


def _casts(family, written: str) -> set[str]:
    """The dtypes a family's stores into `written` round to on the way: in the stored value, or in a
    name it reads (a block's names carry the casts of every binding, loop updates included)."""
    of_name: dict[str, set[str]] = {}

    def walk(value) -> set[str]:
        if isinstance(value, ir.Local):
            return set(of_name.get(value.name, ()))
        if isinstance(value, ir.Map):
            found = {value.func[5:]} if value.func.startswith("cast:") else set()
            return found.union(*(walk(a) for a in value.args))
        if isinstance(value, ir.MatMul):
            return walk(value.left) | walk(value.right)
        if isinstance(value, ir.Reduce):
            return walk(value.body)
        if isinstance(value, ir.Transpose):
            return walk(value.value)
        return set()

    found: set[str] = set()

    def statements(items):
        for s in items:
            if isinstance(s, ir.Loop):
                statements(s.body)
                statements(s.body)  # a carried name's update reads the previous step's casts
            elif isinstance(s, ir.Let):
                of_name[s.name] = of_name.get(s.name, set()) | walk(s.value)
            elif isinstance(s, ir.Store) and s.target.tensor == written:
                found.update(walk(s.value))
    statements(family.body or family.stores)
    return found


def launch_sizes(schedule, world: int, given: dict, consts: dict, nodes: int = 1) -> dict:
    """The given sizes, the rest from `default_sizes`; sizes the program cannot run at are reported
    against the .tds line that needs them, before any rank starts."""
    program = schedule.program
    if world % nodes:
        raise TdsError([error(f"{world} ranks do not split into {nodes} nodes of equal size", program.name.span)],
                       program.path, program.source)
    if nodes > 1 and not schedule.spans_nodes:
        raise TdsError([error(f"{schedule.name} names no topology: it reaches other ranks through peer pointers, "
                              f"which stay within a node, so it does not run on {nodes} nodes", program.name.span,
                              hint="programs written for nodes name `node`, `local_world`, ...: "
                                   "programs/hier_*.tds")], program.path, program.source)
    unknown = sorted(set(given) - set(schedule.params))
    if unknown:
        raise TdsError([error(f"no param named {', '.join(unknown)}; the params are "
                              f"{', '.join(schedule.params) or 'none'}", program.name.span)],
                       program.path, program.source)
    try:
        return _checked_sizes(schedule, world, given, consts, nodes)
    except ArithmeticError:  # `N / (world - 1)` at world 1, say: the checker's worlds did not have it
        raise TdsError([error(f"the program's sizes divide by zero at world {world}", program.name.span,
                              hint="a size that divides by an expression of world is 0 or undefined at some worlds")],
                       program.path, program.source) from None


def _checked_sizes(schedule, world: int, given: dict, consts: dict, nodes: int) -> dict:
    program = schedule.program
    try:
        sizes = {**default_sizes(schedule, world, nodes=nodes), **given}
    except ValueError as why:
        if set(given) != set(schedule.params):
            raise TdsError([error(f"{why}: give every param (--size NAME=VALUE)", program.name.span)],
                           program.path, program.source) from None
        sizes = dict(given)
    values = size_values(schedule, world, {**sizes, **consts}, nodes)
    # the program's conditions, and the TMA rows of the kernel built with these consts
    conditions = schedule.conditions + row_conditions(schedule, consts)
    holds = compile_exprs(tuple(c.holds for c in conditions), size_symbols(schedule))(*values)
    shown = ", ".join(f"{k}={v}" for k, v in sizes.items())
    broken = {(c.message, c.span): error(f"{c.message} (at {shown}, world {world})", c.span, hint=c.hint)
              for c, ok in zip(conditions, holds) if not ok}
    if broken:
        raise TdsError(list(broken.values()), program.path, program.source)
    # the checker proved a few worlds at small sizes: this run's world and sizes are proved too
    wrong = check_at(schedule, world, {**sizes, **consts}, nodes)
    if wrong:
        raise TdsError(wrong, program.path, program.source)
    return sizes


def compare(tensor: str, got: list[torch.Tensor], want: list[torch.Tensor], dtype: str, note: str = "",
            stored: list[torch.Tensor] | None = None) -> Verdict:
    """The verdict on one output, over every rank's copy (and every call): the largest error relative to
    that copy's largest expected magnitude, against the tolerance of `dtype`. A NaN or Inf anywhere
    fails, and a reference that is not finite can vouch for nothing. Outputs start poisoned with NaN:
    `stored` (each copy's elements that some instance stores to, Reference.written) tells a NaN the
    kernel computed from one nothing wrote; without it a NaN is either."""
    worst, computed, unwritten, infinite = 0.0, 0, 0, 0
    for n, (mine, expected) in enumerate(zip(got, want, strict=True)):
        mine, expected = mine.double(), expected.double()
        if mine.shape != expected.shape:
            return Verdict(tensor, False, float("inf"),
                           f"{note}; shape {list(mine.shape)}, expected {list(expected.shape)}")
        if not torch.isfinite(expected).all():
            return Verdict(tensor, False, float("inf"), f"{note}; the reference holds NaN or Inf")
        nan = torch.isnan(mine)
        if stored is not None:
            computed += int((nan & stored[n]).sum())
            unwritten += int((nan & ~stored[n]).sum())
        else:
            unwritten += int(nan.sum())
        infinite += int(torch.isinf(mine).sum())
        if mine.numel() and not (computed or unwritten or infinite):
            scale = expected.abs().max().item() or 1.0
            worst = max(worst, (mine - expected).abs().max().item() / scale)
    if computed or unwritten or infinite:
        worst = float("inf")
        found = [f"{computed} elements computed as NaN"] if computed else []
        if unwritten:
            found.append(f"{unwritten} elements never written (still NaN)" if stored is not None else
                         f"{unwritten} elements NaN (never written, or computed so)")
        note += f"; {', '.join(found)}" if found else f"; {infinite} elements Inf"
    return Verdict(tensor, worst <= TOLERANCE.get(dtype, 0.0), worst, note)
