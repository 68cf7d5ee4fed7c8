"""The multi-GPU check scripts run whole on CPU: two gloo ranks, small sizes, and torch stand-ins for the
programs. This proves their own logic (references, shapes, dtypes, tolerances, calls back to back and
the summary), not the programs: a stand-in that computes the right thing must pass every repeated-call
check, and one that reads the previous call's inputs, as a too-early wait would, must fail every one."""
import os
import re
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

HERE = Path(__file__).parent
# checks that need the real runtime or a GPU (a schedule timing out, launch validation, CUDA graphs the caller
# captures, reset after a failed call, TMA alignment): the stand-ins cannot pass them; by name, sizes aside
RUNTIME_ONLY = {"broken schedule reports rank, edge and epoch", "launch validation names the wrong tensor",
                "user CUDA graph, ag_gemm (copy engine)", "user CUDA graph, allreduce (staged input) x1 per graph",
                "user CUDA graph, allreduce (staged input) x3 per graph",
                "user CUDA graph without a warm-up call is refused by name",
                "a failed call, then reset() on every rank, then correct calls",
                "N=32001 (rows not a multiple of 16 bytes) is refused by name"}


def _all_reduce(x):
    y = x.float().clone()
    dist.all_reduce(y)
    return y


def _gather(x):
    y = torch.empty(x.shape[0] * dist.get_world_size(), *x.shape[1:], dtype=x.dtype)
    dist.all_gather_into_tensor(y, x.contiguous())
    return y


