"""tiledsl.ops.flash_decode and tiledsl.ops.sp_attention on 2 emulated ranks, through the torch path
and the program (forced, and as the rule picks), in fp32 (the torch path: the programs round their
softmax weights to bf16), bf16 and fp16, against float64 attention:
- flash_decode: a KV cache split along the sequence, a rank whose share is short or empty and a
  sequence of length 0; a head dimension the program is not built for takes the torch path, and
  forcing the program there is refused by name; a wrong tensor is a ValueError; opcheck and
  torch.compile(fullgraph=True) pass;
- sp_attention: causal attention of a sequence sharded zig-zag (pieces of a length no tile divides),
  GQA; a wrong tensor is a ValueError; opcheck passes."""
from __future__ import annotations

import math

import pytest
import torch

from ops_ranks import TOLERANCE, as_numpy, relative_error, start, stop

pytestmark = pytest.mark.emulated

WORLD = 2
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
B, H, HKV, D, C = 3, 4, 2, 128, 40   # 40 keys a rank against 32-key blocks: a ragged last block
# sequence 0 fills both ranks' shares, sequence 1 ends inside rank 0's (rank 1 has none), sequence 2 is empty
LENS = [WORLD * C, C - 5, 0]
SMALL_D = 64                        # not the program's head dimension: the torch path serves it
SP = {"B": 1, "P": 21, "H": 4, "HKV": 2}  # 21 tokens a piece against 16-row and 32-key blocks


def _inputs():
    generator = torch.Generator().manual_seed(3)
    q = {d: torch.randn(B, H, d, generator=generator) for d in (D, SMALL_D)}
    kv = {d: [(torch.randn(B, C, HKV, d, generator=generator), torch.randn(B, C, HKV, d, generator=generator))
              for _ in range(WORLD)] for d in (D, SMALL_D)}
    sp = [[torch.randn(SP["B"], 2, SP["P"], heads, D, generator=generator) for heads in (SP["H"], SP["HKV"],
                                                                                         SP["HKV"])]
          for _ in range(WORLD)]
    return q, kv, sp


