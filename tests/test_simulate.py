"""The simulator reproduces a short scenario computed by hand from the traces and the bandit's formulas."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zeus_callbacks import simulate as sim
from zeus_callbacks.backends import traces
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.optimizers.cost import ZeusCost
from zeus_callbacks.optimizers.power_limit import (
    Objective,
    PowerLimitProfiler,
    ProfileKey,
    ProfileSettings,
    power_limit_grid_W,
)
from zeus_callbacks.session import _log_records as records
from zeus_callbacks.store import open_store

GPU, WORKLOAD, SIZES, SEED = "V100", "squad", [16, 32, 48], 3
MAX_W = 250.0  # V100 trace


def epoch_cost(b: int) -> float:
    curve = traces.power_curve(GPU, WORKLOAD, b)
    t, p = curve.time_per_epoch_s[-1], curve.average_power_W[-1]
    return 0.5 * t * p + 0.5 * MAX_W * t


def test_short_scenario_by_hand(tmp_path):
    steps = 2
    got = sim.simulate(
        GPU,
        WORKLOAD,
        4,
        seed=SEED,
        steps_per_epoch=steps,
        pruning_rounds=1,
        batch_sizes=SIZES,
        store_path=tmp_path / "s.sqlite",
    )
    # Training paths: the simulator's own seeded stream of the world, one draw per recurrence.
    world = np.random.default_rng([SEED, 0x5EED])
    # Pruning from the default 32: down to 16 (converges; nothing smaller), then up to 48; then Thompson.
    expected_bs = [32, 16, 48]
    costs = []
    for i, b in enumerate(expected_bs):
        paths = sim.training_paths(GPU, WORKLOAD, b)
        epochs = paths[int(world.integers(len(paths)))]
        r = got[i]
        assert (r.batch_size, r.target_epoch, r.phase) == (b, epochs, "pruning")
        # Threshold 2 x the first cost is never passed by these close arms: every run converges.
        assert (r.status, r.converged, r.epochs) == ("completed", True, epochs)
        assert r.cost == pytest.approx(epochs * epoch_cost(b), rel=1e-9)
        assert r.power_limit_W == MAX_W
        costs.append(r.cost)
    # Thompson sampling, by hand: prior N(mean of all costs, (1.0 x mean)^2), one observation per arm,
    # noise variance at its floor (0.05 x cost)^2, then one draw per arm (16, 32, 48) from PCG64(seed).
    obs = dict(zip(expected_bs, costs, strict=True))
    mu0 = float(np.mean(costs))
    tau0 = 1 / mu0**2
    rng = np.random.Generator(np.random.PCG64(SEED))
    draws = {}
    for b in sorted(obs):
        var = (0.05 * obs[b]) ** 2
        tau = tau0 + 1 / var
        mu = (tau0 * mu0 + obs[b] / var) / tau
        draws[b] = rng.normal(mu, 1 / np.sqrt(tau))
    assert got[3].batch_size == min(draws, key=draws.get) and got[3].phase == "thompson"


def test_early_stop_mid_epoch_by_hand(tmp_path):
    # beta 1.05: the first recurrence's cost c0 sets the threshold 1.05 c0; a run stops at the first
    # half-epoch step whose accumulated cost exceeds it.
    got = sim.simulate(
        GPU,
        WORKLOAD,
        3,
        seed=SEED,
        beta_knob=1.05,
        steps_per_epoch=2,
        pruning_rounds=1,
        batch_sizes=SIZES,
        store_path=tmp_path / "s.json",
    )
    threshold = 1.05 * got[0].cost
    for r in got[1:]:
        per_step = epoch_cost(r.batch_size) / 2
        total_steps = 2 * r.target_epoch
        stop_step = next((k for k in range(1, total_steps + 1) if k * per_step > threshold), None)
        if stop_step is None or stop_step > total_steps:
            assert (r.status, r.epochs) == ("completed", r.target_epoch)
        else:
            # A stop at the target epoch's last step is followed by that epoch's evaluation, which
            # reaches the target: the run converged (issue 26); any earlier stop did not.
            converged = stop_step == total_steps
            assert (r.status, r.converged, r.epochs) == ("early_stopped", converged, stop_step / 2)
            assert r.cost == pytest.approx(stop_step * per_step, rel=1e-9)
    assert any(r.status == "early_stopped" for r in got)


def test_command_line_prints_a_table_or_json_lines(capsys):
    args = ["--gpu", "V100", "--workload", "squad", "--recurrences", "2", "--steps-per-epoch", "1"]
    assert sim.main([*args, "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["batch_size"] for r in lines] == [32, 24]
    assert sim.main(args) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split()[:2] == ["rec", "batch"] and [row.split()[1] for row in rows[2:4]] == ["32", "24"]
    assert rows[4].startswith("2 recurrence(s)")


def test_jit_power_limit_trains_at_the_cheapest_limit():
    (r,) = sim.simulate("A40", "squad", 1, power_limit="jit", steps_per_epoch=2)
    curve = traces.power_curve("A40", "squad", 32)
    assert r.power_limit_source == "profile" and r.profiling_steps > 0
    assert r.power_limit_W == sim.best_power_limit_W(curve, ZeusCost(0.5, curve.max_limit_W)) < curve.max_limit_W


def _replay_search(curve: traces.PowerCurve, dt_max_s: float, job_steps: int | None = None) -> list[float]:
    """The limits the profiler visits, in order, fed the trace's exact per-step time and energy."""
    objective = Objective("zeus_cost", 0.5, max_power_W=curve.max_limit_W)
    power = {}
    profiler = PowerLimitProfiler(
        power_limit_grid_W(curve.min_limit_W, curve.max_limit_W), objective,
        lambda a, b, **_: power[a] * (b - a), ProfileSettings(job_steps=job_steps),
    )  # fmt: skip
    now, visited = 0.0, []
    while not profiler.finished:
        limit = profiler.on_step_start(len(visited), now)
        visited += [limit] if not visited or visited[-1] != limit else []
        power[now] = traces.average_power_W_at(curve, limit)
        slowdown = traces.time_per_epoch_s_at(curve, limit) / traces.time_per_epoch_s_at(curve, curve.max_limit_W)
        now += dt_max_s * slowdown
        profiler.on_step_end(len(visited), now)
    return visited


