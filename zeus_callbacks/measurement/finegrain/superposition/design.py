"""The linear model of a superposition: executions, sample intervals and the design matrix.

FinGraV (arXiv 2412.12426), challenge C1 (low sampling rate): every sample ``k`` is the mean
power over its interval ``(t_{k-1} - d, t_k - d]`` (``d`` the sensor delay, which puts the
samples on the executions' clock), so its energy is a linear function of the power profile:

    p_k Δ_k = Σ_j g_j · A[k, j] + c · (Δ_k − Σ_j A[k, j]) + noise

``A[k, j]`` is the time (s) sample ``k``'s interval spends in profile bin ``j`` of any execution
(Lang & Rünger, Euro-Par 2013, write it the same way). This module builds ``A`` and what it
is built from; :mod:`.solve` fits it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from zeus_callbacks.measurement.finegrain.superposition.intervals import bin_edges, overlap_with
from zeus_callbacks.measurement.finegrain.superposition.settings import SuperposeSettings

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
    """The four input sequences as float64 arrays, checked.

    Args:
        starts_s: Execution starts, shape (n,) (s).
        ends_s: Execution ends, shape (n,) (s).
        sample_times_s: Sample timestamps, shape (m,) (s).
        sample_power_W: Sample values, shape (m,) (W).

    Returns:
        ``(starts, ends, times, power)`` as float64 arrays.

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
    starts: np.ndarray, ends: np.ndarray, labels: Sequence[str] | None, settings: SuperposeSettings
) -> Executions:
    """Sort the executions, fold steady mode's launch gaps into them and extend their windows.

    Args:
        starts: Starts, shape (n,) (s), from :func:`check_inputs`.
        ends: Ends, shape (n,) (s).
        labels: Class of each execution, shape (n,); None: every execution is ``"all"``.
        settings: ``mode``, ``launch_gap_s``, ``pre_s`` and ``post_s`` are used.

    Returns:
        The :class:`Executions`.

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

    A gap after an execution shorter than ``launch_gap_s`` (default: half the execution's
    duration) is the launch overhead of back-to-back work, so the execution ends at the next start.

    Args:
        starts: Sorted starts, shape (n,) (s).
        ends: Their ends, shape (n,) (s).
        launch_gap_s: The longest gap folded in (s); None: half each execution's duration.

    Returns:
        The new ends, shape (n,) (s).
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
    """Turn samples into intervals; drop the first and any that spans a lost sample.

    Args:
        times: Sample timestamps, shape (m,) (s), increasing.
        power: Sample values, shape (m,) (W).
        sensor_delay_s: Lag of a sample behind the power it reports (s).

    Returns:
        The :class:`SampleIntervals` (at most m − 1 of them).
    """
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

    Args:
        execs: The executions.
        median_interval_s: Median sample interval (s).
        settings: ``mode``, ``short_gap_s`` and ``post_s`` are used.

    Returns:
        The :class:`Pauses`.
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
        ends[is_gap],
        (ends + pause)[is_gap],
        ends[is_end],
        np.minimum(ends + settings.post_s, ends + pause)[is_end],
    )


@dataclass(frozen=True)
class Columns:
    """Layout of the unknowns θ: each class's profile bins, the pause level, the tail bins, the baseline.

    Attributes:
        classes: The execution classes, in order of first appearance.
        n_pre: Profile bins before each start.
        n_bins: Profile bins inside each execution.
        n_post: Profile bins after each end.
        n_tail: Bins of the run tail (steady mode; 0 in isolated mode).
    """

    classes: tuple[str, ...]
    n_pre: int
    n_bins: int
    n_post: int
    n_tail: int

    @property
    def per_class(self) -> int:
        """Profile bins of one class (``n_pre + n_bins + n_post``)."""
        return self.n_pre + self.n_bins + self.n_post

    @property
    def gap(self) -> int:
        """Column of the pause level."""
        return len(self.classes) * self.per_class

    @property
    def tail(self) -> int:
        """First column of the run tail's bins (the baseline's when there are none)."""
        return self.gap + 1

    @property
    def size(self) -> int:
        """Number of unknowns; the last one (index −1) is the baseline."""
        return self.gap + 2 + self.n_tail

    @property
    def inside(self) -> slice:
        """The bins of a class's profile that lie inside the execution."""
        return slice(self.n_pre, self.n_pre + self.n_bins)

    def first(self, label: str) -> int:
        """First column of class ``label``'s profile."""
        return self.classes.index(label) * self.per_class

    def of_class(self, label: str) -> slice:
        """The columns of class ``label``'s profile."""
        c0 = self.first(label)
        return slice(c0, c0 + self.per_class)


