"""Power-limit search vs Zeus's full sweep on every V100 and A40 workload of the Zeus traces.

Drives the product's own code (an :class:`~zeus_callbacks.session.EnergySession` with
``power_limit.enabled``) on the virtual GPU with a :class:`ManualClock`: each step lasts
the trace's time per epoch scaled to a per-step time, times the slowdown at the limit in
force, with 1 % step-time jitter; power comes from the trace plus the virtual GPU's
H200-like sensor noise (20 ms samples, ``--noise-W``). Epochs are shorter than one Zeus
profile window (``--steps-per-epoch``), so profiles must carry across epoch ends.

For every workload and seed it runs our search (defaults of ``power_limit``) and a
Zeus-style sweep (every 25 W limit from max to min, 10 warm-up + 40 profiled steps each)
side by side, and reports steps spent profiling, the chosen limit, and the cost gap of
that limit to the optimum of the trace curve over the same 25 W grid (cost computed
from the trace, noise-free). The last line is one JSON object::

    {"steps_ratio_max": ..., "cost_gap_pct_max": ...}

Usage::

    python benchmarks/power_limit_search.py --seeds 10
    python benchmarks/power_limit_search.py --trace my_gpu.csv   # a user trace instead of V100/A40
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package, not an installed one

from zeus_callbacks.backends import traces
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.optimizers.power_limit import Objective, power_limit_grid_W
from zeus_callbacks.session import EnergySession
from zeus_callbacks.simulate import SENSOR_TIMEOUT_S

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling regret module
from power_limit_regret import JOB_STEPS, job_regret, regret_ratio  # noqa: E402

TARGET_STEP_S = 0.25  # per-step time at the maximum limit is the epoch time split into ~this
SWEEP = {"search": "sweep", "warmup_steps": 10, "min_profile_steps": 40, "profile_steps": 40}


def step_time_s(curve: traces.PowerCurve) -> float:
    """Per-step time at the maximum limit (s): the trace's epoch time over 20–2000 steps."""
    epoch_s = float(curve.time_per_epoch_s[-1])
    steps = int(np.clip(round(epoch_s / TARGET_STEP_S), 20, 2000))
    return epoch_s / steps


class Decided(NamedTuple):
    """What one simulated training did until the profiler decided."""

    steps: int  # steps the profiler counted (warm-up and profile windows)
    limit_W: float  # the chosen limit
    step_limits_W: tuple[float, ...]  # the limit in force at each step of the loop, up to the decision


