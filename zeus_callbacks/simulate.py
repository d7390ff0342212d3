"""Trace-driven simulator of recurring jobs that runs the product's own code.

Each recurrence of a job asks :func:`~zeus_callbacks.optimizers.batch_size.suggest_batch_size`
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

Power limit (``power_limit``): ``"max"`` trains at the maximum limit; ``"jit"`` turns on the
session's own just-in-time profiler (``power_limit.enabled``, see
:mod:`zeus_callbacks.optimizers.power_limit`): its warm-up, golden-section search over the
25 W grid and per-limit windows run during the simulated steps, the session applies each
limit through the virtual GPU's setter, and the virtual GPU's power and the step's time
follow the limit in force. While the profiler runs, a simulated step is one *real* training
step (:func:`real_steps_per_epoch` of them per epoch), so profiling costs what it costs a real
job, and that cost counts in the run's energy, time and bandit cost like any other step;
once it has chosen, steps are coarse again. Like a framework integration, the simulator tells the
profiler the job's length through ``train_start(job_steps=...)``: ``max_epochs`` × the real steps
of an epoch, what Lightning's ``estimated_stepping_batches`` gives a fit of ``max_epochs`` (a run
that reaches its target stops sooner). The profiler's objective is the bandit's cost
(``zeus_cost`` with the same ``eta_knob``), and its profiles live in the store
(``power_limit.cache_in: store``), keyed as the profiler keys them (job, GPU model, batch
size, world size, objective): a later recurrence at the same batch size applies the cached
limit after its first step, without profiling.

Command line (a table; ``--json`` for one JSON line per recurrence)::

    python -m zeus_callbacks.simulate --gpu A40 --workload cifar100 --recurrences 100 --seed 0
    zeus-callbacks simulate --trace my_gpu.csv --train-trace my_runs.csv --power-limit jit
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

from zeus_callbacks.backends import traces
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.optimizers.batch_size import suggest_batch_size
from zeus_callbacks.optimizers.cost import ZeusCost
from zeus_callbacks.session import EnergySession
from zeus_callbacks.store import is_url, open_configured_store

logger = logging.getLogger(__name__)

METRIC = "target"
"""Name of the validation metric the simulator reports."""

SENSOR_TIMEOUT_S = 60.0
"""``sampling.sensor_timeout_s`` of the simulator's sessions (s; the most the setting allows).

