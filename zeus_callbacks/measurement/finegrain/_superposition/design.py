"""The linear model of a superposition: the layout of the unknowns and the design matrix ``A``.

The model is stated in :mod:`zeus_callbacks.measurement.finegrain`; ``A`` is built from
:mod:`.timeline`, and :mod:`.solve` fits it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zeus_callbacks.measurement.finegrain._superposition.intervals import bin_edges, overlap_with
from zeus_callbacks.measurement.finegrain._superposition.settings import SuperposeSettings
from zeus_callbacks.measurement.finegrain._superposition.timeline import (
    Executions,
    Pauses,
    SampleIntervals,
    sample_ranges,
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
    """Build ``A``: the executions' profile bins, then the pause and tail levels, then the baseline."""
    A = np.zeros((samples.m, cols.size))
    widths = execution_columns(A, execs, samples, cols, settings)
    A[:, cols.gap] = overlap_with(samples.begin_s, samples.end_s, gaps.gap_lo_s, gaps.gap_hi_s)
    tail_columns(A, samples, gaps, cols, settings.post_s)
    A[:, -1] = np.clip(samples.duration_s - A[:, :-1].sum(axis=1), 0.0, None)
    return Design(A, widths, cols)


def execution_columns(
    A: np.ndarray, execs: Executions, samples: SampleIntervals, cols: Columns, settings: SuperposeSettings
) -> np.ndarray:
    """Add every execution's bin overlaps to its class's columns of ``A`` (in place); return its bin widths."""
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
