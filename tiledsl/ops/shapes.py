"""From the tensors a model hands an op to the 2-D problem a program takes, and back: rows along the
gathered or scattered dimension, rows rounded up to few size classes (each distinct size a program
sees keeps its own symmetric buffers for good, and is a tuning bucket), rows of 16-byte multiples
(TMA descriptors refuse anything else: "strides must be 16-byte aligned"), zero padding where a tile
needs it, and padded copies of weights kept for as long as the weight is unchanged."""
from __future__ import annotations

import math
import weakref
from collections import OrderedDict

import torch

TMA_ALIGN_BYTES = 16  # row strides and start addresses of a TMA descriptor's tensor
# Eight size classes per power of two: at most 1/8 of a padded problem's rows are padding, and a
# serving loop whose batch varies reaches a program with a few dozen sizes, not thousands.
CLASS_BITS = 3
KEPT_BUFFERS = 32  # workspaces and padded weights kept, least recently used dropped first
MULTIPLIED = "the last dimension is the one multiplied"


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def size_class(n: int, multiple: int = 1) -> int:
    """n rounded up to a multiple of `multiple`, then to one of 8 sizes per power of two."""
    n = round_up(max(1, n), multiple)
    granule = math.lcm(multiple, 1 << max(0, n.bit_length() - 1 - CLASS_BITS))
    return round_up(n, granule)


def aligned(n: int, dtype: torch.dtype) -> int:
    """n rounded up so that a row of n elements of `dtype` is a multiple of 16 bytes."""
    return round_up(n, max(1, TMA_ALIGN_BYTES // torch.empty((), dtype=dtype).element_size()))


def fits(x: torch.Tensor, shape: tuple, dtype: torch.dtype) -> bool:
    """Whether a program can take x as it is: this shape and dtype, contiguous, 16-byte aligned start."""
    return (tuple(x.shape) == tuple(shape) and x.dtype == dtype and x.is_contiguous()
            and x.data_ptr() % TMA_ALIGN_BYTES == 0)


# ---- any layout to rows, and back ------------------------------------------------------------------

def matrix_rows(a: torch.Tensor, dim: int) -> tuple[torch.Tensor, tuple]:
    """a [..., K] as rows [R, K] ordered by `dim` first (a view where the layout allows), and the
    shape of a with `dim` moved to the front, to restore the result's layout."""
    if a.dim() < 2:
        raise ValueError(f"expected a matrix or a batch of them, got shape {list(a.shape)}")
    dim = normalise_dim(dim, a.dim(), MULTIPLIED)
    moved = a.movedim(dim, 0)
    return moved.reshape(-1, a.shape[-1]), tuple(moved.shape)


def flat_rows(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, tuple]:
    """x as rows [S, rest] with S the size of `dim`, and the shape of x with `dim` moved to the front."""
    if x.dim() == 0:
        raise ValueError("a collective over rows needs at least one dimension")
    dim = normalise_dim(dim, x.dim())
    moved = x.movedim(dim, 0)
    return moved.reshape(moved.shape[0], -1), tuple(moved.shape)


def restore(rows: torch.Tensor, moved_shape: tuple, dim: int) -> torch.Tensor:
    """Rows back to the caller's layout: `moved_shape` (whose first size may have changed, and whose
    last may be that of the rows) with its first dimension moved back to `dim`; always contiguous, so
    the result has the strides the fake implementation promises."""
    return rows.reshape(moved_shape).movedim(0, dim).contiguous()


def normalise_dim(dim: int, ndim: int, why_not_last: str | None = None) -> int:
    """dim in [0, ndim), from a negative index too; the last dimension refused with `why_not_last`."""
    if not -ndim <= dim < ndim:
        raise ValueError(f"dimension {dim} is out of range for a tensor of {ndim} dimensions")
    dim %= ndim
    if why_not_last and dim == ndim - 1:
        raise ValueError(f"dimension {dim} cannot be gathered or scattered: {why_not_last}")
    return dim


# ---- padded copies -------------------------------------------------------------------------------

class Buffers:
    """Zero-filled workspaces kept by (purpose, logical and padded shape, dtype, device). A workspace is
    only ever written in its logical part, so its padding stays zero from allocation on."""

    def __init__(self, kept: int = KEPT_BUFFERS):
        self._kept = kept
        self._buffers: OrderedDict[tuple, torch.Tensor] = OrderedDict()

    def get(self, key: tuple, shape: tuple, dtype: torch.dtype, device) -> torch.Tensor:
        key = (key, tuple(shape), dtype, str(device))
        buffer = self._buffers.pop(key, None)
        if buffer is None:
            buffer = torch.zeros(shape, dtype=dtype, device=device)
            if len(self._buffers) >= self._kept:
                self._buffers.popitem(last=False)
        self._buffers[key] = buffer
        return buffer

    def clear(self) -> None:
        self._buffers.clear()


def padded(x: torch.Tensor, shape: tuple, dtype: torch.dtype, buffers: Buffers, purpose: str) -> torch.Tensor:
    """x (blocks of rows [B, R, C], or [R, C]) in a tensor of `shape` (each dimension at least x's) and
    `dtype`: x itself when it fits, else a copy into a workspace whose padding is zero."""
    if fits(x, shape, dtype):
        return x
    out = buffers.get((purpose, tuple(x.shape)), shape, dtype, x.device)
    out[tuple(slice(0, n) for n in x.shape)].copy_(x)
    return out


def unpadded(y: torch.Tensor, shape: tuple) -> torch.Tensor:
    """The leading `shape` part of y: a view when nothing is cut, else a contiguous copy."""
    if tuple(y.shape) == tuple(shape):
        return y
    return y[tuple(slice(0, n) for n in shape)].contiguous()


class Weights:
    """Padded (and, emulated, converted) contiguous copies of weights, so that a weight that is not laid
    out as a program needs is copied once and not at every call. A copy is found again only while the
    tensor that owns the weight's storage is alive and the weight keeps its address, layout and version
    (`Tensor._version`, shared by views, counts in-place writes such as an optimizer step); a tensor
    without a version (made in inference mode) is copied at every call."""

    def __init__(self, kept: int = KEPT_BUFFERS):
        self._kept = kept
        self._copies: OrderedDict[tuple, tuple[weakref.ref, torch.Tensor]] = OrderedDict()

    def get(self, w: torch.Tensor, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        if fits(w, shape, dtype):
            return w
        try:
            version = w._version
        except RuntimeError:  # inference tensors keep no version counter
            version = None
        # `W.t()` is a new view at every call; the tensor it views (a Parameter) is the one that lasts
        owner = w if w._base is None else w._base
        key = (w.data_ptr(), tuple(w.shape), w.stride(), w.dtype, str(w.device), version, tuple(shape), dtype)
        entry = self._copies.pop(key, None) if version is not None else None
        if entry is not None and entry[0]() is owner:  # the same address reused by another tensor misses
            self._copies[key] = entry
            return entry[1]
        copy = torch.zeros(shape, dtype=dtype, device=w.device)
        copy[tuple(slice(0, n) for n in w.shape)].copy_(w)
        if version is not None:
            if len(self._copies) >= self._kept:
                self._copies.popitem(last=False)
            self._copies[key] = (weakref.ref(owner), copy)
        return copy

    def clear(self) -> None:
        self._copies.clear()
