"""Where the time goes on the sample clock: executions, sample intervals, steady mode's pauses.

The executions in order with the window attributed to each, the samples as intervals shifted by
the sensor delay onto the executions' clock, and steady mode's non-idle time outside the executions
(short pauses, run tails); :mod:`.design` turns these into the design matrix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from zeus_callbacks.measurement.finegrain._superposition.settings import SuperposeSettings

MAX_INTERVAL_OF_MEDIAN = 2.5
"""A sample interval longer than this many median intervals spans a lost sample and is dropped."""
SHORT_GAP_INTERVALS = 3
"""Default longest pause with a level of its own (steady mode), in median sample intervals."""


def check_inputs(
    starts_s: Sequence[float] | np.ndarray,
    ends_s: Sequence[float] | np.ndarray,
    sample_times_s: Sequence[float] | np.ndarray,
    sample_power_W: Sequence[float] | np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The four inputs of :func:`superpose` as float64 arrays, checked.

    Raises:
        ValueError: Mismatched shapes, no execution, fewer than 3 samples, or an execution
            that does not end after it starts.
    """
    starts = np.asarray(starts_s, dtype=np.float64)
    ends = np.asarray(ends_s, dtype=np.float64)
    times = np.asarray(sample_times_s, dtype=np.float64)
    power = np.asarray(sample_power_W, dtype=np.float64)
    if starts.shape != ends.shape or starts.ndim != 1 or starts.size == 0:
        raise ValueError("starts_s and ends_s must be 1-D arrays of the same, non-zero length")
    if times.shape != power.shape or times.size < 3:
        raise ValueError("need at least 3 power samples, with times and powers of the same shape")
    if not np.all(ends > starts):
        raise ValueError("every execution must end after it starts")
    return starts, ends, times, power


@dataclass(frozen=True)
class Executions:
    """Executions in start order, each with the window of time attributed to it.

    Attributes:
        starts_s: Starts, shape (n,) (s), non-decreasing.
        ends_s: Ends, shape (n,) (s); in steady mode a short launch gap after an
            execution is folded into it (its end moves to the next start).
        labels: Class of each execution, shape (n,), dtype object.
        lo_s: Start of each extended window (``start − pre``), shape (n,) (s).
        hi_s: End of each extended window (``end + post``), shape (n,) (s); consecutive
            windows are clipped so that they never overlap.
    """

    starts_s: np.ndarray
    ends_s: np.ndarray
    labels: np.ndarray
    lo_s: np.ndarray
    hi_s: np.ndarray

    @property
    def n(self) -> int:
        """Number of executions."""
        return int(self.starts_s.size)


def executions(
    starts: np.ndarray, ends: np.ndarray, labels: Sequence[str] | np.ndarray | None, settings: SuperposeSettings
) -> Executions:
    """Sort the executions, fold steady mode's launch gaps into them and extend their windows.

    ``labels`` None: every execution is ``"all"``.

    Raises:
        ValueError: ``labels`` does not have one entry per execution.
    """
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    label_arr = np.array(["all"] * starts.size if labels is None else list(labels), dtype=object)
    if label_arr.shape != (starts.size,):
        raise ValueError("labels must have one entry per execution")
    label_arr = label_arr[order]
    if settings.steady:
        ends = fold_launch_gaps(starts, ends, settings.launch_gap_s)
    pre, post = settings.window_pre_s, settings.window_post_s
    lo = starts - pre
    hi = ends + post
    hi[:-1] = np.minimum(hi[:-1], np.maximum(starts[1:] - pre, ends[:-1]))
    lo[1:] = np.maximum(lo[1:], hi[:-1])
    return Executions(starts, ends, label_arr, lo, hi)


