"""EnergySession: the framework-free controller every adapter talks to.

Adapters (the Lightning and Hugging Face callbacks, the simulator) translate their
hooks into the plain events below and act on the :class:`Decision` they get back::

    train_start → (epoch_start → (step_start → step_end)* → [eval_start → eval_end → evaluate]
                   → epoch_end)* → train_end          (exception() at any point)

The power-limit profiler (Zeus, NSDI '23 §4.3; ``_power_limit_steps``) acts at step boundaries,
the batch-size bandit (§4.2; ``_batch_size_steps``) at ``train_start``/``evaluate``/``train_end``.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

from zeus_callbacks import reporting as metric
from zeus_callbacks._distributed import RankGroup, launcher_env_int, process_rank
from zeus_callbacks._lifecycle import CLEANUPS, CleanupOrder, Registration
from zeus_callbacks.backends import GPUBackend, get_backend
from zeus_callbacks.config import ZeusConfig, parse_config
from zeus_callbacks.measurement._overhead import WindowSampling
from zeus_callbacks.measurement._sampler import PowerSampler
from zeus_callbacks.measurement._step_phases import PHASES
from zeus_callbacks.measurement._windows import BoundaryTimer, WindowBatch, WindowMeter
from zeus_callbacks.optimizers.batch_size import BatchSizeController, EarlyStopRule, SuggestedBatchSize
from zeus_callbacks.optimizers.batch_size._batch_size_controller import run_store
from zeus_callbacks.optimizers.power_limit import PowerLimitController
from zeus_callbacks.reporting import RunSummary
from zeus_callbacks.session import _log_records as records
from zeus_callbacks.session._aggregate import RankAggregator
from zeus_callbacks.session._batch_size_steps import BatchSizeSteps
from zeus_callbacks.session._ledger import EVALUATIONS_BEFORE
from zeus_callbacks.session._node_spans import SPAN_WINDOW
from zeus_callbacks.session._power_limit_steps import PowerLimitSteps
from zeus_callbacks.session._run import (
    StartedRun,
    default_gpu_indices,
    make_timer,
    measurement_of,
    open_run,
    select_gpu_indices,
)  # fmt: skip
from zeus_callbacks.session._scheduler import EVAL_TAIL, Decision, StepScheduler
from zeus_callbacks.session._state import Totals, carried_totals, check_state, resume_state
from zeus_callbacks.session._step_reports import StepReports

__all__ = ["Decision", "EnergySession", "default_gpu_indices"]

logger = logging.getLogger(__name__)


class EnergySession:
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
        timer_factory: Builds the run's boundary timer from the open backend at
            :meth:`train_start` (kept as :attr:`timer_factory`, which may be replaced until
            then); default :func:`~zeus_callbacks.session._run.make_timer` (CUDA events where
            the GPUs run queued work, else the backend's clock). Tests and benchmarks pass a
            stand-in for CUDA events, or a timer that counts its marks.
        window_observer: Called with each report's step and phase windows, a
            :class:`~zeus_callbacks.measurement._windows.WindowBatch` in close order, as they
            are attributed (before the totals and the phase tracker take them); for tools and
            tests that need every window, not the reported means. None (default): no call.

    Raises:
        ConfigError: ``config`` is invalid.

    Example:
        >>> session = EnergySession({"backend": "virtual"})
        >>> session.train_start()
        >>> session.epoch_start(0); session.step_start(0); session.step_end(0, num_samples=32)
        Decision(stop_training=False, reason=None)
        >>> summary = session.train_end()  # doctest: +SKIP
    """

    # The step calls: the scheduler's bound methods (documented there), so a step costs no extra call.
    step_start: Callable[..., None]
    step_end: Callable[..., Decision]
    phase_begin: Callable[[str], None]
    phase_end: Callable[[str], None]
    phase_switch: Callable[[str, str], None]
    phase_discard: Callable[[str], None]

    def __init__(
        self,
        config: ZeusConfig | Mapping[str, Any] | None = None,
        *,
        backend: GPUBackend | None = None,
        is_main_process: bool | None = None,
        device_index: int | None = None,
        timer_factory: Callable[[GPUBackend], BoundaryTimer] = make_timer,
        window_observer: Callable[[WindowBatch], None] | None = None,
    ) -> None:
        self.config = parse_config(dict(config) if isinstance(config, Mapping) else config)
        self.is_main_process = launcher_env_int("RANK", 0) == 0 if is_main_process is None else is_main_process
        # The store, opened once per run: shared by the bandit and the profile cache, closed at train end.
        self.run_store = run_store(self.config)
        self._pending_metrics: dict[str, float] = {}  # queued for the loggers (the parts add to it)
        self._totals = Totals()  # the run's (a copy of the carried totals at train start)
        self._reports = StepReports(
            self.config, self._pending_metrics, window_observer=window_observer,
            degraded=lambda: self.degraded, power_limit_W=lambda: self._power.power_limit_W,
            warmup_done=lambda: self._steps.warmup_done, sampling=lambda: self._steps.sampling,
        )  # fmt: skip
        steps = self._steps = StepScheduler(self._reports.report)
        self._batch = BatchSizeSteps(
            self.config, is_main_process=self.is_main_process, run_store=self.run_store,
            on_step_decision=self._set_step_decision, so_far=self._so_far,
            steps_this_run=lambda: self.steps_this_run,
        )  # fmt: skip
        self._power = PowerLimitSteps(
            self.config, is_main_process=self.is_main_process, run_store=self.run_store,
            pending_metrics=self._pending_metrics, on_chosen=self._batch.record_power_limit,
        )  # fmt: skip
        self.step_start, self.step_end = steps.step_start, steps.step_end
        self.phase_begin, self.phase_end = steps.phase_begin, steps.phase_end
        self.phase_switch, self.phase_discard = steps.phase_switch, steps.phase_discard
        self.timer_factory = timer_factory
        self._given_backend = backend
        self.backend: GPUBackend | None = backend
        self._device_index = device_index
        self._run: StartedRun | None = None  # the started run's parts (the last run's, once ended)
        self._carried = Totals()
        self._carried_open_epoch: Any = None  # the epoch the checkpoint was saved inside (None: between epochs)
        self._open_epoch: Any = None  # the epoch under way (None: between epochs)
        self._flag_step: int | None = None  # the logger step the flags were last handed at (once_per_step)
        self._eval_every_rank = True  # the last evaluation ran on every rank (eval_end's every_rank)
        self._started = False
        self._finished: RunSummary | None = None
        self._status = "completed"
        self._exception_record: dict[str, Any] | None = None
        self._rank_group = RankGroup()
        self._ranks = RankAggregator(self._rank_group)
        self._cleanup: Registration | None = None  # SIGTERM / exit: end the run (and restore limits) first

    def _set_step_decision(self, decide: Callable[[], Decision] | None) -> None:
        """The batch-size steps changed the per-step stop decision: the scheduler takes it."""
        self._steps.step_decision = decide

    def _so_far(self) -> tuple[float, float]:
        """The run's (energy in J, time in s) so far on this process, for the batch-size early-stop check.

        The energy is a lower bound (:meth:`~._run.StartedRun.energy_so_far_J`); :meth:`totals` reports
        the known figure only. A checkpoint's unknown energy (null, :meth:`state_dict`) adds 0 J to it.
        """
        run = self.run
        carried_J = self._carried.energy_J if math.isfinite(self._carried.energy_J) else 0.0
        return run.energy_so_far_J(carried_J), run.time_so_far_s(self._carried.time_s)

    # ------------------------------------------------------------------ the parts' figures
    @property
    def sampling(self) -> WindowSampling:
        """Which steps get windows and how often steps are reported (``windows.sample_fraction``)."""
        return self._steps.sampling

    @property
    def measuring(self) -> bool:
        """True between the start and end of a measured step."""
        return self._steps.measuring

    @property
    def step_end_reads_arguments(self) -> bool:
        """Whether the coming ``step_end`` reads its ``step``, ``num_samples`` and ``num_tokens``.

        True for a measured step and while the power-limit profiler takes its step boundaries;
        False for the other steps (most of them under ``windows.sample_fraction``): an adapter
        whose values cost something to compute (Lightning walks the batch for its size) may
        then pass the step it has and no counts. Read it right before ``step_end``.
        """
        return self._steps.step_end_reads_arguments

    def measure_next_step(self) -> None:
        """Measure the step after the current one whatever ``windows.sample_fraction`` draws.

        Call it during the last-but-one step before a pause (an evaluation, the epoch's end, the
        run's end), before that step's ``step_end``: the last step before the pause is then
        measured, and its window opens at the end mark of the step before. The steps since the
        previous measured step then lie in a stretch of steps only, which the epoch ledger and the
        ``steps`` records measure from the power samples instead of estimating them (with none
        measured, an epoch's last steps had null means). The Lightning and Hugging Face adapters
        call it from the trainer's schedule; a raw loop may call it. A wrong guess costs one
        measured step. No effect before :meth:`train_start`, with every step measured, or
        without step windows.
        """
        self._steps.measure_next_step()

    @property
    def quiet_steps_left(self) -> int:
        """Steps counted ahead whose calls have not come yet (their calls return at once)."""
        return self._steps.quiet_steps_left

    @property
    def steps_to_skip(self) -> int:
        """Unmeasured steps before the next measured one (quiet steps counted ahead included)."""
        return self._steps.steps_to_skip

    @property
    def plans_quiet_steps(self) -> bool:
        """Whether steps that need nothing from the session are counted ahead (True by default).

        Set False for the reference path, where every step's calls take the whole path: the
        quiet steps must measure, count and report exactly what it does (tests compare the two).
        """
        return self._steps.plans_quiet_steps

    @plans_quiet_steps.setter
    def plans_quiet_steps(self, plans: bool) -> None:
        self._steps.plans_quiet_steps = plans

    @property
    def epoch_steps(self) -> int:
        """Steps of the current epoch (quiet steps counted ahead included)."""
        return self._steps.epoch_steps

    @property
    def reports_made(self) -> int:
        """Step reports made since this session's run began (every ``interval_steps``, epoch ends, flushes)."""
        return self._reports.reports_made

    @property
    def power_limiter(self) -> PowerLimitController | None:
        """The power-limit controller of the run (None: off, unreadable limits, or another rank cannot profile)."""
        return self._power.power_limiter

    @property
    def power_limit_W(self) -> float | None:
        """The limit in force on this process's first GPU (W; None before :meth:`train_start` or unreadable)."""
        return self._power.power_limit_W

    @property
    def batch_size_controller(self) -> BatchSizeController | None:
        """The controller of the recurrence's trial (None: ``batch_size.enabled`` is false, or not the main process)."""
        return self._batch.batch_size_controller

    @property
    def stop_rule(self) -> EarlyStopRule | None:
        """The early-stop rule in force (the main rank's, on every rank under several processes)."""
        return self._batch.stop_rule

    def suggest_batch_size(self, suggested: SuggestedBatchSize | None = None) -> int | None:
        """The batch size the bandit picks for this recurrence (call before data loaders are built).

        Made once per session (the recurrence's trial is recorded in the store); later calls return
        the same value. ``suggested``: what :func:`~zeus_callbacks.suggest_batch_size` returned for
        this run (its trial is claimed, not a new one made).

        Returns:
            The batch size, or None when ``batch_size.enabled`` is false. A process other than the
            main one never touches the store: it returns the main process's suggestion that
            ``suggested`` received under a launcher, or None if there was none.

        Raises:
            StoreError: The store cannot be opened (corrupt, newer schema).
        """
        return self._batch.suggest_batch_size(suggested)

    def use_batch_size(self, batch_size: int) -> None:
        """Tell the bandit which batch size the run really uses (when it differs from the suggestion)."""
        self._batch.use_batch_size(batch_size)

    def withdraw_batch_size_trial(self, reason: str) -> None:
        """Withdraw the run's batch-size trial at :meth:`train_end` instead of recording it.

        For a loop whose batch size is not known (it never said which it trained at): a trial recorded
        at the suggestion would be an observation of a batch size that may never have run. A withdrawn
        trial (status ``withdrawn``, ``reason`` in its ``info``) is neither an observation nor a failure
        of its batch size. Nothing happens with ``batch_size.enabled`` false or off the main process.

        Args:
            reason: Why, kept in the trial's ``info["reason"]``.
        """
        self._batch.withdraw_trial(reason)

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
    def steps_this_run(self) -> int:
        """Steps since :meth:`train_start` (quiet steps counted ahead included; alike on every rank)."""
        return self._totals.steps - self._carried.steps

    @property
    def open_epoch(self) -> Any:
        """The epoch under way (None between epochs and outside a run)."""
        return self._open_epoch if self.started else None

    def _write(self, record: dict[str, Any]) -> None:
        self.run.log.write(record)

    # ------------------------------------------------------------------ lifecycle
    @property
    def started(self) -> bool:
        """True between :meth:`train_start` and :meth:`train_end`."""
        return self._started and self._finished is None

    def train_start(
        self,
        *,
        run_name: str | None = None,
        job_steps: int | None = None,
        job_steps_source: Literal["trainer", "train_start"] = "train_start",
    ) -> None:
        """Open the backend, start sampling and open the run window.

        Args:
            run_name: Name of the run's JSONL file; default ``config.logging.run_name``
                or a timestamp.
            job_steps: Training steps the job is expected to run (the framework's ``max_steps``, or
                epochs × steps per epoch), for power-limit profiling when ``power_limit.job_steps`` is
                unset: a known job length lets the search polish before choosing (docs/power_limit.md).
                None or a non-positive value: unknown.
            job_steps_source: Who worked out ``job_steps``: ``trainer`` (a framework integration) or
                ``train_start`` (the caller's own loop); the ``power_limit_profile`` record says so.

        Raises:
            BackendUnavailable: ``config.backend`` names a backend that cannot be used.
            OSError: The JSONL log directory is not writable (raised before training).
            StoreError: With the bandit on, its store cannot be used (corrupt, newer schema). Any error
                raised once sampling began first ends the run as ``failed``: the sampler stops, the log
                ends with the exception and ``run_end``.
        """
        if self.started:
            return
        cfg = self.config
        self._finished = None
        self._status = "completed"
        self._totals = self._carried.copy()
        backend = self.open_backend()
        gpu_indices = select_gpu_indices(cfg, backend, self._device_index)
        self._rank_group = RankGroup.detect()
        self._ranks = RankAggregator(self._rank_group)
        name = run_name or cfg.logging.run_name or _dt.datetime.now().strftime("run-%Y%m%d-%H%M%S")
        run = open_run(
            cfg, backend, gpu_indices, name,
            write_log=self.is_main_process and cfg.logging.jsonl, make_timer=self.timer_factory,
        )  # fmt: skip
        self._run = run
        self._reports.begin(run, self._totals, self._carried, self._ranks)
        self._power.open(run)
        if cfg.batch_size.enabled:  # before the run window: a wait for a locked store is not the trial's cost
            self._batch.prepare(run, self._ranks, self._power.power_limit_W)
        run.start()
        self._started = True
        try:
            fraction = cfg.windows.sample_fraction
            sampling = WindowSampling(
                None if fraction == "auto" else fraction,
                cfg.windows.max_overhead,
                cfg.logging.interval_steps,
                stretch_reports=not self.ranks.is_distributed,  # reports are collectives under several processes
                shared=self.ranks.is_distributed,  # the ranks agree the share at each report: the same steps measured
                announce=cfg.windows.step,  # no step windows: no step energy whose cadence to announce
            )
            self._steps.begin(
                self._totals, run.meter, run.timer, backend.clock, sampling,
                step_windows=cfg.windows.step, phase_windows=run.phases is not None,
                warmup_steps=cfg.windows.warmup_steps,
            )  # fmt: skip
            self._reports.node_span_boundary()  # the first node span opens with the run
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
                    devices=records.device_identities(backend, run.gpu_indices), resumed_steps=self._carried.steps,
                    resumed_energy_note=self._carried.energy_note,
                )
            )  # fmt: skip
            # Optimiser hook: the batch-size bandit and power-limit cache are consulted here.
            steps = self._steps
            steps.power_step_start, steps.power_step_end = self._power.start(
                self._ranks, self._totals, job_steps=job_steps, job_steps_source=job_steps_source
            )
            if cfg.batch_size.enabled:
                failure = self._batch.start(self._power.power_limit_W)
                if failure is not None:  # e.g. a corrupt store: end the run cleanly, then raise
                    raise failure
        except BaseException as exc:
            # Sampling has begun: a start that fails past here (a store error, a full disk) ends the run
            # as failed, so that no sampler thread is left and the log ends with the failure.
            try:
                self.exception(exc)
            except Exception:  # the end failed too: at least nothing is left sampling
                logger.exception("zeus-callbacks: cannot end the run whose start failed (%s)", exc)
                run.sampler.stop()
            raise

    def _node_end(self) -> dict[str, Any]:
        """The CPU/DRAM counters at an open epoch's end, for its window's info (nothing without a reader)."""
        run = self.run
        if run.node is None or not run.meter.is_open("epoch"):
            return {}
        return {"node_end": run.node.read()}

    def _end_interrupted(self) -> None:
        self.train_end(status="interrupted")

    def open_backend(self) -> GPUBackend:
        """Open the configured backend now (adapters call it at setup, to fail before training).

        Raises:
            BackendUnavailable: The configured backend cannot be used here.
        """
        if self.backend is None:
            from zeus_callbacks.backends.virtual import virtual_backend_kwargs

            virtual = self.config.virtual
            self.backend = get_backend(
                self.config.backend,
                # Under several processes each has its own virtual GPUs: their made-up ids name the rank.
                virtual=lambda: {**virtual_backend_kwargs(virtual), "process_rank": process_rank()},
                # Every rank opens a backend, and the fallback's warning (the virtual GPU, a GPU that cannot
                # be measured) is the same on each: one process a machine says it.
                announce=self.is_main_process or launcher_env_int("LOCAL_RANK", -1) == 0,
            )
        return self.backend

    def epoch_start(self, epoch: int) -> None:
        """Open the epoch window (and re-anchor CUDA event timing once).

        The epoch's first step window, when that step is measured, opens at the same mark:
        the epoch's first batch fetch belongs to its first step.
        """
        if not self.started:
            return
        # Resumed inside this epoch: its steps before the checkpoint are in the carried total, not in its window.
        resumed_inside = self.steps_this_run == 0 and self._carried_open_epoch is not None
        resumed_inside = resumed_inside and epoch == self._carried_open_epoch
        self._open_epoch = epoch
        self._steps.begin_epoch()
        token = None
        if self.config.windows.epoch:
            # Where the epoch begins among the steps: the ledger measures the steps before its first step window.
            info: dict[str, Any] = {"epoch": epoch, "run_step": self._totals.steps,
                                    EVALUATIONS_BEFORE: self._steps.evaluations}  # fmt: skip
            if resumed_inside:
                info["covered_from_step"] = self._totals.steps
            if self.run.node is not None:  # the CPU/DRAM counters at the epoch's start (a few sysfs reads)
                info["node_start"] = self.run.node.read()
            token = self.run.meter.mark()
            self.run.meter.begin_at("epoch", token, info)
        token = self._steps.close_eval_tail(token)  # an evaluation after the last epoch's end: its tail ends here
        self._steps.open_step_at_boundary(token)

    def _end_epoch_window(self, info: dict[str, Any]) -> bool:
        """Close the epoch window with ``info`` (False: none open); an evaluation's tail still open ends at its mark."""
        token = self._steps.close_eval_tail()
        meter = self.run.meter
        return meter.end("epoch", **info) if token is None else meter.end_at("epoch", token, info)

    def eval_start(self) -> None:
        """Open the evaluation window; a step window opened ahead at the last step's end is dropped.

        The evaluation is no part of any step, nor is what follows it before the next step begins:
        the next measured step's window opens at its own :meth:`step_start` (or at the next
        :meth:`epoch_start`, after an epoch's end). What follows an evaluation up to that boundary
        (or up to this one, for evaluations back to back) is its ``eval_tail`` (:meth:`eval_end`).
        """
        self._steps.take_back_quiet_steps()
        if not self.started:
            return
        run = self.run
        self._steps.eval_begins()
        self._power.eval_start()
        if self.config.windows.eval:  # the last evaluation's tail, if open, ends where this one begins
            run.meter.begin_at("eval", self._steps.close_eval_tail(run.meter.mark()), {"step": self._totals.steps})

    def eval_end(
        self, *, report: bool = False, dataset: str | None = None, every_rank: bool = False
    ) -> dict[str, float]:
        """Close the evaluation window; its energy is reported once attributed.

        The ``eval_tail`` window opens at the evaluation's end mark (with ``windows.eval``, unless a
        measured step holds the evaluation): the attribution here and its wait for the sensor, the other
        callbacks' evaluation hooks, a log, a checkpoint up to the next step's start (or the next
        evaluation's start, the epoch's end, the run's end). The epoch ledger counts it as ``eval_tail``.

        Args:
            report: Attribute the evaluation now (waits ≤ 0.25 s for the sensor, like
                :meth:`epoch_end`) and return its metrics instead of queueing them, so that
                they are logged at the evaluation's own step. Steps attributed on the way stay
                queued for the next :meth:`pop_metrics`.
            dataset: The evaluation dataset's name, for the ``eval`` record (None: the single
                default dataset, or one the framework does not name).
            every_rank: Every rank runs this evaluation and calls this at its end (a trainer's own
                evaluation). Under several processes its energy is then summed over the ranks here
                (a collective). False (default): under several processes the ``eval`` record holds this
                process's figures with a ``ranks_note``, no metric is queued and nothing waits on
                the other ranks (an evaluation on one rank must not hang).

        Returns:
            With ``report``: ``energy/eval_J`` (J) and ``time/eval_s`` (s), flagged as
            :meth:`pop_metrics` flags, when the window is measured (``windows.eval``);
            otherwise empty.
        """
        if not self.started:
            return {}
        run = self.run
        # Whether the ranks meet here: from the configuration and the caller only, the same on every rank.
        together = every_rank and self.config.windows.eval and self._ranks.collective
        self._eval_every_rank = every_rank  # evaluate() then exchanges the stop decision only if every rank is here
        if self.config.windows.eval and run.meter.is_open("eval"):
            token = run.meter.mark()
            info: dict[str, Any] = {"every_rank": together}
            if dataset is not None:
                info["dataset"] = dataset
            run.meter.end_at("eval", token, info)
            self._steps.open_eval_tail(token)  # what follows the evaluation, up to the next boundary
            # Attribute the evaluation now (a wait for the sensor, not work: outside the steps' time),
            # so that adapters log its energy at the evaluation's step, before the next training step.
            run.flush_sensor(run.backend.clock.now_s(), read_counter=False)  # samples only: no 3-5 ms counter read
            # Every rank's window must be in before the exchange: attributed now even where the samples lag.
            self._reports.attribute_closed(final=together)
        if together:
            self._reports.eval_exchange()
        self._steps.eval_ends()
        if not report or not self.config.windows.eval:
            return {}
        if together or not self._ranks.collective:  # a report is a collective under several processes
            run.flush_sensor(run.backend.clock.now_s())
            self._steps.report(resolve_final=True)
        keys = (metric.EVAL_ENERGY_J, metric.EVAL_TIME_S)
        return self._flagged({key: self._pending_metrics.pop(key) for key in keys if key in self._pending_metrics})

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
        self._steps.take_back_quiet_steps()
        if self.started:
            self._write(records.evaluate_record(self._totals.steps, numeric))
            every_rank, self._eval_every_rank = self._eval_every_rank, True  # the next evaluate() without eval_end
            return self._batch.evaluated(numeric, every_rank=every_rank)
        return self._batch.decide()

    def epoch_end(self, epoch: int, *, report: bool = False) -> dict[str, float]:
        """Close the epoch window and attribute its energy (waits ≤ 0.25 s for the sensor).

        Under DDP every rank must call it (it aggregates across ranks).

        Args:
            epoch: The epoch's index (from 0).
            report: Return the epoch metrics instead of queueing them, so that an adapter
                whose loggers may not log at the epoch's end keeps each epoch for its own
                step (the Hugging Face Trainer: two epochs can end between two of its logs).
                Steps attributed on the way stay queued for the next :meth:`pop_metrics`.

        Returns:
            The epoch metrics (``energy/epoch_J`` and the rest, per-GPU and per-phase
            figures included; queued for :meth:`pop_metrics` too unless ``report``),
            flagged as :meth:`pop_metrics` flags them (``energy/simulated`` on the virtual
            GPU); empty when the epoch window is not measured.
        """
        if not self.started:
            return {}
        run = self.run
        steps = self._steps
        self._reports.epoch_ended(steps.epoch_counts)
        self._totals.epochs += 1
        self._open_epoch = None
        steps.pause_timing()
        steps.discard_phases()
        if not self._end_epoch_window({"epoch": epoch, "end_step": self._totals.steps, **self._node_end()}):
            steps.timed_report()
            return {}
        run.flush_sensor(run.backend.clock.now_s())  # a wait, not work: not charged to the steps
        # Attribute everything now (edges past the samples, if the sensor is late, are
        # extrapolated and marked incomplete): every rank then aggregates this epoch here.
        reported = time.perf_counter()
        steps.report(resolve_final=True)
        # The steps' attribution is charged to them; the once-an-epoch phase summary is not.
        steps.charge_report_s(time.perf_counter() - reported - self._reports.phase_summary_s)
        values = self._reports.last_epoch_metrics
        if report:
            for key in values:
                self._pending_metrics.pop(key, None)
        return self._flagged(dict(values))

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
        steps = self._steps
        counts = steps.epoch_counts  # the quiet steps counted ahead taken back
        steps.end()
        run = self.run
        if status is not None:
            self._status = status
        # After a failure other ranks may never reach the same collective: stay local.
        self._ranks.collectives_ok = self._status == "completed"
        try:
            self._close_windows(counts)
            run.flush_sensor(run.backend.clock.now_s())
        finally:  # whatever failed above, sampling stops and the power limits go back
            try:
                run.sampler.stop()
            finally:
                self._power.stop()
        steps.report(resolve_final=True)
        limiter = self._power.power_limiter
        summary = self._reports.summary(
            self._status, chosen_power_limit=self._power.chosen,
            time_note=limiter.time_note() if limiter is not None else None,
        )  # fmt: skip
        self._finished = summary
        failure = None if self._exception_record is None else records.exception_in_short(self._exception_record)
        self._batch.record_trial(summary, failure=failure)
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

    def _close_windows(self, counts: tuple[int, int]) -> None:
        """At the run's end: close the open step, evaluation, epoch and run windows (``counts``: the epoch's)."""
        run = self.run
        # A step cut short is not a step (its energy stays in the run total); an
        # unfinished epoch or evaluation is still measured up to now.
        run.meter.discard("step")
        self._open_epoch = None
        self._reports.epoch_ended(counts)
        if run.meter.is_open("eval"):
            run.meter.end("eval")
        if run.meter.is_open("epoch"):  # cut short (max_steps, an interruption): measured, so counted
            self._totals.epochs += 1
            self._end_epoch_window({"end_step": self._totals.steps, "cut_short": True, **self._node_end()})
        else:
            self._steps.close_eval_tail()  # an evaluation's tail ends with the run
        self._reports.node_span_boundary(last=True)  # the last node span closes with the run
        run.meter.end("run")

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
        if name in ("run", "step", "epoch", "eval", EVAL_TAIL, SPAN_WINDOW, *PHASES):
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

        The step metrics are the means over every step reported since the last call (one
        interval, however many reports it held): ``energy/step_J`` the mean energy of its
        measured steps, ``energy/step_count`` their number.

        Args:
            flush_steps: Report the steps since the last report now (HF Trainer calls
                this at each of its own logging events). Not while auto sampling has spaced
                the reports out (``report_every`` above ``logging.interval_steps``, announced):
                the reports keep that cadence, which exists to save this very cost, and the
                log carries the reports made since the last one. A flush that runs counts
                in auto sampling's budget.
        """
        sampling = self._steps.sampling
        if flush_steps and self.started and sampling.report_every <= sampling.interval_steps:
            self._steps.timed_report()
        self._reports.end_interval()
        pending = self._pending_metrics
        if not pending:
            return {}  # most steps: nothing queued, nothing to copy
        metrics = dict(pending)
        pending.clear()  # the parts hold this queue: emptied, not replaced
        return self._flagged(metrics)

    def charge_overhead_s(self, time_s: float) -> None:
        """Charge ``time_s`` (s) an adapter spent for the session outside its calls to auto sampling's budget.

        For work on the training thread that no session call times, such as assembling a
        framework's log from :meth:`totals` (``windows.max_overhead`` covers it too). No-op
        outside a run.
        """
        if self.started:
            self._steps.charge_report_s(time_s)

    def flagged(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """``metrics`` as this run's loggers get them (adapters flag what they log beside ``pop_metrics``).

        On the virtual GPU with ``energy/simulated``; on a GPU that cannot be measured without
        energy or power figures, and with ``energy/unavailable``.
        """
        return self._flagged(dict(metrics))

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

    def once_per_step(self, metrics: Mapping[str, float], step: int) -> dict[str, float]:
        """``metrics`` as handed to the loggers at logger step ``step``: each flag at most once per step.

        ``energy/simulated`` and ``energy/unavailable`` are flags, not figures; an evaluation's
        log and a report can fall on one step, and a second point of a flag there would be a
        duplicate. The first batch handed at ``step`` keeps the flags; later batches at the same
        step (the step last flagged) lose them. Adapters hand every batch through here, in the
        order the loggers get them.

        Args:
            metrics: Metrics as :meth:`pop_metrics` or :meth:`flagged` return them.
            step: The step the loggers will record them at.

        Returns:
            A new dict: ``metrics``, without the flags when ``step`` already had them.
        """
        flags = (metric.SIMULATED, metric.UNAVAILABLE)
        if not any(key in metrics for key in flags):
            return dict(metrics)
        if self._flag_step == step:
            return {k: v for k, v in metrics.items() if k not in flags}
        self._flag_step = step
        return dict(metrics)

    def totals(self) -> dict[str, float]:
        """The run's energy and time so far: ``energy/total_J``, ``time/total_s``.

        Once the run has ended, also its mean power and mean step (``power/run_mean_W``,
        ``energy/run_step_mean_J``, ``time/run_step_mean_s``, ``energy/run_step_count``), ``energy/cpu_J``,
        ``energy/dram_J``, ``energy/node_J`` and the estimates ``energy/co2_g`` and ``cost/run`` where they
        are configured and known (:func:`~zeus_callbacks.reporting.run_metrics`).

        Under several processes, during the run: the energy of all GPUs and the slowest
        rank's time as of the last step report (the same on every rank); before the first
        report, this rank's own. A figure that is unknown is left out: ``energy/total_J`` while a GPU's
        power samples do not reach the run's start yet (the sensor's first sample period; under several
        processes, any rank's GPU as of the last report), or of a run resumed from a checkpoint whose
        energy was not measured (the summary's ``energy_note``).
        """
        if self._finished is not None:
            values = {metric.TOTAL_ENERGY_J: self._finished.energy_J, metric.TOTAL_TIME_S: self._finished.time_s}
            # The run's means, its CPU/DRAM/node energy and CO2 and cost estimates, where known: at the end only.
            estimates = metric.run_metrics(self._finished)
            once = (
                *(metric.RUN_MEAN_POWER_W, metric.RUN_STEP_ENERGY_J, metric.RUN_STEP_TIME_S, metric.RUN_STEP_COUNT),
                *(metric.CPU_ENERGY_J, metric.DRAM_ENERGY_J, metric.NODE_ENERGY_J, metric.CO2_G, metric.RUN_COST),
            )
            values.update({k: estimates[k] for k in once if k in estimates})
        elif not self.started:
            return {}
        elif self._reports.ranks_totals is not None:
            energy_J, time_s = self._reports.ranks_totals
            values = {metric.TOTAL_ENERGY_J: energy_J, metric.TOTAL_TIME_S: time_s}
        else:
            values = self._local_totals()
        return self._flagged({k: v for k, v in values.items() if math.isfinite(v)}, flag=False)

    def _local_totals(self) -> dict[str, float]:
        run = self.run
        energy_J, time_s = run.known_so_far_J(self._carried.energy_J), run.time_so_far_s(self._carried.time_s)
        return {metric.TOTAL_ENERGY_J: energy_J, metric.TOTAL_TIME_S: time_s}

    def progress_bar_metrics(self) -> dict[str, float]:
        """The short metrics shown on a progress bar: the run's energy so far (kJ, rounded to 1 J).

        ``energy_kJ``; on the virtual GPU ``sim_energy_kJ`` instead (a progress bar shows no
        ``energy/simulated`` flag beside it). Empty before the run and on a GPU that cannot be measured.
        """
        totals = self.totals()
        if metric.TOTAL_ENERGY_J not in totals:
            return {}
        simulated = self.backend is not None and self.backend.simulated
        key = metric.PROGRESS_BAR_SIMULATED_ENERGY if simulated else metric.PROGRESS_BAR_ENERGY
        return {key: round(totals[metric.TOTAL_ENERGY_J] / 1e3, 3)}

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
        """Totals to carry across a checkpoint resume.

        ``energy_J`` is the run's energy so far (J), or None with ``energy_note`` when it was not measured:
        saved before any power sample covered the run's start, on a GPU that cannot be measured, or
        carried unknown from an earlier checkpoint. Saving waits (at most about 0.25 s, as an epoch's
        end does) for the samples to reach the save moment.
        """
        self._steps.take_back_quiet_steps()
        measured = self.started or self._finished is not None
        t = self._totals if measured else self._carried
        energy_J, note = t.energy_J, t.energy_note
        if self.started:
            # This rank's own totals (a resume adds the ranks' figures again). Not 0 J for a stretch no
            # sample covers: a resumed run would count those steps as free. The samples this wait brings
            # are the cheapest honest figure; what they still do not cover is null with the reason.
            run = self.run
            if run.backend.measurable:
                run.flush_sensor(run.backend.clock.now_s(), read_counter=False)
            measured_J, why = run.measured_so_far_J()
            energy_J = self._carried.energy_J + measured_J if measured_J is not None else math.nan
            note = self._carried.energy_note or why
            time_s = run.time_so_far_s(self._carried.time_s)
        elif self._finished is not None:
            energy_J, time_s = self._finished.energy_J, self._finished.time_s
            note = self._finished.energy_note or self._finished.measurement_note
        else:
            time_s = t.time_s
        state = resume_state(
            t,
            energy_J=energy_J,
            energy_note=note,
            time_s=time_s,
            run_name=self.run_name,
            # Saved inside an epoch (after some of its steps): a run resumed from here starts mid-epoch.
            open_epoch=self._open_epoch if self.started and self._steps.epoch_steps > 0 else None,
        )
        profile = self._power.state(measured=measured)
        if profile is not None:
            state["power_limit"] = profile
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Carry totals (and the power-limit profile so far) from a checkpoint into the next :meth:`train_start`.

        Unknown keys are ignored; a state without ``power_limit`` profiles from the start. A state saved
        inside an epoch (``open_epoch``) marks that epoch's record, when the resumed run begins in it, as
        covering only the steps after the checkpoint (``resumed_mid_epoch``, ``energy/epoch_partial``).

        Raises:
            TypeError: ``state`` is not a mapping.
            ValueError: It is not a state :meth:`state_dict` wrote (a total negative, not a number, or
                none at all); the message names the key.
        """
        check_state(state)
        self._carried = carried_totals(state)
        self._carried_open_epoch = state.get("open_epoch")  # None: between epochs, or an older state
        self._power.carry(state)
