"""One recurrence of a job under the batch-size bandit: what the session delegates to.

:class:`BatchSizeController` owns the store and the bandit for one training run: it suggests the
batch size, watches the target metric, decides early stopping from the cost so far, and records the
trial at the end; nothing here knows about a framework. :func:`suggest_batch_size` suggests before
the data loaders exist::

    >>> from zeus_callbacks import suggest_batch_size           # doctest: +SKIP
    >>> bs = suggest_batch_size("zeus.yaml")                    # doctest: +SKIP
    >>> args = TrainingArguments("out", per_device_train_batch_size=bs)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import math
import os
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from zeus_callbacks._atomic_io import write_json_atomic
from zeus_callbacks._distributed import RankGroup
from zeus_callbacks.config import ZeusConfig, load_config, parse_config
from zeus_callbacks.errors import ConfigError, StoreError, StoreUnavailableError
from zeus_callbacks.optimizers.batch_size._bandit import BatchSizeBandit, Suggestion
from zeus_callbacks.optimizers.batch_size._bandit_settings import BanditSettings
from zeus_callbacks.optimizers.cost import ZeusCost
from zeus_callbacks.store import Store, TrialRecord, open_configured_store, store_location
from zeus_callbacks.store._base import this_host
from zeus_callbacks.store._run_store import RunStore

logger = logging.getLogger(__name__)

MIN_CHECK_INTERVAL_S = 0.5
"""Early stopping looks at the cost at most this often (s of run time): checking every step of a fast loop buys
nothing but overhead."""


UNCLAIMED_REASON = "withdrawn: no run claimed the suggestion (it was dropped, or its process ended first)"
REPLACED_REASON = "withdrawn: a later suggest_batch_size() of the job in the same process replaced it"


def withdraw_suggestion(store: Store, trial_id: int, reason: str) -> TrialRecord | None:
    """Withdraw the ``running`` trial of a suggestion no run claimed: status ``withdrawn``, ``info["reason"]``.

    A withdrawn trial is neither an observation nor a failure of its batch size; left ``running``, it
    would be marked failed once its process ended, and count against its batch size.

    Returns:
        The withdrawn trial; None when it is not running any more (or not in the store).
    """
    trial = store.get_trial(trial_id)
    if trial is None or trial.status != "running":
        return None
    return store.finish_trial(
        trial_id, status="withdrawn", energy_J=None, time_s=None, cost=None, converged=False, info={"reason": reason}
    )


def _withdraw_and_close(store: Store, trial_id: int, pid: int, reason: str) -> TrialRecord | None:
    """Withdraw an unclaimed suggestion's trial and close its store (a finalizer: never raises a store error)."""
    if os.getpid() != pid:  # a forked child's copy: the trial and the store are its parent's
        return None
    try:
        withdrawn = withdraw_suggestion(store, trial_id, reason)
        if withdrawn is not None:
            logger.info("zeus-callbacks: trial %d of job %s %s", trial_id, withdrawn.job_id, reason)
        return withdrawn
    except StoreError as exc:
        logger.warning(
            "zeus-callbacks: cannot withdraw trial %d, a suggestion no run claimed (%s); the store marks it "
            "failed once its process has ended",
            trial_id,
            exc,
        )
        return None
    finally:
        store.close()


@dataclass
class _Made:
    """What :func:`suggest_batch_size` made for a job, until the run claims it (or it is withdrawn)."""

    job_id: str
    batch_size: int
    suggestion: Suggestion | None = None  # None: made without the store (it could not be reached)
    store: Store | None = None  # the store the suggestion was made in, still open: the run goes on with it
    detached: str | None = None  # why there is no suggestion
    state: Literal["unclaimed", "claimed", "withdrawn"] = "unclaimed"

    def __post_init__(self) -> None:
        # Never claimed (the object dropped, the process ending): its trial is withdrawn, its store closed.
        self._finalizer: weakref.finalize | None = None
        if self.store is not None and self.suggestion is not None:
            args = (self.store, self.suggestion.trial_id, os.getpid(), UNCLAIMED_REASON)
            self._finalizer = weakref.finalize(self, _withdraw_and_close, *args)
        elif self.store is not None:
            self._finalizer = weakref.finalize(self, self.store.close)

    def claimed(self) -> _Made:
        if self._finalizer is not None:
            self._finalizer.detach()  # the run reports into the trial and closes the store
        self.state = "claimed"
        return self

    def withdraw(self, reason: str) -> TrialRecord | None:
        """Withdraw the unclaimed trial now (what the finalizer does at exit), with ``reason``."""
        self.state = "withdrawn"
        detached = None if self._finalizer is None else self._finalizer.detach()
        if detached is None or detached[1] is not _withdraw_and_close:
            return None
        store, trial_id, pid, _ = detached[2]
        return _withdraw_and_close(store, trial_id, pid, reason)


