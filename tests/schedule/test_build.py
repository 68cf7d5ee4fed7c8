"""build_schedule: the mistakes it names, each at its line and column, and the schedule it builds."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import sympy

from tiledsl.diagnostics import TdsError
from tiledsl.pipeline import run
from tiledsl.schedule import ir

ROOT = Path(__file__).resolve().parents[2]


def tds(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def build_errors(source: str) -> list:
    with pytest.raises(TdsError) as raised:
        run(source, until="schedule")
    return raised.value.diagnostics


def the_error(source: str, message: str):
    found = [d for d in build_errors(source) if d.message == message]
    assert found, [d.message for d in build_errors(source)]
    return found[0]


def at(diagnostic) -> tuple[int, int]:
    return diagnostic.span.line, diagnostic.span.column


COPY = tds("""
    program copy
    param N
    const BLOCK = 64
    in  X : f32[N]
    out Y : f32[N]
    tile cp[i in N/BLOCK]: Y[i*BLOCK : +BLOCK] = X[i*BLOCK : +BLOCK]
    """)


def test_unknown_name_suggests_the_closest_one():
    error = the_error(COPY.replace("N/BLOCK", "N/BLOK"), "unknown name 'BLOK'")
    assert at(error) == (6, 16)
    assert error.hint == "did you mean 'BLOCK'?"


def test_duplicate_declaration_points_at_both():
    error = the_error(COPY.replace("out Y", "out X"), "'X' is already declared")
    assert at(error) == (5, 5)
    assert [(n.message, n.span.line, n.span.column) for n in error.notes] == \
        [("'X' was first declared here", 4, 5)]


def test_chunk_between_dtypes_is_refused():
    source = tds("""
        program convert
        param N
        in   X : f32[N]
        symm S : bf16[N]
        chunk c[s in world] on copy_engine: X -> S@s[:]
        """)
    error = the_error(source, "the chunk copies float32 into bfloat16; chunks do not convert")
    assert at(error) == (5, 1)
    assert error.hint == "convert in a tile"


def test_matmul_inner_dimensions_must_match():
    source = tds("""
        program product
        param M, K, N
        in  A : bf16[M, K]
        in  B : bf16[N, K]
        out C : bf16[M, N]
        tile mm[i in 1]: C = A @ B
        """)
    error = the_error(source, "the inner dimensions of '@' differ: [M, K] @ [N, K]")
    assert at(error) == (6, 22)
    assert error.hint == "K must equal N"


def test_assignment_shape_must_match_its_target():
    source = COPY.replace("X[i*BLOCK : +BLOCK]", "X[i*BLOCK : +2*BLOCK]")
    error = the_error(source, "the value has shape [2*BLOCK] but its target 'Y' slice has [BLOCK]")
    assert at(error) == (6, 24)


def test_writing_an_in_tensor_is_refused():
    source = COPY.replace("Y[i*BLOCK : +BLOCK] =", "X[i*BLOCK : +BLOCK] =")
    error = the_error(source, "'X' is an `in` tensor and cannot be written")
    assert at(error) == (6, 24)
    assert error.hint == "declare it `inout` or `out`"


def test_unknown_dtype_suggests_the_closest_one():
    error = the_error(COPY.replace("f32[N]\nout", "f23[N]\nout"), "unknown dtype 'f23'")
    assert at(error) == (4, 9)
    assert error.hint in ("did you mean 'f32'?", "did you mean 'f16'?")


def test_unknown_engine_suggests_the_closest_one():
    source = tds("""
        program engine
        param N
        in   X : f32[N]
        symm S : f32[N]
        chunk c[s in world] on copy_engin: X -> S@s[:]
        """)
    error = the_error(source, "unknown engine 'copy_engin'")
    assert at(error) == (5, 24)
    assert error.hint == "did you mean 'copy_engine'?"


def test_all_mistakes_are_reported_together():
    source = COPY.replace("N/BLOCK", "N/BLOK").replace("f32[N]\nout", "f23[N]\nout")
    assert {d.message for d in build_errors(source)} >= {"unknown name 'BLOK'", "unknown dtype 'f23'"}


def test_ag_gemm_builds_regions_and_edge_maps_as_sympy():
    schedule = run(ROOT / "programs" / "ag_gemm.tds", until="schedule").schedule
    M, world = ir.size_symbol("M"), ir.WORLD
    i = ir.index_symbol("i")
    assert schedule.tensors["A"].shape == (M / world, ir.size_symbol("K"))
    gather, mm = schedule.families["gather"], schedule.families["mm"]
    assert gather.engine.kind is ir.EngineKind.COPY_ENGINE and mm.engine.programs is None
    assert gather.reads[0].owner == ir.index_symbol("s")
    (edge,) = schedule.edges
    assert (edge.consumer, edge.producer, edge.ranks) == ("mm", "gather", ir.RankSet.LOCAL)
    assert sympy.simplify(edge.index_map[0] - sympy.floor(ir.size_symbol("BM") * i * world / M)) == 0
    assert {c.message for c in schedule.conditions} == {"M must be divisible by world", "M/world must be divisible by BM"}


# ---- require ---------------------------------------------------------------------------------------

REQUIRE = tds("""
    program req
    param N
    const BLOCK = 1024
    require N % (2 * BLOCK) == 0   # whole pairs of blocks
    require N >= 4 * BLOCK
    in  X : bf16[N]
    out Y : bf16[N]
    tile cp[i in N / BLOCK]: Y[i*BLOCK : +BLOCK] = X[i*BLOCK : +BLOCK]
