"""Rounding to fp8 and bf16 inside Triton kernels, the same on the GPU and in Triton's interpreter.

A float32 block cast with `.to(tl.float8e4nv)` rounds to nearest even on the GPU (cvt.rn.satfinite),
but Triton's interpreter (3.9) rounds half up and, where rounding carries out of the mantissa, does not
carry into the exponent: 127.7 becomes 64 there, not 128. The code generator therefore rounds first, in
float32, to a value e4m3 holds exactly, and only then casts: both cast exactly, and agree with torch's
`.to(torch.float8_e4m3fn)` on every finite value within e4m3's range.

The interpreter's `.to(tl.bfloat16)` truncates (half of random values come out one step toward zero),
where the GPU rounds to nearest even: `round_bf16` rounds in float32 first there, and on the GPU is the
plain cast (INTERPRETED is a constexpr: the other branch is not compiled)."""
import os

import triton
import triton.language as tl

INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")

E4M3_MAX = tl.constexpr(448.0)            # the largest finite e4m3 ("fn": no infinities)
E4M3_MIN_NORMAL = tl.constexpr(0.015625)  # 2**-6: below it e4m3's step is fixed at 2**-9
SUBNORMAL_SHIFT = tl.constexpr(24576.0)   # 1.5 * 2**14: float32's step there is 2**-9, so `(x + it) - it`
#                                           rounds x to it


@triton.jit
def round_e4m3(x):
    """`x` (float32) rounded to nearest even among e4m3's values, as float32; beyond +-448, +-448."""
    bits = x.to(tl.int32, bitcast=True)
    # keep 3 of float32's 23 mantissa bits: add just under half of the 20 dropped bits' weight, plus
    # the kept part's lowest bit (ties to even), then clear them; a carry moves into the exponent
    kept = (bits + (0x7FFFF + ((bits >> 20) & 1))) & -1048576
    normal = kept.to(tl.float32, bitcast=True)
    subnormal = (x + SUBNORMAL_SHIFT) - SUBNORMAL_SHIFT
    rounded = tl.where(tl.abs(x) < E4M3_MIN_NORMAL, subnormal, normal)
    return tl.minimum(tl.maximum(rounded, -E4M3_MAX), E4M3_MAX)


@triton.jit
def round_bf16(x):
    """`x` (float32) rounded to nearest even among bf16's values, as float32."""
    if INTERPRETED:
        bits = x.to(tl.int32, bitcast=True)
        # keep bfloat16's 7 of float32's 23 mantissa bits, ties to even; a carry moves into the exponent
        kept = (bits + (0x7FFF + ((bits >> 16) & 1))) & -65536
        return tl.where(x == x, kept.to(tl.float32, bitcast=True), x)  # NaN stays NaN
    else:
        return x.to(tl.bfloat16).to(tl.float32)
