"""FinGraV maths on synthetic sample streams with known truth (random phases, 20/100 ms sensors, delay, jitter)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from zeus_callbacks.measurement.finegrain import (
    DROPPED,
    bin_executions,
    differentiate,
    position_labels,
    superpose,
)

BASE_W = 100.0
PRE_S, POST_S = 0.04, 0.1


def sense(grid, power, t_end, dt_s, period_s, delay_s, noise_W, rng):
    """A sensor sampling a true power trace (``power`` on ``grid`` up to ``t_end``, step ``dt_s``).

    Each sample is the mean of the true power over the interval since the previous sample,
    reported ``delay_s`` late, with timestamp jitter and noise. Returns the running true energy
    ``C(t)`` (J), the sample times and the sample powers.
    """
    cum = np.concatenate(([0.0], np.cumsum(power) * dt_s))
    knots = np.concatenate((grid, [t_end]))

    def C(x):
        return np.interp(x, knots, cum)

    k = np.arange(1, int((t_end - 0.05) / period_s))
    times = k * period_s + rng.uniform(-period_s / 40, period_s / 40, k.size)
    powers = (C(times[1:] - delay_s) - C(times[:-1] - delay_s)) / np.diff(times) + rng.normal(0, noise_W, k.size - 1)
    return C, times[1:], powers


def synth(
    rng: np.random.Generator,
    *,
    n: int,
    dur_s: float,
    mode: str,
    period_s: float = 0.02,
    delay_s: float = 0.004,
    noise_W: float = 3.0,
    busy_W: float = 400.0,
    tail_W: float = 150.0,
    tau_s: float = 0.015,
    gap_s: tuple[float, float] = (0.15, 0.25),
    dur_jitter: float = 0.02,
    outliers: int = 0,
    warm: tuple[int, float] | None = None,
    runs: int = 1,
    dt_s: float = 2e-5,
):
    """A true power trace on a fine grid, executions on it, and a sensor sampling it.

    Power = BASE_W + per execution a ramp busy_W·(0.8 + 0.4u) while it runs and a tail
    tail_W·exp(−(t−end)/tau) after it. ``warm = (k, factor)`` multiplies the busy power of the
    first k executions of every run by factor. Each sample is the mean of the true power over the
    interval since the previous sample, reported ``delay_s`` late, with timestamp jitter and noise.
    Returns starts, ends, run ids, sample times, sample powers and the true gross energy of each
    execution (power while it runs, plus, in isolated mode, the tail above baseline within POST_S).
    """
    starts, ends, run_ids, factors = [], [], [], []
    t = 0.3 + rng.uniform(0, period_s)
    per_run = n // runs
    for r in range(runs):
        for j in range(per_run):
            d = dur_s * (1 + rng.uniform(-dur_jitter, dur_jitter))
            if j < outliers // runs:
                d *= 2.5
            starts.append(t)
            ends.append(t + d)
            run_ids.append(r)
            factors.append(warm[1] if warm and j < warm[0] else 1.0)
            t += d + (rng.uniform(*gap_s) if mode == "isolated" else 2e-5)
        t += 0.3 + rng.uniform(0, period_s)
    starts, ends, factors = np.array(starts), np.array(ends), np.array(factors)
    t_end = t + 0.3
    grid = np.arange(0.0, t_end, dt_s)
    p = np.full(grid.size, BASE_W)
    for s, e, f in zip(starts, ends, factors, strict=True):
        i0, i1 = np.searchsorted(grid, [s, e])
        u = (grid[i0:i1] - s) / (e - s)
        p[i0:i1] += f * busy_W * (0.8 + 0.4 * u)
        i2 = np.searchsorted(grid, e + 8 * tau_s)
        p[i1:i2] += f * tail_W * np.exp(-(grid[i1:i2] - e) / tau_s)
    C, times, powers = sense(grid, p, t_end, dt_s, period_s, delay_s, noise_W, rng)
    if mode == "steady":
        nxt = np.append(starts[1:], np.inf)
        ext = np.where(nxt - ends < 0.5 * (ends - starts), nxt, ends)
        truth = C(ext) - C(starts)
    else:
        truth = C(ends + POST_S) - C(starts) - BASE_W * POST_S
    return starts, ends, np.array(run_ids), times, powers, truth


def estimate(data, mode, *, period_s=0.02, delay_s=0.004, **kw):
    starts, ends, _, times, powers, _ = data
    return superpose(starts, ends, times, powers, mode=mode, sensor_delay_s=delay_s, pre_s=PRE_S, post_s=POST_S, **kw)


def rel_errors(mode, *, n, dur_s, period_s, trials, n_boot=0, seed0=0, **kw):
    errors, covered = [], []
    for s in range(seed0, seed0 + trials):
        data = synth(np.random.default_rng(s), n=n, dur_s=dur_s, mode=mode, period_s=period_s, dt_s=1e-4, **kw)
        est = estimate(data, mode, period_s=period_s, n_boot=n_boot, seed=s)["all"]
        truth = data[5].mean()
        errors.append((est.energy_J - truth) / truth)
        covered.append(est.energy_ci_J[0] <= truth <= est.energy_ci_J[1])
    return np.array(errors), np.array(covered)


@pytest.mark.parametrize(
    ("mode", "dur_s", "period_s"),
    [("steady", 0.001, 0.02), ("steady", 0.01, 0.1), ("isolated", 0.01, 0.02), ("isolated", 0.1, 0.1)],
)
def test_energy_per_execution_is_accurate(mode, dur_s, period_s):
    n = 400 if mode == "steady" and dur_s < 0.01 else 60
    errors, _ = rel_errors(mode, n=n, dur_s=dur_s, period_s=period_s, trials=3)
    assert np.abs(errors).max() < 0.03, errors


def test_error_shrinks_with_executions_like_one_over_sqrt_n():
    # Isolated 10 ms executions under a 100 ms sensor: each execution is seen through a few
    # noisy samples, so the error is statistical and should fall ~ 1/sqrt(n) (16x n -> ~4x).
    few, _ = rel_errors("isolated", n=20, dur_s=0.01, period_s=0.1, trials=8, noise_W=30.0)
    many, _ = rel_errors("isolated", n=320, dur_s=0.01, period_s=0.1, trials=8, noise_W=30.0, seed0=100)
    rmse_few, rmse_many = np.sqrt(np.mean(few**2)), np.sqrt(np.mean(many**2))
    assert rmse_many < 0.5 * rmse_few, (rmse_few, rmse_many)
    assert rmse_many > 0.1 * rmse_few  # not suspiciously better than statistics allow


@pytest.mark.parametrize(
    ("mode", "dur_s", "period_s", "n"), [("isolated", 0.01, 0.02, 40), ("steady", 0.001, 0.1, 300)]
)
def test_bootstrap_ci_covers_truth_at_about_the_stated_rate(mode, dur_s, period_s, n):
    _, covered = rel_errors(mode, n=n, dur_s=dur_s, period_s=period_s, trials=30, n_boot=60, noise_W=20.0)
    assert 0.75 <= covered.mean() <= 1.0, covered.mean()  # stated 95 %; loose bounds for 30 trials


def test_profile_recovers_the_shape_and_the_tail():
    data = synth(np.random.default_rng(7), n=150, dur_s=0.1, mode="isolated", dt_s=1e-4)
    res = estimate(data, "isolated", n_bins=8, n_boot=20)
    prof = res["all"]
    assert res.baseline_source == "idle samples"
    assert res.baseline_W == pytest.approx(BASE_W, abs=2.0)
    inside = (prof.u > 0) & (prof.u < 1)
    truth_inside = BASE_W + 400.0 * (0.8 + 0.4 * prof.u[inside])
    np.testing.assert_allclose(prof.power_W[inside], truth_inside, rtol=0.06)
    assert prof.power_W[prof.u > 1][0] > BASE_W + 50  # the tail right after the end
    assert prof.power_W[-1] == pytest.approx(BASE_W, abs=15)  # gone 100 ms later
    assert prof.power_ci_W.shape == (2, prof.power_W.size)
    assert prof.dynamic_energy_J == pytest.approx(prof.energy_J - res.baseline_W * prof.duration_s)


def test_given_baseline_is_used_and_reported():
    data = synth(np.random.default_rng(3), n=400, dur_s=0.001, mode="steady", dt_s=1e-4)
    res = estimate(data, "steady", baseline_W=90.0, n_boot=0)
    assert res.baseline_W == 90.0 and res.baseline_source == "given"
    assert "baseline_W" in res.subtracted


def test_binning_drops_planted_outliers(caplog):
    rng = np.random.default_rng(0)
    durations = rng.normal(0.01, 0.0002, 200)
    durations[rng.choice(200, 12, replace=False)] *= 2.0
    b = bin_executions(durations)
    assert b.dropped == 12 and b.keep.sum() == 188
    assert not b.too_many_dropped
    assert b.groups[0][2] == 188
    with caplog.at_level(logging.WARNING):
        b = bin_executions(np.r_[np.full(10, 0.01), np.full(8, 0.05)], max_drop_fraction=0.2)
    assert b.too_many_dropped and "dropped 8 of 18" in caplog.text


def test_dropped_executions_do_not_bias_the_kept_ones():
    data = synth(np.random.default_rng(1), n=60, dur_s=0.01, mode="isolated", outliers=6, dt_s=1e-4)
    starts, ends, _, times, powers, truth = data
    b = bin_executions(ends - starts)
    assert b.dropped == 6
    labels = np.where(b.keep, "all", DROPPED)
    res = superpose(starts, ends, times, powers, mode="isolated", sensor_delay_s=0.004, labels=labels, n_boot=0)
    assert set(res.profiles) == {"all"} and res["all"].executions == 54
    assert res["all"].energy_J == pytest.approx(truth[b.keep].mean(), rel=0.02)


def test_position_labels():
    assert position_labels([0, 0, 0, 1, 1], warm_executions=1).tolist() == [
        "first",
        "warming",
        "steady",
        "first",
        "warming",
    ]


def test_differentiation_finds_a_planted_warm_up_transient(caplog):
    kw = dict(n=600, dur_s=0.01, mode="steady", runs=20, dt_s=1e-4)

    def check(warm, seed):
        starts, ends, runs, times, powers, truth = synth(np.random.default_rng(seed), warm=warm, **kw)
        diff = differentiate(starts, ends, runs, times, powers, sensor_delay_s=0.004, n_boot=0)
        labels = position_labels(runs)
        true_W = {lab: truth[labels == lab].mean() for lab in ("first", "warming", "steady")}
        # Equal durations: energy ratio = power ratio. The single first execution of each run is
        # read 3-6 % low in this synthetic stream (some of its energy goes to the warming
        # executions it is contiguous with, which inherit its tail), before and after pauses and
        # run tails got their own levels in steady mode: a known limit, hence its wider tolerance.
        for lab, tol in (("first", 0.08), ("warming", 0.05)):
            assert diff.rel_diff[lab] == pytest.approx(true_W[lab] / true_W["steady"] - 1, abs=tol)
        return diff

    with caplog.at_level(logging.WARNING):
        planted = check((6, 1.5), 5)
    assert "warming" in planted.differs and planted.rel_diff["warming"] > 0.25
    assert "power-profile differentiation" in caplog.text
    # Without the transient warming looks like steady state; the first execution still differs
    # (it lacks the power tail its predecessor leaves to every later execution), as it should.
    control = check(None, 6)
    assert "warming" not in control.differs and "first" in control.differs


def test_input_validation():
    with pytest.raises(ValueError, match="mode"):
        superpose([0.0], [1.0], [0.0, 1.0, 2.0], [1.0, 1.0, 1.0], mode="bursty")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="end after"):
        superpose([1.0], [1.0], [0.0, 1.0, 2.0], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="3 power samples"):
        superpose([0.0], [1.0], [0.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        bin_executions([0.0, 1.0])


def synth_chunks(rng, *, dur_s, chunk_s=0.25, n_chunks=8, pause_s=0.003, busy_W=400.0, pause_W=350.0,
                 period_s=0.02, delay_s=0.004, noise_W=3.0, idle_s=0.5, dt_s=2e-5):  # fmt: skip
    """Back-to-back executions in chunks separated by short pauses at high power (the profiler's steady mode).

    Executions share their boundaries inside a chunk (gap exactly 0) and draw BASE_W + busy_W
    (flat, so the superposition model is exact); a pause of ~``pause_s`` between chunks draws
    BASE_W + pause_W (a sync at near-full power); after the last execution the power decays
    to BASE_W (tau 15 ms). The sensor averages over its 20 ms sample interval. Returns starts,
    ends, sample times and powers, the true energy of each execution and the pauses (s).
    """
    starts, ends, pauses = [], [], []
    t = idle_s + rng.uniform(0, period_s)
    for c in range(n_chunks):
        t_end = t + chunk_s
        while t < t_end:
            d = dur_s * (1 + rng.uniform(-0.02, 0.02))
            starts.append(t)
            ends.append(t + d)
            t += d
        if c < n_chunks - 1:
            p = pause_s * (1 + rng.uniform(-0.2, 0.2))
            pauses.append((t, t + p))
            t += p
    starts, ends, pauses = np.array(starts), np.array(ends), np.array(pauses)
    t_stop = t + idle_s
    grid = np.arange(0.0, t_stop, dt_s)
    power = np.full(grid.size, BASE_W)
    for lo, hi, level in [(s, e, busy_W) for s, e in zip(starts, ends, strict=True)] + [
        (s, e, pause_W) for s, e in pauses
    ]:
        i0, i1 = np.searchsorted(grid, [lo, hi])
        power[i0:i1] += level
    i1 = np.searchsorted(grid, ends[-1])
    power[i1:] += busy_W * np.exp(-(grid[i1:] - ends[-1]) / 0.015)
    C, times, powers = sense(grid, power, t_stop, dt_s, period_s, delay_s, noise_W, rng)
    return starts, ends, times, powers, C(ends) - C(starts), pauses


@pytest.mark.parametrize("dur_s", [0.001, 0.01])
def test_steady_pauses_between_chunks_are_not_charged_to_the_executions(dur_s):
    # 2 s of executions in 0.25 s chunks with 3 ms pauses where the power stays high, as
    # profile() runs steady mode. Modelled at the idle baseline, each pause's excess
    # (pause_W + BASE_W − baseline) × pause length would land in the executions: a bias of
    # about (pause_W) × total pause time / total execution energy (~0.7 % here; +1.3–1.7 % was
    # read on an H200 at 1 ms). With their own level the model is exact, so what remains is
    # the sensor noise: the executions' power level is fitted from N ≈ 2 s / 20 ms samples of
    # noise σ, a relative standard error σ / (P √N). The bound is 4 of those.
    noise_W, period_s, busy_W, pause_W = 3.0, 0.02, 400.0, 350.0
    for seed in range(4):
        starts, ends, times, powers, truth, pauses = synth_chunks(
            np.random.default_rng(seed), dur_s=dur_s, busy_W=busy_W, pause_W=pause_W, noise_W=noise_W
        )
        res = superpose(starts, ends, times, powers, mode="steady", sensor_delay_s=0.004, launch_gap_s=0.0, n_boot=0)
        n_samples = (ends[-1] - starts[0]) / period_s
        se = noise_W / ((BASE_W + busy_W) * np.sqrt(n_samples))
        pause_bias = pause_W * (pauses[:, 1] - pauses[:, 0]).sum() / truth.sum()
        assert pause_bias > 10 * se  # the test can tell the two models apart
        err = res["all"].energy_J / truth.mean() - 1
        assert abs(err) < 4 * se, (seed, err, se, pause_bias)
        assert res.gap_time_s == pytest.approx((pauses[:, 1] - pauses[:, 0]).sum())
        assert res.gap_power_W == pytest.approx(BASE_W + pause_W, rel=0.1)
        assert res.baseline_W == pytest.approx(BASE_W, abs=2.0)  # the run's tail has its own bins
        assert res.tail_power_W is not None and res.tail_power_W > BASE_W + 10


def test_regular_pauses_collinear_with_the_executions_stay_bounded():
    # A pause after every execution is as collinear with the executions as it can be: its
    # level is tied to theirs (it cannot be told apart), not left free to run off.
    rng = np.random.default_rng(0)
    starts = 0.5 + np.arange(1800) * 1.1e-3
    ends = starts + 1e-3
    times = np.arange(0.02, 3.0, 0.02)
    busy = (times - 0.004 > starts[0]) & (times - 0.004 < ends[-1])
    powers = np.where(busy, 500.0, BASE_W) + rng.normal(0, 3.0, times.size)
    res = superpose(starts, ends, times, powers, mode="steady", sensor_delay_s=0.004, launch_gap_s=0.0, n_boot=0)
    assert res.gap_time_s == pytest.approx(1799 * 1e-4)
    assert BASE_W < res.gap_power_W < 600.0
    assert res["all"].energy_J == pytest.approx(500.0 * 1e-3, rel=0.05)


@pytest.mark.parametrize("confidence", [0.90, 0.95, 0.99])
def test_an_interval_needs_the_executions_its_bootstrap_needs(confidence):
    """Below :func:`min_executions_for_interval` a percentile bootstrap over executions returns the data's range.

    Shown on the bootstrap itself, not on the rule: resample ``n`` distinct values with replacement
    (seeded, 40 000 replicates) and take the tail quantiles of the replicate means. With one fewer
    than the minimum, a tail quantile is an extreme replicate (one value ``n`` times, probability
    ``n**-n`` at least the tail's share): an interval end equals a single execution's value. At the
    minimum both ends fall strictly inside the data's range, as an interval for a mean should.
    """
    from zeus_callbacks.measurement.finegrain import interval_reason, min_executions_for_interval

    need = min_executions_for_interval(confidence)
    alpha = (1 - confidence) / 2
    rng = np.random.default_rng(0)

    def ends(n):
        values = np.arange(1.0, n + 1)  # distinct executions' energies
        means = values[rng.integers(0, n, (40_000, n))].mean(axis=1)
        return np.quantile(means, [alpha, 1 - alpha]), values

    (lo, hi), values = ends(need - 1)
    assert lo == values.min() or hi == values.max()  # an end is one execution's own value
    (lo, hi), values = ends(need)
    assert values.min() < lo and hi < values.max()
    assert interval_reason(need, confidence) is None
    assert f"at least {need}" in interval_reason(need - 1, confidence)
    assert min_executions_for_interval(0.95) == 4  # the figure the docs quote
    with pytest.raises(ValueError, match="confidence"):
        min_executions_for_interval(1.0)