_UNCLAIMED: weakref.WeakValueDictionary[str, _Made] = weakref.WeakValueDictionary()
"""The latest unclaimed suggestion of each job in this process: a later :func:`suggest_batch_size` withdraws it."""


class SuggestedBatchSize(int):
    """The batch size :func:`suggest_batch_size` returns: an ``int`` that carries its trial to the run.

    Pass it on as ``TrainingArguments(per_device_train_batch_size=...)``: the
    :class:`~zeus_callbacks.integrations.huggingface.ZeusTrainerCallback` claims the trial
    (and the store it was made in, still open) from there when training begins, or give it
    to :meth:`~zeus_callbacks.session.EnergySession.suggest_batch_size`. It is claimed once;
    copies and pickles are plain ints. One that no run claims is withdrawn (:func:`withdraw_suggestion`)
    and its store closed when it is garbage-collected or the process ends, or when a later
    :func:`suggest_batch_size` of the same job in this process replaces it (:attr:`withdrawn`).
    """

    _made: _Made | None

    def __new__(cls, made: _Made) -> SuggestedBatchSize:  # noqa: D102
        self = super().__new__(cls, made.batch_size)
        self._made = made
        return self

    def __reduce__(self) -> tuple[type[int], tuple[int]]:
        return (int, (int(self),))  # the trial stays with this object

    @property
    def withdrawn(self) -> bool:
        """Whether its trial was withdrawn (a later suggestion of its job replaced it): a run given it makes its own."""
        return self._made is not None and self._made.state == "withdrawn"

    def claim(self, job_id: str) -> _Made | None:
        """Take the trial for a run of ``job_id`` (None: claimed before, withdrawn, or made for another job)."""
        made = self._made
        if made is None or made.job_id != job_id or made.state != "unclaimed":
            return None
        self._made = None
        return made.claimed()


def _withdraw_earlier(job_id: str) -> None:
    """Withdraw this process's unclaimed suggestion of ``job_id``, if any, with a warning (a new one replaces it)."""
    earlier = _UNCLAIMED.pop(job_id, None)
    if earlier is None or earlier.state != "unclaimed" or earlier.suggestion is None:
        return
    logger.warning(
        "zeus-callbacks: suggest_batch_size() was called again for job %s in this process; its earlier "
        "suggestion (batch size %d, trial %d), which no run claimed, is withdrawn: hand the run the value the "
        "latest call returns, as it is (TrainingArguments(per_device_train_batch_size=...) for the Hugging Face "
        "Trainer, measure(config, batch_size=...) for a raw loop)",
        job_id,
        earlier.batch_size,
        earlier.suggestion.trial_id,
    )
    earlier.withdraw(REPLACED_REASON)


def unclaimed_suggestion(job_id: str) -> Suggestion | None:
    """This process's latest suggestion of ``job_id`` that no run has claimed yet (None: there is none)."""
    made = _UNCLAIMED.get(job_id)
    return None if made is None or made.state != "unclaimed" else made.suggestion


PENDING_DIR = "zeus_pending_trials"


def pending_dir(config: ZeusConfig) -> Path:
    """Where trials wait that the store could not take (``<log_dir>/zeus_pending_trials``)."""
    return Path(config.logging.log_dir) / PENDING_DIR


def open_job_store(config: ZeusConfig) -> Store:
    """Open the store ``config.store`` names (default ``<log_dir>/zeus_store.<ext>``), merging waiting trials.

    With the bandit on, the trials an earlier run of this job could not record (the store locked or
    down) are recorded now from their files in :func:`pending_dir` (:func:`merge_pending_trials`).

    Raises:
        StoreUnavailableError: The store cannot be reached now (locked, a database down).
        StoreError: The store cannot be opened (corrupt, newer schema, refused credentials).
    """
    store = open_configured_store(config.store, config.logging.log_dir)
    if config.batch_size.enabled:  # pending files are bandit trials: merging them needs its settings
        merge_pending_trials(store, config)
    return store


