"""The candidate grid, the Student-t interval and the shape-robust search (pure functions, no session)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from scipy import stats

from zeus_callbacks.backends import traces
from zeus_callbacks.optimizers.power_limit._limit_profile import LimitProfile, t_interval, t_quantile_975
from zeus_callbacks.optimizers.power_limit._limit_profiler import PowerLimitProfiler, ProfileSettings
from zeus_callbacks.optimizers.power_limit._objective import INFEASIBLE_COST, Objective
from zeus_callbacks.optimizers.power_limit._search import (
    Measured,
    SearchPlan,
    SearchSettings,
    neighbour_pooled_costs,
    power_limit_grid_W,
    tolerance,
    wiener_gaps,
)

# Two-sided 95 % Student-t quantiles from the printed tables (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2).
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}

# Shared strategies: a device's minimum limit (W), and the noise seeds.
MIN_LIMITS_W = st.sampled_from([100.0, 125.0, 150.0, 200.0])
SEEDS = st.integers(0, 2**32 - 1)


# -- grid ----------------------------------------------------------------------------
def test_the_grid_is_the_zeus_grid_where_the_step_divides_the_range():
    assert power_limit_grid_W(100, 300) == [300, 275, 250, 225, 200, 175, 150, 125, 100]
    assert power_limit_grid_W(200, 700, 50)[:3] == [700, 650, 600]


def test_the_grid_keeps_both_ends_where_the_step_does_not_divide_the_range():
    grid = power_limit_grid_W(100, 260, 25)
    assert grid[0] == 260 and grid[-1] == 100 and len(grid) == 8  # 7 equal parts of 22.9 W
    assert np.allclose(np.diff(grid), -160 / 7, atol=1e-3)
    assert power_limit_grid_W(150, 150, 25) == [150]
    with pytest.raises(ValueError):
        power_limit_grid_W(200, 100)


@settings(deadline=None)  # a loaded CI machine must not turn a slow example into a failure
@given(st.floats(50, 600, allow_nan=False), st.floats(0, 600, allow_nan=False), st.floats(1, 100, allow_nan=False))
def test_any_range_and_step_give_both_ends_and_no_gap_wider_than_the_step(low, width, step):
    high = low + width
    width = high - low  # the span the grid sees: low + width - low can round below 1e-3
    grid = power_limit_grid_W(low, high, step)
    assert grid[0] == high
    if width < 1e-3:  # a range of one point (under 1 mW wide): one limit
        assert grid == [high]
        return
    assert grid[-1] == low
    gaps = -np.diff(grid)
    assert np.all(gaps > 0) and np.all(gaps <= step + 2e-3)
    assert len(grid) == math.ceil(width / step - 1e-9) + 1


# -- Student-t interval -----------------------------------------------------------------
@pytest.mark.parametrize("n", range(2, 11))
def test_the_interval_uses_the_t_quantile_for_n_minus_one_degrees_of_freedom(n):
    rng = np.random.default_rng(n)
    values = list(rng.normal(10.0, 1.0, n))
    low, high = t_interval(values)
    half = stats.t.ppf(0.975, n - 1) * np.std(values, ddof=1) / math.sqrt(n)
    assert (high - low) / 2 == pytest.approx(half, rel=1e-12)
    assert (low + high) / 2 == pytest.approx(np.mean(values), rel=1e-12)
    if n - 1 in T_TABLE:
        assert t_quantile_975(n - 1) == pytest.approx(T_TABLE[n - 1], abs=5e-4)
    assert t_quantile_975(n - 1) > 1.96  # wider than the normal interval at every small n


def test_fewer_than_two_values_give_an_unbounded_interval():
    assert t_interval([1.0]) == (-math.inf, math.inf)


def test_a_limit_two_watts_from_the_best_is_measured_again_when_the_job_repays_it():
    # The A40 movielens-1m case of the families benchmark: the optimum, 200 W, is a kink of the curve
    # (0.3 % a watt either side), and a refine point 2.1 W below it read cheaper over a short window.
    # A 50 000-step job repays measuring the two again; before, a tie this close in watts was settled.
    grid = power_limit_grid_W(100, 300, 35)
    prof = _profiler(grid, "energy", job_steps=50_000)
    rng = np.random.default_rng(0)

    def window(limit_W: float, level: float, n: int) -> None:
        energy = list(level * (1 + 0.03 * rng.standard_normal(n)))
        prof.profiles[limit_W] = LimitProfile(limit_W, energy, [1.0] * n, steps=n + 1)

    for x in grid:
        window(x, 1.08, 6)
    window(200.0, 1.004, 6)
    window(197.907, 0.995, 12)
    assert prof._polish() is not None
    # the tie's ranking on its own (the wide gaps beside the pair may be probed first, see below)
    informative = _most_informative(prof)
    assert informative is not None and informative[0] in (200.0, 197.907)
    assert prof._polish_steps(informative[0]) >= 6


def test_the_best_is_not_measured_again_against_itself():
    # Every other limit is settled (clearly dearer over long windows): nothing is left to tell the best
    # from, however wide its own interval, so the polish ends instead of spending the job's share on it.
    grid = power_limit_grid_W(100, 300, 35)
    prof = _profiler(grid, "energy", job_steps=50_000)
    rng = np.random.default_rng(1)
    for x in grid:
        level, n = (1.0, 6) if x == 200.0 else (1.2, 40)
        energy = list(level * (1 + 0.03 * rng.standard_normal(n)))
        prof.profiles[x] = LimitProfile(x, energy, [1.0] * n, steps=n + 1)
    assert _most_informative(prof) is None


def _most_informative(prof: PowerLimitProfiler) -> tuple[float, float] | None:
    """The profiler's ranking of measured limits to measure again, as its polish calls it."""
    feasible = {x: m for x, m in prof.measured().items() if prof.profiles[x].n >= 2}
    best_x = min(feasible, key=lambda x: (feasible[x].cost, -x))
    budget_left = prof.settings.polish_budget * prof.settings.job_steps - prof.excess_steps(best_x)
    return prof._most_informative(feasible, best_x, prof._price(best_x), budget_left)


