"""The power-limit choice by raw readings against pooled costs, paired on the same searches.

Every `energy` and `zeus_cost` case of ``power_limit_families.py`` (each family and range, both
grid steps, the V100 and A40 workloads), each seed, each job length N: one search told N, run
once. The profile is the same up to the choice, so both choices come from it: the least raw
reading, and the least cost pooled with its neighbours' line (``_limit_profiler._choice_costs``,
the tree's). Each choice's job-total regret (profiling included, on the true curve, %) is the
families benchmark's.

    PYTHONPATH=. python benchmarks/power_limit_choice_pairs.py --n 2000,10000 --seeds 0,1 --out pairs.jsonl

Prints each N's mean and worst regret for both choices and every case whose regret changed; the
last line is JSON with those means and worsts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmarks


def _one(job: tuple[tuple, int, int]) -> dict:
    """One case, seed and N: both choices' job-total regret (%)."""
    key, seed, n = job
    import power_limit_families as families

    from zeus_callbacks.optimizers.power_limit._limit_profiler import PowerLimitProfiler

    seen: dict[str, dict[float, float]] = {}
    pooled_costs = PowerLimitProfiler._choice_costs

    def spy(self: PowerLimitProfiler, costs: dict[float, float]) -> dict[float, float]:
        seen["raw"], seen["pooled"] = dict(costs), pooled_costs(self, costs)
        return seen["pooled"]

    PowerLimitProfiler._choice_costs = spy  # type: ignore[method-assign]  # this worker process only
    case = next(c for c in families.cases([]) if (c.objective, c.family, c.label, c.step_W) == key)
    decided = families.run_search(case, seed, {"job_steps": n})
    best = families.best_cost(case.curve, case.objective)
    out: dict = {"case": list(key), "seed": seed, "n": n}
    for name in ("raw", "pooled"):
        costs = seen.get(name)
        limit = decided.limit_W if costs is None else min(costs, key=lambda x: (costs[x], -x))
        cost_at = {x: families.step_cost(case.curve, case.objective, x) for x in {limit, *decided.step_limits_W}}
        regret = families.job_regret([cost_at[x] for x in decided.step_limits_W], cost_at[limit], best, n)
        out[name] = 100 * regret
    return out


def main() -> None:
    """Run the pairs, write them as JSON lines, print the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="2000,10000", help="comma-separated job lengths")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True, help="every pair, as JSON lines")
    args = parser.parse_args()
    import power_limit_families as families

    keys = [(c.objective, c.family, c.label, c.step_W) for c in families.cases([]) if c.objective != "max_slowdown"]
    jobs = [(k, int(s), int(n)) for k in keys for s in args.seeds.split(",") for n in args.n.split(",")]
    with ProcessPoolExecutor(args.workers) as pool, args.out.open("w") as f:
        rows = []
        for row in pool.map(_one, jobs, chunksize=4):
            rows.append(row)
            f.write(json.dumps(row) + "\n")
    summary = {}
    for n in sorted({r["n"] for r in rows}):
        at = [r for r in rows if r["n"] == n]
        summary[n] = {f"{k}_{name}": round(f(r[name] for r in at), 4)
                      for name in ("raw", "pooled") for k, f in (("mean", statistics.mean), ("max", max))}  # fmt: skip
        changed = sorted((r for r in at if abs(r["pooled"] - r["raw"]) > 1e-9), key=lambda r: r["pooled"] - r["raw"])
        print(f"N={n}: {len(at)} runs, {len(changed)} choices changed, {summary[n]}")
        for r in changed:
            print(f"  {r['pooled'] - r['raw']:+.3f}  {' '.join(map(str, r['case']))} seed {r['seed']}: "
                  f"raw {r['raw']:.3f} %, pooled {r['pooled']:.3f} %")  # fmt: skip
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
