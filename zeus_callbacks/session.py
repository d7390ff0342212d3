"""EnergySession: the framework-free controller every adapter talks to.

Adapters (the Lightning and Hugging Face callbacks, the simulator) translate their
hooks into the plain events below and act on the :class:`Decision` they get back.
Everything hardware-facing sits underneath: a backend, a background
:class:`~zeus_callbacks.measurement.sampler.PowerSampler`, and a
:class:`~zeus_callbacks.measurement.windows.WindowMeter` whose boundaries cost one
clock read (or one CUDA event record) on the training thread.

Event order::

    train_start → (epoch_start → (step_start → step_end)* → [eval_start → eval_end → evaluate]
                   → epoch_end)* → train_end          (exception() at any point)

Where the optimisers plug in: the power-limit profiler (Zeus, NSDI '23 §4.3) acts at
``step_start``/``step_end`` boundaries and the batch-size bandit (§4.2) at
``train_start``/``evaluate``/``train_end``; both answer through :class:`Decision`.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime as _dt
import logging
import math
import os
import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from zeus_callbacks import reporting as metric
from zeus_callbacks.backends import BackendError, GPUBackend, get_backend
from zeus_callbacks.config import ZeusConfig, parse_config
from zeus_callbacks.distributed import RankGroup, launcher_world_size
from zeus_callbacks.measurement.attribution import counter_energy_J, extrapolated_energy_J, interval_energy_J
from zeus_callbacks.measurement.overhead import WindowSampling
from zeus_callbacks.measurement.phases import PHASES, PhaseTracker
from zeus_callbacks.measurement.sampler import PowerSampler
from zeus_callbacks.measurement.windows import (
    BoundaryTimer,
    ClockTimer,
    CudaEventTimer,
    WindowBatch,
    WindowMeter,
    WindowRecord,
)
from zeus_callbacks.optimizers import power_limit as pl
from zeus_callbacks.optimizers.batch_size import BatchSizeController, EarlyStopRule, claim_pending
from zeus_callbacks.reporting import JsonlWriter, RunSummary
from zeus_callbacks.signals import ChainedSigterm
from zeus_callbacks.store.profile_cache import StoreProfileCache

logger = logging.getLogger(__name__)

_EPOCH_FLUSH_TIMEOUT_S = 0.25  # wall time an epoch end may wait for the sensor to catch up
_BULK_WINDOWS = frozenset(("step", *PHASES))  # attributed and aggregated as arrays at each report
_UNMEASURED_TIMING_MASK = 63  # an unmeasured step is timed when its remaining skips are a multiple of 64
_PHASE_REANCHOR_S = 30.0  # with windows.phases, CUDA event timing is re-anchored this often (s)


@dataclass(frozen=True)
class Decision:
    """What the session asks the training loop to do after an event.

    Attributes:
        stop_training: Stop training now (early stopping of a costly recurrence).
        reason: Why, for the log.
    """

    stop_training: bool = False
    reason: str | None = None


_CONTINUE = Decision()  # the answer of almost every step: built once, not per step


@dataclass
class _Totals:
    """Running totals of the training run (carried across checkpoint resumes)."""

    energy_J: float = 0.0
    time_s: float = 0.0
    steps: int = 0  # steps executed
    measured_steps: int = 0  # steps whose energy has been attributed
    epochs: int = 0
    step_energy_J: float = 0.0
    step_time_s: float = 0.0
    epoch_energy_J: list[float] = field(default_factory=list)


def default_gpu_indices(backend: GPUBackend) -> list[int]:
    """GPUs this process measures by default.

    Under a distributed launcher (``WORLD_SIZE`` > 1 and ``LOCAL_RANK`` set) each process
    measures its own GPU only, so nothing is counted twice; a single process measures
    every GPU it can see.
    """
    count = backend.device_count()
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is not None and launcher_world_size() > 1:
        return [int(local_rank) % count]
    return list(range(count))


def _is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


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
        self.config = parse_config(dict(config) if isinstance(config, Mapping) else config)
        self._given_backend = backend
        self.backend: GPUBackend | None = backend
        self.is_main_process = _is_main_process() if is_main_process is None else is_main_process
        self._device_index = device_index
        self.run_name: str | None = None
        self.gpu_indices: list[int] = []
        self.power_limit_W: float | None = None
        self.sensor_delay_s = 0.0
        self.sampler: PowerSampler | None = None
        self.meter: WindowMeter | None = None
        self._timer: BoundaryTimer | None = None
        self._writer: JsonlWriter | None = None
        self._totals = _Totals()
        self._carried = _Totals()
        self._pending_metrics: dict[str, float] = {}
        self._unreported_steps: list[WindowBatch] = []  # step windows attributed since the last step metrics
        self._steps_since_report = 0
        self._steps_unlogged = 0  # steps taken since the last "steps" record (measured or not)
        self._run_start_s: float | None = None
        self._run_start_wall: float | None = None
        self._epoch_index: int | None = None
        self._epoch_steps = 0
        self._last_eval_metrics: dict[str, float] = {}
        self._started = False
        self._finished: RunSummary | None = None
        self._status = "completed"
        self._exception_record: dict[str, Any] | None = None
        self.ranks = RankGroup()
        self._collectives_ok = True  # False once a failure may leave ranks out of step
        self._peer_degraded = False
        self._run_record: WindowRecord | None = None
        # A scheduler's kill skips atexit: end the run (and restore limits) first.
        self._sigterm = ChainedSigterm(lambda: self.train_end(status="interrupted"), "ending the energy log")
        self.power_limiter: pl.PowerLimitController | None = None
        self._power_limit_agreement = False  # DDP: exchange the limit at each step start
        self._power_limit_follower = False  # DDP, not the main rank: apply the main rank's limits
        # Batch-size bandit (Zeus §4.2-4.4): only the main process talks to the store.
        self.batch_size_controller = (
            BatchSizeController(self.config) if self.config.batch_size.enabled and self.is_main_process else None
        )
        self._stop_reason: str | None = None
        self._followed_batch_size: int | None = None  # not the main process: the main's suggestion
        self._stop_rule: EarlyStopRule | None = None  # several processes: the main's rule, on every rank
        self._stop_agreement = False  # several processes, bandit on: stop decisions are exchanged
        self._cost_agreement = False  # ... and the cost is compared every batch_size.stop_agreement_steps
        self._converged = False  # several processes: the target was reached on the main rank (agreed)
        self._ranks_totals: tuple[float, float] | None = None  # several processes: (J, s) of all ranks
        self._phases: PhaseTracker | None = None  # windows.phases: per-phase energy per epoch
        self._anchored_s = -math.inf
        # Hot path (step_start / step_end / phases): flags read once at train_start.
        self._active = False  # started and not finished
        self._step_windows = True
        self._phase_open: str | None = None  # the phase window open now (phases tile the step)
        self._mark: Any = None  # the meter's mark(): one boundary
        # Which steps get windows (windows.sample_fraction) and the report interval.
        self._sampling = WindowSampling(1.0, 0.002, 1, stretch_reports=False)
        self._skip = 0  # steps to leave unmeasured before the next measured one
        self._time_unmeasured = False  # an unmeasured step whose step_end times itself
        self._quiet_left = 0  # planned steps with nothing to do, not yet taken (see _plan_quiet_steps)
        self._measuring = False  # the current step has windows
        self._dataloader_open = False  # phases: a measured step's dataloader gap is open
        self._epoch_measured = 0  # steps of this epoch that got windows
        self._epoch_sampled = (0, 0)  # (steps, measured steps) of the last ended epoch
        self._new_timing_interval(None)
        self._phase_summary_s = 0.0  # the last epoch's phase superposition (s)

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
        self._totals = dataclasses.replace(self._carried, epoch_energy_J=list(self._carried.epoch_energy_J))
        backend = self.open_backend()
        if cfg.gpu_indices is not None:
            bad = [i for i in cfg.gpu_indices if i >= backend.device_count()]
            if bad:
                raise ValueError(
                    f"gpu_indices {bad} do not exist: the {backend.name} backend sees "
                    f"{backend.device_count()} GPU(s)"
                )
            self.gpu_indices = list(cfg.gpu_indices)
        elif self._device_index is not None:
            self.gpu_indices = [self._device_index % backend.device_count()]
        else:
            self.gpu_indices = default_gpu_indices(backend)
        self.ranks = RankGroup.detect()
        self._collectives_ok = True
        self._peer_degraded = False
        self._ranks_totals = None
        self.run_name = run_name or cfg.logging.run_name or _dt.datetime.now().strftime("run-%Y%m%d-%H%M%S")
        if self.is_main_process and cfg.logging.jsonl:
            self._writer = JsonlWriter(cfg.logging.log_dir, self.run_name)
            self.run_name = self._writer.run_name  # a taken name gets a -N suffix
        delay_s = cfg.windows.sensor_delay_s
        self.sensor_delay_s = backend.sensor_delay_s if delay_s is None else delay_s
        self.sampler = PowerSampler(
            backend,
            self.gpu_indices,
            poll_period_s=cfg.sampling.poll_period_s,
            energy_counter_period_s=cfg.sampling.energy_counter_period_s,
            buffer_s=cfg.sampling.buffer_s,
            sensor_delay_s=self.sensor_delay_s,
        )
        self._timer = self._make_timer(backend)
        self.meter = WindowMeter(self.sampler, self._timer)
        self._restore_leftover_power_limits()
        self._phases = PhaseTracker(self.sampler) if cfg.windows.phases else None
        self.power_limit_W = self._read_power_limit_W()
        self.sampler.start()
        self._run_start_wall = time.time()
        self._run_start_s = backend.clock.now_s()
        self.meter.begin("run")
        self._started = True
        self._mark = self.meter.mark
        self._step_windows = cfg.windows.step
        fraction = cfg.windows.sample_fraction
        self._sampling = WindowSampling(
            None if fraction == "auto" else fraction,
            cfg.windows.max_overhead,
            cfg.logging.interval_steps,
            stretch_reports=not self.ranks.is_distributed,  # reports are collectives under several processes
        )
        self._skip = self._sampling.next_skip()  # the first step is drawn like any other
        self._quiet_left = 0
        self._measuring = self._dataloader_open = False
        self._new_timing_interval(time.perf_counter())
        self._phase_open = None
        self._active = True
        _LIVE_SESSIONS.add(self)
        self._sigterm.install()
        self._write(
            {
                "event": "run_start",
                "run_name": self.run_name,
                "job_id": cfg.job_id,
                "backend": backend.describe(),
                "gpu_indices": self.gpu_indices,
                "power_limit_W": self.power_limit_W,
                "read_only": backend.read_only,
                "resumed_energy_J": self._carried.energy_J,
                "wall_time": self._run_start_wall,
                "config": cfg.model_dump(mode="json"),
            }
        )
        # Optimiser hook: the batch-size bandit and power-limit cache are consulted here.
        self._start_power_limiter()
        if cfg.batch_size.enabled:
            self._start_batch_size()

    def _start_batch_size(self) -> None:
        """Start the bandit's side of the run; under several processes, share its stop rule.

        Every rank takes part in the same two collectives (when distributed): the sum of
        the GPUs' maximum power (the cost's ``MaxPower``), then the main rank's early-stop
        rule, or the error that kept it from starting, so that no rank waits alone.
        """
        assert self.backend is not None
        try:
            max_power_W = sum(self.backend.power_limit_constraints_W(i)[1] for i in self.gpu_indices)
        except BackendError:  # no limit range: the limit in force stands in for the maximum
            max_power_W = (self.power_limit_W or 1.0) * len(self.gpu_indices)
        self._stop_agreement = self._collective()
        self._converged = False
        if self._stop_agreement:
            max_power_W = sum(row[0] for row in self.ranks.gather([max_power_W]))  # MaxPower of all GPUs
        c = self.batch_size_controller
        failure: BaseException | None = None
        if c is not None:
            try:
                c.start(max_power_W, self.power_limit_W)
            except BaseException as exc:  # e.g. a corrupt store: end the run cleanly, then raise
                failure = exc
        self._stop_rule = c.rule if c is not None and failure is None else None
        if self._stop_agreement:
            try:
                self._stop_rule = self.ranks.broadcast_outcome(self._stop_rule, failure, "start the batch-size bandit")
            except BaseException as exc:
                failure = exc
            bs_cfg = self.config.batch_size
            self._cost_agreement = self._stop_rule is not None
            # Nothing can stop the run (no best cost yet, no target to stop at): no exchanges at all.
            self._stop_agreement = self._cost_agreement or (bs_cfg.target is not None and bs_cfg.stop_at_target)
        if failure is not None:
            self.exception(failure)
            raise failure
        if c is not None:
            self._write(
                {"event": "batch_size", "trial_id": c.trial_id, "batch_size": c.batch_size, "phase": c.phase,
                 "threshold_cost": c.threshold}
            )  # fmt: skip

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

    def open_backend(self) -> GPUBackend:
        """Open the configured backend now (adapters call it at setup, to fail before training).

        Raises:
            BackendUnavailable: The configured backend cannot be used here.
        """
        if self.backend is None:
            self.backend = get_backend(self.config.backend, virtual=self.config.virtual)
        return self.backend

    def _make_timer(self, backend: GPUBackend) -> BoundaryTimer:
        if backend.name in ("nvml", "amdsmi"):
            try:
                import torch

                if torch.cuda.is_available():
                    return CudaEventTimer(backend.clock)
            except Exception as exc:  # no torch, or CUDA unusable: fall back to the clock
                logger.info("zeus-callbacks: CUDA events unavailable (%s); timing windows on the CPU clock", exc)
        return ClockTimer(backend.clock)

    def _read_power_limit_W(self) -> float | None:
        assert self.backend is not None
        try:
            limits = [self.backend.power_limit_W(i) for i in self.gpu_indices]
        except BackendError as exc:
            logger.warning("zeus-callbacks: cannot read the power limit (%s)", exc)
            return None
        return sum(limits) / len(limits)

    def epoch_start(self, epoch: int) -> None:
        """Open the epoch window (and re-anchor CUDA event timing once)."""
        if not self.started:
            return
        self._take_back_quiet_steps()
        assert self.meter is not None and self._timer is not None
        self._timer.anchor()
        self._anchored_s = self.backend.clock.now_s()  # type: ignore[union-attr]
        self._epoch_index = epoch
        self._epoch_steps = 0
        self._epoch_measured = 0
        self._resume_timing()
        if self.config.windows.epoch:
            self.meter.begin("epoch", epoch=epoch)

    def step_start(self, step: int, *, phase: str | None = None) -> None:
        """Open the step window. Hot path: one clock read or CUDA event record.

        Args:
            step: The global step index.
            phase: With ``windows.phases``, the phase window the step begins with
                (``"forward"``, ``"forward_backward"``), opened at the same mark; the
                ``dataloader`` phase closes there too.
        """
        if self._quiet_left or not self._active:
            return
        # Optimiser hook: the power-limit profiler switches limits at step boundaries
        # (before the mark: the switch is no part of the step).
        if self.power_limiter is not None:
            self._power_limit_step_start(step)
        if self._skip:  # not a measured step (windows.sample_fraction)
            self._skip -= 1
            if self._dataloader_open:  # the gap after the last measured step ends here
                t0 = time.perf_counter()
                self.meter.end_at("dataloader", self._mark())  # type: ignore[union-attr]
                self._dataloader_open = False
                self._gov_hook_s += time.perf_counter() - t0
            elif not self._skip & _UNMEASURED_TIMING_MASK:
                self._time_unmeasured = True  # its step_end times itself: auto's budget covers these too
            return
        t0 = time.perf_counter()
        self._measuring = True
        meter = self.meter
        if self._phases is not None:
            token = self._mark()
            meter.end_at("dataloader", token)  # type: ignore[union-attr]
            self._dataloader_open = False
            if phase is not None:
                meter.begin_at(phase, token)  # type: ignore[union-attr]
                self._phase_open = phase
            if self._epoch_measured % 16 == 0:  # a clock read every 16 measured steps, not every step
                self._maybe_reanchor()
            if self._step_windows:
                meter.begin_at("step", token, {"step": step})  # type: ignore[union-attr]
        elif self._step_windows:
            meter.begin_at("step", self._mark(), {"step": step})  # type: ignore[union-attr]
        self._gov_hook_s += time.perf_counter() - t0

    def _power_limit_step_start(self, step: int) -> None:
        assert self.power_limiter is not None
        if self._decides_power_limit():
            self.power_limiter.on_step_start(step, self.backend.clock.now_s())  # type: ignore[union-attr]
        if self._power_limit_agreement:
            self._agree_power_limit()
        self.power_limit_W = self.power_limiter.limit_W

    def _maybe_reanchor(self) -> None:
        # Sub-sample-period phases need the GPU-CPU clock offset fresh: drift of ~10 ppm
        # would otherwise shift boundaries by a 20 ms sample within an hour-long epoch.
        now_s = self.backend.clock.now_s()  # type: ignore[union-attr]
        if now_s - self._anchored_s >= _PHASE_REANCHOR_S:
            started = time.perf_counter()
            self._timer.anchor()  # type: ignore[union-attr]  # one device sync per 30 s
            self._anchored_s = now_s
            # Most of a sync is the queued GPU work finishing, not work of ours: keep it out of the budget.
            self._gov_hook_s -= time.perf_counter() - started

    def step_end(self, step: int, *, num_samples: int | None = None, num_tokens: int | None = None) -> Decision:
        """Close the step window; every ``logging.interval_steps`` steps, queue step metrics.

        With ``windows.phases`` the open phase (e.g. ``optimizer``) closes and the
        ``dataloader`` phase opens at the step's end mark: one mark for all three.

        Args:
            step: The global step index.
            num_samples: Training samples in the step (per process), for energy per sample.
            num_tokens: Input tokens in the step, for energy per token.

        Returns:
            Whether to stop training.
        """
        if self._quiet_left:  # counted ahead by _plan_quiet_steps
            self._quiet_left -= 1
            return _CONTINUE
        if not self._active:
            return _CONTINUE
        timed = None  # perf_counter at entry when this unmeasured step is timed (auto's budget)
        if self._measuring:
            self._close_step_windows(num_samples, num_tokens)
        elif self._time_unmeasured:
            timed = time.perf_counter()
        if self.power_limiter is not None and self._decides_power_limit():
            self._power_limit_step_end(step, num_samples)
        self._epoch_steps += 1
        self._totals.steps += 1
        self._steps_since_report += 1
        self._gov_steps += 1
        if self._steps_since_report >= self._sampling.report_every:
            self._timed_report()
            timed, self._time_unmeasured = None, False  # a report is timed on its own
        if self._gov_steps >= self._sampling.report_every:
            self._observe_timing()
            timed, self._time_unmeasured = None, False  # the interval it would count in has ended
        if self._stop_agreement:
            run_steps = self._totals.steps - self._carried.steps  # since train_start: alike on every rank
            if self._cost_agreement and run_steps % self.config.batch_size.stop_agreement_steps == 0:
                self._agree_stop(None)
            decision = self._decision()
        elif self.batch_size_controller is None and self._stop_reason is None:
            decision = _CONTINUE
        else:
            decision = self._decide()
        if timed is not None:
            self._gov_unmeasured_s += time.perf_counter() - timed
            self._gov_unmeasured_timed += 1
            self._time_unmeasured = False
        if not decision.stop_training:
            self._plan_quiet_steps()
        return decision

    def _plan_quiet_steps(self) -> None:
        """Count the coming steps that need nothing from the session now, so their calls return at once.

        Under ``windows.sample_fraction`` most steps are unmeasured, and each of their
        calls runs right after a step of training with cold caches: every attribute it
        touches costs. Steps that are unmeasured, untimed, before the next report and
        timing interval, with no power limiter, bandit or stop agreement to serve, are
        counted here in one go (step counters and skips); their ``step_start`` and
        ``step_end`` then read one attribute. Any other call takes back the steps not yet
        taken (:meth:`_take_back_quiet_steps`) before it reads a counter.
        """
        skip = self._skip
        if (not skip or self._dataloader_open or self.power_limiter is not None or self._stop_agreement
                or self.batch_size_controller is not None or self._stop_reason is not None):  # fmt: skip
            return
        untimed = (skip & _UNMEASURED_TIMING_MASK or _UNMEASURED_TIMING_MASK + 1) - 1  # before the next timed step
        every = self._sampling.report_every
        count = min(untimed, every - 1 - self._steps_since_report, every - 1 - self._gov_steps)
        if count <= 0:
            return
        self._count_steps_ahead(count)
        self._quiet_left = count

    def _take_back_quiet_steps(self) -> None:
        """Uncount the planned quiet steps not yet taken: the counters then hold the steps run so far."""
        left = self._quiet_left
        if left:
            self._quiet_left = 0
            self._count_steps_ahead(-left)

    def _count_steps_ahead(self, steps: int) -> None:
        """Count ``steps`` unmeasured steps as taken (negative: take them back): the step counters and the skips."""
        self._skip -= steps
        self._epoch_steps += steps
        self._totals.steps += steps
        self._steps_since_report += steps
        self._gov_steps += steps

    def _close_step_windows(self, num_samples: int | None, num_tokens: int | None) -> None:
        """Close a measured step's windows at one end mark; draw how many steps to skip next."""
        t0 = time.perf_counter()
        meter = self.meter
        if self._phases is not None:
            token = self._mark()
            if self._step_windows:
                meter.end_at("step", token, {"num_samples": num_samples, "num_tokens": num_tokens})  # type: ignore[union-attr]
            if self._phase_open is not None:
                meter.end_at(self._phase_open, token)  # type: ignore[union-attr]
                self._phase_open = None
            meter.begin_at("dataloader", token)  # type: ignore[union-attr]  # the gap until the next step_start
            self._dataloader_open = True
        elif self._step_windows:
            meter.end_at("step", self._mark(), {"num_samples": num_samples, "num_tokens": num_tokens})  # type: ignore[union-attr]
        self._measuring = False
        self._epoch_measured += 1
        self._gov_measured += 1
        self._skip = self._sampling.next_skip()
        self._gov_hook_s += time.perf_counter() - t0

    def _timed_report(self) -> None:
        t0 = time.perf_counter()
        self._report_steps()
        self._gov_report_s += time.perf_counter() - t0

    def _observe_timing(self) -> None:
        """Give the sampling the interval's timings (steps, their time, hooks, reports); start a new interval."""
        self._take_back_quiet_steps()
        now = time.perf_counter()
        running = self._gov_t0 is not None
        busy_s = self._gov_busy_s + (now - self._gov_t0 if running else 0.0)  # type: ignore[operator]
        self._sampling.observe(
            steps=self._gov_steps, elapsed_s=busy_s, hook_s=self._gov_hook_s,
            measured=self._gov_measured, report_s=self._gov_report_s,
            unmeasured_s=self._gov_unmeasured_s, unmeasured_timed=self._gov_unmeasured_timed,
        )  # fmt: skip
        self._new_timing_interval(now if running else None)

    def _new_timing_interval(self, t0: float | None) -> None:
        """Start timing an interval for auto sampling; ``t0`` is None while paused.

        Counted: steps, measured steps, the time the steps ran (pauses excluded), the hooks'
        and the reports' time, and the time and number of the timed unmeasured steps' calls.
        """
        self._gov_steps = self._gov_measured = self._gov_unmeasured_timed = 0
        self._gov_hook_s = self._gov_busy_s = self._gov_report_s = self._gov_unmeasured_s = 0.0
        self._gov_t0 = t0

    def _pause_timing(self) -> None:
        """Training pauses (epoch end, evaluation): the pause is no step's time."""
        if self._gov_t0 is not None:
            self._gov_busy_s += time.perf_counter() - self._gov_t0
            self._gov_t0 = None

    def _resume_timing(self) -> None:
        if self._gov_t0 is None:
            self._gov_t0 = time.perf_counter()

    def _decide(self) -> Decision:
        # Optimiser hook: early stopping (cost > beta_knob x best cost) answers here.
        controller = self.batch_size_controller
        if self._stop_reason is None and controller is not None and controller.threshold is not None and self.started:
            self._stop_reason = controller.check(self._run_energy_so_far_J(), self._run_time_so_far_s())
        return self._decision()

    def _decision(self) -> Decision:
        if self._stop_reason is not None:
            return Decision(stop_training=True, reason=self._stop_reason)
        return _CONTINUE

    def _agree_stop(self, target_reason: str | None) -> None:
        """Several processes: decide early stopping together (collective, at the same step on every rank).

        Called every ``batch_size.stop_agreement_steps`` steps and at each evaluation end,
        never elsewhere, so every rank joins the same exchanges. The ranks share their
        energy and time so far and the main rank's target verdict; each then applies the
        same :class:`~zeus_callbacks.optimizers.batch_size.EarlyStopRule` to the run's
        energy (summed over GPUs) and time (the slowest rank's), so all decide alike.

        Args:
            target_reason: The main rank's reason to stop at the target (None elsewhere).
        """
        c = self.batch_size_controller
        converged = c is not None and c.converged
        rows = self.ranks.gather(
            [
                self._run_energy_so_far_J(),
                self._run_time_so_far_s(),
                1.0 if target_reason else 0.0,
                1.0 if converged else 0.0,
            ]
        )
        if any(row[2] for row in rows):
            self._stop_reason = target_reason or "target reached (decided by the main process)"
        elif any(row[3] for row in rows):
            self._converged = True  # a converged run is not stopped on cost (Zeus §4.4)
            self._cost_agreement = False
        elif self._cost_agreement and self._stop_rule is not None:
            energy_J = sum(row[0] for row in rows)
            time_s = max(row[1] for row in rows)
            self._stop_reason = self._stop_rule.reason(energy_J, time_s)
            if c is not None and self._stop_reason is not None:
                c.stop_reason = self._stop_reason  # recorded as early_stopped by the main rank
        if self._stop_reason is not None or (self._converged and not self.config.batch_size.stop_at_target):
            self._stop_agreement = self._cost_agreement = False  # nothing left to agree on

    def eval_start(self) -> None:
        """Open the evaluation window (a dataloader gap open since the last step ends unmeasured)."""
        self._take_back_quiet_steps()
        if self.started:
            self._pause_timing()
            if self._dataloader_open:  # the gap would otherwise hold the whole evaluation
                self.meter.discard("dataloader")  # type: ignore[union-attr]
                self._dataloader_open = False
        if self.started and self.power_limiter is not None:
            self.power_limiter.on_eval_start(self.backend.clock.now_s())  # type: ignore[union-attr]
        if self.started and self.config.windows.eval:
            self.meter.begin("eval")  # type: ignore[union-attr]

    def eval_end(self) -> None:
        """Close the evaluation window; its energy is reported once attributed."""
        if self.started and self.config.windows.eval:
            self.meter.end("eval")  # type: ignore[union-attr]
        if self.started and self.power_limiter is not None:
            self.power_limiter.on_eval_end(self.backend.clock.now_s())  # type: ignore[union-attr]
        if self.started:
            self._resume_timing()

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
            self._write({"event": "evaluate", "step": self._totals.steps, "metrics": numeric})
            target_reason = None
            if self.batch_size_controller is not None and self._stop_reason is None:
                target_reason = self.batch_size_controller.observe(numeric)
            if self._stop_agreement:  # several processes: every rank exchanges here
                self._agree_stop(target_reason)
                return self._decision()
            self._stop_reason = self._stop_reason or target_reason
        return self._decide()

    def epoch_end(self, epoch: int) -> dict[str, float]:
        """Close the epoch window and attribute its energy (waits ≤ 0.25 s for the sensor).

        Under DDP every rank must call it (it aggregates across ranks).

        Returns:
            The epoch metrics (also queued for :meth:`pop_metrics`).
        """
        if not self.started:
            return {}
        assert self.meter is not None and self.backend is not None
        self._take_back_quiet_steps()
        self._totals.epochs += 1
        self._pause_timing()
        self._discard_phases()
        self._epoch_sampled = (self._epoch_steps, self._epoch_measured)
        if not self.meter.end("epoch", epoch=epoch):
            self._timed_report()
            return {}
        self._flush_sensor(self.backend.clock.now_s())  # a wait, not work: not charged to the steps
        # Attribute everything now (edges past the samples, if the sensor is late, are
        # extrapolated and marked incomplete): every rank then aggregates this epoch here.
        reported = time.perf_counter()
        self._phase_summary_s = 0.0
        self._report_steps(resolve_final=True)
        # The steps' attribution is charged to them; the once-an-epoch phase summary is not.
        self._gov_report_s += time.perf_counter() - reported - self._phase_summary_s
        epoch_prefixes = ("energy/epoch", "time/epoch", "power/epoch")
        return {k: v for k, v in self._pending_metrics.items() if k.startswith(epoch_prefixes)}

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
        assert self.meter is not None and self.sampler is not None and self.backend is not None
        if status is not None:
            self._status = status
        # After a failure other ranks may never reach the same collective: stay local.
        self._collectives_ok = self._status == "completed"
        # A step cut short is not a step (its energy stays in the run total); an
        # unfinished epoch or evaluation is still measured up to now.
        self.meter.discard("step")
        self._measuring = False
        self._discard_phases()
        self._epoch_sampled = (self._epoch_steps, self._epoch_measured)
        for name in ("eval", "epoch"):
            if self.meter.is_open(name):
                if name == "epoch":  # cut short (max_steps, an interruption): measured, so counted
                    self._totals.epochs += 1
                self.meter.end(name)
        self.meter.end("run")
        try:
            self._flush_sensor(self.backend.clock.now_s())
        finally:
            self.sampler.stop()
            self._stop_power_limiter()
        self._report_steps(resolve_final=True)
        summary = self._summary()
        self._finished = summary
        if self.batch_size_controller is not None:
            try:
                t = self.batch_size_controller.finish(summary.energy_J, summary.time_s, summary.status)
                if t is not None:
                    self._write(
                        {"event": "trial", "trial_id": t.trial_id, "batch_size": t.batch_size, "status": t.status,
                         "converged": t.converged, "cost": t.cost, "stop_reason": t.info.get("stop_reason")}
                    )  # fmt: skip
            except Exception as exc:  # the run is over: a store fault must not hide its summary
                logger.warning("zeus-callbacks: cannot record the batch-size trial (%s)", exc)
        if self._exception_record is not None:
            self._write(self._exception_record)
        self._write({"event": "run_end", **summary.as_dict()})
        self._sigterm.uninstall()
        if self._writer is not None:
            self._writer.close()
        if self._given_backend is None:
            self.backend.close()
        _LIVE_SESSIONS.discard(self)
        return summary

    def exception(self, exc: BaseException | None = None) -> RunSummary | None:
        """End the run after a training failure; nothing measured so far is lost."""
        if not self.started:
            return self._finished
        # Ctrl-C, or Lightning's exception for a SIGTERM it caught: the run was stopped, not broken.
        stopped = isinstance(exc, KeyboardInterrupt) or type(exc).__name__ == "SIGTERMException"
        status = "interrupted" if stopped else "failed"
        if exc is not None:
            self._exception_record = {"event": "exception", "type": type(exc).__name__, "message": str(exc)[:500]}
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
        self.meter.begin(name, **info)  # type: ignore[union-attr]
        try:
            yield
        finally:
            self.meter.end(name)  # type: ignore[union-attr]

    # ------------------------------------------------------- step phases (windows.phases)
    def phase_begin(self, name: str) -> None:
        """Open phase window ``name`` (one of :data:`~zeus_callbacks.measurement.phases.PHASES`).

        A no-op unless ``windows.phases`` is on and the step is measured
        (``windows.sample_fraction``). Hot path: one clock read or CUDA event record.
        ``dataloader`` is opened and closed by :meth:`step_end` / :meth:`step_start` themselves;
        where one phase ends as the next begins, :meth:`phase_switch` takes one mark for both.
        """
        if self._measuring and self._phases is not None:  # most steps: unmeasured, one read
            t0 = time.perf_counter()
            self.meter.begin_at(name, self._mark())  # type: ignore[union-attr]
            self._phase_open = name
            self._gov_hook_s += time.perf_counter() - t0

    def phase_end(self, name: str) -> None:
        """Close phase window ``name`` (a no-op unless ``windows.phases`` is on, or if it is not open)."""
        if self._measuring and self._phases is not None and self.meter.is_open(name):  # type: ignore[union-attr]
            t0 = time.perf_counter()
            self.meter.end_at(name, self._mark())  # type: ignore[union-attr]
            if self._phase_open == name:
                self._phase_open = None
            self._gov_hook_s += time.perf_counter() - t0

    def phase_switch(self, ended: str, begun: str) -> None:
        """End phase ``ended`` and begin phase ``begun`` at one shared mark (they tile the step exactly).

        A no-op unless ``windows.phases`` is on and the step is measured; ``ended`` need not be open.
        """
        if self._measuring and self._phases is not None:  # most steps: unmeasured, one read
            t0 = time.perf_counter()
            meter = self.meter
            token = self._mark()
            meter.end_at(ended, token)  # type: ignore[union-attr]
            meter.begin_at(begun, token)  # type: ignore[union-attr]
            self._phase_open = begun
            self._gov_hook_s += time.perf_counter() - t0

    def phase_discard(self, name: str) -> None:
        """Drop an open phase window unmeasured (e.g. no optimizer step after this micro-batch)."""
        if self._measuring and self._phases is not None:  # most steps: unmeasured, one read
            self.meter.discard(name)  # type: ignore[union-attr]
            if self._phase_open == name:
                self._phase_open = None

    def _discard_phases(self) -> None:
        if self._phases is not None:
            for name in PHASES:
                self.meter.discard(name)  # type: ignore[union-attr]
            self._phase_open = None
            self._dataloader_open = False

    def _queue_phase_metrics(self, epoch: Any, epoch_energy_J: float) -> None:
        """Per-phase energy of the epoch (this process's GPUs), from the superposed phase windows."""
        assert self._phases is not None
        steps, measured = self._epoch_sampled
        started = time.perf_counter()
        stats = self._phases.epoch_summary(measured_fraction=measured / steps if measured and steps else 1.0)
        self._phase_summary_s = time.perf_counter() - started
        if not stats:
            return
        explained = sum(p.total_J for p in stats) / epoch_energy_J if epoch_energy_J > 0 else math.nan
        for p in stats:
            self._pending_metrics[metric.phase_key(p.name)] = p.energy_J
            self._pending_metrics[metric.phase_key(p.name, "ci_low")] = p.energy_ci_J[0]
            self._pending_metrics[metric.phase_key(p.name, "ci_high")] = p.energy_ci_J[1]
            self._pending_metrics[metric.phase_key(p.name, "count")] = float(p.executions)
        self._pending_metrics[metric.PHASES_EXPLAINED] = explained
        self._write(
            {
                "event": "phases",
                "epoch": epoch,
                "phases": [dataclasses.asdict(p) for p in stats],
                "explained": explained,
                "epoch_energy_J": epoch_energy_J,
            }
        )

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
        return metrics

    def totals(self) -> dict[str, float]:
        """The run's energy and time so far: ``energy/total_J``, ``time/total_s``.

        Under several processes, during the run: the energy of all GPUs and the slowest
        rank's time as of the last step report (the same on every rank); before the first
        report, this rank's own.
        """
        if self._finished is not None:
            return {metric.TOTAL_ENERGY_J: self._finished.energy_J, metric.TOTAL_TIME_S: self._finished.time_s}
        if not self.started:
            return {}
        if self._ranks_totals is not None:
            energy_J, time_s = self._ranks_totals
            return {metric.TOTAL_ENERGY_J: energy_J, metric.TOTAL_TIME_S: time_s}
        return self._local_totals()

    def _local_totals(self) -> dict[str, float]:
        return {metric.TOTAL_ENERGY_J: self._run_energy_so_far_J(), metric.TOTAL_TIME_S: self._run_time_so_far_s()}

    def progress_bar_metrics(self) -> dict[str, float]:
        """The short metrics shown on a progress bar (run energy in kJ)."""
        totals = self.totals()
        if not totals:
            return {}
        return {metric.PROGRESS_BAR_ENERGY: round(totals[metric.TOTAL_ENERGY_J] / 1e3, 3)}

    @property
    def summary(self) -> RunSummary | None:
        """The run summary once :meth:`train_end` has run."""
        return self._finished

    @property
    def degraded(self) -> bool:
        """True when a sensor fault (here or, under DDP, on another rank) made the measurement incomplete."""
        return self._peer_degraded or (self.sampler is not None and self.sampler.health.degraded)

    # ------------------------------------------------------------- resume support
    def state_dict(self) -> dict[str, Any]:
        """Totals to carry across a checkpoint resume."""
        self._take_back_quiet_steps()
        measured = self.started or self._finished is not None
        t = self._totals if measured else self._carried
        # This rank's own totals while running (a resume adds the ranks' figures again).
        totals = self._local_totals() if self.started else self.totals() if measured else {}
        energy_J = totals.get(metric.TOTAL_ENERGY_J, t.energy_J)
        time_s = totals.get(metric.TOTAL_TIME_S, t.time_s)
        return {
            "energy_J": energy_J,
            "time_s": time_s,
            "steps": t.steps,
            "measured_steps": t.measured_steps,
            "epochs": t.epochs,
            "step_energy_J": t.step_energy_J,
            "step_time_s": t.step_time_s,
            "epoch_energy_J": list(t.epoch_energy_J),
            "run_name": self.run_name,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Carry totals from a checkpoint into the next :meth:`train_start` (unknown keys ignored)."""
        self._carried = _Totals(
            energy_J=float(state.get("energy_J", 0.0)),
            time_s=float(state.get("time_s", 0.0)),
            steps=int(state.get("steps", 0)),
            measured_steps=int(state.get("measured_steps", state.get("steps", 0))),
            epochs=int(state.get("epochs", 0)),
            step_energy_J=float(state.get("step_energy_J", 0.0)),
            step_time_s=float(state.get("step_time_s", 0.0)),
            epoch_energy_J=[float(e) for e in state.get("epoch_energy_J", [])],
        )

    # ------------------------------------------------------------ power limits
    def _restore_leftover_power_limits(self) -> None:
        """Put back limits a killed run left changed (its marker file is still there)."""
        assert self.backend is not None
        cfg = self.config
        try:
            pl.restore_from_marker(pl.marker_path(cfg.logging.log_dir, cfg.power_limit.restore_marker), self.backend)
        except BackendError as exc:
            logger.error("zeus-callbacks: cannot restore the power limits an earlier run left (%s)", exc)
        except pl.NotAMarker as exc:  # kept: it may hold the only record of the original limits
            logger.error(
                "zeus-callbacks: %s; it was left untouched, and this run will not change power limits "
                "while it is there (check the GPU's limit, then move the file away)",
                exc,
            )

    def _start_power_limiter(self) -> None:
        cfg = self.config
        self._power_limit_agreement = self._power_limit_follower = False
        if not cfg.power_limit.enabled:
            return
        assert self.backend is not None
        try:
            self.power_limiter = self._make_power_limiter()
        except BackendError as exc:
            logger.warning("zeus-callbacks: power-limit profiling is off: the limits cannot be read (%s)", exc)
        if self._collective():
            # Every rank must take part in the per-step agreement, or none may.
            ready = self.ranks.gather([1.0 if self.power_limiter is not None else 0.0])
            if not all(row[0] for row in ready):
                if self.power_limiter is not None:
                    logger.warning("zeus-callbacks: power-limit profiling is off: another rank cannot profile")
                self.power_limiter = None
            self._power_limit_agreement = self.power_limiter is not None
            self._power_limit_follower = self._power_limit_agreement and self.ranks.process_index != 0

    def _decides_power_limit(self) -> bool:
        """Under DDP the main rank's profiler decides; the other ranks follow it."""
        return not self._power_limit_follower

    def _agree_power_limit(self) -> None:
        """Under DDP, make every rank run the same limit from this step on (collective).

        The main rank's profiler decides from its own GPU's measurements (with identical
        GPUs, its per-GPU cost ranks the limits as the summed cost does); each step while
        it profiles, every rank takes its limit. Observe mode anywhere (no permission,
        read-only) becomes observe mode everywhere.
        """
        limiter = self.power_limiter
        assert limiter is not None
        done = limiter.profiler.finished or limiter.observe
        rows = self.ranks.gather([limiter.limit_W, 1.0 if done else 0.0, 1.0 if limiter.observe else 0.0])
        target_W, main_done, _ = rows[0]
        if any(row[2] for row in rows):
            limiter.enter_observe("another rank cannot change its power limit")
            self._power_limit_agreement = False
            return
        if self.ranks.process_index != 0:
            limiter.apply(target_W)
        if main_done:
            self._power_limit_agreement = False  # settled: no more exchanges; followers keep the limit

    def _make_power_limiter(self) -> pl.PowerLimitController:
        cfg = self.config
        assert self.backend is not None
        return pl.PowerLimitController(
            cfg.power_limit,
            self.backend,
            self.gpu_indices,
            self._energy_between_J,
            log_dir=cfg.logging.log_dir,
            job_id=cfg.job_id,
            world_size=launcher_world_size(),
            is_main_process=self.is_main_process,
            run_name=self.run_name or "run",
            cache=self._profile_cache(),
        )

    def _profile_cache(self) -> pl.ProfileCache | None:
        """The store as the profile cache (``power_limit.cache_in: store``), else None (the JSON file)."""
        cfg = self.config
        if cfg.power_limit.cache_in != "store":
            return None
        return StoreProfileCache(cfg.store.location(cfg.logging.log_dir), cfg.store.backend,
                                 lease_grace_s=cfg.store.lease_grace_s)

    def _stop_power_limiter(self) -> None:
        if self.power_limiter is not None:
            if self._decides_power_limit():
                unfinished = self.power_limiter.unfinished(self._totals.steps)
                if unfinished is not None:
                    self._write_power_limit_profile(unfinished)
            self.power_limiter.restore()
            self.power_limit_W = self._read_power_limit_W()

    def _energy_between_J(self, start_s: float, end_s: float) -> float | None:
        """Energy (J) of the measured GPUs in [start_s, end_s]; None until samples cover end_s."""
        assert self.sampler is not None and self.backend is not None
        latest = self.sampler.latest_sample_s()
        if (latest is None or latest - self.sensor_delay_s < end_s) and _is_manual(self.backend):
            self.sampler.poll_once(read_counter=False)
            latest = self.sampler.latest_sample_s()
        if latest is None or latest - self.sensor_delay_s < end_s:
            self.sampler.request_poll()
            return None
        total = 0.0
        for index in self.gpu_indices:
            knots, cumulative = self.sampler.cumulative_energy(index)
            total += float(interval_energy_J(knots, cumulative, [start_s], [end_s])[0])
        return total

    def _power_limit_step_end(self, step: int, num_samples: int | None) -> None:
        assert self.power_limiter is not None and self.backend is not None
        result = self.power_limiter.on_step_end(step, self.backend.clock.now_s(), num_samples)
        self.power_limit_W = self.power_limiter.limit_W
        if result is None:
            return
        if result.chosen_limit_W is not None:
            self._pending_metrics[metric.POWER_LIMIT_CHOSEN_W] = result.chosen_limit_W
            if self.batch_size_controller is not None:  # the trial records the limit it trained at
                self.batch_size_controller.record_power_limit(result.chosen_limit_W)
        self._pending_metrics[metric.POWER_LIMIT_PROFILING_STEPS] = float(result.profiling_steps)
        self._write_power_limit_profile(result)

    def _write_power_limit_profile(self, result: pl.PowerLimitResult) -> None:
        assert self.power_limiter is not None
        self._write(
            {
                "event": "power_limit_profile",
                "step": self._totals.steps,
                "source": result.source,
                "objective": result.objective,
                "chosen_limit_W": result.chosen_limit_W,
                "original_limit_W": self.power_limiter.original_W,
                "profiling_steps": result.profiling_steps,
                "fallback_sweep": result.fallback_sweep,
                "limits": result.rows,
                "finished": result.finished,
                "message": result.message,
            }
        )

    # ------------------------------------------------------------------ internals
    def _flush_sensor(self, until_s: float) -> None:
        """Poll until samples cover ``until_s`` (bounded wait), and read the counter."""
        assert self.sampler is not None and self.backend is not None
        deadline = time.monotonic() + _EPOCH_FLUSH_TIMEOUT_S
        delay = self.sensor_delay_s
        read_counter = True  # once: a counter read costs 3-5 ms on an H200
        while True:
            self.sampler.poll_once(read_counter=read_counter)
            read_counter = False
            latest = self.sampler.latest_sample_s()
            if latest is not None and latest - delay >= until_s:
                return
            if time.monotonic() >= deadline or self.backend.clock.now_s() <= until_s and _is_manual(self.backend):
                return
            time.sleep(0.005)

    def _report_steps(self, *, resolve_final: bool = False) -> None:
        """Attribute closed windows and queue their metrics.

        Step and phase windows are attributed and aggregated in bulk (arrays, no object
        per window); the rare others (epoch, eval, run, user windows) one record each.
        """
        assert self.meter is not None
        self._take_back_quiet_steps()
        records, batch = self.meter.resolve_bulk(_BULK_WINDOWS, final=resolve_final)
        if batch is not None:
            self._absorb_bulk(batch)
        for record in records:
            self._absorb(record)
        if (self._steps_since_report or self._unreported_steps) and self.power_limit_W is not None:
            # The limit in force, with the step metrics or without them (no step measured: windows.sample_fraction).
            self._pending_metrics[metric.POWER_LIMIT_W] = self.power_limit_W
        self._steps_unlogged += self._steps_since_report
        self._steps_since_report = 0
        if self._unreported_steps or self._collective():
            self._queue_step_metrics()
        if resolve_final and self._steps_unlogged:  # the last steps, none of them measured: still counted
            self._write_steps_record({}, [], self.ranks.num_processes)

    def _absorb_bulk(self, batch: WindowBatch) -> None:
        """Take one report's step and phase windows (close order) into the totals and the phase tracker."""
        is_step = batch.names == "step"
        steps = batch if is_step.all() else batch.select(is_step)
        if steps.size:
            self._unreported_steps.append(steps)
            self._totals.measured_steps += steps.size
            self._totals.step_energy_J += float(steps.energy_J.sum())
            self._totals.step_time_s += float(steps.time_s.sum())
        if self._phases is not None and steps.size < batch.size:
            self._phases.add_batch(batch.select(~is_step))

    def _absorb(self, record: WindowRecord) -> None:
        """Take one window other than a step or a phase (those go through :meth:`_absorb_bulk`)."""
        if record.name == "epoch":
            self._queue_epoch_metrics(record)
        elif record.name == "eval":
            self._pending_metrics[metric.EVAL_ENERGY_J] = record.energy_J
            self._pending_metrics[metric.EVAL_TIME_S] = record.time_s
            self._write({"event": "eval", "energy_J": record.energy_J, "time_s": record.time_s})
        elif record.name == "run":
            self._run_record = record
        else:
            self._pending_metrics[metric.window_energy_key(record.name)] = record.energy_J
            self._write(
                {"event": "window", "name": record.name, "energy_J": record.energy_J, "time_s": record.time_s}
            )

    def _collective(self) -> bool:
        return self.ranks.is_distributed and self._collectives_ok

    def _gather(self, values: list[float]) -> list[list[float]]:
        """Every rank's ``values`` plus a degraded flag (collective under DDP, else local)."""
        local = [*values, 1.0 if self.degraded else 0.0]
        rows = self.ranks.gather(local) if self._collective() else [local]
        if any(row[-1] for row in rows) and not self.degraded:
            self._peer_degraded = True  # one rank's fault: the same degraded mode everywhere
        return [row[:-1] for row in rows]

    def _queue_step_metrics(self) -> None:
        batches = self._unreported_steps
        self._unreported_steps = []
        count = sum(b.size for b in batches)
        samples = [v for b in batches for v in b.info_values("num_samples")]
        tokens = [v for b in batches for v in b.info_values("num_tokens")]
        local = [
            sum(float(b.energy_J.sum()) for b in batches),
            sum(float(b.time_s.sum()) for b in batches),
            float(count),
            float(sum(samples)) if count and all(samples) else math.nan,
            float(sum(tokens)) if count and all(tokens) else math.nan,
            float(sum(int(b.num_power_samples.sum()) for b in batches)),
        ]
        if self._collective():  # the running totals travel with the report: every rank shows the run's
            local += [self._run_energy_so_far_J(), self._run_time_so_far_s()]
        # One rank's row per GPU group; combine per step: energy and power sum over
        # ranks, time is the slowest rank's.
        gathered = self._gather(local)
        if self._collective():
            self._ranks_totals = (sum(row[6] for row in gathered), max(row[7] for row in gathered))
            gathered = [row[:6] for row in gathered]
        rows = [row for row in gathered if row[2] > 0]  # ranks with steps attributed this time
        if not rows:
            return
        step_J = sum(E / n for E, _, n, *_ in rows)
        samples_per_step = sum(S / n for _, _, n, S, *_ in rows)
        tokens_per_step = sum(K / n for _, _, n, _, K, _ in rows)
        values = {
            metric.STEP_ENERGY_J: step_J,
            metric.STEP_COUNT: min(n for _, _, n, *_ in rows),
            metric.STEP_POWER_SAMPLES: sum(row[5] for row in rows),
            metric.STEP_TIME_S: max(T / n for _, T, n, *_ in rows),
            metric.MEAN_POWER_W: sum(E / T for E, T, *_ in rows if T > 0),
        }
        if math.isfinite(samples_per_step) and samples_per_step > 0:
            values[metric.ENERGY_PER_SAMPLE_J] = step_J / samples_per_step
        if math.isfinite(tokens_per_step) and tokens_per_step > 0:
            values[metric.ENERGY_PER_TOKEN_J] = step_J / tokens_per_step
        self._pending_metrics.update(values)
        self._write_steps_record(values, batches if count else [], len(gathered))

    def _write_steps_record(self, values: dict[str, float], batches: list[WindowBatch], ranks: int) -> None:
        """The JSONL ``steps`` record: the means in ``values`` (empty: no step measured) and every step taken."""
        steps_taken, self._steps_unlogged = self._steps_unlogged, 0
        self._write(
            {
                "event": "steps",
                "last_step": batches[-1].info(-1).get("step") if batches else None,
                "count": int(values.get(metric.STEP_COUNT, 0)),
                "steps": steps_taken,
                "energy_J_mean": values.get(metric.STEP_ENERGY_J),
                "time_s_mean": values.get(metric.STEP_TIME_S),
                "power_W_mean": values.get(metric.MEAN_POWER_W),
                "energy_J_per_sample": values.get(metric.ENERGY_PER_SAMPLE_J),
                "energy_J_per_token": values.get(metric.ENERGY_PER_TOKEN_J),
                "power_samples": int(values.get(metric.STEP_POWER_SAMPLES, 0)),
                "complete": all(bool(b.complete.all()) for b in batches),
                "power_limit_W": self.power_limit_W,
                "ranks": ranks,
                "degraded": self.degraded,
            }
        )

    def _queue_epoch_metrics(self, record: WindowRecord) -> None:
        local_counter_J = self._counter_energy_J(record.start_s, record.end_s)
        rows = self._gather(
            [
                record.energy_J,
                record.time_s,
                math.nan if local_counter_J is None else local_counter_J,
                *record.gpu_energy_J,
            ]
        )
        energy_J = sum(row[0] for row in rows)
        time_s = max(row[1] for row in rows)
        counter_J = sum(row[2] for row in rows)
        gpu_energy_J = [e for row in rows for e in row[3:]]
        self._totals.epoch_energy_J.append(energy_J)
        values = {
            metric.EPOCH_ENERGY_J: energy_J,
            metric.EPOCH_TIME_S: time_s,
            metric.EPOCH_MEAN_POWER_W: energy_J / time_s if time_s > 0 else math.nan,
        }
        if len(gpu_energy_J) > 1:
            values.update({metric.gpu_energy_key(i): e for i, e in enumerate(gpu_energy_J)})
        if math.isfinite(counter_J):
            values[metric.EPOCH_COUNTER_ENERGY_J] = counter_J
            gap = abs(counter_J - energy_J) / max(counter_J, 1e-9)
            if time_s >= 5.0 and gap > 0.15:
                logger.warning(
                    "zeus-callbacks: epoch %s energy from power samples (%.1f J) and from the energy "
                    "counter (%.1f J) differ by %.0f%%",
                    record.info.get("epoch"),
                    energy_J,
                    counter_J,
                    100 * gap,
                )
        self._pending_metrics.update(values)
        if self._phases is not None:
            self._queue_phase_metrics(record.info.get("epoch"), record.energy_J)
        self._write(
            {
                "event": "epoch",
                "epoch": record.info.get("epoch"),
                "energy_J": energy_J,
                "counter_energy_J": counter_J if math.isfinite(counter_J) else None,
                "time_s": time_s,
                "power_W_mean": values[metric.EPOCH_MEAN_POWER_W],
                "gpu_energy_J": gpu_energy_J,
                "power_samples": record.num_power_samples,
                "complete": record.complete,
                "ranks": len(rows),
                "degraded": self.degraded,
            }
        )

    def _counter_energy_J(self, start_s: float, end_s: float) -> float | None:
        assert self.sampler is not None
        total = 0.0
        for index in self.gpu_indices:
            times, readings = self.sampler.counter_readings(index)
            energy = counter_energy_J(times, readings, start_s, end_s)
            if energy is None:
                return None
            total += energy
        return total

    def _run_energy_so_far_J(self) -> float:
        assert self.sampler is not None and self._run_start_s is not None and self.backend is not None
        if self.sampler.latest_sample_s() is None:
            self.sampler.poll_once(read_counter=False)  # early in the run: read once, off the step path
        now_s = self.backend.clock.now_s()
        total = 0.0
        for index in self.gpu_indices:
            knots, cumulative = self.sampler.cumulative_energy(index)
            if len(knots) >= 2:
                # Samples lag the present: the nearest power stands in for the gaps, as in
                # the run window that gives the final total.
                total += float(extrapolated_energy_J(knots, cumulative, [self._run_start_s], [now_s])[0])
        return self._carried.energy_J + total

    def _run_time_so_far_s(self) -> float:
        assert self.backend is not None and self._run_start_s is not None
        return self._carried.time_s + self.backend.clock.now_s() - self._run_start_s

    def _summary(self) -> RunSummary:
        assert self.backend is not None and self.sampler is not None
        run = self._run_record
        t = self._totals
        local_counter_J = self._counter_energy_J(run.start_s, run.end_s) if run else None
        rows = self._gather(
            [
                run.energy_J if run else 0.0,
                run.time_s if run else 0.0,
                math.nan if local_counter_J is None else local_counter_J,
                t.step_energy_J / t.measured_steps if t.measured_steps else math.nan,
                t.step_time_s / t.measured_steps if t.measured_steps else math.nan,
                *(run.gpu_energy_J if run else ()),
            ]
        )
        # Energy sums over GPUs (ranks); time is the slowest rank's.
        energy_J = self._carried.energy_J + sum(row[0] for row in rows)
        time_s = self._carried.time_s + max(row[1] for row in rows)
        counter_J = sum(row[2] for row in rows)
        return RunSummary(
            run_name=self.run_name or "",
            status=self._status,
            backend=self.backend.describe(),
            energy_J=energy_J,
            time_s=time_s,
            steps=t.steps,
            epochs=t.epochs,
            mean_power_W=energy_J / time_s if time_s > 0 else math.nan,
            step_energy_J=sum(row[3] for row in rows),
            step_time_s=max(row[4] for row in rows),
            epoch_energy_J=list(t.epoch_energy_J),
            power_limit_W=self.power_limit_W,
            counter_energy_J=self._carried.energy_J + counter_J if math.isfinite(counter_J) else None,
            faults=dict(self.sampler.health.faults),
            jsonl_path=str(self._writer.path) if self._writer is not None else None,
            world_size=len(rows),
            gpu_energy_J=[e for row in rows for e in row[5:]],
            degraded=self.degraded,
        )

    def _write(self, record: dict[str, Any]) -> None:
        if self._writer is not None:
            try:
                self._writer.write(record)
            except OSError as exc:  # a full disk must not stop training
                logger.warning("zeus-callbacks: cannot write the energy log (%s); logging stops", exc)
                self._writer = None


def _is_manual(backend: GPUBackend) -> bool:
    from zeus_callbacks.backends.base import ManualClock

    return isinstance(backend.clock, ManualClock)


_LIVE_SESSIONS: weakref.WeakSet[EnergySession] = weakref.WeakSet()


@atexit.register
def _end_live_sessions() -> None:
    """At interpreter exit, end runs that never saw train_end (their log gets a summary)."""
    for session in list(_LIVE_SESSIONS):
        try:
            session.train_end(status="interrupted")
        except Exception:  # pragma: no cover - best effort at exit
            pass