# -- the gaps between measured limits: a Brownian bridge (issue 31) -------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_the_gap_model_recovers_the_variance_per_watt_of_a_wiener_curve(seed):
    # A curve drawn as a Wiener process (variance 0.04 per W) and measured exactly at 301 random limits:
    # the bridge's variance at a gap's middle is kappa² · gap / 4, kappa² its maximum-likelihood estimate
    # (relative standard error sqrt(2/300) = 8 %; 30 % is ~3.7 of them)
    rng = np.random.default_rng(seed)
    limits = np.sort(rng.uniform(100.0, 400.0, 301))
    costs = 10.0 + np.concatenate([[0.0], np.cumsum(rng.normal(0.0, np.sqrt(0.04 * np.diff(limits))))])
    measured = {float(x): Measured(float(c)) for x, c in zip(limits, costs, strict=True)}
    gaps = wiener_gaps(measured, 0.5)
    assert gaps and all(g.limit_W not in measured for g in gaps)
    widths = dict(zip(limits[:-1], np.diff(limits), strict=True))
    for g in gaps:
        a = max(x for x in limits if x < g.limit_W)
        kappa2 = 4 * g.sd**2 / widths[a]
        assert kappa2 == pytest.approx(0.04, rel=0.3)
        b = min(x for x in limits if x > g.limit_W)
        assert g.cost == pytest.approx(0.5 * (measured[a].cost + measured[b].cost))
    # only the gaps at least min_gap_W wide
    assert len(gaps) == int(np.sum(np.diff(limits) >= 0.5))


def test_the_gap_model_takes_measurement_noise_out_of_the_curves_variance_and_into_the_ends():
    # three limits 10 W apart, costs 1.0, 1.2, 1.0, each with a 95 % half-width of 0.098 (sd 0.05): the
    # middle lies 0.2 off the line through its neighbours, whose noise there is 0.05² (1 + 1/4 + 1/4);
    # kappa² = (0.2² − 1.5 · 0.05²) / (10 · 10 / 20); a gap's middle: kappa² · 10 / 4 + 2 · 0.05² / 4
    measured = {100.0: Measured(1.0, 0.098), 110.0: Measured(1.2, 0.098), 120.0: Measured(1.0, 0.098)}
    gaps = wiener_gaps(measured, 2.0)
    assert [g.limit_W for g in gaps] == [105.0, 115.0]
    sd = 0.098 / 1.96
    kappa2 = (0.2**2 - 1.5 * sd**2) / 5
    for g in gaps:
        assert g.cost == pytest.approx(1.1)
        assert g.sd == pytest.approx(math.sqrt(kappa2 * 10 / 4 + 2 * sd**2 / 4))
    # under three limits nothing is predicted (no residual to go by); infeasible ones are out
    assert wiener_gaps({100.0: Measured(1.0), 120.0: Measured(1.1)}, 2.0) == []
    assert len(wiener_gaps({**measured, 90.0: Measured(INFEASIBLE_COST)}, 2.0)) == 2


@given(slope=st.floats(-0.05, 0.05), spacing=st.floats(1.0, 50.0), n=st.integers(3, 12))
def test_a_straight_cost_line_however_steep_predicts_no_spread_in_its_gaps(slope, spacing, n):
    # the bridge's mean follows any trend: only the curve's bends (residuals from the neighbours' line) count
    measured = {100.0 + k * spacing: Measured(1.0 + slope * k * spacing) for k in range(n)}
    gaps = wiener_gaps(measured, 0.5)
    assert len(gaps) == n - 1
    assert all(g.sd == pytest.approx(0.0, abs=1e-6) for g in gaps)


def test_the_grid_gives_the_variance_when_refined_limits_crowd_it():
    # two refine points a watt from a grid limit, their difference pure noise the short windows understate:
    # from the grid alone, the curve (straight between its grid limits) has no spread; from every limit, it has
    grid = [100.0, 125.0, 150.0, 175.0]
    measured = {x: Measured(1.0 + 0.001 * (x - 100.0)) for x in grid}
    measured |= {149.0: Measured(1.05), 151.0: Measured(1.0)}
    assert all(g.sd == pytest.approx(0.0, abs=1e-6) for g in wiener_gaps(measured, 10.0, variance_from_W=grid))
    assert all(g.sd > 0.01 for g in wiener_gaps(measured, 10.0))


@given(slope=st.floats(-0.05, 0.05), spacing=st.floats(1.0, 50.0), n=st.integers(3, 12), sd=st.floats(1e-4, 0.05))
def test_pooling_keeps_a_straight_cost_line_however_steep_and_noisy_its_intervals(slope, spacing, n, sd):
    # the line through a limit's neighbours is the curve's own value on a straight stretch: nothing moves
    measured = {100.0 + k * spacing: Measured(1.0 + slope * k * spacing, 1.96 * sd) for k in range(n)}
    pooled = neighbour_pooled_costs(measured)
    assert pooled == pytest.approx({x: m.cost for x, m in measured.items()}, rel=1e-9, abs=1e-12)


def test_a_lucky_short_reading_between_two_neighbours_is_pooled_up_and_a_narrow_one_keeps_its_value():
    # 656 W read from 4 steps 2 % below both neighbours (zeus_cost steep 200-700 W, seed 0, N = 10 000):
    # chosen on its reading, 1.5 % above the optimum. Pooled with its neighbours' line it is no longer least.
    grid = [600.0, 625.0, 650.0, 675.0, 700.0]
    measured = {x: Measured(175.0 + 0.02 * (700.0 - x), 0.3) for x in grid}  # straight, least at 700 W
    measured[655.0] = Measured(172.0, 3.0)  # short window, lucky
    pooled = neighbour_pooled_costs(measured, variance_from_W=grid)
    assert min(measured, key=lambda x: measured[x].cost) == 655.0
    assert min(pooled, key=pooled.get) == 700.0 and pooled[655.0] > 175.0
    # the same reading from a long window (a narrow interval) is believed: a real dip stays the choice
    measured[655.0] = Measured(172.0, 0.05)
    pooled = neighbour_pooled_costs(measured, variance_from_W=grid)
    assert min(pooled, key=pooled.get) == 655.0
    assert pooled[655.0] == pytest.approx(172.0, abs=0.2)
    # the ends and a set of two keep their readings
    assert pooled[600.0] == measured[600.0].cost and pooled[700.0] == measured[700.0].cost
    assert neighbour_pooled_costs({100.0: Measured(1.0, 0.1), 120.0: Measured(0.5, 0.1)}) == {100.0: 1.0, 120.0: 0.5}


