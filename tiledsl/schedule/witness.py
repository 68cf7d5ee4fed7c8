"""What a refusal proves, as data: the instances behind a race, a deadlock or an access out of bounds,
at the world and sizes where the checker found it. A diagnostic carries its witness
(`Diagnostic.witness`), so that a second checker can confirm a refusal without trusting the first
(tests/schedule/bruteforce.py does, for generated schedules)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    """One instance of a family, run by one rank; for a tile with a loop, maybe one part of it: the
    step of its loop (-1: before the loop), None for the whole instance (or what follows its loop)."""
    family: str
    index: tuple[int, ...]
    rank: int
    step: int | None = None

    def __str__(self) -> str:
        text = f"{self.family}[{', '.join(map(str, self.index))}]@rank{self.rank}"
        return text if self.step is None else text + (" before its loop" if self.step < 0 else f" step {self.step}")


@dataclass(frozen=True)
class At:
    """Where a finding holds: the world (in `nodes` nodes) and every param and const value."""
    world: int
    sizes: tuple[tuple[str, int], ...]
    nodes: int = 1

    def values(self) -> dict[str, int]:
        return dict(self.sizes)


@dataclass(frozen=True)
class Race:
    """`first` writes elements [lo, hi) of rank `copy`'s copy of `tensor` that `second` reads or writes
    (`second_writes`), and no path of edges orders the two."""
    at: At
    tensor: str
    copy: int
    first: Point
    second: Point
    second_writes: bool
    lo: tuple[int, ...]
    hi: tuple[int, ...]


@dataclass(frozen=True)
class Step:
    """`waiter` cannot start before `waited` is complete: through `edge` (its number in the schedule),
    or, with edge None, because `waited` runs before `waiter` on the same rank in the serial order."""
    waiter: Point
    waited: Point
    edge: int | None


@dataclass(frozen=True)
class Deadlock:
    """A cycle: each step's `waited` is the next step's `waiter`, and the last step's `waited` is the
    first step's `waiter`."""
    at: At
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Unsignalled:
    """`waiter` waits through `edge` on `producer`, an NVSHMEM put whose signal reaches only the ranks
    it writes to, `waiter`'s rank not among them."""
    at: At
    waiter: Point
    producer: Point
    edge: int


@dataclass(frozen=True)
class FamilyCycle:
    """Families that wait on each other: there is no order in which to run them one after another."""
    families: tuple[str, ...]
    edges: tuple[int, ...]


@dataclass(frozen=True)
class OutOfBounds:
    """`instance` reaches coordinate `value` of dimension `dim` of `tensor`, whose size there is
    `extent`; `stop` tells whether `value` is a slice's end (`a : b` past the end) or an index."""
    at: At
    instance: Point
    tensor: str
    dim: int
    value: int
    extent: int
    stop: bool


@dataclass(frozen=True)
class NoSuchRank:
    """`instance` reads (or writes, with `write`) `tensor`@`copy`, but ranks are 0..world - 1: there is no
    such copy (rank 0 reading `B@(rank - 1)`)."""
    at: At
    instance: Point
    tensor: str
    copy: int
    write: bool


@dataclass(frozen=True)
class AcrossNodes:
    """`instance` reaches rank `copy`'s copy of `tensor` (writes it, with `write`) through a peer pointer,
    and `copy` is on another node, where pointers do not reach."""
    at: At
    instance: Point
    tensor: str
    copy: int
    write: bool


@dataclass(frozen=True)
class SignalAcross:
    """`waiter` waits through `edge` on `producer`, on another node, whose signal goes only through peer
    pointers (a copy-engine chunk), which do not reach there."""
    at: At
    waiter: Point
    producer: Point
    edge: int


Witness = Race | Deadlock | Unsignalled | FamilyCycle | OutOfBounds | NoSuchRank | AcrossNodes | SignalAcross