A read of the virtual sensor never hangs: it only computes, and under heavy CPU load that can take
longer than the default 0.5 s meant for a real sensor. Cut short, it would mark the run degraded
for a fault no GPU had; a simulated run waits for it instead.
"""


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
        profiling_steps: Steps the power-limit profiler spent warming up and profiling (0:
            none, e.g. a cache hit or ``power_limit="max"``).
        power_limit_source: ``profile`` (the profiler chose), ``cache`` (a stored profile was
            applied), ``abandoned`` (no choice; trained at the maximum) or ``max``.
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
    profiling_steps: int = 0
    power_limit_source: str = "max"


def training_paths(gpu: traces.TraceLike, workload: traces.WorkloadLike, batch_size: int) -> list[int | None]:
    """``target_epoch`` of every traced run of ``workload`` at ``batch_size`` (None: never reached).

    Args:
        gpu: A bundled GPU's name or a user :class:`~zeus_callbacks.backends.traces.GPUTrace`.
        workload: The workload's name or :class:`~zeus_callbacks.backends.traces.Workload`.
        batch_size: The batch size.

    Raises:
        ValueError: Unknown GPU or workload.
    """
    trace = traces.resolve_trace(gpu)
    w = traces.get_workload(workload, trace)
    return [
        p.target_epoch
        for p in trace.train
        if (p.dataset, p.network, p.optimizer, p.batch_size) == (w.dataset, w.network, w.optimizer, batch_size)
        and math.isclose(p.target_metric, w.target_metric)
    ]


def check_training_paths(gpu: traces.TraceLike, workload: traces.WorkloadLike, batch_sizes: Sequence[int]) -> None:
    """Check that a user trace's training paths can drive every arm of ``workload``.

    A bundled trace always can. A user trace needs, for the workload's target (the highest
    ``target_metric`` in its training-path file), at least one run that reaches it and at least
    one run at every batch size in ``batch_sizes``: without them the simulator would invent an
    epoch budget or make an arm never converge, figures no trace holds.

    Raises:
        ValueError: Unknown GPU or workload, or training paths missing as above (the message
            names the trace, the workload and the batch sizes).
    """
    trace = traces.resolve_trace(gpu)
    w = traces.get_workload(workload, trace)
    if trace.bundled:
        return
    hint = "(Zeus summary_train format; train_path / --train-trace, docs/backends.md)"
    if not any((p.dataset, p.network, p.optimizer) == (w.dataset, w.network, w.optimizer) for p in trace.train):
        raise ValueError(
            f"the trace {trace.source} has no training paths for {w.dataset}: the simulator samples when a run "
            f"reaches its target from a training-path CSV {hint}"
        )
    reached = [
        p
        for p in trace.train
        if (p.dataset, p.network, p.optimizer) == (w.dataset, w.network, w.optimizer)
        and math.isclose(p.target_metric, w.target_metric)
        and p.target_epoch is not None
    ]
    if not reached:
        raise ValueError(
            f"no training path of {w.dataset} in the trace {trace.source} reaches its target "
            f"{w.target_metric:g} (every target_epoch is empty): the simulator has no epoch budget {hint}"
        )
    missing = [bs for bs in batch_sizes if not training_paths(trace, w, bs)]
    if missing:
        raise ValueError(
            f"the trace {trace.source} has no training paths of {w.dataset} at target {w.target_metric:g} for "
            f"batch size(s) {', '.join(map(str, missing))}: every batch size the simulator tries needs one {hint}"
        )


def epoch_cost(curve: traces.PowerCurve, power_limit_W: float, cost: ZeusCost) -> float:
    """ZeusCost of one epoch at ``power_limit_W`` from the trace (J-equivalent)."""
    return cost(traces.epoch_energy_J_at(curve, power_limit_W), traces.time_per_epoch_s_at(curve, power_limit_W))


def best_power_limit_W(curve: traces.PowerCurve, cost: ZeusCost) -> float:
    """The traced power limit with the lowest cost per epoch (W)."""
    return float(min(curve.power_limit_W, key=lambda p: (epoch_cost(curve, float(p), cost), -p)))


REAL_STEP_S = 0.25
"""Nominal time of one real training step at the maximum limit (s): a modelling assumption.

