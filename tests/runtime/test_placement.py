"""Where ranks run (tiledsl.runtime.placement), on CPU: the decision from ranks, GPUs and torchrun's
variables; the host collectives through the CPU on gloo ranks; what `tiledsl run` on GPUs compares and
poisons; the benchmarks' refusal; and the entry barrier of a program for nodes, built for one node, which
NVSHMEM's module init must not be asked to initialise."""
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tiledsl.runtime import placement
from tiledsl.runtime.placement import decide

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("world, gpus, shared, devices", [
    (8, 1, True, [0] * 8), (4, 2, True, [0, 1, 0, 1]), (2, 4, False, [0, 1]), (4, 4, False, [0, 1, 2, 3]),
    (3, 2, True, [0, 1, 0]), (1, 1, False, [0])])
def test_rank_r_runs_on_gpu_r_mod_count_and_more_ranks_than_gpus_share(world, gpus, shared, devices):
    places = [decide(rank, world, gpus, {}) for rank in range(world)]
    assert [p.device for p in places] == devices
    assert {p.shared for p in places} == {shared}
    assert {p.backend for p in places} == {"gloo" if shared else "nccl"}
    assert places[0].per_gpu == -(-world // gpus)
    if shared:
        assert f"{world} ranks share {gpus} GPU" in places[0].describe()


def test_torchrun_local_ranks_number_the_ranks_of_each_machine():
    # 2 machines of 4 ranks, 2 GPUs each: local rank 3 of its machine on GPU 1, shared
    place = decide(7, 8, 2, {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"})
    assert (place.local_rank, place.local_world, place.device, place.shared) == (3, 4, 1, True)
    assert not decide(7, 8, 4, {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}).shared


@pytest.mark.parametrize("environ", [
    {"LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "2"},      # a local rank past its machine
    {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "3"},      # a machine size that does not divide the world
    {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"},      # rank 5 cannot be local rank 0 of 4
    {"LOCAL_RANK": "x", "LOCAL_WORLD_SIZE": "4"}, {"LOCAL_RANK": "1"}])
def test_local_ranks_that_disagree_with_the_rank_are_not_trusted(environ):
    place = decide(5, 8, 1, environ)
    assert (place.local_rank, place.local_world, place.device, place.shared) == (5, 8, 0, True)


def test_no_gpu_is_refused_by_name():
    with pytest.raises(RuntimeError, match="found no GPU.*--emulate"):
        decide(0, 2, 0, {})


def test_a_shared_gpu_gives_each_rank_its_share_of_the_heap(monkeypatch):
    class Properties:
        total_memory = 140 << 30
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Properties)
    eight = decide(0, 8, 1, {})
    assert placement.heap_bytes(16 << 30, eight) == (140 << 30) // 2 // 8 // (1 << 20) * (1 << 20)
    assert placement.heap_bytes(1 << 30, eight) == 1 << 30
    assert placement.heap_bytes(16 << 30, decide(0, 2, 2, {})) == 16 << 30  # one rank a GPU: as asked


def test_nvshmem_sizes_read_as_nvshmem_reads_them():
    from tiledsl.runtime.heap import _size_bytes
    assert _size_bytes(str(16 << 30)) == 16 << 30
    assert _size_bytes("2G") == 2 << 30 and _size_bytes("512M") == 512 << 20 and _size_bytes("1.5g") == 3 << 29
    assert _size_bytes("") == 1 << 30 and _size_bytes("lots") == 1 << 30


# ---- the host collectives on gloo, CUDA tensors stood in for by a CPU subclass --------------------

def _collectives_rank(rank, world, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo")
    from tiledsl.runtime import placement as host
    # the path of CUDA tensors on gloo, through the CPU: here every tensor takes it
    host._via_cpu = lambda t, group=None: True
    got = {}
    torch.manual_seed(rank)
    x = (torch.arange(6, dtype=torch.float32).view(3, 2) + 10 * rank).to(torch.bfloat16)
    total = x.float().clone()
    host.all_reduce(total)
    got["all_reduce"] = total
    out = torch.empty(3 * world, 2, dtype=torch.bfloat16)
    host.all_gather_into_tensor(out, x)
    got["all_gather_into_tensor"] = out.float()
    parts = [torch.empty(3, 2, dtype=torch.float8_e4m3fn) for _ in range(world)]
    host.all_gather(parts, x.float().to(torch.float8_e4m3fn))
    got["all_gather_fp8"] = torch.stack([p.float() for p in parts])
    scattered = torch.empty(3, 2)
    host.reduce_scatter_tensor(scattered, torch.arange(3 * world * 2, dtype=torch.float32).view(3 * world, 2) + rank)
    got["reduce_scatter_tensor"] = scattered
    ids = torch.tensor([rank, 7], dtype=torch.int32)
    host.broadcast(ids, 1)
    got["broadcast"] = ids
    rows = torch.full((rank + 1, 2), float(rank), dtype=torch.bfloat16)      # rank r sends r + 1 rows to each
    back = torch.empty(sum(r + 1 for r in range(world)), 2, dtype=torch.bfloat16)
    host.all_to_all_single(back, torch.cat([rows] * world), [r + 1 for r in range(world)], [rank + 1] * world)
    got["all_to_all_single"] = back.float()
    flat = torch.tensor([1.0 * rank, 2.0])                                   # a 1-d tensor: rows are elements
    flat_back = torch.empty(world)
    host.all_to_all_single(flat_back, torch.cat([flat[:1]] * world), [1] * world, [1] * world)
    got["all_to_all_1d"] = flat_back
    results.put((rank, {k: v.tolist() for k, v in got.items()}))  # by value: a tensor's memory leaves with us
    dist.destroy_process_group()


def test_host_collectives_through_the_cpu_match_what_torch_defines():
    world = 2
    context = mp.get_context("spawn")
    results = context.Queue()
    port = 29500 + (os.getpid() * 7) % 1000
    procs = [context.Process(target=_collectives_rank, args=(r, world, port, results)) for r in range(world)]
    for p in procs:
        p.start()
    got = {rank: {k: torch.tensor(v) for k, v in mine.items()} for rank, mine in
           (results.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(timeout=30)
    x = [(torch.arange(6, dtype=torch.float32).view(3, 2) + 10 * r).to(torch.bfloat16).float() for r in range(world)]
    for rank in range(world):
        mine = got[rank]
        assert torch.equal(mine["all_reduce"], sum(x))
        assert torch.equal(mine["all_gather_into_tensor"], torch.cat(x))
        assert torch.equal(mine["all_gather_fp8"], torch.stack([t.to(torch.float8_e4m3fn).float() for t in x]))
        whole = sum(torch.arange(3 * world * 2, dtype=torch.float32).view(3 * world, 2) + r for r in range(world))
        assert torch.equal(mine["reduce_scatter_tensor"], whole[3 * rank:3 * rank + 3])
        assert mine["broadcast"].tolist() == [1, 7]
        assert torch.equal(mine["all_to_all_single"], torch.cat([torch.full((r + 1, 2), float(r)) for r in range(world)]))
        assert mine["all_to_all_1d"].tolist() == [float(r) for r in range(world)]


# ---- what `tiledsl run` compares on GPUs -------------------------------------------------------------

def test_an_int_output_is_poisoned_with_its_minimum_not_nan():
    from tiledsl.tools.run_program import poison
    count = torch.empty(4, dtype=torch.int32)
    count.fill_(poison(count.dtype))  # what run_gpu does; NaN raised "cannot be converted to type int"
    assert count.tolist() == [torch.iinfo(torch.int32).min] * 4
    assert poison(torch.bfloat16) != poison(torch.bfloat16)  # NaN


def test_an_upto_output_is_compared_below_its_count_only():
    from tiledsl.tools.gpu_run import below_count
    from tiledsl.tools.run_program import compare, program_schedule
    schedule = program_schedule(ROOT / "programs" / "group_gemm.tds")
    name = next(n for n, t in schedule.tensors.items() if t.upto is not None and t.role.value in ("out", "inout"))
    upto = schedule.tensors[name].upto
    count = torch.tensor([2, 0, 3])
    want = torch.randn(3, 4, 5)
    got = want.clone()
    got[0, 2:] = float("nan")   # past the count: never written, unspecified
    got[2, 3:] = 1e9
    assert not compare(name, [got], [want], "f32").ok  # whole: the rows past the count fail
    mine, theirs, note = below_count(schedule, name, got, want, {upto: count})
    verdict = compare(name, [mine], [theirs], "f32")
    assert verdict.ok and verdict.max_error == 0.0 and note == f"; compared below {upto}"
    got[2, 1, 0] += 1.0          # below the count: still judged
    mine, theirs, _ = below_count(schedule, name, got, want, {upto: count})
    assert not compare(name, [mine], [theirs], "f32").ok


def test_an_output_a_rank_does_not_write_must_stay_as_passed_on_gpus():
    """reduce_root writes Y on rank 0 only (`if rank == 0`): run on GPUs compared rank 1's poisoned Y
    with the reference and said MISMATCH (inf) on an H200 at world 2; now, as emulated, rank 0 is
    compared and rank 1 must keep the NaN it was passed."""
    from tiledsl.tools.gpu_run import output_error
    from tiledsl.tools.reference import Reference
    from tiledsl.tools.run_program import launch_sizes, make_inputs, program_schedule, written_ranks
    schedule = program_schedule(ROOT / "programs" / "reduce_root.tds")
    sizes = launch_sizes(schedule, 2, {}, {}, 1)
    written = written_ranks(schedule, 2, sizes, {}, 1)
    assert written["Y"] == {0}
    inputs = make_inputs(schedule, 2, sizes, 0, {})
    expected = Reference(schedule, 2, sizes).run(inputs)
    total = (inputs[0]["X"].double() + inputs[1]["X"].double()).to(torch.bfloat16)
    assert torch.equal(expected[0]["Y"].to(torch.bfloat16), total)
    error, note = output_error(schedule, "Y", 0, 2, written, total.clone(), expected[0])
    assert error == 0.0 and note == "; left as passed on rank 1"
    wrong = total.clone()
    wrong[7] += 1.0
    assert output_error(schedule, "Y", 0, 2, written, wrong, expected[0])[0] > 1e-3
    poisoned = torch.full_like(total, float("nan"))
    assert output_error(schedule, "Y", 1, 2, written, poisoned, expected[1]) == (0.0, note)
    poisoned[3] = 0.0  # something wrote rank 1's copy
    assert output_error(schedule, "Y", 1, 2, written, poisoned, expected[1])[0] == float("inf")


# ---- benchmarks refuse ranks sharing a GPU ---------------------------------------------------------

def test_benchmarks_refuse_to_time_ranks_sharing_a_gpu_by_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(SystemExit, match="bench_overlap: refused: 4 ranks share 1 GPU.*means nothing"):
        placement.refuse_timing("bench_overlap")
    sys.path.insert(0, str(ROOT / "bench"))
    sys.modules.pop("common", None)
    monkeypatch.setattr(sys, "argv", ["bench/bench_collectives.py"])
    with pytest.raises(SystemExit, match="bench_collectives: refused"):
        import common  # noqa: F401  (refuses at import)
    sys.modules.pop("common", None)
    monkeypatch.setenv("WORLD_SIZE", "1")
    import common
    with pytest.raises(SystemExit, match="refused"):  # and at every timing, should ranks come to share later
        monkeypatch.setenv("WORLD_SIZE", "2")
        common.time_ms(lambda: None)
    sys.modules.pop("common", None)


# ---- a program for nodes built for one node -------------------------------------------------------

def test_barrier_nodes_on_one_node_holds_no_nvshmem_state_and_is_not_initialised():
    """Triton makes an int argument equal to 1 a constant: barrier_nodes with nodes == 1 loses every
    NVSHMEM call, the linker takes no NVSHMEM state along, and nvshmemx_cumodule_init failed on it with
    status 7 (hier_allreduce on one GPU). The hook now leaves such a module alone."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tiledsl.runtime import nvshmem_device, sync
    try:
        libs = tuple(nvshmem_device.extern_libs(90).items())
    except RuntimeError as error:
        pytest.skip(str(error))
    fn = sync.barrier_nodes
    seen = {}
    for nodes in (1, 2):
        signature = {name: "i32" for name in fn.arg_names}
        signature.update(bar_ptr="*i32", epoch_cell="*i32", diag_ptr="*i32", peers_bar="*i64", shmem_bar="*i64")
        constexprs = {}
        if nodes == 1:
            signature["nodes"], constexprs["nodes"] = "constexpr", 1
        kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                                target=GPUTarget("cuda", 90, 32), options={"extern_libs": libs})
        seen[nodes] = nvshmem_device.references_nvshmem(nvshmem_device._ptx(kernel))
    assert seen == {1: False, 2: True}
    assert nvshmem_device.references_nvshmem(None)  # PTX unknown: initialise, as before


def test_a_group_of_nccl_alone_on_a_shared_gpu_is_refused_by_name_and_gloo_is_told_once(monkeypatch, capsys):
    monkeypatch.setattr(placement, "current", lambda environ=None: decide(0, 4, 1, {}))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(placement, "_told", False)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    with pytest.raises(RuntimeError, match="4 ranks share 1 GPU.*NCCL refuses two ranks on one GPU.*gloo"):
        placement.settle()
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    for _ in range(3):
        assert placement.settle().device == 0
    err = capsys.readouterr().err
    assert err.count("4 ranks share 1 GPU") == 1 and "no time means anything" in err


def test_a_heap_on_a_shared_gpu_refuses_torch_symmetric_memory_by_name(monkeypatch):
    from tiledsl.runtime import heap
    monkeypatch.setattr(placement, "shared", lambda: True)
    monkeypatch.setattr(placement, "current", lambda environ=None: decide(1, 2, 1, {}))
    monkeypatch.setitem(sys.modules, "nvshmem", None)   # nvshmem4py missing
    monkeypatch.setitem(sys.modules, "nvshmem.core", None)
    with pytest.raises(RuntimeError, match="2 ranks share 1 GPU.*only NVSHMEM runs several ranks on one GPU"):
        heap.open_heap()