@pytest.mark.parametrize("seed", range(3))
def test_choosing_by_pooled_costs_pays_less_for_the_winners_curse_than_by_readings(seed):
    # 40 limits on a smooth valley, each read from a short window (sd 1 % of the cost): the least reading
    # is the luckiest of many. Over 200 draws the pooled choice's true excess is ~20 % lower on average.
    rng = np.random.default_rng(seed)
    limits = np.linspace(100.0, 300.0, 40)
    true = 1.0 + 0.5 * ((limits - 230.0) / 200.0) ** 2
    raw_gap, pooled_gap = [], []
    for _ in range(200):
        reads = true * (1 + 0.01 * rng.standard_normal(limits.size))
        measured = {float(x): Measured(float(c), 1.96 * 0.01 * float(c)) for x, c in zip(limits, reads, strict=True)}
        pooled = neighbour_pooled_costs(measured)
        raw_gap.append(true[int(np.argmin(reads))] - true.min())
        pooled_gap.append(true[list(pooled).index(min(pooled, key=pooled.get))] - true.min())
    assert np.mean(pooled_gap) < 0.9 * np.mean(raw_gap), (np.mean(pooled_gap), np.mean(raw_gap))


@pytest.mark.parametrize(("gpu", "workload"), [("V100", "sentiment140"), ("A40", "movielens-1m")])
def test_a_long_job_finds_an_optimum_between_two_grid_limits(gpu, workload):
    # The bundled traces are measured every 25 W and interpolated linearly (time and power apart, so energy
    # bends between knots); on a 35 W grid the optimum is a knot no grid limit reaches. V100 sentiment140:
    # the search refines a valley 1 % dearer (150 W lies between 130 and 160 W); A40 movielens-1m: the
    # golden-section search may take the 200 W valley, 1.7 % dearer than the knot at 275 W. Untold the
    # job's length, some seeds pay that. Told 10 000 steps or more, the gap probes find the optimum's
    # valley: every seed within 0.75 %, 0.4 % on average.
    curve = traces.power_curve(traces.bundled_trace(gpu), workload)

    def energy_of(x: float) -> float:
        t = np.interp(x, curve.power_limit_W, curve.time_per_epoch_s)
        return float(t * np.interp(x, curve.power_limit_W, curve.average_power_W))

    best = min(energy_of(x) for x in np.linspace(curve.min_limit_W, curve.max_limit_W, 6001))
    grid = power_limit_grid_W(curve.min_limit_W, curve.max_limit_W, 35)
    untold = [energy_of(_train(_profiler(grid, "energy"), energy_of, 0.01, seed)) / best - 1 for seed in range(4)]
    assert max(untold) > 0.01
    for job_steps in (10_000, 50_000):
        gaps = []
        for seed in range(4):
            prof = _profiler(grid, "energy", job_steps=job_steps)
            chosen = _train(prof, energy_of, 0.01, seed)
            gaps.append(energy_of(chosen) / best - 1)
            assert prof.excess_steps(chosen) <= 1.25 * prof.settings.polish_budget * job_steps
        assert max(gaps) < 0.0075 and np.mean(gaps) < 0.004, (job_steps, gaps)


# -- search ----------------------------------------------------------------------------
def drive(plan: SearchPlan, cost_fn, half_width: float = 0.0) -> tuple[float, dict[float, Measured]]:
    """Run the search on exact (or fixed-width) measurements; return (choice, what it measured)."""
    measured: dict[float, Measured] = {}
    for _ in range(200):
        x = plan.next_limit(measured)
        if x is None:
            break
        measured[x] = Measured(cost_fn(x), half_width)
    else:
        raise AssertionError("the search did not stop")
    return min(measured, key=lambda x: (measured[x].cost, -x)), measured


def test_the_ends_are_measured_first():
    plan = SearchPlan(power_limit_grid_W(100, 250, 25))
    assert plan.next_limit({}) == 250
    assert plan.next_limit({250.0: Measured(1.0)}) == 100


def test_a_plateau_over_the_upper_limits_does_not_hide_an_optimum_near_the_minimum():
    # flat above 150 W, falling towards 110 W: the golden-section probes all sit on the plateau
    def cost(x: float) -> float:
        return 1.0 if x >= 150 else 1.0 - 0.004 * (150 - x) + 0.0004 * max(0.0, 110 - x) ** 2

    choice, _ = drive(SearchPlan(power_limit_grid_W(100, 400, 25)), cost)
    best = min(cost(x) for x in np.arange(100, 400.25, 0.25))
    assert cost(choice) <= best * 1.01


def test_a_curve_flat_everywhere_costs_no_more_than_the_grid():
    grid = power_limit_grid_W(100, 250, 25)
    _, measured = drive(SearchPlan(grid), lambda x: 5.0, half_width=0.05)
    assert len(measured) <= len(grid)


def test_the_sweep_measures_every_grid_limit_highest_first_and_nothing_else():
    grid = power_limit_grid_W(100, 260, 25)
    plan = SearchPlan(grid)
    plan.settings = SearchSettings(kind="sweep")
    order = []
    measured: dict[float, Measured] = {}
    while (x := plan.next_limit(measured)) is not None:
        order.append(x)
        measured[x] = Measured(1.0)
    assert order == grid


@settings(max_examples=150, deadline=None)
@given(
    low=MIN_LIMITS_W,
    width=st.floats(100, 500),
    step=st.sampled_from([20.0, 25.0, 35.0]),
    opt_frac=st.floats(0, 1),
    curvature=st.floats(0.2, 5.0),
    plateau_frac=st.floats(0, 1),
)
# Found in a stressed CI run: a plateau 0.01 % above the best grid limit, a tie under the noise floor.
@example(low=100.0, width=321.0, step=20.0, opt_frac=0.09375, curvature=0.25, plateau_frac=0.125)
def test_on_exact_unimodal_curves_the_choice_is_within_one_percent_of_the_true_optimum(
    low, width, step, opt_frac, curvature, plateau_frac
):
    high = low + width
    opt = low + opt_frac * width
    flat_from = low + plateau_frac * width  # the curve is flat above this (a plateau), if above the optimum

    def cost(x: float) -> float:
        x = min(x, max(flat_from, opt))
        return 1.0 + curvature * ((x - opt) / width) ** 2

    grid = power_limit_grid_W(low, high, step)
    best = min(cost(x) for x in np.linspace(low, high, 2001))
    # A valley narrower than the grid's spacing (e.g. 100-221 W in 17 W steps, curvature 5) puts every
    # grid limit more than 1 % above the optimum: that is the grid's limit, not the search's, and
    # docs/power_limit.md lists it among the cases the search does not reach.
    assume(min(cost(x) for x in grid) <= best * 1.01)
    choice, measured = drive(SearchPlan(grid), cost)
    assert cost(choice) <= best * 1.01
    # Never worse than the best grid limit by more than the search can tell apart: costs within the
    # noise floor (0.2 %) are ties by design, even on an exact curve.
    best_grid = Measured(min(cost(x) for x in grid))
    assert cost(choice) <= best_grid.cost + tolerance(Measured(cost(choice)), best_grid, SearchSettings().noise_floor)
    assert high in measured and low in measured


