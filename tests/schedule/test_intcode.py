"""The one sympy-to-integer printer that the checker, the code generator and the reference share."""
import pytest
import sympy

from tiledsl.schedule.intcode import code

x, y = sympy.Symbol("x", integer=True), sympy.Symbol("y", integer=True, positive=True)
i = sympy.Symbol("i", integer=True, nonnegative=True)


def test_kernel_division_and_mod_floor_for_any_sign_and_stay_plain_where_provably_non_negative():
    assert code(sympy.Mod(x, y)) == "tds_int.floormod(x, y)"
    assert code(sympy.floor(x / y)) == "tds_int.floordiv(x, y)"
    assert code(sympy.ceiling(x / y)) == "-tds_int.floordiv(-x, y)"
    assert code(sympy.floor((i - 1) / 2)) == "tds_int.floordiv(i - 1, 2)"
    # an index over a size: Triton's truncation is the floor
    assert code(sympy.Mod(i, y)) == "i % y"
    assert code(sympy.floor(i * 4 / y)) == "4 * i // y"
    assert code(sympy.ceiling(i / y)) == "tl.cdiv(i, y)"


def test_host_division_and_mod_are_pythons_which_floor():
    assert code(sympy.Mod(x, y), kernel=False) == "x % y"
    assert code(sympy.floor(x / y), kernel=False) == "x // y"
    values = {"x": -7, "y": 2}
    assert eval(code(sympy.ceiling(x / y), kernel=False), {}, values) == -3
    assert eval(code(sympy.floor((x - 1) / y), kernel=False), {}, values) == -4


def test_parentheses_only_where_precedence_needs_them():
    assert code(2 * (i + 1) * y) == "2 * y * (i + 1)" or code(2 * (i + 1) * y) == "y * (2 * i + 2)"
    assert code(sympy.floor(i / (2 * y))) == "i // (2 * y)"
    assert code(y - i - 1) == "y - i - 1"
    assert code(sympy.Mod(i + 3, y) * 4) == "4 * ((i + 3) % y)"


def test_min_and_max_are_triton_in_kernels_and_python_on_the_host():
    assert code(sympy.Min(x, y)) == "tl.minimum(x, y)"
    assert code(sympy.Min(x, y), kernel=False) == "min(x, y)"


def test_conditions_print_as_python_logic_on_the_host_and_as_masks_in_kernels():
    condition = sympy.And(sympy.Eq(sympy.Mod(x, 4), 0), x >= y)
    text = code(condition, kernel=False, names={"x": "a", "y": "b"})
    assert eval(text, {"min": min, "max": max}, {"a": 8, "b": 3}) is True
    assert eval(text, {"min": min, "max": max}, {"a": 6, "b": 3}) is False
    assert code(sympy.And(i - 1 >= 0, i - 1 < y)) == "(i - 1 >= 0) & (i - 1 < y)"


def test_strict_names_refuse_a_symbol_without_a_value():
    with pytest.raises(ValueError, match="'y' has no value here"):
        code(x + y, kernel=False, names={"x": "a"}, strict=True)
    assert code(x + y, names={"x": "a"}) == "a + y"  # not strict: a symbol keeps its own name


def test_host_code_rounds_up_with_the_named_cdiv_as_kernels_do_with_tl_cdiv():
    from tiledsl.runtime.intmath import cdiv
    n, b = sympy.symbols("n b", integer=True, positive=True)
    assert code(sympy.ceiling(n / b)) == "tl.cdiv(n, b)"
    assert code(sympy.ceiling(n / b), kernel=False, cdiv="tds_int.cdiv") == "tds_int.cdiv(n, b)"
    assert code(sympy.ceiling(n / b), kernel=False) == "(b + n - 1) // b"  # the checker's: no import
    assert code(sympy.ceiling(n / b), cdiv="tds_int.cdiv") == "tl.cdiv(n, b)"  # kernels keep Triton's
    text = code(sympy.ceiling(x / y), kernel=False, cdiv="cdiv")  # a numerator of any sign
    for a, d in ((-7, 2), (7, 2), (-8, 2), (0, 3), (5, 5)):
        assert eval(text, {"cdiv": cdiv}, {"x": a, "y": d}) == -(-a // d)
