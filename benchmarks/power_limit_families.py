"""Power-limit search over families of cost curves, against the true optimum of each curve.

The product's own code runs: an :class:`~zeus_callbacks.session.EnergySession` with
``power_limit.enabled`` on the virtual GPU and a :class:`ManualClock`, as in
``benchmarks/power_limit_search.py`` (per-step time 0.25 s × the slowdown at the limit in
force, 1 % step-time jitter, 3 W sensor noise on 20 ms samples, 30-step epochs). Each curve is
written as a user trace (the Zeus ``summary_power`` CSV format, one row per watt) into a
temporary folder and read back through ``VirtualGPUBackend(trace=...)``, so the virtual GPU's
range of limits is the curve's own.

Curve model (synthetic, per card range ``lo``–``hi`` W): a DVFS-like card whose busy power at
frequency ``f`` ∈ (0, 1] is ``P(f) = Ps + (Pu − Ps)·f^g`` and whose time per step is
``m + (1 − m)/f`` (``m``: the part that does not scale with the clock); a limit ``L`` caps the
power at ``min(L, Pu)``. Families:

- ``convex``: ``Pu`` = 0.97 hi, ``Ps`` = 0.8 lo, ``g`` = 3, ``m`` = 0.4 (an interior optimum);
- ``steep``: ``Ps`` = 0.6 lo, ``g`` = 1.3, ``m`` = 0 (speed ~ power: the optimum near the top);
- ``flat_topped``: ``Pu`` = lo + 0.3 (hi − lo): the limit binds only near the minimum, the
  cost is flat above;
- ``low_draw``: ``Pu`` = 0.9 lo: the limit never binds, every limit costs the same;
- ``noisy``: ``convex`` with 10 W sensor noise and 3 % step-time jitter;
- ``non_unimodal``: ``convex`` plus a second valley in power (a Gaussian dip, 4 % of the range
  wide) placed, for each objective, at the cheapest limit at least a quarter of the range away
  from the first valley, just deep enough to be the global optimum by 1 %;
- ``rising_energy``: energy per step rising linearly with the limit, +14 % from the minimum to the
  maximum, while the mean draw (``0.72 lo`` → ``0.54 hi``, 90–135 W on 125–250 W) stays below
  every limit above ~150 W: the limit clips peaks only (seen on real cards, issue 31);
- ``V100``, ``A40``: every workload of the bundled Zeus NSDI '23 traces (their own ranges).

Ranges 100–250, 125–250, 100–260, 150–400 and 200–700 W; ``power_limit.step_W`` 25 W (divides
every range but 100–260) and 35 W (divides none). Objectives ``zeus_cost`` (eta 0.5),
``energy`` and ``max_slowdown`` (1.1).

Baseline: the same session with the Zeus sweep (``search: sweep``, 10 warm-up + 40 profiled
steps at every limit of the grid). Cost gap: the noise-free cost of the chosen limit over the
**true optimum of the curve**, the minimum over the whole range on a 0.25 W grid (not the
best point of the search's grid). For ``max_slowdown`` a choice slower than 1.1 × the time at
the maximum limit counts as a gap equal to its excess (``t / (1.1 t_max) − 1``, in %).

The last line is one JSON object::

    {"steps_ratio_max": ..., "cost_gap_pct_max": ..., "by_family": {...}, "by_objective": {...}}

Usage::

    python benchmarks/power_limit_families.py [--seeds 3] [--workers 2] [--json-out FILE] [--markdown FILE]
    python benchmarks/power_limit_families.py --trace my_gpu.csv        # add a user trace as a family
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package, not an installed one

from zeus_callbacks.backends import traces
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.optimizers.power_limit import power_limit_grid_W

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark's training loop
from power_limit_regret import JOB_STEPS, job_regret, regret_ratio  # noqa: E402
from power_limit_search import Decided, profile_until_decided  # noqa: E402

TARGET_STEP_S = 0.25  # per-step time at the maximum limit
STEPS_PER_EPOCH = 30
SWEEP = {"search": "sweep", "warmup_steps": 10, "min_profile_steps": 40, "profile_steps": 40}
RANGES_W = ((100, 250), (125, 250), (100, 260), (150, 400), (200, 700))
STEPS_W = (25.0, 35.0)
SYNTHETIC = ("convex", "steep", "flat_topped", "low_draw", "noisy", "non_unimodal", "rising_energy")
RISE = 0.14  # rising_energy: energy per step at the maximum limit over that at the minimum, minus 1
OBJECTIVES = ("zeus_cost", "energy", "max_slowdown")
ETA = 0.5
MAX_SLOWDOWN = 1.1
TRUE_RESOLUTION_W = 0.25


# -- curves ------------------------------------------------------------------------
def _dvfs(family: str, limits_W: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """(time factor, busy power W) of a synthetic family at ``limits_W``."""
    static_W, g, m, unbound_W = 0.8 * lo, 3.0, 0.4, 0.97 * hi
    if family == "steep":
        static_W, g, m = 0.6 * lo, 1.3, 0.0
    elif family == "flat_topped":
        unbound_W = lo + 0.3 * (hi - lo)
    elif family == "low_draw":
        unbound_W = 0.9 * lo
    power_W = np.minimum(limits_W, unbound_W)
    f = np.clip((power_W - static_W) / (unbound_W - static_W), 1e-9, 1.0) ** (1.0 / g)
    return m + (1.0 - m) / f, power_W


def true_cost(objective: str, time_s: np.ndarray, power_W: np.ndarray, max_W: float) -> np.ndarray:
    """Noise-free cost per step of every point (the last point is the maximum limit); inf: infeasible."""
    energy_J = time_s * power_W
    if objective == "energy":
        return energy_J
    if objective == "zeus_cost":
        return ETA * energy_J + (1 - ETA) * max_W * time_s
    return np.where(time_s <= MAX_SLOWDOWN * time_s[-1] * (1 + 1e-12), energy_J, np.inf)


def _rising_energy(limits_W: np.ndarray, lo: float, hi: float) -> traces.PowerCurve:
    """A card whose energy per step rises with the limit while its mean draw stays below it.

    Mean draw ``0.72 lo`` at the minimum to ``0.54 hi`` at the maximum, linear in the limit
    (90–135 W on 125–250 W: below every limit above 135 W); the limit clips short peaks only,
    so the energy per step still rises, linearly, from its least at the minimum to ``1 + RISE``
    times that at the maximum; time per step = energy / mean draw (1.32× the time at the maximum
    on 125–250 W). As measured on real cards (project issue 31).
    """
    s = (limits_W - lo) / (hi - lo)
    power_W = 0.72 * lo + (0.54 * hi - 0.72 * lo) * s
    energy = (1.0 + RISE * s) / (1.0 + RISE)  # 1 at the maximum limit
    time_per_epoch_s = 100.0 * energy * power_W[-1] / power_W
    return traces.PowerCurve(limits_W, time_per_epoch_s, power_W)


def synthetic_curve(family: str, lo: float, hi: float, objective: str) -> traces.PowerCurve:
    """The family's curve on ``lo``–``hi`` W at 1 W resolution (time per epoch = time factor × 100 s)."""
    limits = np.arange(lo, hi + 0.5, 1.0)
    if family == "rising_energy":
        return _rising_energy(limits, lo, hi)
    base = "convex" if family in ("noisy", "non_unimodal") else family
    factor, power_W = _dvfs(base, limits, lo, hi)
    if family == "non_unimodal":
        cost = true_cost(objective, factor, power_W, hi)
        first = int(np.argmin(cost))
        far = np.flatnonzero(np.abs(limits - limits[first]) >= 0.25 * (hi - lo))
        second = int(far[np.argmin(cost[far])])  # the cheapest limit a quarter of the range away
        x = (limits - limits[second]) / (0.04 * (hi - lo))
        for depth in np.arange(0.01, 0.30, 0.005):  # the shallowest dip that wins by ~1 %
            dipped = power_W * (1 - depth * np.exp(-(x**2)))
            c = true_cost(objective, factor, dipped, hi)
            if np.nanmin(c[np.abs(x) < 1]) < 0.99 * np.nanmin(c[np.abs(x) > 3]):
                power_W = dipped
                break
    return traces.PowerCurve(limits, factor * 100.0, power_W)