# -- max_slowdown: the feasibility boundary --------------------------------------------
def _dvfs_card(low: float, high: float, binds_frac: float):
    """(time factor, energy) of a DVFS-like card whose draw is ``low + binds_frac·(high − low)`` W when unbound.

    Busy power P(f) = Ps + (Pu − Ps)·f³, time m + (1 − m)/f with m = 0.4 (the clock-bound part), as in
    benchmarks/power_limit_families.py; a limit caps the power at min(limit, Pu).
    """
    unbound_W, static_W = low + binds_frac * (high - low), 0.8 * low

    def time_energy(limit_W: float) -> tuple[float, float]:
        power_W = min(limit_W, unbound_W)
        f = max((power_W - static_W) / (unbound_W - static_W), 1e-9) ** (1 / 3)
        t = 0.4 + 0.6 / f
        return t, power_W * t

    return time_energy


@settings(max_examples=60, deadline=None)
@given(
    low=MIN_LIMITS_W,
    width=st.floats(100, 500),
    step=st.sampled_from([25.0, 35.0]),
    binds_frac=st.floats(0.2, 1.0),
)
def test_max_slowdown_finds_the_boundary_below_a_plateau_within_one_percent(low, width, step, binds_frac):
    # The energy falls steeply just above the slowdown boundary and is flat where the limit does not bind:
    # the slope seen on the plateau says nothing of the fall below it, the unused slowdown does.
    high = low + width
    time_energy = _dvfs_card(low, high, binds_frac)
    t_max = time_energy(high)[0]
    allowed = 1.1

    def measure(x: float) -> Measured:
        t, e = time_energy(x)
        cost = e if t <= allowed * t_max else INFEASIBLE_COST * (1 + t / t_max) + e
        return Measured(cost, 0.0, t / t_max)

    plan = SearchPlan(power_limit_grid_W(low, high, step), SearchSettings(max_slowdown=allowed))
    measured: dict[float, Measured] = {}
    while (x := plan.next_limit(measured)) is not None:
        assert len(measured) < 60, "the search did not stop"
        measured[x] = measure(x)
    choice = min(measured, key=lambda x: (measured[x].cost, -x))
    feasible = [e for t, e in map(time_energy, np.linspace(low, high, 4001)) if t <= allowed * t_max]
    assert time_energy(choice)[0] <= allowed * t_max
    assert time_energy(choice)[1] <= 1.01 * min(feasible)


@settings(max_examples=60, deadline=None)
@given(
    seed=SEEDS,
    low=MIN_LIMITS_W,
    width=st.floats(100, 500),
    step=st.sampled_from([25.0, 35.0]),
    binds_frac=st.floats(0.2, 1.0),
    rel_sd=st.floats(0.002, 0.02),
)
def test_max_slowdown_noisy_slowdowns_below_the_boundary_do_not_start_a_sweep(
    seed, low, width, step, binds_frac, rel_sd
):
    # The limits slower than allowed cost INFEASIBLE_COST × (1 + slowdown): with noisy slowdowns their
    # order is noise (seen: 186.9, 187.9, 189.6 W measured 1.102, 1.106, 1.102 on convex 100-260 W),
    # which made the shape check sweep the grid below the boundary, every limit there too slow.
    rng = np.random.default_rng(seed)
    high = low + width
    time_energy = _dvfs_card(low, high, binds_frac)
    t_max = time_energy(high)[0]
    allowed = 1.1

    def measure(x: float) -> Measured:
        t, e = time_energy(x)
        slowdown = t / t_max * (1 + rel_sd * rng.standard_normal())
        cost = e if t <= allowed * t_max else INFEASIBLE_COST * (1 + slowdown) + e
        return Measured(cost, 0.0, slowdown)

    plan = SearchPlan(power_limit_grid_W(low, high, step), SearchSettings(max_slowdown=allowed))
    measured: dict[float, Measured] = {}
    while (x := plan.next_limit(measured)) is not None:
        assert len(measured) < 60, "the search did not stop"
        measured[x] = measure(x)
    assert not plan.fallback_sweep  # the feasible limits are unimodal (exact), the slow ones are one stretch
    choice = min(measured, key=lambda x: (measured[x].cost, -x))
    assert time_energy(choice)[0] <= allowed * t_max
    # (no 1 % bound here: a noisy slowdown moves the secant's estimate of the boundary; with exact
    # slowdowns the test above holds it)


@settings(max_examples=40, deadline=None)
@given(seed=SEEDS, steps=st.integers(0, 6))
def test_a_fallback_sweep_skips_the_limits_below_one_too_slow(seed, steps):
    # max_slowdown with a second valley among the feasible limits: the sweep measures the remaining
    # feasible grid, not the limits below one already measured too slow (a lower limit is slower still)
    grid = power_limit_grid_W(100, 250, 25)  # 100, 125, ..., 250
    plan = SearchPlan(grid, SearchSettings(max_slowdown=1.1))
    energy = {250.0: 10.0, 225.0: 9.0, 200.0: 9.5, 175.0: 8.9}  # not unimodal: 225 and 175 both dip
    measured = {x: Measured(e, 0.0, 1.0 + (250 - x) / 1000) for x, e in energy.items()}
    measured[100.0] = Measured(INFEASIBLE_COST * 2.3, 0.0, 1.3)
    measured[150.0] = Measured(INFEASIBLE_COST * 2.12, 0.0, 1.12)
    rng = np.random.default_rng(seed)
    asked = []
    for _ in range(steps + 1):
        x = plan.next_limit(measured)
        if x is None:
            break
        asked.append(x)
        measured[x] = Measured(INFEASIBLE_COST * 2.2, 0.0, 1.2) if x < 150 else Measured(9.0 + rng.random(), 0.0, 1.05)
    assert all(x > 150.0 for x in asked), asked  # 125 W lies below 150 W, measured too slow


# -- the card's measured noise and ties with the best ------------------------------------
def _profiler(limits_W, objective: str = "energy", **settings_kw) -> PowerLimitProfiler:
    return PowerLimitProfiler(limits_W, Objective(objective), lambda a, b, **_: None, ProfileSettings(**settings_kw))


