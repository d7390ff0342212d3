"""A limit's window of measured steps and the small-sample (Student t) interval of its mean.

A window holds a handful of steps (``min_profile_steps`` 4 by default, 2 allowed), where the
normal quantile 1.96 is far too small: the two-sided 95 % quantile of Student's t with
n − 1 degrees of freedom is 12.71 at n = 2, 3.18 at n = 4 and 2.26 at n = 10 (scipy).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@functools.lru_cache(maxsize=512)
def _t_quantile(q: float, dof: int) -> float:
    if dof < 1:
        raise ValueError(f"Student's t needs at least 1 degree of freedom, got {dof}")
    # scipy.stats.t.ppf's own kernel: scipy.special imports in a fraction of scipy.stats's seconds
    from scipy.special import stdtrit

    return float(stdtrit(dof, q))


def t_quantile_975(dof: int) -> float:
    """The 97.5 % quantile of Student's t with ``dof`` ≥ 1 degrees of freedom (a two-sided 95 % interval).

    Raises:
        ValueError: ``dof`` < 1.
    """
    return _t_quantile(0.975, dof)


def t_quantile_95(dof: int) -> float:
    """The 95 % quantile of Student's t with ``dof`` ≥ 1 degrees of freedom (a one-sided 95 % bound).

    6.31 at 1 dof, 2.35 at 3, 1.83 at 9 (scipy); the normal's 1.645 in the limit.

    Raises:
        ValueError: ``dof`` < 1.
    """
    return _t_quantile(0.95, dof)


def t_interval(values: Sequence[float]) -> tuple[float, float]:
    """Two-sided 95 % interval (low, high) of the mean of ``values``: mean ± t(0.975, n−1)·s/√n.

    Args:
        values: Per-step measurements, shape (n,).

    Returns:
        (low, high); (-inf, inf) for fewer than two values.

    Example:
        >>> low, high = t_interval([1.0, 2.0, 3.0])
        >>> round(high - 2.0, 3)  # t(0.975, 2) = 4.303, s = 1, n = 3
        2.484
    """
    n = len(values)
    if n < 2:
        return -math.inf, math.inf
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile_975(n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


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
