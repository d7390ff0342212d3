"""Issue 31's targets checked on hand-made families summaries (benchmarks/power_limit_targets.py).

The summaries are built from ``power_limit_families._family_row()``, the accumulator the families
benchmark writes its JSON from, so the keys are the real output's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from power_limit_families import OBJECTIVES, _family_row, _rounded  # noqa: E402
from power_limit_regret import JOB_STEPS  # noqa: E402
from power_limit_targets import FAMILIES, check_all, load_objectives, summarise  # noqa: E402


def family(objective: str, ratio: float = 0.3, regret_pct: float = 0.5, violations: int = 0) -> dict:
    """One family's JSON entry, as the families benchmark writes it: 10 cases, 2 seeds."""
    f = _family_row()
    f.update(cases=10, runs=20, steps_ratio_max=1.2, cost_gap_pct_max=0.4, sweep_gap_pct_max=0.9, worst="x")
    for g in f["regret"].values():
        g.update(our_regret_pct_max=regret_pct, sweep_regret_pct_max=regret_pct / ratio, regret_ratio_max=ratio)
    if objective == "max_slowdown":
        f.update(violations=violations, worst_slowdown=1.099, sweep_worst_slowdown=1.09)
        f["violation_rate"], f["sweep_violation_rate"] = violations / f["runs"], 0.0
    else:
        for key in ("violations", "sweep_violations", "worst_slowdown", "sweep_worst_slowdown"):
            del f[key]
    return _rounded(f)


def summary(objectives=OBJECTIVES, families=FAMILIES, ours_gap=0.3, shrunk_gap=0.5) -> dict:
    """A families summary where every target passes, of the given objectives and families."""
    return {
        "by_objective": {
            o: {
                "mean_gap_pct": {str(n): {"ours": ours_gap, "shrunk": shrunk_gap, "sweep": 0.5} for n in JOB_STEPS},
                "by_family": {name: family(o) for name in families},
            }
            for o in objectives
        }
    }


def status(s: dict, runs: list[dict] | None = None) -> dict[str, tuple[str, int]]:
    """{target: (status, failing rows)} of a summary."""
    return {t: (v["status"], v["failing"]) for t, v in summarise(check_all(load_objectives([s]), runs)).items()}


def test_a_summary_meeting_every_target_passes_all():
    assert status(summary()) == {t: ("PASS", 0) for t in "abcde"}


def test_a_regret_above_the_sweeps_at_n_50000_fails_a_only():
    s = summary()
    s["by_objective"]["energy"]["by_family"]["V100"]["regret"]["50000"]["regret_ratio_max"] = 1.2
    assert status(s) == {"a": ("FAIL", 1), "b": ("PASS", 0), "c": ("PASS", 0), "d": ("PASS", 0), "e": ("PASS", 0)}


def test_a_ratio_of_0_6_at_n_2000_fails_b_not_a():
    s = summary()
    s["by_objective"]["zeus_cost"]["by_family"]["noisy"]["regret"]["2000"]["regret_ratio_max"] = 0.6
    assert status(s)["a"] == ("PASS", 0)
    assert status(s)["b"] == ("FAIL", 1)


def test_an_absolute_regret_above_1_pct_fails_c_at_n_10000_not_at_2000():
    s = summary()
    fam = s["by_objective"]["max_slowdown"]["by_family"]["A40"]["regret"]
    fam["2000"]["our_regret_pct_max"] = 3.0  # N = 2000 is not judged by c
    assert status(s)["c"] == ("PASS", 0)
    fam["10000"]["our_regret_pct_max"] = 1.01
    assert status(s)["c"] == ("FAIL", 1)


def test_a_mean_gap_tied_with_the_shrunk_sweep_does_not_beat_it():
    assert status(summary(ours_gap=0.5, shrunk_gap=0.5))["d"] == ("FAIL", 3 * len(JOB_STEPS))


def test_what_the_files_lack_is_not_measured_never_a_pass():
    partial = status(summary(objectives=("energy",), families=("convex", "V100")))
    assert {t: v[0] for t, v in partial.items()} == dict.fromkeys("abcde", "NOT MEASURED")
    s = summary()
    del s["by_objective"]["energy"]["mean_gap_pct"]  # an older file: no shrunk sweep
    assert status(s)["d"] == ("NOT MEASURED", 0)


