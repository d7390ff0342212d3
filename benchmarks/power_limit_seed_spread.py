"""Seed spread of the job-total regret on given cases of the families benchmark: ours and the sweep's.

``power_limit_families.py`` runs the Zeus sweep on seed 0 only and compares every seed of our
search with it, so a failing row of ``power_limit_targets.py`` may be the sweep's luck or ours.
This script runs both, our search (told the job length N) and the sweep, on the same seeds of the
cases named, and prints per case and N: the sweep's regret (least–most over the seeds, mean), ours,
the ratio of the means, and the worst per-seed ratio of ours to the sweep's on the same seed.

Cases are named as in the ``--runs-out`` files of the families benchmark:
``objective/family/case``, e.g. ``zeus_cost/A40/movielens-1m step 35``. With ``--worst RUNS``
(a ``--runs-out`` file, repeatable), the cases are the worst-ratio case of every failing row there.

The last line is one JSON object::

    {"rows": [{"objective", "family", "case", "N", "sweep_pct": [...], "ours_pct": [...],
               "mean_ratio", "worst_paired_ratio"}, ...],
     "failing": {"a_b": ..., "c": ...}}

where ``failing`` counts rows whose worst paired ratio breaks target a (> 1) or b (> 0.5 at
N ≤ 10 000), and rows whose worst regret breaks c (> 1 % at N ≥ 10 000).

Usage::

    python benchmarks/power_limit_seed_spread.py --worst RUNS.jsonl [--seeds 6] [--workers 2]
    python benchmarks/power_limit_seed_spread.py --case "energy/V100/movielens-1m step 25" --seeds 6
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmarks
import power_limit_families as families  # noqa: E402
from power_limit_regret import JOB_STEPS, regret_ratio  # noqa: E402
from power_limit_targets import MAX_ABS_REGRET_PCT  # noqa: E402

CaseKey = tuple[str, str, str]  # objective, family, "label step W"


def case_key(case: families.Case) -> CaseKey:
    """A case's name in the families benchmark's runs files."""
    return (case.objective, case.family, f"{case.label} step {case.step_W:g}")


def worst_cases(runs_files: list[Path]) -> list[CaseKey]:
    """The worst-ratio case of every row (objective × family × N) failing target a, b or c in the files."""
    runs = [json.loads(line) for path in runs_files for line in path.open(encoding="utf-8")]
    sweep = {(r["objective"], r["family"], r["case"]): r for r in runs if r["mode"] == "sweep"}
    rows: dict[tuple[str, str, int], list[tuple[float, float, CaseKey]]] = defaultdict(list)
    for r in runs:
        if r["mode"] != "ours":
            continue
        key = (r["objective"], r["family"], r["case"])
        for n, ours in r["regret"].items():
            ratio = regret_ratio(ours, sweep[key]["regret"][n])  # None: no ratio to take, no failure
            rows[(r["objective"], r["family"], int(n))].append((0.0 if ratio is None else ratio, ours, key))
    chosen: list[CaseKey] = []
    for (_, _, n), values in rows.items():
        worst_ratio = max(values)
        worst_regret = max(values, key=lambda v: v[1])
        if worst_ratio[0] > (0.5 if n <= 10_000 else 1.0):
            chosen.append(worst_ratio[2])
        if n >= 10_000 and 100.0 * worst_regret[1] > MAX_ABS_REGRET_PCT:
            chosen.append(worst_regret[2])
    return sorted(set(chosen))


def spread_rows(results: list[dict]) -> list[dict]:
    """Per case and N: both regrets over the seeds (%), the ratio of the means and the worst paired ratio."""
    by_row: dict[tuple, dict[str, dict[int, float]]] = defaultdict(lambda: {"ours": {}, "sweep": {}})
    for r in results:
        for n, value in r["regret"].items():
            by_row[(r["objective"], r["family"], r["case"], int(n))][r["mode"]][r["seed"]] = 100.0 * value
    rows = []
    for (objective, family, case, n), modes in sorted(by_row.items()):
        ours, sweep = modes["ours"], modes["sweep"]
        seeds = sorted(set(ours) & set(sweep))
        paired = [ratio for s in seeds if (ratio := regret_ratio(ours[s], sweep[s])) is not None]
        rows.append({
            "objective": objective, "family": family, "case": case, "N": n,
            "sweep_pct": [round(sweep[s], 4) for s in seeds], "ours_pct": [round(ours[s], 4) for s in seeds],
            "mean_ratio": round(statistics.mean(ours.values()) / statistics.mean(sweep.values()), 3),
            "worst_paired_ratio": round(max(paired), 3) if paired else None,
        })  # fmt: skip
    return rows


def _failing(rows: list[dict]) -> dict[str, int]:
    """Rows breaking target a or b (worst paired ratio), and c (worst regret), as power_limit_targets.py judges."""
    a_b = sum(
        r["worst_paired_ratio"] is not None and r["worst_paired_ratio"] > (0.5 if r["N"] <= 10_000 else 1.0)
        for r in rows
    )
    c = sum(r["N"] >= 10_000 and max(r["ours_pct"]) > MAX_ABS_REGRET_PCT for r in rows)
    return {"a_b": a_b, "c": c}


def main() -> None:
    """Run both searches on every seed of the chosen cases; print the table, then one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", default=[], help='"objective/family/label step W" (repeatable)')
    parser.add_argument("--worst", type=Path, action="append", default=[], help="a --runs-out file of the families")
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs-out", type=Path, default=None, help="also write every run's result (JSON lines)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    wanted = set(worst_cases(args.worst)) | {tuple(c.split("/", 2)) for c in args.case}
    chosen = [c for c in families.cases([]) if case_key(c) in wanted]
    missing = wanted - {case_key(c) for c in chosen}
    if missing:
        parser.error(f"no such case in the families benchmark: {sorted(missing)}")
    jobs = [(c, seed, mode, mode == "ours", None) for c in chosen for seed in range(args.seeds)
            for mode in ("sweep", "ours")]  # fmt: skip
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(families._job, jobs))
    for (case, _, _, _, _), r in zip(jobs, results, strict=True):
        r.update(zip(("objective", "family", "case"), case_key(case), strict=True))
    if args.runs_out is not None:
        with args.runs_out.open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in results)
    rows = spread_rows(results)
    print("| objective | family | case | N | sweep % (least–most, mean) | ours % (least–most, mean) | "
          "ratio of means | worst paired ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        s, o = r["sweep_pct"], r["ours_pct"]
        print(f"| {r['objective']} | {r['family']} | {r['case']} | {r['N']} | "
              f"{min(s):.3f}–{max(s):.3f}, {statistics.mean(s):.3f} | {min(o):.3f}–{max(o):.3f}, "
              f"{statistics.mean(o):.3f} | {r['mean_ratio']:.2f} | {r['worst_paired_ratio']} |")  # fmt: skip
    print(json.dumps({"rows": rows, "failing": _failing(rows), "seeds": args.seeds, "job_steps": list(JOB_STEPS)}))


if __name__ == "__main__":
    main()
