"""Integer division and modulo that floor, for every sign, inside Triton kernels: what `/` and `mod`
mean in a program's index maps, and what the checker and the reference compute with Python's `//`
and `%`. Triton's own `//` and `%` truncate toward zero like C; the code generator calls these only
where it cannot prove the numerator non-negative (schedule/intcode.py). `cdiv` is the host's: generated
host code rounds a quotient up with it where the kernel writes `tl.cdiv`."""
import triton
import triton.language as tl


@triton.jit
def floordiv(a, b):
    quotient = a // b
    # Whatever `//` did here, the floor leaves a remainder of b's sign (or none). On the GPU `//`
    # truncates, which leaves a's sign where the quotient is negative and not whole: step down once
    # there. Triton's interpreter floors scalars that are plain Python ints (a loop's index) and
    # truncates tensors: the remainder's sign is right for both, where a test of a's sign would
    # step a floored quotient down a second time.
    remainder = a - quotient * b
    wrong = (remainder != 0) & ((remainder < 0) != (b < 0))
    return quotient - wrong.to(quotient.dtype)


@triton.jit
def floormod(a, b):
    return a - floordiv(a, b) * b


def cdiv(a: int, b: int) -> int:
    """The quotient rounded up, for every sign: what a program's `cdiv(a, b)` means on the host."""
    return -(-a // b)