def run(objective: str, fam: str, case: str, mode: str, regret: float, violates: bool = False) -> dict:
    """One row of a --runs-out file (only the keys the checker reads)."""
    regrets = {str(n): regret for n in JOB_STEPS}
    slowdown = 1.2 if violates else 1.05
    return {"objective": objective, "family": fam, "case": case, "mode": mode, "seed": 0, "regret": regrets,
            "violates": violates, "slowdown": slowdown}  # fmt: skip


def test_runs_against_a_sweep_regret_of_0_need_the_runs_file_and_are_judged_by_it():
    s = summary()
    g = s["by_objective"]["energy"]["by_family"]["low_draw"]["regret"]["2000"]
    g.update(regret_ratio_max=None, no_ratio=1, sweep_regret_pct_max=0.0)
    assert status(s)["a"] == ("NOT MEASURED", 0)
    # the sweep's regret is 0 in every case: ours must be 0 too
    equal = [
        run("energy", "low_draw", "100-250 step 25", "sweep", 0.0),
        run("energy", "low_draw", "100-250 step 25", "ours", 1e-12),
    ]
    assert status(s, equal)["a"] == ("PASS", 0)
    above = [equal[0], run("energy", "low_draw", "100-250 step 25", "ours", 0.001)]
    assert status(s, above)["a"] == ("FAIL", 1)


def test_a_violation_rate_is_judged_per_case():
    s = summary()
    s["by_objective"]["max_slowdown"]["by_family"]["noisy"].update(violations=5, violation_rate=0.25)
    assert status(s)["e"] == ("FAIL", 1)  # 25 % of the family: some case is above 5 %
    s["by_objective"]["max_slowdown"]["by_family"]["noisy"].update(violations=1, violation_rate=0.05)
    assert status(s)["e"] == ("NOT MEASURED", 0)  # 1 of 20: every case ≤ 5 % only if it is in a case of ≥ 20 seeds
    runs = [run("max_slowdown", "noisy", f"{r} step 25", "ours", 0.0, violates=(r == 0 and seed == 0))
            for r in range(10) for seed in range(2)]  # fmt: skip
    assert status(s, runs)["e"] == ("FAIL", 1)  # 1 of the 2 seeds of one case: 50 %


def test_files_of_one_objective_with_disjoint_families_merge_and_weight_their_mean_gaps():
    a = summary(objectives=("energy",), families=("convex",), ours_gap=0.2, shrunk_gap=0.4)
    b = summary(objectives=("energy",), families=("V100", "A40"), ours_gap=0.5, shrunk_gap=0.1)
    for f in b["by_objective"]["energy"]["by_family"].values():
        f["runs"] = 30  # 3 seeds: our runs and the sweeps' cases weigh differently
    merged = load_objectives([a, b])["energy"]
    assert set(merged["by_family"]) == {"convex", "V100", "A40"}
    # 20 of our runs and 10 cases in a, 60 and 20 in b
    assert merged["mean_gap_pct"]["2000"]["ours"] == pytest.approx((0.2 * 20 + 0.5 * 60) / 80)
    assert merged["mean_gap_pct"]["2000"]["shrunk"] == pytest.approx((0.4 * 10 + 0.1 * 20) / 30)
    with pytest.raises(ValueError, match="convex"):
        load_objectives([a, a])


def test_the_command_prints_a_table_and_a_last_json_line(tmp_path):
    path = tmp_path / "energy.json"
    s = summary()
    s["by_objective"]["energy"]["by_family"]["steep"]["regret"]["10000"]["our_regret_pct_max"] = 2.5
    path.write_text(json.dumps(s), encoding="utf-8")
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "power_limit_targets.py"), str(path)],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout.splitlines()  # fmt: skip
    assert out[0].startswith("| target | status |")
    last = json.loads(out[-1])
    assert last["all_pass"] is False
    assert last["targets"]["c"]["status"] == "FAIL"
    assert last["targets"]["c"]["worst"]["where"] == "energy / steep / N=10000"
    assert last["targets"]["c"]["worst"]["value"] == pytest.approx(2.5)
    assert last["targets"]["e"]["worst_true_slowdown"] == pytest.approx(1.099)
