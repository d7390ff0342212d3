"""What a blind scan for a narrow second valley would cost the smooth families, against issue 31's target b.

The `non_unimodal` family's second valley is a dip 4 % of the range wide between two grid limits.
Until a probe lands near it, its readings are those of the `convex` curve it is built on, so a
search that finds it must probe the same places on every curve. This prices the bluntest such
rule, a scan of the whole range at the dip's width, on each smooth case's true curve: ``--probes``
limits evenly over the range, each a window of ``--window`` steps, the excess of each step over
the optimum summed, over a job of ``--n`` steps (% of the job). Added to our search's worst regret
at that N (``--ours``: the pooled column of a ``power_limit_choice_pairs.py`` file), it counts the
cases that would then fail target b (regret above half the full sweep's, ``--sweep``: a families
runs file). No search runs: the scan's cost is exact on the true curve.

    PYTHONPATH=. python benchmarks/power_limit_scan_cost.py \
        --ours docs/results/families_2026-12-07c/pooled_choice_pairs.jsonl \
        --sweep docs/results/families_2026-12-07c/all_energy_zeus_cost_runs.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmarks


def main() -> None:
    """Price the scan on every smooth `energy` and `zeus_cost` case; print the b failures with and without it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="the job's steps")
    parser.add_argument("--probes", type=int, default=26, help="limits of the scan, evenly over the range")
    parser.add_argument("--window", type=int, default=6, help="steps per probe (warm-up included)")
    parser.add_argument("--ours", type=Path, required=True, help="power_limit_choice_pairs.py rows")
    parser.add_argument("--sweep", type=Path, required=True, help="power_limit_families.py --runs-out rows")
    args = parser.parse_args()
    import power_limit_families as families

    sweep = {}
    for row in map(json.loads, args.sweep.open()):
        if row["mode"] == "sweep":
            sweep[(row["objective"], row["family"], row["case"])] = 100 * row["regret"][str(args.n)]
    ours: dict[tuple, float] = {}
    for row in map(json.loads, args.ours.open()):
        if row["n"] == args.n:
            key = tuple(row["case"])
            ours[key] = max(ours.get(key, 0.0), row["pooled"])
    by_family: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    worst_scan: dict[tuple[str, str], float] = defaultdict(float)
    for case in families.cases([]):
        if case.objective not in ("energy", "zeus_cost") or case.family == "non_unimodal":
            continue
        best = families.best_cost(case.curve, case.objective)
        limits = np.linspace(case.curve.min_limit_W, case.curve.max_limit_W, args.probes)
        excess = sum(max(families.step_cost(case.curve, case.objective, x) / best - 1, 0.0) for x in limits)
        scan_pct = 100 * args.window * excess / args.n
        allowed = 0.5 * sweep[(case.objective, case.family, f"{case.label} step {case.step_W:.0f}")]
        regret = ours[(case.objective, case.family, case.label, case.step_W)]
        tally = by_family[(case.objective, case.family)]
        tally[0] += 1
        tally[1] += regret > allowed
        tally[2] += regret + scan_pct > allowed
        worst_scan[(case.objective, case.family)] = max(worst_scan[(case.objective, case.family)], scan_pct)
    for (objective, family), (cases, now, scanned) in sorted(by_family.items()):
        print(f"{objective:9} {family:13} {cases:2} cases: b fails {now:2} now, {scanned:2} with the scan "
              f"(the scan's cost up to {worst_scan[(objective, family)]:.3f} % of the job)")  # fmt: skip
    totals = [sum(t[i] for t in by_family.values()) for i in range(3)]
    print(json.dumps({"n": args.n, "cases": totals[0], "b_fails_now": totals[1], "b_fails_with_scan": totals[2]}))


if __name__ == "__main__":
    main()