def fold_launch_gaps(starts: np.ndarray, ends: np.ndarray, launch_gap_s: float | None) -> np.ndarray:
    """Ends with each short launch gap belonging to the execution before it (steady mode).

    A gap after an execution shorter than ``launch_gap_s`` (None: half the execution's duration)
    is the launch overhead of back-to-back work, so the execution ends at the next start.
    """
    nxt = np.append(starts[1:], np.inf)
    gap = nxt - ends
    launch = 0.5 * (ends - starts) if launch_gap_s is None else launch_gap_s
    return np.where((gap >= 0) & (gap < launch), nxt, ends)


@dataclass(frozen=True)
class SampleIntervals:
    """The usable sample intervals, shifted by the sensor delay onto the executions' clock.

    Attributes:
        begin_s: Start of each interval (the previous sample's shifted time), shape (m,) (s).
        end_s: End of each interval (the sample's shifted time), shape (m,) (s).
        mid_s: Midpoints, shape (m,) (s).
        power_W: The sample values, shape (m,) (W).
        duration_s: ``end_s − begin_s``, shape (m,) (s).
        energy_J: ``power_W × duration_s``, shape (m,) (J): the left-hand side of the model.
        median_interval_s: Median interval of all samples (s).
    """

    begin_s: np.ndarray
    end_s: np.ndarray
    mid_s: np.ndarray
    power_W: np.ndarray
    duration_s: np.ndarray
    energy_J: np.ndarray
    median_interval_s: float

    @property
    def m(self) -> int:
        """Number of intervals."""
        return int(self.begin_s.size)


def sample_intervals(times: np.ndarray, power: np.ndarray, sensor_delay_s: float) -> SampleIntervals:
    """Turn samples into intervals; drop the first and any that spans a lost sample."""
    b = times - sensor_delay_s
    a = np.empty_like(b)
    a[1:] = b[:-1]
    a[0] = np.nan
    delta = b - a
    med = np.nanmedian(delta[1:])
    valid = np.isfinite(delta) & (delta > 0) & (delta <= MAX_INTERVAL_OF_MEDIAN * med)
    a, b, y_power = a[valid], b[valid], power[valid]
    delta = b - a
    return SampleIntervals(a, b, (a + b) / 2, y_power, delta, y_power * delta, med)


@dataclass(frozen=True)
class Pauses:
    """Steady mode's time outside every execution that is not idle (both empty in isolated mode).

    Attributes:
        gap_lo_s: Starts of the short pauses between executions, shape (g,) (s).
        gap_hi_s: Their ends, shape (g,) (s).
        tail_lo_s: Starts of the tails after the last execution of each run, shape (r,) (s).
        tail_hi_s: Their ends (``post_s`` later, or the next start), shape (r,) (s).
    """

    gap_lo_s: np.ndarray
    gap_hi_s: np.ndarray
    tail_lo_s: np.ndarray
    tail_hi_s: np.ndarray


def pauses(execs: Executions, median_interval_s: float, settings: SuperposeSettings) -> Pauses:
    """Find steady mode's short pauses and run tails (none in isolated mode).

    A pause up to ``short_gap_s`` (default: 3 median sample intervals) gets a power level of
    its own; a longer one ends a run, and its first ``post_s`` is that run's tail.
    """
    if not settings.steady:
        none = np.zeros(0)
        return Pauses(none, none, none, none)
    starts, ends = execs.starts_s, execs.ends_s
    short = SHORT_GAP_INTERVALS * median_interval_s if settings.short_gap_s is None else settings.short_gap_s
    pause = np.append(starts[1:], np.inf) - ends
    is_gap = (pause > 0) & (pause <= short)
    is_end = pause > short
    return Pauses(
        ends[is_gap], (ends + pause)[is_gap], ends[is_end], np.minimum(ends + settings.post_s, ends + pause)[is_end]
    )


def sample_ranges(execs: Executions, samples: SampleIntervals) -> tuple[np.ndarray, np.ndarray]:
    """For each execution, the range ``k_lo[i] <= k < k_hi[i]`` of sample intervals that can meet its window."""
    k_lo = np.searchsorted(samples.end_s, execs.lo_s, side="right")
    k_hi = np.searchsorted(samples.begin_s, execs.hi_s, side="left")
    return k_lo, k_hi
