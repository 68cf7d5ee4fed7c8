"""The GEMM tile alone (programs/gemm.tds, communication off) against cuBLAS (torch.matmul) on the
per-rank problems of the overlap benchmarks, on one GPU: the tile must reach 90% of cuBLAS."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import M, SHAPES, save, time_ms  # noqa: E402

import tiledsl  # noqa: E402

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"


def main() -> int:
    torch.manual_seed(0)
    programs = {bk: tiledsl.compile(PROGRAMS / "gemm.tds", BK=bk) for bk in (64, 128)}
    rows = []
    for world in (4, 2):
        for model, (N, K) in SHAPES.items():
            for op, (m, k, n) in (("ag_gemm", (M, K, N // world)), ("gemm_rs", (M, K // world, N))):
                A = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                B = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
                C = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                want = A @ B
                row = {"op": op, "model": model, "world": world, "M": m, "K": k, "N": n}
                row["cublas"] = time_ms(lambda: torch.matmul(A, B, out=C))
                for bk, program in programs.items():
                    C.fill_(float("nan"))
                    program(A, B, C)
                    err = ((C.float() - want.float()).norm() / want.float().norm()).item()
                    row[f"tiledsl_bk{bk}"] = time_ms(lambda: program(A, B, C, check=False))
                    row[f"error_bk{bk}"] = err
                row["tiledsl"] = min(row["tiledsl_bk64"], row["tiledsl_bk128"])
                row["fraction_of_cublas"] = row["cublas"] / row["tiledsl"]
                rows.append(row)
                print(f"{op:8} {model:13} W{world} {m}x{k}x{n}: cuBLAS {row['cublas']:.3f} ms, tiledsl "
                      f"{row['tiledsl']:.3f} ms ({100 * row['fraction_of_cublas']:.0f}%), "
                      f"rel err {row['error_bk64']:.1e}", flush=True)
    save("gemm_tile", {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
