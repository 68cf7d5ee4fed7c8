"""tests/gpu/moe_checks.py runs whole on CPU: two gloo ranks, small sizes, and stand-ins for the four
MoE programs computed from moe_expectations.py (written independently of the script's references,
which go through all_to_all_single, all-gather and reduce-scatter). This proves the script's own logic
(routings, references, the `upto count` masks, calls back to back, the capacity verdict), not the
programs: a stand-in that computes the right thing must pass every check that needs no GPU, and one
that reads the previous call's inputs, as a too-early wait would, must fail every one."""
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = Path(__file__).parent
PROGRAMS_TESTS = HERE.parent / "programs"
RUNTIME_ONLY = ("user CUDA graph",)  # checks that capture a CUDA graph: no stand-in can pass them


class CapacityExceeded(RuntimeError):
    """The stand-ins' own error of that name (the check judges the name and the message)."""


def _everyone(tensors: dict) -> dict:
    """Every rank's tensors, as lists (index = rank)."""
    mine = {n: t.clone() for n, t in tensors.items()}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return {n: [g[n] for g in gathered] for n in mine}


def _stand_in(name, inputs, outputs, rank):
    import moe_expectations as expect
    world = dist.get_world_size()
    every = None if name == "group_gemm_fp8" else _everyone(inputs)  # fp8 tensors do not pickle
    if name == "moe_dispatch":
        E, C = outputs["recv"].shape[0], outputs["recv"].shape[2]
        sent = expect.histogram(inputs["ids"], E * world)
        if int(sent.max()) > C:
            expert = int(sent.argmax())
            raise CapacityExceeded(f"rank {rank}: sent[{expert}] = {int(sent[expert])} is above its cap {C}")
        got = expect.moe_dispatch(every["X"], every["ids"], E, C)
    elif name == "moe_dispatch_fp8":
        E, C = outputs["recv"].shape[0], outputs["recv"].shape[2]
        group = outputs["recv"].shape[-1] // outputs["rscale"].shape[-1]
        got = expect.moe_dispatch_fp8(every["X"], every["ids"], E, C, group)
    elif name == "moe_combine":
        got = expect.moe_combine(every["Y"], every["ids"], every["w"], inputs["Y"].shape[0])
    elif name == "ag_group_gemm":
        C = outputs["G"].shape[2]
        counts = torch.stack([expect.histogram(i, inputs["B"].shape[0]) for i in every["ids"]])
        if int(counts[:, 0].max()) > C:
            raise CapacityExceeded(f"rank {rank}: count[0, 0] = {int(counts[0, 0])} is above its cap {C}")
        got = expect.ag_group_gemm(every["A"], every["ids"], every["B"], C)
    elif name == "group_gemm_fp8":  # one rank's own: no collective
        C, group = inputs["P"].shape[1], inputs["P"].shape[2] // inputs["S"].shape[2]
        if int(inputs["count"].max()) > C:
            raise CapacityExceeded(f"rank {rank}: count[0] = {int(inputs['count'].max())} is above its cap {C}")
        got = {"G": [expect.group_gemm_fp8([inputs["count"]], [inputs["P"]], [inputs["S"]], [inputs["B"]],
                                           group)["G"][0]] * world}
    else:
        got = expect.moe_gemm_rs(every["Hx"], every["ids"], every["w"], every["B"])
    for n, values in got.items():
        out = values[rank]
        outputs[n][tuple(slice(0, s) for s in out.shape)].copy_(out)


class StandIn:
    """A MoE program computed by moe_expectations; `stale`: from the second call on, from the previous
    call's inputs."""

    INPUTS = {"moe_dispatch": ("X", "ids"), "moe_dispatch_fp8": ("X", "ids"),
              "group_gemm_fp8": ("count", "P", "S", "B"), "moe_combine": ("Y", "ids", "w"),
              "ag_group_gemm": ("A", "ids", "B"), "moe_gemm_rs": ("Hx", "ids", "w", "B")}

    def __init__(self, name, stale):
        self.name, self.stale, self.previous = name, stale, None

    def __call__(self, check=True, **args):
        current = {n: args[n].clone() for n in self.INPUTS[self.name]}
        outputs = {n: t for n, t in args.items() if n not in current}
        _stand_in(self.name, self.previous if self.stale and self.previous else current, outputs, dist.get_rank())
        self.previous = current

    def check(self):
        pass