def run_store(config: ZeusConfig) -> RunStore:
    """The store handle of one run of ``config`` (opened on first use by :func:`open_job_store`)."""
    return RunStore(lambda: open_job_store(config))


_ORPHAN_REASONS = ("process died", "lease expired")  # what the store's dead-trial scan writes in info["reason"]

_after_merge_hook: Callable[[Path], None] | None = None
"""Test hook, called after a pending file's trial is merged (committed) and before the file is removed."""


def merge_pending_trials(store: Store, config: ZeusConfig) -> int:
    """Record in ``store`` the waiting trials of ``config.job_id`` (see :func:`open_job_store`).

    A pending file of another store or job is left for its own store; one that cannot be merged now
    stays for the next open. A trial the store marked failed meanwhile ("process died") gets its real
    outcome. A run that trained without the store gets a trial at the batch size it trained at: an
    observation of that arm that does not move the pruning on (the bandit did not choose it).

    Idempotent: the store records each file's ``pending_id`` with the merged trial, in the same
    transaction, so a file merged again (its merger died before removing it) adds nothing.

    Returns:
        How many trials were merged.
    """
    folder = pending_dir(config)
    if not folder.is_dir():
        return 0
    merged = 0
    for path in sorted(folder.glob("*.json")):
        try:
            pending = json.loads(path.read_text(encoding="utf-8"))
            if pending.get("store") != store.location or pending.get("job_id") != config.job_id:
                continue
            # A file written before pending ids existed has none: its name (pid and a random part) is as stable.
            pending_id = str(pending.get("pending_id") or path.stem)
            merged += _merge_one(store, config, path, pending, pending_id)
            if _after_merge_hook is not None:
                _after_merge_hook(path)
            path.unlink()
        except StoreError as exc:
            logger.warning(
                "zeus-callbacks: cannot merge the pending trial %s yet (%s); kept for the next open", path, exc
            )
            break
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("zeus-callbacks: pending trial file %s is unreadable (%s); left as it is", path, exc)
    return merged


def _merge_one(store: Store, config: ZeusConfig, path: Path, pending: dict[str, Any], pending_id: str) -> bool:
    """Record the outcome kept in ``path`` (see :func:`merge_pending_trials`); False: nothing to merge."""
    detached = pending.get("trial_id") is None  # trained without the store: no trial yet
    outcome = dict(pending["report"])
    late = "be reached at train start" if detached else "take it at train end"
    outcome["info"] = {
        **(outcome.get("info") or {}),
        "reason": f"recorded late from {path.name}: the store could not {late}",
    }
    if detached:
        info = {"round": None, "detached": str(pending.get("detached") or ""), "host": str(pending.get("host") or "")}
        # Created with the file's id: a second merge of the file gets this same trial back, not a new one.
        trial = store.create_trial(
            config.job_id,
            int(pending["batch_size"]),
            outcome.get("power_limit_W"),
            info=info,
            pid=int(pending["pid"]),
            pending_id=pending_id,
        )
    else:
        found = store.get_trial(int(pending["trial_id"]))
        if found is None:
            logger.warning(
                "zeus-callbacks: pending trial file %s names trial %s, which store %s does not hold; removed",
                path,
                pending["trial_id"],
                store.location,
            )
            return False
        trial = found
    # Running, or failed by the dead-trial scan, the trial holds no outcome yet (a detached run's trial has the
    # file's id from its creation); else it holds this file's (merged before) or its real one (the write committed).
    finished = trial.status != "running" and trial.info.get("reason") not in _ORPHAN_REASONS
    if finished and trial.pending_id == pending_id:
        logger.info(
            "zeus-callbacks: trial %d of job %s already holds the outcome kept in %s (merged before); "
            "the file is removed",
            trial.trial_id,
            config.job_id,
            path,
        )
        return False
    if finished and not detached:
        return False
    bandit = BatchSizeBandit(store, config.job_id, BanditSettings.from_config(config.batch_size))
    bandit.report(trial.trial_id, **outcome, pending_id=pending_id)
    logger.info("zeus-callbacks: merged trial %d of job %s kept in %s", trial.trial_id, config.job_id, path)
    return True


