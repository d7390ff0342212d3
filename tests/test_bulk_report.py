"""Step and phase windows attributed and aggregated in bulk give the per-window numbers.

The oracle is the per-window path: each window's energy from its own scalar look-up in the
running integral of the samples (and its own sample count), and the report aggregates as
plain Python sums over those windows.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_hot_path import LaggingGPU, phase_session

from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.measurement import _step_phases as phases_mod
from zeus_callbacks.measurement._attribution import extrapolated_energy_J, samples_in
from zeus_callbacks.measurement._sampler import PowerSampler
from zeus_callbacks.measurement._windows import ClockTimer, CudaEventTimer, WindowMeter
from zeus_callbacks.reporting import read_jsonl

PHASE_NAMES = ("forward", "backward", "optimizer")


def per_window_energy_J(sampler: PowerSampler, start_s: float, end_s: float) -> tuple[float, int]:
    """One window alone: energy summed over the GPUs (J) and the fewest samples inside it."""
    energy_J, fewest = 0.0, None
    for index in sampler.gpu_indices:
        knots, cumulative = sampler.cumulative_energy(index)
        energy_J += float(extrapolated_energy_J(knots, cumulative, [start_s], [end_s])[0])
        times, _ = sampler.samples(index)
        n = int(samples_in(times, np.array([start_s]), np.array([end_s]), sampler.sensor_delay_s)[0])
        fewest = n if fewest is None else min(fewest, n)
    return energy_J, int(fewest)


def make_timer(kind: str, clock):
    gpu = LaggingGPU(clock)
    return (ClockTimer(clock) if kind == "clock" else CudaEventTimer(clock, cuda=gpu)), gpu


@pytest.mark.parametrize("timer_kind", ["clock", "cuda"])
def test_bulk_batches_give_each_window_its_own_energy(manual_clock, timer_kind):
    backend = VirtualGPUBackend(clock=manual_clock, num_devices=2, noise_W=8.0, seed=3, read_only=True)
    sampler = PowerSampler(backend, [0, 1], sensor_delay_s=backend.sensor_delay_s)
    timer, gpu = make_timer(timer_kind, manual_clock)
    meter = WindowMeter(sampler, timer)
    rng = np.random.default_rng(7)
    truth: list[tuple[str, float, float]] = []  # (name, start, end) on the clock, in close order
    meter.begin("epoch")
    epoch_start_s = manual_clock.now_s()
    batches, records = [], []
    for step in range(600):
        token, t_s = meter.mark(), manual_clock.now_s()
        meter.begin_at("step", token, {"step": step})
        meter.begin_at("forward", token)
        ends = []
        for name, nxt in zip(PHASE_NAMES, (*PHASE_NAMES[1:], None), strict=True):
            manual_clock.advance(float(rng.uniform(2e-4, 4e-3)))
            token, end_s = meter.mark(), manual_clock.now_s()
            meter.end_at(name, token)
            truth.append((name, t_s, end_s))
            ends.append(end_s)
            if nxt is not None:
                meter.begin_at(nxt, token)
            t_s = end_s
        meter.end_at("step", token, {"num_samples": 4})
        truth.append(("step", truth[-3][1], ends[-1]))
        manual_clock.advance(float(rng.uniform(1e-4, 1e-3)))
        if step % 37 == 36:
            sampler.poll_once(read_counter=False)
            gpu.reached = int(rng.integers(gpu.reached, gpu.recorded + 1))  # the GPU lags behind
            more, batch = meter.resolve_bulk({"step", *PHASE_NAMES})
            records += more
            if batch is not None:
                batches.append(batch)
    meter.end("epoch")
    epoch_end_s = manual_clock.now_s()
    manual_clock.advance(3 * backend.sample_period_s + backend.sensor_delay_s)
    sampler.poll_once(read_counter=False)
    more, batch = meter.resolve_bulk({"step", *PHASE_NAMES}, final=True)
    records += more
    batches.append(batch)
    assert gpu.violations == []
    assert [r.name for r in records] == ["epoch"]  # only the non-bulk window is a record
    assert records[0].start_s == pytest.approx(epoch_start_s, abs=1e-9)
    assert records[0].end_s == pytest.approx(epoch_end_s, abs=1e-9)
    assert len(batches) > 10  # many reports, each a batch
    names = [n for b in batches for n in b.names.tolist()]
    assert names == [n for n, _, _ in truth]  # every window once, in close order
    starts = np.concatenate([b.start_s for b in batches])
    ends = np.concatenate([b.end_s for b in batches])
    np.testing.assert_allclose(starts, [s for _, s, _ in truth], rtol=0, atol=1e-9)
    np.testing.assert_allclose(ends, [e for _, _, e in truth], rtol=0, atol=1e-9)
    energy = np.concatenate([b.energy_J for b in batches])
    per_gpu = np.concatenate([b.gpu_energy_J for b in batches], axis=1)
    counts = np.concatenate([b.num_power_samples for b in batches])
    complete = np.concatenate([b.complete for b in batches])
    assert complete.all()  # samples covered every window: the oracle below is exact
    for k in range(len(truth)):
        expected_J, expected_n = per_window_energy_J(sampler, starts[k], ends[k])
        assert energy[k] == pytest.approx(expected_J, rel=1e-9, abs=1e-12)
        assert per_gpu[0, k] + per_gpu[1, k] == energy[k]
        assert counts[k] == expected_n
    assert 0 < energy.min() and per_gpu.min() > 0  # real energies, not zeros on both sides
    assert counts.max() >= 1
    # The steps' info comes through without a merged dict per window.
    step_batch = batches[0].select(batches[0].names == "step")
    assert step_batch.info_values("num_samples") == [4] * step_batch.size
    assert step_batch.info_values("step") == list(range(step_batch.size))
    assert step_batch.info(-1) == {"step": step_batch.size - 1, "num_samples": 4}
    backend.close()


def run_session(tmp_path, manual_clock, timer_kind: str, steps: int):
    batches = []  # each report's step and phase windows, as the session attributed them
    session, backend, gpu = phase_session(
        tmp_path, manual_clock, timer_kind, interval_steps=7, noise_W=8.0, seed=5, window_observer=batches.append
    )
    rng = np.random.default_rng(11)
    session.train_start()
    session.epoch_start(0)
    for i in range(steps):
        manual_clock.advance(float(rng.uniform(1e-4, 2e-3)))  # data loading
        session.step_start(i, phase="forward")
        manual_clock.advance(float(rng.uniform(1e-3, 4e-3)))
        session.phase_switch("forward", "backward")
        manual_clock.advance(float(rng.uniform(2e-3, 6e-3)))
        session.phase_switch("backward", "optimizer")
        manual_clock.advance(float(rng.uniform(2e-4, 1e-3)))
        session.step_end(i, num_samples=8, num_tokens=100 + i % 3)
        if i % 5 == 4:
            session.sampler.poll_once(read_counter=False)
            gpu.reached = gpu.recorded
    session.epoch_end(0)
    summary = session.train_end()
    return session, summary, batches, gpu


@pytest.mark.parametrize("timer_kind", ["clock", "cuda"])
def test_session_reports_equal_per_window_sums(tmp_path, manual_clock, timer_kind, monkeypatch):
    seen = {}
    superpose = phases_mod.superpose

    def spy(starts, ends, t, p, **kw):
        seen.update(starts=np.array(starts), ends=np.array(ends), labels=list(kw["labels"]))
        return superpose(starts, ends, t, p, **kw)

    monkeypatch.setattr(phases_mod, "superpose", spy)
    session, summary, batches, gpu = run_session(tmp_path, manual_clock, timer_kind, 300)
    assert gpu.violations == []
    sampler = session.sampler
    # Per-window oracle: every step and phase window, its own energy.
    per_batch = [b.records() for b in batches]
    windows = [r for rs in per_batch for r in rs]
    assert sum(r.name == "step" for r in windows) == 300
    assert sum(r.complete for r in windows) > 0.9 * len(windows)  # the oracle is exact for these
    oracle = {id(r): per_window_energy_J(sampler, r.start_s, r.end_s) for r in windows}
    for r in windows:
        if r.complete:
            assert r.energy_J == pytest.approx(oracle[id(r)][0], rel=1e-9)
    records = read_jsonl(summary.jsonl_path)
    step_reports = [r for r in records if r["event"] == "steps"]
    # The run's first step is a warm-up step (windows.warmup_steps): in the warmup record, not the steps'.
    (warmup,) = [r for r in records if r["event"] == "warmup"]
    (first,) = [r for r in windows if r.name == "step" and r.info.get("warmup")]
    assert warmup["steps"] == [first.info["step"]] == [0]
    assert warmup["energy_J"] == pytest.approx(first.energy_J, rel=1e-12)
    assert warmup["time_s"] == pytest.approx(first.time_s, rel=1e-12)
    step_batches = [[r for r in rs if r.name == "step" and not r.info.get("warmup")] for rs in per_batch]
    step_batches = [s for s in step_batches if s]
    assert len(step_reports) == len(step_batches) > 20
    for report, steps in zip(step_reports, step_batches, strict=True):
        n = len(steps)
        assert report["count"] == n
        assert report["energy_J_mean"] == pytest.approx(sum(r.energy_J for r in steps) / n, rel=1e-12)
        assert report["time_s_mean"] == pytest.approx(sum(r.time_s for r in steps) / n, rel=1e-12)
        assert report["power_samples"] == sum(r.num_power_samples for r in steps)
        assert report["energy_J_per_sample"] == pytest.approx(report["energy_J_mean"] / 8, rel=1e-12)
        tokens = sum(r.info["num_tokens"] for r in steps) / n
        assert report["energy_J_per_token"] == pytest.approx(report["energy_J_mean"] / tokens, rel=1e-12)
        assert report["last_step"] == steps[-1].info["step"]
        assert report["complete"] == all(r.complete for r in steps)
        for r in steps:
            if r.complete:
                assert r.num_power_samples == oracle[id(r)][1]
    # The summary's mean: each report's mean over its windows × the steps it stands for (no warm-up step).
    pairs = list(zip(step_reports, step_batches, strict=True))
    stood_for = sum(report["steps"] for report, _ in pairs)
    assert stood_for == 299
    energy_J = sum(sum(r.energy_J for r in steps) / len(steps) * report["steps"] for report, steps in pairs)
    time_s = sum(sum(r.time_s for r in steps) / len(steps) * report["steps"] for report, steps in pairs)
    assert summary.step_energy_J == pytest.approx(energy_J / stood_for, rel=1e-12)
    assert summary.step_time_s == pytest.approx(time_s / stood_for, rel=1e-12)
    # Phases: the counts and mean durations of every execution, and the superposition fed
    # the same executions, sorted by start (stable), as the per-window tracker fed it.
    (phase_event,) = [r for r in records if r["event"] == "phases"]
    phase_windows = [r for r in windows if r.name != "step" and r.end_s > r.start_s]
    stats = {p["name"]: p for p in phase_event["phases"]}
    assert set(stats) == {"dataloader", *PHASE_NAMES}
    for name, p in stats.items():
        mine = [r for r in phase_windows if r.name == name]
        assert p["executions"] == len(mine)
        assert p["time_s"] == pytest.approx(float(np.mean([r.time_s for r in mine])), rel=1e-12)
        assert p["total_J"] == pytest.approx(p["energy_J"] * len(mine), rel=1e-12)
        assert math.isfinite(p["energy_J"]) and p["energy_J"] > 0
    recent = sorted(phase_windows, key=lambda r: r.start_s)
    covered = [r for r in recent if r.start_s >= sampler.samples(0)[0][0]]
    assert seen["labels"] == [r.name for r in covered]
    np.testing.assert_array_equal(seen["starts"], [r.start_s for r in covered])
    np.testing.assert_array_equal(seen["ends"], [r.end_s for r in covered])
    session.backend.close()
