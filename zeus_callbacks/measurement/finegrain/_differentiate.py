"""Power-profile differentiation: first-execution, warming and steady-state profiles.

FinGraV (Singhania, Aga, Ibrahim, arXiv 2412.12426, 2024), challenge C4 (power variance
across executions): the first executions after idle draw a different power (rise, overshoot)
than executions in steady state; averaging them together misstates both (by up to ~80 % in
FinGraV's measurements). :func:`differentiate` fits the classes separately with
:func:`~zeus_callbacks.measurement.finegrain.superpose` and warns when their powers differ by
more than :data:`DIFFERENCE_WARNING`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zeus_callbacks.measurement.finegrain._superposition import DROPPED, Superposition, superpose

logger = logging.getLogger(__name__)

DIFFERENCE_WARNING = 0.10
"""Relative energy difference between first / warming / steady profiles that warrants a warning."""


@dataclass(frozen=True)
class Differentiation:
    """First-execution, warming and steady-state profiles (FinGraV power-profile differentiation, challenge C4).

    Attributes:
        result: The superposition with classes ``"first"``, ``"warming"``, ``"steady"``
            (a class without executions is absent).
        rel_diff: Relative energy difference of each class from ``"steady"``
            (``first``/``warming`` → ``(E_class − E_steady) / E_steady``).
        differs: Classes whose energy differs from steady by more than ``threshold``.
        threshold: The relative difference that triggers a warning.
    """

    result: Superposition
    rel_diff: dict[str, float] = field(default_factory=dict)
    differs: tuple[str, ...] = ()
    threshold: float = DIFFERENCE_WARNING


def position_labels(run_ids: Sequence[int] | np.ndarray, *, warm_executions: int = 5) -> np.ndarray:
    """Label each execution by its position in its run: first, warming or steady.

    A *run* is a burst of executions after idle (the same ``run_id``); its first
    execution starts from idle power, the next ``warm_executions`` may still be warming
    up (power overshoot and settling; docs/hardware.md#sample-semantics), the rest are steady.

    Args:
        run_ids: Run of each execution, in execution order, shape (n,).
        warm_executions: Executions after the first labelled ``"warming"``.

    Returns:
        Labels, shape (n,), dtype object.
    """
    ids = np.asarray(run_ids)
    labels = np.empty(ids.size, dtype=object)
    position = 0
    for i in range(ids.size):
        position = 0 if i == 0 or ids[i] != ids[i - 1] else position + 1
        labels[i] = "first" if position == 0 else ("warming" if position <= warm_executions else "steady")
    return labels


def differentiate(
    starts_s: Sequence[float] | np.ndarray,
    ends_s: Sequence[float] | np.ndarray,
    run_ids: Sequence[int] | np.ndarray,
    sample_times_s: Sequence[float] | np.ndarray,
    sample_power_W: Sequence[float] | np.ndarray,
    *,
    warm_executions: int = 5,
    threshold: float = DIFFERENCE_WARNING,
    keep: np.ndarray | None = None,
    n_bins: int = 2,
    **superpose_args: Any,
) -> Differentiation:
    """Separate first-execution / warming / steady-state profiles and compare their energies.

    FinGraV, challenge C4 (module docstring). Warns when a class's mean power differs from
    steady by more than ``threshold``.

    Args:
        starts_s: Execution starts, shape (n,) (s), in order.
        ends_s: Execution ends, shape (n,) (s).
        run_ids: Run (burst) of each execution, shape (n,).
        sample_times_s: Sample timestamps, shape (m,) (s).
        sample_power_W: Sample values, shape (m,) (W).
        warm_executions: Executions after the first counted as warming.
        threshold: Relative difference that triggers the warning (0.10 = 10 %).
        keep: Optional mask from :func:`bin_executions`; dropped executions are fitted
            under :data:`DROPPED` and not reported.
        n_bins: Profile bins per execution (few: the first-execution class has one
            execution per run, too few to resolve a fine shape).
        **superpose_args: Passed to :func:`~zeus_callbacks.measurement.finegrain.superpose`
            (``settings``, ``seed`` or fields of
            :class:`~zeus_callbacks.measurement.finegrain.SuperposeSettings`: ``mode``,
            ``sensor_delay_s``, ``n_boot``, ...).

    Returns:
        The :class:`Differentiation`.

    Raises:
        ValueError: As :func:`~zeus_callbacks.measurement.finegrain.superpose`.
        TypeError: An unknown keyword in ``superpose_args``.
    """
    labels = position_labels(run_ids, warm_executions=warm_executions)
    if keep is not None:
        labels = np.where(np.asarray(keep, bool), labels, DROPPED)
    result = superpose(starts_s, ends_s, sample_times_s, sample_power_W, labels=labels, n_bins=n_bins, **superpose_args)
    rel: dict[str, float] = {}
    differs = []
    steady = result.profiles.get("steady")
    if steady is not None and steady.energy_J:
        for lab in ("first", "warming"):
            prof = result.profiles.get(lab)
            if prof is None:
                continue
            # Compare power, not energy: a class may have a different mean duration.
            rel[lab] = (prof.mean_power_W - steady.mean_power_W) / steady.mean_power_W
            if abs(rel[lab]) > threshold:
                differs.append(lab)
    if differs:
        logger.warning(
            "zeus-callbacks: %s executions draw a power different from steady state by %s (> %.0f%%): "
            "report them separately (FinGraV power-profile differentiation)",
            "/".join(differs), ", ".join(f"{100 * rel[d]:+.0f}%" for d in differs), 100 * threshold,
        )  # fmt: skip
    return Differentiation(result, rel, tuple(differs), threshold)
