"""Tests of the trace-driven virtual GPU backend and the Zeus trace loaders."""

from __future__ import annotations

import csv
import math
import threading
from pathlib import Path

import numpy as np
import pytest

import zeus_callbacks.backends as backends_pkg
from zeus_callbacks.backends import traces
from zeus_callbacks.backends.base import READ_ONLY_ENV, ManualClock, ReadOnlyError, SensorError
from zeus_callbacks.backends.virtual import HISTORY_S, VirtualGPUBackend

DATA_DIR = Path(backends_pkg.__file__).resolve().parents[1] / "data" / "zeus_nsdi23"
START_S = 1_000.0


def trace_rows(gpu: str, dataset: str, batch_size: int) -> dict[float, tuple[float, float]]:
    """Read {power_limit: (time_per_epoch, average_power)} straight from the CSV."""
    optimizer = {"imagenet": "adadelta", "cifar100": "adadelta", "librispeech": "adamw"}[dataset]
    rows = {}
    with open(DATA_DIR / f"summary_power_{gpu.lower()}.csv", newline="") as f:
        for row in csv.DictReader(f):
            if (row["dataset"], int(row["batch_size"]), row["optimizer"]) == (dataset, batch_size, optimizer):
                rows[float(row["power_limit"])] = (float(row["time_per_epoch"]), float(row["average_power"]))
    assert rows
    return rows


def make(clock: ManualClock | None = None, **kwargs) -> VirtualGPUBackend:
    kwargs.setdefault("read_only", False)
    return VirtualGPUBackend(clock=clock or ManualClock(START_S), **kwargs)


def mean_power_W(samples) -> float:
    return float(np.mean([s.power_W for s in samples]))


# -- power model ------------------------------------------------------------------
def test_power_at_max_limit_matches_trace():
    clock = ManualClock(START_S)
    backend = make(clock, gpu="A40", workload="imagenet")
    rows = trace_rows("A40", "imagenet", 256)
    max_limit = max(rows)
    assert backend.power_limit_constraints_W(0) == (min(rows), max_limit)
    assert backend.power_limit_W(0) == max_limit
    clock.advance(2.0)
    samples = backend.power_samples_since(0, -math.inf)
    assert len(samples) >= 95
    assert mean_power_W(samples) == pytest.approx(rows[max_limit][1], abs=1.5)  # noise 3 W / √100
    assert np.std([s.power_W for s in samples]) == pytest.approx(3.0, rel=0.35)


def test_lower_limit_lowers_power_and_slows_down():
    clock = ManualClock(START_S)
    backend = make(clock, gpu="V100", workload="imagenet", noise_W=0.0)
    rows = trace_rows("V100", "imagenet", 256)
    high, low = max(rows), 150.0
    backend.set_power_limit_W(0, low)
    assert backend.power_limit_W(0) == low
    clock.advance(1.0)
    assert mean_power_W(backend.power_samples_since(0, START_S + 0.05)) == pytest.approx(rows[low][1])
    assert rows[low][1] < rows[high][1]
    factor = backend.step_time_factor(low)
    assert factor == pytest.approx(rows[low][0] / rows[high][0])
    assert factor > 1.0
    assert backend.epoch_time_s(low) == pytest.approx(rows[low][0])
    assert backend.average_power_W(low) == pytest.approx(rows[low][1])
    assert backend.epoch_energy_J(low) == pytest.approx(rows[low][0] * rows[low][1])


def test_interpolation_is_linear_and_clamped():
    rows = trace_rows("A40", "imagenet", 256)
    curve = traces.power_curve("a40", "imagenet")
    mid = (rows[200.0][1] + rows[225.0][1]) / 2
    assert traces.average_power_W_at(curve, 212.5) == pytest.approx(mid)
    assert traces.time_per_epoch_s_at(curve, 50.0) == pytest.approx(rows[100.0][0])
    assert traces.time_per_epoch_s_at(curve, 900.0) == pytest.approx(rows[300.0][0])
    with pytest.raises(ValueError):
        traces.average_power_W_at(curve, math.nan)


