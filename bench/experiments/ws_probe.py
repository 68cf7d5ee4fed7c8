"""Why the causal warp-specialized attention tile is wrong on the GPU (issue 26; 2026-12-03 the
`masked_ws` builds of attention_causal_masked.tds were wrong on 0.4-0.7% of elements, the same program
without warp specialization right, the full-attention `ws` builds right).

One process on one GPU: each variant of bench/experiments/attention_causal_masked.tds below (its text
changed by one thing, or its build options) runs on fresh random bf16 inputs, B = 2, 32/8 heads, D = 128,
S tokens (default 4096), output poisoned with NaN, against torch's float32 attention. For a wrong one it
prints where: how many (b, h, row block) tiles hold a wrong element, the wrong rows by their offset in
the 128-row block (16 a bucket: the two consumer warp groups hold rows 0-63 and 64-127), the first
blocks hit, and whether a second call gives the same bits (a race does not). Every variant is also timed
(median of CUDA events, wrong ones too, marked), beside attention_causal.tds at BN = 128 on 3 stages
(the fastest right causal build) and cuDNN (`sdpa_kernel([CUDNN_ATTENTION])`, is_causal=True).

    python3 bench/experiments/ws_probe.py            # on a GPU; WS_VARIANTS=a,b picks, TOKENS=S

Found (2026-12-03, session 19, one H200, Triton 3.6; bench/results/2026-12-03-s19/call2, call3): only
the rows of the second consumer warp group are wrong (offsets 64-127 of a block), most in the first
row blocks and fewer later (125854 of 151453 wrong elements in row block 0): as if that group applied
the first group's causal mask (missing 64 keys matters less the more keys a row sees). The same
elements whatever the mask's form (-inf, -1e6, additive), wherever the rows' indices are made (the
kernel's top, in the loop, through inline PTX, carried as loop state), in the tile's natural order
and with every key block visited; without the mask the specialized tile is right, and so is BM = 64
(one consumer group, 0.37x of cuDNN). Rows' indices loaded from a tensor, or the diagonal's blocks in
a plain loop before the specialized one, fail Triton's pass (WSDataPartition.cpp:324 "Unexpected
op"). What a right build would gain: ws_BN128 0.632-0.650 ms against split_BN128_3stages 0.688-0.706
at 4K tokens (8%).
"""
from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from common import time_ms  # noqa: E402
SOURCE = (HERE / "attention_causal_masked.tds").read_text()
WS = {"WS": 1, "TMA": 2, "WARPS": 4, "STAGES": 2}
LOOP = "    for c in min(cdiv(S, BN), cdiv((i + 1)*BM, BN)):     # key blocks to the diagonal"
MASK = "        s = where(c*BN + cols(BN) <= i*BM + rows(BM), s, -inf)"
assert LOOP in SOURCE and MASK in SOURCE and "order attn by -i" in SOURCE


def text(**changes):
    out = SOURCE
    for old, new in changes.values():
        assert old in out, old
        out = out.replace(old, new)
    return out


# the row and column indices made inside the loop instead of once at the kernel's top (the generated
# module edited: the code generator hoists every `rows(..)`/`cols(..)` to the top)
INSIDE = [(r"tds_add = \(c \* BN\) \+ tds_c(\d+)", r"tds_add = (c * BN) + tl.arange(0, \1)[None, :]"),
          (r"tds_add2 = \(i \* BM\) \+ tds_r(\d+)", r"tds_add2 = (i * BM) + tl.arange(0, \1)[:, None]")]
# the rows' indices through an opaque identity (inline PTX), which no pass can see through or remake
OPAQUE = [(r"tds_r(\d+) = tl.arange\(0, (\d+)\)\[:, None\]",
           r'tds_r\1 = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [tl.arange(0, \2)[:, None]], '
           r'dtype=tl.int32, is_pure=False, pack=1)')]
FINITE = (MASK, "        s = where(c*BN + cols(BN) <= i*BM + rows(BM), s, -1.0e6)")
BIAS = (MASK, "        s = s + where(c*BN + cols(BN) <= i*BM + rows(BM), 0.0, -1.0e6)")

