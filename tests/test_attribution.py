"""Tests of the pure attribution functions on synthetic sample streams with known truth."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeus_callbacks.measurement._attribution import (
    COUNTER_NOT_BRACKETED,
    COUNTER_TOO_FEW_READINGS,
    counter_energy,
    cumulative_energy,
    extrapolated_energy_J,
    interval_energy_J,
    samples_in,
)

PERIOD_S = 0.02
DELAY_S = 0.016
T0_S = 5.0


def regular_stream(n: int, power_W: float, delay_s: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    times = T0_S + PERIOD_S * np.arange(1, n + 1) + delay_s
    return times, np.full(n, power_W)


def energy(times, power, starts, ends, *, delay_s: float) -> np.ndarray:
    knots, cumulative = cumulative_energy(times, power, sample_period_s=PERIOD_S, sensor_delay_s=delay_s)
    return interval_energy_J(knots, cumulative, np.asarray(starts, float), np.asarray(ends, float))


def test_cumulative_energy_of_constant_power():
    n, power_W = 100, 250.0
    times, power = regular_stream(n, power_W)
    knots, cumulative = cumulative_energy(times, power, sample_period_s=PERIOD_S, sensor_delay_s=0.0)
    assert knots.shape == cumulative.shape == (n + 1,)
    assert knots[0] == pytest.approx(times[0] - PERIOD_S)
    np.testing.assert_allclose(knots[1:], times)
    assert cumulative[0] == 0.0
    assert cumulative[-1] == pytest.approx(power_W * n * PERIOD_S)
    assert np.all(np.diff(cumulative) > 0)


def test_delay_shifts_the_knots():
    times, power = regular_stream(10, 100.0)
    knots, _ = cumulative_energy(times, power, sample_period_s=PERIOD_S, sensor_delay_s=DELAY_S)
    np.testing.assert_allclose(knots[1:], times - DELAY_S)


def test_constant_power_times_duration_for_many_windows():
    power_W = 312.5
    times, power = regular_stream(200, power_W)
    starts = np.array([T0_S + 0.5, T0_S + 1.003, T0_S + 2.0, T0_S + 3.001])
    durations = np.array([1.0, 0.0004, 0.013, 0.5])  # including windows far shorter than a sample period
    got = energy(times, power, starts, starts + durations, delay_s=0.0)
    assert got.shape == starts.shape
    np.testing.assert_allclose(got, power_W * durations, rtol=1e-9)


def test_irregular_sample_times_do_not_matter_for_constant_power():
    rng = np.random.default_rng(7)
    power_W = 180.0
    gaps = rng.uniform(0.5 * PERIOD_S, 1.5 * PERIOD_S, 300)
    times = T0_S + np.cumsum(gaps)
    start, end = times[10] + 0.0031, times[250] - 0.0077
    got = energy(times, np.full(len(times), power_W), [start], [end], delay_s=0.0)
    assert got[0] == pytest.approx(power_W * (end - start), rel=1e-9)


def step_change_stream(low_W: float, high_W: float, change_index: int, n: int):
    """Samples of a power step at ``T0 + change_index·PERIOD``, each reported ``DELAY_S`` late.

    Sample k (k = 1..n) is the mean power over ``(T0 + (k-1)·PERIOD, T0 + k·PERIOD]`` and
    carries the timestamp ``T0 + k·PERIOD + DELAY_S``.
    """
    k = np.arange(1, n + 1)
    times = T0_S + PERIOD_S * k + DELAY_S
    power = np.where(k <= change_index, low_W, high_W).astype(float)
    change_s = T0_S + PERIOD_S * change_index
    return times, power, change_s


def test_step_change_with_sensor_delay_is_attributed_to_the_right_time():
    low_W, high_W = 100.0, 400.0
    times, power, change_s = step_change_stream(low_W, high_W, change_index=50, n=120)
    start, end = change_s - 0.3037, change_s + 0.4211
    truth = low_W * (change_s - start) + high_W * (end - change_s)
    shifted = energy(times, power, [start], [end], delay_s=DELAY_S)[0]
    assert shifted == pytest.approx(truth, rel=1e-9)
    # Ignoring the delay attributes the step DELAY_S too late: the window loses (high - low)·delay.
    unshifted = energy(times, power, [start], [end], delay_s=0.0)[0]
    assert unshifted == pytest.approx(truth - (high_W - low_W) * DELAY_S, rel=1e-9)


def test_windows_on_either_side_of_a_step_see_their_own_power():
    low_W, high_W = 120.0, 480.0
    times, power, change_s = step_change_stream(low_W, high_W, change_index=40, n=100)
    before = (change_s - 0.2, change_s - 0.1)
    after = (change_s + 0.1, change_s + 0.15)
    got = energy(times, power, [before[0], after[0]], [before[1], after[1]], delay_s=DELAY_S)
    expected = [low_W * (before[1] - before[0]), high_W * (after[1] - after[0])]
    np.testing.assert_allclose(got, expected, rtol=1e-9)


def test_no_power_is_invented_outside_the_covered_span():
    power_W = 200.0
    times, power = regular_stream(50, power_W)
    knots, cumulative = cumulative_energy(times, power, sample_period_s=PERIOD_S, sensor_delay_s=0.0)
    first, last = knots[0], knots[-1]
    starts = np.array([first - 2.0, first - 0.5, last - 0.1, last + 1.0])
    ends = np.array([first - 1.0, first + 0.2, last + 0.5, last + 2.0])
    got = interval_energy_J(knots, cumulative, starts, ends)
    # Only the part of each interval inside [first, last] has power.
    covered_s = np.clip(np.minimum(ends, last) - np.maximum(starts, first), 0.0, None)
    assert covered_s[0] == covered_s[-1] == 0.0
    np.testing.assert_allclose(got, power_W * covered_s, atol=1e-9)


def test_empty_stream():
    knots, cumulative = cumulative_energy(np.array([]), np.array([]), sample_period_s=PERIOD_S, sensor_delay_s=0.0)
    assert knots.shape == cumulative.shape == (0,)
    got = interval_energy_J(knots, cumulative, np.array([1.0, 2.0]), np.array([1.5, 3.0]))
    np.testing.assert_array_equal(got, np.zeros(2))


# -- energy counter -------------------------------------------------------------------------
def test_counter_energy_interpolates_between_bracketing_readings():
    rate_W, origin_J = 150.0, 12_345.0  # the counter's origin is arbitrary
    times = np.array([10.0, 11.0, 12.0, 13.0])
    readings = origin_J + rate_W * (times - times[0])
    start, end = 10.25, 12.5
    assert counter_energy(times, readings, start, end)[0] == pytest.approx(rate_W * (end - start))
    assert counter_energy(times, readings, times[0], times[-1])[0] == pytest.approx(readings[-1] - readings[0])


@pytest.mark.parametrize(
    ("start", "end"),
    [(9.5, 12.0), (10.0, 13.5), (8.0, 14.0)],
)
def test_counter_energy_is_none_without_bracketing_readings(start, end):
    times = np.array([10.0, 11.0, 12.0, 13.0])
    assert counter_energy(times, 100.0 * times, start, end)[0] is None


def test_counter_energy_needs_two_readings():
    assert counter_energy(np.array([]), np.array([]), 1.0, 2.0)[0] is None
    assert counter_energy(np.array([1.0]), np.array([5.0]), 1.0, 1.0)[0] is None


def test_a_missing_counter_figure_says_why():
    times = np.array([10.0, 11.0, 12.0, 13.0])
    assert counter_energy(times, 100.0 * times, 9.5, 12.0) == (None, COUNTER_NOT_BRACKETED)  # starts too early
    assert counter_energy(times, 100.0 * times, 10.0, 13.5) == (None, COUNTER_NOT_BRACKETED)  # ends too late
    assert counter_energy(np.array([1.0]), np.array([5.0]), 1.0, 2.0) == (None, COUNTER_TOO_FEW_READINGS)
    energy, why = counter_energy(times, 100.0 * times, 10.5, 11.0, min_span_s=2.0)
    assert energy is None and why is not None and "2 s" in why
    # Within reach of a period past the last reading the counter is extended: a figure, no reason.
    assert counter_energy(times, 100.0 * times, 10.0, 13.05, reach_s=0.1) == (pytest.approx(305.0), None)


# -- sample counts ----------------------------------------------------------------------------
def test_samples_in_counts_shifted_samples_inside_each_interval():
    rng = np.random.default_rng(3)
    times = np.sort(rng.uniform(0.0, 10.0, 500))
    starts = rng.uniform(0.0, 9.0, 40)
    ends = starts + rng.uniform(0.0, 1.0, 40)
    got = samples_in(times, starts, ends, DELAY_S)
    expected = [sum(1 for t in times if s <= t - DELAY_S <= e) for s, e in zip(starts, ends, strict=True)]
    assert got.shape == starts.shape
    np.testing.assert_array_equal(got, expected)


def test_samples_in_window_shorter_than_a_period_may_hold_none():
    times, _ = regular_stream(20, 1.0)
    start = times[5] + PERIOD_S / 4
    got = samples_in(times, np.array([start]), np.array([start + PERIOD_S / 2]), 0.0)
    np.testing.assert_array_equal(got, [0])


def test_extending_the_integral_in_batches_equals_building_it_at_once():
    from zeus_callbacks.measurement._attribution import cumulative_energy as ce

    rng = np.random.default_rng(3)
    times = np.cumsum(rng.uniform(0.015, 0.025, 40)) + 100.0
    power = rng.uniform(100.0, 300.0, 40)
    knots, energy = ce(times, power, sample_period_s=0.02, sensor_delay_s=0.004)
    head_k, head_E = ce(times[:15], power[:15], sample_period_s=0.02, sensor_delay_s=0.004)
    tail_k, tail_E = ce(times[15:], power[15:], sample_period_s=0.02, sensor_delay_s=0.004,
                        previous_timestamp_s=times[14], start_J=head_E[-1])  # fmt: skip
    np.testing.assert_allclose(np.concatenate((head_k, tail_k)), knots)
    np.testing.assert_allclose(np.concatenate((head_E, tail_E)), energy)


def test_extrapolated_energy_uses_the_nearest_segment_outside_the_span():
    from zeus_callbacks.measurement._attribution import extrapolated_energy_J

    knots = np.array([10.0, 11.0, 12.0])
    cumulative = np.array([0.0, 100.0, 300.0])  # 100 W, then 200 W
    inside, before, after = extrapolated_energy_J(knots, cumulative, [10.5, 9.0, 11.5], [11.5, 10.5, 13.0])
    assert inside == pytest.approx(0.5 * 100.0 + 0.5 * 200.0)
    assert before == pytest.approx(1.0 * 100.0 + 0.5 * 100.0)  # the first segment's power before the span
    assert after == pytest.approx(0.5 * 200.0 + 1.0 * 200.0)  # the last segment's power after it


@settings(max_examples=200, deadline=None)
@given(
    powers=st.lists(st.floats(0.0, 800.0), min_size=2, max_size=30),
    gaps=st.lists(st.floats(0.001, 0.5), min_size=30, max_size=30),
    ends=st.tuples(st.floats(-1.0, 1.0), st.floats(0.0, 1.0)),
    reach_s=st.floats(0.0, 0.2),
)
def test_the_extended_integral_differences_are_the_extrapolated_energy(powers, gaps, ends, reach_s):
    """The run's total so far keeps F at the start and reads F now (issue 28: a call no longer walks the
    whole run's knots). F(e) − F(s) must be the extrapolated energy of [s, e] for any s ≤ e."""
    from zeus_callbacks.measurement._attribution import extended_integral_J

    times = 100.0 + np.cumsum(gaps[: len(powers)])
    knots, cumulative = cumulative_energy(times, np.array(powers), sample_period_s=0.02, sensor_delay_s=0.0)
    span = knots[-1] - knots[0]
    start = knots[0] + ends[0] * span  # from before the knots to inside them
    end = start + ends[1] * (knots[-1] + 1.0 - start)  # up to past the last knot
    want = extrapolated_energy_J(knots, cumulative, [start], [end], reach_s=reach_s)[0]
    got = extended_integral_J(knots, cumulative, end, reach_s=reach_s) - extended_integral_J(
        knots, cumulative, start, reach_s=reach_s
    )
    assert got == pytest.approx(want, rel=1e-9, abs=1e-6 * (1.0 + abs(cumulative[-1])))