def profile_until_decided(
    backend: VirtualGPUBackend,
    clock: ManualClock,
    power_limit: dict,
    log_dir: str,
    *,
    base_s: float,
    jitter: float,
    seed: int,
    steps_per_epoch: int,
    max_steps: int,
    label: str,
) -> Decided:
    """Train on the virtual GPU through the real session until the power-limit profiler decides.

    Each step lasts ``base_s`` times the slowdown at the limit in force, with relative
    Gaussian jitter ``jitter`` (seeded from ``seed``); epochs are ``steps_per_epoch`` long.

    Returns:
        The profiler's step count, the chosen limit and the limit each step of the loop ran at.
    """
    rng = np.random.default_rng(seed + 7919)
    config = {
        "backend": "virtual",
        "logging": {"log_dir": log_dir, "jsonl": False},
        "sampling": {"sensor_timeout_s": SENSOR_TIMEOUT_S},  # a virtual sensor: slow under load, never stuck
        "power_limit": {"enabled": True, "cache": False, "plot": False, **power_limit},
    }
    session = EnergySession(config, backend=backend, is_main_process=True)
    session.train_start()
    limiter = session.power_limiter
    assert limiter is not None
    step_limits_W: list[float] = []
    try:
        for step in range(max_steps):
            if step % steps_per_epoch == 0:
                session.epoch_start(step // steps_per_epoch)
            session.step_start(step)
            step_limits_W.append(backend.power_limit_W(0))
            factor = backend.step_time_factor(step_limits_W[-1])
            clock.advance(base_s * factor * (1.0 + jitter * rng.standard_normal()))
            session.step_end(step, num_samples=32)
            if step % steps_per_epoch == steps_per_epoch - 1:
                session.epoch_end(step // steps_per_epoch)
            if limiter.result is not None:
                break
    finally:
        session.train_end()
    result = limiter.result
    assert result is not None and result.chosen_limit_W is not None, f"{label}: no decision"
    return Decided(result.profiling_steps, float(result.chosen_limit_W), tuple(step_limits_W))


def simulate(
    gpu: traces.TraceLike,
    workload: str,
    seed: int,
    overrides: dict,
    *,
    objective: str = "zeus_cost",
    eta_knob: float = 0.5,
    noise_W: float = 3.0,
    steps_per_epoch: int = 30,
    max_steps: int = 20_000,
) -> Decided:
    """Run one simulated training of a trace workload until the profiler decides.

    Returns:
        The profiler's step count, the chosen limit and the limit each step ran at.
    """
    clock = ManualClock(1000.0)
    trace = traces.resolve_trace(gpu)
    backend = VirtualGPUBackend(trace=trace, workload=workload, clock=clock, noise_W=noise_W, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        return profile_until_decided(
            backend, clock, {"objective": objective, "eta_knob": eta_knob, **overrides}, tmp,
            base_s=step_time_s(backend.curve), jitter=0.01, seed=seed, steps_per_epoch=steps_per_epoch,
            max_steps=max_steps, label=f"{trace.gpu}/{workload}",
        )  # fmt: skip


def true_step_cost(backend: VirtualGPUBackend, objective: Objective, limit_W: float) -> float:
    """Noise-free cost of one step at ``limit_W`` from the trace curve (``max_slowdown``: its energy)."""
    t = backend.step_time_factor(limit_W)
    energy = t * backend.average_power_W(limit_W)
    if objective.name == "max_slowdown":
        return energy
    return objective.cost(energy, t, 1.0)


def true_optimum(backend: VirtualGPUBackend, objective: Objective, limits: list[float] | None = None) -> float:
    """Noise-free cost per step at the best of ``limits`` (default: the whole range on a 0.25 W grid).

    With ``max_slowdown`` only the limits no slower than allowed count.
    """
    low, high = backend.curve.min_limit_W, backend.curve.max_limit_W
    if limits is None:
        limits = [float(x) for x in np.append(np.arange(low, high, 0.25), high)]
    feasible = [x for x in limits if backend.step_time_factor(x) <= objective.max_slowdown * (1 + 1e-12)]
    return min(
        true_step_cost(backend, objective, x) for x in (feasible if objective.name == "max_slowdown" else limits)
    )


def main() -> None:
    """Run the benchmark and print the table, then one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--noise-W", type=float, default=3.0)
    parser.add_argument("--objective", default="zeus_cost")
    parser.add_argument("--eta-knob", type=float, default=0.5)
    parser.add_argument("--max-slowdown", type=float, default=1.1)
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    parser.add_argument(
        "--job-steps",
        choices=("known", "unknown"),
        default="known",
        help="known: our search runs once per job length N with power_limit.job_steps = N; unknown: once, untold",
    )
    parser.add_argument(
        "--trace", type=Path, action="append", default=[], help="a user trace CSV (repeatable; default: V100, A40)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    slowdown = args.objective == "max_slowdown"

    header = (
        "| GPU | workload | sweep steps | our steps (mean, max) | steps ratio (max) | sweep limit | "
        "our limits | sweep gap % (max) | our gap % (max) | "
        + ("violations (ours, sweep) | worst slowdown (ours, sweep) | " if slowdown else "")
        + " | ".join(f"regret % N={n} (ours max, sweep max)" for n in JOB_STEPS)
        + " |"
    )
    lines = [header, "|" + "---|" * len(header.split(" | "))]
    print("\n".join(lines), flush=True)  # the rows follow as each workload finishes
    ratio_max = 0.0
    gap_max = 0.0
    regret: dict[int, dict] = {
        n: {"regret_ratio_max": None, "our_regret_pct_max": None, "no_ratio": 0} for n in JOB_STEPS
    }
    violations = {"ours": 0, "sweep": 0, "ours_runs": 0, "sweep_runs": 0}
    worst_slowdown = {"ours": 0.0, "sweep": 0.0}
    sources = [traces.read_trace(path) for path in args.trace] or [traces.bundled_trace(g) for g in traces.GPUS]
    for trace in sources:
        gpu = trace.gpu
        for workload in traces.available_workloads(trace):
            backend = VirtualGPUBackend(trace=trace, workload=workload)
            low, high = backend.power_limit_constraints_W(0)
            objective = Objective(args.objective, args.eta_knob, args.max_slowdown, max_power_W=high)
            best = true_optimum(backend, objective)  # the regret's reference: the curve's own optimum
            grid_best = true_optimum(backend, objective, power_limit_grid_W(low, high))  # the gap's, as before
            by_n: dict[int, list[Decided]] = {n: [] for n in JOB_STEPS}  # our runs per job length
            sweep: list[Decided] = []
            for seed in range(args.seeds):
                kw = {"objective": args.objective, "eta_knob": args.eta_knob, "noise_W": args.noise_W}
                extra = {"max_slowdown": args.max_slowdown}
                if args.job_steps == "known":
                    for n in JOB_STEPS:
                        by_n[n].append(simulate(trace, workload, seed, {**extra, "job_steps": n}, **kw))
                else:
                    untold = simulate(trace, workload, seed, extra, **kw)
                    for n in JOB_STEPS:
                        by_n[n].append(untold)
                sweep.append(simulate(trace, workload, seed, {**SWEEP, **extra}, **kw))
            # the table's steps, limits, gaps and slowdowns: every run of ours (each N's, when N is known)
            ours = [d for n in JOB_STEPS for d in by_n[n]] if args.job_steps == "known" else by_n[JOB_STEPS[0]]
            # the search may choose off the grid: every cost comes from the curve itself
            cost_at: dict[float, float] = {}
            for d in ours + sweep:
                for x in (d.limit_W, *d.step_limits_W):
                    if x not in cost_at:
                        cost_at[x] = true_step_cost(backend, objective, x)

            def gap(d: Decided, cost_at: dict[float, float] = cost_at, best: float = grid_best) -> float:
                return 100 * (cost_at[d.limit_W] - best) / best

            def job(d: Decided, n: int, cost_at: dict[float, float] = cost_at, best: float = best) -> float:
                return job_regret([cost_at[x] for x in d.step_limits_W], cost_at[d.limit_W], best, n)

            gaps, sweep_gaps = [gap(d) for d in ours], [gap(d) for d in sweep]
            ratios = [o.steps / s.steps for n in JOB_STEPS for o, s in zip(by_n[n], sweep, strict=True)]
            ratio_max = max(ratio_max, max(ratios))
            gap_max = max(gap_max, max(gaps))
            cells = []
            for n in JOB_STEPS:
                mine = [job(d, n) for d in by_n[n]]
                theirs = [job(d, n) for d in sweep]
                r = regret[n]
                r["our_regret_pct_max"] = max(100 * max(mine), r["our_regret_pct_max"] or -1e300)
                for a, b in zip(mine, theirs, strict=True):
                    q = regret_ratio(a, b)
                    if q is None:
                        r["no_ratio"] += 1
                    else:
                        r["regret_ratio_max"] = max(q, r["regret_ratio_max"] or -1e300)
                cells.append(f"{100 * max(mine):.2f}, {100 * max(theirs):.2f}")
            if slowdown:
                limit_t = args.max_slowdown * (1 + 1e-12)
                slow = {
                    k: [backend.step_time_factor(d.limit_W) for d in v] for k, v in (("ours", ours), ("sweep", sweep))
                }
                for k, v in slow.items():
                    violations[k] += sum(t > limit_t for t in v)
                    violations[f"{k}_runs"] += len(v)
                    worst_slowdown[k] = max(worst_slowdown[k], max(v))
                cells[:0] = [
                    ", ".join(f"{sum(t > limit_t for t in slow[k])}/{len(slow[k])}" for k in ("ours", "sweep")),
                    f"{max(slow['ours']):.3f}, {max(slow['sweep']):.3f}",
                ]
            limits = sorted({d.limit_W for d in ours})
            sweep_limits = sorted({d.limit_W for d in sweep})
            lines.append(
                f"| {gpu} | {workload} | {statistics.mean(d.steps for d in sweep):.0f} | "
                f"{statistics.mean(d.steps for d in ours):.1f}, {max(d.steps for d in ours)} | {max(ratios):.3f} | "
                f"{'/'.join(f'{x:.0f}' for x in sweep_limits)} | {'/'.join(f'{x:.0f}' for x in limits)} | "
                f"{max(sweep_gaps):.2f} | {max(gaps):.2f} | " + " | ".join(cells) + " |"
            )
            print(lines[-1], flush=True)
    if args.markdown is not None:
        args.markdown.write_text("\n".join(lines) + "\n", encoding="utf-8")
    summary: dict = {
        "steps_ratio_max": round(ratio_max, 4),
        "cost_gap_pct_max": round(gap_max, 4),
        "regret": {
            str(n): {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for n, r in regret.items()
        },
    }
    if slowdown:
        summary["max_slowdown"] = {
            "violation_rate": {k: round(violations[k] / violations[f"{k}_runs"], 4) for k in ("ours", "sweep")},
            "worst_true_slowdown": {k: round(v, 4) for k, v in worst_slowdown.items()},
        }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
