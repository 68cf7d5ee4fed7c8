"""A fix to Triton's interpreter, installed in every emulated rank, where it differs from the GPU.

A comparison of scalars (`ids_t < V`, a gathered row's index in range) gives bool data under a handle
typed like its operands (int32): splatted into a block mask (`(elems < D) & (ids_t < V)`) it becomes
int32 data, which a masked load refuses ("mask has unsupported dtype"). On the GPU the comparison is
an i1 and the mask is fine, so the handle is given the type of its data."""
from __future__ import annotations

import numpy as np


def install() -> None:
    from triton import language as tl
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    if getattr(builder, "_tiledsl_bool_fix", False):
        return
    builder._tiledsl_bool_fix = True
    binary_op = builder.binary_op

    def typed_binary_op(lhs, rhs, op):
        result = binary_op(lhs, rhs, op)
        if result.data.dtype == np.bool_ and result.dtype != tl.int1:
            return interpreter.TensorHandle(result.data, tl.int1)
        return result
    builder.binary_op = typed_binary_op
