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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package, not an installed one

from zeus_callbacks.backends import traces
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.optimizers.power_limit import Objective, power_limit_grid_W
from zeus_callbacks.session import EnergySession

TARGET_STEP_S = 0.25  # per-step time at the maximum limit is the epoch time split into ~this
SWEEP = {"search": "sweep", "warmup_steps": 10, "min_profile_steps": 40, "profile_steps": 40}


def step_time_s(curve: traces.PowerCurve) -> float:
    """Per-step time at the maximum limit (s): the trace's epoch time over 20–2000 steps."""
    epoch_s = float(curve.time_per_epoch_s[-1])
    steps = int(np.clip(round(epoch_s / TARGET_STEP_S), 20, 2000))
    return epoch_s / steps


def true_costs(backend: VirtualGPUBackend, objective: Objective, grid: list[float]) -> dict[float, float]:
    """Noise-free cost per step of every grid limit, from the trace curve."""
    ref_t = backend.step_time_factor(max(grid))
    return {
        x: objective.cost(backend.step_time_factor(x) * backend.average_power_W(x), backend.step_time_factor(x), ref_t)
        for x in grid
    }


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
) -> tuple[int, float]:
    """Train on the virtual GPU through the real session until the power-limit profiler decides.

    Each step lasts ``base_s`` times the slowdown at the limit in force, with relative
    Gaussian jitter ``jitter`` (seeded from ``seed``); epochs are ``steps_per_epoch`` long.

    Returns:
        (steps spent profiling, chosen limit in W).
    """
    rng = np.random.default_rng(seed + 7919)
    config = {
        "backend": "virtual",
        "logging": {"log_dir": log_dir, "jsonl": False},
        "power_limit": {"enabled": True, "cache": False, "plot": False, **power_limit},
    }
    session = EnergySession(config, backend=backend, is_main_process=True)
    session.train_start()
    limiter = session.power_limiter
    assert limiter is not None
    try:
        for step in range(max_steps):
            if step % steps_per_epoch == 0:
                session.epoch_start(step // steps_per_epoch)
            session.step_start(step)
            factor = backend.step_time_factor(backend.power_limit_W(0))
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
    return result.profiling_steps, float(result.chosen_limit_W)


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
    max_steps: int = 5000,
) -> tuple[int, float]:
    """Run one simulated training of a trace workload until the profiler decides.

    Returns:
        (steps spent profiling, chosen limit in W).
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


def main() -> None:
    """Run the benchmark and print the table, then one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--noise-W", type=float, default=3.0)
    parser.add_argument("--objective", default="zeus_cost")
    parser.add_argument("--eta-knob", type=float, default=0.5)
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    parser.add_argument(
        "--trace", type=Path, action="append", default=[], help="a user trace CSV (repeatable; default: V100, A40)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    header = (
        "| GPU | workload | sweep steps | our steps (mean, max) | steps ratio (max) | sweep limit | "
        "our limits | sweep gap % (max) | our gap % (max) |"
    )
    lines = [header, "|" + "---|" * 9]
    ratio_max = 0.0
    gap_max = 0.0
    sources = [traces.read_trace(path) for path in args.trace] or [traces.bundled_trace(g) for g in traces.GPUS]
    for trace in sources:
        gpu = trace.gpu
        for workload in traces.available_workloads(trace):
            backend = VirtualGPUBackend(trace=trace, workload=workload)
            low, high = backend.power_limit_constraints_W(0)
            grid = power_limit_grid_W(low, high)
            objective = Objective(args.objective, args.eta_knob, max_power_W=high)
            costs = true_costs(backend, objective, grid)
            best = min(costs.values())
            ours, sweep = [], []
            for seed in range(args.seeds):
                kw = {"objective": args.objective, "eta_knob": args.eta_knob, "noise_W": args.noise_W}
                ours.append(simulate(trace, workload, seed, {}, **kw))
                sweep.append(simulate(trace, workload, seed, SWEEP, **kw))
            # the search may choose off the grid: the chosen limit's cost comes from the curve itself
            ref_t = backend.step_time_factor(high)
            cost_at = {
                x: objective.cost(backend.step_time_factor(x) * backend.average_power_W(x), backend.step_time_factor(x),
                                  ref_t)
                for _, x in ours + sweep
            }  # fmt: skip
            gaps = [100 * (cost_at[limit] - best) / best for _, limit in ours]
            sweep_gaps = [100 * (cost_at[limit] - best) / best for _, limit in sweep]
            ratios = [o[0] / s[0] for o, s in zip(ours, sweep, strict=True)]
            ratio_max = max(ratio_max, max(ratios))
            gap_max = max(gap_max, max(gaps))
            limits = sorted({limit for _, limit in ours})
            sweep_limits = sorted({limit for _, limit in sweep})
            lines.append(
                f"| {gpu} | {workload} | {statistics.mean(s for s, _ in sweep):.0f} | "
                f"{statistics.mean(o for o, _ in ours):.1f}, {max(o for o, _ in ours)} | {max(ratios):.3f} | "
                f"{'/'.join(f'{x:.0f}' for x in sweep_limits)} | {'/'.join(f'{x:.0f}' for x in limits)} | "
                f"{max(sweep_gaps):.2f} | {max(gaps):.2f} |"
            )
            print(lines[-1], flush=True)
    if args.markdown is not None:
        args.markdown.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines[:2]))
    print(json.dumps({"steps_ratio_max": round(ratio_max, 4), "cost_gap_pct_max": round(gap_max, 4)}))


if __name__ == "__main__":
    main()
