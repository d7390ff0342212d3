"""Pure functions: energy of time intervals from a stream of power samples.

Each sample ``(t_k, p_k)`` is read as the mean power over the interval
``(t_{k-1} - d, t_k - d]``, where ``d`` is the sensor delay (the H200's 20 ms samples
behave like an average over the preceding 10–20 ms, seen ~16 ms late; docs/hardware.md#sample-semantics).
Power is then a step function whose running integral ``F`` is piecewise linear, and
the energy of a window ``[a, b]`` is ``F(b) - F(a)``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def cumulative_energy(
    timestamps_s: np.ndarray,
    power_W: np.ndarray,
    *,
    sample_period_s: float,
    sensor_delay_s: float,
    previous_timestamp_s: float | None = None,
    start_J: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Return the knots ``(time_s, energy_J)`` of the running energy integral.

    Args:
        timestamps_s: Sample times, shape (n,), increasing (s).
        power_W: Sample values, shape (n,) (W).
        sample_period_s: Interval the first sample covers when it has no predecessor (s).
        sensor_delay_s: Shift applied to every sample (s).
        previous_timestamp_s: Time of the sample before these (s), to extend an
            integral already built; None starts a new one.
        start_J: Value of the integral at the first knot (J).

    Returns:
        ``(knot_times_s, cumulative_J)``: shape (n + 1,) for a new integral (its first
        knot is where the first sample's interval starts), shape (n,) when extending
        one; empty when n = 0.
    """
    if len(timestamps_s) == 0:
        return np.empty(0), np.empty(0)
    ends = np.asarray(timestamps_s, dtype=np.float64) - sensor_delay_s
    starts = np.empty_like(ends)
    starts[0] = ends[0] - sample_period_s if previous_timestamp_s is None else previous_timestamp_s - sensor_delay_s
    starts[1:] = ends[:-1]
    energy = start_J + np.cumsum(np.asarray(power_W, dtype=np.float64) * (ends - starts))
    if previous_timestamp_s is not None:
        return ends, energy
    return np.concatenate(([starts[0]], ends)), np.concatenate(([start_J], energy))


def interval_energy_J(
    knot_times_s: np.ndarray, cumulative_J: np.ndarray, starts_s: ArrayLike, ends_s: ArrayLike
) -> np.ndarray:
    """Energy of each interval ``[starts_s[i], ends_s[i]]`` from the running integral.

    Times outside the covered span are clamped (no power is invented for them);
    callers check coverage first.

    Args:
        knot_times_s: From :func:`cumulative_energy`, shape (n + 1,).
        cumulative_J: From :func:`cumulative_energy`, shape (n + 1,).
        starts_s: Interval starts, shape (m,) (s).
        ends_s: Interval ends, shape (m,) (s).

    Returns:
        Energies, shape (m,) (J); zeros when there are no samples.
    """
    starts_s = np.asarray(starts_s, dtype=np.float64)
    ends_s = np.asarray(ends_s, dtype=np.float64)
    if len(knot_times_s) == 0:
        return np.zeros_like(starts_s)
    return np.interp(ends_s, knot_times_s, cumulative_J) - np.interp(starts_s, knot_times_s, cumulative_J)


def extrapolated_energy_J(
    knot_times_s: np.ndarray, cumulative_J: np.ndarray, starts_s: ArrayLike, ends_s: ArrayLike
) -> np.ndarray:
    """Energy of each interval, with the parts outside the covered span extrapolated.

    Like :func:`interval_energy_J`, but those parts take the power of the nearest segment
    (a sensor that has not caught up, or a buffer that no longer reaches back); callers
    mark such windows incomplete.

    Args:
        knot_times_s: Running-integral knots, shape (n,), n ≥ 2.
        cumulative_J: Integral at the knots, shape (n,).
        starts_s: Interval starts, shape (m,) (s).
        ends_s: Interval ends, shape (m,) (s).

    Returns:
        Energies, shape (m,) (J).
    """
    starts_s = np.asarray(starts_s, dtype=np.float64)
    ends_s = np.asarray(ends_s, dtype=np.float64)
    energy = interval_energy_J(knot_times_s, cumulative_J, starts_s, ends_s)
    cov_start, cov_end = knot_times_s[0], knot_times_s[-1]
    first_W = (cumulative_J[1] - cumulative_J[0]) / max(knot_times_s[1] - knot_times_s[0], 1e-12)
    last_W = (cumulative_J[-1] - cumulative_J[-2]) / max(knot_times_s[-1] - knot_times_s[-2], 1e-12)
    energy += np.clip(np.minimum(ends_s, cov_start) - starts_s, 0, None) * first_W
    energy += np.clip(ends_s - np.maximum(starts_s, cov_end), 0, None) * last_W
    return energy


def samples_in(timestamps_s: np.ndarray, starts_s: np.ndarray, ends_s: np.ndarray, delay_s: float) -> np.ndarray:
    """Count samples whose (shifted) time falls inside each interval; shape (m,)."""
    shifted = np.asarray(timestamps_s) - delay_s
    return np.searchsorted(shifted, ends_s, side="right") - np.searchsorted(shifted, starts_s, side="left")


def counter_energy_J(
    reading_times_s: np.ndarray, readings_J: np.ndarray, start_s: float, end_s: float
) -> float | None:
    """Energy between two times from energy-counter readings, linearly interpolated.

    Args:
        reading_times_s: Counter read times, shape (n,) (s).
        readings_J: Counter values, shape (n,) (J).
        start_s: Window start (s).
        end_s: Window end (s).

    Returns:
        The energy (J), or None when the readings do not bracket the window.
    """
    if len(reading_times_s) < 2 or reading_times_s[0] > start_s or reading_times_s[-1] < end_s:
        return None
    return float(np.interp(end_s, reading_times_s, readings_J) - np.interp(start_s, reading_times_s, readings_J))
