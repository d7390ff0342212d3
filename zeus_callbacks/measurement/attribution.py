"""Pure functions: energy of time intervals from a stream of power samples.

Each sample ``(t_k, p_k)`` is read as the mean power over the interval
``(t_{k-1} - d, t_k - d]``, where ``d`` is the sensor delay (the H200's 20 ms samples
behave like an average over the preceding 10–20 ms, seen ~16 ms late; DESIGN.md).
Power is then a step function whose running integral ``F`` is piecewise linear, and
the energy of a window ``[a, b]`` is ``F(b) - F(a)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SampleCoverage:
    """Where the sample stream gives power, after the delay shift.

    Attributes:
        start_s: Earliest time with known power (s).
        end_s: Latest time with known power (s).
    """

    start_s: float
    end_s: float


def cumulative_energy(
    timestamps_s: np.ndarray, power_W: np.ndarray, *, sample_period_s: float, sensor_delay_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Return the knots ``(time_s, energy_J)`` of the running energy integral.

    Args:
        timestamps_s: Sample times, shape (n,), increasing (s).
        power_W: Sample values, shape (n,) (W).
        sample_period_s: Interval the first sample covers (later ones cover the gap
            since their predecessor) (s).
        sensor_delay_s: Shift applied to every sample (s).

    Returns:
        ``(knot_times_s, cumulative_J)``, each of shape (n + 1,); empty when n = 0.
    """
    if len(timestamps_s) == 0:
        return np.empty(0), np.empty(0)
    ends = np.asarray(timestamps_s, dtype=np.float64) - sensor_delay_s
    starts = np.empty_like(ends)
    starts[0] = ends[0] - sample_period_s
    starts[1:] = ends[:-1]
    knots = np.concatenate(([starts[0]], ends))
    energy = np.concatenate(([0.0], np.cumsum(np.asarray(power_W, dtype=np.float64) * (ends - starts))))
    return knots, energy


def interval_energy_J(
    knot_times_s: np.ndarray, cumulative_J: np.ndarray, starts_s: np.ndarray, ends_s: np.ndarray
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
