"""What code generation cannot emit is refused by the checker, at the line, with a hint
(codegen/emittable.py): a program `tiledsl check` accepts always builds. Issue 24's cases: a copy-engine
chunk waiting on what is not rows of a kernel family, `@` reading a peer's copy through a TMA
descriptor, f64 tensors."""
from __future__ import annotations

import textwrap

import pytest

from tiledsl.diagnostics import TdsError
from tiledsl.pipeline import run


def tds(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def refusal(source: str):
    with pytest.raises(TdsError) as raised:
        run(source, until="check")
    (found,) = [d for d in raised.value.diagnostics if d.severity == "error"]
    return found


def at(source: str, text: str) -> tuple[int, int]:
    line = next(n for n, row in enumerate(source.splitlines(), 1) if text in row)
    return line, source.splitlines()[line - 1].index(text) + 1


CE_WAITS_ON_ALL = tds("""
    program ce_all
    param M, N
    const BR = 32
    in  X : f32[M, N]
    local W : f32[M, N]
    symm Y : f32[M, N]
    out Z : f32[M, N]
    tile mk[i in cdiv(M, BR)]: W[i*BR : +BR, :] = X[i*BR : +BR, :] * 2
    chunk send on copy_engine: W -> Y@((rank + 1) mod world)[:, :]
    tile cp[i in cdiv(M, BR)]: Z[i*BR : +BR, :] = Y[i*BR : +BR, :]
    send after mk[*]
    cp[i] after send @ ((rank - 1) mod world)
""")


def test_a_copy_engine_chunk_waiting_on_every_tile_builds():
    """Once refused (the stream waited on one row's count only): `mk[*]` is a wait on each row."""
    plan = run(CE_WAITS_ON_ALL, until="module").plan
    wait, = next(f for f in plan.families if f.name == "send").host.waits
    assert [str(v) for v, _ in wait.loops] == ["tds_row"] and wait.writer is None


def test_a_copy_engine_chunk_waiting_on_a_column_of_tiles_is_refused_at_the_edge_and_its_hint_is_accepted():
    source = CE_WAITS_ON_ALL.replace("tile mk[i in cdiv(M, BR)]: W[i*BR : +BR, :] = X[i*BR : +BR, :] * 2",
                                     "tile mk[i in cdiv(M, BR), j in 1]: W[i*BR : +BR, :] = X[i*BR : +BR, :] * 2")
    source = source.replace("send after mk[*]", "send after mk[*, 0]")
    found = refusal(source)
    assert (found.span.line, found.span.column) == at(source, "mk[*, 0]")
    assert "copy engine can wait only on rows of a kernel family" in found.message and "on sms" in found.hint
    run(source.replace("on copy_engine", "on sms(4)"), until="module")  # the hint builds


PEER_PRODUCT = tds("""
    program peer_mm
    param M, K, N
    const BM = 64, BN = 64
    in  X : f32[M, K]
    symm A : f32[M, K]
    in  B : f32[K, N]
    out C : f32[M, N]
    chunk put on sms(4): X -> A[:, :]
    tile mm[i in cdiv(M, BM), j in cdiv(N, BN)]: C[i*BM : +BM, j*BN : +BN] = A@((rank + 1) mod world)[i*BM : +BM, :] @ B[:, j*BN : +BN]
    mm[i, j] after put @ ((rank + 1) mod world)
""")

PEER_PRODUCT_AS_BLOCK = PEER_PRODUCT.replace(
    "C[i*BM : +BM, j*BN : +BN] = A@((rank + 1) mod world)[i*BM : +BM, :] @ B[:, j*BN : +BN]",
    "\n    a = A@((rank + 1) mod world)[i*BM : +BM, :]\n    C[i*BM : +BM, j*BN : +BN] = a @ B[:, j*BN : +BN]")


def test_a_product_of_a_peers_copy_is_refused_at_the_operand_and_its_hint_is_accepted():
    found = refusal(PEER_PRODUCT)
    assert (found.span.line, found.span.column) == at(PEER_PRODUCT, "A@((rank + 1)")
    assert "through a TMA descriptor" in found.message and "a = A@owner[...]" in found.hint
    run(PEER_PRODUCT_AS_BLOCK, until="module")


F64 = tds("""
    program f64
    param M, N
    in  X : f32[M, N]
    in  D : f64[M, N]
    out Y : f32[M, N]
    tile t[i in cdiv(M, 32)]: Y[i*32 : +32, :] = X[i*32 : +32, :] + D[i*32 : +32, :]
""")


def test_an_f64_tensor_is_refused_at_its_declaration_not_computed_in_float32():
    found = refusal(F64)
    assert (found.span.line, found.span.column) == at(F64, "in  D")
    assert "f64" in found.message and "f32" in found.hint
    run(F64.replace("f64[", "f32["), until="module")


def test_a_refusal_is_exit_1_of_run_not_an_internal_error(tmp_path, capsys):
    from tiledsl import cli
    path = tmp_path / "peer_mm.tds"
    path.write_text(PEER_PRODUCT)
    assert cli.main(["run", str(path), "--world", "2"]) == 1
    err = capsys.readouterr().err
    assert "internal error" not in err and f"{path}:{at(PEER_PRODUCT, 'A@((rank + 1)')[0]}:" in err


def test_a_tile_of_one_element_builds_instead_of_being_refused():
    """`Y[i] = X[i]`: the checker used to accept it and the build refused it (blocks of 0 dimensions)."""
    module = run("program one\nparam N\nin  X : f32[N]\nout Y : f32[N]\ntile one[i in N]: Y[i] = X[i] * 2\n").module
    compile(module, "one_tds.py", "exec")
    assert "tl.load(X + i)" in module