def _detached_warning(exc: Exception, config: ZeusConfig) -> None:
    logger.warning(
        "zeus-callbacks: %s; training at default_batch_size %d without the bandit's suggestion: at the "
        "run's end its trial is written to %s and recorded when the store is next opened",
        exc,
        config.batch_size.default_batch_size,
        pending_dir(config),
    )


def suggest_batch_size(
    config: ZeusConfig | Mapping[str, Any] | str | Path | None,
    *,
    cpu: bool | None = None,
    ddp_backend: str | None = None,
    ddp_timeout_s: float | None = None,
) -> SuggestedBatchSize:
    """Batch size for this recurrence of ``config.job_id`` (call before building data loaders).

    Records the recurrence's trial in the store; the value returned carries it to the run
    (:class:`SuggestedBatchSize`). A store that cannot be reached (after ``store.lock_timeout_s``)
    does not stop the run: every process gets ``batch_size.default_batch_size`` (one warning) and
    the run's trial is recorded when the store is next opened.

    Under a launcher (``WORLD_SIZE`` > 1) call it on **every** process, before
    ``TrainingArguments``: it joins the launcher's process group
    (:meth:`~zeus_callbacks._distributed.RankGroup.from_launcher`), the main process alone
    opens the store and suggests, and every process returns that same batch size. The keyword
    arguments are those given to ``TrainingArguments``, so that the group is the Trainer's.

    Args:
        config: A ZeusConfig, a mapping of settings, or the path of a YAML file.
        cpu: As ``TrainingArguments(use_cpu=...)``; default: True without CUDA.
        ddp_backend: As ``TrainingArguments(ddp_backend=...)``; default: accelerate's choice.
        ddp_timeout_s: As ``TrainingArguments(ddp_timeout=...)`` (s); default 1800.

    Returns:
        The batch size; ``batch_size.default_batch_size`` (carrying no trial) when the bandit is disabled.

    Raises:
        ConfigError: Invalid configuration, or the bandit off (``batch_size.enabled`` false) and no
            ``batch_size.default_batch_size``: the message names the file and the keys to set.
        StoreError: The store cannot be opened (on the main process): corrupt, newer schema,
            refused credentials.
        RuntimeError: Under a launcher, on the other processes, when the main process
            failed to suggest (so that no process waits for a suggestion that never comes).
    """
    cfg = load_config(config) if isinstance(config, (str, Path)) else parse_config(config)
    bs_cfg = cfg.batch_size
    if not bs_cfg.enabled:
        if bs_cfg.default_batch_size is None:
            source = config if isinstance(config, (str, Path)) else "the configuration given"
            raise ConfigError(
                f"suggest_batch_size() has no batch size in {source}: the bandit is off (batch_size.enabled is "
                "false). Set batch_size.enabled: true with batch_size.batch_sizes and batch_size.default_batch_size "
                "(docs/batch_size.md), or batch_size.default_batch_size alone to train at that size"
            )
        return SuggestedBatchSize(_Made(cfg.job_id, bs_cfg.default_batch_size))
    ranks = RankGroup.from_launcher(cpu=cpu, backend=ddp_backend, timeout_s=ddp_timeout_s)
    made: _Made | None = None
    failure: BaseException | None = None
    if ranks.process_index == 0:
        try:
            _withdraw_earlier(cfg.job_id)
            made = _suggest_from_store(cfg)
            if made.suggestion is not None:
                _UNCLAIMED[cfg.job_id] = made
        except StoreUnavailableError as exc:  # an unreachable store must not keep the run from training
            _detached_warning(exc, cfg)
            made = _Made(cfg.job_id, int(bs_cfg.default_batch_size), detached=str(exc))  # type: ignore[arg-type]
        except Exception as exc:
            if not ranks.is_distributed:
                raise
            failure = exc  # raised after the broadcast, which the other ranks are waiting in
    if ranks.is_distributed:  # the open store stays on the main process
        shared = None if made is None else (made.batch_size, made.suggestion, made.detached)
        batch_size, suggestion, detached = ranks.broadcast_outcome(shared, failure, "suggest a batch size")
        if made is None:
            made = _Made(cfg.job_id, batch_size, suggestion, detached=detached)
    assert made is not None
    return SuggestedBatchSize(made)


