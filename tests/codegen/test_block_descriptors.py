"""A tile written as a block reads and writes its blocks through TMA descriptors where the program asks
(const or build option TMA: 1 made by the launcher, 2 made on the device), warp-specializes its loops
with WS=1, and sets its warps with WARPS (codegen/blocks.py). What the generated code holds, and the
attention programs of bench/experiments built each way, run in Triton's interpreter at world 1 against
torch's scaled_dot_product_attention (causal and not, GQA, a length no block divides)."""
from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import torch

from tiledsl import pipeline

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "bench" / "experiments"
SMALL = {"D": 16, "BM": 16, "BN": 16}


def module_text(path, **consts) -> str:
    """The generated module of a program built with `consts` (its schedule checked once a program)."""
    from tiledsl.codegen import lower, render
    return render(lower(_checked(str(path)), consts))


@functools.lru_cache(maxsize=None)
def _checked(path: str):
    return pipeline.run(path, until="check").schedule


def tile_function(text: str) -> str:
    start = text.index("def tds_tile_attn")
    return text[start:text.index("\n\n\n", start)]


def test_host_descriptors_read_every_block_a_descriptor_reaches_and_are_kernel_arguments():
    text = module_text(EXPERIMENTS / "attention_causal.tds", TMA=1)
    tile = tile_function(text)
    for tensor in ("Q", "K", "V"):
        assert f"tds_desc_attn_{tensor}.load([" in tile
        assert f"tl.load({tensor} +" not in tile
    assert "tds_desc_attn_O.store([" in tile and "tl.store(O" not in tile
    # one descriptor a tensor and block, over the whole [B, S, heads, D] tensor, 1 at its points
    assert "Arg('tds_desc_attn_K', 'descriptor', of='K', dtype='bfloat16', block=(1, 64, 1, 128))" in text


def test_without_tma_the_blocks_are_pointer_loads():
    tile = tile_function(module_text(EXPERIMENTS / "attention_causal.tds", TMA=0))
    assert "tds_desc" not in tile and "tl.load(K +" in tile


def test_a_block_larger_than_its_region_stays_a_masked_pointer_load():
    """flash_decode's queries Q[b, g*G : +G, :] are 8 rows in a 16-row block: a descriptor would read the
    next head group's rows where a masked load reads zeros. Its K and V blocks go through TMA."""
    tile = module_text(ROOT / "programs" / "flash_decode.tds", TMA=1)
    part = tile[tile.index("def tds_tile_part"):tile.index("def tds_tile_comb")]
    assert "tl.load(Q +" in part and "tds_desc_part_K.load(" in part and "tds_desc_part_V.load(" in part
    # the partials are waited on by the combine: a TMA store would complete after the notify
    assert "tl.store(Part +" in part


def test_device_descriptors_are_two_dimensional_made_once_where_their_points_are_known():
    text = module_text(EXPERIMENTS / "attention_causal.tds", TMA=2)
    tile = tile_function(text)
    made = [line for line in tile.splitlines() if "tl.make_tensor_descriptor(" in line]
    assert len(made) == 4, made  # Q, K, V, O: K and V read by both loops, made once
    loop = next(line for line in tile.splitlines() if re.match(r"\s+for c in", line))
    depth = len(loop) - len(loop.lstrip())
    assert all(len(line) - len(line.lstrip()) <= depth for line in made), "a descriptor made inside a loop"
    assert "[S, D], [D * HKV, 1]" in tile  # 2-D over the kept dimensions, at the points' offset
    assert "    device_descriptors=True," in text
    assert "'descriptor'" not in text  # none made by the launcher


def test_the_sp_programs_descriptors_follow_its_piece_and_its_loads_follow_a_fence():
    """sp_ag_attention reads piece pk of K_all, which changes from step to step: a device-made
    descriptor is made in the step, after its waits, not hoisted out of the loop over pieces; and the TMA
    loads read what the copy engine wrote, through another proxy, after a fence."""
    tile = tile_function(module_text(ROOT / "programs" / "sp_ag_attention.tds", TMA=2))
    lines = tile.splitlines()
    step = next(n for n, line in enumerate(lines) if re.match(r"\s+for t in", line))
    fence = next(n for n, line in enumerate(lines) if "fence_async" in line)
    k = next(n for n, line in enumerate(lines) if "make_tensor_descriptor(K_all" in line)
    assert step < fence < k
    host = tile_function(module_text(ROOT / "programs" / "sp_ag_attention.tds"))
    assert "fence_async" in host and "tds_desc_attn_K_all.load(" in host


