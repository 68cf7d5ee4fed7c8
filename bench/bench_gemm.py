"""The GEMM tile alone (programs/gemm.tds, communication off) against cuBLAS (torch.matmul) on the
per-rank problems of the overlap benchmarks, on one GPU: the tile must reach 90% of cuBLAS. The
headline is the program as compiled with no tuning given; each BK it may be tuned to is a column,
and the best of them one more. Every output is checked against cuBLAS's before it is timed (a wrong
one is a FAIL line, left out, and the exit code is 1); both run on the same random data."""
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import M, NAN, SHAPES, Verdicts, program_call, save, time_checked, time_ms  # noqa: E402

import tiledsl  # noqa: E402

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"


def main() -> int:
    torch.manual_seed(0)
    verdicts = Verdicts()
    programs = {"default": tiledsl.compile(PROGRAMS / "gemm.tds"),
                **{f"bk{bk}": tiledsl.compile(PROGRAMS / "gemm.tds", BK=bk) for bk in (64, 128)}}
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
                for name, program in programs.items():
                    key = "tiledsl" if name == "default" else f"tiledsl_{name}"
                    row[key] = time_checked(verdicts, f"gemm {op} {model} W{world} {name}",
                                            program_call(program, A, B, C), program.check, C, want)
                    row[f"error_{name}"] = ((C.float() - want.float()).norm() / want.float().norm()).item()
                tuned = [(row[f"tiledsl_bk{bk}"], f"bk{bk}") for bk in (64, 128)
                         if math.isfinite(row[f"tiledsl_bk{bk}"])]
                row["best"], row["best_variant"] = min(tuned) if tuned else (NAN, None)
                row["fraction_of_cublas"] = row["cublas"] / row["tiledsl"]
                row["best_fraction_of_cublas"] = row["cublas"] / row["best"]
                rows.append(row)
                print(f"{op:8} {model:13} W{world} {m}x{k}x{n}: cuBLAS {row['cublas']:.3f} ms, tiledsl "
                      f"{row['tiledsl']:.3f} ms ({100 * row['fraction_of_cublas']:.0f}%), best "
                      f"{row['best']:.3f} ({row['best_variant']}, {100 * row['best_fraction_of_cublas']:.0f}%), "
                      f"rel err {row['error_default']:.1e}", flush=True)
    save("gemm_tile", {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "wrong": verdicts.wrong,
                       "rows": rows})
    return verdicts.exit_code()


if __name__ == "__main__":
    sys.exit(main())
