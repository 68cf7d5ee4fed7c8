"""Ranking a bucket's program paths by `tiledsl.predict` where nothing was measured at this world:
each program's schedule simulated on the CPU at the call's world and sizes with the GPU's rates
(H200's, the one set shipped), cached per (program, consts, world, sizes). Deterministic, no GPU.
A prediction is not a measurement: a decision made from one says so and is not written to the
tuning cache, which holds only what was timed."""
from __future__ import annotations

import functools
import math

from tiledsl.ops.context import library_program

MAX_INSTANCES = 20_000  # all ranks together: a larger simulation takes seconds, too long at a call's first use


@functools.lru_cache(maxsize=512)
def predicted_us(program: str, consts: tuple, world: int, sizes: tuple) -> float | None:
    """One call of the library program `program` predicted at `world` ranks (one node) and these
    params and consts; None where the schedule cannot be simulated there or would take too long."""
    from tiledsl import pipeline
    from tiledsl.predict import load, predict
    from tiledsl.schedule import meaning
    schedule = pipeline.run(library_program(program), until="schedule").schedule
    given = {**dict(consts), **dict(sizes)}
    try:
        count = sum(math.prod(meaning._extents(schedule, f, world, given, rank))
                    for f in schedule.families.values() for rank in range(world))
        if count > MAX_INSTANCES:
            return None
        return predict(schedule, world, given, load()).total_us
    except Exception:  # noqa: BLE001 - a program the simulator cannot take here is simply not ranked
        return None