@settings(max_examples=60, deadline=None)
@given(
    seed=SEEDS,
    rel_sd=st.floats(0.002, 0.05),
    windows=st.integers(1, 6),
    n=st.integers(2, 10),
    level=st.floats(1.0, 1000.0),
)
def test_a_too_quiet_window_is_widened_to_the_cards_pooled_noise(seed, rel_sd, windows, n, level):
    rng = np.random.default_rng(seed)
    prof = _profiler([100.0 + 10 * k for k in range(windows + 1)])
    pooled_ss, pooled_dof = 0.0, 0
    for k in range(windows):  # noisy windows at other limits: the card's noise
        values = list(level * (1 + rel_sd * rng.standard_normal(8)))
        prof.profiles[100.0 + 10 * k] = LimitProfile(100.0 + 10 * k, values, [1.0] * 8)
        mean = np.mean(values)
        pooled_ss += float(np.sum(((np.array(values) - mean) / mean) ** 2))
        pooled_dof += 7
    quiet = LimitProfile(100.0 + 10 * windows, [level] * n, [1.0] * n)  # a lucky window: no spread at all
    prof.profiles[quiet.limit_W] = quiet
    low, high = prof.interval(quiet)
    pooled_sd = math.sqrt(pooled_ss / pooled_dof)
    dof = pooled_dof + n - 1  # the quiet window adds n − 1 dof of zero deviation
    expected = stats.t.ppf(0.975, dof) * math.sqrt(pooled_ss / dof) * level / math.sqrt(n)
    assert (high - low) / 2 == pytest.approx(expected, rel=1e-9)
    assert (high - low) / 2 > 0 and pooled_sd > 0
    # a window that is the only one measured keeps its own Student-t interval
    alone = _profiler([100.0])
    values = list(level * (1 + rel_sd * rng.standard_normal(n)))
    alone.profiles[100.0] = LimitProfile(100.0, values, [1.0] * n)
    assert alone.interval(alone.profiles[100.0]) == pytest.approx(t_interval(values), rel=1e-12)


def _run_steps(prof: PowerLimitProfiler, cost_of, rel_sd: float, seed: int):
    """Run 1 s steps whose energy is ``cost_of(limit)`` with relative Gaussian noise; yield each step end's answer."""
    rng = np.random.default_rng(seed)
    energies: dict[tuple[float, float], float] = {}
    prof.energy_fn = lambda a, b, **_: energies.get((a, b))
    now = 0.0
    for step in range(5000):
        limit = prof.on_step_start(step, now)
        assert limit is not None
        energies[(now, now + 1.0)] = cost_of(limit) * (1 + rel_sd * rng.standard_normal())
        now += 1.0
        yield prof.on_step_end(step, now)


def _train(prof: PowerLimitProfiler, cost_of, rel_sd: float, seed: int) -> float:
    """Run :func:`_run_steps` until the profiler decides; return the choice."""
    for decided in _run_steps(prof, cost_of, rel_sd, seed):
        if decided:
            assert prof.chosen_limit_W is not None
            return prof.chosen_limit_W
    raise AssertionError("the profiler did not decide")


@settings(max_examples=40, deadline=None)
@given(seed=SEEDS, rel_sd=st.floats(0.003, 0.02), top_frac=st.floats(0.8, 1.0))
def test_the_best_and_a_runner_up_it_cannot_be_told_from_are_measured_again_before_choosing(seed, rel_sd, top_frac):
    # steep: the cost falls towards an optimum near the top of the range, where probes end up level
    def cost(x: float) -> float:
        return 1.0 + 2.0 * ((x - (100 + 150 * top_frac)) / 150) ** 2

    grid = power_limit_grid_W(100, 250, 35)
    prof = _profiler(grid)
    _train(prof, cost, rel_sd, seed)
    s = prof.settings
    assert prof.revisits <= s.max_revisits
    measured = prof.measured()
    best_x = min(measured, key=lambda x: (measured[x].cost, -x))
    best = measured[best_x]
    tied = [x for x, m in measured.items() if x != best_x and m.cost - best.cost <= tolerance(m, best, 0.002)]
    spread = max(m.cost for m in measured.values()) - best.cost
    if tied and len(tied) < len(measured) - 1 and spread > 2 * s.rel_ci * best.cost:
        runner = min(tied, key=lambda x: (measured[x].cost, -x))
        resolved = math.hypot(measured[runner].half_width, best.half_width) <= s.rel_ci * best.cost
        no_room = all(prof.profiles[x].n + s.min_profile_steps > s.profile_steps for x in (runner, best_x))
        assert resolved or no_room or prof.revisits == s.max_revisits


@settings(max_examples=20, deadline=None)
@given(seed=SEEDS)
def test_a_curve_flat_within_the_noise_is_not_measured_again(seed):
    prof = _profiler(power_limit_grid_W(100, 250, 25))
    _train(prof, lambda x: 5.0, 0.002, seed)
    assert prof.revisits == 0


@pytest.mark.parametrize("objective", ["max_slowdown", "energy"])
def test_max_slowdown_does_not_measure_again_a_tie_whose_limits_are_each_within_rel_ci(objective):
    # The best (200 W) and a runner-up just above it (225 W) tie; each 8-step window is within rel_ci
    # (±0.86 %) but together they are not (±1.21 %): energy measures again, max_slowdown leaves the
    # pair to the boundary narrowing (its windows at the boundary already ran on)
    prof = _profiler(power_limit_grid_W(100, 250, 25), objective)
    wobble = [1 + 0.0113 * (-1) ** k for k in range(8)]  # a relative sd of 1.21 %
    for limit, energy_J, time_s in ((250.0, 10.0, 1.0), (225.0, 8.05, 1.02), (200.0, 8.0, 1.05), (100.0, 12.0, 1.3)):
        prof.profiles[limit] = LimitProfile(limit, [energy_J * w for w in wobble], [time_s] * 8)
    measured = prof.measured()
    rel = {x: measured[x].half_width / measured[x].cost for x in (200.0, 225.0)}
    assert all(0.008 < r < 0.01 for r in rel.values()), rel  # each within rel_ci on its own
    assert math.hypot(*(measured[x].half_width for x in (200.0, 225.0))) > 0.01 * measured[200.0].cost
    again = prof._contender()
    if objective == "max_slowdown":
        assert measured[100.0].cost >= INFEASIBLE_COST  # 1.3 × the maximum's time: too slow
        assert again is None
    else:
        assert again in (200.0, 225.0)


# -- windows: the late last step, sequential rejection, the sweep's fixed windows -------------
def _train_lagged(prof: PowerLimitProfiler, cost_of, rel_sd: float, seed: int) -> int:
    """Like :func:`_train`, but a step's energy arrives one step after it ends (the sensor's lag); returns steps run."""
    rng = np.random.default_rng(seed)
    energies: dict[tuple[float, float], float] = {}
    clock = {"now": 0.0}
    prof.energy_fn = lambda a, b, **_: energies.get((a, b)) if clock["now"] >= b + 1.0 else None
    for step in range(5000):
        now = clock["now"]
        limit = prof.on_step_start(step, now)
        assert limit is not None
        energies[(now, now + 1.0)] = cost_of(limit) * (1 + rel_sd * rng.standard_normal())
        clock["now"] = now + 1.0
        if prof.on_step_end(step, now + 1.0):
            return step + 1
    raise AssertionError("the profiler did not decide")


