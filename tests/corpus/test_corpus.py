"""The corpus: programs written as users write them, from the README and the grammar, for the layers and
collectives of public model code, each on emulated ranks at worlds 2 and 3 against its expectation in
plain torch (expectations.py, written from what the program is for, not from its meaning), the same
check as `tiledsl run FILE --expect tests/corpus/expectations.py`. A program that hits a compiler bug
stays as written and is marked xfail (strict) with the bug; refused/ holds programs the checker must
refuse, each with the positioned error it must give.

All programs of one world run in one set of rank processes (run_together): starting ranks and
importing Triton in them costs more than most of these programs take."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
EXPECTATIONS = HERE / "expectations.py"
WORLDS = (2, 3)


@dataclass(frozen=True)
class Case:
    sizes: dict                       # the params; a callable of the world where they depend on it
    consts: dict = field(default_factory=dict)
    bug: str | None = None            # a compiler bug or missing feature it hits: xfail(strict=True)

    def params(self, world: int) -> dict:
        return self.sizes(world) if callable(self.sizes) else dict(self.sizes)


# Sizes no tile divides wherever the program allows it; K and N multiples of 8 under products (TMA's
# 16-byte rows at bf16), rows a multiple of the world where the program splits them by rank.
CORPUS = {
    "swiglu": Case({"T": 37, "F": 100}),
    "softmax_family_out": Case({"T": 13, "N": 100}),
    "bias_gelu": Case({"M": 37, "K": 24, "N": 72}),
    "reduce_to_root": Case({"N": 1001}),
    "residual_add": Case({"T": 13, "D": 100}),
    "rmsnorm": Case({"T": 7, "D": 96}),
    "layernorm": Case({"T": 7, "D": 80}),
    "softmax_rows": Case({"T": 9, "N": 50}),
    "gelu_tanh": Case({"T": 11, "F": 70}),
    "bias_gelu_ew": Case({"T": 11, "F": 200}),
    "softcap": Case({"T": 5, "V": 300}),
    "rotary": Case({"T": 11, "D": 32}),
    "add_rmsnorm": Case({"T": 5, "D": 64}),
    "residual_3d": Case({"B": 2, "S": 9, "D": 40}),
    "broadcast_root": Case({"N": 700}),
    "gather_root": Case(lambda w: {"M": 7 * w, "N": 45}),
    "max_root": Case({"N": 300}),
    "allreduce_f16": Case({"N": 1500}),
    "sgd_allreduce": Case({"N": 1000}),
    "ring_allgather_tiles": Case(lambda w: {"M": 32 * w, "N": 70}),
    "ring_reduce_scatter_f32": Case(lambda w: {"M": 13 * w, "N": 100}),
    "chain_broadcast_f16": Case({"N": 1000}),
    "allgather_seq_3d": Case(lambda w: {"B": 2, "S": 5 * w, "D": 24}),
    "alltoall_heads": Case(lambda w: {"S": 3 * w, "H": 2 * w, "D": 8}),
    "column_linear_ag": Case(lambda w: {"M": 16 * w, "K": 24, "N": 40}),
    "row_linear_rs": Case(lambda w: {"M": 16 * w, "K": 24, "N": 40}),
    "row_linear_ar_bias": Case({"M": 20, "K": 24, "N": 40}),
    "mlp_swiglu_tp": Case({"T": 20, "D": 152, "F": 48}),  # D: three K steps of 64, the last ragged
    "ag_gelu_linear": Case(lambda w: {"M": 16 * w, "K": 24, "N": 40}),
    "linear_residual": Case({"M": 20, "K": 24, "N": 40}),
    "vocab_max": Case(lambda w: {"T": 7, "V": 25 * w}),
    "vocab_logsumexp": Case(lambda w: {"T": 7, "V": 25 * w}),
    "vocab_softmax": Case(lambda w: {"T": 7, "V": 25 * w}),
    # runs at these sizes; at `build --arch sm_90` (every param 4096) its K.T block is 4096 x 4096, past
    # Triton's 2**20 elements: refused at the tile (tests/test_cli_reproducers.py), a loop over S is the fix
    "attention_scores": Case({"S": 20, "D": 16}),
    "attention_online": Case({"S": 40, "D": 16}),
    "attention_online_d16": Case({"S": 40}),
    "attention_causal": Case({"S": 40, "D": 16}),
    "attention_causal_d16": Case({"S": 40}),
    "attention_merge": Case({"T": 10, "D": 24}),
    "allreduce_layernorm": Case({"T": 5, "D": 48}),
    "qk_norm": Case({"T": 3, "H": 5, "D": 16}),
    "embedding": Case({"T": 6, "V": 11, "D": 40}),
    "lm_head_gather": Case(lambda w: {"T": 20, "D": 24, "V": 40 * w}),
    "cast_scale": Case({"T": 11, "D": 100}),
    "reduce_scatter_seq_3d": Case(lambda w: {"B": 2, "S": 5 * w, "D": 40}),
    "broadcast_last": Case({"M": 9, "N": 33}),
    "mean_root_3d": Case({"B": 2, "H": 5, "W": 12}),
    "glu_halves": Case({"T": 11, "F": 24}),
    "relu_squared": Case({"N": 1500}),
    "allgather_nvshmem": Case(lambda w: {"M": 7 * w, "N": 33}),
    "dequant_linear": Case({"M": 20, "K": 24, "N": 40}),
    # the second set (issue 24), written from the README, the grammar and LANGUAGE.md alone
    "swiglu_bias": Case({"T": 37, "D": 24, "F": 72}),
    "gqa_attention": Case({"S": 37, "H": 4, "HKV": 2, "D": 16}),
    "rotary_qk": Case({"T": 11, "H": 4, "HKV": 2, "D": 32}),
    "vocab_target_logit": Case(lambda w: {"T": 7, "V": 25 * w}),
    "vocab_cross_entropy": Case(lambda w: {"T": 7, "V": 25 * w}),
    "vocab_embedding": Case(lambda w: {"T": 6, "V": 5 * w, "D": 40}),
    "rs_rmsnorm": Case(lambda w: {"T": 4 * w, "D": 48}),
    "scatter_root": Case(lambda w: {"M": 7 * w, "N": 33}),
    "chain_reduce": Case({"N": 1001}),
    "ring_shift": Case({"B": 2, "S": 5, "D": 24}),
    "causal_conv_halo": Case(lambda w: {"T": 13 * w, "C": 40}),
    "layernorm_stats": Case({"T": 7, "D": 80}),
    "linear_kloop_bias": Case({"M": 20, "K": 40, "N": 40}),   # K: three blocks of 16, the last ragged
    "sgd_nesterov_allreduce": Case({"N": 1000}),
    "router_top1": Case({"T": 20, "D": 24, "E": 8}),
    "sliding_window_attention": Case({"S": 45, "D": 16}),   # window 20: from block 2 on, blocks outside it
    "alibi_attention": Case({"H": 3, "S": 37, "D": 16}),
    "masked_mean_pool": Case({"B": 5, "S": 9, "D": 24}),
    "kv_cache_append": Case({"B": 3, "C": 7, "HKV": 2, "D": 16}),
    "main_grad_accum": Case({"M": 13, "N": 100}),
    "qkv_split_heads": Case({"T": 11, "H": 4, "HKV": 2, "D": 16}),
    "ring_allreduce": Case(lambda w: {"M": 16 * w, "N": 70}),
    "tree_broadcast": Case({"N": 1001}),      # depth 1 at worlds 2 and 3; by hand at world 5, depth 2
    "int8_weight_linear": Case({"M": 20, "K": 32, "N": 40}),
    "allreduce_push_add": Case({"N": 1001}),
    "lm_head_softcap": Case({"T": 20, "D": 24, "V": 72}),
    "allgather_sms_split": Case(lambda w: {"M": 7 * w, "N": 33}),
    "linear_wgrad_allreduce": Case({"T": 37, "K": 24, "N": 40}),
    "fp8_amax_quant": Case(lambda w: {"T": 7, "D": 24 * w}),
    "attention_peer_kv": Case(lambda w: {"T": 20, "S": 12 * w, "D": 16}),
}

# Programs the checker must refuse: (line, column, words of the message).
REFUSED = {
    # the ring all-gather without `require Ms % BM == 0`: a rank's last tile of rows spills into the next block
    "ring_tile_spills": (20, 9, ["race", "'fwd'", "R"]),
    # every rank sends only after receiving from the one before it: a cycle around the ring
    "halo_deadlock": (13, 15, ["deadlock", "cycle", "send[0]@rank0", "recv[0]@rank1"]),
    # a peer's staging buffer read with no edge to the tile that writes it
    "stage_race": (11, 70, ["race", "'take'", "'stage'", "S", "add an edge: take[s, i] after stage[i] @ s"]),
    # the LM head's copy engine pulling a peer's logits with no edge to the tiles that write them
    "lm_head_race": (13, 42, ["race", "chunk 'gather' reads Lg", "tile 'mm'",
                              "add an edge: gather[s] after mm[*, *] @ s"]),
    # the second set (issue 24)
    # the pipeline shift without `mod world`: the last rank reads a rank that does not exist
    "shift_out_of_range": (9, 55, ["no such rank", "take[0] on rank 1 reads 'X'@2", "ranks are 0..1"]),
    # nn.Linear's [N, K] weight multiplied as [K, N]
    "linear_weight_transposed": (10, 74, ["inner dimensions of '@' differ", "[BM, K] @ [N, BN]", "K must equal N"]),
    # rotary halves [BT, D/2] times a cos table of the whole head, [BT, D]
    "rotary_full_cos": (15, 28, ["shapes [BT, D/2] and [BT, D] do not match"]),
    # a scan whose chain edge points forward: row i waits on row i + 1, which runs after it
    "scan_backwards": (14, 15, ["deadlock", "scan[0] on rank 0 waits for scan[1] on rank 0",
                                "comes after it in the order of 'scan'"]),
    # two families writing row 0 of Y with no edge between them
    "fixup_write_race": (10, 11, ["race", "tile 'bos' writes Y while tile 'scale' may still write it",
                                  "add an edge: bos after scale[0]"]),
    # one staging buffer reused for a second exchange before the next rank has read the first
    "staging_reuse_race": (15, 34, ["race", "tile 'put_b' writes S while tile 'get_a' may still read it",
                                    "add an edge: put_b[i] after get_a[i] @ ((rank + 1) mod world)"]),
    # a halo of 4 rows whose last row is past this rank's tokens (`a : b` is not clipped)
    "halo_off_by_one": (11, 79, ["out of bounds", "dimension 0 of 'X' has size 32", "up to 33"]),
    # a wait on the NVSHMEM put that lands on another rank: it never signals this one
    "nvshmem_wait_wrong_put": (12, 15, ["deadlock", "take[1] on rank 0 waits for put[1] on rank 1",
                                        "signals only the rank it writes to"]),
    # a reduce to the root that waits on rank 0's partials only and reads every rank's
    "root_waits_on_itself": (11, 71, ["race", "tile 'red' reads Part while tile 'part' may still write it",
                                      "@ every rank"]),
    # a loop step that waits for piece c and reads piece c + 1
    "loop_waits_wrong_piece": (18, 37, ["race", "tile 'score' reads Kall while chunk 'gather' may still write it",
                                        "score[0]@rank0 at step 0 and gather[1]@rank0"]),
}
# Refusals that a compiler bug puts elsewhere or words wrongly: xfail(strict=True) with the bug.
REFUSED_BUGS = {
}

# What a refusal's hint must say and must not (followed, the hint should lead to an accepted program):
# (words it must hold, words it must not, the bug while it does not).
HINTS = {
    # X@(rank + 1) is past the top rank: the guard that helps is `if rank < world - 1` (the hint said
    # `if rank > 0` until 2026-12-04, and following it gave the same refusal)
    "shift_out_of_range": (["rank < world - 1"], ["`if rank > 0`"], None),
}


@pytest.fixture(scope="module")
def corpus(request):
    """(name, world) -> verdicts or the exception the run failed with; the first test of a world runs
    every selected program of that world (each known bug alone, so that it cannot stop the others)."""
    from tiledsl.tools.expect import load_expectation
    from tiledsl.tools.run_program import EmulatedRun, run_together
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a second thread only adds waiting on busy cores
    done: dict = {}

    def prepare(name: str, world: int):
        case, source = CORPUS[name], os.fspath(HERE / f"{name}.tds")
        try:  # a build failure shows here, before any rank starts
            return EmulatedRun.prepare(source, world, case.params(world), seed=world, consts=case.consts,
                                       expect=load_expectation(os.fspath(EXPECTATIONS), name))
        except Exception as failure:  # noqa: BLE001 - reported by the test of this program
            return failure

    def result(name: str, world: int):
        if (name, world) not in done:
            selected = sorted({(item.callspec.params["name"], item.callspec.params["world"])
                               for item in request.session.items
                               if getattr(item, "originalname", None) == "test_program_means_what_its_author_meant"})
            pending = [n for n, w in selected if w == world and (n, w) not in done]
            prepared = {n: prepare(n, world) for n in pending}
            failed = {n: p for n, p in prepared.items() if isinstance(p, Exception)}
            sound = [n for n in pending if n not in failed and CORPUS[n].bug is None]
            alone = [n for n in pending if n not in failed and CORPUS[n].bug is not None]
            done.update({(n, world): p for n, p in failed.items()})
            for names in [sound] + [[n] for n in alone]:
                found = run_together([prepared[n] for n in names])
                done.update({(n, world): f for n, f in zip(names, found, strict=True)})
        return done[name, world]

    yield result
    torch.set_num_threads(threads)


CASES = [pytest.param(name, world, id=f"{name}-world{world}",
                      marks=[pytest.mark.xfail(strict=True, reason=case.bug)] if case.bug else [])
         for name, case in CORPUS.items() for world in WORLDS]


@pytest.mark.emulated
@pytest.mark.parametrize("name, world", CASES)
def test_program_means_what_its_author_meant(corpus, name, world):
    found = corpus(name, world)
    if isinstance(found, Exception):
        raise AssertionError(f"{name} at world {world}: {type(found).__name__}: {found}")
    lines = [f"{name}: {verdict.line()}" for verdict in found]
    assert found and all(verdict.ok for verdict in found), "\n".join(lines)


REFUSED_CASES = [pytest.param(name, marks=[pytest.mark.xfail(strict=True, reason=REFUSED_BUGS[name])]
                             if name in REFUSED_BUGS else []) for name in sorted(REFUSED)]


@pytest.mark.parametrize("name", REFUSED_CASES)
def test_program_is_refused_with_a_positioned_error(name):
    from tiledsl import pipeline
    from tiledsl.diagnostics import TdsError
    line, column, words = REFUSED[name]
    path = HERE / "refused" / f"{name}.tds"
    with pytest.raises(TdsError) as refused:
        pipeline.run(path, until="check")
    text = refused.value.render()
    assert f"{path.name}:{line}:{column}: error:" in text, text
    for word in words:
        assert word in text, text


HINT_CASES = [pytest.param(name, marks=[pytest.mark.xfail(strict=True, reason=bug)] if bug else [])
              for name, (_, _, bug) in sorted(HINTS.items())]


@pytest.mark.parametrize("name", HINT_CASES)
def test_refusal_hint_names_a_fix_that_fits(name):
    from tiledsl import pipeline
    from tiledsl.diagnostics import TdsError
    wanted, unwanted, _ = HINTS[name]
    with pytest.raises(TdsError) as refused:
        pipeline.run(HERE / "refused" / f"{name}.tds", until="check")
    text = refused.value.render()
    hints = "\n".join(line for line in text.splitlines() if line.strip().startswith("hint:"))
    assert all(word in hints for word in wanted) and not any(word in hints for word in unwanted), hints


def test_every_corpus_program_has_a_case_and_an_expectation():
    import importlib.util
    spec = importlib.util.spec_from_file_location("corpus_expectations", EXPECTATIONS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    programs = {p.stem for p in HERE.glob("*.tds")}
    assert programs == set(CORPUS)
    assert all(callable(getattr(module, name, None)) for name in programs)
    assert {p.stem for p in (HERE / "refused").glob("*.tds")} == set(REFUSED)
    assert set(HINTS) <= set(REFUSED) and set(REFUSED_BUGS) <= set(REFUSED)


def test_following_the_no_such_rank_hint_gives_an_accepted_program(tmp_path):
    """The guard the hint proposes for `X@(rank + 1)`, written in, passes the checker."""
    from tiledsl import pipeline
    text = (HERE / "refused" / "shift_out_of_range.tds").read_text()
    guarded = tmp_path / "guarded.tds"
    guarded.write_text(text.replace("tile take[i in cdiv(N, BLOCK)]:", "tile take[i in cdiv(N, BLOCK)] if rank < world - 1:"))
    assert "if rank < world - 1" in guarded.read_text()
    pipeline.run(guarded, until="check")
