"""Multi-GPU checks of the attention programs, run under torchrun (made for world 2, any world works):
sp_ag_attention (zig-zag causal, GQA; also built with BM=128 BN=64), sp_ulysses (causal and full),
flash_decode (one sequence whose cache ends before the last rank's share, lengths no block divides),
each against torch's scaled_dot_product_attention in float32 on the sequence gathered by
torch.distributed; 100 calls back to back with no reset, each on fresh random inputs with its output
poisoned (NaN) before and checked after; and flash_decode recorded into a CUDA graph of the caller's,
replayed 100 times on fresh inputs copied into the graph's tensors. Rank 0 prints one PASS/FAIL line a
check."""
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from harness import Case, Checks, back_to_back, cap_calls, close, empty, host, start  # noqa: E402

import tiledsl

PROGRAMS = Path(__file__).resolve().parents[2] / "programs"
CALLS = 100
NAN = float("nan")
BF16 = {"dtype": torch.bfloat16}
D = 128


def zigzag_shapes(world):
    """(B, P, H, HKV) of sp_ag_attention: P tokens a piece, 2 * world pieces; the second no block divides."""
    return [(1, 1024, 8, 2), (2, 1000, 32, 8)]


def zigzag_block_cases(world):
    """(blocks, (B, P, H, HKV)) of sp_ag_attention built with other blocks: BM=128 BN=64 at the size where
    the GPU run of 2026-12-01 found rank 1 wrong (then 4 warps and a spilling kernel; now 8, no spill)."""
    # the ragged size first, so that its verdict does not follow a timed-out call; then B=2 at 4096 tokens
    # (timed out on one H200, session 12 run 1) with the persistent grid four programs short of the SMs,
    # then with the whole grid: a copy that needs an SM cannot start while the kernel fills every SM
    # (bench/experiments/copy_starvation.py)
    fewer = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count - 4
    # BM=128 BN=64 on 3 stages: right in 30 calls at the ragged size where 1 and 2 stages were wrong
    # (bench/experiments/attention_blocks_probe.py, session 12), and the fastest tile on one H200
    three = {"BM": 128, "BN": 64, "num_stages": 3}
    # the blocks read through pointers (TMA=0) and through descriptors made on the device (TMA=2), beside
    # the default's made by the launcher, at the ragged size (issue 26)
    return [({"BM": 128, "BN": 64}, (1, 1000, 8, 2)), ({"BM": 128, "BN": 64, "num_sms": fewer}, (2, 2048, 32, 8)),
            ({"BM": 128, "BN": 64}, (2, 2048, 32, 8)), (three, (1, 1000, 8, 2)), (three, (2, 2048, 32, 8)),
            ({"TMA": 0}, (2, 1000, 32, 8)), ({"TMA": 2}, (2, 1000, 32, 8))]


def ulysses_shapes(world):
    """(S, DM, H, HKV): H and HKV split over the ranks; the second's shards no block divides."""
    return [(1024 * world, 1024, 8 * world, 2 * world), (1000 * world, 512, 4 * world, world)]


def decode_shapes(world):
    """(B, H, HKV, C): C cache positions a rank."""
    return [(1, 64, 8, 4096), (8, 64, 8, 1000)]


# ---- references: torch on the gathered sequence, float32 ------------------------------------------------

def gathered(x: torch.Tensor) -> list[torch.Tensor]:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    host.all_gather(parts, x.contiguous())
    return parts


def sdpa(q, k, v, causal: bool) -> torch.Tensor:
    """[batch, tokens, heads, D] in and out, float32; query head h on KV head h // (H / HKV). KV heads
    repeated rather than enable_gqa: the memory-light backends take float32 that way."""
    group = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    out = F.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float(),
                                         v.transpose(1, 2).float(), is_causal=causal)
    return out.transpose(1, 2)


def zigzag_reference(Q, K, V):
    """This rank's pieces of causal attention over the sequence whose pieces r and 2w-1-r rank r holds."""
    world, rank = dist.get_world_size(), dist.get_rank()

    def whole(x):
        pieces = [None] * (2 * world)
        for r, part in enumerate(gathered(x)):
            pieces[r], pieces[2 * world - 1 - r] = part[:, 0], part[:, 1]
        return torch.cat(pieces, dim=1)
    out = sdpa(whole(Q), whole(K), whole(V), causal=True)
    P = Q.shape[2]
    return torch.stack([out[:, rank * P:(rank + 1) * P], out[:, (2 * world - 1 - rank) * P:(2 * world - rank) * P]],
                       dim=1)


def ulysses_reference(X, WQ, WK, WV, causal):
    """This rank's tokens of attention over every rank's tokens, each projected with its rank's weights."""
    world, rank = dist.get_world_size(), dist.get_rank()
    q, k, v = (torch.cat([x.float() @ w.float() for x, w in zip(gathered(X), gathered(W))]) for W in (WQ, WK, WV))
    tokens = q.shape[0]
    out = sdpa(*(t.reshape(1, tokens, -1, D) for t in (q, k, v)), causal=causal).reshape(tokens, -1)
    rows = tokens // world
    return out[rank * rows:(rank + 1) * rows]


def decode_reference(Q, K, V, Lens):
    """One query a sequence against the first Lens[b] positions of the cache that the ranks split."""
    keys, values = torch.cat(gathered(K), dim=1), torch.cat(gathered(V), dim=1)
    rows = [sdpa(Q[b][None, None], keys[b:b + 1, :int(n)], values[b:b + 1, :int(n)], causal=False)[0, 0]
            for b, n in enumerate(Lens.tolist())]
    return torch.stack(rows)


