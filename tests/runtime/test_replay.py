"""The steady-state launch path: after the first call on a GPU the runtime relaunches the compiled
kernel with the same arguments (the epoch is on the device). These tests check, without a GPU, that the
argument list it builds is the one Triton's JIT would pass, for every program in programs/."""
import dataclasses
from pathlib import Path

import pytest
import torch

from tiledsl.api import build_module
from tiledsl.runtime import sync
from tiledsl.runtime.emulate import EmulatedHeap
from tiledsl.runtime.issue import goes_first
from tiledsl.runtime.launch import LaunchError, Program
from tiledsl.tools.reference import Reference
from tiledsl.runtime.replay import Replay
from tiledsl.tools.run_program import make_inputs, program_schedule
from tiledsl.schedule.meaning import default_sizes

PROGRAMS = sorted((Path(__file__).resolve().parents[2] / "programs").glob("*.tds"))
CORPUS = Path(__file__).resolve().parents[2] / "tests" / "corpus"


class FakeCompiled:
    """Stands in for triton's CompiledKernel: `compiled[grid](*args)` records what was launched."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args: self.launches.append((grid, args))


class NoBarrier:
    def wait(self):
        pass  # one rank in this process: allocations need no agreement


class FakeJit:
    arg_names = ["x", "n", "tds_epoch_cell", "BLOCK"]


def test_replay_passes_arguments_in_parameter_order_every_time():
    compiled = FakeCompiled()
    x, cell = torch.arange(3), torch.zeros(1)
    replay = Replay(FakeJit(), compiled, (7,), {"BLOCK": 64, "tds_epoch_cell": cell, "n": 5, "x": x, "extra": 0})
    replay()
    replay()
    assert [grid for grid, _ in compiled.launches] == [(7, 1, 1), (7, 1, 1)]
    assert all(args[0] is x and args[1] == 5 and args[2] is cell and args[3] == 64 for _, args in compiled.launches)


def test_replay_names_a_kernel_argument_it_has_no_value_for():
    with pytest.raises(KeyError, match="BLOCK"):
        Replay(FakeJit(), FakeCompiled(), (1,), {"x": 0, "n": 1, "tds_epoch_cell": 1})


def test_replay_waits_for_a_kernel_compiled_asynchronously():
    compiled = FakeCompiled()

    class Future:
        def result(self):
            return compiled

    Replay(FakeJit(), Future(), (1,), {"x": 0, "n": 1, "tds_epoch_cell": 1, "BLOCK": 2})()
    assert compiled.launches[0][1] == (0, 1, 1, 2)


def test_the_entry_kernels_take_the_epoch_cell_where_the_launcher_puts_it():
    assert sync.barrier_all.arg_names[4] == "epoch_cell" and len(sync.barrier_all.arg_names) == 7
    assert sync.enter.arg_names == ["epoch_cell"]


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.stem)
def test_the_launcher_has_a_value_for_every_kernel_parameter(path, monkeypatch):
    """What the fast path needs of the launcher: a value for each parameter of the generated kernel,
    by name (the JIT path passes them by position, so a missing one would go unnoticed there)."""
    monkeypatch.setattr(Program, "_options", lambda self, env: {})  # no NVSHMEM bitcode needed here
    world = 2
    schedule = program_schedule(path)
    sizes = default_sizes(schedule, world)
    inputs = make_inputs(schedule, world, sizes, seed=0, dtype_map={})
    arenas = [torch.zeros(256 * 2**20, dtype=torch.uint8) for _ in range(world)]
    heap = EmulatedHeap(0, world, arenas, barrier=NoBarrier())
    module = build_module(path.read_text(), {})
    program = Program(module, heap, emulated=False, num_sms=132)
    shapes = Reference(schedule, world, sizes).shapes(0)
    tensors = {}
    for spec in program.callers:
        tensors[spec.name] = inputs[0].get(spec.name, torch.empty(shapes[spec.name], dtype=getattr(torch, spec.dtype)))
    call = program._prepare(tensors, parity=1)
    if not call.grid:
        return  # copy-engine only: no kernel to relaunch
    compiled = FakeCompiled()
    Replay(module.tds_SPEC.kernel, compiled, (call.grid,), {**call.kernel_args, **call.roles})()
    (_, args), = compiled.launches
    assert len(args) == len(program.spec.kernel.arg_names)
    assert args[program.spec.kernel.arg_names.index("tds_epoch_cell")] is program._epoch_cell


def test_num_warps_overrides_the_launch_options_and_must_be_a_power_of_two():
    module = build_module((PROGRAMS[0].parent / "copy.tds").read_text(), {})  # no product: 4 warps by default
    assert Program(module, None, emulated=False)._options({"N": 64, "rank": 0, "world": 1, "BLOCK": 1024})["num_warps"] == 4
    assert Program(module, None, emulated=False, num_warps=16)._options({"N": 64, "rank": 0, "world": 1, "BLOCK": 1024})["num_warps"] == 16
    with pytest.raises(LaunchError, match="power of two"):
        Program(module, None, emulated=False, num_warps=12)


def test_num_stages_overrides_the_launch_options_and_a_128_row_tile_gets_8_warps():
    env = {"N": 64, "rank": 0, "world": 1, "BLOCK": 1024}
    module = build_module((PROGRAMS[0].parent / "copy.tds").read_text(), {})
    assert Program(module, None, emulated=False, num_stages=3)._options(env)["num_stages"] == 3
    with pytest.raises(LaunchError, match="num_stages"):
        Program(module, None, emulated=False, num_stages=0)
    attention = build_module(PROGRAMS[0].parent / "sp_ag_attention.tds", {"BM": 128})
    assert Program(attention, None, emulated=False)._options({})["num_warps"] == 8


@pytest.mark.parametrize("name, consts, stages", [("sp_ag_attention", {}, 3), ("sp_ag_attention", {"STAGES": 2}, 2),
                                                   ("flash_decode", {}, 4), ("copy", {}, 2)])
def test_a_programs_const_stages_sets_the_pipeline_depth_of_its_block_tiles(name, consts, stages):
    """STAGES, where a program declares it, is its tiles' pipeline depth (num_stages= still overrides)."""
    module = build_module(PROGRAMS[0].parent / f"{name}.tds", consts)
    assert Program(module, None, emulated=False)._options({})["num_stages"] == stages
    assert Program(module, None, emulated=False, num_stages=1)._options({})["num_stages"] == 1


