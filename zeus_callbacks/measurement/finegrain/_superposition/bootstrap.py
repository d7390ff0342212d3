"""Bootstrap over executions for the superposition's confidence intervals.

Each sample interval belongs to the execution whose extended window holds its midpoint; a
replicate resamples executions with replacement within each class (class sizes stay fixed)
and weights every sample by its execution's count. Samples of steady mode's pauses and run
tails, and idle samples, are resampled as two strata of their own. Percentile intervals are
taken in :mod:`.summary`. (FinGraV, arXiv 2412.12426, reports energy per execution with its
spread; the stratified bootstrap is this package's choice.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zeus_callbacks.measurement.finegrain._superposition.design import Columns
from zeus_callbacks.measurement.finegrain._superposition.intervals import inside
from zeus_callbacks.measurement.finegrain._superposition.solve import Problem, solve
from zeus_callbacks.measurement.finegrain._superposition.timeline import (
    Executions,
    Pauses,
    SampleIntervals,
    sample_ranges,
)


def min_executions_for_interval(confidence: float) -> int:
    """Fewest executions for which a percentile-bootstrap interval over executions is an interval.

    A replicate resamples ``n`` executions with replacement; the one that draws a single execution
    ``n`` times (the most extreme replicate) has probability ``n**-n`` for each execution. While
    ``n**-n >= (1 - confidence) / 2``, a tail quantile of the replicates is such a replicate: the
    interval's end is one execution's own value, the data's range rather than an interval for the
    mean, and with ``n = 1`` every replicate is the same execution (width 0). A t-interval would
    need ``n >= 2`` too (``n - 1`` degrees of freedom). The answer is the least ``n >= 2`` with
    ``n**-n < (1 - confidence) / 2``: 4 at 95 % (``3**-3`` = 3.7 % ≥ 2.5 %, ``4**-4`` = 0.39 %
    < 2.5 %), 3 at 90 % (3.7 % < 5 %), 4 at 99 % (0.39 % < 0.5 %).

    Args:
        confidence: The interval's level, in (0, 1).

    Returns:
        The minimum number of executions (≥ 2).

    Raises:
        ValueError: ``confidence`` is not in (0, 1).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    alpha = (1 - confidence) / 2
    n = 2
    while float(n) ** -n >= alpha:
        n += 1
    return n


def interval_reason(executions: int, confidence: float) -> str | None:
    """Why there is no interval from ``executions`` executions at ``confidence``, in words; None when there is one.

    The reason names the minimum of :func:`min_executions_for_interval`.
    """
    need = min_executions_for_interval(confidence)
    if executions >= need:
        return None
    return (
        f"{executions} execution{'s' if executions != 1 else ''} measured; a {confidence:.0%} interval needs at "
        f"least {need} (a bootstrap over fewer executions gives the data's range, with 1 a width of 0)"
    )


IDLE = -1
"""Owner of a sample outside every execution's window, pause and tail."""
PAUSE = -2
"""Owner of a sample in a pause or a run tail (steady mode)."""


@dataclass(frozen=True)
class Strata:
    """Who owns each sample, for resampling.

    Attributes:
        owner: Execution owning each sample interval, shape (m,) int; :data:`IDLE` or :data:`PAUSE` otherwise.
        members: Executions of each class, in :attr:`Columns.classes` order, each shape (n_c,).
        idle_rows: Samples owned by no execution, pause or tail, shape (i,).
        pause_rows: Samples in a pause or a run tail, shape (q,).
        n: Number of executions.
    """

    owner: np.ndarray
    members: tuple[np.ndarray, ...]
    idle_rows: np.ndarray
    pause_rows: np.ndarray
    n: int


def strata(execs: Executions, samples: SampleIntervals, gaps: Pauses, cols: Columns) -> Strata:
    """Assign every sample interval to its execution (by midpoint), a pause, or idle time."""
    mids = samples.mid_s
    owner = np.full(samples.m, IDLE, dtype=np.int64)
    k_lo, k_hi = sample_ranges(execs, samples)
    for i in range(execs.n):
        if k_hi[i] <= k_lo[i]:
            continue
        ks = slice(k_lo[i], k_hi[i])
        mine = (mids[ks] > execs.lo_s[i]) & (mids[ks] <= execs.hi_s[i])
        owner[ks][mine] = i
    in_pause = inside(mids, gaps.gap_lo_s, gaps.gap_hi_s) | inside(mids, gaps.tail_lo_s, gaps.tail_hi_s)
    owner[(owner < 0) & in_pause] = PAUSE
    return Strata(
        owner=owner,
        members=tuple(np.flatnonzero(execs.labels == c) for c in cols.classes),
        idle_rows=np.flatnonzero(owner == IDLE),
        pause_rows=np.flatnonzero(owner == PAUSE),
        n=execs.n,
    )


def replicate_weights(st: Strata, rng: np.random.Generator) -> np.ndarray:
    """Sample weights of one bootstrap replicate, shape (m,).

    Draws from ``rng``, in this order, one resample of each class's executions, then of the idle
    samples, then of the pause samples (an empty stratum draws nothing).
    """
    counts = np.zeros(st.n)
    for members in st.members:
        counts[members] += np.bincount(rng.integers(0, members.size, members.size), minlength=members.size)
    weights = np.where(st.owner >= 0, counts[np.maximum(st.owner, 0)], 0.0)
    for rows in (st.idle_rows, st.pause_rows):
        if rows.size:
            weights[rows] = np.bincount(rng.integers(0, rows.size, rows.size), minlength=rows.size)
    return weights


def bootstrap(prob: Problem, st: Strata, n_boot: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Refit ``n_boot`` replicates; return θ of each, shape (p,) each.

    A replicate whose weights are all zero is skipped, so there may be fewer than ``n_boot``.

    Raises:
        numpy.linalg.LinAlgError: A replicate's normal equations are singular.
    """
    thetas = []
    for _ in range(n_boot):
        weights = replicate_weights(st, rng)
        if weights.any():
            thetas.append(solve(prob, weights))
    return thetas