@settings(max_examples=30, deadline=None)
@given(seed=SEEDS, rel_sd=st.floats(0.003, 0.02))
def test_a_windows_last_step_joins_its_limit_after_the_switch_and_no_step_is_lost(seed, rel_sd):
    def cost(x: float) -> float:
        return 1.0 + 3.0 * ((x - 180) / 150) ** 2

    prof = _profiler(power_limit_grid_W(100, 250, 25), warmup_steps=2, min_profile_steps=4)
    steps = _train_lagged(prof, cost, rel_sd, seed)
    assert steps == prof.profiling_steps
    for limit, p in prof.profiles.items():
        assert p.n >= 2, limit
        # every profiled step has its energy, the one awaiting it at the switch too: what is not in the
        # profile is warm-up (2 per visit, revisits visit again) and the last window's last step
        assert p.steps - p.n <= 2 * (1 + prof.revisits) + 1, limit
    decided = [p for x, p in prof.profiles.items() if x != prof.chosen_limit_W]
    # a window spends warm-up + its profiled steps, not one more waiting for the last step's samples
    assert any(p.steps == 2 + p.n for p in decided)


@settings(max_examples=30, deadline=None)
@given(seed=SEEDS, rel_sd=st.floats(0.003, 0.02), unreachable=st.booleans())
def test_a_late_steps_energy_is_asked_for_the_samples_before_the_switch_only(seed, rel_sd, unreachable):
    # A step's energy arrives one step late. Every step resolved after the next limit began is asked with
    # samples_until_s = that limit's first step start, the others with None; where the samples before the
    # switch cannot reach the step's end (NaN), the step stays out of its profile but counts as run.
    rng = np.random.default_rng(seed)
    prof = _profiler(power_limit_grid_W(100, 250, 25), warmup_steps=2, min_profile_steps=4)
    energies: dict[tuple[float, float], float] = {}
    limit_at: dict[float, float] = {}  # step start (s) → its limit
    asked: list[tuple[float, float, float | None, float]] = []  # (start s, end s, samples_until_s, asked at s)
    clock = {"now": 0.0}

    def energy_fn(a: float, b: float, *, samples_until_s: float | None = None) -> float | None:
        if clock["now"] < b + 1.0:
            return None
        asked.append((a, b, samples_until_s, clock["now"]))
        return math.nan if unreachable and samples_until_s is not None else energies[(a, b)]

    prof.energy_fn = energy_fn
    for step in range(5000):
        now = clock["now"]
        limit = prof.on_step_start(step, now)
        assert limit is not None
        limit_at[now] = limit
        energies[(now, now + 1.0)] = (1.0 + 3.0 * ((limit - 180) / 150) ** 2) * (1 + rel_sd * rng.standard_normal())
        clock["now"] = now + 1.0
        if prof.on_step_end(step, now + 1.0):
            break
    late = [until for _, _, until, _ in asked if until is not None]
    assert late  # some windows ended with a step still awaiting its energy
    for a, b, until, at in asked:
        # the next limit's first step start; a step asked after it (at a later step's end) is cut there
        switch = next((t for t in sorted(limit_at) if t >= b and limit_at[t] != limit_at[a]), None)
        assert until == (switch if switch is not None and switch < at else None)
    resolved = [until for _, _, until, _ in asked if not (unreachable and until is not None)]
    assert sum(p.n for p in prof.profiles.values()) == len(resolved)
    assert prof.dropped_steps == (len(late) if unreachable else 0)
    assert all(math.isfinite(e) for p in prof.profiles.values() for e in p.energy_J)
    assert prof.chosen_limit_W is not None and prof.profiling_steps == step + 1


def test_a_limit_clearly_worse_than_the_best_is_rejected_before_min_profile_steps():
    # the minimum limit costs 20 % more than the maximum: once the maximum's window gives the card's
    # noise, two steps at the minimum separate it
    prof = _profiler(power_limit_grid_W(100, 250, 25), warmup_steps=2, min_profile_steps=6)
    _train_lagged(prof, lambda x: 1.0 + 0.2 * (250 - x) / 150, 0.005, seed=1)
    low = prof.profiles[100.0]
    assert low.steps < 2 + 6  # warm-up + fewer than min_profile_steps
    assert low.n >= 2 and prof.chosen_limit_W != 100.0


def test_the_sweep_keeps_its_fixed_windows():
    # Zeus's sweep measures min_profile_steps at every limit: no early rejection, no early first window
    prof = _profiler(power_limit_grid_W(100, 250, 50), search="sweep", warmup_steps=2, min_profile_steps=8,
                     profile_steps=8)  # fmt: skip
    _train_lagged(prof, lambda x: 1.0 + 0.3 * (250 - x) / 150, 0.005, seed=2)
    assert sorted(prof.profiles) == [100.0, 150.0, 200.0, 250.0]
    for limit, p in prof.profiles.items():
        assert p.steps == 2 + 8, limit  # warm-up + min_profile_steps everywhere
        # the last window ends the profile with its last step's energy still on the way
        assert p.n >= (7 if limit == 100.0 else 8), limit


# derandomize: the noise seed is drawn too, and "within 1 %" is what the search does at 0.5 % noise, not a
# bound for every seed; a random run found seed 492 (100-225 W, optimum 115.6 W: 100 W chosen, 1.17 %)
@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    seed=SEEDS,
    low=MIN_LIMITS_W,
    width=st.floats(125, 500),
    step=st.sampled_from([25.0, 35.0]),
    opt_frac=st.floats(0, 1),
    curvature=st.floats(0.5, 3.0),
    objective=st.sampled_from(["energy", "zeus_cost"]),
)
def test_on_noisy_unimodal_curves_the_profiler_is_within_one_percent_in_a_quarter_of_the_sweep(
    seed, low, width, step, opt_frac, curvature, objective
):
    # 0.5 % per-step noise, the sensor's one-step lag, default windows: the whole profiler, not the search alone
    high = low + width
    opt = low + opt_frac * width

    def cost(x: float) -> float:
        return 1.0 + curvature * ((x - opt) / width) ** 2

    grid = power_limit_grid_W(low, high, step)
    best = min(cost(x) for x in np.linspace(low, high, 2001))
    assume(min(cost(x) for x in grid) <= best * 1.005)  # the grid itself reaches the optimum
    prof = _profiler(grid, objective)
    steps = _train_lagged(prof, cost, 0.005, seed)
    assert prof.chosen_limit_W is not None
    assert cost(prof.chosen_limit_W) <= best * 1.01
    assert steps <= 0.25 * len(grid) * 50  # the Zeus sweep: 10 warm-up + 40 profiled steps per grid limit


