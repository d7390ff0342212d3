"""Trace-driven simulator of recurring jobs that runs the product's own code.

Each recurrence of a job asks :func:`~zeus_callbacks.optimizers.recurring.suggest_batch_size`
for a batch size, then drives an :class:`~zeus_callbacks.session.EnergySession` — with the
batch-size bandit, early stopping and the store exactly as a real run has them — on a
:class:`~zeus_callbacks.backends.virtual.VirtualGPUBackend` whose
:class:`~zeus_callbacks.backends.base.ManualClock` the simulator advances step by step.
Only the training itself is synthetic, from the Zeus (NSDI '23) traces:

- **Training path**: one run sampled (seeded) from ``summary_train.csv`` for the chosen
  batch size; its ``target_epoch`` is the epoch at which validation reaches the
  workload's target (never, within ``max_epochs``, when it is missing).
- **Time and power** per epoch at the power limit in force, from
  ``summary_power_{gpu}.csv`` (the virtual GPU's own model).

An epoch is ``steps_per_epoch`` simulated steps (coarse steps keep 100 recurrences to
seconds; early stopping is checked at every one). After each epoch the simulator
reports the metric ``target`` (the target value once reached, a worse one before).

Power limit (``power_limit``): ``"max"`` trains at the maximum limit; ``"jit"`` is a
stand-in for the just-in-time profiler (not yet the real one in ``optimizers/power_limit.py``): at the start of the
first epoch it runs ``profile_epochs`` at each limit from the maximum down (charged at
that limit's real time and power, and counted as training progress), measures the cost
per epoch of each from the session's own totals, and trains at the cheapest (the
traces' cost is not unimodal in the limit, so every limit is tried). The profile is cached in the store (key
``<gpu>/<workload>/bs<b>/eta<eta>``): a later recurrence at the same batch size skips
profiling.

Command line (a table; ``--json`` for one JSON line per recurrence)::

    python -m zeus_callbacks.simulate --gpu A40 --workload cifar100 --recurrences 100 --seed 0
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from zeus_callbacks import reporting as metric
from zeus_callbacks.backends import traces
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.optimizers.cost import ZeusCost
from zeus_callbacks.optimizers.recurring import suggest_batch_size
from zeus_callbacks.session import EnergySession
from zeus_callbacks.store import open_store

logger = logging.getLogger(__name__)

METRIC = "target"
"""Name of the validation metric the simulator reports."""


@dataclass(frozen=True)
class Recurrence:
    """Outcome of one simulated recurrence.

    Attributes:
        index: Recurrence number (from 0).
        batch_size: Batch size the bandit chose.
        power_limit_W: Power limit trained at after profiling (W).
        energy_J: Measured GPU energy (J).
        time_s: Simulated wall time (s).
        cost: ZeusCost of the run (J-equivalent), as recorded in the store.
        converged: Whether the target was reached.
        status: Trial status (``completed`` or ``early_stopped``).
        epochs: Epochs trained (fractional when stopped mid-epoch).
        phase: Bandit phase of the choice.
        target_epoch: Epoch at which the sampled path reaches the target; None if never.
    """

    index: int
    batch_size: int
    power_limit_W: float
    energy_J: float
    time_s: float
    cost: float
    converged: bool
    status: str
    epochs: float
    phase: str
    target_epoch: int | None


def training_paths(gpu: str, workload: str, batch_size: int) -> list[int | None]:
    """``target_epoch`` of every traced run of ``workload`` at ``batch_size`` (None: never reached).

    Raises:
        ValueError: Unknown GPU or workload.
    """
    traces.normalize_gpu(gpu)
    w = traces.get_workload(workload)
    return [
        p.target_epoch
        for p in traces.load_train_trace()
        if (p.dataset, p.network, p.optimizer, p.batch_size) == (w.dataset, w.network, w.optimizer, batch_size)
        and math.isclose(p.target_metric, w.target_metric)
    ]


def epoch_cost(curve: traces.PowerCurve, power_limit_W: float, cost: ZeusCost) -> float:
    """ZeusCost of one epoch at ``power_limit_W`` from the trace (J-equivalent)."""
    return cost(traces.epoch_energy_J_at(curve, power_limit_W), traces.time_per_epoch_s_at(curve, power_limit_W))


def best_power_limit_W(curve: traces.PowerCurve, cost: ZeusCost) -> float:
    """The traced power limit with the lowest cost per epoch (W)."""
    return float(min(curve.power_limit_W, key=lambda p: (epoch_cost(curve, float(p), cost), -p)))


def simulate(
    gpu: str,
    workload: str,
    recurrences: int,
    *,
    eta_knob: float = 0.5,
    beta_knob: float | None = 2.0,
    seed: int = 0,
    store_path: str | Path | None = None,
    steps_per_epoch: int = 4,
    power_limit: Literal["max", "jit"] = "max",
    profile_epochs: float = 0.01,
    pruning_rounds: int = 1,
    batch_sizes: Sequence[int] | None = None,
    bandit: dict | None = None,
    on_recurrence: Callable[[Recurrence], None] | None = None,
) -> list[Recurrence]:
    """Replay ``recurrences`` recurrences of one workload through the real session, bandit and store.

    Args:
        gpu: ``"V100"`` or ``"A40"``.
        workload: Zeus workload (``cifar100``, ``imagenet``, ``librispeech``, ``movielens-1m``,
            ``sentiment140``, ``squad``).
        recurrences: How many recurrences to run.
        eta_knob: Energy weight of the cost.
        beta_knob: Early-stopping factor (None: off).
        seed: Seeds the bandit and the sampling of training paths.
        store_path: Store file (kept, so a later call continues the job); default a
            temporary one.
        steps_per_epoch: Simulated steps per epoch (early stopping granularity).
        power_limit: ``"max"`` or ``"jit"`` (see the module docstring).
        profile_epochs: With ``"jit"``: epochs spent at each limit while profiling.
        pruning_rounds: Pruning rounds of the bandit.
        batch_sizes: Arms; default every batch size of the workload in the GPU's trace.
        bandit: Further ``batch_size`` settings (e.g. ``{"noise_floor_rel": 0.1}``).
        on_recurrence: Called with each :class:`Recurrence` as soon as it ends (progress, streaming).

    Returns:
        One :class:`Recurrence` per recurrence, in order.

    Raises:
        ValueError: Unknown GPU or workload, or bad arguments.
    """
    if steps_per_epoch < 1 or recurrences < 0:
        raise ValueError("steps_per_epoch must be ≥ 1 and recurrences ≥ 0")
    w = traces.get_workload(workload)
    sizes = list(batch_sizes or traces.available_batch_sizes(gpu, workload))
    default = traces.default_batch_size(gpu, workload)
    world = np.random.default_rng([int(seed), 0x5EED])
    with tempfile.TemporaryDirectory(prefix="zeus-sim-") as tmp:
        path = Path(store_path) if store_path is not None else Path(tmp) / "store.sqlite"
        config = {
            "job_id": f"sim/{traces.normalize_gpu(gpu)}/{w.dataset}",
            "backend": "virtual",
            "logging": {"jsonl": False, "log_dir": tmp, "interval_steps": max(steps_per_epoch, 1)},
            "windows": {"step": False, "eval": False},
            "store": {"backend": "json" if path.suffix == ".json" else "sqlite", "path": str(path)},
            "batch_size": {
                "enabled": True,
                "batch_sizes": sizes,
                "default_batch_size": default,
                "target": {
                    "metric": METRIC,
                    "value": w.target_metric,
                    "direction": "max" if w.higher_is_better else "min",
                },
                "eta_knob": eta_knob,
                "beta_knob": beta_knob,
                "seed": seed,
                "pruning_rounds": pruning_rounds,
                **(bandit or {}),
            },
        }
        out = []
        for index in range(recurrences):
            out.append(_one_recurrence(index, gpu, w, config, world, steps_per_epoch, power_limit, profile_epochs))
            if on_recurrence is not None:
                on_recurrence(out[-1])
        return out


def _one_recurrence(
    index: int,
    gpu: str,
    w: traces.Workload,
    config: dict,
    world: np.random.Generator,
    steps_per_epoch: int,
    power_limit: str,
    profile_epochs: float,
) -> Recurrence:
    batch_size = suggest_batch_size(config)
    paths = training_paths(gpu, w.dataset, batch_size)
    target_epoch = paths[int(world.integers(len(paths)))] if paths else None
    curve = traces.power_curve(gpu, w.dataset, batch_size)
    max_W = curve.max_limit_W
    cost = ZeusCost(config["batch_size"]["eta_knob"], max_W)
    dt_max = traces.time_per_epoch_s_at(curve, max_W) / steps_per_epoch
    clock = ManualClock(0.0)
    backend = VirtualGPUBackend(
        gpu=gpu,
        workload=w.dataset,
        batch_size=batch_size,
        clock=clock,
        noise_W=0.0,
        read_only=False,
        # A few samples per simulated step (profiling slices included): exact, and fast.
        sample_period_s=min(1.0, dt_max / 8, profile_epochs * traces.time_per_epoch_s_at(curve, max_W) / 8),
    )
    session = EnergySession(config, backend=backend, is_main_process=True)
    session.suggest_batch_size()  # claims the suggestion made above
    session.train_start(run_name=f"recurrence-{index}")
    sampler = session.sampler
    assert sampler is not None

    # Each simulated step is a slice of an epoch; `progress` counts epochs done.
    if power_limit not in ("max", "jit"):
        raise ValueError(f"power_limit must be 'max' or 'jit', got {power_limit!r}")
    profile_key = f"{traces.normalize_gpu(gpu)}/{w.dataset}/bs{batch_size}/eta{cost.eta_knob:g}"
    cached = _get_profile(config, profile_key) if power_limit == "jit" else None
    to_profile = [float(p) for p in sorted(curve.power_limit_W, reverse=True)] if power_limit == "jit" else []
    measured: dict[float, float] = {}  # power limit -> measured cost per epoch
    chosen_W = max_W
    if cached is not None:
        to_profile, chosen_W = [], float(cached["best_W"])
    progress, stopped, step = 0.0, False, 0
    epoch_index = -1
    reached = target_epoch is not None and target_epoch <= w.max_epochs

    def run_slice(limit_W: float, epochs: float) -> bool:
        nonlocal progress, step
        if backend.power_limit_W(0) != limit_W:
            backend.set_power_limit_W(0, limit_W)
        session.step_start(step)
        dt_s = epochs * traces.time_per_epoch_s_at(curve, limit_W)
        # The sensor keeps only 2.4 s of samples: drain once early in the slice, so the first
        # sample after a limit change (which averages old and new power) is never lost.
        first_s = min(dt_s / 2, 2 * backend.sample_period_s)
        clock.advance(first_s)
        sampler.poll_once(read_counter=False)
        clock.advance(dt_s - first_s)
        sampler.poll_once(read_counter=False)
        decision = session.step_end(step)
        step += 1
        progress += epochs
        return decision.stop_training

    while not stopped and progress < w.max_epochs - 1e-9:
        # Next epoch boundary: profile slices first, then regular slices at the chosen limit.
        if int(progress + 1e-9) != epoch_index:
            epoch_index = int(progress + 1e-9)
            session.epoch_start(epoch_index)
        profiling = bool(to_profile)
        if profiling:
            limit_W, epochs = to_profile.pop(0), profile_epochs
            before = session.totals()
        else:
            limit_W, epochs = chosen_W, 1.0 / steps_per_epoch
        boundary = epoch_index + 1
        epochs = min(epochs, boundary - progress)
        stopped = run_slice(limit_W, epochs)
        if profiling:
            after = session.totals()
            measured[limit_W] = (
                cost(
                    after[metric.TOTAL_ENERGY_J] - before[metric.TOTAL_ENERGY_J],
                    after[metric.TOTAL_TIME_S] - before[metric.TOTAL_TIME_S],
                )
                / epochs
            )
            if not to_profile:  # every limit measured (trace costs are not unimodal in the limit)
                to_profile = []
                chosen_W = min(measured, key=measured.__getitem__)
                _put_profile(config, profile_key, measured, chosen_W)
        if abs(progress - boundary) < 1e-9:
            progress = float(boundary)
            session.epoch_end(epoch_index)
            done = reached and boundary >= target_epoch  # type: ignore[operator]
            value = w.target_metric if done else w.target_metric + (-1.0 if w.higher_is_better else 1.0)
            stopped = session.evaluate({METRIC: value}).stop_training or stopped
    summary = session.train_end()
    controller = session.batch_size_controller
    assert controller is not None and controller.trial_id is not None
    store = open_store(config["store"]["path"], config["store"]["backend"])
    try:
        trial = store.get_trial(controller.trial_id)
    finally:
        store.close()
    assert trial is not None
    backend.close()
    return Recurrence(
        index=index,
        batch_size=batch_size,
        power_limit_W=chosen_W,
        energy_J=summary.energy_J,
        time_s=summary.time_s,
        cost=float(trial.cost or 0.0),
        converged=trial.converged,
        status=trial.status,
        epochs=progress,
        phase=str(trial.info.get("phase")),
        target_epoch=target_epoch,
    )


def _get_profile(config: dict, key: str) -> dict | None:
    with open_store(config["store"]["path"], config["store"]["backend"]) as store:
        return store.get_profile(key)


def _put_profile(config: dict, key: str, measured: dict[float, float], best_W: float) -> None:
    table = {"limits_W": list(measured), "cost_per_epoch": list(measured.values()), "best_W": best_W}
    with open_store(config["store"]["path"], config["store"]["backend"]) as store:
        store.put_profile(key, table)


def format_recurrences(runs: Sequence[Recurrence]) -> str:
    """The recurrences as a table within 80 columns, then their totals.

    ``result`` is ``converged`` (target reached), ``early_stopped`` or ``not_converged``.
    """
    from zeus_callbacks.cli_format import table

    rows = [
        [r.index, r.batch_size, r.power_limit_W, r.energy_J, r.time_s, r.cost, r.epochs,
         "converged" if r.converged else ("early_stopped" if r.status == "early_stopped" else "not_converged"),
         r.phase]
        for r in runs
    ]  # fmt: skip
    headers = ["rec", "batch", "limit_W", "energy_J", "time_s", "cost", "epochs", "result", "phase"]
    converged = sum(r.converged for r in runs)
    totals = (
        f"{len(runs)} recurrence(s), {converged} converged: energy {sum(r.energy_J for r in runs):.0f} J, "
        f"time {sum(r.time_s for r in runs):.0f} s, cost {sum(r.cost for r in runs):.0f}"
    )
    return table(headers, rows) + "\n" + totals if runs else totals


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m zeus_callbacks.simulate``: a table of the recurrences, or one JSON line each with ``--json``."""
    from zeus_callbacks.cli_format import progress_bar

    parser = argparse.ArgumentParser(prog="zeus_callbacks.simulate", description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="A40", choices=list(traces.GPUS))
    parser.add_argument("--workload", default="cifar100", choices=list(traces.WORKLOADS))
    parser.add_argument("--recurrences", type=int, default=100)
    parser.add_argument("--eta-knob", type=float, default=0.5)
    parser.add_argument("--beta-knob", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps-per-epoch", type=int, default=4)
    parser.add_argument("--power-limit", choices=["max", "jit"], default="max")
    parser.add_argument("--store", default=None, help="store file (default: a temporary one)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line and recurrence, as each ends")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (shown only on a terminal)")
    args = parser.parse_args(argv)

    with progress_bar(args.recurrences, "recurrences", enabled=not (args.json or args.no_progress)) as bar:

        def done(r: Recurrence) -> None:
            if args.json:  # streamed: a long run's first lines are usable before it ends
                print(json.dumps(asdict(r)), flush=True)
            bar.update(1)

        runs = simulate(
            args.gpu,
            args.workload,
            args.recurrences,
            eta_knob=args.eta_knob,
            beta_knob=args.beta_knob,
            seed=args.seed,
            store_path=args.store,
            steps_per_epoch=args.steps_per_epoch,
            power_limit=args.power_limit,
            on_recurrence=done,
        )
    if not args.json:
        print(format_recurrences(runs))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
