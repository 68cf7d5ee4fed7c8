"""The device half of every rank's timeline: when each tile and chunk instance started, finished
waiting and ended, on which SM and program. A program compiled with `trace=True` stamps the GPU's
global timer into a buffer of four int64 per instance (start, waited, end, SM << 16 | program); without
it the stamps are compiled out (`tds_TRACE` is a constexpr). Copy-engine chunks are stamped by a
one-thread kernel on the communication stream before and after each copy. Emulated, the stamps read
the host's clock.

Generated modules import this module (`tds_timeline`); turning a call's buffers into events, traces
and pictures, and `tiledsl trace`, are tiledsl/tools/trace.py, above the compiler."""
from __future__ import annotations

import time

import triton
import triton.language as tl

from tiledsl.runtime import sync

START, WAITED, END, PLACE = range(4)  # the four int64 of an instance's row
FIELDS = 4


def _host_now() -> int:
    return time.perf_counter_ns()


if sync.EMULATED:
    @triton.jit
    def now():
        return tl.full([], _host_now(), tl.int64)

    @triton.jit
    def smid():
        return tl.full([], 0, tl.int32)
else:
    @triton.jit
    def now():
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                         pack=1)

    @triton.jit
    def smid():
        return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def record(row, point: tl.constexpr):
    """One stamp of an instance: `point` is START, WAITED or END; START also records where it runs."""
    tl.store(row + point, now())
    if point == 0:
        tl.store(row + 3, smid().to(tl.int64) * 65536 + tl.program_id(0))


@triton.jit
def wait_began(trace: tl.constexpr):
    """The clock before a loop step's waits, traced; 0, compiled out, otherwise."""
    if trace:
        return now()
    else:
        return tl.full([], 0, tl.int64)


@triton.jit
def wait_ended(row, began):
    """A loop step's waits are over: the time spent in them is added to the instance's WAITED stamp, so
    that WAITED - START is all the time the instance waited, before its body and in its steps."""
    tl.store(row + 1, tl.load(row + 1) + (now() - began))


@triton.jit
def stamp(row, point: tl.constexpr):
    """A kernel of one program: the stamp before or after a copy on the communication stream."""
    tl.store(row + point, now())
    if point == 0:
        tl.store(row + 3, -1)
