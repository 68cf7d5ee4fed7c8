"""The schedule graph and its checks: `build_schedule(program) -> Schedule`, `check(schedule)`."""
from tiledsl.schedule.build import build_schedule
from tiledsl.schedule.ir import Schedule

__all__ = ["build_schedule", "Schedule"]
