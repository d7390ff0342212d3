"""The epoch ledger: every stretch of an epoch's timeline in exactly one entry.

An epoch's energy and time split into warm-up steps, steps, evaluations, evaluation tails and ``other``
(what no window holds: the stretch after the last step, the wait before an evaluation and its loader's
start; a checkpoint save or a log between two steps is in the next step's window). An evaluation's tail
(``eval_tail``) runs from its end mark to the next boundary (the next step's start, an evaluation's start,
the epoch's end): the session's attribution of the evaluation and its wait for the sensor, the other
callbacks' evaluation hooks, the trainer's log, a checkpoint save, the next batch fetch. The first four are
disjoint windows inside the epoch window, attributed from the same running integral of the power
samples, so ``other = epoch − warm-up − steps − evaluations − tails`` is what they leave, not a guess.

A step with no usable window (unmeasured under ``windows.sample_fraction``, or not wholly covered by
samples) is measured all the same when it lies between two step windows with no evaluation between:
step windows tile the timeline, so the stretch from one's end to the next one's start holds exactly
the steps between them, and its energy comes from the same integral (``steps_between``). So does the
stretch from the epoch's start mark, or from an evaluation tail's end, to the next step window (the
first step after it starts there). Only the steps outside such stretches (after the last step window
before an evaluation or the epoch's end) are estimated, at the mean step of those known; with no such
stretch, at the epoch's mean measured step, each measured step weighed by ``1/p − 1`` (``p`` its
chance of being measured: the unmeasured steps it stands in for). Either is said in ``steps_basis``.
A mean of the measured steps alone is a poor estimate where step times vary (a data-loader stall, an
optimizer step under gradient accumulation): on an H100 loader-bound job, 17 measured steps of 444
put the epoch's steps about 30 % short. An estimate that leaves less than nothing for ``other`` makes
``other`` null with the reason, never negative. The split with no estimate in it always closes:
warm-up + the step windows + evaluations + tails + ``unwindowed`` (unmeasured steps and other together).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from zeus_callbacks.measurement._overhead import inverse_probability_weights
from zeus_callbacks.measurement._windows import WindowBatch
from zeus_callbacks.session._rank_records import LedgerColumns

EVALUATIONS_BEFORE = "evaluations_before"
"""A measured step window's info key: evaluation starts and ends before its end (odd: an evaluation is open).

