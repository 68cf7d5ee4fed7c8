"""Steady-state launches without Triton's per-call argument binding.

A call through a `@triton.jit` function binds and specialises every argument before it finds the
compiled kernel: tens of microseconds for a kernel with forty arguments, more than the whole GPU time
of a small collective. A program's arguments stay the same from call to call (the epoch is read
from a device cell), so after the first launch the runtime keeps the compiled kernel and its argument
list and launches it again as it is. The compiled kernel was specialised on these very arguments, so it is the
kernel the JIT would have picked.
"""
from __future__ import annotations


class Replay:
    """Launch `compiled` on `grid` again with the JIT function's arguments in `values`, by name."""

    def __init__(self, jit_function, compiled, grid: tuple, values: dict):
        if hasattr(compiled, "result"):  # a kernel compiled asynchronously
            compiled = compiled.result()
        names = list(jit_function.arg_names)
        missing = [n for n in names if n not in values]
        if missing:
            raise KeyError(f"no value for kernel argument(s) {', '.join(missing)}")
        self.names = names
        self.args = [values[n] for n in names]
        self.runner = compiled[tuple(grid) + (1,) * (3 - len(grid))]

    def rebound(self, values: dict) -> "Replay":
        """The same compiled kernel with the arguments in `values` replaced (the caller's pointers of
        another call of the same shapes and alignment: what the kernel was specialised on holds)."""
        other = object.__new__(Replay)
        other.names, other.runner = self.names, self.runner
        other.args = [values.get(n, a) for n, a in zip(self.names, self.args)]
        return other

    def __call__(self) -> None:
        self.runner(*self.args)