# the rows' indices loaded from a tensor (RI[r, :] = r, 16 wide: a TMA block, as q's) once a tile, not made by tl.arange: on 2026-12-03
# only the second consumer warp group's rows (64-127 of a block) were wrong, most in the first row blocks,
# as if its row indices started at 0 (Triton's data partition of the M dimension)
RI_TEXT = {"in": ("out  O : bf16[B, S, H, D]", "in   RI : i32[S, 16]\nout  O : bf16[B, S, H, D]"),
           "ri": ("    q = Q[b, i*BM : +BM, h, :]\n", "    q = Q[b, i*BM : +BM, h, :]\n    ri = rowmax(RI[i*BM : +BM, :])\n"),
           "mask": ("<= i*BM + rows(BM)", "<= ri")}

# attention_causal.tds (two loops a step) with the diagonal's masked blocks first and the unmasked ones
# after, only the second loop warp-specialized (Triton 3.6 refuses a loop after a specialized one): the
# mask then never meets the data partition (call 3: rows' indices loaded, or through an opaque identity,
# were still wrong or failed the pass)
SPLIT = (HERE / "attention_causal.tds").read_text()
_FULL = SPLIT[SPLIT.index("        for c in full:"):SPLIT.index("        for e in min(")]
_DIAG = SPLIT[SPLIT.index("        for e in min("):SPLIT.index("    O[b, i*BM")]
DIAG_FIRST = SPLIT.replace(_FULL + _DIAG, _DIAG + _FULL)
FIRST_PLAIN = [(r"(for e in tl\.range\([^:]*?),\s*warp_specialize=True\)", r"\1)")]

# the rows' indices carried through the loop as its state, like m, l and acc (which the partition gets
# right), updated by a no-op the passes before the partition cannot fold (x > inf is never true; LLVM
# removes it later); call 3 and Triton 3.6 on CPU: the diagonal-first split fails the pass too
CARRIED = [(r"\n(\s*)(for c in tl\.range\([^:]*warp_specialize=True\):)",
            r"\n\1tds_rowsc = (i * BM) + tds_r128\n\1\2"),
           (r"tds_add2 = \(i \* BM\) \+ tds_r(\d+)", r"tds_add2 = tds_rowsc"),
           (r"\n(\s*)m = mn\n", r"\n\1m = mn\n\1tds_rowsc = tds_rowsc + (mn > float('inf')).to(tl.int32)\n")]

# ws_ri's table read through a device TMA descriptor, as q is (the code generator loads an integer
# block by pointers; the pointer load failed the pass, call 3)
RI_DESC = [(r"tds_RI = tl\.load\(RI \+[^\n]*\n[^\n]*other=0\.0\)",
            r"tds_RI = tl.make_tensor_descriptor(RI, [S, 16], [16, 1], [128, 16]).load([i * BM, 0])")]

