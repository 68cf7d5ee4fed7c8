"""Why is sp_ag_attention at BM=128 BN=64 (3 stages) 1.5x its own tile alone at world 1?

Session 12, run 10: the SP program 4.89 ms, attention_local with the same blocks 3.25 ms, at B=2, 8192
tokens, 32/8 heads (the default blocks' gap is 1.06x). The SP program reads K and V from NVSHMEM's heap
(K_all, V_all are symmetric), attention_local from the caller's tensors. This times, on one GPU, the
tile alone with K and V in torch's memory and in the heap, and the SP program, each the median of
20 calls between CUDA events (every output checked against the first tile's once).

    torchrun --nproc-per-node=1 bench/experiments/attention_heap_probe.py
"""
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
from harness import start  # noqa: E402

import tiledsl  # noqa: E402

B, P, H, HKV, D = 2, 4096, 32, 8, 128
BLOCKS = {"BM": 128, "BN": 64, "num_stages": 3}


def timed(call) -> float:
    call()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        call()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times)


def main():
    _, world, heap = start(11)
    assert world == 1, "made for one GPU: K_all is the rank's own K and V in sequence order"
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    Q = torch.randn(B, 2, P, H, D, **bf16)
    K, V = torch.randn(B, 2, P, HKV, D, **bf16), torch.randn(B, 2, P, HKV, D, **bf16)
    O = torch.empty(B, 2, P, H, D, **bf16)
    local = tiledsl.compile(ROOT / "bench" / "experiments" / "attention_local.tds", heap, D=D, **BLOCKS)
    sp = tiledsl.compile(ROOT / "programs" / "sp_ag_attention.tds", heap, D=D, **BLOCKS)
    K_heap, V_heap = heap.alloc(K.shape, K.dtype), heap.alloc(V.shape, V.dtype)
    K_heap.copy_(K)
    V_heap.copy_(V)
    rows = {}
    rows["tile alone, K and V in torch's memory"] = timed(lambda: local(Q, K, V, O))
    want = O.clone()
    rows["tile alone, K and V in the heap"] = timed(lambda: local(Q, K_heap, V_heap, O))
    assert torch.equal(O, want), "the tile on the heap's K and V differs"
    rows["sp_ag_attention (gathers into the heap, waits)"] = timed(lambda: sp(Q, K, V, O))
    close = (O.float() - want.float()).abs().max().item()
    for label, ms in rows.items():
        print(f"{label:52s} {ms:.3f} ms", flush=True)
    print(f"sp_ag_attention against the tile: max abs difference {close:.3g}", flush=True)
    local.release()
    sp.release()
    heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
