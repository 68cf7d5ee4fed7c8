"""Sympy sizes, index maps and conditions to integer code: for Triton kernels, for the generated host
launcher, and for the checker's compiled expressions (one printer for all three).

Every division in the schedule is either exact (sizes) or floored (index maps), so an expression is
printed over integers only: a term `p/q` becomes a floor division, exact where it is a size and the
intended floor inside `floor()` (whose argument sympy first puts over one denominator). Host code is Python, whose `//` and `%` floor. In a
kernel Triton's `//` and `%` truncate toward zero like C, which differs for a negative numerator: there
a division or modulo that sympy cannot prove non-negative goes through `tds_int.floordiv` /
`tds_int.floormod` (tiledsl/runtime/intmath.py), which floor for every sign, and the plain operators
are kept where the numerator is provably non-negative and the denominator positive (indices,
ranks and sizes are), so common code stays plain. Parentheses only where precedence needs them."""
from __future__ import annotations

import sympy

# precedence of what an expression prints as (Python's): the higher binds tighter
ATOM, UNARY, MUL, ADD, COMPARE, NOT, AND, OR = 100, 90, 80, 70, 50, 45, 40, 30


def code(expr, kernel: bool = True, names: dict[str, str] | None = None, strict: bool = False,
         cdiv: str | None = None) -> str:
    """Integer code for a sympy expression; `names` renames symbols (a symbol's own name otherwise, or
    with `strict` a ValueError for a symbol not in `names`). Conditions print with `and`/`or` in host
    code and `&`/`|` between parenthesised comparisons in kernels. `cdiv` names a host function
    `cdiv(a, b)` that rounds a quotient up for every sign (tiledsl/runtime/intmath.py's `cdiv`): host
    code then calls it where a kernel calls `tl.cdiv`, and writes `-(-a // b)` without it (the
    checker's and the reference's compiled expressions, which import nothing)."""
    return _Printer(kernel, names or {}, strict, cdiv).print(sympy.sympify(expr))[0]


