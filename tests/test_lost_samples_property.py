"""Windows over lost power samples, over random schedules: right on what the samples cover, or null.

A sampler that is not drained within the sensor's history (2.4 s on an H200) loses samples; the
running integral then bridges the stretch with one straight line, a guess (issue 31). Random stretches
of time at random loads, each ended by a drain or not, with windows opened and closed at random
boundaries, on the fake NVML (the H200's sensor facts). The property, for every window:

- null (NaN), or its energy within tolerance of the true energy over the part the samples cover: the
  window less every lost stretch (``PowerSampler.sample_gaps``);
- ``complete`` only where that part is the whole window.

Tolerance as in tests/faults/truth_or_flag.py: the clock's resolution, plus ``|ΔP| × edge`` for each
change of the true power near the window, as a sample is a ~15 ms mean seen ~16 ms late.
"""

from __future__ import annotations

import math

from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.fakes import fake_pynvml as fp
from zeus_callbacks.backends._nvml import NVMLBackend
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.measurement._sampler import PowerSampler
from zeus_callbacks.measurement._windows import ClockTimer, WindowMeter

T0 = 1_800_000_000.0  # on the fake's 100 ms grid
EDGE_S = 0.06  # a power change smears over at most 20 + 15 + 16 ms (tests/faults/truth_or_flag.py)
ABS_EPS_J = 0.01  # µs stamps near 1.8e9 s and the running integral's rounding
REL_EPS = 1e-6

stretch = st.tuples(
    st.floats(0.05, 4.0),  # how long (s)
    st.floats(60.0, 700.0),  # the true power over it (W)
    st.booleans(),  # drained at its end (else the next drain may come too late)
)


@settings(max_examples=60, deadline=None)  # a loaded CI machine must not turn a slow example into a failure
@given(
    stretches=st.lists(stretch, min_size=3, max_size=12),
    opens=st.lists(st.integers(0, 11), min_size=1, max_size=6),
    lengths=st.lists(st.integers(1, 6), min_size=6, max_size=6),
)
def test_a_window_is_right_on_its_covered_part_or_null(stretches, opens, lengths):
    clock = ManualClock(T0)
    fake = fp.FakePyNVML(num_gpus=1, time_fn=clock.now_s)
    backend = NVMLBackend(nvml_module=fake, clock=clock, read_only=True)
    try:
        sampler = PowerSampler(backend, [0], sensor_delay_s=backend.sensor_delay_s)
        meter = WindowMeter(sampler, ClockTimer(clock))
        sampler.poll_once()
        changes: list[tuple[float, float]] = []  # (time, |ΔP|)
        previous_W = fake.gpus[0].model.power_W(clock.now_s())
        closes: dict[int, list[str]] = {}
        spans: dict[str, list[float]] = {}
        for k, (seconds, power_W, drained) in enumerate(stretches):
            for n, (at, length) in enumerate(zip(opens, lengths, strict=False)):
                if at == k:  # window n opens here and closes `length` stretches later (or at the end)
                    name = f"w{n}"
                    meter.begin(name)
                    spans[name] = [clock.now_s()]
                    closes.setdefault(min(k + length, len(stretches)), []).append(name)
            fake.set_load(power_W)
            changes.append((clock.now_s(), abs(power_W - previous_W)))
            previous_W = power_W
            clock.advance(seconds)
            if drained:
                sampler.poll_once()
            for name in closes.pop(k + 1, []):
                meter.end(name)
                spans[name].append(clock.now_s())
        clock.advance(0.2)  # the last samples reach past the last window's end
        sampler.poll_once()
        records = meter.resolve(final=True)
        gaps = sampler.sample_gaps(0)
    finally:
        backend.close()

    assert {r.name for r in records} == set(spans)
    event("samples lost" if gaps else "no samples lost")  # --hypothesis-show-statistics: both are exercised
    for record in records:
        a, b = spans[record.name]
        lost = [(max(g0, a), min(g1, b)) for g0, g1 in gaps]  # the knots' time base: the windows'
        lost = [(lo, hi) for lo, hi in lost if hi > lo]
        covered_s = (b - a) - sum(hi - lo for lo, hi in lost)
        if lost:
            assert not record.complete, (record, gaps)
        if math.isnan(record.energy_J):
            continue  # null: allowed
        truth_J = fake.true_energy_J(a, b) - sum(fake.true_energy_J(lo, hi) for lo, hi in lost)
        smear_J = sum(dp * EDGE_S for t, dp in changes if a - EDGE_S < t < b + EDGE_S)
        tolerance_J = ABS_EPS_J + REL_EPS * truth_J + smear_J
        assert record.covered_s is not None and record.covered_s <= covered_s + 1e-6, (record, covered_s)
        if record.complete:
            assert record.covered_s >= (b - a) - 1e-6
        # Every window begins after the first drain and ends before the last: what is not lost is covered.
        assert abs(record.covered_s - covered_s) < 1e-6, (record, covered_s, gaps)
        assert abs(record.energy_J - truth_J) <= tolerance_J, (record, truth_J, tolerance_J, gaps)