""")


def test_require_becomes_a_launch_condition_with_its_text_and_line():
    schedule = run(REQUIRE, until="schedule").schedule
    stated = [c for c in schedule.conditions if c.message.endswith("is required")]
    assert [(c.message, c.span.line) for c in stated] == [("N % (2 * BLOCK) == 0 is required", 4),
                                                         ("N >= 4 * BLOCK is required", 5)]
    N, BLOCK = ir.size_symbol("N"), ir.size_symbol("BLOCK")
    assert stated[1].holds == sympy.Ge(N, 4 * BLOCK)


def test_the_generated_launcher_checks_require_before_anything_runs():
    from tiledsl.api import build_module
    module = build_module(REQUIRE, {})
    env = {"rank": 0, "world": 2, "BLOCK": 1024}
    failed = [message for ok, message in module.tds_SPEC.conditions({**env, "N": 3072}) if not ok]
    assert len(failed) == 2 and failed[0].startswith("N % (2 * BLOCK) == 0 is required (")
    assert all(ok for ok, _ in module.tds_SPEC.conditions({**env, "N": 8192}))


def test_a_require_that_can_never_hold_is_refused_at_its_line():
    found = the_error(REQUIRE.replace("require N >= 4 * BLOCK", "require 1 > 2"), "'1 > 2' can never hold")
    assert at(found) == (5, 1)


def test_a_require_on_consts_that_fails_is_refused_by_the_checker():
    source = REQUIRE.replace("require N >= 4 * BLOCK", "require BLOCK >= 4096")
    with pytest.raises(TdsError, match=r"BLOCK >= 4096 is required, and it is not \(BLOCK = 1024\)"):
        run(source, until="check")


# A family's program count may be a const, fixed when the program is built with its consts.
OWN_SMS = tds("""
    program own
    param N
    const BLOCK = 64, SMS = 8
    in  X : f32[N]
    out Y : f32[N]
    out Z : f32[N]
    tile cp[i in N/BLOCK] on sms(SMS): Y[i*BLOCK : +BLOCK] = X[i*BLOCK : +BLOCK]
    tile dbl[i in N/BLOCK]: Z[i*BLOCK : +BLOCK] = 2 * X[i*BLOCK : +BLOCK]
    """)


def test_a_program_count_may_be_a_const_and_follows_its_value_when_built():
    assert run(OWN_SMS, until="check").schedule.families["cp"].engine.count({"SMS": 8}) == 8
    assert [f.programs for f in run(OWN_SMS, until="plan", consts={"SMS": 24}).plan.families] == [24, None]
    # a build's -D value: the checker runs at it, so it is refused at the engine's line, as if written there
    with pytest.raises(TdsError) as raised:
        run(OWN_SMS, until="plan", consts={"SMS": 132})
    (error,) = raised.value.diagnostics
    assert error.message == "the families ask for all 132 SMs of the H200, leaving none for 'dbl' (sms(rest))"
    assert at(error) == (7, 23)


def test_a_const_program_count_that_leaves_no_sm_for_the_rest_is_refused_by_the_checker():
    """The checker counts a family's programs at its const's value: 131 leaves one SM for 'dbl', 132 none."""
    assert run(OWN_SMS.replace("SMS = 8", "SMS = 131"), until="check").warnings == []
    with pytest.raises(TdsError) as raised:
        run(OWN_SMS.replace("SMS = 8", "SMS = 132"), until="check")
    (error,) = raised.value.diagnostics
    assert error.message == "the families ask for all 132 SMs of the H200, leaving none for 'dbl' (sms(rest))"
    assert at(error) == (7, 23)


def test_a_program_count_of_a_param_is_refused_with_a_hint():
    found = the_error(OWN_SMS.replace("sms(SMS)", "sms(N)"),
                      "a program count must be known at compile time; this depends on ['N']")
    assert at(found) == (7, 30) and found.hint == "consts are known at compile time"


def test_a_switch_const_may_be_set_to_0_at_build_time_a_size_may_not():
    """sp_ulysses' CAUSAL = 1 is built at 0 for full attention; a block size of 0 divides by zero."""
    from tiledsl import pipeline
    from tiledsl.diagnostics import TdsError
    source = "program p\nparam N\nconst BN = 16, FLAG = 1\nin X : f32[N]\nout Y : f32[N]\n" \
             "tile t[i in cdiv(N, BN)]: Y[i*BN : +BN] = X[i*BN : +BN] * FLAG\n"
    assert pipeline.run(source, until="check", consts={"FLAG": 0}).schedule.consts["FLAG"] == 0
    with pytest.raises(TdsError, match="BN = 0 is set at build time, but a const must be a positive integer"):
        pipeline.run(source, until="check", consts={"BN": 0})
    with pytest.raises(TdsError, match=r"FLAG = -1 .* \(or 0, for a switch declared 0 or 1\)"):
        pipeline.run(source, until="check", consts={"FLAG": -1})
