"""Job-total regret of a power-limit search (benchmarks/power_limit_regret.py) on a hand-made curve."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from power_limit_regret import job_regret, regret_ratio  # noqa: E402

# A hand-made cost per step (J) at four limits: the optimum is 200 W at 80 J.
CURVE_J = {300.0: 100.0, 250.0: 90.0, 200.0: 80.0, 150.0: 120.0}
# A search that warmed up 2 steps at 300 W, then profiled 2 steps at each limit, and chose 250 W.
STEPS_W = [300.0, 300.0, 300.0, 300.0, 250.0, 250.0, 200.0, 200.0, 150.0, 150.0]


def test_job_regret_of_a_hand_made_search():
    costs = [CURVE_J[x] for x in STEPS_W]  # 4·100 + 2·90 + 2·80 + 2·120 = 980 J
    # Floating-point sums of a few exact decimals: approx, not ==.
    # N = 100: 980 + 90 · 90 = 9080 J against 100 · 80 = 8000 J.
    assert job_regret(costs, CURVE_J[250.0], 80.0, 100) == pytest.approx(9080 / 8000 - 1)
    # N = 10 000: the choice's 12.5 % dominates: (980 + 9990 · 90) / 800 000 − 1.
    assert job_regret(costs, CURVE_J[250.0], 80.0, 10_000) == pytest.approx((980 + 9990 * 90) / 800_000 - 1)
    # Choosing the optimum: the regret is the profiling's excess only, 180 J over 1000 steps.
    assert job_regret(costs, 80.0, 80.0, 1000) == pytest.approx(180 / 80_000)


def test_a_job_shorter_than_the_search_pays_only_its_own_steps():
    costs = [CURVE_J[x] for x in STEPS_W]
    # 5 steps: 4 · 100 + 90 = 490 J against 5 · 80 = 400 J; the chosen limit is never reached.
    assert job_regret(costs, 1e9, 80.0, 5) == pytest.approx(490 / 400 - 1)


def test_the_regret_goes_to_the_choice_gap_as_the_job_grows():
    costs = [CURVE_J[x] for x in STEPS_W]
    regrets = [job_regret(costs, 90.0, 80.0, n) for n in (2_000, 10_000, 50_000)]
    assert regrets[0] > regrets[1] > regrets[2] > 90 / 80 - 1


@pytest.mark.parametrize(("n", "best"), [(0, 80.0), (-1, 80.0), (10, 0.0), (10, float("inf"))])
def test_job_regret_rejects_meaningless_inputs(n, best):
    with pytest.raises(ValueError):
        job_regret([1.0], 1.0, best, n)


def test_regret_ratio_is_none_without_a_positive_sweep_regret():
    assert regret_ratio(0.02, 0.04) == pytest.approx(0.5)  # a quotient of two exact binary fractions
    assert regret_ratio(0.02, 0.0) is None
    assert regret_ratio(0.02, -0.01) is None


def test_the_regret_screen_judges_a_run_by_the_targets_of_issue_31():
    from power_limit_regret_screen import _fails

    assert _fails(0.6, 0.5, 50_000)  # above the sweep's, at any N
    assert _fails(0.3, 0.5, 2_000) and not _fails(0.25, 0.5, 2_000)  # above half the sweep's at N <= 10 000
    assert not _fails(0.3, 0.5, 50_000)  # ... not at 50 000
    assert _fails(1.2, 5.0, 10_000) and not _fails(1.2, 5.0, 2_000)  # above 1 % at N >= 10 000


def test_the_regret_screen_counts_the_profiling_and_the_choice_over_the_job():
    # One real search on a convex family curve: the regret holds the chosen limit's gap over the steps after
    # the profiling, and the profiling's own excess on top, never less
    from power_limit_regret_screen import _one

    n = 2_000
    row = _one((("energy", "convex", "100-250", 25.0), 0, n, {}))
    assert row["n"] == n and 0 < row["steps"] < n
    assert 100.0 <= row["limit_W"] <= 250.0 and row["gap_pct"] >= 0.0
    assert row["regret"] >= row["gap_pct"] * (n - row["steps"]) / n - 1e-9


def test_a_screened_variant_changes_its_own_runs_only():
    # One pool runs every variant: a job's settings must not leak into the next job in the same process
    from power_limit_regret_screen import _one

    from zeus_callbacks.optimizers.power_limit import _limit_profiler as profiler

    init, share = profiler.PowerLimitProfiler.__init__, profiler._SCOUT_BUDGET_SHARE
    key, n = ("zeus_cost", "convex", "125-250", 35.0), 10_000
    tree = _one((key, 0, n, {}))
    short = _one((key, 0, n, {"polish_max_share": 0.02}))
    unscouted = _one((key, 0, n, {"_SCOUT_BUDGET_SHARE": 0}))
    again = _one((key, 0, n, {}))
    assert short["steps"] < tree["steps"] and short["set"] == {"polish_max_share": 0.02}
    assert unscouted["steps"] != tree["steps"] or unscouted["limit_W"] != tree["limit_W"]
    assert (again["steps"], again["limit_W"], again["regret"]) == (tree["steps"], tree["limit_W"], tree["regret"])
    # ... and nothing of them outlives the runs: the package is as it was
    assert profiler.PowerLimitProfiler.__init__ is init and profiler._SCOUT_BUDGET_SHARE == share