def test_warp_specialization_marks_the_product_loop_and_never_a_loop_that_waits():
    full = tile_function(module_text(EXPERIMENTS / "attention_full.tds", WS=1, TMA=2, WARPS=4))
    assert "warp_specialize=True" in full
    # a [128, 128] accumulator takes 8 warps; WARPS=4 (what Hopper's warp specialization wants) says 4
    assert "warps=8" in module_text(EXPERIMENTS / "attention_full.tds")
    assert "warps=8" not in module_text(EXPERIMENTS / "attention_full.tds", WS=1, TMA=2, WARPS=4)
    sp = tile_function(module_text(ROOT / "programs" / "sp_ag_attention.tds", WS=1))
    waiting = next(line for line in sp.splitlines() if re.match(r"\s+for t in", line))
    assert "warp_specialize" not in waiting and "num_stages=1" in waiting


def test_build_options_need_no_declaration_but_other_consts_do():
    from tiledsl.codegen.body import LoweringError
    module_text(EXPERIMENTS / "attention_full.tds", WS=1)  # not declared there: a build option
    with pytest.raises(LoweringError, match="not a const"):
        module_text(EXPERIMENTS / "attention_full.tds", NOT_A_CONST=1)


# ---- emulated against torch ---------------------------------------------------------------------------

BUILDS = [("attention_causal", {"TMA": 1}), ("attention_causal", {"TMA": 2}),
          ("attention_causal_masked", {"WS": 1, "TMA": 2, "WARPS": 4}), ("attention_full_split", {"TMA": 2}),
          ("attention_full", {"TMA": 1})]


def _rank(heap, jobs):
    import tiledsl
    results = []
    for name, consts, inputs in jobs:
        where = ROOT / "programs" if name == "sp_ag_attention" else EXPERIMENTS
        program = tiledsl.compile(str(where / f"{name}.tds"), heap, emulated=True,
                                  dtype_override={"bfloat16": torch.float32}, **{**SMALL, **consts})
        out = torch.full_like(inputs[0], float("nan"))
        program(*inputs, out)
        results.append(out.numpy().copy())  # numpy: a tensor's shared memory leaves with the rank
    heap.close()
    return results


@pytest.mark.emulated
def test_the_whole_sequence_attention_programs_match_torch_sdpa_in_every_build():
    from tiledsl.runtime.emulate import run_ranks
    generator = torch.Generator().manual_seed(26)
    B, S, H, HKV, D = 1, 37, 4, 2, SMALL["D"]  # 37 tokens: three 16-row blocks, the last of 5 rows
    q = torch.randn(B, S, H, D, generator=generator)
    k, v = (torch.randn(B, S, HKV, D, generator=generator) for _ in range(2))
    jobs = [(name, consts, (q, k, v)) for name, consts in BUILDS]
    # sp_ag_attention alone: its two pieces are the sequence (36 tokens, pieces of 18), its K and V gathered
    # from the caller's tensors (at world 1 not staged first: no peer reads the copy)
    P = 18
    jobs.append(("sp_ag_attention", {}, tuple(t[:, :2 * P].reshape(B, 2, P, *t.shape[2:]) for t in (q, k, v))))
    got = run_ranks(_rank, 1, jobs, timeout_s=600.0)[0]
    sp = torch.from_numpy(got.pop()).reshape(B, 2 * P, H, D)
    want = torch.nn.functional.scaled_dot_product_attention(
        *(t[:, :2 * P].transpose(1, 2).double() for t in (q, k, v)), is_causal=True, enable_gqa=True).transpose(1, 2)
    assert torch.isfinite(sp).all() and (sp.double() - want).abs().max().item() / want.abs().max().item() < 1e-2
    for (name, consts), out in zip(BUILDS, got):
        out = torch.from_numpy(out)
        want = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2).double(), *(t.transpose(1, 2).double() for t in (k, v)),
            is_causal="causal" in name, enable_gqa=True).transpose(1, 2)
        assert torch.isfinite(out).all(), f"{name} {consts}: elements not written"
        error = (out.double() - want).abs().max().item() / want.abs().max().item()
        assert error < 1e-2, f"{name} {consts}: max error {error:.2e} of the output's scale"
