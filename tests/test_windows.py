"""Tests of named measurement windows on a virtual GPU driven by a manual clock."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.measurement._sampler import PowerSampler
from zeus_callbacks.measurement._windows import ClockTimer, WindowMeter

POLL_S = 0.1  # manual seconds between sampler drains (well inside the backend's 2.4 s history)


def make_meter(backend, **kwargs) -> tuple[PowerSampler, WindowMeter]:
    sampler = PowerSampler(backend, list(range(backend.device_count())), sensor_delay_s=backend.sensor_delay_s)
    meter = WindowMeter(sampler, ClockTimer(backend.clock), **kwargs)
    return sampler, meter


def run_for(clock, sampler: PowerSampler, seconds: float) -> None:
    """Let manual time pass, draining the sensor every POLL_S like the sampler thread would."""
    remaining = seconds
    while remaining > 1e-12:
        dt = min(POLL_S, remaining)
        clock.advance(dt)
        sampler.poll_once()
        remaining -= dt


def settle(backend, clock, sampler) -> None:
    """Let two sample periods pass so samples cover everything closed so far."""
    run_for(clock, sampler, 2 * backend.sample_period_s)


def test_clock_timer_marks_the_clock(manual_clock):
    timer = ClockTimer(manual_clock)
    token = timer.mark()
    manual_clock.advance(1.5)
    assert timer.time_of(token) == token
    assert timer.mark() == manual_clock.now_s()


def test_window_energy_is_true_power_times_duration(virtual_backend, manual_clock):
    sampler, meter = make_meter(virtual_backend)
    run_for(manual_clock, sampler, 0.3)
    start_s = manual_clock.now_s()
    meter.begin("w", tag="x")
    run_for(manual_clock, sampler, 0.737)
    end_s = manual_clock.now_s()
    assert meter.end("w", more=1)
    settle(virtual_backend, manual_clock, sampler)
    (record,) = meter.resolve()
    power_W = virtual_backend.true_power_W(0)
    assert record.name == "w"
    assert (record.start_s, record.end_s) == (start_s, end_s)
    assert record.time_s == pytest.approx(end_s - start_s)
    assert record.energy_J == pytest.approx(power_W * (end_s - start_s), rel=1e-9)
    assert record.gpu_energy_J == pytest.approx((record.energy_J,))
    assert record.complete
    assert record.info == {"tag": "x", "more": 1}
    times, _ = sampler.samples(0)
    assert record.num_power_samples == np.count_nonzero((times >= start_s) & (times <= end_s))
    assert meter.pending_count == 0


def test_window_shorter_than_a_sample_period(virtual_backend, manual_clock):
    sampler, meter = make_meter(virtual_backend)
    run_for(manual_clock, sampler, 0.2)
    duration_s = virtual_backend.sample_period_s / 7
    meter.begin("tiny")
    manual_clock.advance(duration_s)
    meter.end("tiny")
    settle(virtual_backend, manual_clock, sampler)
    (record,) = meter.resolve()
    assert record.energy_J == pytest.approx(virtual_backend.true_power_W(0) * duration_s, rel=1e-6)


def test_window_across_a_power_change(virtual_backend, manual_clock):
    sampler, meter = make_meter(virtual_backend)
    run_for(manual_clock, sampler, 0.2)
    start_s = manual_clock.now_s()
    change_s = start_s + 0.5  # boundaries stay several sample periods away from the change
    virtual_backend.set_utilization(0.0, at_s=change_s)
    busy_W = virtual_backend.true_power_W(0, at_s=start_s)
    idle_W = virtual_backend.true_power_W(0, at_s=change_s)
    assert idle_W < busy_W
    meter.begin("w")
    run_for(manual_clock, sampler, 1.0)
    end_s = manual_clock.now_s()
    meter.end("w")
    settle(virtual_backend, manual_clock, sampler)
    (record,) = meter.resolve()
    truth = busy_W * (change_s - start_s) + idle_W * (end_s - change_s)
    assert record.energy_J == pytest.approx(truth, rel=1e-9)


def test_energy_per_gpu_and_summed(manual_clock):
    offsets_W = [0.0, 45.0]
    backend = VirtualGPUBackend(
        clock=manual_clock, noise_W=0.0, num_devices=len(offsets_W), power_offset_W=offsets_W, read_only=True
    )
    sampler, meter = make_meter(backend)
    run_for(manual_clock, sampler, 0.2)
    start_s = manual_clock.now_s()
    meter.begin("w")
    run_for(manual_clock, sampler, 0.6)
    duration_s = manual_clock.now_s() - start_s
    meter.end("w")
    settle(backend, manual_clock, sampler)
    (record,) = meter.resolve()
    expected = [backend.true_power_W(d) * duration_s for d in range(len(offsets_W))]
    assert record.gpu_energy_J == pytest.approx(expected, rel=1e-9)
    assert record.energy_J == pytest.approx(sum(expected), rel=1e-9)


def test_windows_wait_for_samples(virtual_backend, manual_clock):
    sampler, meter = make_meter(virtual_backend)
    meter.begin("w")
    manual_clock.advance(0.5)
    meter.end("w")
    assert meter.resolve() == []  # nothing drained yet
    assert meter.pending_count == 1
    sampler.poll_once()
    assert meter.resolve() == []  # samples reach only up to the window's end, not past it
    assert meter.pending_count == 1
    manual_clock.advance(2 * virtual_backend.sample_period_s)
    assert meter.resolve() == []  # time passed but nothing was drained
    sampler.poll_once()
    (record,) = meter.resolve()
    assert record.complete
    assert meter.pending_count == 0


def test_final_resolves_everything_and_marks_it_incomplete(virtual_backend, manual_clock):
    sampler, meter = make_meter(virtual_backend)
    run_for(manual_clock, sampler, 0.2)
    start_s = manual_clock.now_s()
    meter.begin("a")
    meter.begin("b")
    run_for(manual_clock, sampler, 0.4)
    meter.end("a")
    meter.end("b")
    end_s = manual_clock.now_s()
    assert meter.resolve() == []
    records = meter.resolve(final=True)
    assert [r.name for r in records] == ["a", "b"]
    assert meter.pending_count == 0
    power_W = virtual_backend.true_power_W(0)
    for record in records:
        assert not record.complete
        # The uncovered tail takes the nearest sample's power: exact for constant power.
        assert record.energy_J == pytest.approx(power_W * (end_s - start_s), rel=1e-9)


def test_final_without_any_sample(virtual_backend, manual_clock):
    _, meter = make_meter(virtual_backend)
    meter.begin("w")
    manual_clock.advance(0.3)
    meter.end("w")
    (record,) = meter.resolve(final=True)
    assert not record.complete
    assert record.num_power_samples == 0
    # No sample covers it: its energy is unknown (null in the records), never 0 J (issue 16 item 2).
    assert math.isnan(record.energy_J) and record.covered_s == 0.0


def test_nested_windows_of_different_names(virtual_backend, manual_clock):
    sampler, meter = make_meter(virtual_backend)
    run_for(manual_clock, sampler, 0.2)
    before_s, inner_s, after_s = 0.3, 0.45, 0.25
    meter.begin("outer")
    run_for(manual_clock, sampler, before_s)
    meter.begin("inner")
    run_for(manual_clock, sampler, inner_s)
    assert meter.is_open("outer") and meter.is_open("inner")
    meter.end("inner")
    run_for(manual_clock, sampler, after_s)
    meter.end("outer")
    settle(virtual_backend, manual_clock, sampler)
    inner, outer = meter.resolve()  # in the order they were closed
    power_W = virtual_backend.true_power_W(0)
    assert (inner.name, outer.name) == ("inner", "outer")
    assert inner.energy_J == pytest.approx(power_W * inner_s, rel=1e-6)
    assert outer.energy_J == pytest.approx(power_W * (before_s + inner_s + after_s), rel=1e-6)
    assert outer.start_s < inner.start_s < inner.end_s < outer.end_s


def test_reopening_a_name_warns_once_and_restarts(virtual_backend, manual_clock, caplog):
    sampler, meter = make_meter(virtual_backend)
    run_for(manual_clock, sampler, 0.2)
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        for _ in range(4):
            meter.begin("w")
            run_for(manual_clock, sampler, 0.1)
        last_begin_s = manual_clock.now_s() - 0.1
        meter.end("w")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "'w'" in warnings[0]
    settle(virtual_backend, manual_clock, sampler)
    (record,) = meter.resolve()
    assert record.start_s == pytest.approx(last_begin_s)


def test_end_of_a_window_that_is_not_open(virtual_backend):
    _, meter = make_meter(virtual_backend)
    assert meter.end("never") is False
    assert meter.pending_count == 0


def test_windows_go_stale_when_the_sensor_dies(virtual_backend, manual_clock):
    stale_after_s = 1.0
    sampler, meter = make_meter(virtual_backend, stale_after_s=stale_after_s)
    run_for(manual_clock, sampler, 0.2)
    start_s = manual_clock.now_s()
    meter.begin("w")
    run_for(manual_clock, sampler, 0.3)
    end_s = manual_clock.now_s()
    meter.end("w")
    virtual_backend.inject_fault(reads=10**6, kind="gpu_lost", sensor="any")  # samples and counter both dead
    run_for(manual_clock, sampler, stale_after_s / 2)
    assert meter.resolve() == []  # not stale yet: the sensor may still catch up
    run_for(manual_clock, sampler, stale_after_s)
    (record,) = meter.resolve()
    assert sampler.health.faults["gpu_lost"] > 0
    assert not record.complete
    assert (record.start_s, record.end_s) == (start_s, end_s)
    # Samples covered the start; the uncovered tail, shorter than one sample period, takes the last
    # sample's (constant) power (no more is ever extrapolated: tests/test_honest_figures.py).
    assert record.covered_s == pytest.approx(end_s - start_s, rel=1e-9)
    assert record.energy_J == pytest.approx(virtual_backend.true_power_W(0) * (end_s - start_s), rel=1e-9)
    assert meter.pending_count == 0


def test_pending_windows_do_not_pile_up_with_a_dead_sensor(virtual_backend, manual_clock):
    stale_after_s = 0.5
    window_s = 0.1
    sampler, meter = make_meter(virtual_backend, stale_after_s=stale_after_s)
    # Samples and counter both dead (with the counter alive it takes the stream's place).
    virtual_backend.inject_fault(reads=10**6, kind="gpu_lost", sensor="any")
    closed, resolved, most_pending = 0, [], 0
    for _ in range(100):
        meter.begin("step")
        run_for(manual_clock, sampler, window_s)
        meter.end("step")
        closed += 1
        resolved += meter.resolve()
        most_pending = max(most_pending, meter.pending_count)
    assert most_pending <= math.ceil(stale_after_s / window_s) + 1
    assert len(resolved) + meter.pending_count == closed
    assert all(not r.complete for r in resolved)


def test_a_window_over_lost_samples_counts_only_what_the_samples_cover(virtual_backend, manual_clock):
    # A drain later than the sensor's history loses its oldest samples (issue 31): the integral bridges the
    # stretch with one straight line. A window over it keeps only its other parts; one inside it is unknown.
    sampler, meter = make_meter(virtual_backend)
    run_for(manual_clock, sampler, 0.5)
    history_s = virtual_backend.sample_history_s
    meter.begin("across")  # begins while samples are drained: its first part is covered
    run_for(manual_clock, sampler, 0.4)
    manual_clock.advance(0.3)
    meter.begin("inside")  # wholly in the stretch the drain below misses
    manual_clock.advance(0.2)
    meter.end("inside")
    manual_clock.advance(history_s + 0.5)  # no drain: the oldest samples leave the sensor's buffer
    sampler.poll_once()
    run_for(manual_clock, sampler, 0.4)
    meter.end("across")
    settle(virtual_backend, manual_clock, sampler)
    records = {r.name: r for r in meter.resolve()}
    (gap,) = sampler.sample_gaps(0)
    across, inside = records["across"], records["inside"]
    lost_s = min(gap[1], across.end_s) - max(gap[0], across.start_s)
    assert lost_s > 0.5  # the stretch is a real part of the window
    assert across.covered_s == pytest.approx(across.time_s - lost_s, rel=1e-9)
    assert not across.complete
    # Its energy is its covered time at the true power (the virtual GPU's load is steady here).
    power_W = virtual_backend.true_power_W(0)
    assert across.energy_J == pytest.approx(power_W * across.covered_s, rel=0.05)
    assert math.isnan(inside.energy_J) and inside.covered_s == 0 and not inside.complete
