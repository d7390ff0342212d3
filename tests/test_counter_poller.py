"""The benchmarks' energy-counter references: ticks timed by a background poller (benchmarks/fg_common.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from fg_common import CounterPoller, fitted_power, mean_power_between, ticks_from_reads  # noqa: E402

from zeus_callbacks.backends.virtual import VirtualGPUBackend  # noqa: E402


def synthetic_reads(rng, *, power_W, seconds, read_s=(0.003, 0.005)):
    """An H200-like counter: ticks every 77-123 ms hold the exact energy at the tick; reads of
    3-5 ms back to back, each sampling the counter at a fixed point (60 %) of the call."""
    ticks = np.cumsum(rng.uniform(0.077, 0.123, int(seconds / 0.077) + 2))
    reads, t = [], 0.0
    while t < seconds:
        d = rng.uniform(*read_s)
        seen = ticks[ticks <= t + 0.6 * d]
        reads.append((t, t + d, power_W * seen[-1] if seen.size else 0.0))
        t += d
    return reads, ticks


def test_ticks_are_timed_within_their_stated_uncertainty():
    reads, true_ticks = synthetic_reads(np.random.default_rng(0), power_W=690.0, seconds=8.0)
    ticks = ticks_from_reads(reads)
    assert ticks.time_s.size == np.count_nonzero(true_ticks < ticks.time_s[-1] + 1e-9)
    late = ticks.time_s - true_ticks[: ticks.time_s.size]
    # Sampled at 60 % of each read: the tick lies within one read spacing before the read's
    # end, offset by at most the 40 % of a read after its sampling point.
    assert np.all(late >= 0) and np.all(late <= ticks.uncertainty_s + 0.4 * 0.005)
    assert np.all((ticks.uncertainty_s >= 0.003) & (ticks.uncertainty_s <= 0.005))


def test_mean_power_between_ticks_is_within_its_tick_bound_and_the_fit_within_its_se():
    rng = np.random.default_rng(1)
    for _ in range(5):
        reads, _ = synthetic_reads(rng, power_W=624.0, seconds=16.0)
        ticks = ticks_from_reads(reads)
        m = mean_power_between(ticks, 0.5, 15.5)
        assert abs(m["power_W"] / 624.0 - 1) <= m["rel_err"]
        assert 14.7 < m["t1_s"] - m["t0_s"] <= 15.0
        fit = fitted_power(ticks, 0.5, 15.5)
        assert abs(fit["power_W"] - 624.0) < 4 * fit["se_W"] and fit["ticks"] > 100
    with pytest.raises(ValueError, match="fewer than 2"):
        mean_power_between(ticks, 1.0, 1.01)


def _wait_until(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _last_tick_s(poller: CounterPoller) -> float:
    times = poller.ticks().time_s
    return float(times[-1]) if times.size else -np.inf


def test_poller_reads_the_virtual_counter_from_a_thread_while_the_gpu_is_busy():
    backend = VirtualGPUBackend(noise_W=0.0, utilization=0.0, read_only=True, seed=0)
    with CounterPoller(backend, min_interval_s=0.002) as poller:
        t0 = backend.clock.now_s()
        backend.set_utilization(1.0)
        time.sleep(0.8)  # the main thread is free: here it just waits
        t1 = backend.clock.now_s()
        # The thread goes on reading on its own until a tick after t1 closes the interval: waited for
        # (60 s only guards a hang), not assumed from how fast a loaded machine runs the thread.
        assert _wait_until(lambda: len(poller.reads()) > 100 and _last_tick_s(poller) > t1, timeout_s=60.0)
    reads = poller.reads()
    time.sleep(0.05)
    assert len(poller.reads()) == len(reads)  # the thread stopped on exit
    assert all(a <= b for a, b, _ in reads)
    m = mean_power_between(poller.ticks(), t0 + 0.05, t1)
    truth_W = backend.average_power_W(backend.power_limit_W(0))
    assert abs(m["power_W"] / truth_W - 1) <= m["rel_err"] + 1e-3 / (m["t1_s"] - m["t0_s"]) / truth_W  # 1 mJ floor
