"""Every program's kernel compiles for Hopper (sm_90) to a cubin on this CPU-only machine, fits in an
SM's shared memory, and its matrix products become wgmma (HGMMA in the SASS). About 30 s for all
programs with a cold Triton cache; `-m "not aot"` leaves them out."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tiledsl.api import build_module
from tiledsl.codegen.aot import report

pytestmark = pytest.mark.aot

ROOT = Path(__file__).resolve().parents[2]
# the library, and the experiments the benchmarks time beside it
PROGRAMS = sorted((ROOT / "programs").glob("*.tds")) + sorted((ROOT / "bench" / "experiments").glob("*.tds"))
MATMUL_PROGRAMS = {"ag_gemm", "ag_gemm_push", "gemm", "gemm_rs"}  # at least these; found from the modules
# tiles written as blocks whose products (plain tl.dot) have 64 rows or more: wgmma too. flash_decode's
# have the 8 query heads of a KV head as rows (a block of 16): mma.sync, no HGMMA.
BLOCK_WGMMA_PROGRAMS = {"sp_ag_attention", "sp_ulysses", "attention_local", "group_gemm_fp8"}
HOPPER_SHARED_BYTES = 227 * 1024  # the most one block may use on sm_90


def has_matmul(module) -> bool:
    return any(f.matmul for f in module.tds_SPEC.families)


@pytest.fixture(scope="module")
def reports():
    """One compile per program, shared by the tests below."""
    cache = {}

    def get(path):
        if path not in cache:
            module = build_module(path)
            cache[path] = (module, report(module, "sm_90"))
        return cache[path]
    return get


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.stem)
def test_kernel_compiles_for_sm90_to_a_cubin_that_fits_an_sm(reports, path):
    _, row = reports(path)
    assert row.cubin_bytes > 0
    assert row.shared_bytes <= HOPPER_SHARED_BYTES, f"{row.shared_bytes} bytes of shared memory"
    if row.sass:
        assert 0 < row.registers <= 255


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.stem)
def test_matrix_products_become_hgmma_and_nothing_else_does(reports, path):
    module, row = reports(path)
    if not row.sass:
        pytest.skip("cuobjdump is missing: the SASS cannot be read")
    if has_matmul(module) or path.stem in BLOCK_WGMMA_PROGRAMS:
        assert row.hgmma > 0, "the matmul did not become wgmma"
    elif "tl.dot(" not in Path(module.__file__).read_text():
        assert row.hgmma == 0


def test_the_gemm_programs_are_the_ones_with_matrix_products():
    found = {p.stem for p in PROGRAMS if p.parent.name == "programs" and has_matmul(build_module(p))}
    assert MATMUL_PROGRAMS <= found


# The products tiledsl.ops runs in fp32 too: the library's blocks are chosen for bf16, and in fp32 they
# need twice the shared memory (the first GPU run of the ops, 2026-12-01: "Required: 426032").
FP32_PRODUCTS = ["ag_gemm", "ag_gemm_push", "gemm_rs", "gemm_rs_pull", "gemm_rs_ce", "gemm_ar"]


@pytest.mark.parametrize("name", FP32_PRODUCTS)
def test_fp32_products_fit_an_sm_with_the_blocks_ops_picks_and_are_refused_by_name_without(name):
    from tiledsl.codegen.aot import compile_kernel
    from tiledsl.ops.context import fitted_blocks, library_consts
    from tiledsl.runtime.specs import SharedMemoryError, kernel_options

    consts, tunables = library_consts(name)
    refused = []
    for bk in tunables.get("BK", (consts["BK"],)):
        library = {**consts, "BK": bk}
        fitted = fitted_blocks(library, 4)
        assert fitted["BM"] == library["BM"]  # rows are padded to BM by the ops: never changed here
        module = build_module(ROOT / "programs" / f"{name}.tds", fitted)
        kernel = compile_kernel(module, "sm_90", dtype="float32")
        assert kernel.metadata.shared <= HOPPER_SHARED_BYTES, (fitted, kernel.metadata.shared)
        assert kernel.metadata.num_stages >= 2
        # the library's own blocks in fp32 (a user's tiledsl.compile with dtype_override): they fit, or
        # they are refused before any launch, by name, never by the driver at the first launch
        own = build_module(ROOT / "programs" / f"{name}.tds", library)
        try:
            kernel_options(own.tds_SPEC, 4)
        except SharedMemoryError as error:
            assert re.search(r"blocks \[\d+, \d+\] x \[\d+, \d+\] of 4-byte elements need \d+ bytes", str(error))
            refused.append(bk)
        else:
            assert compile_kernel(own, "sm_90", dtype="float32").metadata.shared <= HOPPER_SHARED_BYTES
    if name in ("ag_gemm", "ag_gemm_push"):  # 128 x 256 blocks with a TMA store: 327680 bytes at BK 64
        assert refused


# ---- the attention tile at 128 query rows (GPU run 2026-12-01: sp_ag_attention wrong on rank 1 at BM=128,
# BN=64, right at the defaults and right emulated) ------------------------------------------------------

ATTENTION = ROOT / "programs" / "sp_ag_attention.tds"


def _attention(warps: int | None = None, **consts):
    """The built module, or with `warps` a copy whose families ask for that many (build_module caches
    modules: the cached one stays as built)."""
    import dataclasses
    import types
    module = build_module(ATTENTION, consts)
    if warps is None:
        return module
    changed = types.ModuleType(module.__name__)
    changed.__dict__.update(module.__dict__)
    spec = module.tds_SPEC
    families = tuple(dataclasses.replace(f, warps=warps) for f in spec.families)
    changed.tds_SPEC = dataclasses.replace(spec, families=families)
    return changed


def test_the_report_counts_what_ptxas_spills_into_the_stack_frame():
    """A [128, 128] fp32 accumulator on 4 warps does not fit in 255 registers: ptxas spills it into
    the stack frame, which the report must show (it read LOCAL only, and said 0)."""
    row = report(_attention(warps=4, BM=128, BN=64), "sm_90")
    if not row.sass:
        pytest.skip("cuobjdump is missing: the resource usage cannot be read")
    assert row.spill_bytes > 0


def test_a_128_row_attention_tile_gets_8_warps_and_does_not_spill():
    """The warps follow the largest block a tile holds (codegen/blocks.py): 8 for a [128, 128] accumulator,
    which then fits in registers. On 4 warps this kernel spilled around the slow path of its waits (a
    call), the one place only rank 1's tiles reached mid-accumulation on the GPU."""
    module = _attention(BM=128, BN=64)
    assert [f.warps for f in module.tds_SPEC.families if f.name == "attn"] == [8]
    row = report(module, "sm_90")
    if not row.sass:
        pytest.skip("cuobjdump is missing: the resource usage cannot be read")
    assert row.spill_bytes == 0 and 0 < row.registers <= 255