def _suggest_from_store(cfg: ZeusConfig) -> _Made:
    store = open_job_store(cfg)
    try:
        suggestion = BatchSizeBandit(store, cfg.job_id, BanditSettings.from_config(cfg.batch_size)).suggest()
    except BaseException:
        store.close()
        raise
    return _Made(cfg.job_id, suggestion.batch_size, suggestion, store)


@dataclass(frozen=True)
class EarlyStopRule:
    """Early stopping of a costly recurrence (Zeus, NSDI '23, §4.4).

    Picklable: the main process sends it to the other ranks at train start, and every rank applies
    it to the same aggregated energy and time.

    Attributes:
        cost: The run's cost function (``MaxPower`` of all GPUs).
        threshold_cost: The cost past which the run stops (J-equivalent).
        explore: Whether the threshold is the exploring-run stop
            (:meth:`~zeus_callbacks.optimizers.batch_size.BatchSizeBandit.explore_stop_threshold`)
            rather than a factor × the best converged cost.
        factor_name: The setting whose factor × the best converged cost is the threshold
            (``beta_knob``, ``prune_cost_ratio`` or ``prune_cost_ratio_no_descent``;
            :meth:`~zeus_callbacks.optimizers.batch_size.BatchSizeBandit.early_stop_factor`);
            unused when ``explore``.
        factor: That factor's value; None when not known (the reason then gives no value).
    """

    cost: ZeusCost
    threshold_cost: float
    explore: bool = False
    factor_name: str = "beta_knob"
    factor: float | None = None

    def reason(self, energy_J: float, time_s: float) -> str | None:
        """Why the run stops, or None while the cost of ``energy_J`` (J) over ``time_s`` (s) is within bounds.

        An unknown cost (NaN energy or time) stops nothing: a run is never stopped on a cost it has not shown.
        """
        cost = self.cost(energy_J, time_s)
        if not cost > self.threshold_cost:  # NaN included
            return None
        if self.explore:
            return (
                f"cost {cost:.4g} exceeds the best arm's mean + explore_stop_z noise sd = {self.threshold_cost:.4g} "
                "(exploring run stopped, censored)"
            )
        factor = self.factor_name if self.factor is None else f"{self.factor_name} {self.factor:g}"
        why = ", Zeus §4.4" if self.factor_name == "beta_knob" else " of a pruning candidate: its direction ends"
        return f"cost {cost:.4g} exceeds {factor} x best cost = {self.threshold_cost:.4g} (early stop{why})"