def test_utilization_zero_gives_idle_power_and_is_timestamped():
    clock = ManualClock(START_S)
    backend = make(clock, noise_W=0.0)
    busy_W = trace_rows("A40", "imagenet", 256)[300.0][1]
    clock.advance(1.0)
    backend.set_utilization(0.0)
    change_s = clock.now_s()
    clock.advance(1.0)
    samples = backend.power_samples_since(0, -math.inf)
    before = [s.power_W for s in samples if s.timestamp_s < change_s - 0.005]
    after = [s.power_W for s in samples if s.timestamp_s > change_s + 0.025]
    assert before and after
    assert np.allclose(before, busy_W)
    assert np.allclose(after, backend.idle_power_W)
    assert backend.idle_power_W == pytest.approx(30.0)
    assert backend.true_power_W(0) == pytest.approx(backend.idle_power_W)
    with pytest.raises(ValueError, match="utilization"):
        backend.set_utilization(1.5)


def test_power_offset_per_device():
    clock = ManualClock(START_S)
    backend = make(clock, num_devices=2, noise_W=0.0, power_offset_W=[0.0, 7.0])
    clock.advance(0.5)
    p0 = mean_power_W(backend.power_samples_since(0, -math.inf))
    p1 = mean_power_W(backend.power_samples_since(1, -math.inf))
    assert p1 - p0 == pytest.approx(7.0)
    with pytest.raises(ValueError, match="2 devices"):
        make(num_devices=2, power_offset_W=[1.0])


# -- sensors ----------------------------------------------------------------------
def test_samples_every_20_ms_with_small_jitter():
    clock = ManualClock(START_S)
    backend = make(clock)
    clock.advance(2.0)
    stamps = np.array([s.timestamp_s for s in backend.power_samples_since(0, -math.inf)])
    gaps = np.diff(stamps)
    assert np.all(gaps > 0.018) and np.all(gaps < 0.022)
    assert gaps.mean() == pytest.approx(0.02, abs=2e-4)
    assert np.std(gaps) > 1e-5  # jittered, not a perfect grid
    offsets = (stamps - START_S) - np.round((stamps - START_S) / 0.02) * 0.02
    assert np.all(np.abs(offsets) <= 0.001 + 1e-9)


def test_other_periods_and_negative_seed():
    clock = ManualClock(START_S)
    backend = make(clock, sample_period_s=0.002, seed=-3)
    clock.advance(0.1)
    gaps = np.diff([s.timestamp_s for s in backend.power_samples_since(0, -math.inf)])
    assert len(gaps) >= 45 and np.all(gaps > 0.001) and np.all(gaps < 0.003)


def test_history_is_bounded_and_since_filters():
    clock = ManualClock(START_S)
    backend = make(clock)
    clock.advance(10.0)
    now = clock.now_s()
    samples = backend.power_samples_since(0, -math.inf)
    assert samples[0].timestamp_s >= now - HISTORY_S
    assert len(samples) == pytest.approx(HISTORY_S / 0.02, abs=2)
    newer = backend.power_samples_since(0, now - 0.5)
    assert all(s.timestamp_s > now - 0.5 for s in newer)
    assert newer == [s for s in samples if s.timestamp_s > now - 0.5]
    assert backend.power_samples_since(0, now) == []


def test_polling_frequency_does_not_change_values():
    clock_a, clock_b = ManualClock(START_S), ManualClock(START_S)
    a, b = make(clock_a, seed=7), make(clock_b, seed=7)
    polled, last_s = [], -math.inf
    for step in range(100):  # poll every 20 ms, changing the limit half-way
        if step == 50:
            a.set_power_limit_W(0, 200.0)
        clock_a.advance(0.02)
        new = a.power_samples_since(0, last_s)
        polled += new
        last_s = new[-1].timestamp_s if new else last_s
    for step in range(100):  # same history, never polled until the end
        if step == 50:
            b.set_power_limit_W(0, 200.0)
        clock_b.advance(0.02)
    assert polled[-len(b.power_samples_since(0, -math.inf)) :] == b.power_samples_since(0, -math.inf)
    assert len(polled) >= 99
    other_seed = make(ManualClock(START_S), seed=8)
    other_seed.clock.advance(2.0)
    assert other_seed.power_samples_since(0, -math.inf) != b.power_samples_since(0, -math.inf)


def test_energy_counter_integrates_exactly():
    clock = ManualClock(START_S)
    backend = make(clock, gpu="V100", workload="librispeech", batch_size=192)
    power_W = trace_rows("V100", "librispeech", 192)[250.0][1]
    start_J = backend.energy_counter_J(0)
    clock.advance(10.0)
    energy_J = backend.energy_counter_J(0) - start_J
    assert abs(energy_J - power_W * 10.0) <= 1e-3 + 1e-9
    assert energy_J * 1000 == pytest.approx(round(energy_J * 1000), abs=1e-6)  # mJ steps
    clock.advance(0.099)  # counter updates every 100 ms only
    assert backend.energy_counter_J(0) - start_J == energy_J
    clock.advance(0.002)
    assert backend.energy_counter_J(0) - start_J == pytest.approx(power_W * 10.1, abs=1e-3)


