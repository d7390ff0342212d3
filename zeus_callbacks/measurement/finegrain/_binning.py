"""Execution-time binning: keep the executions of the dominant duration, drop the rest.

FinGraV (Singhania, Aga, Ibrahim, arXiv 2412.12426, 2024), challenge C3 (execution-time
variation): an execution that took longer (throttled, contended, preempted) has a different
power profile and would blur the superposition, so executions are binned by duration and only
the dominant bin is analysed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Binning:
    """Executions grouped by duration (FinGraV execution-time binning, challenge C3).

    Attributes:
        keep: Which executions are kept, shape (n,) bool.
        reference_s: The duration executions are compared with (median of all) (s).
        groups: ``(low_s, high_s, count)`` of each duration group, log-spaced by
            ``rel_tol``, most populated first.
        dropped: How many executions were dropped.
        dropped_fraction: ``dropped / n`` (0 when n = 0).
        too_many_dropped: True when ``dropped_fraction`` exceeded the allowed fraction
            (a warning was logged).
    """

    keep: np.ndarray
    reference_s: float
    groups: tuple[tuple[float, float, int], ...]
    dropped: int
    dropped_fraction: float
    too_many_dropped: bool


def bin_executions(
    durations_s: Sequence[float] | np.ndarray,
    *,
    rel_tol: float = 0.1,
    max_drop_fraction: float = 0.2,
    warn: bool = True,
) -> Binning:
    """Keep executions whose duration is within ``rel_tol`` of the median; drop the rest (FinGraV, challenge C3).

    Args:
        durations_s: Duration of each execution, shape (n,) (s); must be > 0.
        rel_tol: Half-width of the kept bin relative to the median duration.
        max_drop_fraction: Warn (once per call) when more than this fraction is dropped.
        warn: Log that warning here; False for a caller that bins again and again and warns
            once itself (:func:`binning_warning`).

    Returns:
        The :class:`Binning`.

    Raises:
        ValueError: A duration is not positive, or ``rel_tol`` is not positive.

    Example:
        >>> b = bin_executions([1.0, 1.01, 0.99, 1.0, 3.0])
        >>> b.keep.tolist(), b.dropped
        ([True, True, True, True, False], 1)
    """
    d = np.asarray(durations_s, dtype=np.float64)
    if rel_tol <= 0:
        raise ValueError(f"rel_tol must be > 0, got {rel_tol}")
    if d.size and not np.all(d > 0):
        raise ValueError("execution durations must be positive")
    if d.size == 0:
        return Binning(np.zeros(0, bool), math.nan, (), 0, 0.0, False)
    ref = float(np.median(d))
    keep = np.abs(d / ref - 1.0) <= rel_tol
    dropped = int(d.size - keep.sum())
    fraction = dropped / d.size
    too_many = fraction > max_drop_fraction
    binning = Binning(keep, ref, duration_groups(d, ref, rel_tol), dropped, fraction, too_many)
    if too_many and warn:
        binning_warning(binning, max_drop_fraction)
    return binning


def duration_groups(
    durations_s: np.ndarray, reference_s: float, rel_tol: float
) -> tuple[tuple[float, float, int], ...]:
    """Histogram of durations in log-spaced bins of relative width ``rel_tol`` around ``reference_s``.

    Args:
        durations_s: Durations, shape (n,) (s), > 0.
        reference_s: The duration at the centre of bin 0 (s), > 0.
        rel_tol: Half-width of a bin relative to its centre.

    Returns:
        ``(low_s, high_s, count)`` of every non-empty bin (the shortest and longest duration
        in it), most populated first (ties: shorter bin first).
    """
    width = math.log1p(rel_tol) * 2
    idx = np.floor((np.log(durations_s / reference_s) + width / 2) / width).astype(int)
    groups = []
    for b in np.unique(idx):
        sel = durations_s[idx == b]
        groups.append((float(sel.min()), float(sel.max()), int(sel.size)))
    groups.sort(key=lambda g: -g[2])
    return tuple(groups)


def binning_warning(binning: Binning, max_drop_fraction: float = 0.2) -> None:
    """Log the one warning for a binning that dropped more than ``max_drop_fraction`` of the executions.

    Args:
        binning: The result of :func:`bin_executions`.
        max_drop_fraction: The fraction that was exceeded (quoted in the message).
    """
    logger.warning(
        "zeus-callbacks: execution-time binning dropped %d of %d executions (%.0f%% > %.0f%%): durations "
        "vary a lot (throttling, contention?); the profile describes the %.3g ms bin only",
        binning.dropped, binning.keep.size, 100 * binning.dropped_fraction, 100 * max_drop_fraction,
        binning.reference_s * 1e3,
    )  # fmt: skip
