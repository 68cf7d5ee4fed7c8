"""Sympy sizes and index maps to integer code, for Triton kernels and for the host launcher.

Every division in the schedule is either exact (sizes) or floored (index maps), so an expression is
printed over integers only: a rational `p/q` becomes `p // q` after sympy puts it over one
denominator, which is exact or the intended floor. Kernel code gets a non-negative `mod`, because
Triton's `%` on signed integers truncates like C."""
from __future__ import annotations

import sympy


def code(expr, kernel: bool = True, names: dict[str, str] | None = None) -> str:
    """Integer code for a sympy expression; `names` renames symbols (a symbol's own name otherwise)."""
    return _Printer(kernel, names or {}).print(sympy.sympify(expr))


class _Printer:
    def __init__(self, kernel: bool, names: dict[str, str]):
        self.kernel = kernel
        self.names = names

    def print(self, e) -> str:
        if e.is_Integer:
            return str(int(e))
        if e.is_Symbol:
            return self.names.get(e.name, e.name)
        if isinstance(e, sympy.floor):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            return self.div(num, den)
        if isinstance(e, sympy.ceiling):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            if den == 1:
                return self.print(num)
            d = f"({self.print(den)})"
            return f"(({self.print(num)} + {d} - 1) // {d})"
        if isinstance(e, sympy.Mod):
            a, b = self.print(e.args[0]), self.print(e.args[1])
            return f"((({a}) % {b} + {b}) % {b})" if self.kernel else f"(({a}) % {b})"
        if isinstance(e, (sympy.Min, sympy.Max)):
            func = ("tl.minimum" if isinstance(e, sympy.Min) else "tl.maximum") if self.kernel else \
                ("min" if isinstance(e, sympy.Min) else "max")
            out = self.print(e.args[0])
            for arg in e.args[1:]:
                out = f"{func}({out}, {self.print(arg)})"
            return out
        num, den = sympy.fraction(sympy.together(e))
        if den != 1:
            return self.div(num, den)
        if e.is_Add:
            terms = [self.print(t) for t in sympy.Add.make_args(e)]
            out = terms[0]
            for t in terms[1:]:
                out += f" - {t[1:]}" if t.startswith("-") else f" + {t}"
            return f"({out})"
        if e.is_Mul:
            coeff, rest = e.as_coeff_Mul()
            factors = [self.print(f) for f in sympy.Mul.make_args(rest)]
            body = " * ".join(factors)
            if coeff == -1:
                return f"-{body}" if len(factors) == 1 else f"-({body})"
            if coeff != 1:
                return f"{self.print(coeff)} * {body}"
            return body
        if e.is_Pow and e.exp.is_Integer and e.exp > 0:
            return "(" + " * ".join([self.print(e.base)] * int(e.exp)) + ")"
        raise ValueError(f"cannot print {e!r} as integer code")

    def div(self, num, den) -> str:
        if den == 1:
            return self.print(num)
        return f"(({self.print(num)}) // ({self.print(den)}))"

