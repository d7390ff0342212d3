"""The batch-size glue of the session: the bandit's start, its suggestion, early stopping and the trial.

:class:`BatchSizeSteps` talks to the batch-size controller (Zeus, NSDI '23 §4.2-4.4): it starts the
recurrence's trial (under several processes, sharing the main rank's early-stop rule), suggests the
batch size, hands the step scheduler its per-step stop decision, decides early stopping (with the
other ranks, when there are several) and records the trial at the end.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from zeus_callbacks.backends import BackendError
from zeus_callbacks.config import ZeusConfig
from zeus_callbacks.optimizers.batch_size import BatchSizeController, EarlyStopRule, SuggestedBatchSize
from zeus_callbacks.reporting import RunSummary
from zeus_callbacks.session import _agreement as agreement
from zeus_callbacks.session import _log_records as records
from zeus_callbacks.session._aggregate import RankAggregator
from zeus_callbacks.session._run import StartedRun
from zeus_callbacks.session._scheduler import CONTINUE, Decision
from zeus_callbacks.store import TrialRecord
from zeus_callbacks.store._run_store import RunStore

logger = logging.getLogger(__name__)


class BatchSizeSteps:
    """The session's batch-size part: the bandit's controller and the stop decision.

    Args:
        config: The session's configuration.
        is_main_process: Only the main process talks to the store.
        run_store: The run's store (the bandit's trials).
        on_step_decision: Called with the per-step stop decision whenever it changes (None:
            nothing can stop the run); the session hands it to the step scheduler.
        so_far: The run's (energy in J, time in s) so far, on this process.
        steps_this_run: Steps since train start.

    Attributes:
        batch_size_controller: The controller of the recurrence's trial (None:
            ``batch_size.enabled`` is false, or not the main process).
    """

    def __init__(
        self,
        config: ZeusConfig,
        *,
        is_main_process: bool,
        run_store: RunStore,
        on_step_decision: Callable[[Callable[[], Decision] | None], None],
        so_far: Callable[[], tuple[float, float]],
        steps_this_run: Callable[[], int],
    ) -> None:
        self._config = config
        self._on_step_decision = on_step_decision
        self._so_far = so_far
        self._steps_this_run = steps_this_run
        self._run: StartedRun | None = None  # the started run (its log)
        self._running = False  # between start and the trial's record at the end
        self._ranks: RankAggregator
        self.batch_size_controller = (
            BatchSizeController(config, run_store) if config.batch_size.enabled and is_main_process else None
        )
        self._stop_reason: str | None = None
        self._reported: set[str] = set()  # the metric names this run's evaluations reported (the main process)
        self._target_pending: str | None = None  # a target reached at an evaluation not every rank ran
        self._followed_batch_size: int | None = None  # not the main process: the main's suggestion
        self._stops = agreement.StopAgreement()  # several processes, bandit on: stop decisions are exchanged
        self._prepare_failure: BaseException | None = None  # what kept prepare() from opening the trial
        self._store_open_s: float | None = None  # how long prepare() spent on the store (s, backend clock)
        self._max_power_W = 0.0  # the cost's MaxPower, agreed by prepare() (W, all GPUs)
        self._refresh_step_decision()

    @property
    def stop_rule(self) -> EarlyStopRule | None:
        """The early-stop rule in force (the main rank's, on every rank under several processes)."""
        return self._stops.rule

    def record_power_limit(self, limit_W: float) -> None:
        """The power-limit profiler chose ``limit_W`` (W): the trial records the limit it trained at."""
        if self.batch_size_controller is not None:
            self.batch_size_controller.record_power_limit(limit_W)

    def evaluated(self, metrics: dict[str, float], *, every_rank: bool = True) -> Decision:
        """After an evaluation of a started run: the batch-size target is checked (with the ranks, if several).

        ``every_rank``: every rank ran this evaluation and calls this (the stop exchange is a collective).
        Otherwise no rank is waited on: a target reached here goes with the next exchange every rank makes.
        """
        target_reason = None
        if self.batch_size_controller is not None:
            self._reported.update(metrics)
            # Observed after a stop too: the evaluation that follows a cost stop may reach the
            # target, and the trial then counts as converged (its batch size stays a candidate).
            target_reason = self.batch_size_controller.observe(metrics)
            if self._stop_reason is not None:
                target_reason = None  # already stopping: the first reason stands
        if self._stops.active and not every_rank:  # the other ranks may not be here: no exchange
            self._target_pending = self._target_pending or target_reason
            return self._decision()
        if self._stops.active:  # several processes: every rank exchanges here
            self._agree_stop(target_reason or self._target_pending)
            return self._decision()
        self._stop_reason = self._stop_reason or target_reason
        self._refresh_step_decision()
        return self.decide()

    def record_trial(self, summary: RunSummary, *, failure: str | None = None) -> None:
        """At the end: record the recurrence's trial in the store (and the log).

        A run whose energy is unknown (resumed from a checkpoint saved before any power sample) is
        recorded with its status and no energy: not an observation of its batch size, and not
        left ``running`` for the next open to mark failed. ``failure``: the exception that ended a
        run that did not complete, in short (:func:`~zeus_callbacks.session._log_records.exception_in_short`).
        """
        self._running = False
        if self.batch_size_controller is not None:
            energy_note = None
            if not math.isfinite(summary.energy_J):
                energy_note = summary.energy_note or "the run's energy is unknown"
                logger.warning(
                    "zeus-callbacks: the run's energy is unknown (%s): its batch-size trial is recorded without "
                    "a cost, not as an observation of its batch size",
                    energy_note,
                )
            try:
                t = self.batch_size_controller.finish(
                    summary.energy_J, summary.time_s, summary.status, degraded=summary.degraded,
                    energy_note=energy_note, error=failure,
                )  # fmt: skip
                if t is not None and self._run is not None:
                    self._run.log.write(records.trial_record(t))
                if t is not None:
                    self._warn_target_unreported(t)
            except Exception as exc:  # the run is over: a store fault must not hide its summary
                logger.warning("zeus-callbacks: cannot record the batch-size trial (%s)", exc)

    def _warn_target_unreported(self, trial: TrialRecord) -> None:
        """A trial recorded without the target's metric ever reported (misnamed, or no evaluation): say so, once.

        The trial is recorded as not converged, and its arm may be pruned, whatever the model reached.
        """
        target = self._config.batch_size.target
        if target is None or target.metric in self._reported or trial.status not in ("completed", "early_stopped"):
            return
        names = sorted(self._reported)
        seen = f"its evaluations reported {', '.join(names[:10])}{', ...' if len(names) > 10 else ''}"
        logger.warning(
            "zeus-callbacks: batch_size.target names metric %s, but this run never reported it (%s), so trial %d "
            "(batch size %d) is recorded as not converged: report %s from an evaluation inside the run "
            "(docs/batch_size.md)",
            target.metric,
            seen if names else "no evaluation reported any metric",
            trial.trial_id,
            trial.batch_size,
            target.metric,
        )

    def prepare(self, run: StartedRun, ranks: RankAggregator, power_limit_W: float | None) -> None:
        """Before the run's measurement opens: the bandit's store work, then the cost's ``MaxPower``.

        The main process opens the store, draws (or claims) the suggestion and reads what the early-stop
        threshold needs (:meth:`~zeus_callbacks.optimizers.batch_size.BatchSizeController.open_trial`)
        here, before the run window: a store another process holds makes it wait up to
        ``store.lock_timeout_s`` with no training done, and that wait belongs to neither the run's energy
        and time nor the trial's cost, which is made of them. How long it took goes into the
        ``batch_size`` record (``store_open_s``). Then every rank takes part in the first collective
        (when distributed), the sum of the GPUs' maximum power: no rank's run opens before the main
        process is through with the store. An error is kept for :meth:`start`, which shares it.

        Args:
            run: The run, not started yet.
            ranks: The processes of the run.
            power_limit_W: The power limit in force (W), standing in for a GPU's maximum where the
                backend has no limit range.
        """
        self._run, self._ranks = run, ranks
        self._prepare_failure = None
        c = self.batch_size_controller
        clock = run.backend.clock
        began_s = clock.now_s()
        if c is not None:
            try:
                c.open_trial()
            except BaseException as exc:  # e.g. a corrupt store: the run starts, ends cleanly, then raises
                self._prepare_failure = exc
        self._store_open_s = clock.now_s() - began_s if c is not None else None
        try:
            max_power_W = sum(run.backend.power_limit_constraints_W(i)[1] for i in run.gpu_indices)
        except BackendError:  # no limit range: the limit in force stands in for the maximum
            max_power_W = (power_limit_W or 1.0) * len(run.gpu_indices)
        if ranks.collective:
            max_power_W = agreement.agree_max_power_W(ranks.ranks, max_power_W)  # MaxPower of all GPUs
        self._max_power_W = max_power_W

    def start(self, power_limit_W: float | None) -> BaseException | None:
        """Start the bandit's side of the run (after :meth:`prepare`); under several processes, share its stop rule.

        Every rank takes part in the same collective (when distributed): the main rank's early-stop
        rule, or the error that kept it from starting, so that no rank waits alone. No store is used
        here (:meth:`prepare` did), so nothing in the run's window waits for one.

        Args:
            power_limit_W: The power limit in force once the power-limit part has started (W),
                recorded with the trial.

        Returns:
            The error that kept the bandit from starting (e.g. a corrupt store), which the session
            raises once it has ended the run cleanly; None when it started.
        """
        run = self._run
        assert run is not None, "prepare() comes first"
        self._running = True
        agreed = self._ranks.collective
        self._stops = agreement.StopAgreement()
        c = self.batch_size_controller
        failure = self._prepare_failure
        if c is not None and failure is None:
            try:
                c.start(self._max_power_W, power_limit_W)
            except BaseException as exc:  # e.g. a corrupt store: end the run cleanly, then raise
                failure = exc
        rule = c.rule if c is not None and failure is None else None
        self._stops.rule = rule
        if agreed:
            try:
                rule = agreement.share_stop_rule(self._ranks.ranks, rule, failure)
            except BaseException as exc:
                failure = exc
            bs_cfg = self._config.batch_size
            self._stops.start(rule, target_set=bs_cfg.target is not None, stop_at_target=bs_cfg.stop_at_target)
        self._refresh_step_decision()
        if failure is None and c is not None:
            run.log.write(records.batch_size_record(c, store_open_s=self._store_open_s))
        return failure

    def suggest_batch_size(self, suggested: SuggestedBatchSize | None = None) -> int | None:
        """The batch size for this recurrence (:meth:`~zeus_callbacks.session.EnergySession.suggest_batch_size`)."""
        if self.batch_size_controller is not None:
            return self.batch_size_controller.suggest(suggested)
        made = (
            None if suggested is None or not self._config.batch_size.enabled else suggested.claim(self._config.job_id)
        )
        if made is not None and self._followed_batch_size is None:
            self._followed_batch_size = None if made.suggestion is None else made.suggestion.batch_size
        return self._followed_batch_size

    def use_batch_size(self, batch_size: int) -> None:
        """Tell the bandit which batch size the run really uses (when it differs from the suggestion)."""
        if self.batch_size_controller is not None:
            self.batch_size_controller.use_batch_size(batch_size)

    def withdraw_trial(self, reason: str) -> None:
        """At the end, withdraw the run's trial rather than record it (its batch size is not known)."""
        if self.batch_size_controller is not None:
            self.batch_size_controller.withdraw(reason)

    def _refresh_step_decision(self) -> None:
        """Set the per-step stop decision hook from the stop state (None: nothing can stop the run)."""
        if self._stops.active:
            self._on_step_decision(self._agreed_step_decision)
        elif self.batch_size_controller is None and self._stop_reason is None:
            self._on_step_decision(None)
        else:
            self._on_step_decision(self.decide)

    def _agreed_step_decision(self) -> Decision:
        if self._stops.cost and self._steps_this_run() % self._config.batch_size.stop_agreement_steps == 0:
            self._agree_stop(self._target_pending)
        return self._decision()

    def decide(self) -> Decision:
        """The stop decision now (early stopping: cost > beta_knob x best cost, checked while the run goes on)."""
        controller = self.batch_size_controller
        running = self._running
        if self._stop_reason is None and controller is not None and controller.threshold is not None and running:
            self._stop_reason = controller.check(*self._so_far())
        return self._decision()

    def _decision(self) -> Decision:
        return CONTINUE if self._stop_reason is None else Decision(stop_training=True, reason=self._stop_reason)

    def _agree_stop(self, target_reason: str | None) -> None:
        """Several processes: decide early stopping together (:func:`~._agreement.exchange_stop`).

        Args:
            target_reason: The main rank's reason to stop at the target (None elsewhere).
        """
        self._target_pending = None  # a target seen at an evaluation of this rank alone goes with this exchange
        c = self.batch_size_controller
        energy_J, time_s = self._so_far()
        verdict = agreement.exchange_stop(
            self._ranks.ranks,
            self._stops,
            energy_J=energy_J,
            time_s=time_s,
            target_reason=target_reason,
            converged=c is not None and c.converged,
            stop_at_target=self._config.batch_size.stop_at_target,
        )
        if verdict.reason is not None:
            self._stop_reason = verdict.reason
            if verdict.on_cost and c is not None and self._stop_reason is not None:
                c.stop_agreed(self._stop_reason)
        self._refresh_step_decision()
