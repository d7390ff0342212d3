"""The candidate limits and what each measured limit holds: the grid, a limit's window of steps, unimodality.

The golden-section search over the grid (Zeus, NSDI '23, §4.3, made cheaper) is driven by
:class:`~zeus_callbacks.optimizers.power_limit.profiler.PowerLimitProfiler`; this module holds its pieces.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from zeus_callbacks.optimizers.power_limit.objective import Objective

logger = logging.getLogger(__name__)


_Z95 = 1.96


def power_limit_grid_W(min_W: float, max_W: float, step_W: float = 25.0) -> list[float]:
    """Limits to profile, from ``max_W`` down in ``step_W`` steps, ``min_W`` included; shape (n,), W."""
    if step_W <= 0 or min_W > max_W:
        raise ValueError(f"bad grid: [{min_W}, {max_W}] W by {step_W} W")
    grid = []
    limit = max_W
    while limit > min_W + 1e-6:
        grid.append(round(limit, 3))
        limit -= step_W
    grid.append(round(min_W, 3))
    return grid



@dataclass
class LimitProfile:
    """Measurements of one power limit: per-step energy (J) and time (s) of its window."""

    limit_W: float
    energy_J: list[float] = field(default_factory=list)
    time_s: list[float] = field(default_factory=list)
    steps: int = 0  # steps spent at this limit (warm-up and profile)

    @property
    def n(self) -> int:
        """Resolved profiled steps."""
        return len(self.energy_J)

    @property
    def energy_per_step_J(self) -> float:
        """Mean energy per step (J)."""
        return sum(self.energy_J) / self.n if self.n else math.nan

    @property
    def time_per_step_s(self) -> float:
        """Mean time per step (s)."""
        return sum(self.time_s) / self.n if self.n else math.nan

    def interval(self, objective: Objective) -> tuple[float, float]:
        """95 % confidence interval (low, high) of the mean per-step value of ``objective``."""
        values = [objective.step_value(e, t) for e, t in zip(self.energy_J, self.time_s, strict=True)]
        n = len(values)
        mean = sum(values) / n
        if n < 2:
            return -math.inf, math.inf
        var = sum((v - mean) ** 2 for v in values) / (n - 1)
        half = _Z95 * math.sqrt(var / n)
        return mean - half, mean + half



def is_unimodal(costs: Sequence[float], tolerance: float = 0.01) -> bool:
    """Whether ``costs`` (ordered by limit) falls to one minimum and rises after it.

    A dip smaller than ``tolerance`` × the minimum cost is noise, not a second valley.
    """
    if len(costs) < 3:
        return True
    k = min(range(len(costs)), key=costs.__getitem__)
    tol = tolerance * abs(costs[k])
    for side in (costs[k::-1], costs[k:]):
        running = side[0]
        for value in side[1:]:
            if value < running - tol:
                return False
            running = max(running, value)
    return True
