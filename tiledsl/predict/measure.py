"""What the predictor's rates are that one GPU can show, measured on it (`tiledsl calibrate`). Every
figure is the median of several windows of back-to-back calls timed by CUDA events, each output
checked first on fresh random inputs:

- `sms`: the device's SM count;
- `call_us`: programs/copy.tds on 4096 elements replayed from its CUDA graph (a call's floor);
- `hbm_gbps`: programs/copy.tds on 512 MB, bytes read and written per second, every SM copying, the
  best of a few block sizes (`COPY_BLOCKS`); `sm_hbm_gbps` the same on one SM (`num_sms=1`, 64 MB);
- `ce_local_gbps`: a 256 MB copy within the GPU through cuMemcpyAsync (torch's `copy_`, as the
  copy-engine chunks issue theirs); `ce_op_us`: a 4-byte one, per operation, replayed from a CUDA
  graph as a call's stream operations are;
- `wait_release_us` (informing `wait_us` and `release_us`, which stay as set): what a wait whose
  signal is there and a release store add to a tile, a chain of copy tiles against copy.tds, one SM;
- `products`: programs/gemm.tds (the product tile, BM = 128, BN = 256) timed at products of one to
  several waves, to which calibrate.py fits `tile_fixed_us` and `sm_tflops`.

Links (NVLink, IB), the copy engines a stream runs at once and a signal's latency need more than one
GPU: they are not measured here."""
from __future__ import annotations

from tiledsl import library
from tiledsl.runtime import timing

# (M, K, N) of the product tile's calibration: from under one wave of 132 SMs to several
PRODUCTS = ((1024, 4096, 2048), (4096, 4096, 4096), (8192, 4096, 4096), (8192, 1024, 8192), (8192, 8192, 8192),
            (4096, 8192, 2048))


# copy.tds's block sizes (bf16 elements a tile) for the memory rates: its own 1024 and two larger
COPY_BLOCKS = (1024, 4096, 16384)


class CalibrationError(RuntimeError):
    """A measurement that cannot be made here (no GPU) or whose output was wrong."""


def gpu_us(fn, calls: int = 50, windows: int = 7, warmup: int = 3) -> float:
    """Median over `windows` of the GPU time per call of `calls` back-to-back calls, in microseconds
    (tiledsl.runtime.timing, the timer the ops' tuner and the benchmarks use too)."""
    return timing.median_us(fn, calls=calls, windows=windows, warmup=warmup)


def _checked(name: str, got, want, tol: float) -> None:
    error = float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30))
    if not error <= tol:  # NaN fails too: outputs start poisoned
        raise CalibrationError(f"{name}: the output is wrong (max relative error {error:.3g}, tolerance {tol})")


def _copy_program(n: int, **options):
    import torch

    import tiledsl
    program = tiledsl.compile(library.program("copy"), **options)
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.full_like(x, float("nan"))
    program(x, y)
    _checked(f"copy.tds N={n}", y, x, 0.0)
    return lambda: program(x, y, check=False)


OPS_A_GRAPH = 100  # 4-byte copies captured in one CUDA graph for ce_op_us

# copy.tds's tiles on one program, each waiting on the one before it (whose signal is there: the same
# program wrote it) and releasing the next: against copy.tds's on one program, what a wait's read and
# a release store into one rank's slot cost a program together (simulate._sync_us)
WAIT_CHAIN = """program wait_chain
param N
const BLOCK = 1024
in  X : bf16[N]
out Y : bf16[N]
tile step[i in N / BLOCK] on sms(1): Y[i*BLOCK : +BLOCK] = X[i*BLOCK : +BLOCK]
step[i] after step[i - 1]
"""
CHAIN_TILES = 4096


def _stream_op_us(copy, log) -> tuple[float, str]:
    """(us, source) of one operation on a stream as a replayed call runs it: OPS_A_GRAPH 4-byte copies
    captured in one CUDA graph, replayed back to back. Issued one by one from Python instead, a copy
    costs torch's dispatch on the host: 6.58 us on an H200 (bench/results/2026-12-04-s22), with which
    the history's small gemm_rs_ce rows are predicted ~19% slow (~27% fast at the assumed 3 us).
    That figure is logged beside; it is the one kept only where the capture fails."""
    import torch
    issued = gpu_us(copy, calls=500)
    log(f"ce_op_us issued from Python: {issued:.2f} us a copy")
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(OPS_A_GRAPH):
                copy()
        replayed = gpu_us(graph.replay, calls=5) / OPS_A_GRAPH
    except RuntimeError as why:  # a capture this torch or driver refuses: the issued figure, said so
        return round(issued, 2), (f"a 4-byte cuMemcpyAsync within the GPU issued back to back from Python, per "
                                  f"operation (its capture in a CUDA graph failed: {str(why).splitlines()[0]})")
    return round(replayed, 2), (f"{OPS_A_GRAPH} 4-byte cuMemcpyAsync within the GPU captured in one CUDA graph, "
                                f"replayed back to back, per operation (issued from Python: {issued:.2f} us)")


