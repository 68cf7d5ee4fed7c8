"""Fixes to Triton's interpreter, installed in every emulated rank and in any process that runs a program
emulated, where it differs from the GPU.

A product of bfloat16 blocks (`tl.dot`): the interpreter keeps bfloat16 data as its uint16 bit patterns
and converts only 8-bit float operands before its matmul, so it multiplied the bit patterns (values
about 1e10 for inputs of about 1; triton-lang/triton#11584, declined upstream as unsupported). On the
GPU the tensor cores multiply the bfloat16 values exactly and accumulate in float32: the operands are
widened to float32 here (exact: a bfloat16 is the top half of a float32), then multiplied as the GPU
does, in float32.

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
    if getattr(builder, "_tiledsl_fixes", False):
        return
    builder._tiledsl_fixes = True
    create_dot = builder.create_dot

    def widened(handle):
        if handle.dtype != tl.bfloat16:
            return handle
        bits = np.ascontiguousarray(handle.data).view(np.uint16).astype(np.uint32) << 16
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def exact_dot(a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(widened(a), widened(b), d, input_precision, max_num_imprecise_acc)
    builder.create_dot = exact_dot
    binary_op = builder.binary_op

    def typed_binary_op(lhs, rhs, op):
        result = binary_op(lhs, rhs, op)
        if result.data.dtype == np.bool_ and result.dtype != tl.int1:
            return interpreter.TensorHandle(result.data, tl.int1)
        return result
    builder.binary_op = typed_binary_op