def _script_rank(rank, world, port, stale, results, spread=False):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      CHECKS_ONLY="", CHECKS_SPREAD="1" if spread else "")
    sys.path[:0] = [str(HERE), str(PROGRAMS_TESTS)]
    torch.set_num_threads(1)
    import harness
    import moe_checks
    harness.DEVICE = "cpu"
    moe_checks.start = lambda seed: harness.start(seed, cpu=True)
    moe_checks.CALLS = 12  # more than one round of calls back to back
    moe_checks.EP_SHAPES = [(10, 12, 2, 2, 10), (9, 8, 1, 3, 9)]
    moe_checks.FP8_GROUP = 4  # 3 and 2 scales a row at these widths
    moe_checks.FP8_GEMM_SHAPES = [(12, 8, 3, 9)]
    moe_checks.GEMM_SHAPES = [(10, 16, 24, 2, 4, 10), (5, 8, 16, 8, 8, 5)]
    moe_checks.tiledsl = type("tiledsl", (), {"compile": staticmethod(
        lambda source, heap=None, **options: StandIn(Path(source).stem, stale))})
    results.put((rank, moe_checks.main()))


def _run(stale, spread=False):
    context = mp.get_context("spawn")
    results = context.Queue()
    port = 29500 + (os.getpid() + 211 + 17 * stale) % 1000
    procs = [context.Process(target=_script_rank, args=(r, 2, port, stale, results, spread)) for r in range(2)]
    for p in procs:
        p.start()
    got = sorted(results.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    return got


def _lines(out, verdict):
    return [line.split(" -- ")[0].removeprefix(verdict + " ") for line in out.splitlines()
            if line.startswith(verdict + " ")]


def test_moe_checks_pass_a_correct_stand_in_and_fail_a_stale_one(capfd):
    # spread over the programs, as where ranks share a GPU: each check still gets its own shape and routing
    assert _run(stale=False, spread=True) == [(0, 1), (1, 1)]  # the CUDA-graph checks fail without a GPU
    out = capfd.readouterr().out
    verdicts = [line for line in out.splitlines() if line.startswith(("PASS ", "FAIL "))]
    assert [line.split(" -- ")[0] for line in verdicts[-2:]] == [
        "PASS moe_dispatch over capacity raises CapacityExceeded",
        "PASS ag_group_gemm over capacity raises CapacityExceeded"], out  # last, as asked
    assert verdicts[0].split()[1] != verdicts[1].split()[1], out  # one program, then another
    passed, failed = _lines(out, "PASS"), _lines(out, "FAIL")
    assert failed and all(name.startswith(RUNTIME_ONLY) for name in failed), out
    programs = {name.split()[0] for name in passed}
    assert programs == {"moe_dispatch", "moe_dispatch_fp8", "group_gemm_fp8", "moe_combine", "ag_group_gemm",
                        "moe_gemm_rs"}, out
    assert {"moe_dispatch over capacity raises CapacityExceeded",
            "ag_group_gemm over capacity raises CapacityExceeded"} <= set(passed), out
    for routing in ("uniform", "skewed", "idle", "stay_home"):
        assert any(name.endswith(routing) for name in passed), (routing, out)
    assert f"{len(passed) + len(failed)} run, {len(failed)} failed" in out.splitlines()

    assert _run(stale=True) == [(0, 1), (1, 1)]
    out = capfd.readouterr().out
    stale_failed = set(_lines(out, "FAIL"))
    # every check of outputs fails; the capacity checks judge only the error, which a stale call still raises
    assert stale_failed >= set(passed + failed) - {n for n in passed if "over capacity" in n}, out
