"""Sympy sizes, index maps and conditions to integer code: for Triton kernels, for the generated host
launcher, and for the checker's compiled expressions (one printer for all three).

Every division in the schedule is either exact (sizes) or floored (index maps), so an expression is
printed over integers only: a rational `p/q` becomes `p // q` after sympy puts it over one
denominator, which is exact or the intended floor. Kernel code gets a non-negative `mod`, because
Triton's `%` on signed integers truncates like C; `cdiv` is `(n + d - 1) // d`, a ceiling for every n
under Python's floor division and for the non-negative n of kernel indices under Triton's."""
from __future__ import annotations

import sympy


def code(expr, kernel: bool = True, names: dict[str, str] | None = None, strict: bool = False) -> str:
    """Integer code for a sympy expression; `names` renames symbols (a symbol's own name otherwise, or
    with `strict` a ValueError for a symbol not in `names`). Host code (`kernel=False`) also prints
    relations and and/or/not, for conditions."""
    return _Printer(kernel, names or {}, strict).print(sympy.sympify(expr))


class _Printer:
    def __init__(self, kernel: bool, names: dict[str, str], strict: bool):
        self.kernel = kernel
        self.names = names
        self.strict = strict

    def print(self, e) -> str:
        if e is sympy.true or e is sympy.false:
            return str(bool(e))
        if e.is_Integer:
            return str(int(e))
        if e.is_Symbol:
            if self.strict and e.name not in self.names:
                raise ValueError(f"'{e}' has no value here")
            return self.names.get(e.name, e.name)
        logic = self.logic(e)
        if logic is not None:
            if self.kernel:  # kernels take conditions as masks built elsewhere, never as Python logic
                raise ValueError(f"cannot evaluate '{e}' with integers")
            return logic
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
        raise ValueError(f"cannot evaluate '{e}' with integers")

    def logic(self, e) -> str | None:
        """Relations and boolean connectives, as Python: None for anything else."""
        if isinstance(e, sympy.core.relational.Relational):
            return f"(({self.print(e.lhs)}) {e.rel_op} ({self.print(e.rhs)}))"
        if isinstance(e, (sympy.And, sympy.Or)):
            joiner = " and " if isinstance(e, sympy.And) else " or "
            return "(" + joiner.join(self.print(a) for a in e.args) + ")"
        if isinstance(e, sympy.Not):
            return f"(not {self.print(e.args[0])})"
        return None

    def div(self, num, den) -> str:
        if den == 1:
            return self.print(num)
        return f"(({self.print(num)}) // ({self.print(den)}))"

