"""The bandit's pure maths: Gaussian posteriors, the tail mean of a stopped run, pooled noise, arm elimination.

Formulas and sources: :mod:`zeus_callbacks.optimizers.batch_size._bandit` (Zeus, NSDI '23, §4.2) and docs/batch_size.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ArmPosterior:
    """Gaussian posterior of one arm's cost (see the module docstring for the formulas).

    Attributes:
        batch_size: The arm.
        n: Effective number of observations ``Σ w_i``.
        mean: Posterior mean cost ``μn`` (J-equivalent).
        precision: Posterior precision ``τn`` (1 / J-equivalent²).
        noise_var: Noise variance ``σ²`` used (J-equivalent²); nan without observations.
    """

    batch_size: int
    n: float
    mean: float
    precision: float
    noise_var: float

    @property
    def std(self) -> float:
        """Posterior standard deviation ``1 / sqrt(τn)``."""
        return 1.0 / math.sqrt(self.precision)


def prior_from_costs(costs: Sequence[float], prior_std_rel: float) -> tuple[float, float]:
    """Empirical-Bayes prior of every arm: ``(μ0, τ0) = (mean cost, 1 / (κ μ0)²)``.

    Args:
        costs: Every observed cost of the job (J-equivalent), shape (n,), n ≥ 1.
        prior_std_rel: κ, the prior standard deviation relative to ``μ0``.

    Returns:
        Prior mean and precision.

    Raises:
        ValueError: No costs, or a non-positive mean.
    """
    if len(costs) == 0:
        raise ValueError("the prior needs at least one observed cost")
    mean = float(np.mean(costs))
    if not mean > 0:
        raise ValueError(f"costs must be positive, mean is {mean}")
    return mean, 1.0 / (prior_std_rel * mean) ** 2


def gaussian_posterior(
    costs: Sequence[float],
    weights: Sequence[float] | np.ndarray,
    prior_mean: float,
    prior_precision: float,
    noise_floor_rel: float,
    relative_var: float | None = None,
) -> tuple[float, float, float]:
    """Posterior of a Gaussian mean with a Gaussian prior and a floored noise variance.

    Args:
        costs: Observations ``x_i``, shape (n,).
        weights: Weights ``w_i`` ≥ 0, shape (n,).
        prior_mean: ``μ0``.
        prior_precision: ``τ0`` > 0.
        noise_floor_rel: ρ: the noise standard deviation is at least ``ρ · x̄``.
        relative_var: A relative noise variance ``r`` pooled over arms: when given,
            ``σ² = max(r, ρ²) · x̄²`` replaces the arm's own sample variance.

    Returns:
        ``(μn, τn, σ²)``; ``(μ0, τ0, nan)`` when the weights sum to 0.

    Example:
        >>> mean, precision, var = gaussian_posterior([100.0, 100.0], [1, 1], 100.0, 1e-4, 0.05)
        >>> round(mean, 6), round(precision, 6), var   # σ² = (0.05·100)² = 25: no freeze
        (100.0, 0.0801, 25.0)
    """
    x = np.asarray(costs, dtype=float)
    w = np.asarray(weights, dtype=float)
    n = float(w.sum())
    if n <= 0:
        return prior_mean, prior_precision, math.nan
    mean = float((w * x).sum() / n)
    if relative_var is None:
        sample_var = float((w * (x - mean) ** 2).sum() / (n - 1)) if n > 1 else 0.0
    else:
        sample_var = relative_var * mean**2
    noise_var = max(sample_var, (noise_floor_rel * mean) ** 2)
    precision = prior_precision + n / noise_var
    post_mean = (prior_precision * prior_mean + n / noise_var * mean) / precision
    return post_mean, precision, noise_var


def gaussian_tail_mean(mean: float, std: float, threshold: float) -> float:
    """Mean of a Gaussian truncated below at ``threshold``: ``E[X | X > c]``, ``X ~ N(μ, s²)``.

    ``E[X | X > c] = μ + s·λ(α)`` with ``α = (c − μ)/s`` and ``λ(α) = φ(α) / (1 − Φ(α))`` the
    inverse Mills ratio (Johnson, Kotz & Balakrishnan, *Continuous Univariate
    Distributions*, vol. 1, 2nd ed., 1994, ch. 13). Replacing a censored value by its conditional
    expectation is the imputation of Schmee & Hahn ("A simple method for regression analysis with
    censored data", Technometrics 21(4), 1979). ``scipy.stats.truncnorm`` computes it in log
    space, so a far tail stays finite; the result is always ≥ ``threshold``.

    Args:
        mean: ``μ`` (J-equivalent).
        std: ``s`` > 0 (J-equivalent).
        threshold: ``c``, the censoring point (J-equivalent).

    Returns:
        The tail mean (J-equivalent).

    Raises:
        ValueError: ``std`` is not positive.

    Example:
        >>> round(gaussian_tail_mean(0.0, 1.0, 0.0), 6)   # half-normal: sqrt(2/pi)
        0.797885
    """
    return float(gaussian_tail_means(mean, std, [threshold])[0])


def gaussian_tail_means(mean: float, std: float, thresholds: Sequence[float]) -> np.ndarray:
    """:func:`gaussian_tail_mean` at each of ``thresholds``, shape (n,) (one ``scipy.stats.truncnorm`` call)."""
    from scipy.stats import truncnorm  # scipy.stats takes a while to import: only when a run was censored

    if not std > 0:
        raise ValueError(f"std must be positive, got {std}")
    c = np.asarray(thresholds, dtype=float)
    # truncnorm also computes the skew, which a far tail rounds to nan (a warning): the mean is unaffected.
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        tail = truncnorm.stats((c - mean) / std, np.inf, loc=mean, scale=std, moments="m")
    return np.maximum(np.asarray(tail, dtype=float), c)


def pooled_relative_variance(
    costs_by_arm: Sequence[Sequence[float]], weights_by_arm: Sequence[Sequence[float] | np.ndarray]
) -> float:
    """Relative noise variance pooled over arms: ``Σ_a Σ_i w_i (x_i / x̄_a − 1)² / Σ_a (n_a − 1)``.

    Only arms with ``n_a = Σ w_i > 1`` contribute; 0 when none does.

    Args:
        costs_by_arm: Each arm's observations.
        weights_by_arm: Their weights, same shapes.

    Returns:
        The pooled relative variance (dimensionless).
    """
    num = den = 0.0
    for costs, weights in zip(costs_by_arm, weights_by_arm, strict=True):
        x, w = np.asarray(costs, dtype=float), np.asarray(weights, dtype=float)
        n = float(w.sum())
        if n > 1:
            mean = float((w * x).sum() / n)
            num += float((w * (x / mean - 1.0) ** 2).sum())
            den += n - 1
    return num / den if den > 0 else 0.0


def eliminate_arms(posteriors: dict[int, ArmPosterior], z: float | None) -> list[int]:
    """Arms Thompson sampling still draws from: lower-confidence-bound elimination.

    An arm is skipped when its lower bound ``μn − z·sd`` exceeds the best upper bound
    ``min_b (μn_b + z·sd_b)``: it is then worse than the best arm with probability
    ≳ 1 − Φ(−z)², and a draw of it a near-certain loss (Thompson sampling alone plays an arm seen
    once about one recurrence in a few hundred). Re-evaluated at every draw: an arm comes back
    when the best one's bound moves.

    Args:
        posteriors: Posterior of each candidate arm.
        z: Width of the bounds in posterior standard deviations; None: keep every arm.

    Returns:
        The kept arms, in the order of ``posteriors`` (never empty when posteriors is not).

    Example:
        >>> a = ArmPosterior(32, 3.0, 100.0, 1 / 5.0**2, 75.0)   # sd 5: bounds 90..110
        >>> b = ArmPosterior(64, 1.0, 130.0, 1 / 8.0**2, 64.0)   # sd 8: lower bound 114 > 110
        >>> eliminate_arms({32: a, 64: b}, 2.0), eliminate_arms({32: a, 64: b}, 3.0)
        ([32], [32, 64])
    """
    if z is None or not posteriors:
        return list(posteriors)
    best_upper = min(p.mean + z * p.std for p in posteriors.values())
    return [b for b, p in posteriors.items() if p.mean - z * p.std <= best_upper]


def satisficing_choice(draws: dict[int, float], means: dict[int, float], rel: float | None) -> int:
    """The arm a Thompson round plays, given each arm's draw and posterior mean.

    Satisficing Thompson sampling (Russo & Van Roy, "Satisficing in time-sensitive bandit
    learning", 2022): of the arms whose draw is within a fraction ``rel`` of the lowest, take the
    one the posterior believes cheapest. Telling apart arms closer than ``rel`` takes tens of runs
    (run-to-run spread ~10 %) and gains less than ``rel`` per run.

    Args:
        draws: ``θ_a`` per arm.
        means: Posterior mean per arm (same keys).
        rel: The satisficing fraction; None (or 0): plain Thompson sampling.

    Returns:
        The arm to play.

    Example:
        >>> satisficing_choice({32: 101.0, 64: 100.0}, {32: 99.0, 64: 102.0}, 0.02)  # 101 <= 1.02 x 100
        32
        >>> satisficing_choice({32: 103.0, 64: 100.0}, {32: 99.0, 64: 102.0}, 0.02)
        64
        >>> satisficing_choice({32: 101.0, 64: 100.0}, {32: 99.0, 64: 102.0}, None)
        64
    """
    best = min(draws, key=lambda b: (draws[b], b))
    if not rel:
        return int(best)
    accepted = [b for b in draws if draws[b] <= draws[best] + rel * abs(draws[best])]
    return int(min(accepted, key=lambda b: (means[b], b)))


def observation_weights(ages: Sequence[int], window: int | None, discount: float | None) -> np.ndarray:
    """Weights of one arm's observations, given their ages (0 = newest recurrence of the job).

    Args:
        ages: Age of each observation in job recurrences, shape (n,).
        window: Keep the ``window`` youngest observations of the arm; None: all.
        discount: Weight ``discount ** age``; None: 1.

    Returns:
        Weights, shape (n,).
    """
    a = np.asarray(ages, dtype=float)
    w = np.ones_like(a) if discount is None else np.power(float(discount), a)
    if window is not None and len(a) > window:
        keep = np.argsort(a, kind="stable")[:window]
        mask = np.zeros(len(a), dtype=bool)
        mask[keep] = True
        w = np.where(mask, w, 0.0)
    return w


def scaled_learning_rate(lr: float, batch_size: int, default_batch_size: int, rule: str) -> float:
    """Scale a learning rate tuned at ``default_batch_size`` to ``batch_size``.

    Args:
        lr: Learning rate at the default batch size.
        batch_size: The batch size in use.
        default_batch_size: The batch size ``lr`` was tuned for.
        rule: ``"none"``, ``"linear"`` (Goyal et al., 2017) or ``"sqrt"`` (Krizhevsky, 2014).

    Returns:
        The scaled learning rate.

    Raises:
        ValueError: Unknown rule.
    """
    ratio = batch_size / default_batch_size
    if rule == "none":
        return lr
    if rule == "linear":
        return lr * ratio
    if rule == "sqrt":
        return lr * math.sqrt(ratio)
    raise ValueError(f"unknown learning-rate scaling {rule!r}; use none, linear or sqrt")