def _wait_release_us(log) -> float:
    """Microseconds a tile's wait (its signal there) and release add to its program: WAIT_CHAIN
    against copy.tds, both on one SM over CHAIN_TILES tiles of 1024 elements."""
    import torch

    import tiledsl
    x = torch.randn(CHAIN_TILES * 1024, device="cuda", dtype=torch.bfloat16)
    times = {}
    for name, program in (("wait_chain", tiledsl.compile(WAIT_CHAIN)),
                          ("copy.tds", tiledsl.compile(library.program("copy"), num_sms=1))):
        y = torch.full_like(x, float("nan"))
        program(x, y)
        _checked(f"{name} on one SM", y, x, 0.0)
        times[name] = gpu_us(lambda program=program, y=y: program(x, y, check=False), calls=5, windows=5)
        log(f"{name}: {CHAIN_TILES} tiles on one SM in {times[name]:.1f} us")
    return (times["wait_chain"] - times["copy.tds"]) / CHAIN_TILES


def measure(log=print) -> dict:
    """Every rate this GPU shows, by field name, and for each how it was measured (`sources`)."""
    import torch
    if not torch.cuda.is_available():
        raise CalibrationError("calibrate measures the GPU it runs on, and this machine has none that torch sees "
                               "(torch.cuda.is_available() is False); refit from measured figures on the CPU with "
                               "`python -m tiledsl.predict.calibrate gemm_tile.json`")
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    got: dict = {"gpu": torch.cuda.get_device_name(0), "sms": props.multi_processor_count}
    sources: dict = {"sms": "the device's multi_processor_count"}

    got["call_us"] = round(gpu_us(_copy_program(4096), calls=200), 2)
    sources["call_us"] = "programs/copy.tds on 4096 bf16 elements, replayed from its CUDA graph, back to back"
    log(f"call_us {got['call_us']}")

    # The model's memory rates are what a streaming tile can reach: copy.tds at its own 1024-element
    # block reached 1079 GB/s on all SMs and 10 GB/s on one (2026-12-04, an H200: a latency-bound
    # 2 KB tile), which made every memory-bound prediction 2-3x too slow (gemm_ar's skinny tiles).
    # So the best over a few blocks, each logged, and the block that gave it named.
    big = 256 << 20  # elements: 512 MB of bf16
    one = 32 << 20   # 64 MB on one SM
    for field, n, options, calls, windows, where in (
            ("hbm_gbps", big, {}, 5, 7, "512 MB, every SM"),
            ("sm_hbm_gbps", one, {"num_sms": 1}, 1, 3, "64 MB on one SM (num_sms=1)")):
        rates = {}
        for block in COPY_BLOCKS:
            rates[block] = 2 * 2 * n / gpu_us(_copy_program(n, BLOCK=block, **options), calls=calls,
                                              windows=windows) / 1e3
            log(f"{field}: copy.tds BLOCK={block} on {where}: {rates[block]:.1f} GB/s")
        best = max(rates, key=rates.get)
        got[field] = round(rates[best], 1)
        sources[field] = (f"programs/copy.tds on {where}, bytes read + written per second, the best of BLOCK = "
                          f"{', '.join(map(str, COPY_BLOCKS))} elements (BLOCK={best}: " +
                          ", ".join(f"{b}: {r:.0f}" for b, r in rates.items()) + " GB/s)")
    log(f"hbm_gbps {got['hbm_gbps']}, sm_hbm_gbps {got['sm_hbm_gbps']}")

    src = torch.randn(128 << 20, device="cuda", dtype=torch.bfloat16)
    dst = torch.full_like(src, float("nan"))
    dst.copy_(src)
    _checked("256 MB copy", dst, src, 0.0)
    got["ce_local_gbps"] = round(src.numel() * 2 / gpu_us(lambda: dst.copy_(src, non_blocking=True), calls=5) / 1e3, 1)
    sources["ce_local_gbps"] = "a 256 MB copy within the GPU by cuMemcpyAsync (torch copy_): bytes copied per second"
    cell, other = torch.arange(1, device="cuda", dtype=torch.int32), torch.zeros(1, device="cuda", dtype=torch.int32)
    got["ce_op_us"], sources["ce_op_us"] = _stream_op_us(lambda: other.copy_(cell, non_blocking=True), log)
    log(f"ce_local_gbps {got['ce_local_gbps']}, ce_op_us {got['ce_op_us']}")

    try:
        got["wait_release_us"] = round(_wait_release_us(log), 3)
        sources["wait_release_us"] = (f"programs/copy.tds's tiles on one SM, each waiting on the one before it "
                                      f"({CHAIN_TILES} tiles), against copy.tds on one SM: a wait's read and a "
                                      "release store together, per tile (wait_us + release_us for one rank)")
        log(f"wait_release_us {got['wait_release_us']}")
    except CalibrationError:
        raise
    except Exception as why:  # noqa: BLE001 - a probe that cannot run here leaves the rates it would inform
        log(f"wait_release_us not measured: {type(why).__name__}: {str(why).splitlines()[0]}")

    import tiledsl
    gemm = tiledsl.compile(library.program("gemm"))
    rows = []
    for M, K, N in PRODUCTS:
        A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        C = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(A, B, C)
        _checked(f"gemm.tds {M}x{K}x{N}", C, A @ B, 2e-2)
        ms = gpu_us(lambda: gemm(A, B, C, check=False), calls=10) / 1e3
        rows.append({"M": M, "K": K, "N": N, "tiledsl": ms})
        log(f"gemm {M}x{K}x{N}: {ms * 1e3:.1f} us")
    got["products"] = rows
    return {"rates": got, "sources": sources}