class _Printer:
    def __init__(self, kernel: bool, names: dict[str, str], strict: bool, cdiv: str | None = None):
        self.kernel = kernel
        self.names = names
        self.strict = strict
        self.cdiv = None if kernel else cdiv

    def text(self, e, precedence: int) -> str:
        """`e` printed to sit where an operand of `precedence` goes."""
        out, own = self.print(e)
        return out if own > precedence else f"({out})"

    def print(self, e) -> tuple[str, int]:
        if e is sympy.true or e is sympy.false:
            return ("True" if e is sympy.true else "False"), ATOM
        if e.is_Integer:
            return str(int(e)), ATOM if e >= 0 else UNARY
        if e.is_Symbol:
            if self.strict and e.name not in self.names:
                raise ValueError(f"'{e}' has no value here")
            return self.names.get(e.name, e.name), ATOM
        logic = self.logic(e)
        if logic is not None:
            return logic
        if isinstance(e, sympy.floor):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            return self.divide(num, den)
        if isinstance(e, sympy.ceiling):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            if den == 1:
                return self.print(num)
            if self.cdiv is not None:  # the host's own cdiv: exact for every sign, as `-(-a // b)` is
                return f"{self.cdiv}({self.print(num)[0]}, {self.print(den)[0]})", ATOM
            if not self.kernel:
                if self.plain(num, den):
                    return f"({self.print(num + den - 1)[0]}) // {self.text(den, MUL)}", MUL
                return f"-(-{self.text(num, UNARY)} // {self.text(den, MUL)})", UNARY
            if self.plain(num, den):
                return f"tl.cdiv({self.print(num)[0]}, {self.print(den)[0]})", ATOM
            return f"-tds_int.floordiv(-{self.text(num, UNARY)}, {self.print(den)[0]})", UNARY
        if isinstance(e, sympy.Mod):
            a, b = e.args
            if self.kernel and not self.plain(a, b):
                return f"tds_int.floormod({self.print(a)[0]}, {self.print(b)[0]})", ATOM
            return f"{self.text(a, MUL - 1)} % {self.text(b, MUL)}", MUL
        if isinstance(e, (sympy.Min, sympy.Max)):
            func = ("tl.minimum" if isinstance(e, sympy.Min) else "tl.maximum") if self.kernel else \
                ("min" if isinstance(e, sympy.Min) else "max")
            out = self.print(e.args[0])[0]
            for arg in e.args[1:]:
                out = f"{func}({out}, {self.print(arg)[0]})"
            return out, ATOM
        if e.is_Add:  # term by term: each term's own exact division, not one over a common denominator
            return self.add(e)
        num, den = sympy.fraction(e)
        if den != 1:
            return self.divide(num, den)
        if e.is_Mul:
            coeff, rest = e.as_coeff_Mul()
            factors = sympy.Mul.make_args(rest)
            if coeff == -1:  # unary minus binds tighter than `//` and `%`: `-(a // b)`, but `-a * b`
                if len(factors) == 1:
                    return f"-{self.text(rest, UNARY)}", UNARY
                return f"-{self.product(factors, leading=False)}", UNARY
            if coeff != 1:  # the factors follow `coeff *`: none of them may be a bare `a // b` or `a % b`
                return f"{self.text(coeff, MUL - 1)} * {self.product(factors, leading=False)}", MUL
            return self.product(factors), MUL if len(factors) > 1 else self.print(factors[0])[1]
        if e.is_Pow and e.exp.is_Integer and e.exp > 0:
            return " * ".join([self.text(e.base, MUL)] * int(e.exp)), MUL
        raise ValueError(f"cannot evaluate '{e}' with integers")

    def product(self, factors, leading: bool = True) -> str:
        """Factors joined by `*`; the first may be a division or modulo only when nothing precedes it."""
        out = self.text(factors[0], MUL - 1 if leading else MUL)
        for f in factors[1:]:
            out += f" * {self.text(f, MUL)}"
        return out

    def add(self, e) -> tuple[str, int]:
        """Positive terms first, then the subtracted ones, then the constant: `world - rank - 1`."""
        terms = sympy.Add.make_args(e)
        constant = [t for t in terms if t.is_Number]
        ordered = [t for t in terms if not t.is_Number and not t.could_extract_minus_sign()] + \
                  [t for t in terms if not t.is_Number and t.could_extract_minus_sign()] + constant
        out = ""
        for t in ordered:
            negative = t.could_extract_minus_sign()
            body = self.text(-t if negative else t, ADD)
            out = (f"-{self.text(-t, UNARY)}" if negative else body) if not out else \
                f"{out} {'-' if negative else '+'} {body}"
        return out, ADD

    def plain(self, num, den) -> bool:
        """Whether Triton's truncating `//` and `%` give the floor here: a numerator sympy proves
        non-negative over a positive denominator."""
        return bool(num.is_nonnegative) and bool(den.is_positive)

    def divide(self, num, den) -> tuple[str, int]:
        if den == 1:
            return self.print(num)
        if self.kernel and not self.plain(num, den):
            return f"tds_int.floordiv({self.print(num)[0]}, {self.print(den)[0]})", ATOM
        return f"{self.text(num, MUL - 1)} // {self.text(den, MUL)}", MUL

    def logic(self, e) -> tuple[str, int] | None:
        """Relations and boolean connectives: None for anything else."""
        if isinstance(e, sympy.core.relational.Relational):
            return f"{self.text(e.lhs, COMPARE)} {e.rel_op} {self.text(e.rhs, COMPARE)}", COMPARE
        if isinstance(e, (sympy.And, sympy.Or)):
            is_and = isinstance(e, sympy.And)
            if self.kernel:  # `&` binds tighter than comparisons in Python and Triton: parenthesise them
                joiner, own = (" & ", AND) if is_and else (" | ", OR)
                return joiner.join(self.text(a, ATOM - 1) for a in e.args), own
            joiner, own = (" and ", AND) if is_and else (" or ", OR)
            return joiner.join(self.text(a, own) for a in e.args), own
        if isinstance(e, sympy.Not):
            if self.kernel:
                return f"~{self.text(e.args[0], ATOM - 1)}", UNARY
            return f"not {self.text(e.args[0], NOT)}", NOT
        return None
