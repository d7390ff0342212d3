"""Recurring-job benchmark of the batch-size bandit on the Zeus (NSDI '23) traces.

6 workloads x {V100, A40} x 5 seeds, eta_knob 0.5, beta_knob 2.0, 2·|batch sizes|·|power limits|
recurrences each, through zeus_callbacks.simulate: the real EnergySession, bandit and store and,
with --power-limit jit (the default), the session's own power-limit profiler, on a virtual clock.
Baseline: the workload's default batch size at the maximum power limit. As an integration does, the
simulator tells the profiler each job's length (max_epochs × real steps an epoch); --job-steps unknown
does not (the profiler before issue 31 was never told).

Per row (mean over seeds): oracle ETA saving (the expected-cost-optimal batch size and power
limit), ETA saving over the last 10 and over all recurrences, TTA change over the last 10,
and cumulative regret Σ(cost_i − cost_opt)/cost_opt. The last line printed is one JSON object.

    python benchmarks/recurring_jobs.py [--seeds 5] [--seed-start 0] [--power-limit jit|max] [--workers 2]
                                        [--job-steps known|unknown]
                                        [--only squad,movielens-1m] [--bandit '{"prune_cost_ratio": 1.3}']
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from zeus_callbacks.backends import traces
from zeus_callbacks.optimizers.cost import ZeusCost
from zeus_callbacks.simulate import simulate, training_paths

ETA, BETA = 0.5, 2.0
# The Zeus reference simulator, same settings (issue 4): oracle, last-10, all-recurrence saving (%), regret.
REFERENCE = {
    ("V100", "cifar100"): (74.7, 74.1, 71.8, 10.4),
    ("V100", "imagenet"): (19.4, 19.2, 14.8, 4.0),
    ("V100", "librispeech"): (38.6, 39.1, 35.8, 7.5),
    ("V100", "movielens-1m"): (65.3, 65.9, 62.6, 14.0),
    ("V100", "sentiment140"): (20.9, 20.9, 19.2, 1.7),
    ("V100", "squad"): (17.3, 18.3, 17.2, 1.9),
    ("A40", "cifar100"): (67.0, 67.2, 65.3, 10.7),
    ("A40", "imagenet"): (15.1, 13.7, 11.4, 5.2),
    ("A40", "librispeech"): (66.3, 66.3, 63.2, 8.3),
    ("A40", "movielens-1m"): (61.2, 62.2, 58.8, 12.5),
    ("A40", "sentiment140"): (20.6, 20.6, 13.7, 4.4),
    ("A40", "squad"): (16.3, 17.2, 16.1, 3.2),
}


def expected(gpu: str, workload: str, batch_size: int, limit_W: float) -> tuple[float, float, float, bool]:
    """Expected (energy J, time s, cost, all paths converge) to reach the target, over the traced paths."""
    w = traces.get_workload(workload)
    curve = traces.power_curve(gpu, workload, batch_size)
    cost = ZeusCost(ETA, curve.max_limit_W)
    paths = training_paths(gpu, workload, batch_size)
    epochs = [p if p is not None and p <= w.max_epochs else w.max_epochs for p in paths] or [w.max_epochs]
    ok = bool(paths) and all(p is not None and p <= w.max_epochs for p in paths)
    e = traces.epoch_energy_J_at(curve, limit_W) * float(np.mean(epochs))
    t = traces.time_per_epoch_s_at(curve, limit_W) * float(np.mean(epochs))
    return e, t, cost(e, t), ok


def baseline_and_oracle(gpu: str, workload: str) -> dict:
    default = traces.default_batch_size(gpu, workload)
    max_W = traces.power_curve(gpu, workload, default).max_limit_W
    e0, t0, c0, _ = expected(gpu, workload, default, max_W)
    best = None
    for b in traces.available_batch_sizes(gpu, workload):
        for p in traces.power_curve(gpu, workload, b).power_limit_W:
            e, t, c, ok = expected(gpu, workload, b, float(p))
            if ok and (best is None or c < best[2]):
                best = (e, t, c, b, float(p))
    assert best is not None
    return {"energy_J": e0, "time_s": t0, "cost": c0, "opt": best}


def one(job: tuple) -> dict:
    gpu, workload, seed, power_limit, rounds, bandit, job_steps = job
    sizes = traces.available_batch_sizes(gpu, workload)
    limits = traces.power_curve(gpu, workload).power_limit_W
    n = 2 * len(sizes) * len(limits)
    runs = simulate(
        gpu,
        workload,
        n,
        eta_knob=ETA,
        beta_knob=BETA,
        seed=seed,
        power_limit=power_limit,
        pruning_rounds=rounds,
        bandit=bandit,
        tell_job_steps=job_steps == "known",
    )
    return {"gpu": gpu, "workload": workload, "seed": seed, "runs": [(r.energy_J, r.time_s, r.cost) for r in runs]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5, help="how many seeds (default 5)")
    parser.add_argument("--seed-start", type=int, default=0, help="first seed (default 0: seeds 0-4)")
    parser.add_argument("--power-limit", choices=["jit", "max"], default="jit")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--job-steps",
        choices=["known", "unknown"],
        default="known",
        help="known: each recurrence tells the profiler its length, as an integration does; unknown: untold",
    )
    parser.add_argument("--pruning-rounds", type=int, default=1)
    parser.add_argument("--only", default=None, help="comma-separated workloads (default: all six)")
    parser.add_argument(
        "--bandit", type=json.loads, default=None, help='further batch_size settings as JSON, e.g. {"seed": 1}'
    )
    args = parser.parse_args()
    start = time.monotonic()
    rows_keys = [k for k in REFERENCE if args.only is None or k[1] in args.only.split(",")]
    jobs = [
        (g, w, s, args.power_limit, args.pruning_rounds, args.bandit, args.job_steps)
        for g, w in rows_keys
        for s in range(args.seed_start, args.seed_start + args.seeds)
    ]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(one, jobs))
    rows = []
    print(
        f"{'GPU':5} {'workload':13} | {'oracle':>15} | {'last-10':>15} | {'all':>15} | {'TTA l10':>7} | "
        f"{'regret':>11} | ratio"
    )
    print(
        f"{'':19} | {'ours / ref %':>15} | {'ours / ref %':>15} | {'ours / ref %':>15} | {'%':>7} | "
        f"{'ours / ref':>11} |"
    )
    for gpu, workload in rows_keys:
        base = baseline_and_oracle(gpu, workload)
        opt_e, opt_t, opt_c, opt_b, opt_p = base["opt"]
        oracle = 100 * (1 - opt_e / base["energy_J"])
        last10, allrec, tta, regret = [], [], [], []
        for r in (r for r in results if (r["gpu"], r["workload"]) == (gpu, workload)):
            e = np.array([x[0] for x in r["runs"]])
            t = np.array([x[1] for x in r["runs"]])
            c = np.array([x[2] for x in r["runs"]])
            last10.append(100 * (1 - e[-10:].mean() / base["energy_J"]))
            allrec.append(100 * (1 - e.mean() / base["energy_J"]))
            tta.append(100 * (t[-10:].mean() / base["time_s"] - 1))
            regret.append(float(((c - opt_c) / opt_c).sum()))
        ref = REFERENCE[(gpu, workload)]
        row = {
            "gpu": gpu,
            "workload": workload,
            "oracle_saving_pct": round(oracle, 1),
            "last10_saving_pct": round(float(np.mean(last10)), 1),
            "all_saving_pct": round(float(np.mean(allrec)), 1),
            "tta_change_last10_pct": round(float(np.mean(tta)), 1),
            "regret": round(float(np.mean(regret)), 2),
            "regret_per_seed": [round(x, 2) for x in regret],
            "oracle_batch_size": opt_b,
            "oracle_power_limit_W": opt_p,
            "ref": {"oracle": ref[0], "last10": ref[1], "all": ref[2], "regret": ref[3]},
            "oracle_gap_pts": round(oracle - float(np.mean(last10)), 2),
            "regret_ratio": round(float(np.mean(regret)) / ref[3], 3),
        }
        rows.append(row)
        print(
            f"{gpu:5} {workload:13} | {row['oracle_saving_pct']:6.1f} / {ref[0]:5.1f} | "
            f"{row['last10_saving_pct']:6.1f} / {ref[1]:5.1f} | {row['all_saving_pct']:6.1f} / {ref[2]:5.1f} | "
            f"{row['tta_change_last10_pct']:+7.1f} | {row['regret']:5.1f} / {ref[3]:4.1f} | {row['regret_ratio']:.2f}"
        )
    print(
        f"# {len(jobs)} simulations, {sum(len(r['runs']) for r in results)} recurrences in "
        f"{time.monotonic() - start:.0f} s (power limit: {args.power_limit}, job steps: {args.job_steps})"
    )
    print(
        json.dumps(
            {
                "rows": rows,
                "regret_ratio_max": max(r["regret_ratio"] for r in rows),
                "oracle_gap_pts_max": max(r["oracle_gap_pts"] for r in rows),
            }
        )
    )


if __name__ == "__main__":
    main()
