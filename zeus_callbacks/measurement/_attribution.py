"""Pure functions: energy of time intervals from a stream of power samples.

Each sample ``(t_k, p_k)`` is read as the mean power over the interval
``(t_{k-1} - d, t_k - d]``, where ``d`` is the sensor delay (the H200's 20 ms samples
behave like an average over the preceding 10–20 ms, seen ~16 ms late; docs/hardware.md#sample-semantics).
Power is then a step function whose running integral ``F`` is piecewise linear, and
the energy of a window ``[a, b]`` is ``F(b) - F(a)``.

Throughout, ``knot_times_s`` (s) and ``cumulative_J`` (J) are ``F``'s knots from
:func:`cumulative_energy`, shape (n,) each, and ``starts_s``, ``ends_s`` the windows' bounds,
shape (m,) each (s).
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
    """Energy of each interval ``[starts_s[i], ends_s[i]]`` from the running integral, shape (m,) (J).

    Times outside the covered span are clamped (no power is invented for them); callers check
    coverage first. Zeros when there are no knots.
    """
    starts_s = np.asarray(starts_s, dtype=np.float64)
    ends_s = np.asarray(ends_s, dtype=np.float64)
    if len(knot_times_s) == 0:
        return np.zeros_like(starts_s)
    return np.interp(ends_s, knot_times_s, cumulative_J) - np.interp(starts_s, knot_times_s, cumulative_J)


def extrapolated_energy_J(
    knot_times_s: np.ndarray,
    cumulative_J: np.ndarray,
    starts_s: ArrayLike,
    ends_s: ArrayLike,
    *,
    reach_s: float = np.inf,
) -> np.ndarray:
    """Energy of each interval, with the parts just outside the covered span extrapolated, shape (m,) (J).

    Like :func:`interval_energy_J`, but the parts up to ``reach_s`` (s; one sample period in the
    meter) before the first knot (of n ≥ 2) and after the last take the power of the nearest segment
    (a sensor that has not caught up); nothing is extrapolated further. Callers mark such windows
    incomplete; :func:`covered_energy_J` also says how much of each window is covered.
    """
    starts_s = np.asarray(starts_s, dtype=np.float64)
    ends_s = np.asarray(ends_s, dtype=np.float64)
    energy = interval_energy_J(knot_times_s, cumulative_J, starts_s, ends_s)
    cov_start, cov_end = knot_times_s[0], knot_times_s[-1]
    first_W = (cumulative_J[1] - cumulative_J[0]) / max(knot_times_s[1] - knot_times_s[0], 1e-12)
    last_W = (cumulative_J[-1] - cumulative_J[-2]) / max(knot_times_s[-1] - knot_times_s[-2], 1e-12)
    lo, hi = cov_start - reach_s, cov_end + reach_s
    energy += np.clip(np.minimum(ends_s, cov_start) - np.maximum(starts_s, lo), 0, None) * first_W
    energy += np.clip(np.minimum(ends_s, hi) - np.maximum(starts_s, cov_end), 0, None) * last_W
    return energy


def extended_integral_J(knot_times_s: np.ndarray, cumulative_J: np.ndarray, time_s: float, *, reach_s: float) -> float:
    """The running integral at one time, extended past the knots as :func:`extrapolated_energy_J` does.

    Within the knots F is interpolated; up to ``reach_s`` before the first knot or after the last it
    takes the nearest segment's power; further out it stays at its value ``reach_s`` out. So
    ``F(e) − F(s)`` is :func:`extrapolated_energy_J` over ``[s, e]``, and a caller that keeps ``F(s)``
    needs only the newest knots (n ≥ 2) for ``F(e)``. Returns the integral's value (J).
    """
    first, last = knot_times_s[0], knot_times_s[-1]
    t = min(max(time_s, first - reach_s), last + reach_s)
    if t < first:
        first_W = (cumulative_J[1] - cumulative_J[0]) / max(knot_times_s[1] - first, 1e-12)
        return float(cumulative_J[0] - (first - t) * first_W)
    if t > last:
        last_W = (cumulative_J[-1] - cumulative_J[-2]) / max(last - knot_times_s[-2], 1e-12)
        return float(cumulative_J[-1] + (t - last) * last_W)
    return float(np.interp(t, knot_times_s, cumulative_J))


def covered_energy_J(
    knot_times_s: np.ndarray, cumulative_J: np.ndarray, starts_s: ArrayLike, ends_s: ArrayLike, *, reach_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Energy of each interval over the part the samples cover, and that part's length.

    The samples cover ``[first knot - reach_s, last knot + reach_s]``: the knots' span and
    at most ``reach_s`` (one sample period) of extrapolation either side. A window outside
    it has no energy (NaN, reported as null), never a guess; one partly inside has the energy
    of its covered part, and its covered time says how much that is. Fewer than 2 knots cover nothing.

    Returns:
        ``(energy_J, covered_s)``, shapes (m,), (m,): NaN energy where ``covered_s`` is 0.
    """
    starts_s = np.asarray(starts_s, dtype=np.float64)
    ends_s = np.asarray(ends_s, dtype=np.float64)
    if len(knot_times_s) < 2:
        return np.full(starts_s.shape, np.nan), np.zeros(starts_s.shape)
    lo, hi = knot_times_s[0] - reach_s, knot_times_s[-1] + reach_s
    covered_s = np.clip(np.minimum(ends_s, hi) - np.maximum(starts_s, lo), 0, None)
    energy = extrapolated_energy_J(knot_times_s, cumulative_J, starts_s, ends_s, reach_s=reach_s)
    # A window of zero length inside the span is covered (0 J is its energy); one outside is not.
    inside = (starts_s <= hi) & (ends_s >= lo)
    energy = np.where((covered_s > 0) | inside, energy, np.nan)
    return energy, covered_s


