"""Tolerances of the golden tests, derived from the computation that made each float.

The floats of a golden file are not bit-exact across machines: OpenBLAS picks a kernel for the
CPU (``OPENBLAS_CORETYPE``) that sums the Gram matrix of a fit in another order, and numpy's
element-wise functions take other SIMD paths. A tolerance here says how far that can move a
figure; CI runs the golden files under two kernels to keep it honest.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from zeus_callbacks.measurement.finegrain._superposition import solve as solve_module

EPS = float(np.finfo(float).eps)


@contextmanager
def solve_conditioning() -> Iterator[list[tuple[float, int]]]:
    """Record ``(cond(M), m)`` of every penalised solve inside the block.

    The point fit and each bootstrap replicate solve the least-squares system ``Ã θ ≈ b̃``
    (``solve.augmented_system``, from ``m`` weighted sample rows); ``M = ÃᵀÃ`` is its normal
    matrix, shape (p, p). ``cond(M) = cond(Ã)²`` bounds how far another summation order can move
    the result, with room to spare: the solve itself works on ``Ã`` (a QR-type solve, not the
    normal equations), and the goldens were recorded from the normal equations.
    """
    seen: list[tuple[float, int]] = []
    original = solve_module.augmented_system

    def observed(prob, weights):
        rows, rhs = original(prob, weights)
        seen.append((float(np.linalg.cond(rows.T @ rows)), int(prob.matrix.shape[0])))
        return rows, rhs

    solve_module.augmented_system = observed
    try:
        yield seen
    finally:
        solve_module.augmented_system = original


def fit_tolerance(seen: list[tuple[float, int]]) -> float:
    """Relative, normwise tolerance of a fit's floats: ``10 · ε · κ_max · √m_max``.

    A backward-stable solve moves θ by about κ(M)·ε relative to ‖θ‖ (Higham, *Accuracy and
    Stability of Numerical Algorithms*, 2nd ed., §7.1); another BLAS kernel reorders the m-term
    sums that form ``AᵀWA`` and ``AᵀWy``, whose rounding errors grow as √m (ibid. §3.1, the
    probabilistic bound); the factor 10 covers the summary's own arithmetic (sums over bins,
    bootstrap percentiles). κ and m are the largest of every solve the case made, bootstrap
    replicates included (a replicate that drops rows can be far worse conditioned than the point fit).
    """
    assert seen, "the case made no solve: its tolerance would be meaningless"
    kappa = max(k for k, _ in seen)
    m = max(m for _, m in seen)
    return 10 * EPS * kappa * math.sqrt(m)


SUMS_REL_TOL = 1e4 * EPS
"""A scenario with no solve: its floats are sums and means of at most 10⁴ readings, each of
which element-wise functions may round differently on another SIMD path (n·ε, Higham §4.2)."""


def scenario_tolerance(seen: list[tuple[float, int]]) -> float:
    """The tolerance of a session scenario: its fits' (:func:`fit_tolerance`) if it made any, else sums'."""
    return max(fit_tolerance(seen), SUMS_REL_TOL) if seen else SUMS_REL_TOL