# label -> (program text, build options[, edits of the generated module: (regex, replacement)])
VARIANTS = {
    "masked": (SOURCE, {}),                                         # right on 2026-12-03
    "ws": (SOURCE, WS),                                             # wrong on 2026-12-03
    "ws_finite": (text(mask=FINITE), WS),                           # masked to -1e6, not -inf
    "ws_bias": (text(mask=BIAS), WS),                               # an additive mask (Triton's tutorial)
    "ws_inside": (SOURCE, WS, INSIDE),
    "ws_bias_inside": (text(mask=BIAS), WS, INSIDE),
    "ws_BN128": (SOURCE, dict(WS, BN=128)),
    "ws_BN128_bias": (text(mask=BIAS), dict(WS, BN=128)),
    "ws_BN128_inside": (SOURCE, dict(WS, BN=128), INSIDE),
    "ws_BN128_bias_inside": (text(mask=BIAS), dict(WS, BN=128), INSIDE),
    "ws_ri": (text(**RI_TEXT), WS),
    "ws_BN128_ri": (text(**RI_TEXT), dict(WS, BN=128)),
    "ws_ri_desc": (text(**RI_TEXT), WS, RI_DESC),
    "ws_BN128_ri_desc": (text(**RI_TEXT), dict(WS, BN=128), RI_DESC),
    "ws_opaque": (SOURCE, WS, OPAQUE),
    "ws_BN128_opaque": (SOURCE, dict(WS, BN=128), OPAQUE),
    "ws_diagfirst": (DIAG_FIRST, WS, FIRST_PLAIN),
    "ws_BN128_diagfirst": (DIAG_FIRST, dict(WS, BN=128), FIRST_PLAIN),
    "ws_carried": (SOURCE, WS, CARRIED),
    "ws_BN128_carried": (SOURCE, dict(WS, BN=128), CARRIED),
    "ws_BM64": (SOURCE, dict(WS, BM=64)),                           # one consumer group: no M partition
    "ws_nomask": (text(mask=(MASK, "")), WS),                       # its reference: keys to (i+1)*BM
    "split_BN128_3stages": ((HERE / "attention_causal.tds").read_text(), {"BN": 128}),
    # run on 2026-12-03 (session 19, call 1): masked_tma2 right, ws_alltrips / ws_noorder / ws_3stages wrong
    "masked_tma2": (SOURCE, {"TMA": 2}),
    "ws_alltrips": (text(loop=(LOOP, "    for c in cdiv(S, BN):")), WS),   # trip count not the tile's
    "ws_noorder": (text(order=("order attn by -i", "")), WS),      # instances in their natural order
    "ws_3stages": (SOURCE, dict(WS, STAGES=3)),
}
# run on 2026-12-03 (call 2): ws_finite, ws_bias, ws_inside, ws_bias_inside and their BN128 builds wrong, the
# same elements as ws
# call 3 (2026-12-03): ws_ri and ws_BN128_ri failed the warp-specialization pass; ws_opaque and
# ws_BN128_opaque wrong (the same elements); ws_BM64 right at 1.425 ms (0.37x of cuDNN)
# (and Triton 3.6's sm_90 build on CPU): ws_diagfirst and ws_BN128_diagfirst fail the pass; the carried
# builds compile there
# (call 3b: ws_carried and ws_BN128_carried wrong, the same elements as ws; Triton 3.6's sm_90 build on
# CPU: ws_ri_desc and ws_BN128_ri_desc fail the pass, WSDataPartition.cpp:324 "Unexpected op")
DEFAULT = ("masked", "ws", "ws_BN128", "ws_nomask", "split_BN128_3stages")


def compiled(variant):
    """The program of a variant, bound to this process (its generated module edited where it says)."""
    import re

    import tiledsl
    from tiledsl import pipeline
    from tiledsl.api import cache_dir, load_built
    source, consts, *edits = variant
    if not edits:
        return tiledsl.compile(source, **consts)
    module = pipeline.run(source, until="module", consts=consts).module
    for pattern, replacement in edits[0]:
        module, n = re.subn(pattern, replacement, module, flags=re.M)
        assert n, pattern
    path = cache_dir() / f"tds_ws_probe_{abs(hash(module)) % 10**12}.py"
    path.write_text(module)
    return load_built(path).tds_load()


B, H, HKV, D = 2, 32, 8, 128
S = int(os.environ.get("TOKENS", "4096"))
BM = 128


