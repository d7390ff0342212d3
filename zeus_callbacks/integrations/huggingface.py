"""``ZeusTrainerCallback``: GPU energy in a Hugging Face ``transformers.Trainer``.

Example:
    >>> from transformers import Trainer, TrainingArguments
    >>> from zeus_callbacks import ZeusTrainerCallback
    >>> args = TrainingArguments("out", report_to=["tensorboard"])  # doctest: +SKIP
    >>> trainer = Trainer(model, args, train_dataset=ds)  # doctest: +SKIP
    >>> ZeusTrainerCallback.from_yaml("zeus.yaml").attach(trainer)  # doctest: +SKIP
    >>> trainer.train()  # doctest: +SKIP

Energy values travel to TensorBoard and W&B inside the Trainer's own ``logs``
dict. The Trainer calls callbacks in list order and puts user callbacks *after* its
reporters, so values a user callback adds in ``on_log`` would never reach them: this
callback therefore sits right after ``DefaultFlowCallback`` (:meth:`~ZeusTrainerCallback.attach`
puts it there, and it moves back there when training begins). The Trainer copies ``logs``
into ``trainer.state.log_history`` *before* it calls the callbacks, so the energy values
reach the reporters but never ``log_history`` / ``trainer_state.json``.

An epoch's energy belongs at the step the epoch ended at, and the Trainer may not log there
(``logging_steps`` longer than an epoch, or two epochs between two logs): an epoch no log
carried at its own step is handed to the reporters as a log of its own, at that step, before
the next log reaches them (``log_history`` never holds it either).

The Trainer passes neither itself nor its callback list to callbacks. :meth:`attach` is the
explicit way to give them; a callback passed only as ``Trainer(callbacks=[...])`` finds the
Trainer being built from its caller (``on_init_end``) and attaches itself then, a fallback that a
subclassed or wrapped Trainer may defeat (it then warns).
"""

from __future__ import annotations

import contextvars
import copy
import functools
import hashlib
import json
import logging
import sys
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from tqdm.auto import tqdm
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import DefaultFlowCallback, ExportableState

from zeus_callbacks import reporting as metric
from zeus_callbacks.backends.base import GPUBackend
from zeus_callbacks.integrations._common import ConfigArg, SessionAdapter, unknown_energy_state
from zeus_callbacks.optimizers.batch_size import SuggestedBatchSize

logger = logging.getLogger(__name__)

# Keys the Trainer puts only in its last log, after the training loop ("train_runtime"
# is not enough: speed metrics with token counting add it to every log).
_FINAL_LOG_KEYS = ("total_flos", "train_loss")

# What the results (TrainOutput.metrics, train_results.json) keep of the final log's energy keys.
_RUN_LEVEL_KEYS = frozenset(
    (
        metric.TOTAL_ENERGY_J, metric.TOTAL_TIME_S, metric.RUN_MEAN_POWER_W, metric.RUN_STEP_ENERGY_J,
        metric.RUN_STEP_TIME_S, metric.RUN_STEP_COUNT, metric.POWER_LIMIT_CHOSEN_W, metric.CO2_G, metric.RUN_COST,
        metric.CPU_ENERGY_J, metric.DRAM_ENERGY_J, metric.NODE_ENERGY_J, metric.SIMULATED, metric.UNAVAILABLE,
    )
)  # fmt: skip
# The flags go once a step to the reporters, but the results always keep them: they say what the figures are.
_FLAG_KEYS = (metric.SIMULATED, metric.UNAVAILABLE)
_TOTAL_KEYS = (metric.TOTAL_ENERGY_J, metric.TOTAL_TIME_S)

_TRAINING: contextvars.ContextVar[Trainer | None] = contextvars.ContextVar("zeus_callbacks_trainer", default=None)
"""The attached Trainer whose ``train()`` is running (callbacks it rebuilds from a checkpoint find it here)."""

_HANDING: contextvars.ContextVar[bool] = contextvars.ContextVar("zeus_callbacks_handing", default=False)
"""True while zeus-callbacks hands a log of its own to the reporters (every instance's ``on_log`` leaves it alone)."""