def write_trace(curve: traces.PowerCurve, path: Path, gpu: str) -> Path:
    """Write ``curve`` as a one-workload user trace (Zeus summary_power columns)."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["gpu", *traces.KEY_COLUMNS, *traces.POWER_COLUMNS])
        for limit, t, p in zip(curve.power_limit_W, curve.time_per_epoch_s, curve.average_power_W, strict=True):
            writer.writerow([gpu, "synthetic", "model", 32, "sgd", repr(float(limit)), repr(float(t)), repr(float(p))])
    return path


def dense_costs(curve: traces.PowerCurve, objective: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(limits, cost, time factor) of the curve's interpolation on a fine grid over its whole range."""
    lo, hi = curve.min_limit_W, curve.max_limit_W
    limits = np.append(np.arange(lo, hi, TRUE_RESOLUTION_W), hi)
    t = np.interp(limits, curve.power_limit_W, curve.time_per_epoch_s)
    p = np.interp(limits, curve.power_limit_W, curve.average_power_W)
    return limits, true_cost(objective, t, p, hi), t


def step_cost(curve: traces.PowerCurve, objective: str, limit_W: float) -> float:
    """Noise-free cost of one step at ``limit_W`` (``max_slowdown``: its energy, whatever its slowdown)."""
    t_at = float(np.interp(limit_W, curve.power_limit_W, curve.time_per_epoch_s))
    p_at = float(np.interp(limit_W, curve.power_limit_W, curve.average_power_W))
    priced = "energy" if objective == "max_slowdown" else objective
    return float(true_cost(priced, np.array([t_at]), np.array([p_at]), curve.max_limit_W)[0])