def test_jit_drives_the_real_profiler_and_its_store_cache(tmp_path, monkeypatch):
    # The simulator's own virtual GPU accepts limit changes even where the environment asks
    # real backends for read-only mode.
    monkeypatch.setenv("ZEUS_CALLBACKS_READ_ONLY", "1")
    gpu, workload, b = "A40", "squad", 32
    store_path = tmp_path / "s.sqlite"
    first, second = sim.simulate(gpu, workload, 2, power_limit="jit", batch_sizes=[b], store_path=store_path)
    curve = traces.power_curve(gpu, workload, b)
    max_W = curve.max_limit_W
    n = sim.real_steps_per_epoch(curve)
    cost = ZeusCost(0.5, max_W)

    # The profiler wrote its profile into the store, under its own key (job, GPU model, batch size,
    # world size, objective), and the simulator trained at the limit it chose.
    gpu_model = VirtualGPUBackend(gpu=gpu, workload=workload, batch_size=b).device_name(0)
    key = ProfileKey(f"sim/{gpu}/{workload}", gpu_model, b, 1, "zeus_cost(eta=0.5)")
    with open_store(store_path) as store:
        profile = store.get_profile(key.as_str())
        (trial0, trial1) = store.list_trials(f"sim/{gpu}/{workload}")
    assert profile is not None and first.power_limit_source == "profile"
    assert profile["chosen_limit_W"] == first.power_limit_W == trial0.power_limit_W
    rows = {row["limit_W"]: row for row in profile["limits"]}
    # It visited the limits its search visits on the trace's exact costs, told the job's length as an
    # integration tells it (max_epochs × real steps an epoch, issue 31): on this long job it polishes.
    job_steps = traces.get_workload(workload).max_epochs * n
    visited = _replay_search(curve, traces.time_per_epoch_s_at(curve, max_W) / n, job_steps)
    assert set(rows) == set(visited)
    assert len(set(_replay_search(curve, traces.time_per_epoch_s_at(curve, max_W) / n))) < len(rows)
    assert first.power_limit_W == min(rows, key=lambda x: rows[x]["cost"])
    # Each limit's steps ran at that limit's traced time and power: the virtual GPU followed the limit.
    for limit, row in rows.items():
        t = traces.time_per_epoch_s_at(curve, limit) / n
        assert row["time_per_step_s"] == pytest.approx(t, rel=1e-9)
        # A window's last step is attributed after the next limit began (its samples arrive during the next
        # step) from the samples before the switch only: the sample straddling it averages in the next
        # limit's power (0.27 % of a limit's mean here before, docs/power_limit.md "The late last step").
        # Every sample used covers one limit's constant power, which the noise-free sensor reports exactly,
        # and the step's end past the last one is extrapolated at that same power: what is left is the float
        # rounding of the running integral, F(b) − F(a) of sums of ~100 samples worth ~30 steps' energy
        # (2.2e-16 × 100 × 30 ≈ 1e-12 of a step; 5e-15 seen), so the bound is the time's.
        assert row["energy_per_step_J"] == pytest.approx(t * traces.average_power_W_at(curve, limit), rel=1e-9)
    # Profiling is charged at what it cost, by hand: the untouched first step at the maximum, every
    # warm-up and profiled step at its limit (1/n epoch each), the rest of the epochs at the choice.
    assert sum(row["steps"] for row in rows.values()) == first.profiling_steps
    by_hand = (
        sim.epoch_cost(curve, max_W, cost) / n
        + sum(row["steps"] * sim.epoch_cost(curve, limit, cost) / n for limit, row in rows.items())
        + (first.target_epoch - (1 + first.profiling_steps) / n) * sim.epoch_cost(curve, first.power_limit_W, cost)
    )
    assert first.cost == pytest.approx(by_hand, rel=1e-6) and first.epochs == first.target_epoch
    # The next recurrence at the same batch size hits the cache: no profiling, the same limit
    # from its second step on.
    assert (second.power_limit_source, second.profiling_steps) == ("cache", 0)
    assert second.power_limit_W == first.power_limit_W == trial1.power_limit_W
    by_hand = sim.epoch_cost(curve, max_W, cost) / n + (second.target_epoch - 1 / n) * sim.epoch_cost(
        curve, second.power_limit_W, cost
    )
    assert second.cost == pytest.approx(by_hand, rel=1e-6)


