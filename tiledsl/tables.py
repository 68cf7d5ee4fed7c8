"""One table per concept that the front end, the code generator and the reference all read: the
dtypes a program may declare, and the elementwise functions a tile may apply. Adding a dtype or a
function is one line here; nothing else keeps its own list."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Dtype:
    name: str                   # torch's name, what the schedule stores: "bfloat16"
    spellings: tuple[str, ...]  # how a program writes it (the first is the shortest)
    triton: str                 # the triton.language type
    signature: str              # Triton's short name in a kernel signature (ahead-of-time compiles)
    tolerance: float            # relative error an emulated or GPU result may have against float64

    @property
    def torch(self) -> torch.dtype:
        return getattr(torch, self.name)


DTYPES = {d.name: d for d in (
    Dtype("bfloat16", ("bf16",), "tl.bfloat16", "bf16", 5e-2),
    Dtype("float16", ("f16", "fp16"), "tl.float16", "fp16", 2e-2),
    Dtype("float32", ("f32", "fp32"), "tl.float32", "fp32", 2e-4),
    Dtype("float64", ("f64",), "tl.float64", "fp64", 1e-9),
    Dtype("int32", ("i32",), "tl.int32", "i32", 0.0),
    Dtype("int64", ("i64",), "tl.int64", "i64", 0.0),
    Dtype("int8", ("i8",), "tl.int8", "i8", 0.0),
    Dtype("uint8", ("u8",), "tl.uint8", "u8", 0.0),
    # e4m3 (OCP's "fn": no infinities, 448 the largest), the wire format of DeepSeek-V3's dispatch; a
    # value rounded to it is within half of its 3-bit mantissa's step
    Dtype("float8_e4m3fn", ("fp8", "e4m3"), "tl.float8e4nv", "fp8e4nv", 7e-2),
)}
SPELLINGS = {s: d.name for d in DTYPES.values() for s in d.spellings}  # bf16 -> bfloat16
EIGHT_BIT = frozenset({"float8_e4m3fn", "int8", "uint8"})  # one-byte elements


def smallest_dot_k(dtypes) -> int:
    """The least K tl.dot takes on a GPU for operands of these element types: 16, 32 where one has 8-bit
    elements (the interpreter takes any; generated bodies, seeds 105 and 172, found it by sm_90 compiles)."""
    return 32 if any(d in EIGHT_BIT for d in dtypes) else 16


def _rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps=1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + float(eps)) * weight


@dataclass(frozen=True)
class Function:
    """An elementwise function of float32 blocks. `triton` formats its arguments `{0}`, `{1}`, ...;
    a row function also gets `{row}`, the length of the row it normalises over (the block's last axis)."""
    name: str
    arity: tuple[int, int]            # fewest and most arguments
    triton: str
    torch: Callable[..., torch.Tensor]
    rows: bool = False                # works on whole rows of a 2-D block
    operator: str | None = None       # written as this operator in a program, not by name
    defaults: tuple[str, ...] = ()    # Triton text of arguments a call may leave out, in order
    reduces: bool = False             # reduces each row of a 2-D block to one value: [m, n] -> [m, 1]
    identity: float = 0.0             # of a reduction: what a padding element must hold to change nothing


FUNCTIONS = {f.name: f for f in (
    Function("relu", (1, 1), "tl.maximum({0}, 0.0)", torch.relu),
    Function("sigmoid", (1, 1), "tl.sigmoid({0})", torch.sigmoid),
    Function("silu", (1, 1), "({0} * tl.sigmoid({0}))", torch.nn.functional.silu),
    # torch's default (erf) gelu, so that results match torch.nn.functional.gelu
    Function("gelu", (1, 1), "(0.5 * {0} * (1.0 + tl.math.erf({0} * 0.7071067811865476)))",
             torch.nn.functional.gelu),
    Function("tanh", (1, 1), "(2.0 * tl.sigmoid(2.0 * {0}) - 1.0)", torch.tanh),
    Function("exp", (1, 1), "tl.exp({0})", torch.exp),
    Function("abs", (1, 1), "tl.abs({0})", torch.abs),
    # sqrt and `/` round to nearest, as torch's do: tl.sqrt and Triton's fp32 `/` compile to approximate
    # instructions (div.full.f32: moe_dispatch_fp8's scales came out one e4m3 step off on an H200)
    Function("sqrt", (1, 1), "tl.math.sqrt_rn({0})", torch.sqrt),
    Function("rsqrt", (1, 1), "tl.rsqrt({0})", torch.rsqrt),
    Function("max", (2, 2), "tl.maximum({0}, {1})", torch.maximum),
    Function("min", (2, 2), "tl.minimum({0}, {1})", torch.minimum),
    Function("neg", (1, 1), "(-{0})", torch.neg, operator="-"),
    Function("add", (2, 2), "({0} + {1})", torch.add, operator="+"),
    Function("sub", (2, 2), "({0} - {1})", torch.sub, operator="-"),
    Function("mul", (2, 2), "({0} * {1})", torch.mul, operator="*"),
    Function("div", (2, 2), "tl.math.div_rn({0}, {1})", torch.div, operator="/"),
    Function("exp2", (1, 1), "tl.exp2({0})", torch.exp2),
    Function("log2", (1, 1), "tl.log2({0})", torch.log2),
    Function("log", (1, 1), "tl.log({0})", torch.log),
    # where(condition, a, b): a where the condition holds, else b (masks: causal, lengths)
    Function("where", (3, 3), "tl.where({0}, {1}, {2})", torch.where),
    # the row statistics of online softmax, each row kept as a column [m, 1] that broadcasts against [m, n]
    Function("rowmax", (1, 1), "tl.max({0}, axis=1, keep_dims=True)", lambda x: x.amax(-1, keepdim=True),
             reduces=True, identity=float("-inf")),
    Function("rowsum", (1, 1), "tl.sum({0}, axis=1, keep_dims=True)", lambda x: x.sum(-1, keepdim=True),
             reduces=True),
    Function("lt", (2, 2), "({0} < {1})", torch.lt, operator="<"),
    Function("le", (2, 2), "({0} <= {1})", torch.le, operator="<="),
    Function("gt", (2, 2), "({0} > {1})", torch.gt, operator=">"),
    Function("ge", (2, 2), "({0} >= {1})", torch.ge, operator=">="),
    Function("eq", (2, 2), "({0} == {1})", torch.eq, operator="=="),
    Function("ne", (2, 2), "({0} != {1})", torch.ne, operator="!="),
    # rmsnorm(x, weight[, eps]): each row of x over its last dimension, as torch's unfused ops do
    Function("rmsnorm", (2, 3), "({0} * tl.rsqrt(tl.sum({0} * {0}, axis=1) / {row} + {2})[:, None] * {1})",
             _rmsnorm, rows=True, defaults=("1e-6",)),
)}
NAMED = {f.name: f for f in FUNCTIONS.values() if f.operator is None}      # written `name(...)`
BINARY = {f.operator: f.name for f in FUNCTIONS.values() if f.operator and f.arity == (2, 2)}
COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")       # their values are booleans
INTEGER_CLOSED = ("add", "sub", "mul", "neg", "min", "max")  # of integers, an integer
# functions whose Triton form takes floating operands only (tl.math.div_rn, tl.exp, tl.sigmoid ...): an
# integer block (a load of an i8 tensor, kept native for integer arithmetic) enters them as float32
FLOAT_ONLY = ("div", "sqrt", "rsqrt", "exp", "exp2", "log", "log2", "sigmoid", "silu", "gelu", "tanh", "rmsnorm")