def _sp_expected(sp, rank):
    """float64 causal attention of `rank`'s zig-zag pieces over the whole sequence."""
    P, group = SP["P"], SP["H"] // SP["HKV"]
    pieces = {s + z * (2 * WORLD - 1 - 2 * s): (s, z) for s in range(WORLD) for z in range(2)}
    keys, values = (torch.cat([sp[s][n][:, z] for s, z in (pieces[i] for i in range(2 * WORLD))], dim=1).double()
                    for n in (1, 2))
    out = torch.zeros(sp[rank][0].shape, dtype=torch.float64)
    for z in range(2):
        piece = rank + z * (2 * WORLD - 1 - 2 * rank)
        for t in range(P):
            seen = piece * P + t + 1
            for h in range(SP["H"]):
                scores = keys[:, :seen, h // group] @ sp[rank][0][:, z, t, h].double()[0] / math.sqrt(D)
                out[:, z, t, h] = torch.softmax(scores, -1) @ values[:, :seen, h // group]
    return out


def _expected(q, kv):
    """float64 attention of each sequence over its first LENS[b] positions of the whole cache."""
    k = torch.cat([k for k, _ in kv], dim=1).double()
    v = torch.cat([v for _, v in kv], dim=1).double()
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = H // HKV
    for b, n in enumerate(LENS):
        for h in range(H):
            if n:
                scores = k[b, :n, h // group] @ q[b, h].double() / math.sqrt(q.shape[-1])
                out[b, h] = torch.softmax(scores, 0) @ v[b, :n, h // group]
    return out


def _sp(ops, mine):
    out = {}
    for dtype in DTYPES:
        tensors = [t.to(dtype) for t in mine]
        for impl in ("torch", "sp_ag_attention", None):
            if dtype == torch.float32 and impl == "sp_ag_attention":
                with pytest.raises(ValueError) as refused:
                    ops.sp_attention(*tensors, impl=impl)
                out[dtype, impl] = str(refused.value)
                continue
            got = ops.sp_attention(*tensors, impl=impl)
            out[dtype, impl] = (as_numpy(got), got.dtype, ops.decision("sp_attention").choice)
    with pytest.raises(ValueError) as refused:
        ops.sp_attention(mine[0][:, :1], mine[1], mine[2])
    out["error"] = str(refused.value)
    try:
        torch.library.opcheck(torch.ops.tiledsl.sp_attention.default, (*[t.bfloat16() for t in mine], "0"))
        out["opcheck"] = "ok"
    except Exception as error:  # noqa: BLE001 - reported by the test
        out["opcheck"] = f"{type(error).__name__}: {error}"
    return out


def _rank(heap, rendezvous, q, kv, sp):
    ops = start(heap, rendezvous)
    lens = torch.tensor(LENS, dtype=torch.int32)
    out = {"paths": {}}
    for dtype in DTYPES:
        k, v = (t.to(dtype) for t in kv[D][heap.rank])
        for impl in ("torch", "flash_decode", None):
            if dtype == torch.float32 and impl == "flash_decode":
                with pytest.raises(ValueError) as refused:
                    ops.flash_decode(q[D].to(dtype), k, v, lens, impl=impl)
                out["paths"][dtype, impl] = str(refused.value)
                continue
            got = ops.flash_decode(q[D].to(dtype), k, v, lens, impl=impl)
            out["paths"][dtype, impl] = (as_numpy(got), got.dtype, ops.decision("flash_decode").choice)
    k, v = (t.to(torch.bfloat16) for t in kv[SMALL_D][heap.rank])
    small = ops.flash_decode(q[SMALL_D].to(torch.bfloat16), k, v, lens.long())
    out["small"] = (as_numpy(small), ops.decision("flash_decode").choice, ops.explain("flash_decode"))
    errors = {}
    for label, call in {
            "forced at D=64": lambda: ops.flash_decode(q[SMALL_D].to(k.dtype), k, v, lens, impl="flash_decode"),
            "float lens": lambda: ops.flash_decode(q[SMALL_D].to(k.dtype), k, v, lens.float()),
            "k and v differ": lambda: ops.flash_decode(q[SMALL_D].to(k.dtype), k, v[:, :-1], lens),
            "heads do not divide": lambda: ops.flash_decode(q[SMALL_D][:, :3].to(k.dtype), k, v, lens)}.items():
        with pytest.raises(ValueError) as refused:
            call()
        errors[label] = str(refused.value)
    out["errors"] = errors
    k, v = kv[D][heap.rank]
    try:
        torch.library.opcheck(torch.ops.tiledsl.flash_decode.default, (q[D], k, v, lens, "0"))
        out["opcheck"] = "ok"
    except Exception as error:  # noqa: BLE001 - reported by the test
        out["opcheck"] = f"{type(error).__name__}: {error}"

    def layer(q, k, v, lens):
        return ops.flash_decode(q * 2, k, v, lens).sum(dim=1)

    eager = layer(q[D], k, v, lens)
    traced = torch.compile(layer, fullgraph=True, backend="aot_eager")(q[D], k, v, lens)
    out["compiled"] = relative_error(as_numpy(traced), eager.double())
    out["sp"] = _sp(ops, sp[heap.rank])
    stop(heap)
    return out


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    from tiledsl.runtime.emulate import run_ranks
    q, kv, sp = _inputs()
    folder = tmp_path_factory.mktemp("attention")
    return q, kv, sp, run_ranks(_rank, WORLD, str(folder / "rendezvous"), q, kv, sp, timeout_s=600)


@pytest.mark.parametrize("impl", ["torch", "flash_decode", None], ids=["torch", "program", "rule"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_every_path_matches_attention_over_the_whole_cache(emulated, dtype, impl):
    q, kv, _, results = emulated
    want = _expected(q[D], kv[D])
    for rank, r in enumerate(results):
        if dtype == torch.float32 and impl == "flash_decode":
            assert "runs fp16 and bf16, not torch.float32" in r["paths"][dtype, impl]
            continue
        got, got_dtype, choice = r["paths"][dtype, impl]
        assert got_dtype == dtype
        assert relative_error(got, want) <= TOLERANCE[dtype], (rank, relative_error(got, want))
        assert (got[2] == 0).all()  # the empty sequence
        # the rule takes the program where it applies (it needs no padding), torch's path for fp32
        assert choice == (impl or ("torch" if dtype == torch.float32 else "flash_decode"))


def test_a_head_dimension_the_program_is_not_built_for_takes_the_torch_path_and_says_why(emulated):
    q, kv, _, results = emulated
    want = _expected(q[SMALL_D], kv[SMALL_D])
    for r in results:
        got, choice, explained = r["small"]
        assert relative_error(got, want) <= TOLERANCE[torch.bfloat16]
        assert choice == "torch" and "head dimension 128, not 64" in explained, explained


def test_wrong_tensors_are_refused_at_the_call(emulated):
    for r in emulated[3]:
        errors = r["errors"]
        assert "built for head dimension 128, not 64" in errors["forced at D=64"]
        assert "lens must be [3] integers" in errors["float lens"]
        assert "k, v one shape" in errors["k and v differ"]
        assert "divide into the 2 KV heads" in errors["heads do not divide"]


def test_opcheck_and_torch_compile_fullgraph(emulated):
    for r in emulated[3]:
        assert r["opcheck"] == "ok", r["opcheck"]
        assert r["compiled"] <= 1e-5, r["compiled"]


@pytest.mark.parametrize("impl", ["torch", "sp_ag_attention", None], ids=["torch", "program", "rule"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_sp_attention_matches_causal_attention_over_the_whole_sequence(emulated, dtype, impl):
    _, _, sp, results = emulated
    for rank, r in enumerate(results):
        if dtype == torch.float32 and impl == "sp_ag_attention":
            assert "runs fp16 and bf16, not torch.float32" in r["sp"][dtype, impl]
            continue
        got, got_dtype, choice = r["sp"][dtype, impl]
        want = _sp_expected(sp, rank)
        assert got_dtype == dtype
        assert relative_error(got, want) <= TOLERANCE[dtype], (rank, relative_error(got, want))
        assert choice == (impl or ("torch" if dtype == torch.float32 else "sp_ag_attention"))


def test_sp_attention_refuses_a_wrong_tensor_and_passes_opcheck(emulated):
    for r in emulated[3]:
        assert "q must be [B, 2, P, H, D]" in r["sp"]["error"]
        assert r["sp"]["opcheck"] == "ok", r["sp"]["opcheck"]
