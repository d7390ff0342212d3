"""What a whole job pays for a power-limit search: job-total regret on the noise-free curve.

A search spends its first steps at the limits it profiles, then runs the rest of the job at
the limit it chose. For a job of ``N`` training steps the total cost, priced on the true
(noise-free) curve, is::

    total = sum(cost(limit of step i) for the first min(S, N) steps) + max(N − S, 0) · cost(chosen)

where ``S`` is the number of steps the search ran before it decided (warm-up included: the
job pays them too). The regret is ``total / (N · cost at the true optimum) − 1``: 0 for a job
that ran at the optimum from its first step, 0.01 for one that paid 1 % more.

Used by ``benchmarks/power_limit_families.py`` and ``benchmarks/power_limit_search.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

JOB_STEPS = (2_000, 10_000, 50_000)  # training steps of the jobs the regret is reported for


def job_regret(step_costs: Sequence[float], chosen_cost: float, best_cost: float, n_steps: int) -> float:
    """Job-total regret of a search that ran ``step_costs`` before choosing a limit of cost ``chosen_cost``.

    Args:
        step_costs: true cost per step (any unit, e.g. J or the Zeus cost) of each step the
            search ran before it decided, in order, shape ``(S,)``.
        chosen_cost: true cost per step at the chosen limit (same unit).
        best_cost: true cost per step at the curve's optimum (same unit), > 0.
        n_steps: training steps of the job, > 0. When ``S > n_steps`` the job ends before the
            search decides: only its first ``n_steps`` steps are paid.

    Returns:
        ``total / (n_steps · best_cost) − 1`` (dimensionless; 0.01 is 1 %). Negative only if a
        step costs less than ``best_cost`` (e.g. ``max_slowdown`` priced in energy at a limit
        slower than allowed).

    Raises:
        ValueError: if ``n_steps`` ≤ 0 or ``best_cost`` ≤ 0 or is not finite.
    """
    if n_steps <= 0:
        raise ValueError(f"n_steps must be > 0, got {n_steps}")
    if not 0.0 < best_cost < float("inf"):
        raise ValueError(f"best_cost must be finite and > 0, got {best_cost}")
    paid = list(step_costs[:n_steps])
    total = sum(paid) + (n_steps - len(paid)) * chosen_cost
    return total / (n_steps * best_cost) - 1.0


def regret_ratio(ours: float, sweep: float) -> float | None:
    """Our regret over the sweep's, or None where the sweep's regret is not > 0 (no ratio to take)."""
    return ours / sweep if sweep > 0.0 else None