def build(job):
    label, variant = job
    try:
        torch.cuda.set_device(0)
        program = compiled(variant)
        q = torch.randn(B, 256, H, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, 256, HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        program(*args(variant[0], q, k, v, torch.empty_like(q)))
        torch.cuda.synchronize()
        return label, None
    except Exception as error:  # noqa: BLE001 - reported by the timed process again
        return label, f"{type(error).__name__}: {str(error)[:300]}"


def args(source, q, k, v, out):
    """The program's tensors: the RI variants also take the rows' indices."""
    if "in   RI" not in source:
        return q, k, v, out
    rows = torch.arange(q.shape[1], device=q.device, dtype=torch.int32)
    return q, k, v, rows[:, None].expand(-1, 16).contiguous(), out


def reference(q, k, v, nomask: bool):
    qh, kh, vh = (t.transpose(1, 2).float() for t in (q, k, v))
    kh, vh = (t.repeat_interleave(H // HKV, dim=1) for t in (kh, vh))
    if not nomask:
        return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True).transpose(1, 2)
    # without the mask each row block sees every key up to the end of its diagonal block
    rows = torch.arange(S, device="cuda")
    allowed = (rows[None, :] < ((rows[:, None] // BM) + 1) * BM)
    return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed).transpose(1, 2)


def where_wrong(got, want):
    bad = (got.float() - want).abs() > 0.02 * want.abs() + 0.02 * want.abs().max().item()  # bench's rule
    n = int(bad.sum())
    if not n:
        return n, ""
    idx = bad.nonzero()                           # [n, 4]: b, s, h, d
    b, s, h = idx[:, 0], idx[:, 1], idx[:, 2]
    tiles = torch.unique(b * H * (S // BM) + h * (S // BM) + s // BM)
    offsets = torch.bincount((s % BM) // 16, minlength=BM // 16).tolist()
    blocks = torch.bincount(s // BM, minlength=S // BM)
    rows_bad = torch.unique(b * S * H + s * H + h).numel()
    first = [int(x) for x in torch.nonzero(blocks).flatten()[:8]]
    worst = (got.float() - want).abs().max().item()
    return n, (f"{n} wrong ({100 * n / got.numel():.3f}%), worst |err| {worst:.3f}; {rows_bad} rows of "
               f"{tiles.numel()} of {B * H * (S // BM)} tiles; by offset in the block (16 rows a bucket) "
               f"{offsets}; row blocks hit (first) {first}, per block {blocks[blocks > 0][:8].tolist()}")


def main():
    chosen = [x for x in os.environ.get("WS_VARIANTS", ",".join(DEFAULT)).split(",") if x in VARIANTS]
    began = time.monotonic()
    import multiprocessing
    with ProcessPoolExecutor(max_workers=min(8, len(chosen)), mp_context=multiprocessing.get_context("spawn")) as pool:
        built = dict(pool.map(build, [(x, VARIANTS[x]) for x in chosen]))
    print(f"built {len(chosen)} variants in {time.monotonic() - began:.0f} s", flush=True)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(0)
    q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, S, HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    wants = {False: reference(q, k, v, False), True: None}
    views = [t.transpose(1, 2).contiguous() for t in (q, k, v)]
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        cudnn = time_ms(lambda: F.scaled_dot_product_attention(*views, is_causal=True, enable_gqa=True))
    print(f"cuDNN causal S={S}: {cudnn:.3f} ms", flush=True)
    rows = []
    for label in chosen:
        if built.get(label):
            print(f"{label}: build failed: {built[label]}", flush=True)
            rows.append((label, "build failed", float("nan")))
            continue
        nomask = label == "ws_nomask"
        if nomask and wants[True] is None:
            wants[True] = reference(q, k, v, True)
        want = wants[nomask]
        program = compiled(VARIANTS[label])
        out = torch.full_like(q, float("nan"))
        tensors = args(VARIANTS[label][0], q, k, v, out)
        program(*tensors)
        torch.cuda.synchronize()
        first = out.clone()
        n, where = where_wrong(out, want)
        out.fill_(float("nan"))
        program(*tensors)
        torch.cuda.synchronize()
        same = torch.equal(first.view(torch.int16), out.view(torch.int16))
        n2, _ = where_wrong(out, want)
        t = time_ms(lambda: program(*tensors))
        verdict = "right" if n == 0 and n2 == 0 else f"WRONG ({n}, then {n2}; {'same bits' if same else 'bits differ: a race'})"
        print(f"{label}: {t:.3f} ms ({cudnn / t:.2f}x of cuDNN) {verdict}" + (f"\n    {where}" if where else ""),
              flush=True)
        rows.append((label, verdict.split(" (")[0], t))
        program.release()
        del program
    print(f"\n| variant | ms | of cuDNN ({cudnn:.3f} ms) | verdict |\n|---|---|---|---|")
    for label, verdict, t in rows:
        print(f"| {label} | {t:.3f} | {cudnn / t:.2f}x | {verdict} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