def slowdown(curve: traces.PowerCurve, limit_W: float) -> float:
    """True slowdown at ``limit_W``: time there over the time at the maximum limit."""
    return float(np.interp(limit_W, curve.power_limit_W, curve.time_per_epoch_s) / curve.time_per_epoch_s[-1])


def violates(curve: traces.PowerCurve, limit_W: float) -> bool:
    """Whether ``limit_W`` is, on the true curve, slower than ``MAX_SLOWDOWN`` allows."""
    return slowdown(curve, limit_W) > MAX_SLOWDOWN * (1 + 1e-12)


def best_cost(curve: traces.PowerCurve, objective: str) -> float:
    """Noise-free cost per step at the curve's true optimum (``max_slowdown``: the least energy of a feasible limit)."""
    return float(np.min(dense_costs(curve, objective)[1]))


def gap_pct(curve: traces.PowerCurve, objective: str, limit_W: float) -> float:
    """Cost gap (%) of ``limit_W`` to the curve's true optimum.

    ``max_slowdown``: the energy gap to the least energy of a feasible limit, negative for a limit
    slower than allowed that uses less (its violation is reported apart, never as a gap).
    """
    best = best_cost(curve, objective)
    return 100.0 * (step_cost(curve, objective, limit_W) - best) / best


# -- one simulated training ------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One curve, range, grid step and objective."""

    family: str
    objective: str
    step_W: float
    curve: traces.PowerCurve
    label: str  # e.g. "100-260" or the workload
    noise_W: float = 3.0
    jitter: float = 0.01


