"""``measure()``: GPU energy of a raw PyTorch or Lightning Fabric loop, as a context manager or a decorator.

Example:
    >>> import zeus_callbacks
    >>> with zeus_callbacks.measure("zeus.yaml") as m:  # doctest: +SKIP
    ...     for epoch in range(3):
    ...         with m.epoch():
    ...             for x, y in loader:
    ...                 with m.step(num_samples=len(x)):
    ...                     train_step(x, y)
    ...             with m.evaluation():
    ...                 val_loss = evaluate(model)
    >>> print(m.summary)  # doctest: +SKIP

The adapter drives :class:`~zeus_callbacks.session.EnergySession` in the order the Lightning
and Hugging Face callbacks do: ``train_start`` when the block is entered, ``epoch_start`` /
``step_start`` / ``step_end`` / ``eval_start`` / ``eval_end`` / ``epoch_end`` as marked, and
``train_end`` on exit (``exception`` when the block raises). It keeps the order of the marks
itself, since the session's step path checks nothing (it is the hot path): a mark out of order
raises :class:`~zeus_callbacks.errors.CallOrderError`.
"""

from __future__ import annotations

import functools
import inspect
import logging
import operator
import os
import reprlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from zeus_callbacks.backends.base import GPUBackend
from zeus_callbacks.errors import CallOrderError
from zeus_callbacks.integrations._common import ConfigArg, SessionAdapter
from zeus_callbacks.optimizers.batch_size import SuggestedBatchSize
from zeus_callbacks.optimizers.batch_size._batch_size_controller import unclaimed_suggestion
from zeus_callbacks.session import Decision, check_state

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

_active: tuple[int, Measurement] | None = None
"""The run under way in this process (its pid, its object): runs of two objects cannot nest."""


