"""The one sympy-to-integer printer that the checker, the code generator and the reference share."""
import pytest
import sympy

from tiledsl.schedule.intcode import code

x, y = sympy.Symbol("x", integer=True), sympy.Symbol("y", integer=True, positive=True)


def test_kernel_mod_is_non_negative_and_host_mod_is_pythons():
    assert code(sympy.Mod(x, y)) == "(((x) % y + y) % y)"
    assert code(sympy.Mod(x, y), kernel=False) == "((x) % y)"


def test_min_and_max_are_triton_in_kernels_and_python_on_the_host():
    assert code(sympy.Min(x, y)) == "tl.minimum(x, y)"
    assert code(sympy.Min(x, y), kernel=False) == "min(x, y)"


def test_host_code_prints_conditions_and_kernel_code_refuses_them():
    condition = sympy.And(sympy.Eq(sympy.Mod(x, 4), 0), x >= y)
    text = code(condition, kernel=False, names={"x": "a", "y": "b"})
    assert eval(text, {"min": min, "max": max}, {"a": 8, "b": 3}) is True
    assert eval(text, {"min": min, "max": max}, {"a": 6, "b": 3}) is False
    with pytest.raises(ValueError, match="with integers"):
        code(condition)


def test_strict_names_refuse_a_symbol_without_a_value():
    with pytest.raises(ValueError, match="'y' has no value here"):
        code(x + y, kernel=False, names={"x": "a"}, strict=True)
    assert code(x + y, names={"x": "a"}) == "(a + y)"  # not strict: a symbol keeps its own name