@pytest.mark.parametrize("name", ["moe_dispatch", "moe_dispatch_fp8", "ag_group_gemm", "moe_gemm_rs"])
def test_a_ranged_wait_reads_its_slots_all_at_once_then_fences_once(name):
    """A wait over thousands of a producer's slots (sync.wait_span) reads them with relaxed loads, all
    in flight together, then one fence.acq_rel makes them an acquire. Read as acquire loads, each of a
    thread's lanes went one round trip after another: MoE dispatch took 3.5 ms at 4096 tokens a rank on
    one H200, nearly all of it in its pulls' ranged waits (bench/NOTES.md, session 13)."""
    from tiledsl.codegen.aot import compile_kernel
    module = build_module(ROOT / "programs" / f"{name}.tds")
    ranged = Path(module.__file__).read_text().count("tds_sync.wait_span(")
    ptx = compile_kernel(module).asm["ptx"]
    assert ranged and ptx.count("ld.relaxed.sys.global.b32") >= 32 * ranged
    assert ptx.count("fence.acq_rel.sys") == ranged


# A block tile that reads a whole dimension holds all of it: [64, 1024] x [1024, 64] of f32 is a MB of
# shared memory (issue 24: build --arch reported 1.5 MB without a word). Its hint, a loop over K, fits.
WHOLE_K = """\
program whole_k
param M, N
const KK = 512, BM = 64, BN = 64, BK = 64
in  A : f32[M, KK]
in  B : f32[KK, N]
out C : f32[M, N]
tile mm[i in cdiv(M, BM), j in cdiv(N, BN)]:
    a = A[i*BM : +BM, :]
    C[i*BM : +BM, j*BN : +BN] = a @ B[:, j*BN : +BN]
"""
SPLIT_K = WHOLE_K.replace("""\
    a = A[i*BM : +BM, :]
    C[i*BM : +BM, j*BN : +BN] = a @ B[:, j*BN : +BN]
""", """\
    acc = 0
    for k in cdiv(KK, BK):
        acc = acc + A[i*BM : +BM, k*BK : +BK] @ B[k*BK : +BK, j*BN : +BN]
    C[i*BM : +BM, j*BN : +BN] = acc
""")