def decode_lengths(Lens, C):
    """Random lengths, the same on every rank; sequence 0 ends inside rank 0's share (every other rank
    holds none of it), and no length is a multiple of a block."""
    world = dist.get_world_size()
    Lens.random_(1, world * C + 1)
    Lens[0] = C // 2 + 1
    Lens.add_((Lens % 64 == 0).int())
    Lens.clamp_(max=world * C)
    host.broadcast(Lens, 0)


# ---- checks ------------------------------------------------------------------------------------------

def zigzag_check(heap, B, P, H, HKV, blocks=None):
    def run():
        program = tiledsl.compile(PROGRAMS / "sp_ag_attention.tds", heap, D=D, **(blocks or {}))

        def make_case():
            Q, O = empty(B, 2, P, H, D, **BF16), empty(B, 2, P, H, D, **BF16)
            K, V = empty(B, 2, P, HKV, D, **BF16), empty(B, 2, P, HKV, D, **BF16)
            want = empty(B, 2, P, H, D)

            def refresh():
                for t in (Q, K, V):
                    t.normal_()
                want.copy_(zigzag_reference(Q, K, V))
                O.fill_(NAN)
            return Case((Q, K, V, O), refresh, lambda: close(O, want))
        back_to_back(program, program.check, make_case, CALLS)
    return run


def ulysses_check(heap, world, S, DM, H, HKV, causal):
    def run():
        program = tiledsl.compile(PROGRAMS / "sp_ulysses.tds", heap, CAUSAL=int(causal), D=D)

        def make_case():
            X = empty(S // world, DM, **BF16)
            WQ, WK, WV = empty(DM, H * D, **BF16), empty(DM, HKV * D, **BF16), empty(DM, HKV * D, **BF16)
            O, want = empty(S // world, H * D, **BF16), empty(S // world, H * D)

            def refresh():
                X.normal_().div_(DM ** 0.5)
                for w in (WQ, WK, WV):
                    w.normal_()
                want.copy_(ulysses_reference(X, WQ, WK, WV, causal))
                O.fill_(NAN)
            return Case((X, WQ, WK, WV, O), refresh, lambda: close(O, want))
        back_to_back(program, program.check, make_case, CALLS)
    return run


def decode_case(B, H, HKV, C):
    Q, O = empty(B, H, D, **BF16), empty(B, H, D, **BF16)
    K, V = empty(B, C, HKV, D, **BF16), empty(B, C, HKV, D, **BF16)
    Lens = torch.empty(B, dtype=torch.int32, device=Q.device)
    want = empty(B, H, D)

    def refresh():
        Q.normal_()
        host.broadcast(Q, 0)  # one query, the same on every rank
        K.normal_()
        V.normal_()
        decode_lengths(Lens, C)
        want.copy_(decode_reference(Q, K, V, Lens))
        O.fill_(NAN)
    return Case((Q, K, V, Lens, O), refresh, lambda: close(O, want))


def decode_check(heap, B, H, HKV, C):
    def run():
        program = tiledsl.compile(PROGRAMS / "flash_decode.tds", heap, D=D)
        back_to_back(program, program.check, lambda: decode_case(B, H, HKV, C), CALLS)
    return run


def decode_graph_check(heap, B, H, HKV, C):
    """The caller records one decode step into a CUDA graph of its own (the program relaunches its
    compiled kernel, which reads the epoch from the device) and replays it on new inputs each time."""
    def run():
        program = tiledsl.compile(PROGRAMS / "flash_decode.tds", heap, graphs=False, D=D)
        case = decode_case(B, H, HKV, C)
        for _ in range(3):  # compile, then the direct relaunch that the graph records
            case.refresh()
            program(*case.args)
            case.verify()
        replay = lambda: program(*case.args, check=False)  # noqa: E731 - what the stand-ins of CPU tests get
        if case.args[0].is_cuda:
            side = torch.cuda.Stream()  # warm up on a side stream first, as torch.cuda.graph asks
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                program(*case.args, check=False)
            torch.cuda.current_stream().wait_stream(side)
            program.check()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                program(*case.args, check=False)
            replay = graph.replay
        for _ in range(cap_calls(CALLS)):
            case.refresh()
            replay()
            program.check()
            case.verify()
    return run


SEED = 2468


def register(checks, rank: int, world: int, heap) -> None:
    """Every check of this suite, recorded in `checks` (tests/gpu/all_checks.py runs the suites one after
    another in one process group)."""
    record = checks.record
    for B, P, H, HKV in zigzag_shapes(world):
        record(f"sp_ag_attention B={B} P={P} H={H} HKV={HKV} (sequence {2 * world * P})",
               zigzag_check(heap, B, P, H, HKV))
    for blocks, (B, P, H, HKV) in zigzag_block_cases(world):
        record(f"sp_ag_attention {blocks} B={B} P={P} H={H} HKV={HKV} (sequence {2 * world * P})",
               zigzag_check(heap, B, P, H, HKV, blocks))
    for S, DM, H, HKV in ulysses_shapes(world):
        for causal in (True, False):
            record(f"sp_ulysses {'causal' if causal else 'full'} S={S} DM={DM} H={H} HKV={HKV}",
                   ulysses_check(heap, world, S, DM, H, HKV, causal))
    for B, H, HKV, C in decode_shapes(world):
        record(f"flash_decode B={B} H={H} HKV={HKV} C={C} a rank", decode_check(heap, B, H, HKV, C))
    B, H, HKV, C = decode_shapes(world)[-1]
    record(f"flash_decode in the caller's CUDA graph B={B} H={H} HKV={HKV} C={C}",
           decode_graph_check(heap, B, H, HKV, C))


def main() -> int:
    rank, world, heap = start(SEED)
    checks = Checks()
    register(checks, rank, world, heap)
    return checks.finish(heap)


if __name__ == "__main__":
    sys.exit(main())