class FakeGraph:
    """Stands in for torch.cuda.CUDAGraph: counts replays."""
    replays = 0

    def replay(self):
        FakeGraph.replays += 1


def graph_calls(monkeypatch, capture_fails=False, name="copy"):
    """A GPU-mode Program on CPU tensors with the launch itself recorded instead of run."""
    monkeypatch.setattr(Program, "_options", lambda self, env: {})
    issued = []
    monkeypatch.setattr(Program, "_issue", lambda self, call: issued.append(id(call)))

    class Capture:
        def __init__(self, graph, capture_error_mode):
            assert capture_error_mode == "thread_local"

        def __enter__(self):
            if capture_fails:
                raise RuntimeError("operation not permitted when stream is capturing")

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", Capture)
    FakeGraph.replays = 0
    module = build_module((PROGRAMS[0].parent / f"{name}.tds").read_text(), {})
    world = 1 if name == "copy" else 2
    arenas = [torch.zeros(1 << 20, dtype=torch.uint8) for _ in range(world)]
    program = Program(module, EmulatedHeap(0, world, arenas, barrier=NoBarrier()), emulated=False, num_sms=132)
    X, Y = torch.randn(4096).bfloat16(), torch.empty(4096).bfloat16()
    return program, ((X, Y) if name == "copy" else (X,)), issued