def columns(execs: Executions, settings: SuperposeSettings) -> Columns:
    """The :class:`Columns` of these executions under these settings."""
    return Columns(
        tuple(dict.fromkeys(execs.labels.tolist())),
        settings.window_n_pre,
        settings.n_bins,
        settings.window_n_post,
        settings.n_tail,
    )


def sample_ranges(execs: Executions, samples: SampleIntervals) -> tuple[np.ndarray, np.ndarray]:
    """For each execution, the half-open range of sample intervals that can meet its window.

    Returns:
        ``(k_lo, k_hi)``, each shape (n,): intervals ``k_lo[i] <= k < k_hi[i]``.
    """
    k_lo = np.searchsorted(samples.end_s, execs.lo_s, side="right")
    k_hi = np.searchsorted(samples.begin_s, execs.hi_s, side="left")
    return k_lo, k_hi


@dataclass(frozen=True)
class Design:
    """The design matrix and the bin widths behind it.

    Attributes:
        matrix: ``A``, shape (m, p) (s): time each sample interval spends in each column's bins;
            the last column is the time left at the baseline.
        widths_s: Width of each execution's profile bins, shape (n, per_class) (s).
        columns: The layout of the p columns.
    """

    matrix: np.ndarray
    widths_s: np.ndarray
    columns: Columns

    @property
    def idle_time_s(self) -> float:
        """Total time of the sample intervals modelled at the baseline (s)."""
        return self.matrix[:, -1].sum()

    @property
    def tail_block(self) -> np.ndarray:
        """The run tail's columns of ``A``, shape (m, n_tail) (s)."""
        return self.matrix[:, self.columns.tail : -1]


def design_matrix(
    execs: Executions, samples: SampleIntervals, gaps: Pauses, cols: Columns, settings: SuperposeSettings
) -> Design:
    """Build ``A``: the executions' profile bins, then the pause and tail levels, then the baseline.

    Args:
        execs: The executions.
        samples: The sample intervals.
        gaps: Steady mode's pauses and run tails.
        cols: The column layout.
        settings: ``pre_s``, ``post_s`` (window and tail widths) are used.

    Returns:
        The :class:`Design`.
    """
    A = np.zeros((samples.m, cols.size))
    widths = execution_columns(A, execs, samples, cols, settings)
    A[:, cols.gap] = overlap_with(samples.begin_s, samples.end_s, gaps.gap_lo_s, gaps.gap_hi_s)
    tail_columns(A, samples, gaps, cols, settings.post_s)
    A[:, -1] = np.clip(samples.duration_s - A[:, :-1].sum(axis=1), 0.0, None)
    return Design(A, widths, cols)


def execution_columns(
    A: np.ndarray, execs: Executions, samples: SampleIntervals, cols: Columns, settings: SuperposeSettings
) -> np.ndarray:
    """Add every execution's bin overlaps to its class's columns of ``A`` (in place).

    Returns:
        The bin widths of each execution, shape (n, per_class) (s).
    """
    a, b = samples.begin_s, samples.end_s
    pre, post = settings.window_pre_s, settings.window_post_s
    widths = np.zeros((execs.n, cols.per_class))
    k_lo, k_hi = sample_ranges(execs, samples)
    for i in range(execs.n):
        edges = bin_edges(
            execs.starts_s[i], execs.ends_s[i], execs.lo_s[i], execs.hi_s[i],
            pre, post, cols.n_pre, cols.n_bins, cols.n_post,
        )  # fmt: skip
        widths[i] = np.diff(edges)
        if k_hi[i] <= k_lo[i]:
            continue
        ks = slice(k_lo[i], k_hi[i])
        overlap = np.minimum(b[ks, None], edges[None, 1:]) - np.maximum(a[ks, None], edges[None, :-1])
        A[ks, cols.of_class(execs.labels[i])] += np.clip(overlap, 0.0, None)
    return widths


def tail_columns(A: np.ndarray, samples: SampleIntervals, gaps: Pauses, cols: Columns, post_s: float) -> None:
    """Fill the run tail's columns of ``A`` (in place): bin j of each tail is ``(end + j·w, end + (j+1)·w]``.

    ``w = post_s / n_tail``; each bin is clipped to the pause it lies in.
    """
    tail_w = (post_s / cols.n_tail) if cols.n_tail else 0.0
    lo, hi = gaps.tail_lo_s, gaps.tail_hi_s
    for j in range(cols.n_tail):
        A[:, cols.tail + j] = overlap_with(
            samples.begin_s, samples.end_s, np.minimum(lo + j * tail_w, hi), np.minimum(lo + (j + 1) * tail_w, hi)
        )
