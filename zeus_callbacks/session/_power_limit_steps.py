"""The power-limit glue of the session: the profiler's step boundaries, its agreement across ranks, its records.

:class:`PowerLimitSteps` drives the power-limit controller (Zeus, NSDI '23 §4.3): it restores limits a
killed run left changed, starts the controller (under several processes, every rank runs the main
rank's limit), hands the step scheduler its step hooks, writes the ``power_limit_profile`` records and
restores the limits at the end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal

from zeus_callbacks import reporting as metric
from zeus_callbacks._distributed import launcher_world_size
from zeus_callbacks.backends import BackendError
from zeus_callbacks.config import ZeusConfig
from zeus_callbacks.errors import UnsafeFile
from zeus_callbacks.optimizers import power_limit as pl
from zeus_callbacks.session import _agreement as agreement
from zeus_callbacks.session import _log_records as records
from zeus_callbacks.session._aggregate import RankAggregator
from zeus_callbacks.session._run import StartedRun
from zeus_callbacks.session._state import Totals
from zeus_callbacks.store._run_store import RunStore
from zeus_callbacks.store.profile_cache import StoreProfileCache

StepHooks = tuple[Callable[[int], None] | None, Callable[[int, int | None], None] | None]
"""(step start, step end) hooks for the step scheduler; None where there is nothing to do."""

JobStepsSource = Literal["config", "trainer", "train_start"]
"""Where the job length given to the search came from: ``power_limit.job_steps``, a framework
integration (Lightning, the HF Trainer), or the caller of ``train_start(job_steps=...)``."""


def job_length(
    configured: int | None, given: int | None, given_by: JobStepsSource
) -> tuple[int | None, JobStepsSource | None]:
    """The job length (training steps) the power-limit search uses and where it came from; (None, None): unknown.

    ``configured`` (``power_limit.job_steps``) wins over ``given`` (from ``train_start``; None or ≤ 0:
    unknown), which ``given_by`` passed.
    """
    if configured is not None:
        return configured, "config"
    return (given, given_by) if given is not None and given > 0 else (None, None)


logger = logging.getLogger(__name__)


class PowerLimitSteps:
    """The session's power-limit part: the profiler's controller, the limit in force, the chosen limit.

    Args:
        config: The session's configuration.
        is_main_process: Whether this process writes the profile cache and the log.
        run_store: The run's store (the profile cache with ``power_limit.cache_in: store``).
        pending_metrics: The session's queue of metrics for the loggers (this part adds to it).
        on_chosen: Called with the chosen limit (W) once the profiler has chosen (the batch-size trial records it).

    Attributes:
        power_limiter: The power-limit controller of the run (None: ``power_limit.enabled``
            is false, the limits cannot be read, or another rank cannot profile).
        power_limit_W: The limit in force on this process's first GPU (W; None before
            :meth:`~zeus_callbacks.session.EnergySession.train_start` or where unreadable).
        chosen: (W, from step, applied) of the profiler's choice in this run, or None.
    """

    def __init__(
        self,
        config: ZeusConfig,
        *,
        is_main_process: bool,
        run_store: RunStore,
        pending_metrics: dict[str, float],
        on_chosen: Callable[[float], None],
    ) -> None:
        self._config = config
        self._is_main_process = is_main_process
        self._run_store = run_store
        self._pending_metrics = pending_metrics
        self._on_chosen = on_chosen
        self._run: StartedRun
        self._ranks: RankAggregator
        self._totals = Totals()
        self._job_steps: int | None = None  # the job length the search uses (None: unknown)
        self._job_steps_source: JobStepsSource | None = None  # where it came from (for the record)
        self.power_limiter: pl.PowerLimitController | None = None
        self.power_limit_W: float | None = None
        self.chosen: tuple[float, int, bool] | None = None  # (W, from step, applied)
        self._carried_power_limit: dict[str, Any] | None = None  # a checkpoint's profile so far
        self._power_limit_agreement = False  # DDP: exchange the limit at each step start
        self._power_limit_follower = False  # DDP, not the main rank: apply the main rank's limits

    # ------------------------------------------------------------------ the run
    def open(self, run: StartedRun) -> None:
        """At train start: put back limits a killed run left changed, then read the limit in force."""
        self._run = run
        self.chosen = None
        self._restore_leftover_power_limits()
        self.power_limit_W = self._run.read_power_limit_W()

    def eval_start(self) -> None:
        """An evaluation begins: it is excluded from profiling."""
        if self.power_limiter is not None:
            self.power_limiter.on_eval_start(self._run.backend.clock.now_s())

    def state(self, *, measured: bool) -> dict[str, Any] | None:
        """The profile so far for a checkpoint (``measured``: a run started), else the carried one."""
        if self.power_limiter is not None and self._decides_power_limit() and measured:
            return self.power_limiter.export_state()
        return self._carried_power_limit

    def carry(self, state: Mapping[str, Any]) -> None:
        """Keep a checkpoint's profile so far for the next run (none in ``state``: profile from the start)."""
        profile = state.get("power_limit")
        self._carried_power_limit = dict(profile) if isinstance(profile, Mapping) else None

    def _restore_leftover_power_limits(self) -> None:
        """Put back limits a killed run left changed (its marker file is still there; its owner is dead)."""
        cfg = self._config
        try:
            for marker in pl.marker_paths(cfg.logging.log_dir, cfg.power_limit.restore_marker):  # and the old name
                pl.restore_from_marker(marker, self._run.backend)  # logs what it did per GPU, or why not
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

    def start(
        self,
        ranks: RankAggregator,
        totals: Totals,
        *,
        job_steps: int | None = None,
        job_steps_source: JobStepsSource = "train_start",
    ) -> StepHooks:
        """Start the controller (after :meth:`open`); under several processes, every rank or none profiles.

        ``totals``' step count dates the records; ``job_steps`` (None: unknown; ``job_steps_source`` gave it)
        is the job length unless ``power_limit.job_steps`` is set. Returns the scheduler's step hooks.
        """
        self._ranks, self._totals = ranks, totals
        cfg = self._config
        self._job_steps, self._job_steps_source = job_length(cfg.power_limit.job_steps, job_steps, job_steps_source)
        self._power_limit_agreement = self._power_limit_follower = False
        if cfg.power_limit.enabled:
            try:
                self.power_limiter = self._make_power_limiter()
            except BackendError as exc:
                logger.warning("zeus-callbacks: power-limit profiling is off: the limits cannot be read (%s)", exc)
            if self._ranks.collective:
                # Every rank must take part in the per-step agreement, or none may.
                if not agreement.every_rank_ready(self._ranks.ranks, self.power_limiter is not None):
                    if self.power_limiter is not None:
                        logger.warning("zeus-callbacks: power-limit profiling is off: another rank cannot profile")
                    self.power_limiter = None
                self._power_limit_agreement = self.power_limiter is not None
                self._power_limit_follower = self._power_limit_agreement and self._ranks.ranks.process_index != 0
        carried = self._carried_power_limit
        if self.power_limiter is not None and carried is not None and self._decides_power_limit():
            limiter = self.power_limiter
            if limiter.resume(carried) and limiter.result is not None and limiter.result.chosen_limit_W is not None:
                self._chose(limiter.result.chosen_limit_W, from_step=self._totals.steps)  # from this run's first step
        has_limiter = self.power_limiter is not None
        return (
            self._power_limit_step_start if has_limiter else None,
            self._power_limit_step_end if has_limiter and self._decides_power_limit() else None,
        )

    def _decides_power_limit(self) -> bool:
        """Under DDP the main rank's profiler decides; the other ranks follow it."""
        return not self._power_limit_follower

    def _power_limit_step_start(self, step: int) -> None:
        limiter = self.power_limiter
        assert limiter is not None
        if self._decides_power_limit():
            limiter.on_step_start(step, self._run.backend.clock.now_s())
        if self._power_limit_agreement:
            self._agree_power_limit(limiter)
        self.power_limit_W = limiter.limit_W

    def _agree_power_limit(self, limiter: pl.PowerLimitController) -> None:
        """Under DDP, make every rank run the main rank's limit from this step on (collective).

        The main rank decides from its own GPU alone: with identical GPUs, its per-GPU cost ranks the
        limits as the summed cost does.
        """
        verdict = agreement.exchange_power_limit(
            self._ranks.ranks,
            limiter.limit_W,
            done=limiter.profiler.finished or limiter.observe,
            observe=limiter.observe,
        )
        if verdict.observe_everywhere:
            limiter.enter_observe("another rank cannot change its power limit")
            self._power_limit_agreement = False
            return
        if self._ranks.ranks.process_index != 0:
            limiter.apply(verdict.target_W)
        if verdict.settled:
            self._power_limit_agreement = False  # settled: no more exchanges; followers keep the limit

    def _make_power_limiter(self) -> pl.PowerLimitController:
        cfg = self._config
        run = self._run
        settings = cfg.power_limit
        if settings.job_steps != self._job_steps:  # the framework's length (a configured one wins)
            settings = settings.model_copy(update={"job_steps": self._job_steps})
        return pl.PowerLimitController(
            settings,
            run.backend,
            run.gpu_indices,
            run.energy_between_J,
            log_dir=cfg.logging.log_dir,
            job_id=cfg.job_id,
            world_size=launcher_world_size(),
            is_main_process=self._is_main_process,
            run_name=run.run_name or "run",
            cache=StoreProfileCache(self._run_store) if cfg.power_limit.cache_in == "store" else None,  # else JSON
        )

    def stop(self) -> None:
        """At the end: record an unfinished profile, restore the limits, read the limit in force.

        The restore never depends on the profile: a failure choosing or writing it is logged
        and the limits go back all the same.
        """
        if self.power_limiter is None:
            return
        try:
            if self._decides_power_limit():
                unfinished = self.power_limiter.unfinished(self._totals.steps)
                if unfinished is not None:
                    self._write_power_limit_profile(unfinished)
        except Exception:  # a defect in the choice must not leave a GPU at a trial limit
            logger.exception("zeus-callbacks: cannot record the unfinished power-limit profile; restoring the limits")
        finally:
            self.power_limiter.restore()
        self.power_limit_W = self._run.read_power_limit_W()

    def _chose(self, limit_W: float, *, from_step: int) -> None:
        """Record the limit chosen, in force from ``from_step`` (observe mode: chosen, never applied).

        The summary says it; the batch-size trial records the limit it trained at.
        """
        assert self.power_limiter is not None
        self.chosen = (limit_W, from_step, not self.power_limiter.observe)
        self._on_chosen(limit_W)

    def _power_limit_step_end(self, step: int, num_samples: int | None) -> None:
        assert self.power_limiter is not None
        result = self.power_limiter.on_step_end(step, self._run.backend.clock.now_s(), num_samples)
        self.power_limit_W = self.power_limiter.limit_W
        if result is None:
            return
        if result.chosen_limit_W is not None:
            self._pending_metrics[metric.POWER_LIMIT_CHOSEN_W] = result.chosen_limit_W
            self._chose(result.chosen_limit_W, from_step=self._totals.steps + 1)  # in force from the next step on
        self._pending_metrics[metric.POWER_LIMIT_PROFILING_STEPS] = float(result.profiling_steps)
        self._write_power_limit_profile(result)

    def _write_power_limit_profile(self, result: pl.PowerLimitResult) -> None:
        assert self.power_limiter is not None
        limiter = self.power_limiter
        self._run.log.write(
            records.power_limit_profile_record(
                self._totals.steps,
                result,
                limiter.original_W,
                time_note=limiter.time_note(),
                job_steps=self._job_steps,
                job_steps_source=self._job_steps_source,
            )
        )