def _reduce_scatter(x):
    y = torch.empty(x.shape[0] // dist.get_world_size(), *x.shape[1:])
    dist.reduce_scatter_tensor(y, x.float().contiguous())
    return y


def _rmsnorm(inputs, args):
    X, R0, W = inputs
    _, R, _, Y = args
    R.copy_(_all_reduce(X) + R0.float())
    Y.copy_(F.rms_norm(R.float(), (R.shape[-1],), W.float(), eps=1e-6))


def _everyone(x):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return parts


def _attention(program, names, **kwargs):
    """A stand-in from the program's torch expectation (tests/programs/expectations.py) on every rank's
    inputs, gathered: a formulation of its own, not the check script's reference."""
    def compute(inputs, args, D=128, CAUSAL=1, **_):
        sys.path.insert(0, str(HERE.parent / "programs"))
        from expectations import EXPECTATIONS
        extra = {"D": D, "causal": bool(CAUSAL)} if program == "sp_ulysses" else {}
        gathered = {name: _everyone(x) for name, x in zip(names, inputs)}
        args[len(names)].copy_(EXPECTATIONS[program](**gathered, **extra)["O"][dist.get_rank()])
    return len(names), compute


ATTENTION = ("sp_ag_attention", "sp_ulysses", "flash_decode")
# program: (how many of its leading arguments it reads, what it writes from them into the arguments)
STAND_INS = {
    "sp_ag_attention": _attention("sp_ag_attention", ("Q", "K", "V")),
    "sp_ulysses": _attention("sp_ulysses", ("X", "WQ", "WK", "WV")),
    "flash_decode": _attention("flash_decode", ("Q", "K", "V", "Lens")),
    "ag_gemm": (2, lambda i, a: a[2].copy_(_gather(i[0]).float() @ i[1].float())),
    "gemm_rs": (2, lambda i, a: a[2].copy_(_reduce_scatter(i[0].float() @ i[1].float()))),
    "allreduce": (1, lambda i, a: a[0].copy_(_all_reduce(i[0]))),
    "reduce_scatter": (1, lambda i, a: a[1].copy_(_reduce_scatter(i[0]))),
    "allgather": (1, lambda i, a: a[1].copy_(_gather(i[0]))),
    "gemm_ar": (2, lambda i, a: a[2].copy_(_all_reduce(i[0].float() @ i[1].float()))),
    "allreduce_rmsnorm": (3, _rmsnorm),
}
# the two-level programs compute what their one-level counterparts do
STAND_INS.update({f"hier_{name}": STAND_INS[name] for name in ("ag_gemm", "gemm_rs", "reduce_scatter", "allgather")})
STAND_INS["hier_allreduce"] = STAND_INS["allreduce"]


class StandIn:
    """A program's result computed by torch; `stale`: from the second call on, computed from the
    previous call's inputs."""

    def __init__(self, name, stale, skip=(), **options):
        self.family = next(f for f in sorted(STAND_INS, key=len, reverse=True) if name.startswith(f))
        self.reads, self.compute = STAND_INS[self.family]
        self.stale, self.skip, self.previous = stale, skip, None
        # what the program is built with (head dim, causal), for the attention stand-ins that depend on it
        self.consts = {k: v for k, v in options.items() if k.isupper()} if self.family in ATTENTION else {}

    def __call__(self, *args, check=True):
        if self.skip:
            raise NotImplementedError("a stand-in has no schedule to break")
        if self.family == "ag_gemm" and args[0].dtype != torch.bfloat16:
            raise NotImplementedError("a stand-in validates nothing")
        current = [a.clone() for a in args[:self.reads]]
        inputs = self.previous if self.stale and self.previous else current
        self.compute(inputs, args, **self.consts) if self.consts else self.compute(inputs, args)
        self.previous = current

    def check(self):
        pass


class StandInAllReduce:
    def __init__(self, heap, stale):
        self.threshold_bytes, self.last_algorithm = float("inf"), None
        self.programs = {name: StandIn("allreduce", stale) for name in ("one_shot", "two_shot")}

    def choose(self, x):
        return "one_shot"

    def __call__(self, x, algorithm=None, check=True):
        self.last_algorithm = algorithm or self.choose(x)
        self.programs[self.last_algorithm](x, check=check)
        return x

    def check(self):
        pass


def _compile(stale):
    def compile(source, heap=None, **options):
        text = str(source)
        name = re.search(r"^program (\w+)", text, re.MULTILINE).group(1) if "\n" in text else Path(text).stem
        return StandIn(name, stale, **options)
    return compile


def _script_rank(rank, world, port, script, stale, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      CHECKS_ONLY="")
    sys.path.insert(0, str(HERE))
    import harness
    module = __import__(script)
    harness.DEVICE = "cpu"
    module.start = lambda seed: harness.start(seed, cpu=True)
    module.CALLS = 12  # more than one round of calls back to back
    _small(module, script, stale)
    results.put((rank, module.main()))


def _small(module, script, stale):
    """A script's programs stood in for, on sizes a CPU runs in seconds."""
    module.tiledsl = type("tiledsl", (), {"compile": staticmethod(_compile(stale))})
    if script == "attention_checks":
        module.D = 16
        module.zigzag_shapes = lambda world: [(1, 21, 4, 2)]
        module.zigzag_block_cases = lambda world: [({"BM": 32, "BN": 16}, (1, 21, 4, 2))]
        module.ulysses_shapes = lambda world: [(19 * world, 24, 2 * world, world)]
        module.decode_shapes = lambda world: [(3, 4, 2, 13)]
    elif script == "multigpu_checks":
        module.gemm_shapes = lambda world: [(64, 32, 48), (24 * world, 40, 40)]
        module.collective_shapes = lambda world: [(4 * world, 16), (7 * world, 10)]
        module.ALLREDUCE_SIZES = (100, 1001)
    elif script == "nodes_checks":
        module.gemm_shapes = lambda world: [(64, 32, 48), (24 * world, 40, 40)]
        module.BYTES = (1 << 10, 1 << 14)
    else:
        module.AllReduce = lambda heap: StandInAllReduce(heap, stale)
        module.AR_BYTES = (1 << 10, 1 << 14)
        module.AUTO_NUMELS = (100, 3001)
        module.RMSNORM_SHAPES = [(1, 64), (33, 100)]
        module.gemm_ar_shapes = lambda world: [(1, 64, 48), (37, 40 * world, 50)]


def _run_script(script, stale):
    context = mp.get_context("spawn")
    results = context.Queue()
    port = 29500 + (os.getpid() + 97 * len(script) + 13 * stale) % 1000
    procs = [context.Process(target=_script_rank, args=(r, 2, port, script, stale, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = sorted(results.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    return got


def _lines(out, verdict):
    return [line.split(" -- ")[0].removeprefix(verdict + " ") for line in out.splitlines()
            if line.startswith(verdict + " ")]


@pytest.mark.parametrize("script", ["multigpu_checks", "collectives_checks", "attention_checks",
                                    "nodes_checks"])
def test_checks_pass_a_correct_stand_in_and_fail_a_stale_one(script, capfd):
    runtime_only = RUNTIME_ONLY if script == "multigpu_checks" else set()
    rc = 1 if runtime_only else 0
    assert _run_script(script, stale=False) == [(0, rc), (1, rc)]
    out = capfd.readouterr().out
    passed, failed = _lines(out, "PASS"), _lines(out, "FAIL")
    named = {name if name in runtime_only else name.rsplit(" M=", 1)[0].rsplit(" N=", 1)[0] for name in failed}
    assert len(passed) >= (5 if script == "attention_checks" else 20) and named == runtime_only, out
    assert f"{len(passed) + len(failed)} run, {len(failed)} failed" in out.splitlines()

    assert _run_script(script, stale=True) == [(0, 1), (1, 1)]
    out = capfd.readouterr().out
    assert not _lines(out, "PASS") and sorted(_lines(out, "FAIL")) == sorted(passed + failed), out


def _all_checks_rank(rank, world, port, budget, results):
    """tests/gpu/all_checks.py on gloo ranks posing as ranks that share a GPU, the suites' programs stood in
    for as above."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      CHECKS_ONLY="", CHECKS_CALLS="3")
    sys.path.insert(0, str(HERE))
    import all_checks
    import harness
    from tiledsl.runtime.placement import Placement
    harness.DEVICE = "cpu"

    def start():
        dist.init_process_group("gloo")
        return Placement(rank, world, rank, world, 1)  # every rank on one GPU: shared
    all_checks.placement.start = start
    all_checks.open_heap = lambda: None
    for script in ("multigpu_checks", "collectives_checks", "attention_checks", "nodes_checks"):
        _small(__import__(script), script, False)
    sys.argv = ["all_checks.py", "--suites", "programs,collectives,attention,nodes", "--budget-s", str(budget)]
    results.put((rank, all_checks.main()))


def test_all_checks_runs_every_suite_in_one_group_and_each_gets_its_first_check_however_short_the_time(capfd):
    context = mp.get_context("spawn")
    results = context.Queue()
    port = 29500 + (os.getpid() + 577) % 1000
    procs = [context.Process(target=_all_checks_rank, args=(r, 2, port, 0.01, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = sorted(results.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert got == [(0, 0), (1, 0)]
    out = capfd.readouterr().out
    passed = [line for line in out.splitlines() if line.startswith("PASS ")]
    # spread: each suite's first check is the first of its first program; no time for a second
    assert [line.split(":")[0] for line in passed] == ["PASS programs", "PASS collectives", "PASS attention",
                                                       "PASS nodes"], out
    assert "SKIP programs: ag_gemm sms" in out and "-- out of time" in out
    table = out[out.index("suite "):].splitlines()
    assert [row.split()[:3] for row in table[1:5]] == [["programs", "1", "0"], ["collectives", "1", "0"],
                                                       ["attention", "1", "0"], ["nodes", "1", "0"]], out
    assert table[5] == "4 run, 0 failed"