class ZeusTrainerCallback(SessionAdapter, TrainerCallback, ExportableState):
    """Measure and log GPU energy of a Hugging Face Trainer run.

    A *step* is one optimizer step: with gradient accumulation its window spans every
    micro-batch, and energy per sample divides by
    ``per_device_train_batch_size × gradient_accumulation_steps``. Energy per token is
    logged when ``TrainingArguments(include_num_input_tokens_seen=True)``.

    Checkpoints: the run's totals and the power-limit profile so far are saved in each
    checkpoint's ``trainer_state.json`` (``stateful_callbacks``, transformers'
    ``ExportableState``), one entry per instance under :attr:`state_key`. ``trainer.train(
    resume_from_checkpoint=...)`` continues them whether or not
    ``TrainingArguments.restore_callback_states_from_checkpoint`` is set: the callback reads
    the state the Trainer loaded from the checkpoint when training begins. (With that flag set
    the Trainer replaces this callback by a new one built from its saved configuration; a
    ``backend`` passed in is then not carried.)

    Args:
        config: Path of a YAML file, a mapping of settings, a ``ZeusConfig``, or None.
        backend: An open GPU backend to use instead of the configured one (tests,
            simulations); the caller closes it.

    Raises:
        ConfigError: The configuration is invalid (raised here, before training).

    Attributes:
        summary: The :class:`~zeus_callbacks.reporting.RunSummary` once training ended.
        session: The :class:`~zeus_callbacks.session.EnergySession` of the current run.
    """

    def __init__(self, config: ConfigArg = None, backend: GPUBackend | None = None) -> None:
        super().__init__(config, backend)
        self._tokens_seen = 0
        self._samples_per_step = 0  # per_device_train_batch_size × gradient_accumulation_steps, set at train begin
        self._phases = False  # windows.phases: the optimizer-step hook has work
        self._in_eval = False
        self._eval_every_rank = False  # the evaluation open is the Trainer's own (every process runs it)
        self._eval_on_start = False  # eval_on_start: the Trainer's evaluation before the first epoch is still due
        self._epoch = 0
        self._trainer: weakref.ReferenceType[Trainer] | None = None
        self._final_logs: dict[str, Any] | None = None  # the final log (TrainOutput.metrics): results
        self._is_main = True
        self._logged_step = -1  # the global step of the last periodic log that carried energy
        self._results_totals: dict[str, float] = {}  # run totals for the results only (their step was logged)
        self._epoch_reports: list[tuple[int, dict[str, float]]] = []  # (end step, metrics) of epochs not yet logged
        self._eval_prefixes: set[str] = {"eval"}  # the evaluation prefixes its logs carried energy under (eval_<name>)

    # -- attaching -----------------------------------------------------------------------
    def attach(self, trainer: Trainer) -> ZeusTrainerCallback:
        """Attach to ``trainer``: join its callbacks right after ``DefaultFlowCallback`` and guard its ``train()``.

        The guard ends the run of every ``ZeusTrainerCallback`` of the Trainer when
        ``train()`` raises, wherever the failure is (training step, optimizer step, data
        loader, evaluation, another callback, Ctrl-C), and restores their power limits, then
        re-raises. Idempotent; call it before ``trainer.train()``.

        Args:
            trainer: The Trainer to measure.

        Returns:
            This callback.
        """
        handler = trainer.callback_handler
        if self not in handler.callbacks:
            handler.add_callback(self)
        self._trainer = weakref.ref(trainer)
        self._move_before_reporters(trainer)
        _guard_train(trainer)
        _guard_evaluate(trainer)
        return self

    @property
    def trainer(self) -> Trainer | None:
        """The Trainer this callback is attached to (None before :meth:`attach` or the fallback)."""
        return self._trainer() if self._trainer is not None else None

    @staticmethod
    def _caller_trainer() -> Trainer | None:
        """Fallback: the Trainer being built, found among the caller frames' ``self``."""
        frame: FrameType | None = sys._getframe(2)
        while frame is not None:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, Trainer):
                return candidate
            frame = frame.f_back
        return None

    def _move_before_reporters(self, trainer: Trainer) -> None:
        """Place this callback right after DefaultFlowCallback (moving an element earlier never skips one)."""
        callbacks = trainer.callback_handler.callbacks
        if self not in callbacks:
            return
        flow = next((i for i, cb in enumerate(callbacks) if isinstance(cb, DefaultFlowCallback)), -1)
        if callbacks.index(self) > flow + 1:
            callbacks.remove(self)
            callbacks.insert(flow + 1, self)

    def _peers(self) -> list[ZeusTrainerCallback]:
        """Every ZeusTrainerCallback of the attached Trainer, in list order (just this one when detached)."""
        trainer = self.trainer
        if trainer is None:
            return [self]
        peers = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, ZeusTrainerCallback)]
        return peers if self in peers else [self]

    # -- checkpoint state ------------------------------------------------------------------
    @property
    def state_key(self) -> str:
        """This instance's key in the checkpoint: the job id and a digest of the configuration.

        Instances with identical configurations on one Trainer get ``#2``, ``#3``... in list order.
        """
        peers = self._peers()
        base = _base_key(self)
        same = [p for p in peers if _base_key(p) == base]
        index = same.index(self) if self in same else 0
        return base if index == 0 else f"{base}#{index + 1}"

    def state(self) -> dict[str, Any]:
        """The checkpoint entry (transformers' ``ExportableState``): every instance's state, by :attr:`state_key`.

        Returns:
            ``{"args": {"config": ...}, "attributes": {"resume_states": {key: state}}}``:
            ``config`` rebuilds this instance (the Trainer does when
            ``restore_callback_states_from_checkpoint`` is set), ``state`` is
            :meth:`EnergySession.state_dict` (totals, the power-limit profile so far).
            Every instance writes the same entry, so the checkpoint holds one, not a list.
        """
        return {
            "args": {"config": self.config.model_dump(mode="json")},
            "attributes": {"resume_states": {p.state_key: p.session.state_dict() for p in self._peers()}},
        }

    def _checkpoint_state(self, state: TrainerState) -> Mapping[str, Any] | None:
        """This instance's state in the checkpoint the Trainer resumed from (None: a fresh run or none saved)."""
        if not state.global_step:  # a fresh run: the entries are the ones built before training
            return None
        entry = (state.stateful_callbacks or {}).get(type(self).__name__)
        entries = entry if isinstance(entry, list) else [entry]
        saved: dict[str, Any] = {}
        for item in entries:  # an older list (one entry per save): the last one wins
            if isinstance(item, Mapping):
                attributes = item.get("attributes")
                states = attributes.get("resume_states") if isinstance(attributes, Mapping) else None
                saved.update(states if isinstance(states, Mapping) else {})
        key = self.state_key if self.state_key in saved else None
        if key is None and not saved:
            return self._state_for_a_resume_without_one(state.global_step, self.state_key)
        if key is None:
            # The key digests the whole configuration, so any edit between save and resume (a new log_dir,
            # interval) misses it: take the one saved state of this job if there is exactly one; else the
            # run's energy is unknown (it cannot hold the steps before the checkpoint), said with the keys.
            same_job = [k for k in saved if _job_of(k) == self.config.job_id]
            if len(same_job) != 1 or len(self._peers()) != 1:
                why = f"the checkpoint holds energy state for {', '.join(sorted(saved))} but none for {self.state_key}"
                logger.warning(
                    "zeus-callbacks: %s: the run's energy is unknown and its power-limit profile restarts (keep the "
                    "configuration of the run that saved it to continue them)", why,
                )  # fmt: skip
                return unknown_energy_state(why)
            key = same_job[0]
            logger.warning(
                "zeus-callbacks: the checkpoint's state was saved under another configuration of job %r "
                "(%s, this run %s); continuing it",
                self.config.job_id, key, self.state_key,
            )  # fmt: skip
        found = saved[key]  # a damaged entry (null, a list) is refused by the load: the energy is then unknown
        return found if isinstance(found, Mapping) else {"damaged entry": found}

    # -- training ------------------------------------------------------------------------
    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Attach to the Trainer being built (fallback for callbacks not given to :meth:`attach`)."""
        if self.trainer is None:
            trainer = self._caller_trainer()
            if trainer is not None:
                self.attach(trainer)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Start the run (a fresh session per ``train()`` call), continuing a checkpoint's state."""
        trainer = self.trainer or _TRAINING.get()
        if trainer is not None:
            self._trainer = weakref.ref(trainer)
            self._move_before_reporters(trainer)  # a checkpoint restore may have re-added it last
        else:
            logger.warning(
                "zeus-callbacks: the callback is not attached to its Trainer (call ZeusTrainerCallback.attach("
                "trainer)); energy values may not reach TensorBoard/W&B and a failure outside the callbacks "
                "leaves the run open until exit"
            )
        self._is_main = state.is_world_process_zero
        self._final_logs = None
        self._logged_step = -1
        self._results_totals = {}
        self._epoch_reports = []
        self._eval_prefixes = {"eval"}
        self._new_session(
            is_main_process=state.is_world_process_zero,
            device_index=args.local_process_index if args.world_size > 1 else None,
        )
        carried = self._checkpoint_state(state)
        if carried is not None:
            self._load_checkpoint_state(carried)
        self._tokens_seen = state.num_input_tokens_seen or 0
        self._eval_on_start = bool(args.eval_on_start)
        self._samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
        self._phases = self.config.windows.phases
        # None unless batch_size.enabled. What suggest_batch_size() returned reaches us as the Trainer's
        # batch size: the main process claims its trial; under a launcher the others, the main's suggestion.
        handed = args.per_device_train_batch_size
        if self.config.batch_size.enabled and self._is_main and not isinstance(handed, SuggestedBatchSize):
            logger.warning(
                "zeus-callbacks: per_device_train_batch_size (%d) carries no suggestion of the bandit (it is a "
                "number of its own, a copy or a pickle of what suggest_batch_size() returned): this run draws "
                "and records a trial of its own; a suggestion made earlier in this process that no run claims is "
                "withdrawn when it is dropped or the process ends", handed,
            )  # fmt: skip
        self._use_batch_size(
            self.session.suggest_batch_size(handed if isinstance(handed, SuggestedBatchSize) else None),
            args.per_device_train_batch_size, "the Trainer's per_device_train_batch_size",
            "; pass what zeus_callbacks.suggest_batch_size(config) returns as per_device_train_batch_size. "
            "The trial is recorded at",
        )  # fmt: skip
        self.session.train_start(
            run_name=self._run_name(Path(args.run_name).name if args.run_name else None),
            job_steps=state.max_steps - state.global_step if state.max_steps else None,  # what the fit has left
            job_steps_source="trainer",
        )
        # One entry, replaced at each save (never a growing list). Replaced here only once every instance
        # has begun, so that none is given the others' fresh states before it read its own.
        if state.stateful_callbacks is not None and all(p.session.started for p in self._peers()):
            state.stateful_callbacks[type(self).__name__] = self.state()

    def on_epoch_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Open the epoch window."""
        self._eval_on_start = False  # training has begun: no evaluation from here on is the one before it
        self._epoch = int(state.epoch or 0)
        self.session.epoch_start(self._epoch)
        self._plan_pauses(state.global_step, *_pauses(args, state, self._epoch, kwargs.get("train_dataloader")))

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Open the step window (the first micro-batch of an optimizer step)."""
        # One mark: the step and its forward_backward phase (every micro-batch of the step) begin.
        self.session.step_start(state.global_step, phase="forward_backward")

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ):
        """Step phases (``windows.phases``): forward+backward end, the optimizer phase begins.

        The Trainer has no hook between forward and backward; gradient clipping belongs to
        ``forward_backward``, the scheduler step and ``zero_grad`` to ``optimizer``.
        """
        if self._phases:  # else nothing to mark: no call into the session at all
            self.session.phase_switch("forward_backward", "optimizer")  # one shared mark

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Close the step window; stop training if the session says so."""
        # Hot path, after a step of training (cold caches): one call into the session; the counts are
        # kept at train begin, so an unmeasured step reads nothing it does not need.
        tokens = None
        seen = state.num_input_tokens_seen
        if seen:
            tokens = (seen - self._tokens_seen) or None
            self._tokens_seen = seen
        if state.global_step == self._measure_after:  # the next step is the last before an evaluation or an end
            self._measure_next_step(state.global_step)
        # step_end closes the optimizer phase at the step's end mark.
        decision = self.session.step_end(state.global_step, num_samples=self._samples_per_step, num_tokens=tokens)
        if decision.stop_training:
            logger.info("zeus-callbacks: stopping training (%s)", decision.reason)
            control.should_training_stop = True

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Close the epoch window; its metrics wait for the next log, kept for the step the epoch ended at."""
        metrics = self.session.epoch_end(self._epoch, report=True)
        if metrics:
            self._epoch_reports.append((state.global_step, metrics))

    def _eval_begin(self, control: TrainerControl | None) -> None:
        """Open the evaluation window (once per evaluation; only while the run is open).

        ``control``: the Trainer's; its ``should_evaluate`` is set while the Trainer runs its own
        evaluation, which every process runs (its energy is then summed over them). The Trainer's
        ``eval_on_start`` evaluation (between ``on_train_begin`` and the first epoch) sets no flag but
        runs on every process too. Another (``trainer.evaluate()`` called by the user,
        perhaps on one process) stays this process's.
        """
        if not self._in_eval and self.session.started:
            self._in_eval = True
            trainers_own = control is not None and control.should_evaluate
            self._eval_every_rank = bool(trainers_own or self._eval_on_start)
            self._eval_on_start = False  # one evaluation before training
            self.session.eval_start()

    def on_prediction_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Open the evaluation window after the first evaluation batch, unless attached.

        The Trainer has no begin hook: an attached callback opens the window when
        ``trainer.evaluate`` is entered (:meth:`attach`); this is the fallback, which misses
        the evaluation's set-up and its first batch.
        """
        self._eval_begin(control)

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, metrics=None, **kwargs: Any
    ):
        """Close the evaluation window (if its log did not) and hand the metrics to the session."""
        if self._in_eval:
            self._in_eval = False
            self.session.eval_end(every_rank=self._eval_every_rank)
        # The Trainer's metrics are the evaluation's log, which carries our figures: the user's keys only.
        mine = {k: v for k, v in (metrics or {}).items() if not metric.is_own_metric(str(k), self._eval_prefixes)}
        decision = self.session.evaluate(mine)
        if decision.stop_training:
            control.should_training_stop = True

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs=None, **kwargs: Any):
        """Add the energy metrics to ``logs`` before TensorBoard / W&B read it.

        - A periodic training log gets every step reported since the previous log, merged into
          one interval (``energy/step_J``: the mean over its measured steps, ``energy/step_count``:
          how many), and the running totals.
        - An evaluation's log (the Trainer logs before ``on_evaluate``) gets that evaluation's
          energy and time only, as ``eval_energy_J`` / ``eval_time_s`` (the reporters show
          ``eval/energy_J`` beside ``eval/loss``), at its own step: no second step report or
          total at a step the training log already covered.
        - The final log (the Trainer's results) gets the last steps for the reporters and the
          run-level figures (:func:`~zeus_callbacks.reporting.run_metrics`); the interval values
          are taken out of the results once the reporters have read them (``on_train_end``).
          A periodic log at the step where training stops (``max_steps``, a stop set in
          ``on_step_end``) leaves everything to the final log at that step. A stop decided
          at an evaluation after that step's periodic log (``EarlyStoppingCallback``) gives
          the reporters no second point at that step: no step values and no totals (the
          periodic log's totals are the last ones they show); the results still get the
          run's totals.
        - Each epoch's metrics (``energy/epoch_J``...) go with the first of these logs at the
          step the epoch ended at; an epoch that ended at an earlier step (the Trainer did not
          log there, or logged before the epoch ended) first reaches the reporters as a log of
          its own at that step, so every epoch has its point, none shared with another's.
        - ``energy/simulated`` (``energy/unavailable``) once per step: the first log at a step
          that carries energy has it, a second one at that step (an evaluation's after the
          periodic log) not.
        - Nothing after the run (a later ``trainer.evaluate()`` is not measured).
        """
        if logs is None or _HANDING.get() or not self.session.started:
            return
        session = self.session
        step = state.global_step
        self._hand_epochs(before=step)
        if self._in_eval:
            self._in_eval = False
            prefix = _eval_prefix(logs)
            self._eval_prefixes.add(prefix)
            dataset = prefix.removeprefix("eval_") if prefix != "eval" else None  # eval_dataset={"a": ...}: "a"
            ours = session.eval_end(report=True, dataset=dataset, every_rank=self._eval_every_rank)  # flagged
            ours.update(self._take_epochs(step))
            logs.update(_hf_names(session.once_per_step(ours, step), prefix))
            return
        if all(key in logs for key in _FINAL_LOG_KEYS):
            self._finish()
            assert self.summary is not None
            ours = session.pop_metrics()
            ours.update(metric.run_metrics(self.summary))
            if step == self._logged_step:  # else a second point at a step already logged
                self._results_totals = {k: ours.pop(k) for k in _TOTAL_KEYS if k in ours}
                ours = {k: v for k, v in ours.items() if k in _RUN_LEVEL_KEYS}
            ours.update(self._take_epochs(step))  # no log had them: no second point
            logs.update(_hf_names(session.once_per_step(session.flagged(ours), step)))
            self._final_logs = logs
            return
        if control.should_training_stop:  # the final log follows at this same step and carries it all
            return
        ours = session.pop_metrics(flush_steps=True)  # a flush that reports is charged by the session
        assembled = time.perf_counter()
        ours.update(session.totals())
        ours.update(self._take_epochs(step))
        logs.update(_hf_names(session.once_per_step(session.flagged(ours), step)))
        self._logged_step = step
        session.charge_overhead_s(time.perf_counter() - assembled)  # a log every few steps: in the budget too

    def _take_epochs(self, step: int) -> dict[str, float]:
        """The metrics of the epochs that ended at ``step`` (now the log's to carry); empty if none.

        Earlier ones are left only when :meth:`_hand_epochs` could not hand them (no Trainer):
        this log takes them too, the last epoch's values winning.
        """
        taken: dict[str, float] = {}
        for _, metrics in [r for r in self._epoch_reports if r[0] <= step]:
            taken.update(metrics)
        self._epoch_reports = [r for r in self._epoch_reports if r[0] > step]
        return taken

    def _hand_epochs(self, *, before: int | None) -> None:
        """Hand every instance's epochs that ended before step ``before`` (None: all) to the reporters.

        One log per step, in step order, each at the step its epochs ended at; without the
        Trainer (not attached) they stay for the next log, which carries them at its own step
        (:meth:`_take_epochs`).
        """
        trainer = self.trainer
        if trainer is None:
            return
        due: dict[int, dict[str, float]] = {}
        for peer in self._peers():
            kept = []
            for end_step, metrics in peer._epoch_reports:
                if before is None or end_step < before:
                    due.setdefault(end_step, {}).update(peer.session.once_per_step(metrics, end_step))
                else:
                    kept.append((end_step, metrics))
            peer._epoch_reports = kept
        for end_step in sorted(due):
            _hand_to_reporters(trainer, end_step, due[end_step], "the epochs' energy")

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """End the run (if the final log did not already), keep only run figures in the results, print the summary."""
        if self.session.started:
            self._finish()
        self._hand_epochs(before=None)  # any epoch no log carried (the final log carries those at its step)
        if self._final_logs is not None:  # the reporters have read it: results keep run-level figures only
            own = [k for k in self._final_logs if metric.is_own_metric(str(k), self._eval_prefixes)]
            for key in [k for k in own if k not in _RUN_LEVEL_KEYS]:
                del self._final_logs[key]
            self._final_logs.update(self._results_totals)  # the totals kept from the reporters, if any
            if self.summary is not None:
                run = metric.run_metrics(self.summary)
                self._final_logs.update({k: run[k] for k in _FLAG_KEYS if k in run})
            self._final_logs = None
        self._results_totals = {}
        self._print_summary()

    def _finish(self) -> None:
        if self._in_eval:
            self._in_eval = False
            self.session.eval_end()
        self.summary = self.session.train_end()

    def _fail(self, exc: BaseException) -> dict[str, float]:
        """``train()`` raised: end the run (restoring power limits) and print its summary.

        Returns:
            What the loggers get of the ended run: the steps reported since the last log and
            the run's totals, flagged (empty when no run was open).
        """
        if not self.session.started:
            return {}
        self._in_eval = False
        self.summary = self.session.exception(exc)
        self._print_summary()
        ours = self.session.pop_metrics()
        ours.update(self.session.totals())
        return _hf_names(self.session.flagged(ours))

    def _print_summary(self) -> None:
        """Print the run summary on the main process (scripts often leave logging at WARNING).

        Through ``tqdm.write``, as the Trainer prints its own logs: the Trainer's progress bar is
        still open here (its callback ends after this one), and a plain ``print`` would land on the
        bar's line and leave a second bar below it. With no bar open it is a plain print.
        """
        if self.summary is not None and self._is_main:
            tqdm.write(str(self.summary))
            sys.stdout.flush()


def _job_of(key: str) -> str | None:
    """The job id in a :attr:`ZeusTrainerCallback.state_key` (``Name[job:digest]#n``), or None."""
    inside = key.partition("[")[2].rpartition("]")[0]
    return inside.rpartition(":")[0] if ":" in inside else None


def _base_key(callback: ZeusTrainerCallback) -> str:
    digest = hashlib.sha256(json.dumps(callback.config.model_dump(mode="json"), sort_keys=True).encode())
    return f"{type(callback).__name__}[{callback.config.job_id}:{digest.hexdigest()[:12]}]"


def _hf_names(metrics: dict[str, float], prefix: str = "eval") -> dict[str, float]:
    """``metrics`` with the evaluation's figures renamed ``<prefix>_energy_J`` / ``<prefix>_time_s``.

    The Trainer's reporters (TensorBoard, W&B) file keys that start with ``eval_`` under ``eval/``
    and every other key under ``train/``: renamed, an evaluation's energy shows as
    ``eval/energy_J`` beside ``eval/loss``, not as ``train/energy/eval_J``. With several
    evaluation datasets the Trainer's prefix is ``eval_<name>``: ``eval/<name>_energy_J``.
    """
    names = {key: prefix + name.removeprefix("eval") for key, name in metric.HF_EVAL_NAMES.items()}
    return {names.get(key, key): value for key, value in metrics.items()}


def _eval_prefix(logs: Mapping[str, Any]) -> str:
    """The evaluation log's metric prefix (``eval``, or ``eval_<dataset>``), from its ``<prefix>_runtime`` key."""
    for key in logs:
        if isinstance(key, str) and key.startswith("eval") and key.endswith("_runtime"):
            return key.removesuffix("_runtime")
    return "eval"


def _hand_to_reporters(trainer: Trainer, step: int, logs: dict[str, float], what: str) -> None:
    """Hand ``logs`` to the Trainer's reporters (TensorBoard, W&B) as one log at global step ``step``.

    Through the callbacks' ``on_log`` directly, as ``Trainer.log`` would call it, but outside
    ``log_history`` (which never holds energy); every ``ZeusTrainerCallback`` leaves it as it is.
    ``what`` names the metrics in the error message.
    """
    if not logs:
        return
    state = copy.copy(trainer.state)  # a copy: the Trainer's own state keeps its step
    state.global_step = step
    token = _HANDING.set(True)
    try:
        trainer.callback_handler.on_log(trainer.args, state, trainer.control, logs)
    except Exception:  # a reporter broken (by a failure, say): the figures are in the JSONL and the summary
        logger.exception("zeus-callbacks: cannot hand %s to the Trainer's loggers", what)
    finally:
        _HANDING.reset(token)


def _wrap_once(trainer: Trainer, name: str, guarded: Callable[..., Any]) -> None:
    """Make ``trainer.<name>(...)`` call ``guarded(original, ...)``; a Trainer's method is wrapped once."""
    flag = f"_zeus_callbacks_guarded_{name}"
    if getattr(trainer, flag, False):
        return
    original = getattr(trainer, name)
    setattr(trainer, name, functools.wraps(original)(functools.partial(guarded, original)))
    setattr(trainer, flag, True)


def _guard_train(trainer: Trainer) -> None:
    """Wrap ``trainer.train`` once: a failure ends every ZeusTrainerCallback's run before it propagates."""

    def train(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        token = _TRAINING.set(trainer)
        try:
            return original(*args, **kwargs)
        except BaseException as exc:
            ended: dict[str, float] = {}
            callbacks = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, ZeusTrainerCallback)]
            for cb in callbacks:
                try:
                    ended.update(cb._fail(exc))
                except Exception:  # one instance's fault must not keep the others' runs open
                    logger.exception("zeus-callbacks: cannot end the run after the failure")
            if callbacks:  # the epochs no log carried, each at its step; then the run's end
                callbacks[0]._hand_epochs(before=None)
            # At the step that failed, one past the last completed step (its own log is never given a second point).
            _hand_to_reporters(trainer, trainer.state.global_step + 1, ended, "the failed run's totals")
            raise
        finally:
            _TRAINING.reset(token)

    _wrap_once(trainer, "train", train)


def _guard_evaluate(trainer: Trainer) -> None:
    """Wrap ``trainer.evaluate`` once: the evaluation window opens as the evaluation begins.

    The first ``on_prediction_step`` comes after the first evaluation batch: an evaluation of
    one batch measured 0.5 ms of its 308 ms there. Outside ``train()`` no run is open and
    nothing is measured.
    """

    def evaluate(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        for cb in trainer.callback_handler.callbacks:
            if isinstance(cb, ZeusTrainerCallback):
                cb._eval_begin(trainer.control)
        return original(*args, **kwargs)

    _wrap_once(trainer, "evaluate", evaluate)


def _pauses(
    args: TrainingArguments, state: TrainerState, epoch: int, train_dataloader: Any
) -> tuple[int | None, tuple[int | None, ...]]:
    """The Trainer's pauses in optimizer steps (``every`` and ``ends`` of :func:`~._common.next_pause`).

    An evaluation every ``eval_steps`` global steps (``eval_strategy="steps"``), the epoch's end (the
    Trainer's ``ceil(batches / gradient_accumulation_steps)`` steps an epoch, when the loader has a
    length) and ``max_steps``. None where the Trainer does not say; a wrong guess costs one measured step.
    """
    strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
    interval = state.eval_steps  # an int, or a float the Trainer kept (1.0, say: it converts ratios below 1 only)
    whole = isinstance(interval, (int, float)) and interval >= 1 and float(interval).is_integer()
    every = int(interval) if strategy == "steps" and whole else None
    try:
        batches = len(train_dataloader)
    except TypeError:  # None, or a loader without a length
        batches = 0
    accumulation = max(1, args.gradient_accumulation_steps)
    per_epoch = -(-batches // accumulation) if batches > 0 else None
    epoch_end = (epoch + 1) * per_epoch if per_epoch is not None else None
    return every, (epoch_end, state.max_steps or None)
