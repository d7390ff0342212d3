"""Which of a job's trials are observations of their arm (:func:`observation_problem`), and which count against it."""

from __future__ import annotations

import math
from collections.abc import Sequence

from zeus_callbacks.store._base import TrialRecord

OBSERVATION_BOUNDS = {"cost": (1e-6, 1e18), "energy_J": (1e-6, 1e18), "time_s": (1e-6, 1e10)}
"""Physical range of a run's cost (J-equivalent), energy (J) and time (s): outside it a figure is not a
measurement. 1e-6 J is a microjoule (a GPU draws tens of watts at idle: any run measures far more);
1e18 J is 100 000 GPUs at 1 kW for 300 years; 1e10 s is 300 years. Within it the posterior maths
cannot overflow (squares of 1e18 are far below the float maximum)."""


def observation_problem(
    energy_J: float | None, time_s: float | None, cost: float | None, *, degraded: bool = False
) -> str | None:
    """Why a run's figures cannot be an observation of its arm, or None when they can.

    A GPU draws power whenever it runs, so a run's energy, time and cost are positive: a NaN, an
    infinity, a zero (a GPU lost for the whole run reads 0 J), a value outside
    :data:`OBSERVATION_BOUNDS` or a degraded measurement would give the arm a cost it does not
    have, and a 0 would become the job's best cost for good.

    ``energy_J`` (J) and ``time_s`` (s) None: unknown, not checked; ``cost`` (J-equivalent) None: no observation.
    """
    if degraded:
        return "the energy measurement is degraded (sensor faults): its energy is incomplete"
    for name, value in (("cost", cost), ("energy_J", energy_J), ("time_s", time_s)):
        if value is None:
            if name == "cost":
                return "the cost is unknown"
            continue
        if not math.isfinite(value):
            return f"{name} is {value!r}, not a finite number"
        if value <= 0:
            return f"{name} is {value:g}; a run's energy, time and cost are positive"
        low, high = OBSERVATION_BOUNDS[name]
        if not low <= value <= high:
            return f"{name} is {value:g}, outside the physical range [{low:g}, {high:g}]"
    return None


def is_observable_cost(cost: float | None) -> bool:
    """Whether ``cost`` is a finite cost within :data:`OBSERVATION_BOUNDS` (None: unknown, not one)."""
    low, high = OBSERVATION_BOUNDS["cost"]
    return cost is not None and math.isfinite(cost) and low <= cost <= high


def arm_failures(trials: Sequence[TrialRecord]) -> dict[int, tuple[int, str]]:
    """Per arm, its failures in a row at the end of its finished trials, and the last one's reason.

    A ``failed`` trial counts (the run raised, or the store marked its killed process failed); an
    interrupted one (a scheduler's SIGTERM, Ctrl-C) does not; any other finished trial resets the
    count. Running and withdrawn trials are skipped.

    Returns:
        Batch size → (failures in a row, reason of the last), for arms whose last finished trial failed.
    """
    out: dict[int, tuple[int, str]] = {}
    for trial in trials:
        if trial.status in ("running", "withdrawn"):
            continue
        if trial.status != "failed":
            out.pop(trial.batch_size, None)
            continue
        if trial.info.get("run_status") == "interrupted":
            continue
        count = out.get(trial.batch_size, (0, ""))[0] + 1
        out[trial.batch_size] = (count, failure_reason(trial))
    return out


def failure_reason(trial: TrialRecord) -> str:
    """Why a ``failed`` trial failed, in short: the store's ``reason`` (``process died``), else the run's ``error``.

    ``error`` is the exception's type and the first line of its message; a trial recorded before it was
    kept says ``the run failed``.
    """
    return str(trial.info.get("reason") or trial.info.get("error") or "the run failed")


def measurable_or_none(value: float | None) -> float | None:
    """``value`` when it is a finite number ≥ 0, else None (unknown): a store refuses a negative energy or time."""
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def best_target_value(trials: Sequence[TrialRecord], direction: str) -> float | None:
    """The best finite value of the target metric any of ``trials`` saw (``info["best_target_value"]``), or None.

    ``direction``: ``max`` (higher is better) or ``min``.
    """
    values = (t.info.get("best_target_value") for t in trials)
    seen = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    if not seen:
        return None
    return max(seen) if direction == "max" else min(seen)