# -- max_slowdown keeps the user's bound (issue 31) --------------------------------------------------
def test_max_slowdown_judges_a_limit_by_a_one_sided_95_percent_bound_of_its_slowdown():
    # The maximum (250 W) and a limit 9.5 % slower on average, both with a 1 % time wobble: the mean alone
    # is within 1.1, the one-sided bound is not; with no spread at all the bound is the mean.
    prof = _profiler(power_limit_grid_W(100, 250, 25), "max_slowdown")
    wobble = [1 + 0.01 * (-1) ** k for k in range(8)]
    prof.profiles[250.0] = LimitProfile(250.0, [10.0] * 8, [1.0 * w for w in wobble])
    prof.profiles[175.0] = LimitProfile(175.0, [8.0] * 8, [1.095 * w for w in wobble])
    # the bound from its definition: ratio × (1 + t(0.95, pooled dof) × hypot of the relative standard errors)
    rel_sd = math.sqrt(sum((w - 1) ** 2 for w in wobble) / 7)  # each window's, and so the pooled one (14 dof)
    expected = 1.095 * (1 + stats.t.ppf(0.95, 14) * math.hypot(rel_sd / math.sqrt(8), rel_sd / math.sqrt(8)))
    assert prof.slowdown_upper(prof.profiles[175.0]) == pytest.approx(expected, rel=1e-9)
    assert 1.095 < 1.1 < expected
    costs = prof.costs()
    assert costs[175.0] >= INFEASIBLE_COST and costs[250.0] == pytest.approx(10.0)  # the maximum: always within
    assert prof.measured()[175.0].slowdown == pytest.approx(expected, rel=1e-9)  # the search sees the bound
    quiet = _profiler(power_limit_grid_W(100, 250, 25), "max_slowdown")
    quiet.profiles[250.0] = LimitProfile(250.0, [10.0] * 8, [1.0] * 8)
    quiet.profiles[175.0] = LimitProfile(175.0, [8.0] * 8, [1.095] * 8)
    assert quiet.slowdown_upper(quiet.profiles[175.0]) == pytest.approx(1.095, rel=1e-12)
    assert quiet.costs()[175.0] == pytest.approx(8.0)


def _train_timed(prof: PowerLimitProfiler, energy_of, time_of, jitter: float, seed: int) -> float:
    """Steps of ``time_of(limit)`` s and ``energy_of(limit)`` J, both with the same relative jitter; the choice."""
    rng = np.random.default_rng(seed)
    energies: dict[tuple[float, float], float] = {}
    prof.energy_fn = lambda a, b, **_: energies.get((a, b))
    now = 0.0
    for step in range(5000):
        limit = prof.on_step_start(step, now)
        assert limit is not None
        factor = 1 + jitter * rng.standard_normal()
        end = now + time_of(limit) * factor
        energies[(now, end)] = energy_of(limit) * factor
        now = end
        if prof.on_step_end(step, now):
            assert prof.chosen_limit_W is not None
            return prof.chosen_limit_W
    raise AssertionError("the profiler did not decide")


def test_max_slowdown_chooses_a_limit_over_the_bound_in_at_most_5_percent_of_seeds():
    # A card whose energy falls all the way down to the slowdown boundary (the choice sits on it) with 1 %
    # step jitter. Judged by the mean slowdown, about half the choices on a boundary lie over it (9 of 20
    # seeds on the families' convex curves); judged by the one-sided 95 % bound, at most 5 % may.
    def time_of(x: float) -> float:
        return 1.0 + 0.5 * ((250.0 - x) / 150.0) ** 1.5  # 1.5x at 100 W; 1.1 at 198.7 W

    def energy_of(x: float) -> float:
        return (0.4 + x / 250.0) * time_of(x)

    seeds = range(40)
    chosen = [_train_timed(_profiler(power_limit_grid_W(100, 250, 25), "max_slowdown"), energy_of, time_of, 0.01, s)
              for s in seeds]  # fmt: skip
    over = [x for x in chosen if time_of(x) > 1.1 * time_of(250.0)]
    assert len(over) <= 0.05 * len(seeds), (over, chosen)
    # not vacuous: the choices sit near the boundary, not at the maximum
    assert all(time_of(x) > 1.05 for x in chosen), chosen


# -- a known job length: polish before choosing while the job repays it (issue 31) ------------------------
def _boundary_card(low: float, width: float, power: float):
    """A card whose energy falls all the way down to the max_slowdown boundary: (time_of, energy_of)."""
    high = low + width

    def time_of(x: float) -> float:
        return 1.0 + 0.5 * ((high - x) / width) ** power

    def energy_of(x: float) -> float:
        return (0.4 + x / high) * time_of(x)

    return time_of, energy_of


@pytest.mark.parametrize(("low", "width", "step", "power"), [(100.0, 300.0, 25.0, 1.66), (200.0, 500.0, 35.0, 1.5)])
def test_max_slowdown_with_a_known_long_job_chooses_closer_to_the_boundary_and_keeps_the_bound(low, width, step, power):
    # Over 15 fixed seeds of 1 % step jitter: told the job lasts 10 000 steps, the search measures the
    # boundary and the time reference again, so its choice wastes less of the allowed slowdown, and is over
    # the bound in at most 1 seed; the profiling's excess over the best limit stays within the polish budget.
    time_of, energy_of = _boundary_card(low, width, power)
    grid = power_limit_grid_W(low, low + width, step)
    limit = 1.1 * time_of(low + width)
    xs = np.linspace(low, low + width, 4001)
    best = min(energy_of(x) for x in xs if time_of(x) <= limit)
    gaps: dict[int | None, list[float]] = {None: [], 10_000: []}
    over = 0
    for job_steps in gaps:
        for seed in range(15):
            prof = _profiler(grid, "max_slowdown", job_steps=job_steps)
            chosen = _train_timed(prof, energy_of, time_of, 0.01, seed)
            gaps[job_steps].append(energy_of(chosen) / best - 1)
            if job_steps is None:
                assert prof.polishes == 0  # unknown length: the search of before, no polish
                continue
            over += time_of(chosen) > limit * (1 + 1e-12)
            assert prof.polishes > 0
            assert prof.excess_steps(chosen) <= 1.25 * prof.settings.polish_budget * job_steps
    assert over <= 1
    assert np.mean(gaps[10_000]) < 0.7 * np.mean(gaps[None])


