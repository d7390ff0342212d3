"""A quick screen of the power-limit polish's gap probes: mean job regret over 12 cases and 3 seeds.

The cases: the trace and family rows the gap probes were built for or could hurt (V100 and A40
movielens-1m, V100 sentiment140 and squad, rising_energy, steep, convex, noisy), each at a job length
N it is judged at. Each run is ``power_limit_families.run_search`` told N; its regret is the
benchmark's job-total regret (profiling included, on the true curve), in %.

``--min-gap-share S``: gaps narrower than S × the grid's spacing are not probed (the profiler's
``_EXPLORE_GRID_SHARE``, 0.25 in the tree); ``--off``: no gap probes at all (the search before
2026-12-07 (b)). The other variants quoted in docs/results/power_limit_regret.md ran the code of
commit fd29393 (v1) and 217f958 with a share of 0.

    PYTHONPATH=. python benchmarks/power_limit_gap_screen.py            # the tree's setting
    PYTHONPATH=. python benchmarks/power_limit_gap_screen.py --off      # no gap probes
"""

from __future__ import annotations

import argparse
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmarks

CASES = [  # objective, family, label, grid step (W), job steps N
    ("energy", "V100", "movielens-1m", 25, 10_000), ("energy", "V100", "movielens-1m", 25, 50_000),
    ("energy", "V100", "sentiment140", 35, 10_000), ("energy", "V100", "sentiment140", 35, 50_000),
    ("energy", "A40", "movielens-1m", 35, 10_000), ("energy", "A40", "movielens-1m", 35, 50_000),
    ("energy", "rising_energy", "100-250", 25, 10_000), ("energy", "steep", "200-700", 35, 10_000),
    ("energy", "convex", "125-250", 25, 10_000), ("zeus_cost", "V100", "movielens-1m", 25, 10_000),
    ("zeus_cost", "noisy", "150-400", 25, 50_000), ("energy", "V100", "squad", 35, 10_000),
]  # fmt: skip


def _one(job: tuple[tuple, int, float | None, bool]) -> float:
    """One case and seed: our job-total regret (%)."""
    (objective, family, label, step_W, n), seed, share, off = job
    import zeus_callbacks.optimizers.power_limit._limit_profiler as profiler

    if share is not None:
        profiler._EXPLORE_GRID_SHARE = share
    if off:
        profiler._EXPLORE_MIN_GAP_W = float("inf")
    import power_limit_families as families

    case = next(c for c in families.cases([])
                if (c.objective, c.family, c.label, c.step_W) == (objective, family, label, step_W))  # fmt: skip
    decided = families.run_search(case, seed, {"job_steps": n})
    cost_at = {x: families.step_cost(case.curve, objective, x) for x in {decided.limit_W, *decided.step_limits_W}}
    best = families.best_cost(case.curve, objective)
    return 100 * families.job_regret([cost_at[x] for x in decided.step_limits_W], cost_at[decided.limit_W], best, n)


def main() -> None:
    """Print each case's mean and worst regret over the seeds, then the mean of the means."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-gap-share", type=float, default=None)
    parser.add_argument("--off", action="store_true")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    jobs = [(c, s, args.min_gap_share, args.off) for c in CASES for s in range(args.seeds)]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(_one, jobs))
    by_case: dict[tuple, list[float]] = {}
    for (case, _, _, _), r in zip(jobs, results, strict=True):
        by_case.setdefault(case, []).append(r)
    for (objective, family, label, step_W, n), rs in by_case.items():
        print(
            f"{objective:9s} {family:13s} {label:13s} {step_W:3d} W  N={n:6d}  mean {statistics.mean(rs):6.3f} %"
            f"  max {max(rs):6.3f} %"
        )
    print(f"mean of the means: {statistics.mean(statistics.mean(v) for v in by_case.values()):.3f} %")


if __name__ == "__main__":
    main()