class Measurement(SessionAdapter):
    """One measured run per ``with`` block (or per call of the decorated function).

    Build it with :func:`measure`. Inside the run, mark steps (:meth:`step`, or
    :meth:`step_start` and :meth:`step_end`), epochs (:meth:`epoch`, optional: without them
    the run has steps and a total but no epoch records), evaluations (:meth:`evaluation`) and
    named windows (:meth:`window`). Steps and epochs are numbered from 0 in the order they end.

    With the batch-size bandit on (``batch_size.enabled``), the loop trains at the batch size it
    suggests (:attr:`suggested_batch_size`) and says which size it trains at, once, before its first
    step (``batch_size`` here, or :meth:`use_batch_size`): the run's trial is recorded at that size.
    A run that never says, says after steps ran, or says two sizes is not recorded (its trial is
    withdrawn, with a warning), since the loop's batch size is unknown or mixed.

    One run at a time in a process: a run of another ``measure()`` object inside this one's is
    refused (its energy would be counted in both).

    Args:
        config: Path of a YAML file, a mapping of settings, a ``ZeusConfig``, or None (defaults).
        backend: An open GPU backend to use instead of the configured one (tests); the caller closes it.
        run_name: Name of the JSONL log (``<log_dir>/<run_name>.jsonl``); default
            ``logging.run_name``, else a timestamp.
        is_main_process: Whether this process writes the log; default: ``RANK`` is 0. Under
            Fabric pass ``fabric.is_global_zero``.
        device_index: The GPU this process trains on (its local rank); default: the session's
            choice. Under Fabric pass ``fabric.local_rank`` when it runs several processes.
        batch_size: The batch size the loop trains at (samples per step on each process), for the
            bandit's trial; default: none given (call :meth:`use_batch_size` in the run). Pass what
            :func:`~zeus_callbacks.suggest_batch_size` returned, to build the data loaders before the
            run: the run claims its trial (only as returned: a copy made with ``int()`` carries no trial).
            Ignored with ``batch_size.enabled`` false.

    Raises:
        ConfigError: The configuration is invalid (raised here, before training).
        TypeError: ``batch_size`` is not an integer (``bool`` and ``float`` included).
        ValueError: ``batch_size`` is below 1.

    Attributes:
        config: The resolved configuration.
        session: The :class:`~zeus_callbacks.session.EnergySession` of the current (or last) run.
        summary: The :class:`~zeus_callbacks.reporting.RunSummary` of the last run once it ended
            (None before and during a run).
        should_stop: A step or evaluation of this run asked to stop training (the batch-size
            optimiser's early stop or its target reached); the loop decides whether to obey.
    """

    def __init__(
        self,
        config: ConfigArg = None,
        *,
        backend: GPUBackend | None = None,
        run_name: str | None = None,
        is_main_process: bool | None = None,
        device_index: int | None = None,
        batch_size: int | None = None,
    ) -> None:
        if callable(config):
            raise TypeError("measure() takes a configuration, not a function: decorate with @measure(config)")
        if batch_size is not None and not isinstance(batch_size, SuggestedBatchSize):  # that one carries its trial
            batch_size = _check_batch_size("measure(batch_size=...)", batch_size)
        super().__init__(config, backend)
        self._run_name_arg = run_name
        self._is_main_arg = is_main_process
        self._device_index = device_index
        self._batch_size_arg = batch_size
        self._said = _SaidBatchSize()
        self._steps_started = 0  # step_start() calls in this run
        self._running = False
        self._in_step = False
        self._in_eval = False
        self._epoch: int | None = None  # the epoch under way (None: between epochs)
        self._steps = 0  # steps ended in this run
        self._epochs = 0  # epochs ended in this run
        self._resume_from: Mapping[str, Any] | None = None  # a checkpoint's state for the next run (load_state_dict)
        self.should_stop = False

    # ------------------------------------------------------------------ the run
    def __enter__(self) -> Measurement:
        """Start a run: a fresh session, its backend opened and sampling started.

        Returns:
            This object, for the marks.

        Raises:
            CallOrderError: A run of this object is already under way (blocks do not nest), or a run
                of another ``measure()`` object in this process (its energy would be counted in both).
            BackendUnavailable: The configured backend cannot be used here.
            StoreError: With the bandit on, its store cannot be opened (corrupt, newer schema).

        A start that fails once sampling began ends that run as ``failed`` (its log ends with the
        exception) and stops its sampler; a checkpoint state loaded for it is kept for the next try.
        """
        if self._running:
            raise CallOrderError("measure(): a run is already under way; a with block of it cannot nest")
        if _active is not None and _active[0] == os.getpid():
            raise CallOrderError(
                "measure(): a run of another measure() object is under way in this process; two runs cannot nest "
                "(the outer run's energy would include the inner one's, and both would be recorded). End the "
                "outer run first, or measure the inner part as a window of it: with m.window(name): ..."
            )
        self._new_session(is_main_process=self._is_main_arg, device_index=self._device_index)
        self._in_step = self._in_eval = False
        self._epoch = None
        self._steps = self._epochs = self._steps_started = 0
        state = self._resume_from
        if state is not None:  # steps and epochs go on from the checkpoint's
            self.session.load_state_dict(state)
            self._steps, self._epochs = int(state.get("steps", 0)), int(state.get("epochs", 0))
        self.should_stop = False
        self._said = _SaidBatchSize()
        handed = self._batch_size_arg
        copied = None  # a suggestion made before the run that a plain int copy of it did not claim
        if isinstance(handed, SuggestedBatchSize) and self.config.batch_size.enabled:
            self.session.suggest_batch_size(handed)  # claims its trial (and store), as the HF callback does
        elif handed is not None and self.config.batch_size.enabled:
            copied = unclaimed_suggestion(self.config.job_id)
        self.session.train_start(run_name=self._run_name_arg)
        try:
            if copied is not None:
                self._warn_copied(int(handed), copied.batch_size, copied.trial_id)  # type: ignore[arg-type]
            if handed is not None:
                self._use(handed, "measure(batch_size=...)")
        except BaseException as exc:  # the run started: end it as failed (no sampler left), then raise
            self.session.exception(exc)
            raise
        self._resume_from = None  # this run took it (a start that failed keeps it for the next try)
        self._running = True
        _set_active(self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """End the run and write its summary; an exception from the block is recorded and propagates.

        A step still open is not a step (its energy stays in the run's total); an epoch or
        evaluation still open is measured up to here. An open step or epoch is warned about.
        """
        self._running = False
        _set_active(None)
        self._withdraw_unless_told()
        if exc is not None:
            self.summary = self.session.exception(exc)
            return
        if self._in_step:
            logger.warning("zeus-callbacks: the run ended inside a step (step_start without step_end); not counted")
        if self._epoch is not None:  # a loop that forgot epoch_end(): its last epoch is cut at the run's end
            logger.warning(
                "zeus-callbacks: the run ended inside epoch %d (epoch_start without epoch_end); measured up to "
                "the run's end",
                self._epoch,
            )
        self.summary = self.session.train_end()

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        """Decorate ``func``: each call is one measured run (as if its body were in a ``with`` block).

        Args:
            func: The training function; it marks steps on this object if it wants step figures.

        Returns:
            The wrapped function; :attr:`summary` holds the last call's summary.

        Raises:
            TypeError: ``func`` is a generator or ``async`` function: its body runs after the call has
                returned, so the run would end before its first step (use a ``with`` block inside it).
        """
        if inspect.isgeneratorfunction(func) or inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
            kind = "a generator" if inspect.isgeneratorfunction(func) else "an async"
            raise TypeError(
                f"measure() cannot decorate {kind} function ({getattr(func, '__qualname__', func)!r}): its body runs "
                "after the call returns, so the run would end before its first step; put `with measure(...) as m:` "
                "inside it instead"
            )

        @functools.wraps(func)
        def measured(*args: P.args, **kwargs: P.kwargs) -> R:
            with self:
                return func(*args, **kwargs)

        return measured

    # ------------------------------------------------------------------ the batch size
    @property
    def suggested_batch_size(self) -> int | None:
        """The batch size the bandit suggests for this run (samples per step on each process).

        Drawn when the run starts: build the training data loader with it inside the run, then
        confirm it with :meth:`use_batch_size`. Under several processes only the main one draws:
        there, call :func:`~zeus_callbacks.suggest_batch_size` on every process before the run and
        pass its value as ``measure(batch_size=...)`` instead.

        Returns:
            The batch size; ``batch_size.default_batch_size`` when the store could not be reached; None
            when ``batch_size.enabled`` is false (train at your own size), or on a process other than
            the main one that was not handed a suggestion.

        Raises:
            CallOrderError: Outside the run (the suggestion is drawn when the run starts).
        """
        self._need_run("suggested_batch_size")
        return self.session.suggest_batch_size()

    def use_batch_size(self, batch_size: int) -> None:
        """Say which batch size the loop trains at: the bandit's trial of this run is recorded at it.

        Call it once the training data loader is built, before the first step. With the bandit on,
        a run that never says (here or with ``measure(batch_size=...)``), says after a step has
        started, or says two different sizes records no trial: its batch size is unknown or mixed,
        so its trial is withdrawn at the end, with one warning. The same size said again changes
        nothing. A size other than :attr:`suggested_batch_size` is recorded as it is, with a warning
        (as the Lightning and Hugging Face callbacks do). Nothing is recorded with
        ``batch_size.enabled`` false.

        Args:
            batch_size: Samples per training step on this process (the loader's ``batch_size``): an
                int, or any integer type (``numpy.int64``); not a ``bool`` or a ``float``.

        Raises:
            CallOrderError: Outside the run.
            TypeError: ``batch_size`` is not an integer.
            ValueError: ``batch_size`` is below 1.
        """
        self._need_run("use_batch_size()")
        try:
            size = _check_batch_size("use_batch_size()", batch_size)
        except (TypeError, ValueError):
            if len(self._said.refused) < 3:  # the first few: a loop may repeat the call every step
                self._said.refused.append(f"use_batch_size({reprlib.repr(batch_size)})")
            raise
        self._use(size, "use_batch_size()")

    def _use(self, batch_size: int, how: str) -> None:
        """The loop says it trains at ``batch_size`` (with ``how``): the trial is recorded there, if said in time."""
        size, said = int(batch_size), self._said
        if size == said.size or said.withdraw is not None:  # nothing new, or the size is already unknown
            return
        if said.size is not None:
            said.withdraw = (
                f"withdrawn: the loop said two batch sizes ({said.size}, then {size})",
                f"said two batch sizes: {said.size} ({said.how}), then {size} ({how}), so the batch size it "
                # before any step the loop only changed its word; after, it may have trained at both
                + ("trained at is mixed" if self._steps_started else "trained at is not known for sure"),
            )
            return
        if self._steps_started:
            steps = f"{self._steps_started} training step{'s' if self._steps_started != 1 else ''}"
            said.withdraw = (
                "withdrawn: the loop said its batch size after training steps had run",
                f"said use_batch_size({size}) after {steps} had run, so the batch size it trained at is unknown",
            )
            return
        said.size, said.how = size, how
        if not self.config.batch_size.enabled:
            return
        self._use_batch_size(
            self.session.suggest_batch_size(), size, f"the batch size this loop trains at ({how})",
            "; build the training data loader with m.suggested_batch_size (docs/raw_loops.md). "
            "The trial is recorded at",
        )  # fmt: skip
        self.session.use_batch_size(size)

    def _warn_copied(self, handed: int, batch_size: int, trial_id: int) -> None:
        """``measure(batch_size=handed)`` got a plain int while a suggestion of the job waits unclaimed: say so."""
        controller = self.session.batch_size_controller  # None: not the main process (nothing drawn here)
        if controller is None:
            return
        logger.warning(
            "zeus-callbacks: measure(batch_size=%d) was given a plain int, not the value suggest_batch_size() "
            "returned, so the suggestion made before the run (batch size %d, trial %d) was not claimed: this run "
            "drew a trial of its own (trial %s), and trial %d is withdrawn once that value is dropped. Pass the "
            "value as returned, not copied with int() (docs/raw_loops.md)",
            handed,
            batch_size,
            trial_id,
            controller.trial_id,
            trial_id,
        )

    def _withdraw_unless_told(self) -> None:
        """At the run's end: a bandit trial whose batch size the loop never gave (or gave late, or two) is withdrawn.

        One warning says what happened and what to do.
        """
        controller = self.session.batch_size_controller  # None: the bandit off, or not the main process
        said = self._said
        if controller is None or (said.size is not None and said.withdraw is None):
            return
        if said.withdraw is not None:
            reason, what = said.withdraw
            fix = (
                "say it once, before the first step: m.use_batch_size(size) right after building the training "
                "data loader, or measure(config, batch_size=size)"
            )
        elif said.refused:
            reason = "withdrawn: the loop never said a valid batch size"
            what = f"never said a valid batch size (refused: {', '.join(said.refused)})"
            fix = "call m.use_batch_size(size) with a positive int, or pass measure(config, batch_size=size)"
        else:
            reason = "withdrawn: the loop never said which batch size it trained at"
            what = "never said which batch size it trained at"
            fix = (
                "build the training data loader with m.suggested_batch_size and call m.use_batch_size(size), "
                "or pass measure(config, batch_size=size)"
            )
        self.session.withdraw_batch_size_trial(reason)
        trial = "" if controller.trial_id is None else f", trial {controller.trial_id}"
        logger.warning(
            "zeus-callbacks: batch_size.enabled is true, but this loop %s, so its trial (suggested batch size "
            "%s%s of job %s) is withdrawn, not recorded: %s (docs/raw_loops.md)",
            what,
            controller.batch_size,
            trial,
            self.config.job_id,
            fix,
        )

    # ------------------------------------------------------------------ steps
    def step_start(self) -> None:
        """Open a step window (one clock read, or one CUDA event on a GPU).

        Raises:
            CallOrderError: Outside the run, or a step is already open.
        """
        self._need_run("step_start()")
        if self._in_step:
            raise CallOrderError("step_start(): the previous step is still open (call step_end() first)")
        self._in_step = True
        self._steps_started += 1
        self.session.step_start(self._steps)

    def step_end(self, *, num_samples: int | None = None, num_tokens: int | None = None) -> Decision:
        """Close the step window opened by :meth:`step_start`.

        Args:
            num_samples: Training samples in the step (this process's), for energy per sample.
            num_tokens: Input tokens in the step, for energy per token.

        Returns:
            Whether to stop training (also kept in :attr:`should_stop`).

        Raises:
            CallOrderError: Outside the run, or no step is open.
        """
        self._need_run("step_end()")
        if not self._in_step:
            raise CallOrderError("step_end() without step_start(): no step is open")
        self._in_step = False
        decision = self.session.step_end(self._steps, num_samples=num_samples, num_tokens=num_tokens)
        self._steps += 1
        self.should_stop = self.should_stop or decision.stop_training
        return decision

    @contextmanager
    def step(self, *, num_samples: int | None = None, num_tokens: int | None = None) -> Iterator[None]:
        """One step: :meth:`step_start` on entry, :meth:`step_end` on exit.

        A step whose body raises is not ended: it is no step, and its time falls in the next
        step's window if the loop goes on.

        Args:
            num_samples: Training samples in the step, for energy per sample.
            num_tokens: Input tokens in the step, for energy per token.

        Raises:
            CallOrderError: Outside the run, or inside another step.
        """
        self.step_start()
        try:
            yield
        except BaseException:
            self._in_step = False
            raise
        self.step_end(num_samples=num_samples, num_tokens=num_tokens)

    # ------------------------------------------------------------------ epochs
    def epoch_start(self) -> None:
        """Open an epoch window; its first step's window opens at the same mark.

        Raises:
            CallOrderError: Outside the run, inside a step, or an epoch is already open.
        """
        self._need_run("epoch_start()", outside_step=True)
        if self._epoch is not None:
            raise CallOrderError(f"epoch_start(): epoch {self._epoch} is still open (call epoch_end() first)")
        self._epoch = self._epochs
        self.session.epoch_start(self._epoch)

    def epoch_end(self) -> dict[str, float]:
        """Close the epoch window and attribute its energy (waits at most 0.25 s for the sensor).

        Returns:
            The epoch's metrics (``energy/epoch_J`` in J, ``time/epoch_s`` in s, and the rest of
            docs/metrics.md); empty when epoch windows are off (``windows.epoch: false``).

        Raises:
            CallOrderError: Outside the run, inside a step, or no epoch is open.
        """
        self._need_run("epoch_end()", outside_step=True)
        if self._epoch is None:
            raise CallOrderError("epoch_end() without epoch_start(): no epoch is open")
        epoch, self._epoch = self._epoch, None
        self._epochs += 1
        return self.session.epoch_end(epoch)

    @contextmanager
    def epoch(self) -> Iterator[None]:
        """One epoch: :meth:`epoch_start` on entry, :meth:`epoch_end` on exit.

        An epoch whose body raises stays open; the run's end measures it up to there.

        Raises:
            CallOrderError: As :meth:`epoch_start` and :meth:`epoch_end`.
        """
        self.epoch_start()
        yield
        self.epoch_end()

    # ------------------------------------------------------------------ evaluations and windows
    @contextmanager
    def evaluation(
        self, metrics: Mapping[str, Any] | None = None, *, every_rank: bool = False
    ) -> Iterator[dict[str, Any]]:
        """An evaluation window (``energy/eval_J``); no step's window holds it.

        Args:
            metrics: Validation metrics known before the block; more can be put in the dict it yields.
            every_rank: Under several processes, every rank runs this evaluation: its energy is
                summed over the ranks at its end (a collective every rank must reach). False
                (default): the ``eval`` record holds this process's figures, marked so, and no
                ``energy/eval_J`` is logged (an evaluation on rank 0 alone must not wait on the others).

        Yields:
            A dict for the evaluation's metrics (name → number, e.g. ``{"val/acc": 0.93}``); on exit
            they are recorded (the JSONL ``evaluate`` record, the batch-size target) and may set
            :attr:`should_stop`.

        Raises:
            CallOrderError: Outside the run, inside a step, or inside another evaluation.
        """
        self._need_run("evaluation()", outside_step=True)
        if self._in_eval:
            raise CallOrderError("evaluation(): an evaluation is already open")
        results: dict[str, Any] = dict(metrics or {})
        self._in_eval = True
        self.session.eval_start()
        try:
            yield results
        finally:
            self._in_eval = False
            self.session.eval_end(every_rank=every_rank)
        decision = self.session.evaluate(results)
        self.should_stop = self.should_stop or decision.stop_training

    def window(self, name: str, **info: Any) -> AbstractContextManager[None]:
        """A named window; its energy is written to the JSONL log (a ``window`` record, J and s).

        Args:
            name: The window's name (not ``run``, ``step``, ``epoch``, ``eval`` or a phase's).
            **info: Extra fields kept with the window.

        Returns:
            A context manager around the measured code.

        Raises:
            CallOrderError: Outside the run.
            ValueError: ``name`` is reserved.
        """
        self._need_run("window()")
        return self.session.window(name, **info)

    def pop_metrics(self) -> dict[str, float]:
        """The metrics queued since the last call (step reports, epochs, evaluations), for a logger.

        Returns:
            Metric name → value (docs/metrics.md), e.g. for ``fabric.log_dict``; empty most steps.
        """
        return self.session.pop_metrics()

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The run's totals so far, to save in the loop's checkpoint (plain numbers, lists and strings).

        Call it inside the run when the loop saves a checkpoint, or after the run. Saving waits (at most
        about 0.25 s) for the power samples to reach this moment. The energy so far is None, with
        ``energy_note``, when no sample covered it yet (docs/raw_loops.md, "Checkpoints").

        Returns:
            The state :meth:`load_state_dict` takes (:meth:`~zeus_callbacks.session.EnergySession.state_dict`).

        Raises:
            CallOrderError: A step is open (a step is no checkpoint moment).
        """
        if self._in_step:
            raise CallOrderError("state_dict() inside a step: save the checkpoint after step_end()")
        return self.session.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume the next run from a checkpoint's state (:meth:`state_dict`): call it before ``with``.

        The next run's totals (energy, time, steps, epochs, step means) start from the checkpoint's, and
        its steps and epochs are numbered on from there. A loop that resumes inside an epoch calls
        :meth:`epoch_start` again: that epoch's record then covers the steps after the checkpoint only
        (``resumed_mid_epoch``). One run takes the state; the one after starts from nothing again.

        Raises:
            CallOrderError: A run is under way (its totals are already counting).
            TypeError: ``state`` is not a mapping.
            ValueError: It is not a state :meth:`state_dict` wrote (a total negative or not a number, or
                no total at all: a checkpoint's whole dict handed instead of this entry); the message names the key.
        """
        if self._running:
            raise CallOrderError("load_state_dict() inside a run: call it before `with measure(...)`")
        check_state(state)
        self._resume_from = dict(state)

    # ------------------------------------------------------------------ helpers
    def _need_run(self, call: str, *, outside_step: bool = False) -> None:
        if not self._running:
            raise CallOrderError(f"{call} outside a run: call it inside `with measure(...)` or the decorated function")
        if outside_step and self._in_step:
            raise CallOrderError(f"{call} inside a step: end the step first")


@dataclass
class _SaidBatchSize:
    """What the loop said about its batch size in a run."""

    size: int | None = None  # the size said (the first, if two were)
    how: str | None = None  # the call that said it
    withdraw: tuple[str, str] | None = None  # said late or two sizes: (the trial's reason, what the warning says)
    refused: list[str] = field(default_factory=list)  # the first few calls refused (not an integer, below 1)


def _set_active(run: Measurement | None) -> None:
    """Mark ``run`` as this process's run under way (None: none)."""
    global _active
    _active = None if run is None else (os.getpid(), run)


def _check_batch_size(call: str, batch_size: object) -> int:
    """The batch size as an int: refuse one that is not a positive integer (TypeError, ValueError), naming ``call``.

    Any integer type is taken (``operator.index``: ``numpy.int64``); ``bool``, ``float`` and ``str`` are not.
    """
    try:
        if isinstance(batch_size, bool):
            raise TypeError
        size = operator.index(batch_size)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{call}: the batch size must be an int, not {type(batch_size).__name__}") from None
    if size < 1:
        raise ValueError(f"{call}: the batch size must be at least 1, not {size}")
    return size


def measure(
    config: ConfigArg = None,
    *,
    backend: GPUBackend | None = None,
    run_name: str | None = None,
    is_main_process: bool | None = None,
    device_index: int | None = None,
    batch_size: int | None = None,
) -> Measurement:
    """Measure GPU energy of a block or a function, as a context manager or a decorator.

    The arguments are :class:`Measurement`'s.

    Returns:
        A :class:`Measurement`: a context manager, a decorator, and the marks for steps,
        epochs, evaluations and windows. Its ``summary`` holds the run's figures after the run.

    Raises:
        ConfigError: The configuration is invalid.
        TypeError: Used as ``@measure`` without parentheses, or ``batch_size`` not an int.
        ValueError: ``batch_size`` is below 1.
    """
    return Measurement(
        config,
        backend=backend,
        run_name=run_name,
        is_main_process=is_main_process,
        device_index=device_index,
        batch_size=batch_size,
    )
