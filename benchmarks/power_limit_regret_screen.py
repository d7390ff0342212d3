"""A fast screen of our power-limit search alone: job-total regret per case, seed and job length N.

``power_limit_families.py`` runs the Zeus sweep and the shrunk sweeps beside every case, which is
most of its time (an hour on two cores). A change to the search does not change the sweeps, so
this script runs our search only, told N (``power_limit_families.run_search``), and writes one JSON
line per run: the case, the seed, N, the job-total regret (%, profiling included, on the true
curve), the chosen limit and its gap (%), and the profiled steps. With ``--against`` it reads the
sweep's regret of each case from a families runs file (``--runs-out``) and prints, per N, our mean
and worst regret and how many runs fail a target of issue 31 (regret above the sweep's; above half
the sweep's at N <= 10 000; above 1 % at N >= 10 000), next to a previous screen's (``--before``).

    PYTHONPATH=. python benchmarks/power_limit_regret_screen.py --objectives energy --families non_unimodal \
        --n 10000,50000 --seeds 0,1 --out after.jsonl \
        --against docs/results/families_2026-12-07c/all_energy_zeus_cost_runs.jsonl --before before.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmarks

Key = tuple[str, str, str, float]  # objective, family, label, grid step (W)


def _one(job: tuple[Key, int, int]) -> dict:
    """One case, seed and N: our search told N, its job-total regret (%)."""
    key, seed, n = job
    import power_limit_families as families

    case = next(c for c in families.cases([]) if (c.objective, c.family, c.label, c.step_W) == key)
    package_logger = logging.getLogger("zeus_callbacks")
    level = package_logger.level
    package_logger.setLevel(logging.ERROR)  # the sessions' sampling notices, once per run; restored (tests call this)
    try:
        decided = families.run_search(case, seed, {"job_steps": n})
    finally:
        package_logger.setLevel(level)
    best = families.best_cost(case.curve, case.objective)
    cost_at = {x: families.step_cost(case.curve, case.objective, x) for x in {decided.limit_W, *decided.step_limits_W}}
    regret = families.job_regret([cost_at[x] for x in decided.step_limits_W], cost_at[decided.limit_W], best, n)
    return {"case": list(key), "seed": seed, "n": n, "regret": 100 * regret, "limit_W": decided.limit_W,
            "gap_pct": 100 * (cost_at[decided.limit_W] / best - 1), "steps": decided.steps}  # fmt: skip


def _sweep_regrets(runs_file: Path) -> dict[tuple[Key, int], float]:
    """(case, N) → the full sweep's regret (%) from a families runs file."""
    out = {}
    for line in runs_file.open():
        row = json.loads(line)
        if row["mode"] != "sweep":
            continue
        label, step = row["case"].rsplit(" step ", 1)
        for n, regret in row["regret"].items():
            out[((row["objective"], row["family"], label, float(step)), int(n))] = 100 * regret
    return out


def _fails(regret: float, sweep: float, n: int) -> bool:
    """Whether a run fails a target of issue 31."""
    return regret > sweep or (n <= 10_000 and regret > 0.5 * sweep) or (n >= 10_000 and regret > 1.0)


def _summary(rows: list[dict], sweep: dict[tuple[Key, int], float]) -> dict[int, dict]:
    out = {}
    for n in sorted({r["n"] for r in rows}):
        at = [r for r in rows if r["n"] == n]
        fails = sum(_fails(r["regret"], sweep[(tuple(r["case"]), n)], n) for r in at if (tuple(r["case"]), n) in sweep)
        out[n] = {"runs": len(at), "mean": round(statistics.mean(r["regret"] for r in at), 4),
                  "max": round(max(r["regret"] for r in at), 4), "fails": fails}  # fmt: skip
    return out


def main() -> None:
    """Run the screen, write its rows, print the summary (and the comparison)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objectives", default="energy,zeus_cost")
    parser.add_argument("--families", default=None, help="comma-separated families (default: all)")
    parser.add_argument("--n", default="2000,10000", help="comma-separated job lengths")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True, help="every run, as JSON lines")
    parser.add_argument("--against", type=Path, default=None, help="a families runs file: the sweep's regrets")
    parser.add_argument("--before", type=Path, default=None, help="a previous screen's rows, to compare")
    args = parser.parse_args()
    import power_limit_families as families

    objectives, fams = args.objectives.split(","), args.families.split(",") if args.families else None
    keys = [(c.objective, c.family, c.label, c.step_W) for c in families.cases([])
            if c.objective in objectives and (fams is None or c.family in fams)]  # fmt: skip
    jobs = [(k, int(s), int(n)) for k in keys for s in args.seeds.split(",") for n in args.n.split(",")]
    rows = []
    with ProcessPoolExecutor(args.workers) as pool, args.out.open("w") as f:
        for row in pool.map(_one, jobs, chunksize=2):
            rows.append(row)
            f.write(json.dumps(row) + "\n")
    sweep = _sweep_regrets(args.against) if args.against else {}
    after = _summary(rows, sweep)
    if args.before:
        wanted = {(tuple(r["case"]), r["seed"], r["n"]) for r in rows}
        before_rows = [
            r for r in map(json.loads, args.before.open()) if (tuple(r["case"]), r["seed"], r["n"]) in wanted
        ]
        before = _summary(before_rows, sweep)
        for n, s in after.items():
            print(f"N={n}: before {before.get(n)}, after {s}")
    else:
        for n, s in after.items():
            print(f"N={n}: {s}")
    print(json.dumps({str(n): s for n, s in after.items()}))


if __name__ == "__main__":
    main()
