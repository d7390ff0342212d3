"""A run's course on its step axis, as plain data: what ``_run_log`` reads from a log and ``_plots`` draws.

Below both, so that the plots take plain data and import nothing above them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StepSpan:
    """One ``steps`` (or ``warmup``) record on the step axis.

    Attributes:
        first_step: Steps taken before the span's first step (the span starts there).
        end_step: Steps taken after its last step.
        power_W: Mean power over its measured steps, summed over GPUs (W); None when none was measured.
        energy_per_step_J: Mean energy per measured step, summed over GPUs (J); None likewise.
        power_limit_W: The power limit in force when the record was written (W), or None.
        sampled: The means come from a share of the steps (``count`` < ``steps``: ``windows.sample_fraction``).
        complete: The power samples covered every window of the record.
        warmup: The span is the run's warm-up steps (the ``warmup`` record), kept out of the step means.
    """

    first_step: float
    end_step: float
    power_W: float | None
    energy_per_step_J: float | None
    power_limit_W: float | None
    sampled: bool = False
    complete: bool = True
    warmup: bool = False


@dataclass(frozen=True)
class EvalMark:
    """One evaluation (``eval`` record): at ``step`` steps taken, its energy (J), time (s) and mean power (W).

    ``dataset`` names its dataset where the framework named it (the HF Trainer's ``eval_dataset={"a": ...}``),
    else None.
    """

    step: float
    energy_J: float | None
    time_s: float | None
    power_W: float | None
    dataset: str | None = None


@dataclass(frozen=True)
class PowerLimitSwitch:
    """The power limit the profiler chose and the step from which it was in force.

    Attributes:
        step: Steps taken when the chosen limit took over (``run_end.power_limit_from_step``, else the
            ``power_limit_profile`` record's ``step``).
        limit_W: The chosen limit (W); None when none was chosen (observe mode, unfinished, abandoned).
        applied: False in observe mode: the limit was chosen, not applied.
        source: The ``power_limit_profile`` record's ``source`` (``profile``, ``cache``, ``observe``, ...).
        profiling_from: Steps taken when profiling began (the run's first step, ``resumed_steps``).
        finished: False when training ended before profiling did.
        trial_limits_W: The limits profiling measured (W), in the record's order; empty without profiling.
    """

    step: float
    limit_W: float | None
    applied: bool
    source: str
    profiling_from: float
    finished: bool
    trial_limits_W: tuple[float, ...] = ()


@dataclass(frozen=True)
class LimitSegment:
    """A stretch of steps run at one known power limit: from ``first_step`` to ``end_step`` at ``limit_W`` (W)."""

    first_step: float
    end_step: float
    limit_W: float


@dataclass
class RunCourse:
    """A run's course on its step axis: what ``zeus-callbacks plot run`` draws.

    Attributes:
        run_name: The run's name (``run_start``/``run_end``), or None.
        spans: The warm-up and ``steps`` records in log order.
        evals: The evaluations.
        epoch_ends: ``(epoch, end_step)`` of each epoch whose record gives its ``end_step``.
        epochs_without_step: Epoch records without ``end_step`` (logs older than the field): not placed.
        switch: The power-limit choice, when the log has a ``power_limit_profile`` record.
        limits: The stretches whose power limit the log states (the limit at the start, the chosen one);
            none while profiling tries limits (the ``steps`` records' ``power_limit_W`` is the limit when each
            was written, which attribution may leave a trial behind its steps).
        simulated: The figures are simulated (the virtual GPU).
        ended: The log has a ``run_end`` record.
        notes: What a reader of the figure must know (sampled means, incomplete records, missing marks).
        time_note: Why the run's power-limit results do not show the time a limit costs (the
            ``time_note`` of its ``power_limit_profile`` or ``run_end`` record: the virtual GPU on the
            real clock), or None.
    """

    run_name: str | None
    spans: list[StepSpan] = field(default_factory=list)
    evals: list[EvalMark] = field(default_factory=list)
    epoch_ends: list[tuple[Any, float]] = field(default_factory=list)
    epochs_without_step: int = 0
    switch: PowerLimitSwitch | None = None
    limits: list[LimitSegment] = field(default_factory=list)
    simulated: bool = False
    ended: bool = False
    notes: list[str] = field(default_factory=list)
    time_note: str | None = None