def run_search(case: Case, seed: int, overrides: dict) -> Decided:
    """Run one training on the case's curve until the profiler decides (steps, chosen limit W, limit of each step)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = write_trace(case.curve, Path(tmp) / "curve.csv", gpu=f"{case.family} {case.label}")
        clock = ManualClock(1000.0)
        backend = VirtualGPUBackend(trace=path, clock=clock, noise_W=case.noise_W, seed=seed, read_only=False)
        power_limit = {"objective": case.objective, "eta_knob": ETA, "max_slowdown": MAX_SLOWDOWN,
                       "step_W": case.step_W, **overrides}  # fmt: skip
        return profile_until_decided(
            backend,
            clock,
            power_limit,
            tmp,
            base_s=TARGET_STEP_S,
            jitter=case.jitter,
            seed=seed,
            steps_per_epoch=STEPS_PER_EPOCH,
            max_steps=20_000,
            label=str(case),
        )


def shrunk_sweep(case: Case, steps: float) -> dict:
    """The Zeus sweep's settings with its windows shrunk so that it runs about ``steps`` steps in all.

    Every grid limit gets ``steps / len(grid)`` steps, a fifth of them warm-up (Zeus: 10 of 50), at
    least 2 profiled.
    """
    lo, hi = case.curve.min_limit_W, case.curve.max_limit_W
    per_limit = steps / len(power_limit_grid_W(lo, hi, case.step_W))
    warmup = round(per_limit / 5)
    profile = max(2, round(per_limit) - warmup)
    return {"search": "sweep", "warmup_steps": warmup, "min_profile_steps": profile, "profile_steps": profile}


def _job(job: tuple[Case, int, str, bool, dict | None]) -> dict:
    """One case and seed: the sweep, the shrunk sweep (``shrink``: its steps per N) or our search.

    With ``known`` our search runs once per job length N, told N (``power_limit.job_steps``); the
    shrunk sweep runs once per N too.
    """
    case, seed, mode, known, shrink = job
    curve, objective = case.curve, case.objective
    best = best_cost(curve, objective)
    if mode == "sweep":
        runs = {None: run_search(case, seed, SWEEP)}
    elif mode == "shrunk":
        assert shrink is not None
        runs = {n: run_search(case, seed, shrunk_sweep(case, steps)) for n, steps in shrink.items()}
    elif known:
        runs = {n: run_search(case, seed, {"job_steps": n}) for n in JOB_STEPS}
    else:
        runs = {None: run_search(case, seed, {})}
    regret, gap_by_n, steps_by_n = {}, {}, {}
    for n in JOB_STEPS:
        d = runs[n] if n in runs else next(iter(runs.values()))  # one run for every N when N is not known
        cost_at = {x: step_cost(curve, objective, x) for x in {d.limit_W, *d.step_limits_W}}
        regret[n] = job_regret([cost_at[x] for x in d.step_limits_W], cost_at[d.limit_W], best, n)
        gap_by_n[n], steps_by_n[n] = gap_pct(curve, objective, d.limit_W), d.steps
    # the table's steps, gap and slowdown: the worst over the runs (with known N, the longest job profiles most)
    limits = [d.limit_W for d in runs.values()]
    return {"mode": mode, "seed": seed, "steps": max(d.steps for d in runs.values()),
            "limit_W": max(limits, key=lambda x: gap_pct(curve, objective, x)),
            "gap_pct": max(gap_by_n.values()), "regret": regret, "gap_by_n": gap_by_n, "steps_by_n": steps_by_n,
            "violates": any(violates(curve, x) for x in limits),
            "slowdown": max(slowdown(curve, x) for x in limits)}  # fmt: skip


def cases(user_traces: list[traces.GPUTrace]) -> list[Case]:
    """Every family × range × step × objective, then every workload of V100, A40 and the user traces."""
    out = []
    for objective in OBJECTIVES:
        for family in SYNTHETIC:
            for lo, hi in RANGES_W:
                curve = synthetic_curve(family, lo, hi, objective)
                noisy = family == "noisy"
                for step_W in STEPS_W:
                    out.append(Case(family, objective, step_W, curve, f"{lo}-{hi}", 10.0 if noisy else 3.0,
                                    0.03 if noisy else 0.01))  # fmt: skip
        for trace in [traces.bundled_trace(g) for g in traces.GPUS] + user_traces:
            for workload in traces.available_workloads(trace):
                curve = traces.power_curve(trace, workload)
                for step_W in STEPS_W:
                    out.append(Case(trace.gpu, objective, step_W, curve, workload))
    return out


def _family_row() -> dict:
    """An empty per-family accumulator of the table (the gaps start below any real gap)."""
    return {
        "cases": 0, "runs": 0, "steps_ratio_max": 0.0, "cost_gap_pct_max": -1e300, "sweep_gap_pct_max": -1e300,
        "worst": "", "violations": 0, "sweep_violations": 0, "worst_slowdown": 0.0, "sweep_worst_slowdown": 0.0,
        "regret": {
            str(n): {"our_regret_pct_max": -1e300, "sweep_regret_pct_max": -1e300, "regret_ratio_max": None,
                     "no_ratio": 0}
            for n in JOB_STEPS
        },
    }  # fmt: skip


def _regret_worst(rows: list[dict]) -> dict:
    """Per N, the worst of several per-family regret entries: {N: {our_regret_pct_max, regret_ratio_max, ...}}."""
    out = {}
    for n in (str(n) for n in JOB_STEPS):
        ratios = [r[n]["regret_ratio_max"] for r in rows if r[n]["regret_ratio_max"] is not None]
        out[n] = {
            "regret_ratio_max": round(max(ratios), 4) if ratios else None,
            "our_regret_pct_max": round(max(r[n]["our_regret_pct_max"] for r in rows), 4),
            "sweep_regret_pct_max": round(max(r[n]["sweep_regret_pct_max"] for r in rows), 4),
            "no_ratio": sum(r[n]["no_ratio"] for r in rows),
        }
    return out


def _rounded(f: dict) -> dict:
    """A family's accumulator with its floats rounded to 4 digits (nested regret entries too)."""
    return {k: _rounded(v) if isinstance(v, dict) else round(v, 4) if isinstance(v, float) else v for k, v in f.items()}


