"""How a device value that breaks its declaration is told, the same from the kernel's diagnostics
(launch.py reads them after a call) and from the reference (which raises at once): a count above its
`cap`, or a gathered index outside the dimension it indexes. Each message names the rank, the element
(`sent[5]`: the count of expert 5) and the declaration that gave the bound, comment included."""
from __future__ import annotations

from tiledsl.runtime.issue import CapacityExceeded, IndexOutOfRange

CAPACITY, INDEX = "capacity", "index"  # the kinds of guard a kernel may report


def element_text(tensor: str, index) -> str:
    return f"{tensor}[{', '.join(str(int(i)) for i in index)}]"


def capacity_error(rank: int, tensor: str, index, value: int, cap: int, declared: str) -> CapacityExceeded:
    return CapacityExceeded(f"rank {rank}: {element_text(tensor, index)} = {value} is above its cap {cap}: "
                            f"the call kept {cap} and dropped the rest ({declared})")


def index_error(rank: int, tensor: str, index, value: int, extent: int, target: str, declared: str) -> IndexOutOfRange:
    return IndexOutOfRange(f"rank {rank}: {element_text(tensor, index)} = {value} is outside 0..{extent - 1}, "
                           f"the rows of '{target}' it indexes: the call skipped that row ({declared})")


def unflatten(flat: int, shape) -> tuple[int, ...]:
    out = []
    for extent in reversed(tuple(shape)):
        out.append(flat % max(1, extent))
        flat //= max(1, extent)
    return tuple(reversed(out))
