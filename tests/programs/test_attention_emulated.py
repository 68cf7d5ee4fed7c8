"""The attention programs (sp_ag_attention, sp_ulysses, flash_decode) on emulated ranks at worlds 2, 3
and 4, against torch's scaled_dot_product_attention on the whole sequence (expectations.py): causal
(zig-zag and plain) and not, GQA (two query heads per KV head), sequence and cache lengths that no
block divides, and in decode a rank whose share of the cache is empty. Every call has fresh inputs
and outputs poisoned with NaN. The kernels round the softmax's probabilities to bf16 before the second
product, as flash attention does; the float64 expectation does not, hence a bf16-sized tolerance.

Small blocks (16) and head dimension 16 keep the interpreter's work small; every case of one world
runs in one set of rank processes, which pay for starting up once."""
from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from expectations import EXPECTATIONS  # tests/programs/ is on sys.path, as pytest imports this file

pytestmark = pytest.mark.emulated

PROGRAMS = Path(__file__).resolve().parents[2] / "programs"
EMULATED = {"bfloat16": torch.float32}  # the interpreter computes bf16 tl.dot wrongly
# p rounded to bf16 moves an output by at most 2^-9 of its scale; a wrong block, mask or wait moves it
# by its whole scale
TOLERANCE = 1e-2
WORLDS = (2, 3, 4)
SMALL = {"D": 16}  # head dimension 16: the smallest block tl.dot takes


@dataclass(frozen=True)
class Case:
    label: str
    program: str
    consts: dict
    params: object            # world -> the program's params
    inputs: object            # (world, params, generator) -> every rank's inputs
    calls: int = 2
    expect: dict = field(default_factory=dict)  # keyword arguments of the expectation


def _zigzag_inputs(world, p, generator):
    shape = lambda heads: (p["B"], 2, p["P"], heads, SMALL["D"])  # noqa: E731
    return [{"Q": torch.randn(shape(p["H"]), generator=generator), "K": torch.randn(shape(p["HKV"]), generator=generator),
             "V": torch.randn(shape(p["HKV"]), generator=generator)} for _ in range(world)]


def _ulysses_inputs(world, p, generator):
    rows, d = p["S"] // world, SMALL["D"]
    return [{"X": torch.randn(rows, p["DM"], generator=generator) / p["DM"] ** 0.5,
             "WQ": torch.randn(p["DM"], p["H"] * d, generator=generator),
             "WK": torch.randn(p["DM"], p["HKV"] * d, generator=generator),
             "WV": torch.randn(p["DM"], p["HKV"] * d, generator=generator)} for _ in range(world)]


def decode_lengths(world: int, cache: int) -> torch.Tensor:
    """Sequence 0 stops five keys into the second-to-last rank's share, so the last rank holds none of
    it; sequence 1 fills every share but the last key's."""
    return torch.tensor([(world - 2) * cache + 5, world * cache - 1], dtype=torch.int32)


def _decode_inputs(world, p, generator):
    q = torch.randn(p["B"], p["H"], SMALL["D"], generator=generator)
    cache = (p["B"], p["C"], p["HKV"], SMALL["D"])
    lens = decode_lengths(world, p["C"])
    return [{"Q": q.clone(), "K": torch.randn(cache, generator=generator), "V": torch.randn(cache, generator=generator),
             "Lens": lens.clone()} for _ in range(world)]


# 17 tokens per rank: two blocks of rows, the second of one row
ULYSSES = dict(params=lambda w: {"S": 17 * w, "DM": 24, "H": 2 * w, "HKV": w}, inputs=_ulysses_inputs)
CASES = [
    # pieces of 21 tokens at world 2 (two query and two key blocks each, the second ragged), of 13 beyond
    # (one ragged block: the steps grow with the pieces, 2 * world of them)
    Case("zigzag causal, GQA 2, ragged pieces", "sp_ag_attention", {**SMALL, "BM": 16, "BN": 16},
         lambda w: {"B": 1, "P": 21 if w == 2 else 13, "H": 2, "HKV": 1}, _zigzag_inputs),
    # more query rows than keys a block (BM = 2 BN, as BM=128 BN=64 on the GPU): the diagonal block of
    # keys covers half a query block, the rows before it see a block with no key at all
    Case("zigzag causal, BM = 2 BN", "sp_ag_attention", {**SMALL, "BM": 32, "BN": 16},
         lambda w: {"B": 1, "P": 40 if w == 2 else 24, "H": 2, "HKV": 1}, _zigzag_inputs, calls=1),
    Case("ulysses causal, GQA 2, ragged shards", "sp_ulysses", {**SMALL, "BM": 16}, **ULYSSES, calls=1,
         expect={"D": SMALL["D"]}),
    Case("ulysses full attention", "sp_ulysses", {**SMALL, "BM": 16, "CAUSAL": 0}, **ULYSSES, calls=1,
         expect={"D": SMALL["D"], "causal": False}),
    # a cache of 13 per rank in two slices of one 16-key block: the second slice is empty everywhere
    Case("decode, a rank with no keys, GQA 2", "flash_decode", {**SMALL, "BN": 16, "NS": 2, "MINKEYS": 1},
         lambda w: {"B": 2, "H": 4, "HKV": 2, "C": 13}, _decode_inputs),
]
RUNS = sorted({(case.program, world) for case in CASES for world in WORLDS})