def test_jit_tells_the_profiler_the_job_length_as_an_integration_does(monkeypatch):
    written: list[dict] = []
    record = records.power_limit_profile_record

    def spy(*args, **kwargs):  # the power_limit_profile record the session writes (the simulator logs no JSONL)
        written.append(record(*args, **kwargs))
        return written[-1]

    monkeypatch.setattr(records, "power_limit_profile_record", spy)
    (told,) = sim.simulate("A40", "squad", 1, power_limit="jit", batch_sizes=[32])
    curve = traces.power_curve("A40", "squad", 32)
    job_steps = traces.get_workload("squad").max_epochs * sim.real_steps_per_epoch(curve)
    (profile,) = written
    assert (profile["job_steps"], profile["job_steps_source"]) == (job_steps, "train_start")
    assert profile["profiling_steps"] == told.profiling_steps < job_steps

    written.clear()
    (untold,) = sim.simulate("A40", "squad", 1, power_limit="jit", batch_sizes=[32], tell_job_steps=False)
    (profile,) = written
    assert (profile["job_steps"], profile["job_steps_source"]) == (None, None)
    assert untold.profiling_steps < told.profiling_steps  # told a long job, the search polished


def test_max_power_limit_never_profiles(tmp_path):
    (r,) = sim.simulate("A40", "squad", 1, power_limit="max", batch_sizes=[32], store_path=tmp_path / "s.json")
    assert (r.power_limit_W, r.power_limit_source, r.profiling_steps) == (300.0, "max", 0)
    with open_store(tmp_path / "s.json") as store:
        assert store.list_profiles() == []


def test_a_database_url_store_continues_the_job_like_a_file(tmp_path):
    # The same job replayed twice: once in one call into a store file, once split over two calls
    # into a database URL (SQLAlchemy's SQLite dialect, which needs no server): the second call
    # continues from the trials the first wrote, so both histories match recurrence by recurrence.
    kwargs = {"seed": SEED, "steps_per_epoch": 2, "pruning_rounds": 1, "batch_sizes": SIZES}
    whole = sim.simulate(GPU, WORKLOAD, 4, store_path=tmp_path / "file.sqlite", **kwargs)
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    first = sim.simulate(GPU, WORKLOAD, 2, store_path=url, **kwargs)
    with open_store(url, read_only=True) as store:
        assert len(store.list_trials(f"sim/{GPU}/{WORKLOAD}")) == 2  # the URL, not a temporary file, got them
    second = sim.simulate(GPU, WORKLOAD, 2, store_path=url, **kwargs)
    assert [r.batch_size for r in whole[:2]] == [r.batch_size for r in first]
    # The world's random stream restarts with each call, so compare what the bandit decided from the store:
    # the third recurrence's batch size follows the first two trials (pruning goes on where it stopped).
    assert second[0].phase == whole[2].phase and second[0].batch_size == whole[2].batch_size


def test_the_simulators_sessions_wait_for_the_virtual_sensor(monkeypatch):
    # Issue 26: under heavy CPU load a read of the virtual sensor outlasted the default 0.5 s timeout and the
    # simulated run was marked degraded for a fault no GPU had. The simulator's sessions wait up to 60 s.
    made: list[sim.EnergySession] = []

    class Kept(sim.EnergySession):
        def train_start(self, *args, **kwargs):
            made.append(self)
            return super().train_start(*args, **kwargs)

    monkeypatch.setattr(sim, "EnergySession", Kept)
    sim.simulate("A40", "squad", 2, power_limit="jit", batch_sizes=[32])
    assert len(made) == 2
    for session in made:
        assert session.config.sampling.sensor_timeout_s == 60.0
        assert session.sampler is not None and session.sampler.sensor_timeout_s == 60.0  # the sampler it ran


def test_the_power_limit_benchmarks_sessions_wait_for_the_virtual_sensor(monkeypatch):
    # The same for benchmarks/power_limit_search.py (and power_limit_families.py, which trains through it).
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import power_limit_search as bench

    made: list[sim.EnergySession] = []

    class Kept(bench.EnergySession):
        def train_start(self, *args, **kwargs):
            made.append(self)
            return super().train_start(*args, **kwargs)

    monkeypatch.setattr(bench, "EnergySession", Kept)
    bench.simulate("A40", "squad", 0, {})
    (session,) = made
    assert session.config.sampling.sensor_timeout_s == 60.0
    assert session.sampler is not None and session.sampler.sensor_timeout_s == 60.0