The Zeus traces give time per epoch, not per step; as in ``benchmarks/power_limit_search.py``
an epoch is split into steps of about this length, 20 to 2000 of them (CIFAR-100 at batch
size 1024 really has 49 steps per epoch; ImageNet at 256, 5005).
"""


def real_steps_per_epoch(curve: traces.PowerCurve) -> int:
    """Real training steps in one epoch of ``curve``: its time per epoch at the maximum limit over ~0.25 s."""
    epoch_s = traces.time_per_epoch_s_at(curve, curve.max_limit_W)
    return int(np.clip(round(epoch_s / REAL_STEP_S), 20, 2000))


def simulate(
    gpu: traces.TraceLike,
    workload: str,
    recurrences: int,
    *,
    eta_knob: float = 0.5,
    beta_knob: float | None = 2.0,
    seed: int = 0,
    store_path: str | Path | None = None,
    steps_per_epoch: int = 4,
    power_limit: Literal["max", "jit"] = "max",
    pruning_rounds: int = 1,
    batch_sizes: Sequence[int] | None = None,
    bandit: dict | None = None,
    profiler: dict | None = None,
    on_recurrence: Callable[[Recurrence], None] | None = None,
    tell_job_steps: bool = True,
) -> list[Recurrence]:
    """Replay ``recurrences`` recurrences of one workload through the real session, bandit and store.

    Args:
        gpu: ``"V100"`` or ``"A40"``, or a user trace with training paths
            (:func:`~zeus_callbacks.backends.traces.read_trace` with ``train_path``).
        workload: Zeus workload (``cifar100``, ``imagenet``, ``librispeech``, ``movielens-1m``,
            ``sentiment140``, ``squad``), or one of the user trace's.
        recurrences: How many recurrences to run.
        eta_knob: Energy weight of the cost (the bandit's and, with ``"jit"``, the profiler's).
        beta_knob: Early-stopping factor (None: off).
        seed: Seeds the bandit and the sampling of training paths.
        store_path: Store file or database URL (``postgresql://…``, see
            :func:`~zeus_callbacks.store.open_store`), kept so a later call continues the job;
            default a temporary SQLite file.
        steps_per_epoch: Simulated steps per epoch outside profiling (early stopping granularity).
        power_limit: ``"max"`` or ``"jit"`` (see the module docstring).
        pruning_rounds: Pruning rounds of the bandit.
        batch_sizes: Arms; default every batch size of the workload in the GPU's trace.
        bandit: Further ``batch_size`` settings (e.g. ``{"noise_floor_rel": 0.1}``).
        profiler: With ``"jit"``: further ``power_limit`` settings (e.g. ``{"search": "sweep"}``).
        on_recurrence: Called with each :class:`Recurrence` as soon as it ends (progress, streaming).
        tell_job_steps: Pass the job's length in real steps to ``train_start(job_steps=...)``, as an
            integration does (see the module docstring); False: the profiler is not told.

    Returns:
        One :class:`Recurrence` per recurrence, in order.

    Raises:
        ValueError: Unknown GPU or workload, a user trace whose training paths cannot drive
            every arm (:func:`check_training_paths`), or bad arguments.
    """
    if steps_per_epoch < 1 or recurrences < 0:
        raise ValueError("steps_per_epoch must be ≥ 1 and recurrences ≥ 0")
    if power_limit not in ("max", "jit"):
        raise ValueError(f"power_limit must be 'max' or 'jit', got {power_limit!r}")
    trace = traces.resolve_trace(gpu)
    w = traces.get_workload(workload, trace)
    sizes = list(batch_sizes or traces.available_batch_sizes(trace, w))
    check_training_paths(trace, w, sizes)
    default = traces.default_batch_size(trace, w)
    world = np.random.default_rng([int(seed), 0x5EED])
    with tempfile.TemporaryDirectory(prefix="zeus-sim-") as tmp:
        if store_path is not None and is_url(store_path):
            store: dict[str, str] = {"url": str(store_path)}
        else:
            path = Path(store_path) if store_path is not None else Path(tmp) / "store.sqlite"
            store = {"backend": "json" if path.suffix == ".json" else "sqlite", "path": str(path)}
        config = {
            "job_id": f"sim/{trace.gpu}/{w.dataset}",
            "backend": "virtual",
            "logging": {"jsonl": False, "log_dir": tmp, "interval_steps": max(steps_per_epoch, 1)},
            "windows": {"step": False, "eval": False},
            "sampling": {"sensor_timeout_s": SENSOR_TIMEOUT_S},
            "store": store,
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
            "power_limit": {
                "enabled": power_limit == "jit",
                # The bandit's cost: the profiler minimises what the bandit is charged.
                "objective": "zeus_cost",
                "eta_knob": eta_knob,
                "cache": True,
                "cache_in": "store",
                "plot": False,
                **(profiler or {}),
            },
        }
        out = []
        for index in range(recurrences):
            out.append(_one_recurrence(index, trace, w, config, world, steps_per_epoch, tell_job_steps))
            if on_recurrence is not None:
                on_recurrence(out[-1])
        return out


def _one_recurrence(
    index: int,
    trace: traces.GPUTrace,
    w: traces.Workload,
    config: dict,
    world: np.random.Generator,
    steps_per_epoch: int,
    tell_job_steps: bool,
) -> Recurrence:
    batch_size = suggest_batch_size(config)
    paths = training_paths(trace, w, batch_size)
    target_epoch = paths[int(world.integers(len(paths)))] if paths else None
    curve = traces.power_curve(trace, w, batch_size)
    max_W = curve.max_limit_W
    epoch_max_s = traces.time_per_epoch_s_at(curve, max_W)
    real_steps = real_steps_per_epoch(curve)
    real_step = 1.0 / real_steps  # epochs per real (profiling) step
    coarse_step = 1.0 / steps_per_epoch
    profiling = bool(config["power_limit"]["enabled"])
    clock = ManualClock(0.0)
    backend = VirtualGPUBackend(
        trace=trace,
        workload=w,
        batch_size=batch_size,
        clock=clock,
        noise_W=0.0,
        read_only=False,  # the simulator changes limits on its own virtual GPU, whatever the environment says
        # A few samples per simulated step (real steps included): exact, and fast.
        sample_period_s=min(1.0, epoch_max_s * (min(coarse_step, real_step) if profiling else coarse_step) / 4),
    )
    session = EnergySession(config, backend=backend, is_main_process=True)
    session.suggest_batch_size(batch_size)  # claims the suggestion made above
    # The fit's length in real steps, as an integration would pass it (max_epochs × steps an epoch).
    job_steps = w.max_epochs * real_steps if tell_job_steps else None
    session.train_start(run_name=f"recurrence-{index}", job_steps=job_steps)
    sampler = session.sampler
    assert sampler is not None
    limiter = session.power_limiter  # None with power_limit "max"
    assert (limiter is not None) == profiling

    # Each simulated step is a slice of an epoch; `progress` counts epochs done.
    progress, stopped, step = 0.0, False, 0
    epoch_index = -1
    reached = target_epoch is not None and target_epoch <= w.max_epochs

    def run_step(epochs: float) -> bool:
        nonlocal progress, step
        session.step_start(step)  # the profiler applies the limit this step runs at
        dt_s = epochs * traces.time_per_epoch_s_at(curve, backend.power_limit_W(0))
        # The sensor keeps only 2.4 s of samples: drain once early in the step, so the first
        # sample after a limit change (which averages old and new power) is never lost.
        first_s = min(dt_s / 2, 2 * backend.sample_period_s)
        clock.advance(first_s)
        sampler.poll_once(read_counter=False)
        clock.advance(dt_s - first_s)
        sampler.poll_once(read_counter=False)
        decision = session.step_end(step, num_samples=batch_size)  # the batch size keys the profile cache
        step += 1
        progress += epochs
        return decision.stop_training

    while not stopped and progress < w.max_epochs - 1e-9:
        if int(progress + 1e-9) != epoch_index:
            epoch_index = int(progress + 1e-9)
            session.epoch_start(epoch_index)
        # Real steps until the profiler has chosen (or applied a cached choice), coarse ones after.
        size = real_step if limiter is not None and limiter.result is None else coarse_step
        boundary = epoch_index + 1
        left = boundary - progress
        stopped = run_step(left if left <= size + 1e-9 else size)
        if abs(progress - boundary) < 1e-9:
            progress = float(boundary)
            session.epoch_end(epoch_index)
            done = reached and boundary >= target_epoch  # type: ignore[operator]
            value = w.target_metric if done else w.target_metric + (-1.0 if w.higher_is_better else 1.0)
            stopped = session.evaluate({METRIC: value}).stop_training or stopped
    summary = session.train_end()
    controller = session.batch_size_controller
    assert controller is not None and controller.trial_id is not None
    store = open_configured_store(session.config.store, session.config.logging.log_dir, read_only=True)
    try:
        trial = store.get_trial(controller.trial_id)
    finally:
        store.close()
    assert trial is not None
    backend.close()
    result = limiter.result if limiter is not None else None
    chosen_W = result.chosen_limit_W if result is not None else None
    return Recurrence(
        index=index,
        batch_size=batch_size,
        power_limit_W=float(chosen_W) if chosen_W is not None else max_W,
        energy_J=summary.energy_J,
        time_s=summary.time_s,
        cost=float(trial.cost or 0.0),
        converged=trial.converged,
        status=trial.status,
        epochs=progress,
        phase=str(trial.info.get("phase")),
        target_epoch=target_epoch,
        profiling_steps=result.profiling_steps if result is not None else 0,
        power_limit_source=result.source if result is not None else "max",
    )


def format_recurrences(runs: Sequence[Recurrence]) -> str:
    """The recurrences as a table within 80 columns, then their totals.

    ``result`` is ``converged`` (target reached), ``early_stopped`` or ``not_converged``.
    """
    from zeus_callbacks._terminal import table

    rows = [
        [r.index, r.batch_size, r.power_limit_W, r.energy_J, r.time_s, r.cost, r.epochs,
         "converged" if r.converged else ("early_stopped" if r.status == "early_stopped" else "not_converged"),
         r.phase]
        for r in runs
    ]  # fmt: skip
    headers = ["rec", "batch", "limit_W", "energy_J", "time_s", "cost", "epochs", "result", "phase"]
    if not runs:  # a sum over nothing would read as 0 J measured
        return "0 recurrences ran: energy, time and cost are null (nothing was simulated)"
    converged = sum(r.converged for r in runs)
    totals = (
        f"{len(runs)} recurrence(s), {converged} converged: energy {sum(r.energy_J for r in runs):.0f} J, "
        f"time {sum(r.time_s for r in runs):.0f} s, cost {sum(r.cost for r in runs):.0f}"
    )
    return table(headers, rows) + "\n" + totals


def main(argv: Sequence[str] | None = None, prog: str = "zeus_callbacks.simulate") -> int:
    """``python -m zeus_callbacks.simulate``: a table of the recurrences, or one JSON line each with ``--json``.

    ``argv`` defaults to the command line's; ``prog`` names the command in usage and error messages.
    """
    from zeus_callbacks._argtypes import float_in, int_at_least
    from zeus_callbacks._terminal import progress_bar

    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gpu", default=None, help=f"bundled trace: {', '.join(traces.GPUS)} (default A40); with --trace, any name"
    )
    parser.add_argument(
        "--workload", default=None, help=f"{', '.join(traces.WORKLOADS)} (default cifar100); with --trace, one of its"
    )
    parser.add_argument(
        "--trace", type=Path, default=None, help="your own power-limit sweep (Zeus summary_power CSV; docs/backends.md)"
    )
    parser.add_argument(
        "--train-trace", type=Path, default=None, help="training paths for --trace (Zeus summary_train CSV)"
    )
    parser.add_argument(
        "--recurrences", type=int_at_least(1), default=100, help="recurrences to run, ≥ 1 (default 100)"
    )
    parser.add_argument("--eta-knob", type=float_in(0, 1), default=0.5, help="energy weight of the cost, in [0, 1]")
    parser.add_argument(
        "--beta-knob", type=float_in(1, low_open=True), default=2.0, help="early-stop threshold (x best cost), > 1"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps-per-epoch", type=int_at_least(1), default=4)
    parser.add_argument("--power-limit", choices=["max", "jit"], default="max")
    parser.add_argument("--store", default=None, help="store file or database URL (default: a temporary file)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line and recurrence, as each ends")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (shown only on a terminal)")
    args = parser.parse_args(argv)
    try:
        if args.trace is not None:
            gpu: traces.TraceLike = traces.read_trace(args.trace, train_path=args.train_trace, gpu=args.gpu)
            workload = args.workload or traces.available_workloads(gpu)[0]
        else:
            if args.train_trace is not None:
                parser.error("--train-trace needs --trace")
            gpu = traces.bundled_trace(args.gpu or "A40")
            workload = args.workload or "cifar100"
        w = traces.get_workload(workload, gpu)
        check_training_paths(gpu, w, traces.available_batch_sizes(gpu, w))
    except ValueError as exc:  # TraceFormatError included: the message names the file and the column
        parser.error(str(exc))

    with progress_bar(args.recurrences, "recurrences", enabled=not (args.json or args.no_progress)) as bar:

        def done(r: Recurrence) -> None:
            if args.json:  # streamed: a long run's first lines are usable before it ends
                print(json.dumps(asdict(r)), flush=True)
            bar.update(1)

        runs = simulate(
            gpu,
            workload,
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
