"""Penalised, weighted least squares for the superposition model of :mod:`.design`.

The fit minimises ``Σ_k w_k (y_k − A_k θ)² + λ ‖D θ‖² + ω (c − c₀)²`` (``y`` the sample
energies, ``w`` the bootstrap weights, all 1 for the point estimate). ``D`` holds first
differences within each class's profile (smoothness fixes what the data cannot, e.g. the
shape of a 1 ms execution under a 20 ms sensor, while its level and energy stay determined by
the data) and weak ties for steady mode's pause and tail levels; the prior ``ω`` on the
baseline ``c`` is weak when idle samples determine it, strong when it was given. Least-squares
superposition after Lang & Rünger (Euro-Par 2013), as used by FinGraV (arXiv 2412.12426, C1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zeus_callbacks.measurement.finegrain.superposition.design import Columns, Design
from zeus_callbacks.measurement.finegrain.superposition.settings import SuperposeSettings
from zeus_callbacks.measurement.finegrain.superposition.timeline import SampleIntervals

GIVEN_BASELINE_WEIGHT = 1e6
"""Prior weight that pins a given baseline."""
KNOWN_BASELINE_WEIGHT = 1e-4
"""Prior weight on the baseline when idle samples determine it."""
UNKNOWN_BASELINE_WEIGHT = 1.0
"""Prior weight on the baseline when too few idle samples determine it."""
IDLE_INTERVALS_FOR_BASELINE = 2
"""Idle time, in median sample intervals, from which the baseline counts as known."""
RIDGE = 1e-9
"""Relative ridge that keeps the normal equations regular (e.g. steady mode's unused pause column)."""


def penalty_matrix(cols: Columns) -> np.ndarray:
    """``DᵀD`` of the smoothness penalty and the weak ties, shape (p, p).

    Rows of ``D``: first differences within each class's bins; the pause level minus the mean
    of every profile bin (a GPU cannot change power in a few ms; this matters when pauses are so
    regular that they are collinear with the executions); first differences along the run
    tail, whose last bin decays to the baseline.

    Args:
        cols: The column layout.

    Returns:
        The penalty matrix, shape (cols.size, cols.size).
    """
    p, gap, tail = cols.size, cols.gap, cols.tail
    rows = []
    for c in cols.classes:
        c0 = cols.first(c)
        for j in range(cols.per_class - 1):
            r = np.zeros(p)
            r[c0 + j], r[c0 + j + 1] = -1.0, 1.0
            rows.append(r)
    r = np.zeros(p)
    r[gap], r[:gap] = 1.0, -1.0 / gap
    rows.append(r)
    for j in range(cols.n_tail):
        r = np.zeros(p)
        r[tail + j], r[tail + j + 1 if j + 1 < cols.n_tail else -1] = -1.0, 1.0
        rows.append(r)
    Dm = np.array(rows)
    return Dm.T @ Dm


@dataclass(frozen=True)
class Problem:
    """Everything a (weighted) fit needs.

    Attributes:
        matrix: ``A``, shape (m, p) (s).
        energy_J: ``y``, shape (m,) (J).
        penalty: ``DᵀD``, shape (p, p).
        smoothing: ``λ`` relative to the mean diagonal of ``AᵀWA``.
        prior_weight: ``ω`` relative to the same scale.
        prior_power_W: ``c₀``, the baseline the prior pulls to (W).
        baseline_known: Whether idle samples determine the baseline.
    """

    matrix: np.ndarray
    energy_J: np.ndarray
    penalty: np.ndarray
    smoothing: float
    prior_weight: float
    prior_power_W: float
    baseline_known: bool


def problem(design: Design, samples: SampleIntervals, settings: SuperposeSettings) -> Problem:
    """Set up the fit: the penalty and the baseline prior.

    Without a given baseline the prior pulls to the median sample power, weakly when there is
    idle time of at least two sample intervals (the idle samples then decide).

    Args:
        design: The design matrix.
        samples: The sample intervals.
        settings: ``baseline_W`` and ``smoothing`` are used.

    Returns:
        The :class:`Problem`.
    """
    baseline_known = design.idle_time_s >= IDLE_INTERVALS_FOR_BASELINE * samples.median_interval_s
    given = settings.baseline_W
    if given is not None:
        weight = GIVEN_BASELINE_WEIGHT
    else:
        weight = KNOWN_BASELINE_WEIGHT if baseline_known else UNKNOWN_BASELINE_WEIGHT
    return Problem(
        matrix=design.matrix,
        energy_J=samples.energy_J,
        penalty=penalty_matrix(design.columns),
        smoothing=settings.smoothing,
        prior_weight=weight,
        prior_power_W=given if given is not None else float(np.median(samples.power_W)),
        baseline_known=bool(baseline_known),
    )


def normal_equations(prob: Problem, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The penalised normal equations ``M θ = r`` of a fit with sample weights.

    Args:
        prob: The problem.
        weights: Weight of each sample interval, shape (m,) (bootstrap counts, or ones).

    Returns:
        ``(M, r)``: ``M = AᵀWA + λDᵀD + ω e eᵀ + ridge·I``, shape (p, p), and
        ``r = AᵀWy + ω c₀ e``, shape (p,) (``e`` selects the baseline, the last column).
    """
    A, p = prob.matrix, prob.matrix.shape[1]
    Aw = A * weights[:, None]
    G = Aw.T @ A
    rhs = Aw.T @ prob.energy_J
    scale = max(np.trace(G) / p, 1e-30)
    lam = prob.smoothing * scale
    prior = np.zeros(p)
    prior[-1] = 1.0
    M = G + lam * prob.penalty + prob.prior_weight * scale * np.diag(prior) + RIDGE * scale * np.eye(p)
    return M, rhs + prob.prior_weight * scale * prior * prob.prior_power_W


def solve(prob: Problem, weights: np.ndarray) -> np.ndarray:
    """Solve the penalised normal equations with sample weights.

    Args:
        prob: The problem.
        weights: Weight of each sample interval, shape (m,) (bootstrap counts, or ones).

    Returns:
        θ, shape (p,): profile bin powers (W), the pause level, the tail bins, the baseline (last).

    Raises:
        numpy.linalg.LinAlgError: The normal equations are singular.
    """
    M, rhs = normal_equations(prob, weights)
    return np.linalg.solve(M, rhs)