def test_energy_counter_follows_limit_and_utilization_changes():
    clock = ManualClock(START_S)
    backend = make(clock)
    rows = trace_rows("A40", "imagenet", 256)
    clock.advance(1.0)
    backend.set_power_limit_W(0, 150.0)
    clock.advance(1.0)
    backend.set_utilization(0.0)
    clock.advance(1.0)
    expected_J = rows[300.0][1] + rows[150.0][1] + backend.idle_power_W
    assert backend.energy_counter_J(0) == pytest.approx(expected_J, abs=1e-3)


def test_injected_faults_then_recovery():
    clock = ManualClock(START_S)
    backend = make(clock)
    clock.advance(0.5)
    backend.inject_fault(2, "gpu_lost", sensor="energy")
    assert backend.power_samples_since(0, -math.inf)
    for _ in range(2):
        with pytest.raises(SensorError) as info:
            backend.energy_counter_J(0)
        assert info.value.kind == "gpu_lost"
    assert backend.energy_counter_J(0) > 0


def test_concurrent_readers_and_setter():
    backend = VirtualGPUBackend(read_only=False)  # wall clock
    errors = []

    def read():
        try:
            for _ in range(200):
                backend.power_samples_since(0, 0.0)
                backend.energy_counter_J(0)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=read)
    thread.start()
    for i in range(200):
        backend.set_power_limit_W(0, 150.0 + i % 2 * 100.0)
        backend.set_utilization(i % 2)
    thread.join()
    assert errors == []


# -- limits, identity, errors -------------------------------------------------------
def test_read_only_refuses(monkeypatch):
    backend = make(read_only=True)
    with pytest.raises(ReadOnlyError):
        backend.set_power_limit_W(0, 150.0)
    assert backend.power_limit_W(0) == 300.0
    monkeypatch.setenv(READ_ONLY_ENV, "1")
    with pytest.raises(ReadOnlyError):
        VirtualGPUBackend(clock=ManualClock()).set_power_limit_W(0, 150.0)
    with pytest.raises(ValueError, match="outside"):
        make().set_power_limit_W(0, 50.0)


def test_device_name_and_count():
    backend = make(gpu="a40", workload="ImageNet", num_devices=3)
    assert backend.device_count() == 3
    assert backend.device_name(2) == "Virtual A40 (zeus_nsdi23 imagenet/resnet50 bs 256)"
    with pytest.raises(IndexError):
        backend.device_name(3)


@pytest.mark.parametrize(
    ("kwargs", "listed"),
    [
        ({"gpu": "H100"}, ["V100", "A40"]),
        ({"workload": "mnist"}, list(traces.WORKLOADS)),
        ({"workload": "imagenet", "batch_size": 100}, ["8", "256", "512"]),
    ],
)
def test_unknown_choice_lists_valid_ones(kwargs, listed):
    with pytest.raises(ValueError) as info:
        make(**kwargs)
    for name in listed:
        assert name in str(info.value)


# -- trace loaders ------------------------------------------------------------------
def test_workloads_and_default_batch_sizes():
    for gpu in traces.GPUS:
        assert traces.available_workloads(gpu) == list(traces.WORKLOADS)
        for name, workload in traces.WORKLOADS.items():
            default = traces.default_batch_size(gpu, name)
            sizes = traces.available_batch_sizes(gpu, name)
            assert default in sizes and default <= workload.default_batch_size
    assert traces.get_workload("librispeech").higher_is_better is False
    assert traces.available_batch_sizes("V100", "imagenet")[-1] == 360


def test_load_power_and_train_traces():
    trace = traces.load_power_trace("V100")
    key = traces.WorkloadKey("cifar100", "shufflenetv2", 1024, "adam")
    assert list(trace[key].power_limit_W) == [100, 125, 150, 175, 200, 225, 250]
    with pytest.raises(ValueError):
        trace[key].power_limit_W[0] = 1.0  # shared arrays are read-only
    paths = traces.load_train_trace()
    assert len(paths) == 3759
    assert any(p.target_epoch is None for p in paths)
    first = paths[0]
    assert (first.dataset, first.batch_size, first.run, first.target_epoch) == ("cifar100", 1024, 1, 1)
