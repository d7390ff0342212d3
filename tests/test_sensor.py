"""Sensor characterisation: the delay fit on a synthetic delayed stream, and the virtual GPU end to end."""

from __future__ import annotations

import numpy as np
import pytest

from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.measurement._sensor import characterise_sensor, fit_sensor_delay


@pytest.mark.parametrize("delay_s", [0.0, 0.006, 0.016])
def test_fit_recovers_a_planted_delay(delay_s):
    rng = np.random.default_rng(0)
    on, off, period = 1.0, 2.0, 0.02
    t = np.arange(0.0, 3.0, period) + rng.uniform(-0.001, 0.001, 150) + 0.0037

    def mean_power(a, b):  # idle 120 W, busy 700 W on [on, off)
        busy = np.clip(np.minimum(b, off) - np.maximum(a, on), 0, None)
        return (120 * (b - a - busy) + 700 * busy) / (b - a)

    p = np.r_[120.0, mean_power(t[:-1] - delay_s, t[1:] - delay_s)] + rng.normal(0, 2, t.size)
    d, idle_W, busy_W, rmse = fit_sensor_delay(t, p, on, off)
    assert d == pytest.approx(delay_s, abs=0.0015)
    assert idle_W == pytest.approx(120, abs=2) and busy_W == pytest.approx(700, abs=3) and rmse < 5


def test_characterise_the_virtual_gpu_and_cache_it(tmp_path):
    clock = ManualClock(500.0)
    backend = VirtualGPUBackend(clock=clock, noise_W=1.0, utilization=0.0, read_only=True)

    def busy(seconds):
        backend.set_utilization(1.0)
        clock.advance(seconds)
        backend.set_utilization(0.0)

    result = characterise_sensor(backend, busy, idle_s=0.7, busy_s=0.8, cache_dir=tmp_path)
    assert result.sample_period_s == pytest.approx(0.02, abs=0.002)
    assert result.update_period_s == pytest.approx(0.02, abs=0.002)
    assert result.delay_s == pytest.approx(0.0, abs=0.0015)  # the virtual GPU reports without delay
    assert result.busy_W == pytest.approx(backend.average_power_W(backend.power_limit_W(0)), rel=0.01)
    assert result.idle_W == pytest.approx(backend.idle_power_W, abs=1.0)
    assert 0 < result.rise_s <= 0.03 and 0 < result.fall_s <= 0.03
    cached = characterise_sensor(backend, lambda s: pytest.fail("measured again"), cache_dir=tmp_path)
    assert cached == result
