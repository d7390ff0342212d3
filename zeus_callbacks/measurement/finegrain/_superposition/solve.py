"""Penalised, weighted least squares for the superposition model of :mod:`.design`.

The fit minimises ``Σ_k w_k (y_k − A_k θ)² + λ ‖D θ‖² + ω (c − c₀)²`` (``y`` the sample
energies, ``w`` the bootstrap weights, all 1 for the point estimate). ``D`` holds first
differences within each class's profile (smoothness fixes what the data cannot, e.g. the
shape of a 1 ms execution under a 20 ms sensor, while its level and energy stay determined by
the data) and weak ties for steady mode's pause and tail levels; the prior ``ω`` on the
baseline ``c`` is weak when idle samples determine it, strong when it was given. Least-squares
superposition after Lang & Rünger (Euro-Par 2013), as used by FinGraV (arXiv 2412.12426, C1).

The fit is solved as one ordinary least-squares problem on the augmented system
(``scipy.linalg.lstsq``): the penalty and the prior become extra rows, so the solve works on
``A``'s conditioning, not on the normal equations' (which square it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zeus_callbacks.measurement.finegrain._superposition.design import Columns, Design
from zeus_callbacks.measurement.finegrain._superposition.settings import SuperposeSettings
from zeus_callbacks.measurement.finegrain._superposition.timeline import SampleIntervals

GIVEN_BASELINE_WEIGHT = 1e6
"""Prior weight that pins a given baseline."""
KNOWN_BASELINE_WEIGHT = 1e-4
"""Prior weight on the baseline when idle samples determine it."""
UNKNOWN_BASELINE_WEIGHT = 1.0
"""Prior weight on the baseline when too few idle samples determine it."""
IDLE_INTERVALS_FOR_BASELINE = 2
"""Idle time, in median sample intervals, from which the baseline counts as known."""
RIDGE = 1e-9
"""Relative ridge that keeps the problem regular (e.g. steady mode's unused pause column)."""


def penalty_rows(cols: Columns) -> np.ndarray:
    """``D``, the rows of the smoothness penalty and the weak ties, shape (k, p).

    Rows of ``D``: first differences within each class's bins; the pause level minus the mean
    of every profile bin (a GPU cannot change power in a few ms; this matters when pauses are so
    regular that they are collinear with the executions); first differences along the run
    tail, whose last bin decays to the baseline.
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
    return np.array(rows)


@dataclass(frozen=True)
class Problem:
    """Everything a (weighted) fit needs.

    Attributes:
        matrix: ``A``, shape (m, p) (s).
        energy_J: ``y``, shape (m,) (J).
        penalty: ``D``, the penalty rows, shape (k, p).
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
        penalty=penalty_rows(design.columns),
        smoothing=settings.smoothing,
        prior_weight=weight,
        prior_power_W=given if given is not None else float(np.median(samples.power_W)),
        baseline_known=bool(baseline_known),
    )


def augmented_system(prob: Problem, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fit with sample weights as one least-squares system ``min ‖Ã θ − b̃‖²``.

    ``Ã`` stacks ``√W A``, ``√λ D``, ``√ω eᵀ`` and ``√ridge I``; ``b̃`` stacks ``√W y``, zeros,
    ``√ω c₀`` and zeros. Its normal equations are the penalised ones,
    ``(AᵀWA + λDᵀD + ω e eᵀ + ridge·I) θ = AᵀWy + ω c₀ e`` (``e`` selects the baseline, the last
    column), with ``λ``, ``ω`` and the ridge relative to the mean diagonal of ``AᵀWA``.
    ``weights``: shape (m,), bootstrap counts or ones. Shapes of ``(Ã, b̃)``: (m + k + 1 + p, p), (m + k + 1 + p,).
    """
    A, p = prob.matrix, prob.matrix.shape[1]
    root_w = np.sqrt(weights)
    weighted = A * root_w[:, None]
    # The mean diagonal of AᵀWA: the squared column norms of √W A.
    scale = max(float(np.einsum("ij,ij->", weighted, weighted)) / p, 1e-30)
    prior = np.zeros((1, p))
    prior[0, -1] = 1.0
    rows = np.vstack([
        weighted,
        np.sqrt(prob.smoothing * scale) * prob.penalty,
        np.sqrt(prob.prior_weight * scale) * prior,
        np.sqrt(RIDGE * scale) * np.eye(p),
    ])  # fmt: skip
    rhs = np.concatenate([
        root_w * prob.energy_J,
        np.zeros(prob.penalty.shape[0]),
        [np.sqrt(prob.prior_weight * scale) * prob.prior_power_W],
        np.zeros(p),
    ])  # fmt: skip
    return rows, rhs


def solve(prob: Problem, weights: np.ndarray) -> np.ndarray:
    """Solve the penalised fit with sample weights (``scipy.linalg.lstsq`` on :func:`augmented_system`).

    Returns:
        θ, shape (p,): profile bin powers (W), the pause level, the tail bins, the baseline (last).

    Raises:
        scipy.linalg.LinAlgError: The least-squares solve did not converge.
    """
    from scipy import linalg  # here: every import of the session reaches this module, few runs fit

    rows, rhs = augmented_system(prob, weights)
    theta, *_ = linalg.lstsq(rows, rhs)
    return np.asarray(theta)