def test_a_kernel_past_the_shared_memory_of_an_sm_is_refused_at_its_tile_and_the_hint_fits(tmp_path):
    # KK = 512: 278528 bytes, past the 232448 (KK = 1024 needed 540672 and took 105 s to compile twice)
    from tiledsl.tools.build_arch import compile_report
    from tiledsl.diagnostics import TdsError
    path = tmp_path / "whole_k.tds"
    path.write_text(WHOLE_K)
    with pytest.raises(TdsError) as refused:
        compile_report(path, "sm_90")
    (found,) = refused.value.diagnostics
    need = int(re.search(r"needs (\d+) bytes", found.message)[1])
    assert found.span.line == 7 and "tile 'mm'" in found.message and need > HOPPER_SHARED_BYTES
    assert "for k in cdiv(K, BK)" in found.hint
    path.write_text(SPLIT_K)
    assert "(arch sm_90)" in compile_report(path, "sm_90")


CARRIED_FROM_AN_INTEGER = """\
program carried_int
param N, P
in U : f32[P, N]
out W : f32[N]
tile red[i in cdiv(N, 4)]:
    d = 0
    for c in P:
        d = d * 0.5 + 1.0
    W[i*4 : +4] = U[0, i*4 : +4] + d
"""


def test_a_carried_scalar_that_starts_as_an_integer_compiles_as_the_float_it_becomes():
    # generated bodies, seed 242: Triton keeps a loop-carried value's first type, so `d = 0` carried as
    # `d * 0.5 + 1.0` was int32 re-assigned fp32 and only the GPU's compile refused it (emulation runs
    # Python); the start is now a float32 0-d block
    module = build_module(CARRIED_FROM_AN_INTEGER)
    assert "d = tl.zeros([], tl.float32)\n" in Path(module.__file__).read_text()
    assert report(module, "sm_90").spill_bytes == 0


# read by tests/schedule/test_bodies.py too, which runs it on emulated ranks
GPU_ONLY_REFUSALS = (Path(__file__).resolve().parents[1] / "schedule" / "reproducers"
                     / "gpu_only_refusals.tds").read_text()


def test_what_only_the_sm_90_compile_refused_in_generated_bodies_compiles():
    # generated bodies, seeds 105, 134, 172, 209, 211 and 247 compiled for sm_90 (TDS_BODIES_COMPILES): an fp8
    # product whose K block was 16 (tl.dot takes 32 for 8-bit operands), a product whose K step was a
    # `const BK = 8` (16 at least), a float carried from an i64 block, `i8 / f32` and exp of an i8 block
    # (div_rn and exp take fp32); seeds 1354, 1510 and 1762 a cast of a constant (`bf16(0.5)`: a Python
    # float has no `.to` there); emulation runs all of them, only the GPU's compiler refused
    row = report(build_module(GPU_ONLY_REFUSALS), "sm_90")
    assert row.spill_bytes == 0 and row.shared_bytes < HOPPER_SHARED_BYTES
