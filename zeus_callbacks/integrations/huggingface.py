"""``ZeusTrainerCallback``: GPU energy in a Hugging Face ``transformers.Trainer``.

Example:
    >>> from transformers import Trainer, TrainingArguments
    >>> from zeus_callbacks import ZeusTrainerCallback
    >>> args = TrainingArguments("out", report_to=["tensorboard"])  # doctest: +SKIP
    >>> trainer = Trainer(model, args, train_dataset=ds,  # doctest: +SKIP
    ...                   callbacks=[ZeusTrainerCallback.from_yaml("zeus.yaml")])

Energy values travel to TensorBoard and W&B inside the Trainer's own ``logs``
dict. The Trainer calls callbacks in list order and puts user callbacks *after* its
reporters, so values a user callback adds in ``on_log`` would never reach them: this
callback therefore moves itself right after ``DefaultFlowCallback`` when the Trainer is
built and again when training begins.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

from zeus_callbacks.backends.base import GPUBackend
from zeus_callbacks.integrations.common import ConfigArg, SessionAdapter

logger = logging.getLogger(__name__)

# Keys the Trainer puts only in its last log, after the training loop ("train_runtime"
# is not enough: speed metrics with token counting add it to every log).
_FINAL_LOG_KEYS = ("total_flos", "train_loss")


class ZeusTrainerCallback(SessionAdapter, TrainerCallback):
    """Measure and log GPU energy of a Hugging Face Trainer run.

    A *step* is one optimizer step: with gradient accumulation its window spans every
    micro-batch, and energy per sample divides by
    ``per_device_train_batch_size × gradient_accumulation_steps``. Energy per token is
    logged when ``TrainingArguments(include_num_input_tokens_seen=True)``.

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
        self._in_eval = False
        self._epoch = 0

    # -- ordering ------------------------------------------------------------------------
    @staticmethod
    def _caller(kind: type, *, depth: int = 2) -> Any:
        """Return the nearest caller frame's ``self`` that is a ``kind``.

        The Trainer passes neither itself nor its callback handler to callbacks.
        """
        frame: FrameType | None = sys._getframe(depth)
        while frame is not None:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, kind):
                return candidate
            frame = frame.f_back
        return None

    def _end_run_on_failure(self) -> None:
        """Wrap the Trainer's ``training_step`` so a failing step ends the run here.

        The HF Trainer has no exception hook: without this the run would only be closed
        at interpreter exit (as "interrupted").
        """
        from transformers import Trainer

        trainer = self._caller(Trainer, depth=3)
        if trainer is None or getattr(trainer.training_step, "_zeus_wrapped", False):
            return
        original = trainer.training_step
        callback = self

        def training_step(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            except BaseException as exc:
                # Ended already (a SIGTERM handler's train_end): exception() returns that summary.
                callback.summary = callback.session.exception(exc)
                raise

        training_step._zeus_wrapped = True  # type: ignore[attr-defined]
        trainer.training_step = training_step

    def _move_before_reporters(self) -> None:
        """Place this callback right after DefaultFlowCallback in the Trainer's handler.

        The handler is not passed to callbacks, so it is found as the caller of this
        event. Moving an element *earlier* in the list during the handler's loop
        neither skips nor repeats a callback.
        """
        handler = self._caller(CallbackHandler, depth=3)
        if handler is not None and self in handler.callbacks:
            callbacks = handler.callbacks
            flow = next((i for i, cb in enumerate(callbacks) if isinstance(cb, DefaultFlowCallback)), -1)
            if callbacks.index(self) > flow + 1:
                callbacks.remove(self)
                callbacks.insert(flow + 1, self)
            return
        logger.warning(
            "zeus-callbacks: could not find the Trainer's callback list; energy values may not reach "
            "TensorBoard/W&B (they are still in the JSONL log)"
        )

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Move before the reporters."""
        self._move_before_reporters()

    # -- training ------------------------------------------------------------------------
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Start the run (a fresh session per ``train()`` call)."""
        self._move_before_reporters()
        self._end_run_on_failure()
        self._new_session(
            is_main_process=state.is_world_process_zero,
            device_index=args.local_process_index if args.world_size > 1 else None,
        )
        self._tokens_seen = state.num_input_tokens_seen or 0
        # None unless batch_size.enabled. The main process claims its trial; under a launcher the
        # other processes claim the suggestion suggest_batch_size() received from it.
        self._use_batch_size(
            self.session.suggest_batch_size(), args.per_device_train_batch_size,
            "the Trainer's per_device_train_batch_size",
            "; call zeus_callbacks.suggest_batch_size(config) before building TrainingArguments. The trial is "
            "recorded at",
        )  # fmt: skip
        self.session.train_start(run_name=self._run_name(Path(args.run_name).name if args.run_name else None))

    def on_epoch_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Open the epoch window."""
        self._epoch = int(state.epoch or 0)
        self.session.epoch_start(self._epoch)

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
        self.session.phase_switch("forward_backward", "optimizer")  # one shared mark

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Close the step window; stop training if the session says so."""
        tokens = None
        if state.num_input_tokens_seen:
            tokens = state.num_input_tokens_seen - self._tokens_seen
            self._tokens_seen = state.num_input_tokens_seen
        samples = args.per_device_train_batch_size * args.gradient_accumulation_steps
        # step_end closes the optimizer phase at the step's end mark.
        decision = self.session.step_end(state.global_step, num_samples=samples, num_tokens=tokens or None)
        if decision.stop_training:
            logger.info("zeus-callbacks: stopping training (%s)", decision.reason)
            control.should_training_stop = True

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Close the epoch window; its metrics go out with the next log."""
        self.session.epoch_end(self._epoch)

    def on_prediction_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Open the evaluation window at the first evaluation batch (HF has no begin hook)."""
        if not self._in_eval and self.session.started:
            self._in_eval = True
            self.session.eval_start()

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, metrics=None, **kwargs: Any
    ):
        """Close the evaluation window and hand the metrics to the session."""
        if self._in_eval:
            self._in_eval = False
            self.session.eval_end()
        decision = self.session.evaluate(metrics or {})
        if decision.stop_training:
            control.should_training_stop = True

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs=None, **kwargs: Any):
        """Add the energy metrics to ``logs`` before TensorBoard / W&B read it."""
        if logs is None or (not self.session.started and self.session.summary is None):
            return
        if all(key in logs for key in _FINAL_LOG_KEYS) and self.session.started:
            self._finish()
        logs.update(self.session.pop_metrics(flush_steps=self.session.started))
        logs.update(self.session.totals())

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """End the run (if the final log did not already) and print the summary."""
        if self.session.started:
            self._finish()
        if self.summary is not None and state.is_world_process_zero:
            logger.info("%s", self.summary)

    def _finish(self) -> None:
        if self._in_eval:
            self._in_eval = False
            self.session.eval_end()
        self.summary = self.session.train_end()