def test_first_call_launches_second_records_a_graph_later_calls_replay_it(monkeypatch):
    program, args, issued = graph_calls(monkeypatch)
    for _ in range(5):
        program(*args, check=False)
    # call 1 launched, call 2 recorded (issued inside the capture) and replayed, calls 3-5 replayed
    assert len(issued) == 2 and FakeGraph.replays == 4
    assert program.epoch == 5


def test_staged_inputs_alternate_two_recorded_calls(monkeypatch):
    program, args, issued = graph_calls(monkeypatch, name="allreduce")  # X is staged for peers to read
    for _ in range(6):
        program(*args, check=False)
    # calls 1 and 2 launched (one per staging parity), 3 and 4 recorded and replayed, 5 and 6 replayed
    assert len(issued) == 4 and FakeGraph.replays == 4


def test_a_graph_capture_that_fails_falls_back_to_direct_launches_with_a_warning(monkeypatch):
    program, args, issued = graph_calls(monkeypatch, capture_fails=True)
    program(*args, check=False)
    with pytest.warns(UserWarning, match="CUDA graph capture failed"):
        program(*args, check=False)
    program(*args, check=False)
    assert len(issued) == 3 and FakeGraph.replays == 0 and not program.graphs  # every call launched directly


def test_release_drops_the_prepared_calls_and_their_tensors(monkeypatch):
    import weakref
    program, args, issued = graph_calls(monkeypatch)
    X, Y = args
    program(X, Y, check=False)
    program(X, Y, check=False)  # recorded
    alive = weakref.ref(Y)
    program.release()
    del args, Y
    assert alive() is None  # nothing of the program keeps the caller's tensor any more
    program(X, torch.empty(4096).bfloat16(), check=False)
    assert len(issued) == 3  # a new tensor set starts again with a direct launch


def _prepared(name, world, monkeypatch, sms=132, **options):
    """A call of programs/NAME.tds (or tests/corpus/NAME.tds) prepared on rank 0 of `world` as on an
    `sms`-SM GPU, with no GPU."""
    class Properties:
        multi_processor_count = sms
        name = "stand-in GPU"
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Properties())
    monkeypatch.setattr(Program, "_options", lambda self, env: {})
    path = next((p for p in PROGRAMS if p.stem == name), CORPUS / f"{name}.tds")
    schedule = program_schedule(path)
    sizes = default_sizes(schedule, world)
    inputs = make_inputs(schedule, world, sizes, seed=0, dtype_map={})
    heap = EmulatedHeap(0, world, [torch.zeros(256 * 2**20, dtype=torch.uint8) for _ in range(world)],
                        barrier=NoBarrier())
    program = Program(build_module(path.read_text(), {}), heap, emulated=False, **options)
    shapes = Reference(schedule, world, sizes).shapes(0)
    tensors = {spec.name: inputs[0].get(spec.name, torch.empty(shapes[spec.name], dtype=getattr(torch, spec.dtype)))
               for spec in program.callers}
    return program._prepare(tensors, parity=1)


@pytest.mark.parametrize("name, world, programs", [("sp_ag_attention", 2, 131), ("sp_ag_attention", 1, 132),
                                                    ("ag_gemm", 2, 131), ("ag_gemm", 1, 132), ("gemm_rs_ce", 1, 131),
                                                    ("gemm", 2, 132), ("gemm_rs", 2, 132)])
def test_a_kernel_leaves_one_sm_only_to_copies_beside_it(name, world, programs, monkeypatch):
    """The driver runs a copy within one GPU (a chunk's, or the 4-byte signal into this rank's own slot)
    as a kernel on an SM; beside a kernel of one program an SM holding every register it never started
    and the kernel's waits timed out (bench/NOTES.md, sessions 12 and 13). The copies within this GPU
    that wait on no tile run before the kernel (all of them at world 1, where each chunk is local,
    except gemm_rs_ce's, which wait on its tiles); a kernel with copies beside it leaves them one SM."""
    asked = []
    default = Program._default_programs
    monkeypatch.setattr(Program, "_default_programs",
                        lambda self, beside: asked.append(default(self, beside)) or asked[-1])
    _prepared(name, world, monkeypatch)
    assert asked == [programs]


