"""The power-limit glue of the session: the profiler's step boundaries, its agreement across ranks, its records.

:class:`PowerLimitSteps` is the part of :class:`~zeus_callbacks.session.EnergySession`
that drives the power-limit controller (Zeus, NSDI '23 §4.3): it restores limits a killed
run left changed, starts the controller (and, under several processes, makes every rank
run the main rank's limit), sets the :class:`~zeus_callbacks.session.scheduler.StepScheduler`
power hooks, writes the ``power_limit_profile`` records and restores the limits at the end.
Like the step path, it is a base class of the session: its hooks are bound methods of
the object the step calls are made on (no attribute chain on the step path).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from zeus_callbacks import reporting as metric
from zeus_callbacks.backends import BackendError
from zeus_callbacks.distributed import launcher_world_size
from zeus_callbacks.errors import UnsafeFile
from zeus_callbacks.optimizers import power_limit as pl
from zeus_callbacks.optimizers.batch_size import BatchSizeController
from zeus_callbacks.session import agreement, records
from zeus_callbacks.session.part import SessionPart
from zeus_callbacks.store.profile_cache import StoreProfileCache

logger = logging.getLogger(__name__)


class PowerLimitSteps(SessionPart):
    """The session's power-limit part: the profiler's controller, the limit in force, the chosen limit.

    Attributes:
        power_limiter: The power-limit controller of the run (None: ``power_limit.enabled``
            is false, the limits cannot be read, or another rank cannot profile).
        power_limit_W: The limit in force on this process's first GPU (W; None before
            :meth:`~zeus_callbacks.session.EnergySession.train_start` or where unreadable).
    """

    # The batch-size part's (the trial records the limit it trained at).
    batch_size_controller: BatchSizeController | None

    def __init__(self) -> None:
        super().__init__()
        self.power_limiter: pl.PowerLimitController | None = None
        self.power_limit_W: float | None = None
        self._chosen_power_limit: tuple[float, int, bool] | None = None  # (W, from step, applied)
        self._carried_power_limit: dict[str, Any] | None = None  # a checkpoint's profile so far
        self._power_limit_agreement = False  # DDP: exchange the limit at each step start
        self._power_limit_follower = False  # DDP, not the main rank: apply the main rank's limits

    # ------------------------------------------------------------------ the run
    def _open_power_limits(self) -> None:
        """At train start: put back limits a killed run left changed, then read the limit in force."""
        self._chosen_power_limit = None
        self._restore_leftover_power_limits()
        self.power_limit_W = self.run.read_power_limit_W()

    def _power_limit_eval_start(self) -> None:
        """An evaluation begins: it is excluded from profiling."""
        if self.power_limiter is not None:
            self.power_limiter.on_eval_start(self.run.backend.clock.now_s())

    def _power_limit_eval_end(self) -> None:
        """The evaluation ended: profiling goes on."""
        if self.power_limiter is not None:
            self.power_limiter.on_eval_end(self.run.backend.clock.now_s())

    def _power_limit_state(self, *, measured: bool) -> dict[str, Any] | None:
        """The profile so far for a checkpoint (``measured``: a run started), else the carried one."""
        if self.power_limiter is not None and self._decides_power_limit() and measured:
            return self.power_limiter.export_state()
        return self._carried_power_limit

    def _carry_power_limit(self, state: Mapping[str, Any]) -> None:
        """Keep a checkpoint's profile so far for the next run (none in ``state``: profile from the start)."""
        profile = state.get("power_limit")
        self._carried_power_limit = dict(profile) if isinstance(profile, Mapping) else None

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
        limiter = self.power_limiter
        self._write(
            records.power_limit_profile_record(
                self._totals.steps, result, limiter.original_W, time_note=limiter.time_note()
            )
        )
