"""The simulator reproduces a short scenario computed by hand from the traces and the bandit's formulas."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zeus_callbacks import simulate as sim
from zeus_callbacks.backends import traces

GPU, WORKLOAD, SIZES, SEED = "V100", "squad", [16, 32, 48], 3
MAX_W = 250.0  # V100 trace


def epoch_cost(b: int) -> float:
    curve = traces.power_curve(GPU, WORKLOAD, b)
    t, p = curve.time_per_epoch_s[-1], curve.average_power_W[-1]
    return 0.5 * t * p + 0.5 * MAX_W * t


def test_short_scenario_by_hand(tmp_path):
    steps = 2
    got = sim.simulate(GPU, WORKLOAD, 4, seed=SEED, steps_per_epoch=steps, pruning_rounds=1, batch_sizes=SIZES,
                       store_path=tmp_path / "s.sqlite")
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
    got = sim.simulate(GPU, WORKLOAD, 3, seed=SEED, beta_knob=1.05, steps_per_epoch=2, pruning_rounds=1,
                       batch_sizes=SIZES, store_path=tmp_path / "s.json")
    threshold = 1.05 * got[0].cost
    for r in got[1:]:
        per_step = epoch_cost(r.batch_size) / 2
        total_steps = 2 * r.target_epoch
        stop_step = next((k for k in range(1, total_steps + 1) if k * per_step > threshold), None)
        if stop_step is None or stop_step > total_steps:
            assert (r.status, r.epochs) == ("completed", r.target_epoch)
        else:
            assert (r.status, r.converged, r.epochs) == ("early_stopped", False, stop_step / 2)
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
    from zeus_callbacks.optimizers.cost import ZeusCost

    assert r.power_limit_W == sim.best_power_limit_W(curve, ZeusCost(0.5, curve.max_limit_W)) < curve.max_limit_W