def test_a_stream_waiting_on_a_peers_tiles_waits_in_this_gpus_copy_of_their_counts(monkeypatch):
    """lm_head_gather on rank 0 of 2: gather[s] waits, on the stream, on each row of rank s's mm in
    rank 0's heap copy of the counts ([s, row], mm's instances apart), and the tiles reach every
    rank's copy through their peer offsets. Nothing that waits goes before the kernel."""
    call = _prepared("lm_head_gather", 2, monkeypatch)
    counts = call.kernel_args["tds_count_mm"]
    # mm[i in cdiv(T, BT), j in cdiv(V / world, BV)], BT = 16, BV = 32: each rank's rows, in each copy
    rows, tiles = -(-call.env["T"] // 16), -(-call.env["V"] // (2 * 32))
    assert counts.numel() == 2 * rows * tiles and rows > 1
    for s, op in enumerate(call.copies["gather"]):
        assert [address for address, _ in op.waits] == \
            [counts.data_ptr() + 4 * (s * rows * tiles + row) for row in range(rows)]
        assert {expected for _, expected in op.waits} == {tiles} and not goes_first(op)
    peers = call.kernel_args["tds_countpeers_mm"]
    assert peers[0] == 0 and peers[1] != 0  # element offsets to rank 1's copy of the counts


def test_a_chunk_is_local_exactly_where_its_source_and_target_are_this_ranks(monkeypatch):
    """At world 2 on rank 0, sp_ag_attention gathers rank 0's own pieces (s = 0) within the GPU and
    pulls rank 1's; only the own pieces, which wait on nothing, go before the kernel."""
    call = _prepared("sp_ag_attention", 2, monkeypatch)
    for family in ("gk", "gv"):
        ops = call.copies[family]
        assert sum(op.local for op in ops) == len(ops) // 2
        assert all(goes_first(op) == op.local for op in ops)


class _Recorder:
    """A JIT function or a heap that records, in one shared list, what was asked of it."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def warmup(self, *args, grid, **kwargs):
        self.log.append((self.name, "warmup", grid))

    def barrier(self):
        self.log.append((self.name, "barrier"))


def test_a_distributed_calls_first_launch_compiles_everything_then_meets_every_rank(monkeypatch):
    """The first rank to compile must not spin at the entry barrier while a peer still compiles (it
    timed out there at world 8 on one H200): entry and kernel are compiled first, then the host meets."""
    from types import SimpleNamespace

    from tiledsl.runtime.issue import Issuing, PreparedCall
    log = []
    monkeypatch.setattr(sync, "barrier_all", _Recorder(log, "barrier_all"))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # no CUDA here
    issuing = Issuing()
    issuing.spec = SimpleNamespace(distributed=True, spans_nodes=False, kernel=_Recorder(log, "kernel"))
    issuing.heap = _Recorder(log, "heap")
    issuing._epoch_cell, issuing.max_spins = torch.zeros(1), 10
    call = PreparedCall(env={}, diag=torch.zeros(1), staged=[], barrier=(torch.zeros(1),), kernel_args={"x": 1},
                        copies={}, roles={"tds_RUN_a": True}, grid=4, options={}, fold=False, counts=[])
    assert issuing._must_meet(call)
    issuing._compile_then_meet(call)
    assert log == [("barrier_all", "warmup", (1,)), ("kernel", "warmup", (4,)), ("heap", "barrier")]
    # launched once (a compiled kernel to relaunch, or rebound to new tensors from one): no meeting again
    assert not issuing._must_meet(dataclasses.replace(call, issued=True))
    assert not issuing._must_meet(dataclasses.replace(call, kernel_replay=object()))
    issuing.spec.distributed = False
    assert not issuing._must_meet(call)
