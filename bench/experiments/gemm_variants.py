"""Which persistent-GEMM structure reaches cuBLAS on H200 with stock Triton: pointer vs TMA epilogue,
flattened (prefetch across tiles) or not, with and without a per-tile signal wait. One GPU; prints a
table. Results decided the shape of the generated matmul tile (see bench/NOTES.md). Each variant's
output is checked against cuBLAS's before it is timed; a wrong or failing variant is a FAIL line and
makes the exit code 1."""
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "gpu"))
from harness import mismatch  # noqa: E402


@triton.jit(noinline=True)
def slow_wait(sig_ptr, epoch, max_spins):
    seen = tl.atomic_add(sig_ptr, 0, sem="acquire", scope="sys")
    spins = 0
    while (seen < epoch) & (spins < max_spins):
        seen = tl.atomic_add(sig_ptr, 0, sem="acquire", scope="sys")
        spins += 1


@triton.jit
def gemm(a_desc, b_desc, c_desc, c_ptr, sig, order, epoch, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
         BK: tl.constexpr, TMA_STORE: tl.constexpr, FLATTEN: tl.constexpr, WAIT: tl.constexpr,
         ORDERED: tl.constexpr, NUM_PROGRAMS: tl.constexpr):
    pid = tl.program_id(0)
    n_n = tl.cdiv(N, BN)
    total = tl.cdiv(M, BM) * n_n
    for t in tl.range(pid, total, NUM_PROGRAMS, flatten=FLATTEN):
        if ORDERED:
            inst = tl.load(order + t)
        else:
            inst = t
        i = inst // n_n
        j = inst % n_n
        if WAIT:
            if tl.atomic_add(sig + i % 4, 0, sem="acquire", scope="sys") < epoch:
                slow_wait(sig + i % 4, epoch, 1000000)
        acc = tl.zeros([BM, BN], tl.float32)
        for kk in range(0, tl.cdiv(K, BK)):
            a = a_desc.load([i * BM, kk * BK])
            b = b_desc.load([kk * BK, j * BN])
            acc = tl.dot(a, b, acc)
        if TMA_STORE:
            c_desc.store([i * BM, j * BN], acc.to(tl.bfloat16))
        else:
            r = i * BM + tl.arange(0, BM)[:, None]
            c = j * BN + tl.arange(0, BN)[None, :]
            tl.store(c_ptr + r * N + c, acc.to(tl.bfloat16), mask=(r < M) & (c < N))


def grouped_order(M, N, BM, BN, group=8):
    n_m, n_n = triton.cdiv(M, BM), triton.cdiv(N, BN)
    order = []
    for g in range(0, n_m, group):
        for j in range(n_n):
            for i in range(g, min(g + group, n_m)):
                order.append(i * n_n + j)
    return torch.tensor(order, dtype=torch.int32, device="cuda")


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main() -> int:
    shapes = [(8192, 1024, 11008), (8192, 4096, 2752), (8192, 8192, 7168), (8192, 2048, 28672), (8192, 16384, 13312)]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    variants = {  # name: (tma_store, flatten, wait, ordered, stages)
        "ptr-store": (False, False, False, False, 3),
        "tma-store": (True, False, False, False, 3),
        "tma+flatten": (True, True, False, False, 3),
        "tma+flatten s4": (True, True, False, False, 4),
        "tma+flatten+wait": (True, True, True, False, 3),
        "tma+flatten+wait+group": (True, True, True, True, 3),
        "tma+wait+group": (True, False, True, True, 3),
    }
    failures = []
    print("shape".ljust(22) + "cuBLAS".rjust(8) + "".join(n.rjust(24) for n in variants))
    for M, K, N in shapes:
        A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        ref = A @ B
        sig = torch.ones(4, dtype=torch.int32, device="cuda")
        order = grouped_order(M, N, 128, 256)
        cublas = bench(lambda: torch.matmul(A, B, out=C))
        line = f"{M}x{K}x{N}".ljust(22) + f"{cublas:8.3f}"
        for name, (tma, flat, wait, ordered, stages) in variants.items():
            try:
                a_d = TensorDescriptor.from_tensor(A, [128, 64])
                b_d = TensorDescriptor.from_tensor(B, [64, 256])
                c_d = TensorDescriptor.from_tensor(C, [128, 256])
                programs = min(sms, triton.cdiv(M, 128) * triton.cdiv(N, 256))

                def run():
                    gemm[(programs,)](a_d, b_d, c_d, C, sig, order, 1, M, N, K, BM=128, BN=256, BK=64,
                                      TMA_STORE=tma, FLATTEN=flat, WAIT=wait, ORDERED=ordered,
                                      NUM_PROGRAMS=programs, num_warps=8, num_stages=stages)
                C.fill_(float("nan"))
                run()
                wrong = mismatch(C, ref, 2e-2, atol=1.0)
                if wrong:
                    raise AssertionError(wrong)
                t = bench(run)
                line += f"{t:10.3f} ({100 * cublas / t:3.0f}%)".rjust(24)
            except Exception as error:  # noqa: BLE001 - one broken variant leaves the others' figures
                line += f"{type(error).__name__[:20]}".rjust(24)
                failures.append(f"FAIL {name} {M}x{K}x{N} -- {type(error).__name__}: {str(error)[:300]}")
        print(line, flush=True)
    for failure in failures:
        print(failure, flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
