"""Tests of the ring buffer and the background power sampler."""

from __future__ import annotations

import logging
import math
import threading
import time

import numpy as np
import pytest

from zeus_callbacks.backends.base import NotSupported
from zeus_callbacks.measurement._ring import TimeSeriesRing
from zeus_callbacks.measurement._sampler import PowerSampler

THREAD_NAME = "zeus-power-sampler"
LOGGER = "zeus_callbacks"


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


HANG_GUARD_S = 30.0
"""How long a test waits for a background thread (s): a guard against a hang, never the claim. Passed as
``sensor_timeout_s`` too where a test is not about that timeout, so ``stop()`` waits for the thread to end."""


def wait_until(predicate, timeout_s: float = HANG_GUARD_S) -> bool:
    """Wait for a background thread to do something (not a speed assertion)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def warnings_in(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# -- ring buffer ------------------------------------------------------------------
def test_ring_keeps_only_the_newest_capacity_pairs():
    capacity = 8
    total = 10 * capacity
    ring = TimeSeriesRing(capacity)
    for k in range(total):
        ring.append(float(k), 2.0 * k)
    times, values = ring.arrays()
    assert len(ring) == capacity
    assert ring.dropped == total - capacity
    expected_times = np.arange(total - capacity, total, dtype=float)
    np.testing.assert_array_equal(times, expected_times)
    np.testing.assert_array_equal(values, 2.0 * expected_times)
    assert ring.last_time() == expected_times[-1]


def test_ring_before_it_fills():
    ring = TimeSeriesRing(4)
    assert len(ring) == 0
    assert ring.last_time() is None
    assert ring.arrays()[0].shape == (0,)
    ring.append(1.0, 10.0)
    ring.append(2.0, 20.0)
    times, values = ring.arrays()
    np.testing.assert_array_equal(times, [1.0, 2.0])
    np.testing.assert_array_equal(values, [10.0, 20.0])
    assert ring.dropped == 0


def test_ring_arrays_are_copies():
    ring = TimeSeriesRing(4)
    for k in range(6):
        ring.append(float(k), float(k))
    times, _ = ring.arrays()
    times[:] = -1.0
    assert ring.arrays()[0].min() >= 0.0


def test_ring_rejects_tiny_capacity():
    with pytest.raises(ValueError, match="capacity"):
        TimeSeriesRing(1)


# -- polling on a manual clock -------------------------------------------------------
def test_poll_once_collects_the_backend_samples(virtual_backend, manual_clock):
    sampler = PowerSampler(virtual_backend, [0])
    assert sampler.latest_sample_s() is None
    manual_clock.advance(1.0)
    sampler.poll_once()
    times, power = sampler.samples(0)
    reference = virtual_backend.power_samples_since(0, -math.inf)
    assert len(times) == len(reference) > 0
    np.testing.assert_allclose(times, [s.timestamp_s for s in reference])
    np.testing.assert_allclose(power, virtual_backend.true_power_W(0))
    assert sampler.latest_sample_s() == times[-1]
    assert times[-1] <= manual_clock.now_s()


def test_repeated_polls_do_not_duplicate_samples(virtual_backend, manual_clock):
    sampler = PowerSampler(virtual_backend, [0])
    for _ in range(5):
        manual_clock.advance(0.3)
        sampler.poll_once()
        sampler.poll_once()
    times, _ = sampler.samples(0)
    assert np.all(np.diff(times) > 0)
    reference = virtual_backend.power_samples_since(0, -math.inf)  # the backend keeps 2.4 s, we polled 1.5 s
    assert len(times) == len(reference)


def test_energy_counter_is_read_when_due(virtual_backend, manual_clock):
    period_s = 0.5
    sampler = PowerSampler(virtual_backend, [0], energy_counter_period_s=period_s)
    sampler.poll_once()  # first poll: due
    manual_clock.advance(period_s / 2)
    sampler.poll_once()  # not due yet
    assert len(sampler.counter_readings(0)[0]) == 1
    manual_clock.advance(period_s / 2)
    sampler.poll_once()  # due again
    times, energy = sampler.counter_readings(0)
    assert len(times) == 2
    # Stamped at the counter's change, not the read: the previous read is older than one counter
    # period, so the change lies in (now - period, now] and the stamp is its middle.
    assert times[-1] == pytest.approx(manual_clock.now_s() - virtual_backend.energy_counter_period_s / 2)
    assert energy[-1] == virtual_backend.energy_counter_J(0)


def test_sampler_needs_a_gpu(virtual_backend):
    with pytest.raises(ValueError):
        PowerSampler(virtual_backend, [])


# -- the background thread on the wall clock ---------------------------------------------
def test_start_and_stop_the_thread(wall_virtual_backend):
    before = len(sampler_threads())
    sampler = PowerSampler(wall_virtual_backend, [0], poll_period_s=0.01, sensor_timeout_s=HANG_GUARD_S)
    sampler.start()
    try:
        assert sampler.running
        assert len(sampler_threads()) == before + 1
        first = len(sampler.samples(0)[0])
        assert wait_until(lambda: len(sampler.samples(0)[0]) > first)  # the thread drains on its own
    finally:
        sampler.stop()
    assert not sampler.running
    assert len(sampler_threads()) == before
    collected = len(sampler.samples(0)[0])
    sampler.stop()  # idempotent
    assert not sampler.running
    assert len(sampler_threads()) == before
    assert len(sampler.samples(0)[0]) >= collected


def test_start_is_idempotent(wall_virtual_backend):
    before = len(sampler_threads())
    sampler = PowerSampler(wall_virtual_backend, [0], poll_period_s=0.01, sensor_timeout_s=HANG_GUARD_S)
    sampler.start()
    sampler.start()
    try:
        assert len(sampler_threads()) == before + 1
    finally:
        sampler.stop()
    assert len(sampler_threads()) == before


def test_a_paused_thread_resumes_without_losing_the_samples_of_the_pause(virtual_backend, manual_clock):
    """stop(final_drain=False) / start(first_poll=False): the thread only; the device's buffer covers the pause.

    The thread is real, the device's clock manual: the pause lasts 0.3 s of it however long the machine
    takes to restart the thread (on the wall clock a slow restart could outlast the device's 2.4 s buffer).
    """
    before = len(sampler_threads())
    sampler = PowerSampler(virtual_backend, [0], poll_period_s=0.01, sensor_timeout_s=HANG_GUARD_S)
    sampler.start()
    manual_clock.advance(0.1)
    assert wait_until(lambda: len(sampler.samples(0)[0]) > 3)
    sampler.stop(final_drain=False)
    assert not sampler.running and sampler.thread_native_id is None
    assert len(sampler_threads()) == before
    paused = len(sampler.samples(0)[0])
    manual_clock.advance(0.3)  # the device keeps 2.4 s of samples
    time.sleep(0.05)  # time for a thread left running to poll (it would take the new samples)
    assert len(sampler.samples(0)[0]) == paused  # nothing polled while paused
    sampler.start(first_poll=False)
    assert sampler.running and isinstance(sampler.thread_native_id, int)
    try:
        assert wait_until(lambda: len(sampler.samples(0)[0]) > paused)  # the thread's own poll drains them
    finally:
        sampler.stop()
    times = sampler.samples(0)[0]
    period = virtual_backend.sample_period_s
    assert np.diff(times).max() < 2 * period  # no hole where the pause was
    assert times[-1] - times[0] > 0.3


def test_stop_without_start_is_harmless(wall_virtual_backend):
    sampler = PowerSampler(wall_virtual_backend, [0])
    sampler.stop()
    assert not sampler.running


# -- faults --------------------------------------------------------------------------------
def test_sensor_errors_are_counted_and_warned_once(virtual_backend, manual_clock, caplog):
    failing_reads = 20
    sampler = PowerSampler(virtual_backend, [0])
    virtual_backend.inject_fault(reads=failing_reads, kind="gpu_lost", sensor="samples")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(failing_reads + 5):
            manual_clock.advance(0.1)
            sampler.poll_once()  # must not raise
    assert sampler.health.faults["gpu_lost"] == failing_reads
    assert sampler.health.degraded
    gpu_lost = [m for m in warnings_in(caplog) if "gpu_lost" in m]
    assert len(gpu_lost) == 1
    # The sensor recovered: samples flow again.
    assert len(sampler.samples(0)[0]) > 0


def test_each_fault_kind_is_warned_once(virtual_backend, manual_clock, caplog):
    sampler = PowerSampler(virtual_backend, [0])
    kinds = ["gpu_lost", "unknown_error"]
    reads_each = 3
    for kind in kinds:
        virtual_backend.inject_fault(reads=reads_each, kind=kind, sensor="samples")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(len(kinds) * reads_each + 2):
            manual_clock.advance(0.05)
            sampler.poll_once()
    assert dict(sampler.health.faults) == dict.fromkeys(kinds, reads_each)
    for kind in kinds:
        assert len([m for m in warnings_in(caplog) if kind in m]) == 1


def test_energy_counter_faults_are_contained(virtual_backend, manual_clock, caplog):
    failing_reads = 4
    sampler = PowerSampler(virtual_backend, [0])
    virtual_backend.inject_fault(reads=failing_reads, kind="gpu_lost", sensor="energy")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(failing_reads + 2):
            manual_clock.advance(0.1)
            sampler.poll_once(read_counter=True)
    assert sampler.health.faults["gpu_lost"] == failing_reads
    assert len([m for m in warnings_in(caplog) if "gpu_lost" in m]) == 1
    assert len(sampler.counter_readings(0)[0]) == 2  # the reads after the faults


def test_unexpected_exceptions_are_contained(virtual_backend, manual_clock, monkeypatch, caplog):
    polls = 6

    def broken(index, since_s):
        raise RuntimeError("driver bug")

    monkeypatch.setattr(virtual_backend, "power_samples_since", broken)
    sampler = PowerSampler(virtual_backend, [0])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(polls):
            manual_clock.advance(0.1)
            sampler.poll_once()
    assert sampler.health.faults["RuntimeError"] == polls
    messages = [m for m in warnings_in(caplog) if "RuntimeError" in m]
    assert len(messages) == 1
    assert "driver bug" in messages[0]


def test_faults_on_the_thread_do_not_kill_it(wall_virtual_backend):
    sampler = PowerSampler(wall_virtual_backend, [0], poll_period_s=0.01, sensor_timeout_s=HANG_GUARD_S)
    sampler.start()
    try:
        wall_virtual_backend.inject_fault(reads=3, kind="gpu_lost", sensor="samples")
        assert wait_until(lambda: sampler.health.faults["gpu_lost"] == 3)
        after_faults = sampler.latest_sample_s() or -math.inf
        assert wait_until(lambda: (sampler.latest_sample_s() or -math.inf) > after_faults)
        assert sampler.running
    finally:
        sampler.stop()


def test_energy_counter_going_backwards_is_detected_once(virtual_backend, manual_clock, monkeypatch, caplog):
    readings = [10.0, 20.0, 5.0, 25.0, 4.0, 3.0]
    feed = iter(readings)
    monkeypatch.setattr(virtual_backend, "energy_counter_J", lambda index: next(feed))
    sampler = PowerSampler(virtual_backend, [0])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in readings:
            manual_clock.advance(0.1)
            sampler.poll_once(read_counter=True)
    # Each backwards step is a counter reset (issue 16 item 2): not a fault, only the interval
    # across it is dropped (it adds nothing) and the series goes on from the new value.
    continued, backwards = [], 0
    for previous, value in zip([None, *readings], readings, strict=False):
        if previous is not None and value < previous:
            backwards += 1
            continued.append(continued[-1])
        else:
            continued.append(value if previous is None else continued[-1] + value - previous)
    assert sampler.health.counter_resets == backwards and "counter_backwards" not in sampler.health.faults
    assert not sampler.health.degraded
    np.testing.assert_array_equal(sampler.counter_readings(0)[1], continued)
    assert len(sampler.counter_gaps(0)) == backwards
    assert len([m for m in warnings_in(caplog) if "backwards" in m]) == 1


def test_unsupported_energy_counter_disables_cross_checks_once(virtual_backend, manual_clock, monkeypatch, caplog):
    calls = []

    def unsupported(index):
        calls.append(index)
        raise NotSupported("no energy counter on this device")

    monkeypatch.setattr(virtual_backend, "energy_counter_J", unsupported)
    sampler = PowerSampler(virtual_backend, [0])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(5):
            manual_clock.advance(0.1)
            sampler.poll_once(read_counter=True)
    assert calls == [0]  # asked once, then never again
    assert len(sampler.counter_readings(0)[0]) == 0
    assert not sampler.health.degraded  # a missing counter is not a fault
    assert len(warnings_in(caplog)) == 1
    assert len(sampler.samples(0)[0]) > 0  # power samples still flow


# -- memory ---------------------------------------------------------------------------------
def test_memory_stays_bounded(virtual_backend, manual_clock, monkeypatch):
    buffer_s = 1.0
    seen = []
    real = virtual_backend.power_samples_since

    def counting(index, since_s):
        samples = real(index, since_s)
        seen.extend(s.timestamp_s for s in samples)
        return samples

    monkeypatch.setattr(virtual_backend, "power_samples_since", counting)
    sampler = PowerSampler(virtual_backend, [0], buffer_s=buffer_s)
    expected_capacity = math.ceil(buffer_s / virtual_backend.sample_period_s)
    lengths = []
    for _ in range(40):
        manual_clock.advance(0.5)
        sampler.poll_once()
        lengths.append(len(sampler.samples(0)[0]))
    times, _ = sampler.samples(0)
    assert len(seen) > 10 * expected_capacity
    assert max(lengths) == expected_capacity
    assert lengths[-1] == expected_capacity
    assert sampler.health.dropped_samples == len(set(seen)) - expected_capacity
    np.testing.assert_array_equal(times, sorted(seen)[-expected_capacity:])  # the newest are kept


# -- a manual clock's long advance (issue 31) ------------------------------------------------------
def test_a_manual_clock_alarm_runs_at_each_due_time_inside_one_advance(manual_clock):
    origin = manual_clock.now_s()
    last = [origin]
    calls: list[float] = []

    def drain() -> None:
        calls.append(manual_clock.now_s())
        last[0] = manual_clock.now_s()

    token = manual_clock.add_alarm(lambda: last[0] + 1.0, drain)
    assert manual_clock.advance(3.5) == origin + 3.5
    assert calls == [origin + 1.0, origin + 2.0, origin + 3.0]  # stops where due, moves on to the end
    manual_clock.advance(0.5)  # due at origin + 4.0, not before the new time (origin + 4.0)
    assert len(calls) == 3
    manual_clock.remove_alarm(token)
    manual_clock.remove_alarm(token)  # idempotent
    manual_clock.advance(5.0)
    assert len(calls) == 3
    stuck: list[float] = []
    manual_clock.add_alarm(lambda: origin, lambda: stuck.append(manual_clock.now_s()))
    manual_clock.advance(1.0)  # an alarm that does not move its due time on runs once per advance, not forever
    assert stuck == [origin + 9.0]


def test_a_running_sampler_keeps_every_sample_of_a_manual_advance_longer_than_the_sensor_history(
    virtual_backend, manual_clock
):
    # Its thread runs on the wall clock and cannot drain inside one advance: before the clock's alarm, a 4 s
    # advance kept only the sensor's last 2.4 s (the first profiled 4 s step read 0.61 of its energy).
    history_s = virtual_backend.sample_history_s
    sampler = PowerSampler(virtual_backend, [0], sensor_timeout_s=HANG_GUARD_S)
    sampler.start()
    start_s = manual_clock.now_s()
    try:
        manual_clock.advance(history_s + 1.6)
        sampler.poll_once(read_counter=False)
    finally:
        sampler.stop()
    times = sampler.samples(0)[0]
    period = virtual_backend.sample_period_s
    assert times[0] - start_s < 2 * period  # from the advance's start ...
    assert np.diff(times).max() < 2 * period  # ... with no hole
    assert sampler.health.lost_sample_gaps == 0 and sampler.sample_gaps(0) == []


def test_samples_lost_before_a_drain_are_a_gap_no_window_gets_energy_from(virtual_backend, manual_clock, caplog):
    # Not started (as a stalled thread): a drain later than the sensor's history finds its oldest samples gone.
    history_s = virtual_backend.sample_history_s
    sampler = PowerSampler(virtual_backend, [0], sensor_timeout_s=HANG_GUARD_S)
    manual_clock.advance(0.5)
    sampler.poll_once(read_counter=False)
    kept_s = sampler.samples(0)[0][-1]
    manual_clock.advance(history_s + 1.6)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        sampler.poll_once(read_counter=False)
        manual_clock.advance(history_s + 1.6)
        sampler.poll_once(read_counter=False)
    times = sampler.samples(0)[0]
    first_s = times[times > kept_s][0]
    period = virtual_backend.sample_period_s
    assert first_s - kept_s > 1.6 - period  # the buffer held only its last 2.4 s
    gaps = sampler.sample_gaps(0)
    assert len(gaps) == 2 and sampler.health.lost_sample_gaps == 2
    assert gaps[0] == pytest.approx((kept_s, first_s - period))  # sensor_delay_s 0: knots at the samples' times
    assert sum("were lost" in m for m in warnings_in(caplog)) == 1  # once, then counted
