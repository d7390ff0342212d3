"""From fitted θ (point estimate and bootstrap replicates) to the reported :class:`Superposition`.

The energies per execution are those :mod:`zeus_callbacks.measurement.finegrain` defines, with ``g``
a class's bin powers, ``w`` its mean bin widths and ``c`` the baseline; intervals are bootstrap
percentiles (:mod:`.bootstrap`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from zeus_callbacks.measurement.finegrain._superposition.design import Columns, Design
from zeus_callbacks.measurement.finegrain._superposition.results import ProfileEstimate, Superposition
from zeus_callbacks.measurement.finegrain._superposition.settings import DROPPED, SuperposeSettings
from zeus_callbacks.measurement.finegrain._superposition.solve import Problem
from zeus_callbacks.measurement.finegrain._superposition.timeline import Executions, Pauses


class ClassEnergy(NamedTuple):
    """Energy per execution of one class under one θ."""

    gross_J: float
    """Gross energy per execution (J)."""
    dynamic_J: float
    """Gross energy minus the baseline over the execution's duration (J)."""
    power_W: np.ndarray
    """The class's bin powers, shape (per_class,) (W); a view into θ."""


def class_widths(execs: Executions, design: Design) -> dict[str, np.ndarray]:
    """Mean bin widths of each class's executions, shape (per_class,) each (s)."""
    return {lab: design.widths_s[execs.labels == lab].mean(axis=0) for lab in design.columns.classes}


def class_energies(theta: np.ndarray, cols: Columns, widths_s: dict[str, np.ndarray]) -> dict[str, ClassEnergy]:
    """Energy per execution of every class under θ (see the module docstring), in class order."""
    c = theta[-1]
    n_pre, after = cols.n_pre, cols.n_pre + cols.n_bins
    out = {}
    for lab in cols.classes:
        w = widths_s[lab]
        g = theta[cols.of_class(lab)]
        dur = float(w[cols.inside].sum())
        gross = float(g[cols.inside] @ w[cols.inside]) + float((g[:n_pre] - c) @ w[:n_pre])
        gross += float((g[after:] - c) @ w[after:])
        out[lab] = ClassEnergy(gross, gross - c * dur, g)
    return out


def percentile_interval(values: list[float], fallback: float, alpha: float) -> tuple[float, float]:
    """The ``(alpha, 1 − alpha)`` quantiles of ``values``; ``(fallback, fallback)`` when there are none."""
    if not values:
        return (fallback, fallback)
    q = np.quantile(values, [alpha, 1 - alpha])
    return (float(q[0]), float(q[1]))


def baseline(settings: SuperposeSettings, prob: Problem, theta: np.ndarray) -> tuple[float | None, str]:
    """The reported baseline (W) and where it came from: given, fitted from idle samples, or unknown."""
    if settings.baseline_W is not None:
        return float(settings.baseline_W), "given"
    if prob.baseline_known:
        return float(theta[-1]), "idle samples"
    return None, "unknown"


def profile_estimate(
    label: str,
    executions: int,
    widths_s: np.ndarray,
    point: ClassEnergy,
    replicates: list[ClassEnergy],
    cols: Columns,
    alpha: float,
    has_baseline: bool,
) -> ProfileEstimate:
    """The :class:`ProfileEstimate` of one class from its energies under θ and under each replicate.

    ``alpha`` is each tail's share outside the interval; without a baseline the dynamic energies are None.
    """
    w = widths_s
    rel = np.cumsum(w) - w / 2 - (w[: cols.n_pre].sum())
    dur = float(w[cols.inside].sum())
    gross, dyn, g = point
    band = (
        np.quantile(np.array([r.power_W for r in replicates]), [alpha, 1 - alpha], axis=0)
        if replicates
        else (np.vstack([g, g]))
    )
    return ProfileEstimate(
        label=str(label),
        executions=executions,
        duration_s=dur,
        energy_J=gross,
        energy_ci_J=percentile_interval([r.gross_J for r in replicates], gross, alpha),
        dynamic_energy_J=dyn if has_baseline else None,
        dynamic_energy_ci_J=percentile_interval([r.dynamic_J for r in replicates], dyn, alpha)
        if has_baseline
        else None,
        time_s=rel,
        u=rel / dur if dur > 0 else rel,
        width_s=w,
        power_W=g.copy(),
        power_ci_W=np.asarray(band),
        mean_power_W=gross / dur if dur > 0 else math.nan,
    )


def subtracted_text(settings: SuperposeSettings) -> str:
    """Plain-words description of what ``dynamic_energy_J`` subtracts."""
    return (
        "dynamic_energy_J = energy_J - baseline_W x duration_s (idle power over the execution's own time); "
        "energy_J keeps it"
        + ("; the tail above baseline after the end is included in both" if settings.mode == "isolated" else "")
    )


def summarise(
    settings: SuperposeSettings,
    execs: Executions,
    gaps: Pauses,
    design: Design,
    prob: Problem,
    theta: np.ndarray,
    replicates: list[np.ndarray],
    idle_samples: int,
) -> Superposition:
    """Assemble the :class:`Superposition` from the point estimate θ and the replicates' θ.

    Every class but :data:`DROPPED` is reported; steady mode's pause and tail levels are None in
    isolated mode (no such columns) or where no sample meets them.
    """
    cols = design.columns
    tail = design.tail_block
    tail_any = bool(cols.n_tail and tail.any())
    widths = class_widths(execs, design)
    point = class_energies(theta, cols, widths)
    boots = [class_energies(th, cols, widths) for th in replicates]
    alpha = (1 - settings.confidence) / 2
    base, source = baseline(settings, prob, theta)
    profiles = {
        lab: profile_estimate(
            lab, int((execs.labels == lab).sum()), widths[lab], point[lab], [b[lab] for b in boots], cols, alpha,
            base is not None,
        )
        for lab in cols.classes
        if lab != DROPPED
    }  # fmt: skip
    return Superposition(
        mode=settings.mode,
        profiles=profiles,
        baseline_W=base,
        baseline_source=source,
        subtracted=subtracted_text(settings),
        samples_used=int(prob.matrix.shape[0]),
        idle_samples=int(idle_samples),
        sensor_delay_s=float(settings.sensor_delay_s),
        confidence=float(settings.confidence),
        n_boot=len(replicates),
        gap_power_W=float(theta[cols.gap]) if design.matrix[:, cols.gap].any() else None,
        gap_time_s=float((gaps.gap_hi_s - gaps.gap_lo_s).sum()),
        tail_power_W=float(tail.sum(axis=0) @ theta[cols.tail : -1] / tail.sum()) if tail_any else None,
        tail_time_s=float(np.clip(gaps.tail_hi_s - gaps.tail_lo_s, 0.0, None).sum()),
    )