def excluding_gaps(
    knot_times_s: np.ndarray,
    cumulative_J: np.ndarray,
    starts_s: np.ndarray,
    ends_s: np.ndarray,
    energy_J: np.ndarray,
    covered_s: np.ndarray,
    gaps_s: list[tuple[float, float]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Take stretches whose samples were lost out of the windows' energy and covered time.

    Across a lost stretch the running integral joins the samples either side with one straight line:
    one sample's power, a guess. A window over such a stretch keeps the energy and time of its other
    parts only (the stretch's share of the line is subtracted), so it reads as partly covered, never
    as measured over the stretch (:meth:`PowerSampler.sample_gaps`).

    ``energy_J`` (J) and ``covered_s`` (s), shape (m,), are the windows' figures from
    :func:`covered_energy_J` over n ≥ 2 knots; ``gaps_s`` the lost stretches ``(start_s, end_s)``
    on the knots' time base.

    Returns:
        ``(energy_J, covered_s, touched)``, shapes (m,): new arrays; ``touched`` marks the windows a
        stretch overlaps.
    """
    energy_J, covered_s = energy_J.copy(), covered_s.copy()
    touched = np.zeros(len(starts_s), dtype=bool)
    for gap_start_s, gap_end_s in gaps_s:
        lo = np.maximum(starts_s, max(gap_start_s, knot_times_s[0]))
        hi = np.minimum(ends_s, min(gap_end_s, knot_times_s[-1]))
        overlap = hi > lo
        if not overlap.any():
            continue
        bridged = interval_energy_J(knot_times_s, cumulative_J, lo[overlap], hi[overlap])
        energy_J[overlap] -= bridged
        covered_s[overlap] = np.maximum(covered_s[overlap] - (hi - lo)[overlap], 0.0)
        touched |= overlap
    energy_J = np.where(touched & (covered_s <= 0), np.nan, energy_J)  # nothing of it measured: unknown
    return energy_J, covered_s, touched


def samples_in(timestamps_s: np.ndarray, starts_s: np.ndarray, ends_s: np.ndarray, delay_s: float) -> np.ndarray:
    """Count samples whose (shifted) time falls inside each interval; shape (m,)."""
    shifted = np.asarray(timestamps_s) - delay_s
    return np.searchsorted(shifted, ends_s, side="right") - np.searchsorted(shifted, starts_s, side="left")


COUNTER_MIN_PERIODS = 20
"""A counter cross-check needs a span of at least this many counter update periods (how often it changes).

Each reading is stamped at the middle of the span its change can lie in, so a stamp is
off by at most half a counter update period ``P``: at power ``p`` the energy of a span of
``N`` periods is off by at most ``p·P`` (both ends), a share of at most ``1/N``
(5 % at 20 periods, 2 s on an H200); shorter spans give no cross-check (null)."""


COUNTER_TOO_FEW_READINGS = "fewer than two energy-counter readings"
"""Why a span has no counter figure: the counter was read less than twice (:func:`counter_energy`)."""

COUNTER_NOT_BRACKETED = (
    "the energy-counter readings do not bracket it (the first is more than one counter update period after its "
    "start, or the last more than one before its end)"
)
"""Why a span has no counter figure: no reading near enough to its start or its end (:func:`counter_energy`)."""


def counter_energy(
    reading_times_s: np.ndarray,
    readings_J: np.ndarray,
    start_s: float,
    end_s: float,
    *,
    min_span_s: float = 0.0,
    reach_s: float = 0.0,
) -> tuple[float | None, str | None]:
    """Energy between two times from energy-counter readings, linearly interpolated, or why there is none.

    Args:
        reading_times_s: Counter change times, shape (n,) (s).
        readings_J: Counter values, shape (n,) (J).
        start_s: Window start (s).
        end_s: Window end (s).
        min_span_s: Shortest span given a figure (s): :data:`COUNTER_MIN_PERIODS` counter
            periods in the session.
        reach_s: How far before the first stamp or after the last the counter may be
            extended at its nearest slope (s): one counter update period, the span a stamp's change
            can lie in (a reading stamped at its change is always a little older than its read).

    Returns:
        ``(energy_J, None)``, or ``(None, why)``, never a 0.0 that only means the counter did not
        tick: the span is shorter than ``min_span_s``, the counter
        was read less than twice (:data:`COUNTER_TOO_FEW_READINGS`), or its readings do not bracket the
        span within ``reach_s`` (:data:`COUNTER_NOT_BRACKETED`).
    """
    if end_s - start_s < min_span_s:
        return None, f"shorter than {min_span_s:g} s, the shortest span given a counter figure"
    if len(reading_times_s) < 2:
        return None, COUNTER_TOO_FEW_READINGS
    times = np.asarray(reading_times_s, dtype=np.float64)
    values = np.asarray(readings_J, dtype=np.float64)
    if times[0] - start_s > reach_s or end_s - times[-1] > reach_s:
        return None, COUNTER_NOT_BRACKETED
    # Bracketed within reach_s: the readings extended at their end slopes, as the sampler's integral is.
    at_end_J = extended_integral_J(times, values, end_s, reach_s=reach_s)
    return at_end_J - extended_integral_J(times, values, start_s, reach_s=reach_s), None