def _rank(heap, jobs: list) -> list:
    """One emulated rank: each case's program, built once, called once per input set on the same
    tensors (refilled, outputs poisoned); every call's outputs back as numpy."""
    import tiledsl
    results = []
    for program_name, consts, calls, outputs in jobs:
        program = tiledsl.compile(os.fspath(PROGRAMS / f"{program_name}.tds"), heap, emulated=True,
                                  dtype_override=EMULATED, wait_timeout_s=60.0, **consts)
        mine = calls[0][0][heap.rank]
        tensors = {n: torch.empty_like(t) for n, t in mine.items()}
        tensors |= {n: torch.empty(shape) for n, shape in outputs[heap.rank].items()}
        per_call = []
        for inputs, _ in calls:
            for n, t in inputs[heap.rank].items():
                tensors[n].copy_(t)
            for n in outputs[heap.rank]:
                tensors[n].fill_(float("nan"))
            program(**tensors)
            per_call.append({n: tensors[n].numpy().copy() for n in outputs[heap.rank]})
        results.append(per_call)
    heap.close()
    return results


@pytest.fixture(scope="module")
def emulated():
    """world -> (cases, every case's calls as (inputs, expected), each rank's outputs), run once."""
    from tiledsl.runtime.emulate import run_ranks
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a second thread only waits on busy cores
    done = {}

    def result(world: int):
        if world not in done:
            jobs, prepared = [], []
            for case in CASES:
                generator = torch.Generator().manual_seed(zlib.crc32(f"{case.label} {world}".encode()))
                params = case.params(world)
                calls = []
                for _ in range(case.calls):
                    inputs = case.inputs(world, params, generator)
                    wanted = EXPECTATIONS[case.program](**{n: [r[n] for r in inputs] for n in inputs[0]}, **case.expect)
                    calls.append((inputs, [{n: v[rank] for n, v in wanted.items()} for rank in range(world)]))
                outputs = [{n: tuple(t.shape) for n, t in calls[0][1][rank].items()} for rank in range(world)]
                jobs.append((case.program, case.consts, calls, outputs))
                prepared.append(calls)
            done[world] = (prepared, run_ranks(_rank, world, jobs, timeout_s=900.0))
        return done[world]
    yield result
    torch.set_num_threads(threads)


def _check(got: np.ndarray, want: torch.Tensor, what: str) -> None:
    got = torch.from_numpy(got).double()
    assert got.shape == want.shape, f"{what}: shape {list(got.shape)}, expected {list(want.shape)}"
    assert want.numel() and torch.isfinite(want).all(), f"{what}: the expectation is empty or not finite"
    unwritten = int((~torch.isfinite(got)).sum())
    assert unwritten == 0, f"{what}: {unwritten} of {got.numel()} elements not finite (never written?)"
    error = (got - want).abs().max().item() / (want.abs().max().item() or 1.0)
    assert error <= TOLERANCE, f"{what}: max error {error:.2e} of the output's scale"


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"world{w}")
@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
def test_attention_matches_torch_sdpa(emulated, case, world):
    prepared, per_rank = emulated(world)
    n = CASES.index(case)
    for call, (_, expected) in enumerate(prepared[n]):
        for rank in range(world):
            for tensor, want in expected[rank].items():
                _check(per_rank[rank][n][call][tensor], want, f"{case.label}: {tensor} on rank {rank}, call {call}")


@pytest.mark.parametrize("world", WORLDS)
def test_the_decode_case_leaves_a_rank_without_keys(world):
    """What the decode case claims: some rank holds none of sequence 0's keys, and its lengths are no
    multiple of the cache blocks."""
    cache = 13
    lengths = decode_lengths(world, cache)
    assert any(int(lengths[0]) <= rank * cache for rank in range(world))
    assert all(int(n) % 16 for n in lengths)


# ---- the expectations themselves, against attention written out one query at a time --------------

def _naive(q, k, v, allowed):
    """softmax over the allowed keys of q . k / sqrt(D), times v: q [D], k and v [keys, D]."""
    scores = (k @ q) / q.shape[0] ** 0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, 0) @ v


def test_zigzag_expectation_is_causal_attention_over_the_pieces_in_sequence_order():
    world, pieces, heads, kv, d = 2, 3, 4, 2, 8
    generator = torch.Generator().manual_seed(1)
    parts = {n: [torch.randn(1, 2, pieces, h, d, generator=generator, dtype=torch.float64) for _ in range(world)]
             for n, h in (("Q", heads), ("K", kv), ("V", kv))}
    got = EXPECTATIONS["sp_ag_attention"](**parts)["O"]
    # global piece g is rank min(g, 2w-1-g)'s half g // w
    owner = [(min(g, 2 * world - 1 - g), g // world) for g in range(2 * world)]
    whole = {n: torch.cat([parts[n][r][0, z] for r, z in owner]) for n in parts}
    for r in range(world):
        for z in range(2):
            g = r if z == 0 else 2 * world - 1 - r
            for p in range(pieces):
                position = g * pieces + p
                allowed = torch.arange(2 * world * pieces) <= position
                for h in range(heads):
                    want = _naive(whole["Q"][position, h], whole["K"][:, h // 2], whole["V"][:, h // 2], allowed)
                    assert torch.allclose(got[r][0, z, p, h], want)


def test_decode_expectation_reads_each_sequence_only_up_to_its_length():
    world, cache, d = 2, 3, 8
    generator = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, d, generator=generator, dtype=torch.float64)
    k = [torch.randn(2, cache, 2, d, generator=generator, dtype=torch.float64) for _ in range(world)]
    v = [torch.randn(2, cache, 2, d, generator=generator, dtype=torch.float64) for _ in range(world)]
    lens = torch.tensor([2, 5], dtype=torch.int32)
    got = EXPECTATIONS["flash_decode"]([q, q], k, v, [lens, lens])["O"]
    keys, values = torch.cat(k, dim=1), torch.cat(v, dim=1)
    for b, n in enumerate(lens.tolist()):
        for h in range(4):
            want = _naive(q[b, h], keys[b, :, h // 2], values[b, :, h // 2], torch.arange(world * cache) < n)
            assert torch.allclose(got[1][b, h], want)
