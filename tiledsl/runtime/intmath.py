"""Integer division and modulo that floor, for every sign, inside Triton kernels: what `/` and `mod`
mean in a program's index maps, and what the checker and the reference compute with Python's `//`
and `%`. Triton's own `//` and `%` truncate toward zero like C; the code generator calls these only
where it cannot prove the numerator non-negative (schedule/intcode.py)."""
import triton
import triton.language as tl


@triton.jit
def floordiv(a, b):
    quotient = a // b
    # truncation rounded up where the exact quotient is negative and not whole: step down once
    inexact = (quotient * b != a) & ((a < 0) != (b < 0))
    return quotient - inexact.to(quotient.dtype)


@triton.jit
def floormod(a, b):
    return a - floordiv(a, b) * b
