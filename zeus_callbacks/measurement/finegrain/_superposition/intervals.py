"""Interval arithmetic on the sample clock: bin edges, overlaps, membership (all times in s)."""

from __future__ import annotations

import numpy as np


def bin_edges(
    start_s: float,
    end_s: float,
    lo_s: float,
    hi_s: float,
    pre_s: float,
    post_s: float,
    n_pre: int,
    n_in: int,
    n_post: int,
) -> np.ndarray:
    """Edges of one execution's profile bins, clipped to its extended window.

    Args:
        start_s: Execution start (s).
        end_s: Execution end (s).
        lo_s: Start of its extended window (s); the edges are clipped to ``[lo_s, hi_s]``.
        hi_s: End of its extended window (s).
        pre_s: Time before the start split into ``n_pre`` bins (s).
        post_s: Time after the end split into ``n_post`` bins (s).
        n_pre: Bins before the start.
        n_in: Bins between start and end.
        n_post: Bins after the end.

    Returns:
        The edges, shape (n_pre + n_in + n_post + 1,) (s), non-decreasing.
    """
    parts = []
    if n_pre:
        parts.append(np.linspace(start_s - pre_s, start_s, n_pre + 1)[:-1])
    parts.append(np.linspace(start_s, end_s, n_in + 1))
    if n_post:
        parts.append(np.linspace(end_s, end_s + post_s, n_post + 1)[1:])
    return np.clip(np.concatenate(parts), lo_s, hi_s)


def overlap_with(a: np.ndarray, b: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Time each interval ``(a_k, b_k]`` spends in the disjoint, sorted intervals ``(lo_i, hi_i]`` (s).

    Args:
        a: Interval starts, shape (m,) (s).
        b: Interval ends, shape (m,) (s), ``b >= a``.
        lo: Starts of the disjoint, sorted intervals, shape (q,) (s); empty ones (``hi <= lo``) are ignored.
        hi: Their ends, shape (q,) (s).

    Returns:
        The overlap of each ``(a_k, b_k]``, shape (m,) (s).
    """
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    if lo.size == 0:
        return np.zeros_like(a)
    knots = np.column_stack([lo, hi]).ravel()
    cum = np.concatenate(([0.0], np.cumsum(hi - lo)))
    covered = np.column_stack([cum[:-1], cum[1:]]).ravel()  # time covered up to each knot
    return np.interp(b, knots, covered) - np.interp(a, knots, covered)


def inside(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Whether each ``x`` lies in one of the disjoint, sorted intervals ``(lo_i, hi_i]``.

    Args:
        x: Times, shape (m,) (s).
        lo: Interval starts, shape (q,) (s); empty intervals are ignored.
        hi: Interval ends, shape (q,) (s).

    Returns:
        Membership, shape (m,) bool.
    """
    keep = hi > lo
    knots = np.column_stack([lo[keep], hi[keep]]).ravel()
    return np.searchsorted(knots, x, side="left") % 2 == 1