@settings(max_examples=20, deadline=None)
@given(seed=SEEDS, rel_sd=st.floats(0.005, 0.03), opt_frac=st.floats(0.1, 0.9), curvature=st.floats(0.5, 3.0))
def test_a_known_job_length_measures_again_while_the_rest_of_the_job_repays_a_window(seed, rel_sd, opt_frac, curvature):
    # A noisy convex curve: told the job lasts 20 000 steps, the search measures a limit again (the best or
    # one it cannot yet rule out) while the saving it may find, over the steps left, repays the window, and
    # within the excess budget and the share of the job's steps
    low, width, job_steps = 100.0, 200.0, 20_000
    opt = low + opt_frac * width

    def cost(x: float) -> float:
        return 1.0 + curvature * ((x - opt) / width) ** 2

    prof = _profiler(power_limit_grid_W(low, low + width, 25), "energy", job_steps=job_steps)
    chosen = _train(prof, cost, rel_sd, seed)
    s = prof.settings
    budget = s.polish_budget * job_steps
    assert prof.excess_steps(chosen) <= 1.25 * budget
    assert prof.profiling_steps <= s.polish_max_share * job_steps + s.warmup_steps + s.profile_steps
    measured = {x: m for x, m in prof.measured().items() if prof.profiles[x].n >= 2}
    # The polish measures against the least raw reading; the choice pools each cost with its neighbours' line,
    # so it may take another limit (seed 83666: 197.7 W chosen, 200 W the least reading by 6e-7).
    best_x = min(measured, key=lambda x: (measured[x].cost, -x))
    best = measured[best_x]
    # it stopped because no further window repays itself: for every pair with the best still apart by more
    # than polish_ci, the expected saving of the rest of the job (normal difference of the two intervals)
    # is below the window's excess cost, or that window overspends the budget, or the share is used up
    no_share = prof.profiling_steps + s.warmup_steps + s.profile_steps > s.polish_max_share * job_steps
    steps_left = job_steps - prof.profiling_steps
    for x, m in measured.items():
        spread = math.hypot(m.half_width, best.half_width)
        if x == best_x or spread <= s.polish_ci * best.cost or no_share:
            continue
        sd, diff = spread / 1.96, m.cost - best.cost
        saving = sd * float(stats.norm.pdf(diff / sd)) - diff * float(stats.norm.cdf(-diff / sd))
        target = max((x, best_x), key=lambda y: measured[y].half_width)
        window = min(max(prof.profiles[target].n, s.min_profile_steps), s.profile_steps) + s.warmup_steps
        excess = max(prof.measured()[target].cost / best.cost - 1, 0)
        overspends = prof.excess_steps(best_x) + window * excess > budget
        assert overspends or saving / best.cost * steps_left - window * excess <= window * s.polish_ci + 1e-9
    assert cost(chosen) <= 1.01 * min(cost(x) for x in np.linspace(low, low + width, 801))


@pytest.mark.parametrize("dip_frac", [0.41, 0.58, 0.71, 0.86])
def test_a_long_job_scouts_the_gaps_and_finds_a_narrow_second_valley_between_grid_limits(dip_frac):
    # A convex energy curve with its valley near the minimum, and a second, narrow valley (a Gaussian dip 3 %
    # of the range wide, 2 % cheaper than the first) between two grid limits: from the grid it reads as the
    # smooth curve. Untold the job's length the search settles in the first valley; told 50 000 steps, the
    # scouts read the gaps blind and the polish measures again what reads low.
    low, width = 100.0, 300.0
    opt, dip_at, dip_sd = low + 0.1 * width, low + dip_frac * width, 0.03 * width

    def smooth(x: float) -> float:
        return 1.0 + 0.6 * ((x - opt) / width) ** 2

    depth = 1.0 - 0.98 / smooth(dip_at)  # the dip's floor: 2 % under the first valley

    def cost(x: float) -> float:
        return smooth(x) * (1.0 - depth * math.exp(-0.5 * ((x - dip_at) / dip_sd) ** 2))

    best = min(cost(x) for x in np.linspace(low, low + width, 3001))
    grid = power_limit_grid_W(low, low + width, 35)
    assert min(cost(x) for x in grid) > 0.99 * smooth(opt)  # no grid limit sits in the dip
    for seed in range(2):
        untold = _train(_profiler(grid, "energy"), cost, 0.01, seed)
        assert cost(untold) / best - 1 > 0.015
        prof = _profiler(grid, "energy", job_steps=50_000)
        chosen = _train(prof, cost, 0.01, seed)
        assert cost(chosen) / best - 1 < 0.005, (seed, chosen)
        assert prof.excess_steps(chosen) <= 1.25 * prof.settings.polish_budget * 50_000


def test_the_scouted_limits_survive_a_checkpoint():
    # The scouts' own share of the polish budget is counted over the limits they measured first: a resumed
    # profile must know them, or it would scout again with a fresh share
    low, width = 100.0, 300.0

    def cost(x: float) -> float:
        return 1.0 + 0.6 * ((x - low - 0.1 * width) / width) ** 2

    first = _profiler(power_limit_grid_W(low, low + width, 35), "energy", job_steps=50_000)
    _train(first, cost, 0.01, 0)
    assert first.scouted_W
    second = _profiler(power_limit_grid_W(low, low + width, 35), "energy", job_steps=50_000)
    assert second.resume(json.loads(json.dumps(first.export_state())))
    assert second.scouted_W == first.scouted_W


def test_a_run_that_ends_right_after_the_polish_names_a_scout_still_chooses():
    # The polish names a scout before any step runs at it; a run that stops then (early stop, a crash, Ctrl-C)
    # chooses from what was measured. It raised KeyError here, from train_end, and left the limit unrestored.
    low, width = 100.0, 300.0

    def cost(x: float) -> float:
        return 1.0 + 0.6 * ((x - low - 0.1 * width) / width) ** 2

    prof = _profiler(power_limit_grid_W(low, low + width, 35), "energy", job_steps=50_000)
    for decided in _run_steps(prof, cost, 0.01, 0):
        assert not decided
        if any(x not in prof.profiles for x in prof.scouted_W):
            break
    else:
        raise AssertionError("no scout was named")
    named = prof.target_limit_W
    chosen = prof.choose_now()
    assert chosen is not None and chosen != named and chosen in prof.profiles
    assert cost(chosen) <= 1.01 * min(cost(x) for x in np.linspace(low, low + width, 1201))
