"""The collectives: all_reduce, all_gather, reduce_scatter and all_reduce_rmsnorm. Rows are padded to a
size class only (their programs mask ragged tiles and use no TMA)."""
from __future__ import annotations

import math
import re

import torch

from tiledsl.collectives import ALGORITHM_OPTIONS, DEFAULT_THRESHOLD_BYTES
from tiledsl.library import program as library_program
from tiledsl.ops import torch_path
from tiledsl.ops.context import STATE, compiled, compute_dtype
from tiledsl.ops.paths import Op, call, empty, group, pow2
from tiledsl.ops.shapes import padded, restore, size_class, unpadded


class AllReduce(Op):
    """The sum over ranks of x, any shape."""
    name = "all_reduce"
    programs = ("allreduce", "allreduce_two_shot")

    def preferred(self, p):
        # AllReduce's rule (tiledsl/collectives.py): two-shot from 1 MiB, never at world 2
        large = p.world > 2 and p.x.numel() * p.x.element_size() >= DEFAULT_THRESHOLD_BYTES
        return tuple(reversed(self.programs)) if large else self.programs

    def exact(self, path, p, entry):
        return True  # the sum is computed in a new buffer either way; its tail past x is not read back

    def predicted_sizes(self, p):  # N: the buffer `fused` sums, x's elements rounded up to their size class
        return dict(N=size_class(p.x.numel()))

    def unfused(self, p):
        return torch_path.all_reduce(p.x, group(p)).view(p.moved)

    def program(self, path, p, entry):
        options = ALGORITHM_OPTIONS["one_shot" if path.program == "allreduce" else "two_shot"]
        return compiled(entry, path.program, compute_dtype(entry, p.dtype), path.tunables,
                        options=options if not entry.emulated else {})

    def fused(self, path, p, entry, check):
        program = self.program(path, p, entry)
        n = p.x.numel()
        out = empty((size_class(n),), compute_dtype(entry, p.dtype), p.device)
        out[:n].copy_(p.x)
        call(program, (out,), check)
        return out[:n].to(p.dtype).view(p.moved)


class AllGather(Op):
    """x from every rank, concatenated along `dim`."""
    name = "all_gather"
    programs = ("allgather",)

    def exact(self, path, p, entry):
        return size_class(p.rows) == p.rows

    def result(self, p, rows):
        return restore(rows, (p.world * p.moved[0],) + p.moved[1:], p.dim)

    def unfused(self, p):
        return self.result(p, torch_path.all_gather_rows(p.x, group(p), p.world))

    def fused(self, path, p, entry, check):
        program = self.program(path, p, entry)
        compute, rows, width = compute_dtype(entry, p.dtype), p.rows, p.x.shape[1]
        rows_pad = size_class(rows)
        X = padded(p.x.unsqueeze(0), (1, rows_pad, width), compute, STATE.buffers, self.name).view(rows_pad, width)
        Y = empty((p.world * rows_pad, width), compute, p.device)
        call(program, (X, Y), check)
        out = unpadded(Y.view(p.world, rows_pad, width), (p.world, rows, width))
        return self.result(p, out.reshape(p.world * rows, width).to(p.dtype))


class ReduceScatter(Op):
    """The sum over ranks of x, this rank's block of `dim`."""
    name = "reduce_scatter"
    programs = ("reduce_scatter",)

    def exact(self, path, p, entry):
        return size_class(p.rows // p.world) == p.rows // p.world

    def result(self, p, rows):
        return restore(rows, (p.moved[0] // p.world,) + p.moved[1:], p.dim)

    def unfused(self, p):
        return self.result(p, torch_path.reduce_scatter_rows(p.x, group(p), p.world))

    def fused(self, path, p, entry, check):
        program = self.program(path, p, entry)
        compute, rows, width = compute_dtype(entry, p.dtype), p.rows // p.world, p.x.shape[1]
        rows_pad = size_class(rows)
        X = padded(p.x.reshape(p.world, rows, width), (p.world, rows_pad, width), compute, STATE.buffers,
                   self.name).view(p.world * rows_pad, width)
        Y = empty((rows_pad, width), compute, p.device)
        call(program, (X, Y), check)
        return self.result(p, unpadded(Y, (rows, width)).to(p.dtype))


# The library's all-reduce + RMSNorm writes its epsilon as a literal; other epsilons compile a copy of
# the program's text with that literal replaced.
_RMSNORM_EPS = re.compile(r"(rmsnorm\([^\n]*?,\s*)([0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)(\s*\))")


class AllReduceRMSNorm(Op):
    """h = sum over ranks of x + residual; (rmsnorm(h) * weight, h), rows of the last dimension."""
    name = "all_reduce_rmsnorm"
    programs = ("allreduce_rmsnorm",)

    def bucket(self, p):  # the epsilon too: whether the program applies depends on it
        return f"{str(p.dtype).removeprefix('torch.')} T<={pow2(p.rows)} D={p.x.shape[1]} eps={p.eps:g}"

    def source(self, p) -> tuple[str | None, str | None]:
        """(program text for this epsilon, or None for the library file as it is; why not, or None)."""
        text = library_program(self.programs[0]).read_text()
        found = _RMSNORM_EPS.findall(text)
        if len(found) != 1:
            return None, f"the library program's epsilon is not one literal (found {len(found)})"
        if float(found[0][1]) == p.eps:
            return None, None
        if not (math.isfinite(p.eps) and p.eps > 0):
            return None, f"epsilon {p.eps} is not a positive number"
        return _RMSNORM_EPS.sub(lambda m: m.group(1) + repr(float(p.eps)) + m.group(3), text), None

    def refusal(self, path, p, entry):
        return super().refusal(path, p, entry) or self.source(p)[1]

    def exact(self, path, p, entry):
        return size_class(p.rows) == p.rows

    def unfused(self, p):
        y, h = torch_path.all_reduce_rmsnorm(p.x, p.residual, p.w, p.eps, group(p))
        return y.view(p.moved), h.view(p.moved)

    def program(self, path, p, entry):
        return compiled(entry, path.program, compute_dtype(entry, p.dtype), path.tunables, source=self.source(p)[0])

    def fused(self, path, p, entry, check):
        program = self.program(path, p, entry)
        compute, rows, width = compute_dtype(entry, p.dtype), p.rows, p.x.shape[1]
        rows_pad = size_class(rows)
        X = padded(p.x.unsqueeze(0), (1, rows_pad, width), compute, STATE.buffers, self.name).view(rows_pad, width)
        R = torch.zeros((rows_pad, width), dtype=compute, device=p.device)
        R[:rows].copy_(p.residual)
        W = STATE.weights.get(p.w, (width,), compute)
        Y = empty((rows_pad, width), compute, p.device)
        call(program, (X, R, W, Y), check)
        return (unpadded(Y, (rows, width)).to(p.dtype).view(p.moved),
                unpadded(R, (rows, width)).to(p.dtype).view(p.moved))
