"""Wall-clock seconds of a job's consecutive stages (a setup's, a benchmark row's)."""
from __future__ import annotations

import time


class Stages:
    """Wall seconds of consecutive stages, each measured from the end of the previous one (or from the
    clock's start); a stage named twice adds up.

    Example:
        >>> clock = Stages()
        >>> clock.stage("load"); clock.stage("check"); clock.stage("load")
        >>> sorted(clock.seconds), all(v >= 0 for v in clock.seconds.values())
        (['check', 'load'], True)
    """

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def stage(self, name: str) -> None:
        """Close the stage ``name``: the time since the last call (or the start) is added to it."""
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now

    def rounded(self, digits: int = 3) -> dict[str, float]:
        """The seconds rounded for a report."""
        return {k: round(v, digits) for k, v in self.seconds.items()}