Two step windows whose counts differ have an evaluation's edge between them; one that ends with an
evaluation open (it began inside the step) is followed by the rest of that evaluation."""

ROUNDING = 1e-9
"""A part below zero by less than this share of the epoch is rounding: it is 0 (sums of the same integral)."""


@dataclass
class EpochLedger:
    """What one epoch's windows hold on this rank, as they are attributed.

    Attributes:
        warmup_J: Energy of the warm-up step windows (J).
        warmup_s: Their time (s).
        warmup_windows: Their count.
        steps_J: Energy of the other step windows wholly covered by samples (J).
        steps_s: Their time (s).
        step_windows: Their count.
        evals: ``(start_s, energy_J, time_s)`` of each evaluation window; only those that begin
            inside the epoch count (a Trainer may evaluate after the epoch's end).
        eval_tails: The same of each evaluation's tail (``eval_tail`` window), counted alike.
        stand_in_J: The step windows' ``Σ (1/p − 1)·E`` (J), ``p`` each one's chance of being measured.
        stand_in_s: Their ``Σ (1/p − 1)·t`` (s).
        stand_in_steps: Their ``Σ (1/p − 1)``: the unmeasured steps they stand in for, in expectation.
        between: ``(start_s, end_s, steps, energy_J)`` of each stretch between two consecutive step windows
            with no evaluation between, that holds ``steps`` steps without a window and that the samples
            cover wholly (s on the backend clock, J).
    """

    warmup_J: float = 0.0
    warmup_s: float = 0.0
    warmup_windows: int = 0
    steps_J: float = 0.0
    steps_s: float = 0.0
    step_windows: int = 0
    evals: list[tuple[float, float, float]] = field(default_factory=list)
    eval_tails: list[tuple[float, float, float]] = field(default_factory=list)
    stand_in_J: float = 0.0
    stand_in_s: float = 0.0
    stand_in_steps: float = 0.0
    between: list[tuple[float, float, int, float]] = field(default_factory=list)
    _last_window: tuple[float, int, Any] | None = None  # (end_s, run_step, evaluations before) of the latest
    # (start_s, run_step, evaluations before) of each step window with no stretch of steps before it
    # (the epoch's first, the first after an evaluation): where a stretch from a boundary may end
    _after_break: list[tuple[float, int, Any]] = field(default_factory=list)
    # (time_s, run_step, evaluations before) of each evaluation tail's end: a stretch of steps may start there
    _tail_ends: list[tuple[float, int, Any]] = field(default_factory=list)
    _first_window_s: float = math.inf  # the start of the epoch's first step window seen (s)
    _emitted: set[tuple[float, float, int]] = field(default_factory=set)  # boundary stretches already given out

    def stretches_between(self, steps: WindowBatch) -> list[tuple[float, float, int]]:
        """The stretches between consecutive step windows that hold steps without a window and nothing else.

        Args:
            steps: Step windows wholly covered by samples, in the order they closed (warm-up ones included).

        Returns:
            ``(start_s, end_s, steps)`` of each new stretch (s on the backend clock): from a window's end to
            the next one's start, with no evaluation open at the first's end and none begun or ended up to
            the second's end; for :meth:`add_between` once attributed.
        """
        stretches = []
        ends = steps.end_s.tolist()
        if steps.size:
            self._first_window_s = min(self._first_window_s, float(steps.start_s.min()))
        for start_s, end_s, info in zip(steps.start_s.tolist(), ends, steps.end_info, strict=True):
            info = info or {}
            run_step, evaluations = info.get("run_step"), info.get(EVALUATIONS_BEFORE)
            last, self._last_window = self._last_window, None
            if run_step is None:
                continue
            # no evaluation open at the last window's end (an even count), none begun or ended since
            clean = isinstance(evaluations, int) and evaluations % 2 == 0
            if clean and last is not None and evaluations == last[2] and run_step - last[1] > 1 and start_s >= last[0]:
                stretches.append((last[0], start_s, int(run_step - last[1] - 1)))
            elif last is None or evaluations != last[2]:
                self._after_break.append((start_s, int(run_step), evaluations))
            self._last_window = (end_s, int(run_step), evaluations)
        return stretches

    def add_tail_end(self, end_s: float, info: dict[str, Any]) -> None:
        """Note where an evaluation's tail ended (``info``: ``run_step``, the evaluation count there)."""
        boundary = _boundary(end_s, info)
        if boundary is not None:
            self._tail_ends.append(boundary)

    def stretches_from_boundaries(
        self, epoch_info: dict[str, Any], epoch_start_s: float
    ) -> list[tuple[float, float, int]]:
        """The stretches from a boundary (the epoch's start, an evaluation tail's end) to the next step window.

        The first step after such a boundary starts at its mark (the epoch's first step at the epoch's
        start mark; the first after an evaluation where its tail ends), and the step windows tile from
        there. So when that step is unmeasured, the stretch up to the next measured step's start holds
        exactly the steps before it: unless an evaluation began or ended between. Those that
        :meth:`stretches_known_now` gave out already are left out.

        Args:
            epoch_info: The epoch window's info (``run_step``: the steps taken before it; the evaluation count).
            epoch_start_s: The epoch's start (s on the backend clock).

        Returns:
            ``(start_s, end_s, steps)`` of each, for :meth:`add_between` once attributed.
        """
        boundaries = list(self._tail_ends)
        epoch = _boundary(epoch_start_s, epoch_info)
        if epoch is not None:
            boundaries.append(epoch)
        out = []
        for boundary in boundaries:
            # a tail that ends at the epoch's start (an evaluation after the last epoch) is the same boundary
            stretch = self._stretch_from(*boundary) if boundary[0] >= epoch_start_s else None
            if stretch is not None and stretch not in out and stretch not in self._emitted:
                out.append(stretch)
        return out

    def stretches_known_now(self, open_epoch: tuple[float, dict[str, Any]] | None) -> list[tuple[float, float, int]]:
        """The stretches from the open epoch's start and from evaluation tails' ends to the next step window, so far.

        For the ``steps`` records, whose means then hold those steps too; each stretch once
        (:meth:`stretches_from_boundaries` leaves it at the epoch's end). The epoch's start only while
        this ledger holds no window from before it (it is the open epoch's); a tail only when it ends
        after one of the epoch's step windows began (so inside the epoch, whose start is known only at
        its end).

        Args:
            open_epoch: The open epoch window's start (s on the backend clock) and start info
                (``run_step``, the evaluation count); None when none is open or its start is not read yet.

        Returns:
            ``(start_s, end_s, steps)`` of each new one, for :meth:`add_between` once attributed.
        """
        boundaries = []
        epoch = _boundary(*open_epoch) if open_epoch is not None else None
        if epoch is not None and epoch[0] <= self._first_window_s:
            boundaries.append(epoch)
        boundaries += [tail for tail in self._tail_ends if tail[0] > self._first_window_s]
        out = []
        for boundary in boundaries:
            stretch = self._stretch_from(*boundary)
            if stretch is not None and stretch not in self._emitted:
                self._emitted.add(stretch)
                out.append(stretch)
        return out

    def _stretch_from(self, at_s: float, run_step: int, evaluations: Any) -> tuple[float, float, int] | None:
        """The stretch from a boundary at ``at_s`` (the steps before it: ``run_step``) to the next step window.

        None: no step window after it yet, an evaluation open there, or one began or ended before that window.
        """
        after = [w for w in self._after_break if w[0] >= at_s]
        if evaluations % 2 or not after:
            return None
        start_s, window_step, window_evaluations = min(after)
        fits = window_evaluations == evaluations and window_step > run_step
        return (at_s, start_s, window_step - run_step) if fits else None

    def add_between(self, stretch: tuple[float, float, int], energy_J: float) -> None:
        """Add one stretch of :meth:`stretches_between` with its energy (J), attributed from the samples."""
        self.between.append((*stretch, energy_J))

    def add_steps(self, steps: WindowBatch, *, warmup: bool) -> None:
        """Add attributed step windows (every one wholly covered by samples)."""
        energy_J, time_s, count = float(steps.energy_J.sum()), float(steps.time_s.sum()), steps.size
        if warmup:
            self.warmup_J += energy_J
            self.warmup_s += time_s
            self.warmup_windows += count
        else:
            self.steps_J += energy_J
            self.steps_s += time_s
            self.step_windows += count
            stand_in = inverse_probability_weights(steps.end_info) - 1.0
            self.stand_in_J += float(stand_in @ steps.energy_J)
            self.stand_in_s += float(stand_in @ steps.time_s)
            self.stand_in_steps += float(stand_in.sum())

    def add_eval(self, start_s: float, energy_J: float, time_s: float) -> None:
        """Add one evaluation window that starts at ``start_s`` (s on the backend clock)."""
        self.evals.append((start_s, energy_J, time_s))

    def add_eval_tail(self, start_s: float, energy_J: float, time_s: float) -> None:
        """Add one evaluation's tail window that starts at ``start_s`` (s on the backend clock): its end mark."""
        self.eval_tails.append((start_s, energy_J, time_s))

    def row(self, epoch_start_s: float, epoch_end_s: float = math.inf) -> LedgerColumns:
        """This rank's ledger for the epoch from ``epoch_start_s`` to ``epoch_end_s`` (s), sent with its figures."""
        inside = [(e, t) for s, e, t in self.evals if s >= epoch_start_s]
        tails = [(e, t) for s, e, t in self.eval_tails if s >= epoch_start_s]
        between = [(b - a, n, e) for a, b, n, e in self.between if epoch_start_s <= a <= b <= epoch_end_s]
        steps_between = sum(n for _, n, _ in between)
        return LedgerColumns(
            warmup_J=self.warmup_J, warmup_s=self.warmup_s, warmup_windows=float(self.warmup_windows),
            steps_J=self.steps_J, steps_s=self.steps_s, step_windows=float(self.step_windows),
            eval_J=math.fsum(e for e, _ in inside), eval_s=math.fsum(t for _, t in inside), evals=float(len(inside)),
            eval_tail_J=math.fsum(e for e, _ in tails), eval_tail_s=math.fsum(t for _, t in tails),
            stand_in_J=self.stand_in_J, stand_in_s=self.stand_in_s, stand_in_steps=self.stand_in_steps,
            between_J=math.fsum(e for _, _, e in between), between_s=math.fsum(t for t, _, _ in between),
            between_steps=float(steps_between), between_steps_most=float(steps_between),
        )  # fmt: skip


def _boundary(at_s: float, info: dict[str, Any]) -> tuple[float, int, int] | None:
    """Where a stretch of steps may start: ``(at_s, run_step, evaluations before)`` from a mark's info; None without."""
    run_step, evaluations = info.get("run_step"), info.get(EVALUATIONS_BEFORE)
    return (at_s, run_step, evaluations) if isinstance(run_step, int) and isinstance(evaluations, int) else None


def close_ledger(epoch_J: float, epoch_s: float, row: LedgerColumns, *, steps_taken: int) -> dict[str, Any]:
    """The ledger of one epoch: warm-up, steps, evaluations, evaluation tails and ``other``, in J and s.

    Args:
        epoch_J: The epoch's energy (J; NaN when no sample covers it).
        epoch_s: The epoch's time (s).
        row: The ledger (:meth:`EpochLedger.row`), combined over the ranks (energy summed, time and
            counts the slowest rank's: :meth:`~zeus_callbacks.session._rank_records.RankRecord.reduce`).
        steps_taken: Steps taken in the epoch (warm-up steps included).

    Returns:
        The epoch record's ``ledger``: ``warmup + steps + eval + eval_tail + other`` equals the epoch (J and s
        alike) wherever ``other`` is not None (``other_reason`` says why it is; ``other_note`` that it absorbs
        the error of an estimated ``steps_J``). Always: ``warmup + steps_windowed + eval + eval_tail +
        unwindowed`` equals the epoch (``unwindowed`` None only when the epoch's energy is unknown).
    """
    warmup_J, warmup_s, warmup_n = row.warmup_J, row.warmup_s, row.warmup_windows
    steps_J, steps_s, steps_n = row.steps_J, row.steps_s, row.step_windows
    eval_J, eval_s = row.eval_J, row.eval_s
    tail_J, tail_s = row.eval_tail_J, row.eval_tail_s
    windowed_J, windowed_s = steps_J, steps_s
    unwindowed_steps = max(0, steps_taken - int(warmup_n) - int(steps_n))
    # Used where every rank measured the same stretches (a rank may miss one, its samples lost) and they hold
    # no more steps than the epoch left without a window (else they are not this epoch's).
    agreed = row.between_steps == row.between_steps_most
    between = int(row.between_steps) if agreed and row.between_steps <= unwindowed_steps else 0
    if between:  # the steps between two step windows: measured, from the stretch that holds them
        steps_J += row.between_J
        steps_s += row.between_s
    estimated = unwindowed_steps - between
    reason = None
    if estimated and between:  # the rest at the mean step of every step known (measured or between)
        known = steps_n + between
        steps_J, steps_s = steps_J * (1 + estimated / known), steps_s * (1 + estimated / known)
    elif estimated and steps_n and row.stand_in_steps > 0:
        # Steps with no usable window: the measured steps' mean, each weighed by the unmeasured steps it
        # stands in for (1/p - 1), so a stretch measured at a higher share does not count for more.
        steps_J += estimated * row.stand_in_J / row.stand_in_steps
        steps_s += estimated * row.stand_in_s / row.stand_in_steps
    elif estimated and steps_n:  # every measured step had p = 1 (a window the samples missed): the plain mean
        steps_J += estimated * steps_J / steps_n
        steps_s += estimated * steps_s / steps_n
    elif estimated:
        steps_J = steps_s = math.nan
        reason = f"none of the epoch's {estimated} steps after warm-up has a measured window"
    other_J = _rest(epoch_J, warmup_J, steps_J, eval_J, tail_J)
    other_s = _rest(epoch_s, warmup_s, steps_s, eval_s, tail_s)
    if reason is None and not math.isfinite(epoch_J):
        reason = "no power sample covers the epoch"
    elif reason is None and (other_J is None or other_s is None) and estimated:
        reason = f"the {estimated} estimated steps exceed what the measured windows leave of the epoch (sampling error)"
    elif reason is None and (other_J is None or other_s is None):
        reason = "the windows hold more than the epoch (they overlap): a defect, please report it"
    note = None
    if reason is None and estimated:  # the rest of an estimate: its error lands in other, unseen unless said
        note = (
            f"includes the sampling error of steps_J (estimated from {int(steps_n) + between} of "
            f"{int(steps_n) + unwindowed_steps} steps after warm-up)"
        )
    # The exact split, whatever the sampling: what the windows leave (unmeasured steps and other together).
    unwindowed_J = _rest(epoch_J, warmup_J, windowed_J, eval_J, tail_J)
    unwindowed_s = _rest(epoch_s, warmup_s, windowed_s, eval_s, tail_s)
    return {
        "warmup_J": _finite(warmup_J), "steps_J": _finite(steps_J), "eval_J": _finite(eval_J),
        "eval_tail_J": _finite(tail_J), "other_J": other_J if reason is None else None,
        "warmup_s": warmup_s, "steps_s": _finite(steps_s), "eval_s": eval_s, "eval_tail_s": tail_s,
        "other_s": other_s if reason is None else None,
        "steps_estimated": estimated, "steps_measured": int(steps_n), "steps_between": between,
        "steps_basis": _steps_basis(int(steps_n), between, estimated), "other_reason": reason,
        "other_note": note,
        "steps_windowed_J": windowed_J, "steps_windowed_s": windowed_s,
        "unwindowed_J": unwindowed_J, "unwindowed_s": unwindowed_s,
    }  # fmt: skip


def _steps_basis(measured: int, between: int, estimated: int) -> str | None:
    """Where ``steps_J`` comes from when not every step after warm-up has a window, else None (all measured)."""
    if not estimated and not between:
        return None
    total = measured + between + estimated
    if not measured:
        return f"unknown: none of the {total} steps after warm-up has a measured window"
    if between and not estimated:
        return (
            f"measured: {measured} of {total} steps after warm-up in windows of their own, the other {between} "
            "in the stretches between those windows; steps_windowed_J holds the first only"
        )
    if between:
        return (
            f"estimated for {estimated} of {total} steps after warm-up: {measured} measured in windows of their "
            f"own and {between} in the stretches between, the other {estimated} (outside those stretches) "
            "count at their mean step; steps_windowed_J holds the first only"
        )
    return (
        f"estimated from {measured} of {total} steps after warm-up: the other {estimated} count at the "
        "epoch's mean measured step; steps_windowed_J holds the measured steps only"
    )


def _rest(whole: float, *parts: float) -> float | None:
    """``whole − Σ parts``, 0 where it is below zero by rounding only, None when unknown or below zero."""
    if not all(math.isfinite(v) for v in (whole, *parts)):
        return None
    rest = whole - math.fsum(parts)
    if rest >= 0:
        return rest
    return 0.0 if -rest <= ROUNDING * max(abs(whole), 1e-12) else None


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
