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
    """Edges of one execution's profile bins, shape (n_pre + n_in + n_post + 1,) (s), non-decreasing.

    ``n_pre`` bins split the ``pre_s`` before the start, ``n_in`` the execution, ``n_post`` the
    ``post_s`` after the end; the edges are clipped to the extended window ``[lo_s, hi_s]``.
    """
    parts = []
    if n_pre:
        parts.append(np.linspace(start_s - pre_s, start_s, n_pre + 1)[:-1])
    parts.append(np.linspace(start_s, end_s, n_in + 1))
    if n_post:
        parts.append(np.linspace(end_s, end_s + post_s, n_post + 1)[1:])
    return np.clip(np.concatenate(parts), lo_s, hi_s)


def overlap_with(a: np.ndarray, b: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Time each interval ``(a_k, b_k]`` spends in the disjoint, sorted intervals ``(lo_i, hi_i]`` (s), shape (m,).

    ``a``, ``b`` have shape (m,), ``b >= a``; ``lo``, ``hi`` shape (q,), empty ones (``hi <= lo``) ignored.
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
    """Whether each ``x`` lies in one of the disjoint, sorted intervals ``(lo_i, hi_i]`` (empty ones ignored)."""
    keep = hi > lo
    knots = np.column_stack([lo[keep], hi[keep]]).ravel()
    return np.searchsorted(knots, x, side="left") % 2 == 1
