"""EnergySession: the framework-free controller every adapter talks to.

Adapters (the Lightning and Hugging Face callbacks, the simulator) translate their
hooks into the plain events below and act on the :class:`Decision` they get back.
Everything hardware-facing sits underneath, in the started run's parts
(:class:`~zeus_callbacks.session.run.StartedRun`): a backend, a background
:class:`~zeus_callbacks.measurement.sampler.PowerSampler`, and a
:class:`~zeus_callbacks.measurement.windows.WindowMeter` whose boundaries cost one
clock read (or one CUDA event record) on the training thread.

Event order::

    train_start → (epoch_start → (step_start → step_end)* → [eval_start → eval_end → evaluate]
                   → epoch_end)* → train_end          (exception() at any point)

The per-step calls (``step_start``, ``step_end``, the phase calls) are the
:class:`~zeus_callbacks.session.scheduler.StepScheduler`'s; the session's own events
delegate to the run, the records (:mod:`~zeus_callbacks.session.records`), the rank
exchanges (:mod:`~zeus_callbacks.session.aggregate`, :mod:`~zeus_callbacks.session.agreement`)
and the cleanup registry (:mod:`~zeus_callbacks.lifecycle`).

Where the optimisers plug in: the power-limit profiler (Zeus, NSDI '23 §4.3) acts at
``step_start``/``step_end`` boundaries and the batch-size bandit (§4.2) at
``train_start``/``evaluate``/``train_end``; both answer through :class:`Decision`.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from zeus_callbacks import reporting as metric
from zeus_callbacks.backends import BackendError, GPUBackend, get_backend
from zeus_callbacks.config import ZeusConfig, parse_config
from zeus_callbacks.distributed import RankGroup, launcher_env_int, launcher_world_size
from zeus_callbacks.errors import UnsafeFile
from zeus_callbacks.lifecycle import CLEANUPS, CleanupOrder, Registration
from zeus_callbacks.measurement.overhead import WindowSampling
from zeus_callbacks.measurement.phases import PHASES
from zeus_callbacks.measurement.sampler import PowerSampler
from zeus_callbacks.measurement.windows import BoundaryTimer, WindowBatch, WindowMeter, WindowRecord
from zeus_callbacks.optimizers import power_limit as pl
from zeus_callbacks.optimizers.batch_size import BatchSizeController, EarlyStopRule, claim_pending, run_store
from zeus_callbacks.reporting import RunSummary
from zeus_callbacks.session import agreement, records
from zeus_callbacks.session.aggregate import RankAggregator, slowest, total
from zeus_callbacks.session.run import StartedRun, default_gpu_indices, make_timer, open_run, select_gpu_indices
from zeus_callbacks.session.scheduler import CONTINUE, Decision, StepScheduler
from zeus_callbacks.session.state import Totals, carried_totals, resume_state
from zeus_callbacks.store.profile_cache import StoreProfileCache

__all__ = ["Decision", "EnergySession", "default_gpu_indices"]

logger = logging.getLogger(__name__)

_BULK_WINDOWS = frozenset(("step", *PHASES))  # attributed and aggregated as arrays at each report
_EPOCH_PREFIXES = ("energy/epoch", "time/epoch", "power/epoch")


def _is_main_process() -> bool:
    return launcher_env_int("RANK", 0) == 0


def measurement_of(backend: GPUBackend) -> tuple[str, str | None]:
    """``("measured" | "simulated" | "unavailable", note)``: what the backend's energy figures are.

    The note names the cause and the fix when measurement is unavailable (None otherwise).
    """
    if not backend.measurable:
        cause, fix = getattr(backend, "cause", "the GPU cannot be measured"), getattr(backend, "fix", None)
        return "unavailable", f"{cause}. Fix: {fix}" if fix else str(cause)
    return ("simulated" if backend.simulated else "measured"), None


class EnergySession(StepScheduler):
    """Measure GPU energy of a training run and report it as metrics.

    Args:
        config: A :class:`~zeus_callbacks.config.ZeusConfig`, a mapping of settings, or
            None for the defaults.
        backend: An open backend to use (the caller keeps ownership); default: the one
            ``config.backend`` names, opened at :meth:`train_start` and closed at the end.
        is_main_process: Whether this process writes the JSONL log; default: ``RANK`` is 0.
        device_index: The one GPU this process trains on, as the framework knows it (its
            local rank or CUDA device index); default: :func:`default_gpu_indices`. An
            explicit ``gpu_indices`` in the config wins over both.

    Raises:
        ConfigError: ``config`` is invalid.

    Example:
        >>> session = EnergySession({"backend": "virtual"})
        >>> session.train_start()
        >>> session.epoch_start(0); session.step_start(0); session.step_end(0, num_samples=32)
        Decision(stop_training=False, reason=None)
        >>> summary = session.train_end()  # doctest: +SKIP
    """

    def __init__(
        self,
        config: ZeusConfig | Mapping[str, Any] | None = None,
        *,
        backend: GPUBackend | None = None,
        is_main_process: bool | None = None,
        device_index: int | None = None,
    ) -> None:
        super().__init__()
        self.config = parse_config(dict(config) if isinstance(config, Mapping) else config)
        self._given_backend = backend
        self.backend: GPUBackend | None = backend
        self.is_main_process = _is_main_process() if is_main_process is None else is_main_process
        self._device_index = device_index
        self._run: StartedRun | None = None  # the started run's parts (the last run's, once ended)
        self.power_limit_W: float | None = None
        self._carried = Totals()
        self._carried_power_limit: dict[str, Any] | None = None  # a checkpoint's profile so far
        self._pending_metrics: dict[str, float] = {}
        self._unreported_steps: list[WindowBatch] = []  # step windows attributed since the last step metrics
        self._unreported_warmup: list[WindowBatch] = []  # warm-up step windows attributed since then
        self._steps_logged_upto = 0  # steps (run_step order) the "steps" records stood for so far
        self._last_eval_metrics: dict[str, float] = {}
        self._started = False
        self._finished: RunSummary | None = None
        self._status = "completed"
        self._exception_record: dict[str, Any] | None = None
        self._rank_group = RankGroup()
        self._ranks = RankAggregator(self._rank_group)
        self._run_record: WindowRecord | None = None
        self._ranks_totals: tuple[float, float] | None = None  # several processes: (J, s) of all ranks
        self._cleanup: Registration | None = None  # SIGTERM / exit: end the run (and restore limits) first
        self.power_limiter: pl.PowerLimitController | None = None
        self._chosen_power_limit: tuple[float, int, bool] | None = None  # (W, from step, applied)
        self._power_limit_agreement = False  # DDP: exchange the limit at each step start
        self._power_limit_follower = False  # DDP, not the main rank: apply the main rank's limits
        # Batch-size bandit (Zeus §4.2-4.4): only the main process talks to the store, opened once per run.
        self.run_store = run_store(self.config)  # shared by the bandit and the profile cache; closed at train end
        self.batch_size_controller = (
            BatchSizeController(self.config, self.run_store)
            if self.config.batch_size.enabled and self.is_main_process else None
        )
        self._stop_reason: str | None = None
        self._followed_batch_size: int | None = None  # not the main process: the main's suggestion
        self._stops = agreement.StopAgreement()  # several processes, bandit on: stop decisions are exchanged
        self._epoch_sampled = (0, 0)  # (steps, measured steps) of the last ended epoch
        self._phase_summary_s = 0.0  # the last epoch's phase superposition (s)
        self._refresh_step_decision()

    # ------------------------------------------------------------------ the run's parts
    @property
    def run(self) -> StartedRun:
        """The started run's parts (the last run's once it ended).

        Raises:
            RuntimeError: No run has started.
        """
        if self._run is None:
            raise RuntimeError("no run has started (call train_start() first)")
        return self._run

    @property
    def sampler(self) -> PowerSampler | None:
        """The run's power sampler (None before :meth:`train_start`)."""
        return self._run.sampler if self._run is not None else None

    @property
    def meter(self) -> WindowMeter | None:
        """The run's window meter (None before :meth:`train_start`)."""
        return self._run.meter if self._run is not None else None

    @property
    def gpu_indices(self) -> list[int]:
        """The GPUs this process measures (empty before :meth:`train_start`)."""
        return self._run.gpu_indices if self._run is not None else []

    @property
    def run_name(self) -> str | None:
        """The run's name (None before :meth:`train_start`)."""
        return self._run.run_name if self._run is not None else None

    @property
    def sensor_delay_s(self) -> float:
        """How far the power samples lag the power they show (s; 0 before :meth:`train_start`)."""
        return self._run.sensor_delay_s if self._run is not None else 0.0

    @property
    def ranks(self) -> RankGroup:
        """The process group (detected at :meth:`train_start`)."""
        return self._rank_group

    @property
    def stop_rule(self) -> EarlyStopRule | None:
        """The early-stop rule in force (the main rank's, on every rank under several processes)."""
        return self._stops.rule

    @property
    def steps_this_run(self) -> int:
        """Steps since :meth:`train_start` (quiet steps counted ahead included; alike on every rank)."""
        return self._totals.steps - self._carried.steps

    @property
    def last_epoch_sampling(self) -> tuple[int, int]:
        """(steps, measured steps) of the last ended epoch (``windows.sample_fraction``)."""
        return self._epoch_sampled

    def _write(self, record: dict[str, Any]) -> None:
        self.run.log.write(record)

    # ------------------------------------------------------------------ lifecycle
    @property
    def started(self) -> bool:
        """True between :meth:`train_start` and :meth:`train_end`."""
        return self._started and self._finished is None

    def train_start(self, *, run_name: str | None = None) -> None:
        """Open the backend, start sampling and open the run window.

        Args:
            run_name: Name of the run's JSONL file; default ``config.logging.run_name``
                or a timestamp.

        Raises:
            BackendUnavailable: ``config.backend`` names a backend that cannot be used.
            OSError: The JSONL log directory is not writable (raised before training).
        """
        if self.started:
            return
        cfg = self.config
        self._finished = None
        self._status = "completed"
        self._chosen_power_limit = None
        self._totals = self._carried.copy()
        self._steps_logged_upto = self._carried.steps
        backend = self.open_backend()
        gpu_indices = select_gpu_indices(cfg, backend, self._device_index)
        self._rank_group = RankGroup.detect()
        self._ranks = RankAggregator(self._rank_group)
        self._ranks_totals = None
        name = run_name or cfg.logging.run_name or _dt.datetime.now().strftime("run-%Y%m%d-%H%M%S")
        run = open_run(
            cfg, backend, gpu_indices, name,
            write_log=self.is_main_process and cfg.logging.jsonl, make_timer=self._make_timer,
        )  # fmt: skip
        self._run = run
        self._restore_leftover_power_limits()
        self.power_limit_W = run.read_power_limit_W()
        run.start()
        self._started = True
        fraction = cfg.windows.sample_fraction
        sampling = WindowSampling(
            None if fraction == "auto" else fraction,
            cfg.windows.max_overhead,
            cfg.logging.interval_steps,
            stretch_reports=not self.ranks.is_distributed,  # reports are collectives under several processes
            announce=cfg.windows.step,  # no step windows: no step energy whose cadence to announce
        )
        self._begin_steps(
            run.meter, run.timer, backend.clock, sampling,
            step_windows=cfg.windows.step, phase_windows=run.phases is not None,
            warmup_steps=cfg.windows.warmup_steps,
        )  # fmt: skip
        self._active = True
        # A scheduler's kill skips atexit: end the run (and restore limits) first.
        self._cleanup = CLEANUPS.register(
            self._end_interrupted, what="ending the energy log", order=CleanupOrder.END_RUN, at_exit=True
        )
        measurement, note = measurement_of(backend)
        self._write(
            records.run_start_record(
                run_name=run.run_name, config=cfg, backend=backend.describe(), gpu_indices=run.gpu_indices,
                power_limit_W=self.power_limit_W, read_only=backend.read_only,
                resumed_energy_J=self._carried.energy_J, wall_time=run.start_wall,
                measurement=measurement, measurement_note=note,
            )
        )  # fmt: skip
        # Optimiser hook: the batch-size bandit and power-limit cache are consulted here.
        self._start_power_limiter()
        if cfg.batch_size.enabled:
            self._start_batch_size()

    def _end_interrupted(self) -> None:
        self.train_end(status="interrupted")

    def _make_timer(self, backend: GPUBackend) -> BoundaryTimer:
        """The run's boundary timer (a seam: tests and benchmarks time with a stand-in for CUDA)."""
        return make_timer(backend)

    def open_backend(self) -> GPUBackend:
        """Open the configured backend now (adapters call it at setup, to fail before training).

        Raises:
            BackendUnavailable: The configured backend cannot be used here.
        """
        if self.backend is None:
            self.backend = get_backend(self.config.backend, virtual=self.config.virtual)
        return self.backend

    def epoch_start(self, epoch: int) -> None:
        """Open the epoch window (and re-anchor CUDA event timing once).

        The epoch's first step window, when that step is measured, opens at the same mark:
        the epoch's first batch fetch belongs to its first step.
        """
        if not self.started:
            return
        self._begin_epoch()
        token = None
        if self.config.windows.epoch:
            token = self.run.meter.mark()
            self.run.meter.begin_at("epoch", token, {"epoch": epoch})
        self._open_step_at_boundary(token)

    def eval_start(self) -> None:
        """Open the evaluation window; a step window opened ahead at the last step's end is dropped.

        The evaluation is no part of any step: the next step's window opens at :meth:`eval_end`.
        """
        self._take_back_quiet_steps()
        if not self.started:
            return
        run = self.run
        self._pause_timing()
        if not self._measuring:  # the window would otherwise hold the whole evaluation
            self._close_open_step()
        if self.power_limiter is not None:
            self.power_limiter.on_eval_start(run.backend.clock.now_s())
        if self.config.windows.eval:
            run.meter.begin("eval", step=self._totals.steps)

    def eval_end(self, *, report: bool = False) -> dict[str, float]:
        """Close the evaluation window; its energy is reported once attributed.

        Args:
            report: Attribute the evaluation now (waits ≤ 0.25 s for the sensor, like
                :meth:`epoch_end`) and return its metrics instead of queueing them, so that
                they are logged at the evaluation's own step. Steps attributed on the way stay
                queued for the next :meth:`pop_metrics`.

        Returns:
            With ``report``: ``energy/eval_J`` (J) and ``time/eval_s`` (s), when the window
            is measured (``windows.eval``); otherwise empty.
        """
        if not self.started:
            return {}
        run = self.run
        token = None
        if self.config.windows.eval and run.meter.is_open("eval"):
            token = run.meter.mark()
            run.meter.end_at("eval", token)
            # Attribute the evaluation now (a wait for the sensor, not work: outside the steps' time),
            # so that adapters log its energy at the evaluation's step, before the next training step.
            run.flush_sensor(run.backend.clock.now_s(), read_counter=False)  # samples only: no 3-5 ms counter read
            self._attribute_closed()
        if self.power_limiter is not None:
            self.power_limiter.on_eval_end(run.backend.clock.now_s())
        if not self._measuring:
            self._open_step_at_boundary(token)  # the next step's window begins where the evaluation ends
        self._resume_timing()
        if not report or not self.config.windows.eval:
            return {}
        run.flush_sensor(run.backend.clock.now_s())
        self._report_steps(resolve_final=True)
        keys = (metric.EVAL_ENERGY_J, metric.EVAL_TIME_S)
        return {key: self._pending_metrics.pop(key) for key in keys if key in self._pending_metrics}

    def evaluate(self, metrics: Mapping[str, Any]) -> Decision:
        """Record validation metrics (numbers only); the batch-size target is checked here.

        Args:
            metrics: Metric name → value, as the framework reports them.

        Returns:
            Whether to stop training.
        """
        numeric = {}
        for key, value in metrics.items():
            if metric.is_own_metric(str(key)):
                continue
            try:
                numeric[str(key)] = float(value)
            except (TypeError, ValueError):
                continue
        self._last_eval_metrics = numeric
        self._take_back_quiet_steps()
        if self.started:
            self._write(records.evaluate_record(self._totals.steps, numeric))
            target_reason = None
            if self.batch_size_controller is not None and self._stop_reason is None:
                target_reason = self.batch_size_controller.observe(numeric)
            if self._stops.active:  # several processes: every rank exchanges here
                self._agree_stop(target_reason)
                return self._decision()
            self._stop_reason = self._stop_reason or target_reason
            self._refresh_step_decision()
        return self._decide()

    def epoch_end(self, epoch: int) -> dict[str, float]:
        """Close the epoch window and attribute its energy (waits ≤ 0.25 s for the sensor).

        Under DDP every rank must call it (it aggregates across ranks).

        Returns:
            The epoch metrics (also queued for :meth:`pop_metrics`).
        """
        if not self.started:
            return {}
        run = self.run
        self._take_back_quiet_steps()
        self._totals.epochs += 1
        self._pause_timing()
        self._discard_phases()
        self._epoch_sampled = (self._epoch_steps, self._epoch_measured)
        if not run.meter.end("epoch", epoch=epoch):
            self._timed_report()
            return {}
        run.flush_sensor(run.backend.clock.now_s())  # a wait, not work: not charged to the steps
        # Attribute everything now (edges past the samples, if the sensor is late, are
        # extrapolated and marked incomplete): every rank then aggregates this epoch here.
        reported = time.perf_counter()
        self._phase_summary_s = 0.0
        self._report_steps(resolve_final=True)
        # The steps' attribution is charged to them; the once-an-epoch phase summary is not.
        self._governor.report_s += time.perf_counter() - reported - self._phase_summary_s
        return {k: v for k, v in self._pending_metrics.items() if k.startswith(_EPOCH_PREFIXES)}

    def train_end(self, status: str | None = None) -> RunSummary:
        """Close every window, stop sampling, write the summary, release the backend.

        Idempotent: a second call returns the first summary.

        Args:
            status: ``"completed"`` (default), ``"failed"`` or ``"interrupted"``.

        Returns:
            The run summary.
        """
        if self._finished is not None:
            return self._finished
        if not self._started:
            raise RuntimeError("train_end() called before train_start()")
        self._active = False
        self._take_back_quiet_steps()
        run = self.run
        if status is not None:
            self._status = status
        # After a failure other ranks may never reach the same collective: stay local.
        self._ranks.collectives_ok = self._status == "completed"
        # A step cut short is not a step (its energy stays in the run total); an
        # unfinished epoch or evaluation is still measured up to now.
        run.meter.discard("step")
        self._measuring = False
        self._discard_phases()
        self._epoch_sampled = (self._epoch_steps, self._epoch_measured)
        for name in ("eval", "epoch"):
            if run.meter.is_open(name):
                if name == "epoch":  # cut short (max_steps, an interruption): measured, so counted
                    self._totals.epochs += 1
                run.meter.end(name)
        run.meter.end("run")
        try:
            run.flush_sensor(run.backend.clock.now_s())
        finally:
            run.sampler.stop()
            self._stop_power_limiter()
        self._report_steps(resolve_final=True)
        summary = self._summary()
        self._finished = summary
        if self.batch_size_controller is not None and not math.isfinite(summary.energy_J):
            logger.warning("zeus-callbacks: the run's energy is unknown; no batch-size trial is recorded")
        elif self.batch_size_controller is not None:
            try:
                t = self.batch_size_controller.finish(summary.energy_J, summary.time_s, summary.status,
                                                      degraded=summary.degraded)
                if t is not None:
                    self._write(records.trial_record(t))
            except Exception as exc:  # the run is over: a store fault must not hide its summary
                logger.warning("zeus-callbacks: cannot record the batch-size trial (%s)", exc)
        self.run_store.close()
        if self._exception_record is not None:
            self._write(self._exception_record)
        self._write(records.run_end_record(summary))
        if self._cleanup is not None:
            self._cleanup.cancel()
            self._cleanup = None
        run.log.close()
        if self._given_backend is None:
            run.backend.close()
        return summary

    def exception(self, exc: BaseException | None = None, *, interrupted: bool = False) -> RunSummary | None:
        """End the run after a training failure; nothing measured so far is lost.

        Args:
            exc: The exception that ended training, if any (recorded in the log).
            interrupted: The run was stopped (a signal the framework caught), not broken;
                a ``KeyboardInterrupt`` always counts as stopped.

        Returns:
            The run summary (the earlier one if the run had ended already), or None if
            no run had started.
        """
        if not self.started:
            return self._finished
        stopped = interrupted or isinstance(exc, KeyboardInterrupt)  # Ctrl-C: stopped, not broken
        status = "interrupted" if stopped else "failed"
        if exc is not None:
            self._exception_record = records.exception_record(exc)
        return self.train_end(status=status)

    # -------------------------------------------------------------- user windows
    @contextmanager
    def window(self, name: str, **info: Any) -> Iterator[None]:
        """Measure a user-named window; its energy is logged as ``energy/window/<name>_J``.

        Example:
            >>> with session.window("generate"):  # doctest: +SKIP
            ...     model.generate(**inputs)
        """
        if name in ("run", "step", "epoch", "eval", *PHASES):
            raise ValueError(f"window name {name!r} is reserved")
        if not self.started:
            yield
            return
        meter = self.run.meter
        meter.begin(name, **info)
        try:
            yield
        finally:
            meter.end(name)

    # ------------------------------------------------------------------ reporting
    def pop_metrics(self, *, flush_steps: bool = False) -> dict[str, float]:
        """Return and clear the metrics queued for the framework's loggers.

        Args:
            flush_steps: Report the steps since the last report now (HF Trainer calls
                this at each of its own logging events).
        """
        if flush_steps and self.started:
            self._report_steps()
        if not self._pending_metrics:
            return {}  # most steps: nothing queued, nothing to swap
        metrics, self._pending_metrics = self._pending_metrics, {}
        return self._flagged(metrics)

    def _flagged(self, metrics: dict[str, float], *, flag: bool = True) -> dict[str, float]:
        """Metrics as logged: flagged ``energy/simulated`` on the virtual GPU.

        On a GPU that cannot be measured: without any energy or power figure (they are unknown) and
        flagged ``energy/unavailable``. ``flag=False`` (the totals, which adapters log at the step of
        a report that already carries the flag): filtered, not flagged, so a flag has one point per step.
        """
        backend = self.backend
        if backend is not None and not backend.measurable:
            metrics = {k: v for k, v in metrics.items() if not k.startswith(("energy/", "power/"))}
            if flag:
                metrics[metric.UNAVAILABLE] = 1.0
        elif flag and backend is not None and backend.simulated:
            metrics[metric.SIMULATED] = 1.0
        return metrics

    def totals(self) -> dict[str, float]:
        """The run's energy and time so far: ``energy/total_J``, ``time/total_s``.

        Under several processes, during the run: the energy of all GPUs and the slowest
        rank's time as of the last step report (the same on every rank); before the first
        report, this rank's own.
        """
        if self._finished is not None:
            values = {metric.TOTAL_ENERGY_J: self._finished.energy_J, metric.TOTAL_TIME_S: self._finished.time_s}
        elif not self.started:
            return {}
        elif self._ranks_totals is not None:
            energy_J, time_s = self._ranks_totals
            values = {metric.TOTAL_ENERGY_J: energy_J, metric.TOTAL_TIME_S: time_s}
        else:
            values = self._local_totals()
        return self._flagged(values, flag=False)

    def _local_totals(self) -> dict[str, float]:
        return {metric.TOTAL_ENERGY_J: self._run_energy_so_far_J(), metric.TOTAL_TIME_S: self._run_time_so_far_s()}

    def progress_bar_metrics(self) -> dict[str, float]:
        """The short metrics shown on a progress bar (run energy in kJ)."""
        totals = self.totals()
        if metric.TOTAL_ENERGY_J not in totals:
            return {}
        return {metric.PROGRESS_BAR_ENERGY: round(totals[metric.TOTAL_ENERGY_J] / 1e3, 3)}

    @property
    def summary(self) -> RunSummary | None:
        """The run summary once :meth:`train_end` has run."""
        return self._finished

    @property
    def degraded(self) -> bool:
        """True when a sensor fault (here or, under DDP, on another rank) made the measurement incomplete."""
        return self._ranks.peer_degraded or (self._run is not None and self._run.sampler.health.degraded)

    # ------------------------------------------------------------- resume support
    def state_dict(self) -> dict[str, Any]:
        """Totals to carry across a checkpoint resume."""
        self._take_back_quiet_steps()
        measured = self.started or self._finished is not None
        t = self._totals if measured else self._carried
        # This rank's own totals while running (a resume adds the ranks' figures again).
        totals = self._local_totals() if self.started else self.totals() if measured else {}
        state = resume_state(
            t,
            energy_J=totals.get(metric.TOTAL_ENERGY_J, t.energy_J),
            time_s=totals.get(metric.TOTAL_TIME_S, t.time_s),
            run_name=self.run_name,
        )
        profile = self._carried_power_limit
        if self.power_limiter is not None and self._decides_power_limit() and measured:
            profile = self.power_limiter.export_state()
        if profile is not None:
            state["power_limit"] = profile
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Carry totals (and the power-limit profile so far) from a checkpoint into the next :meth:`train_start`.

        Unknown keys are ignored; a state without ``power_limit`` profiles from the start.
        """
        self._carried = carried_totals(state)
        profile = state.get("power_limit")
        self._carried_power_limit = dict(profile) if isinstance(profile, Mapping) else None

    # ------------------------------------------------------------- batch size
    def _start_batch_size(self) -> None:
        """Start the bandit's side of the run; under several processes, share its stop rule.

        Every rank takes part in the same two collectives (when distributed): the sum of
        the GPUs' maximum power (the cost's ``MaxPower``), then the main rank's early-stop
        rule, or the error that kept it from starting, so that no rank waits alone.
        """
        run = self.run
        try:
            max_power_W = sum(run.backend.power_limit_constraints_W(i)[1] for i in run.gpu_indices)
        except BackendError:  # no limit range: the limit in force stands in for the maximum
            max_power_W = (self.power_limit_W or 1.0) * len(run.gpu_indices)
        agreed = self._ranks.collective
        self._stops = agreement.StopAgreement()
        if agreed:
            max_power_W = agreement.agree_max_power_W(self.ranks, max_power_W)  # MaxPower of all GPUs
        c = self.batch_size_controller
        failure: BaseException | None = None
        if c is not None:
            try:
                c.start(max_power_W, self.power_limit_W)
            except BaseException as exc:  # e.g. a corrupt store: end the run cleanly, then raise
                failure = exc
        rule = c.rule if c is not None and failure is None else None
        self._stops.rule = rule
        if agreed:
            try:
                rule = agreement.share_stop_rule(self.ranks, rule, failure)
            except BaseException as exc:
                failure = exc
            bs_cfg = self.config.batch_size
            self._stops.start(rule, target_set=bs_cfg.target is not None, stop_at_target=bs_cfg.stop_at_target)
        self._refresh_step_decision()
        if failure is not None:
            self.exception(failure)
            raise failure
        if c is not None:
            self._write(records.batch_size_record(c))

    def suggest_batch_size(self) -> int | None:
        """The batch size the bandit picks for this recurrence (call before data loaders are built).

        Made once per session (the recurrence's trial is recorded in the store); later
        calls return the same value.

        Returns:
            The batch size, or None when ``batch_size.enabled`` is false. A process other
            than the main one never touches the store: it returns the main process's
            suggestion that :func:`~zeus_callbacks.optimizers.batch_size.suggest_batch_size`
            received under a launcher (claiming it), or None if there was none.

        Raises:
            StoreError: The store cannot be opened (corrupt, newer schema).
        """
        if self.batch_size_controller is not None:
            return self.batch_size_controller.suggest()
        if self.config.batch_size.enabled and self._followed_batch_size is None:
            followed = claim_pending(self.config.job_id)
            self._followed_batch_size = None if followed is None else followed.batch_size
        return self._followed_batch_size

    def use_batch_size(self, batch_size: int) -> None:
        """Tell the bandit which batch size the run really uses (when it differs from the suggestion)."""
        if self.batch_size_controller is not None:
            self.batch_size_controller.use_batch_size(batch_size)

    def _refresh_step_decision(self) -> None:
        """Set the per-step stop decision hook from the stop state (None: nothing can stop the run)."""
        if self._stops.active:
            self._step_decision = self._agreed_step_decision
        elif self.batch_size_controller is None and self._stop_reason is None:
            self._step_decision = None
        else:
            self._step_decision = self._decide

    def _agreed_step_decision(self) -> Decision:
        if self._stops.cost and self.steps_this_run % self.config.batch_size.stop_agreement_steps == 0:
            self._agree_stop(None)
        return self._decision()

    def _decide(self) -> Decision:
        # Optimiser hook: early stopping (cost > beta_knob x best cost) answers here.
        controller = self.batch_size_controller
        if self._stop_reason is None and controller is not None and controller.threshold is not None and self.started:
            self._stop_reason = controller.check(self._run_energy_so_far_J(), self._run_time_so_far_s())
        return self._decision()

    def _decision(self) -> Decision:
        if self._stop_reason is not None:
            return Decision(stop_training=True, reason=self._stop_reason)
        return CONTINUE

    def _agree_stop(self, target_reason: str | None) -> None:
        """Several processes: decide early stopping together (:func:`~.agreement.exchange_stop`).

        Args:
            target_reason: The main rank's reason to stop at the target (None elsewhere).
        """
        c = self.batch_size_controller
        verdict = agreement.exchange_stop(
            self.ranks,
            self._stops,
            energy_J=self._run_energy_so_far_J(),
            time_s=self._run_time_so_far_s(),
            target_reason=target_reason,
            converged=c is not None and c.converged,
            stop_at_target=self.config.batch_size.stop_at_target,
        )
        if verdict.reason is not None:
            self._stop_reason = verdict.reason
            if verdict.on_cost and c is not None and self._stop_reason is not None:
                c.stop_agreed(self._stop_reason)
        self._refresh_step_decision()

    # ------------------------------------------------------------ power limits
    def _restore_leftover_power_limits(self) -> None:
        """Put back limits a killed run left changed (its marker file is still there; its owner is dead)."""
        cfg = self.config
        try:
            for marker in pl.marker_paths(cfg.logging.log_dir, cfg.power_limit.restore_marker):  # and the old name
                pl.restore_from_marker(marker, self.run.backend)  # logs what it did per GPU, or why not
        except BackendError as exc:
            logger.error("zeus-callbacks: cannot restore the power limits an earlier run left (%s)", exc)
        except UnsafeFile as exc:  # another user's file, or a link: never acted on
            logger.warning("zeus-callbacks: ignoring the restore marker: %s", exc)
        except OSError as exc:
            logger.error("zeus-callbacks: cannot update the restore marker an earlier run left (%s)", exc)
        except pl.NotAMarker as exc:  # kept: it may hold the only record of the original limits
            logger.error(
                "zeus-callbacks: %s; it was left untouched, and this run will not change power limits "
                "while it is there (check the GPU's limit, then move the file away)",
                exc,
            )

    def _start_power_limiter(self) -> None:
        cfg = self.config
        self._power_limit_agreement = self._power_limit_follower = False
        if cfg.power_limit.enabled:
            try:
                self.power_limiter = self._make_power_limiter()
            except BackendError as exc:
                logger.warning("zeus-callbacks: power-limit profiling is off: the limits cannot be read (%s)", exc)
            if self._ranks.collective:
                # Every rank must take part in the per-step agreement, or none may.
                if not agreement.every_rank_ready(self.ranks, self.power_limiter is not None):
                    if self.power_limiter is not None:
                        logger.warning("zeus-callbacks: power-limit profiling is off: another rank cannot profile")
                    self.power_limiter = None
                self._power_limit_agreement = self.power_limiter is not None
                self._power_limit_follower = self._power_limit_agreement and self.ranks.process_index != 0
        carried = self._carried_power_limit
        if self.power_limiter is not None and carried is not None and self._decides_power_limit():
            self.power_limiter.resume(carried)
        has_limiter = self.power_limiter is not None
        self._power_step_start = self._power_limit_step_start if has_limiter else None
        self._power_step_end = self._power_limit_step_end if has_limiter and self._decides_power_limit() else None

    def _decides_power_limit(self) -> bool:
        """Under DDP the main rank's profiler decides; the other ranks follow it."""
        return not self._power_limit_follower

    def _power_limit_step_start(self, step: int) -> None:
        limiter = self.power_limiter
        assert limiter is not None
        if self._decides_power_limit():
            limiter.on_step_start(step, self.run.backend.clock.now_s())
        if self._power_limit_agreement:
            self._agree_power_limit(limiter)
        self.power_limit_W = limiter.limit_W

    def _agree_power_limit(self, limiter: pl.PowerLimitController) -> None:
        """Under DDP, make every rank run the same limit from this step on (collective).

        The main rank's profiler decides from its own GPU's measurements (with identical
        GPUs, its per-GPU cost ranks the limits as the summed cost does); each step while
        it profiles, every rank takes its limit. Observe mode anywhere (no permission,
        read-only) becomes observe mode everywhere.
        """
        verdict = agreement.exchange_power_limit(
            self.ranks, limiter.limit_W, done=limiter.profiler.finished or limiter.observe, observe=limiter.observe
        )
        if verdict.observe_everywhere:
            limiter.enter_observe("another rank cannot change its power limit")
            self._power_limit_agreement = False
            return
        if self.ranks.process_index != 0:
            limiter.apply(verdict.target_W)
        if verdict.settled:
            self._power_limit_agreement = False  # settled: no more exchanges; followers keep the limit

    def _make_power_limiter(self) -> pl.PowerLimitController:
        cfg = self.config
        run = self.run
        return pl.PowerLimitController(
            cfg.power_limit,
            run.backend,
            run.gpu_indices,
            run.energy_between_J,
            log_dir=cfg.logging.log_dir,
            job_id=cfg.job_id,
            world_size=launcher_world_size(),
            is_main_process=self.is_main_process,
            run_name=run.run_name or "run",
            cache=self._profile_cache(),
        )

    def _profile_cache(self) -> pl.ProfileCache | None:
        """The store as the profile cache (``power_limit.cache_in: store``), else None (the JSON file)."""
        cfg = self.config
        if cfg.power_limit.cache_in != "store":
            return None
        return StoreProfileCache(self.run_store)

    def _stop_power_limiter(self) -> None:
        if self.power_limiter is not None:
            if self._decides_power_limit():
                unfinished = self.power_limiter.unfinished(self._totals.steps)
                if unfinished is not None:
                    self._write_power_limit_profile(unfinished)
            self.power_limiter.restore()
            self.power_limit_W = self.run.read_power_limit_W()

    def _power_limit_step_end(self, step: int, num_samples: int | None) -> None:
        assert self.power_limiter is not None
        result = self.power_limiter.on_step_end(step, self.run.backend.clock.now_s(), num_samples)
        self.power_limit_W = self.power_limiter.limit_W
        if result is None:
            return
        if result.chosen_limit_W is not None:
            # In force from the next step on (observe mode: chosen, never applied).
            self._chosen_power_limit = (result.chosen_limit_W, self._totals.steps + 1, not self.power_limiter.observe)
            self._pending_metrics[metric.POWER_LIMIT_CHOSEN_W] = result.chosen_limit_W
            if self.batch_size_controller is not None:  # the trial records the limit it trained at
                self.batch_size_controller.record_power_limit(result.chosen_limit_W)
        self._pending_metrics[metric.POWER_LIMIT_PROFILING_STEPS] = float(result.profiling_steps)
        self._write_power_limit_profile(result)

    def _write_power_limit_profile(self, result: pl.PowerLimitResult) -> None:
        assert self.power_limiter is not None
        self._write(records.power_limit_profile_record(self._totals.steps, result, self.power_limiter.original_W))

    # ------------------------------------------------------------------ reports
    def _report_steps(self, *, resolve_final: bool = False) -> None:
        """Attribute closed windows and queue their metrics.

        Step and phase windows are attributed and aggregated in bulk (arrays, no object
        per window); the rare others (epoch, eval, run, user windows) one record each.
        """
        self._take_back_quiet_steps()
        self._attribute_closed(final=resolve_final)
        if (self._steps_since_report or self._unreported_steps) and self.power_limit_W is not None:
            # The limit in force, with the step metrics or without them (no step measured: windows.sample_fraction).
            self._pending_metrics[metric.POWER_LIMIT_W] = self.power_limit_W
        self._steps_since_report = 0
        if self._unreported_steps or self._unreported_warmup or self._ranks.collective:
            self._queue_step_metrics(final=resolve_final)
        if resolve_final and self._totals.steps > self._steps_logged_upto:  # the last steps, none measured
            self._write_steps_record({}, [], self.ranks.num_processes, final=True)

    def _attribute_closed(self, *, final: bool = False) -> None:
        """Attribute the closed windows the samples cover (all of them if ``final``); queue no step metrics."""
        windows, batch = self.run.meter.resolve_bulk(_BULK_WINDOWS, final=final)
        if batch is not None:
            self._absorb_bulk(batch)
        for record in windows:
            self._absorb(record)

    def _absorb_bulk(self, batch: WindowBatch) -> None:
        """Take one report's step and phase windows (close order) into the totals and the phase tracker."""
        is_step = batch.names == "step"
        steps = batch if is_step.all() else batch.select(is_step)
        # A step the samples do not cover wholly has no energy (NaN) or only a part's: neither is in the means.
        covered = np.isfinite(steps.energy_J) & (steps.covered_s >= steps.time_s - 1e-9)
        if not covered.all():
            steps = steps.select(covered)
        if steps.size:
            warmup = np.fromiter((bool(i and i.get("warmup")) for i in steps.end_info), dtype=bool, count=steps.size)
            if warmup.any():  # the run's first steps: reported apart (windows.warmup_steps)
                self._unreported_warmup.append(steps.select(warmup))
                if not warmup.all():
                    self._unreported_steps.append(steps.select(~warmup))
            else:
                self._unreported_steps.append(steps)
            self._totals.measured_steps += steps.size
            self._totals.step_energy_J += float(steps.energy_J.sum())
            self._totals.step_time_s += float(steps.time_s.sum())
        phases = self.run.phases
        if phases is not None and steps.size < batch.size:
            phases.add_batch(batch.select(~is_step))

    def _absorb(self, record: WindowRecord) -> None:
        """Take one window other than a step or a phase (those go through :meth:`_absorb_bulk`)."""
        if record.name == "epoch":
            self._queue_epoch_metrics(record)
        elif record.name == "eval":
            self._pending_metrics[metric.EVAL_ENERGY_J] = record.energy_J
            self._pending_metrics[metric.EVAL_TIME_S] = record.time_s
            self._write(records.eval_record(record))
        elif record.name == "run":
            self._run_record = record
        else:
            self._pending_metrics[metric.window_energy_key(record.name)] = record.energy_J
            self._write(records.window_record(record))

    def _queue_step_metrics(self, *, final: bool = False) -> None:
        batches, warmup = self._unreported_steps, self._unreported_warmup
        self._unreported_steps, self._unreported_warmup = [], []
        count = sum(b.size for b in batches)
        # The warm-up steps' columns travel with the step columns: one exchange per report.
        local = records.local_step_row(batches) + records.local_warmup_row(warmup)
        collective = self._ranks.collective
        if collective:  # the running totals travel with the report: every rank shows the run's
            local += [self._run_energy_so_far_J(), self._run_time_so_far_s()]
        gathered = self._ranks.gather(local, degraded=self.degraded)
        if collective:
            self._ranks_totals = (total(gathered, 9), slowest(gathered, 10))
        warmup_rows = [row[6:9] for row in gathered if row[8] > 0]
        if warmup_rows:
            values = records.warmup_metrics(warmup_rows)
            self._pending_metrics.update(values)
            self._write(records.warmup_record(values, warmup, ranks=len(gathered), degraded=self.degraded))
        gathered = [row[:6] for row in gathered]
        rows = [row for row in gathered if row[2] > 0]  # ranks with steps attributed this time
        if not rows:
            return
        values = records.step_metrics(rows)
        self._pending_metrics.update(values)
        self._write_steps_record(values, batches if count else [], len(gathered), final=final)

    def _write_steps_record(
        self, values: dict[str, float], batches: list[WindowBatch], ranks: int, *, final: bool
    ) -> None:
        """The JSONL ``steps`` record: the means in ``values`` (empty: no step measured) and the steps they stand for.

        The record stands for the steps after the last record's, up to its last measured
        step (to the last step taken when ``final``: every window is attributed then), the
        warm-up steps among them counted apart. So ``energy_J_mean × steps`` pairs a mean
        with the steps it was drawn from, even when attribution lags a report behind.
        """
        lo = self._steps_logged_upto
        if final:
            upto = self._totals.steps
        elif batches:
            upto = max(int(max(b.info_values("run_step"))) for b in batches if b.size) + 1
        else:
            upto = lo
        upto = max(upto, lo)
        self._steps_logged_upto = upto
        first_warmup = self._carried.steps  # warm-up steps are the run's first ones
        warmup = max(0, min(upto, first_warmup + self._warmup_done) - max(lo, first_warmup))
        self._write(
            records.steps_record(
                values, batches, steps_taken=upto - lo - warmup, warmup_steps=warmup,
                power_limit_W=self.power_limit_W, ranks=ranks, degraded=self.degraded,
            )
        )  # fmt: skip

    def _queue_epoch_metrics(self, record: WindowRecord) -> None:
        run = self.run
        counter_J = run.counter_energy_J(record.start_s, record.end_s)
        rows = self._ranks.gather(records.local_epoch_row(record, counter_J), degraded=self.degraded)
        epoch = record.info.get("epoch")
        e = records.epoch_energy(rows, epoch)
        self._totals.epoch_energy_J.append(e.energy_J)
        self._pending_metrics.update(e.metrics)
        if run.phases is not None:
            self._queue_phase_metrics(epoch, record.energy_J)
        self._write(
            records.epoch_record(epoch, e, record, degraded=self.degraded,
                                 counter_resets=run.sampler.health.counter_resets)
        )  # fmt: skip

    def _queue_phase_metrics(self, epoch: Any, epoch_energy_J: float) -> None:
        """Per-phase energy of the epoch (this process's GPUs), from the superposed phase windows."""
        phases = self.run.phases
        assert phases is not None
        steps, measured = self._epoch_sampled
        started = time.perf_counter()
        stats = phases.epoch_summary(measured_fraction=measured / steps if measured and steps else 1.0)
        self._phase_summary_s = time.perf_counter() - started
        if not stats:
            return
        values, explained = records.phase_metrics(stats, epoch_energy_J)
        self._pending_metrics.update(values)
        self._write(records.phases_record(epoch, stats, explained, epoch_energy_J))

    def _run_energy_so_far_J(self) -> float:
        return self.run.energy_so_far_J(self._carried.energy_J)

    def _run_time_so_far_s(self) -> float:
        return self.run.time_so_far_s(self._carried.time_s)

    def _summary(self) -> RunSummary:
        run = self.run
        record = self._run_record
        t = self._totals
        counter_J = run.counter_energy_J(record.start_s, record.end_s) if record else None
        rows = self._ranks.gather(
            records.local_summary_row(record, counter_J, t.step_energy_J, t.step_time_s, t.measured_steps),
            degraded=self.degraded,
        )
        measurement, note = measurement_of(run.backend)
        health = run.sampler.health
        resolution = run.backend.energy_counter_resolution_J if health.counter_fallback else None
        return records.run_summary(
            rows,
            measurement=measurement,
            measurement_note=note,
            counter_resets=health.counter_resets,
            energy_source="samples+counter" if health.counter_fallback else "samples",
            counter_resolution_J=resolution,
            carried_energy_J=self._carried.energy_J,
            carried_time_s=self._carried.time_s,
            run_name=run.run_name or "",
            status=self._status,
            backend=run.backend.describe(),
            steps=t.steps,
            epochs=t.epochs,
            epoch_energy_J=list(t.epoch_energy_J),
            power_limit_W=self.power_limit_W,
            chosen_power_limit=self._chosen_power_limit,
            faults=dict(run.sampler.health.faults),
            jsonl_path=str(run.log.path) if run.log.path is not None else None,
            degraded=self.degraded,
            rejected_samples=dict(run.sampler.health.rejected),
        )