def main() -> None:
    """Run the benchmark; print the per-family table, then one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds of our search per case (the sweep: seed 0)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--objectives", default=",".join(OBJECTIVES))
    parser.add_argument("--families", default=None, help="comma-separated families (default: all)")
    parser.add_argument("--trace", type=Path, action="append", default=[], help="a user trace CSV (repeatable)")
    parser.add_argument(
        "--job-steps",
        choices=("known", "unknown"),
        default="known",
        help="known: our search runs once per job length N with power_limit.job_steps = N; unknown: once, untold",
    )
    parser.add_argument("--json-out", type=Path, default=None, help="also write the JSON summary here")
    parser.add_argument("--runs-out", type=Path, default=None, help="also write every run's result here (JSON lines)")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    start = time.monotonic()
    objectives = args.objectives.split(",")
    chosen = [c for c in cases([traces.read_trace(p) for p in args.trace]) if c.objective in objectives]
    if args.families:
        chosen = [c for c in chosen if c.family in args.families.split(",")]
    known = args.job_steps == "known"
    jobs: list = [(c, s, "ours", known, None) for c in chosen for s in range(args.seeds)]
    jobs += [(c, 0, "sweep", known, None) for c in chosen]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(_job, jobs, chunksize=4))
        # the sweep shrunk to our mean step count per case (and job length), seed 0: the equal-budget baseline
        ours_steps: dict[int, list[dict]] = {}
        for (case, _, mode, _, _), r in zip(jobs, results, strict=True):
            if mode == "ours":
                ours_steps.setdefault(id(case), []).append(r["steps_by_n"])
        shrunk_jobs = []
        for c in chosen:
            by_n = ours_steps[id(c)]
            shrink = {n: float(np.mean([r[n] for r in by_n])) for n in (JOB_STEPS if known else JOB_STEPS[:1])}
            shrunk_jobs.append((c, 0, "shrunk", known, shrink))
        shrunk = list(pool.map(_job, shrunk_jobs, chunksize=4))
    jobs += shrunk_jobs
    results += shrunk
    if args.runs_out is not None:
        with args.runs_out.open("w", encoding="utf-8") as f:
            for (case, _, _, _, _), r in zip(jobs, results, strict=True):
                row = {"objective": case.objective, "family": case.family, "case": f"{case.label} step {case.step_W:g}"}
                f.write(json.dumps({**row, **r}) + "\n")
    by_case: dict[int, dict[str, list[dict]]] = {}
    for (case, _, mode, _, _), r in zip(jobs, results, strict=True):
        by_case.setdefault(id(case), {"ours": [], "sweep": [], "shrunk": []})[mode].append(r)

    summary: dict = {"by_objective": {}}
    header = (
        "| objective | family | cases | steps ratio (max) | our gap % (max) | worst case | sweep gap % (max) | "
        "violations (ours, sweep) | worst true slowdown (ours, sweep) | "
        + " | ".join(f"regret % N={n} (ours max, sweep max, ratio max)" for n in JOB_STEPS)
        + " |"
    )
    lines = [header, "|" + "---|" * len(header.split(" | "))]
    gaps_line: list[str] = []  # mean gap per objective and N: ours, the shrunk sweep's, the full sweep's
    for objective in objectives:
        fams: dict[str, dict] = {}
        for case in (c for c in chosen if c.objective == objective):
            runs = by_case[id(case)]
            sweep = runs["sweep"][0]
            ratio = max(r["steps"] for r in runs["ours"]) / sweep["steps"]
            worst = max(runs["ours"], key=lambda r: r["gap_pct"])
            f = fams.setdefault(case.family, _family_row())
            f["cases"] += 1
            f["steps_ratio_max"] = max(f["steps_ratio_max"], ratio)
            f["sweep_gap_pct_max"] = max(f["sweep_gap_pct_max"], sweep["gap_pct"])
            if worst["gap_pct"] > f["cost_gap_pct_max"]:
                f["cost_gap_pct_max"] = worst["gap_pct"]
                f["worst"] = f"{case.label} step {case.step_W:g} W: {worst['limit_W']:.1f} W"
            f["runs"] += len(runs["ours"])
            f["violations"] += sum(r["violates"] for r in runs["ours"])
            f["sweep_violations"] += int(sweep["violates"])
            f["worst_slowdown"] = max(f["worst_slowdown"], *(r["slowdown"] for r in runs["ours"]))
            f["sweep_worst_slowdown"] = max(f["sweep_worst_slowdown"], sweep["slowdown"])
            for n in JOB_STEPS:
                g = f["regret"][str(n)]
                g["our_regret_pct_max"] = max(g["our_regret_pct_max"], *(100 * r["regret"][n] for r in runs["ours"]))
                g["sweep_regret_pct_max"] = max(g["sweep_regret_pct_max"], 100 * sweep["regret"][n])
                for r in runs["ours"]:
                    q = regret_ratio(r["regret"][n], sweep["regret"][n])
                    if q is None:
                        g["no_ratio"] += 1  # the sweep's regret is not > 0: no ratio to take
                    else:
                        g["regret_ratio_max"] = q if g["regret_ratio_max"] is None else max(g["regret_ratio_max"], q)
        for name, f in fams.items():
            if objective == "max_slowdown":
                viol = f"{f['violations']}/{f['runs']}, {f['sweep_violations']}/{f['cases']}"
                slow = f"{f['worst_slowdown']:.3f}, {f['sweep_worst_slowdown']:.3f}"
            else:
                viol = slow = "n/a"
            regrets = " | ".join(
                f"{g['our_regret_pct_max']:.2f}, {g['sweep_regret_pct_max']:.2f}, "
                + ("—" if g["regret_ratio_max"] is None else f"{g['regret_ratio_max']:.2f}")
                for g in f["regret"].values()
            )
            lines.append(
                f"| {objective} | {name} | {f['cases']} | {f['steps_ratio_max']:.3f} | {f['cost_gap_pct_max']:.2f} | "
                f"{f['worst']} | {f['sweep_gap_pct_max']:.2f} | {viol} | {slow} | {regrets} |"
            )
            if objective != "max_slowdown":
                for key in ("violations", "sweep_violations", "worst_slowdown", "sweep_worst_slowdown"):
                    del f[key]
            else:
                f["violation_rate"] = f["violations"] / f["runs"]
                f["sweep_violation_rate"] = f["sweep_violations"] / f["cases"]
        runs_of = [by_case[id(c)] for c in chosen if c.objective == objective]
        mean_gap = {
            str(n): {
                mode: round(float(np.mean([r["gap_by_n"][n] for runs in runs_of for r in runs[mode]])), 4)
                for mode in ("ours", "shrunk", "sweep")
            }
            for n in JOB_STEPS
        }
        gaps_line.append(f"{objective}: " + "; ".join(
            f"N={n} ours {g['ours']:.2f} %, shrunk sweep {g['shrunk']:.2f} %, sweep {g['sweep']:.2f} %"
            for n, g in mean_gap.items()
        ))  # fmt: skip
        summary["by_objective"][objective] = {
            "mean_gap_pct": mean_gap,
            "steps_ratio_max": round(max(f["steps_ratio_max"] for f in fams.values()), 4),
            "cost_gap_pct_max": round(max(f["cost_gap_pct_max"] for f in fams.values()), 4),
            "regret": _regret_worst([f["regret"] for f in fams.values()]),
            "by_family": {name: _rounded(f) for name, f in fams.items()},
        }
    lines += ["", "Mean gap to the true optimum (all runs):", *gaps_line]
    print("\n".join(lines))
    per_obj = summary["by_objective"].values()
    families = {name for o in per_obj for name in o["by_family"]}
    summary = {
        "steps_ratio_max": max(o["steps_ratio_max"] for o in per_obj),
        "cost_gap_pct_max": max(o["cost_gap_pct_max"] for o in per_obj),
        "regret": _regret_worst([o["regret"] for o in per_obj]),
        "by_family": {
            name: {
                key: max(o["by_family"][name][key] for o in per_obj if name in o["by_family"])
                for key in ("steps_ratio_max", "cost_gap_pct_max")
            }
            for name in sorted(families)
        },
        **summary,
    }  # fmt: skip
    print(f"# {len(jobs)} simulated trainings in {time.monotonic() - start:.0f} s", flush=True)
    if args.markdown is not None:
        args.markdown.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