class BatchSizeController:
    """The batch-size side of one training run.

    Args:
        config: The whole configuration (``batch_size`` must be enabled).
        store: The run's store handle, shared with the rest of the run (the session passes its
            own and closes it at train end); default one of the controller's own, closed by
            :meth:`finish`.

    Attributes:
        suggestion: The run's suggestion (batch size, trial id) once made.
        converged: Whether the target was reached, at any evaluation (one after an early stop included).
        stop_reason: Why the run was stopped early, if it was.
        batch_size: The batch size the run really uses (the suggestion unless told otherwise).
        withdraw_reason: Why the trial is withdrawn at :meth:`finish` rather than recorded (the run's
            batch size is unknown), if it is.
    """

    def __init__(self, config: ZeusConfig, store: RunStore | None = None) -> None:
        self.config = config
        self._owns_store = store is None
        self.run_store = run_store(config) if store is None else store
        self.settings = BanditSettings.from_config(config.batch_size)
        self.suggestion: Suggestion | None = None
        self.batch_size: int | None = None
        self.converged = False
        self.best_target_value: float | None = None  # the best value of the target metric an evaluation gave
        self.stop_reason: str | None = None
        self.cost: ZeusCost | None = None
        self.threshold: float | None = None
        self.explore_stop = False
        self.threshold_factor: tuple[str, float] | None = None  # (setting, value) that sets the threshold
        self.power_limit_W: float | None = None
        self.detached: str | None = None  # why the run trains without the bandit (store unreachable), if it does
        self.pending_path: Path | None = None  # where the trial waits when the store could not take it
        self.withdraw_reason: str | None = None
        self._store_location: str | None = None
        self._last_check_s = -float("inf")
        self._opened = False  # open_trial() done: the store's part of the run's start
        # The early-stop threshold's inputs, read by open_trial(): (early_stop_factor(), explore_stop_threshold());
        # None when the run has no threshold from the store (detached, or the store unreachable then).
        self._stop_inputs: tuple[tuple[str, float, float] | None, float | None] | None = None

    def _with_bandit(self, fn):
        store = self.run_store.get()  # the run's: opened once, closed at train end
        self._store_location = store.location  # names the store in a pending file
        return fn(BatchSizeBandit(store, self.config.job_id, self.settings))

    def suggest(self, suggested: SuggestedBatchSize | None = None) -> int:
        """The run's batch size (made once: later calls return the same).

        ``suggested``: what :func:`suggest_batch_size` returned for this run: its trial (and
        store) is claimed, not a new one made. A store that cannot be reached does not stop the
        run: it trains at ``default_batch_size`` and :meth:`finish` keeps its trial in a pending file.
        """
        if self.detached is not None:
            return int(self.batch_size)  # type: ignore[arg-type]  # set with detached
        if self.suggestion is None:
            if suggested is not None and suggested.withdrawn:
                logger.warning(
                    "zeus-callbacks: the batch size handed to this run (%d) is a suggestion that was withdrawn "
                    "(a later suggest_batch_size() of job %s replaced it): this run draws and records a trial "
                    "of its own",
                    suggested,
                    self.config.job_id,
                )
            made = None if suggested is None else suggested.claim(self.config.job_id)
            if made is not None and made.store is not None:
                self.run_store.adopt(made.store)  # suggest_batch_size() opened it: the run goes on with it
            if made is not None and made.suggestion is None:  # it already waited for the store, and warned
                return self._detach(made.detached or "the store could not be reached")
            try:
                suggestion: Suggestion = (
                    made.suggestion
                    if made is not None and made.suggestion is not None
                    else self._with_bandit(lambda b: b.suggest())
                )
            except StoreUnavailableError as exc:
                _detached_warning(exc, self.config)
                return self._detach(str(exc))
            self.suggestion = suggestion
            self.batch_size = suggestion.batch_size
        return self.suggestion.batch_size

    def _detach(self, reason: str) -> int:
        """Train without the bandit, at ``default_batch_size``."""
        self.detached = reason
        self.batch_size = int(self.config.batch_size.default_batch_size)  # type: ignore[arg-type]  # when enabled
        return self.batch_size

    def open_trial(self) -> None:
        """The store's part of the run's start: the suggestion, and what the early-stop threshold needs.

        Call it before the run's energy and time start counting (the session does, ahead of its run
        window): the trial's cost is the run's, and a store that another process holds makes this wait
        up to ``store.lock_timeout_s`` (a GPU idle, no training), which must not be charged to the
        batch size under test. :meth:`start` calls it when nobody did. Idempotent.

        Raises:
            StoreError: The store cannot be used (corrupt, newer schema); one that cannot be reached
                (:class:`~zeus_callbacks.errors.StoreUnavailableError`) detaches the run instead (:meth:`suggest`).
        """
        if self._opened:
            return
        self.suggest()
        if self.detached is None:
            try:
                self._stop_inputs = self._with_bandit(
                    lambda b: (b.early_stop_factor(), b.explore_stop_threshold(self.batch_size))
                )
            except StoreUnavailableError as exc:  # the trial exists; finish() records it, or keeps it pending
                logger.warning(
                    "zeus-callbacks: %s; this run is not stopped early on cost (its threshold needs the store)", exc
                )
        self._opened = True

    def start(self, max_power_W: float, power_limit_W: float | None) -> None:
        """Training starts: fix the cost function and the early-stop threshold (the lower of the two rules).

        Uses the store only when :meth:`open_trial` has not run yet.

        Args:
            max_power_W: MaxPower of the cost (W, all measured GPUs), unless the config sets it.
            power_limit_W: Power limit in force (W), recorded with the trial.
        """
        self.open_trial()
        self.cost = ZeusCost(self.config.batch_size.eta_knob, self.config.batch_size.max_power_W or max_power_W)
        self.power_limit_W = power_limit_W
        if self._stop_inputs is None:  # detached, or the store unreachable for the threshold: no stop on cost
            return
        factor, explore = self._stop_inputs
        beta = None if factor is None else factor[1] * factor[2]
        self.explore_stop = explore is not None and (beta is None or explore < beta)
        self.threshold = explore if self.explore_stop else beta
        self.threshold_factor = None if factor is None else (factor[0], factor[1])

    def use_batch_size(self, batch_size: int) -> None:
        """Record the batch size of the run's data loaders, when it differs from the suggestion."""
        self.batch_size = int(batch_size)

    def withdraw(self, reason: str) -> None:
        """Withdraw the trial at :meth:`finish` instead of recording it: the run's batch size is not known.

        A trial recorded at a batch size the run did not train at would be an observation of an arm
        never run; withdrawn, it is neither an observation nor a failure (:func:`withdraw_suggestion`).

        Args:
            reason: Why, kept in the trial's ``info["reason"]``.
        """
        self.withdraw_reason = reason

    def record_power_limit(self, power_limit_W: float) -> None:
        """Record the power limit the run trains at from now on (W), kept with the trial."""
        self.power_limit_W = power_limit_W

    @property
    def trial_id(self) -> int | None:
        """The store's trial of this run, once suggested."""
        return None if self.suggestion is None else self.suggestion.trial_id

    @property
    def phase(self) -> str | None:
        """The bandit's phase when the batch size was suggested (``pruning`` or ``thompson``)."""
        return None if self.suggestion is None else self.suggestion.phase

    def observe(self, metrics: Mapping[str, float]) -> str | None:
        """Check validation metrics against the target; return a stop reason when it is reached."""
        target = self.config.batch_size.target
        if target is None or target.metric not in metrics:
            return None
        value = metrics[target.metric]
        if math.isfinite(value) and (self.best_target_value is None or target.better(value, self.best_target_value)):
            self.best_target_value = float(value)
        if target.reached(value):
            if not self.converged:
                logger.info("zeus-callbacks: target %s=%s reached (%s)", target.metric, value, target.direction)
            self.converged = True
            if self.config.batch_size.stop_at_target:
                return f"target {target.metric}={value:g} reached"
        return None

    def check(self, energy_J: float, time_s: float) -> str | None:
        """Early stopping: a reason when the cost so far exceeds the threshold (:attr:`rule`)."""
        if self.threshold is None or self.cost is None or self.stop_reason is not None or self.converged:
            return self.stop_reason
        if time_s - self._last_check_s < MIN_CHECK_INTERVAL_S:
            return None
        self._last_check_s = time_s
        rule = self.rule  # built here, not above: this runs on every step, the rule at most every 0.5 s
        self.stop_reason = None if rule is None else rule.reason(energy_J, time_s)
        return self.stop_reason

    def stop_agreed(self, reason: str) -> None:
        """Record a cost stop that the ranks agreed on (another rank may have seen it first)."""
        self.stop_reason = reason

    @property
    def rule(self) -> EarlyStopRule | None:
        """The early-stop rule once started; None when nothing can stop the run on cost (no best cost yet)."""
        if self.threshold is None or self.cost is None:
            return None
        name, value = self.threshold_factor or ("beta_knob", None)
        return EarlyStopRule(self.cost, self.threshold, self.explore_stop, name, value)

    def finish(
        self,
        energy_J: float,
        time_s: float,
        run_status: str,
        *,
        degraded: bool = False,
        energy_note: str | None = None,
        error: str | None = None,
    ) -> TrialRecord | None:
        """Record the trial's outcome in the store and return the finished trial (None: no trial was made).

        A failed run counts against its arm (``batch_size.max_failures``), an interrupted one does not.
        A run whose energy or time is not finite is recorded without them and without a cost: not an
        observation, so the bandit does not move.

        Args:
            energy_J: GPU energy of the run (J); NaN when unknown.
            time_s: Wall time of the run (s).
            run_status: The session's status: ``completed``, ``failed`` or ``interrupted``.
            degraded: Sensor faults made the energy measurement incomplete.
            energy_note: Why the energy is unknown, kept in the trial's ``info``.
            error: The exception that ended a run that did not complete, in short (``Type: message``),
                kept in the trial's ``info["error"]``: pruning names it (``last: ...``).
        """
        if (self.suggestion is None and self.detached is None) or self.cost is None:
            return None
        if self.withdraw_reason is not None:
            return self._withdraw_trial(self.withdraw_reason)
        if run_status != "completed":
            status = "failed"
        elif self.stop_reason is not None:
            status = "early_stopped"
        else:
            status = "completed"
        known = math.isfinite(energy_J) and math.isfinite(time_s)
        cost = self.cost(energy_J, time_s) if known else None
        # A run stopped on cost whose evaluation after the stop reached the target converged:
        # its cost is its cost to the target, and its batch size stays a candidate.
        converged = self.converged and status != "failed"
        info: dict[str, Any] = {"stop_reason": self.stop_reason} if self.stop_reason else {}
        if self.best_target_value is not None:  # how close it came: named while no run reaches the target
            info["best_target_value"] = self.best_target_value
        if self.config.backend == "virtual":
            info["simulated"] = True  # measured on the virtual GPU: plots say so
        if run_status != "completed":
            info["run_status"] = run_status  # an interrupted run does not count against its arm
            if error:
                info["error"] = error  # what pruning names as the last failure
        if energy_note is not None and not math.isfinite(energy_J):
            info["energy_note"] = energy_note
        suggested = None if self.suggestion is None else self.suggestion.batch_size
        outcome: dict[str, Any] = {
            "energy_J": energy_J if math.isfinite(energy_J) else None,
            "time_s": time_s if math.isfinite(time_s) else None,
            "cost": cost,
            "converged": converged,
            "status": status,
            "batch_size": self.batch_size if suggested is not None and self.batch_size != suggested else None,
            "power_limit_W": self.power_limit_W,
            "info": info,
            "degraded": degraded,
        }
        try:
            if self.suggestion is None:  # trained without the store: no trial to report into yet
                self.pending_path = self._keep_pending(None, outcome)
                logger.warning(
                    "zeus-callbacks: the store could not be reached at train start (%s); this run's "
                    "trial is kept in %s and recorded when the store is next opened",
                    self.detached,
                    self.pending_path,
                )
                return None
            trial_id = self.suggestion.trial_id
            try:
                return self._with_bandit(lambda b: b.report(trial_id, **outcome))
            except StoreError as exc:  # locked past the limit, database down: keep the trial, merge it later
                self.pending_path = self._keep_pending(trial_id, outcome)
                logger.warning(
                    "zeus-callbacks: cannot record trial %d now (%s); kept in %s, merged into the store "
                    "when it is next opened",
                    trial_id,
                    exc,
                    self.pending_path,
                )
                return None
        finally:
            if self._owns_store:
                self.run_store.close()

    def _withdraw_trial(self, reason: str) -> TrialRecord | None:
        """:meth:`finish` of a withdrawn run: its trial withdrawn (none kept when detached from the store)."""
        try:
            if self.suggestion is None:  # trained without the store: nothing made, nothing kept pending
                return None
            trial_id = self.suggestion.trial_id
            try:
                return withdraw_suggestion(self.run_store.get(), trial_id, reason)
            except StoreError as exc:
                logger.warning(
                    "zeus-callbacks: cannot withdraw trial %d now (%s); the store marks it failed once this "
                    "process has ended",
                    trial_id,
                    exc,
                )
                return None
        finally:
            if self._owns_store:
                self.run_store.close()

    def _keep_pending(self, trial_id: int | None, outcome: dict[str, Any]) -> Path:
        """Write the trial's outcome to a pending file (atomically) for :func:`merge_pending_trials`.

        ``trial_id`` None (trained without the store): with the batch size, process, host and why.
        """
        location = self._store_location or store_location(self.config.store.location(self.config.logging.log_dir))
        pending_id = uuid.uuid4().hex  # recorded with the merged trial: a second merge of this file is a no-op
        name = f"trial-{'new' if trial_id is None else trial_id}-{os.getpid()}-{pending_id[:8]}.json"
        record: dict[str, Any] = {
            "store": location,
            "job_id": self.config.job_id,
            "trial_id": trial_id,
            "pending_id": pending_id,
            "report": outcome,
        }
        if trial_id is None:
            record.update(batch_size=self.batch_size, pid=os.getpid(), host=this_host(), detached=self.detached)
        path = pending_dir(self.config) / name
        write_json_atomic(path, record)
        return path
