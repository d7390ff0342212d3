"""The step path: which steps are measured, their window marks, and what that costs the training thread.

:class:`StepScheduler` holds everything the per-step calls touch and nothing else. The session hands
out its bound methods as its own step calls, so a step reads its state from the object it is called
on: no attribute chain, no extra call on the hot path (``benchmarks/hook_cost.py``). The rest of the
session plugs in through the hooks it holds (the power-limit profiler's step boundaries, the per-step
stop decision, the report). :class:`OverheadGovernor` times what the session costs for auto sampling.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zeus_callbacks.backends.base import Clock
from zeus_callbacks.measurement._overhead import MEASURE_PROBABILITY, WindowSampling
from zeus_callbacks.measurement._step_phases import PHASES
from zeus_callbacks.measurement._windows import BoundaryTimer, WindowMeter
from zeus_callbacks.session._ledger import EVALUATIONS_BEFORE
from zeus_callbacks.session._state import Totals

UNMEASURED_TIMING_MASK = 63
"""An unmeasured step is timed when its remaining skips are a multiple of 64."""
PHASE_REANCHOR_S = 30.0
"""With windows.phases, CUDA event timing is re-anchored this often (s)."""
EVAL_TAIL = "eval_tail"
"""The window from an evaluation's end mark to the next boundary: the next step's start, an evaluation's
start, the epoch's start or end, the run's end. It holds the evaluation's aftermath (the session's own
attribution of it and its wait for the sensor, the other callbacks' evaluation hooks, the trainer's log, a
checkpoint save, the next batch fetch); the epoch ledger counts it as ``eval_tail``, no record of its own."""


@dataclass(frozen=True)
class Decision:
    """What the session asks the training loop to do after an event.

    Attributes:
        stop_training: Stop training now (early stopping of a costly recurrence).
        reason: Why, for the log.
    """

    stop_training: bool = False
    reason: str | None = None


CONTINUE = Decision()
"""The answer of almost every step: built once, not per step."""


@dataclass
class OverheadGovernor:
    """Times one interval of steps for auto sampling; the interval's step count is the scheduler's.

    Attributes:
        t0: ``perf_counter`` when the running stretch began; None while paused.
        busy_s: Time of the stretches already ended (s).
        hook_s: Time of the measured steps' hooks (s).
        report_s: Time of the reports (s).
        unmeasured_s: Time of the timed unmeasured steps' calls (s).
        unmeasured_timed: Number of those steps.
        measured: Measured steps.
    """

    t0: float | None = None
    busy_s: float = 0.0
    hook_s: float = 0.0
    report_s: float = 0.0
    unmeasured_s: float = 0.0
    unmeasured_timed: int = 0
    measured: int = 0

    def restart(self, t0: float | None) -> None:
        """Start a new interval; ``t0`` is None while paused."""
        self.measured = self.unmeasured_timed = 0
        self.hook_s = self.busy_s = self.report_s = self.unmeasured_s = 0.0
        self.t0 = t0

    def pause(self) -> None:
        """Training pauses (epoch end, evaluation): the pause is no step's time."""
        if self.t0 is not None:
            self.busy_s += time.perf_counter() - self.t0
            self.t0 = None

    def resume(self) -> None:
        """Training resumes."""
        if self.t0 is None:
            self.t0 = time.perf_counter()

    def observe(self, sampling: WindowSampling, steps: int) -> None:
        """Give ``sampling`` the interval's timings over its ``steps`` steps; start a new interval."""
        now = time.perf_counter()
        running = self.t0 is not None
        busy_s = self.busy_s + (now - self.t0 if self.t0 is not None else 0.0)
        sampling.observe(
            steps=steps, elapsed_s=busy_s, hook_s=self.hook_s,
            measured=self.measured, report_s=self.report_s,
            unmeasured_s=self.unmeasured_s, unmeasured_timed=self.unmeasured_timed,
        )  # fmt: skip
        self.restart(now if running else None)


ReportHook = Callable[[bool, bool, bool], None]
"""``report(resolve_final, stepped, active)``: attribute the closed windows and queue their metrics;
``stepped``: steps were taken since the last report; ``active``: the run goes on (not its end)."""


class StepScheduler:
    """The per-step calls and their state (the session's step path).

    Before :meth:`begin` (and after the run ends) every call returns at once.

    Args:
        report: Called at each report (:data:`ReportHook`): the session's
            :class:`~zeus_callbacks.session._step_reports.StepReports` attribute the closed windows.

    Attributes:
        active: True between :meth:`begin` and :meth:`end`.
        power_step_start: ``(step)``: the power-limit profiler's step start (before the start
            mark); None: no profiler.
        power_step_end: ``(step, num_samples)``: its step end (after the end mark); None: none.
        step_decision: ``()`` → :class:`Decision`: the per-step stop decision, when something may
            stop the run; None: nothing can.
    """

    def __init__(self, report: ReportHook) -> None:
        self._report = report
        self.active = False  # started and not finished
        self._quiet_left = 0  # planned steps with nothing to do, not yet taken (see _plan_quiet_steps)
        self._plans_quiet_steps = True  # False: every step takes the whole path (plans_quiet_steps)
        self._skip = 0  # steps to leave unmeasured before the next measured one
        self._measuring = False  # the current step has windows
        self._time_unmeasured = False  # an unmeasured step whose step_end times itself
        self._dataloader_open = False  # phases: a measured step's dataloader gap is open
        self._phase_open: str | None = None  # the phase window open now (phases tile the step)
        self._phase_windows = False  # windows.phases
        self._tail_open = False  # the eval_tail window is open (an evaluation ended; no boundary since)
        self._evaluations = 0  # evaluations begun and ended: odd while one is open (see EVALUATIONS_BEFORE)
        self._step_windows = True  # windows.step
        self._warmup_left = 0  # warm-up steps still to come (measured, reported apart: windows.warmup_steps)
        self._warmup_done = 0  # warm-up steps taken in this run
        self._step_index = 0  # the measured step's index, as step_start received it
        # The chance the coming measured step had of being measured: the share in force when the skip before it
        # was drawn (1 for warm-up). Auto sampling's share follows the step time, so steps measured while the
        # share is high are the slow ones: estimates weigh each measured step by 1 / this (Horvitz-Thompson).
        self._draw_probability = 1.0
        self._force_next = False  # measure the step after the measured one now open (measure_next_step)
        self._mark: Any = None  # the meter's mark(): one boundary
        # The run's meter, timer and clock: assigned by begin(), read only once a run has started.
        self._meter: WindowMeter
        self._timer: BoundaryTimer
        self._clock: Clock
        self._anchored_s = -math.inf
        # Which steps get windows (windows.sample_fraction) and the report interval.
        self._sampling = WindowSampling(1.0, 0.002, 1, stretch_reports=False)
        self._governor = OverheadGovernor()
        self._totals = Totals()
        self._epoch_steps = 0
        self._epoch_measured = 0  # steps of this epoch that got windows
        self._steps_since_report = 0
        self._interval_steps = 0  # steps of the governor's interval (counted here: the hot path bumps it)
        self.power_step_start: Callable[[int], None] | None = None
        self.power_step_end: Callable[[int, int | None], None] | None = None
        self.step_decision: Callable[[], Decision] | None = None

    # ------------------------------------------------------------------ seams
    @property
    def sampling(self) -> WindowSampling:
        """Which steps get windows and how often steps are reported (``windows.sample_fraction``)."""
        return self._sampling

    @property
    def measuring(self) -> bool:
        """True between the start and end of a measured step."""
        return self._measuring

    @property
    def step_end_reads_arguments(self) -> bool:
        """See :attr:`~zeus_callbacks.session.EnergySession.step_end_reads_arguments`."""
        return self._measuring or self.power_step_end is not None

    @property
    def quiet_steps_left(self) -> int:
        """Steps counted ahead whose calls have not come yet (their calls return at once)."""
        return self._quiet_left

    @property
    def steps_to_skip(self) -> int:
        """Unmeasured steps before the next measured one (quiet steps counted ahead included)."""
        return self._skip

    @property
    def plans_quiet_steps(self) -> bool:
        """See :attr:`~zeus_callbacks.session.EnergySession.plans_quiet_steps`; False takes back steps counted ahead."""
        return self._plans_quiet_steps

    @plans_quiet_steps.setter
    def plans_quiet_steps(self, plans: bool) -> None:
        if not plans:
            self.take_back_quiet_steps()
        self._plans_quiet_steps = plans

    @property
    def epoch_steps(self) -> int:
        """Steps of the current epoch (quiet steps counted ahead included)."""
        return self._epoch_steps

    @property
    def epoch_counts(self) -> tuple[int, int]:
        """(steps, measured steps) of the current epoch (quiet steps counted ahead taken back first)."""
        self.take_back_quiet_steps()
        return self._epoch_steps, self._epoch_measured

    @property
    def warmup_done(self) -> int:
        """Warm-up steps taken in this run (``windows.warmup_steps``)."""
        return self._warmup_done

    # ------------------------------------------------------------------ start
    def begin(
        self, totals: Totals, meter: WindowMeter, timer: BoundaryTimer, clock: Clock, sampling: WindowSampling,
        *, step_windows: bool, phase_windows: bool, warmup_steps: int = 0,
    ) -> None:  # fmt: skip
        """Start the step path of a run; ``totals`` (the session's, the carried steps in it) counts its steps.

        The first ``warmup_steps`` steps are measured whatever the sampling draws (their ends carry ``warmup``).
        """
        self._totals = totals
        self._meter, self._timer, self._clock = meter, timer, clock
        self._mark = meter.mark
        self._step_windows = step_windows
        self._phase_windows = phase_windows
        self._sampling = sampling
        self._warmup_left = warmup_steps if step_windows else 0
        self._warmup_done = 0
        # The first step after warm-up is drawn like any other.
        self._force_next = False
        self._draw_next_skip()
        self._quiet_left = 0
        self._measuring = self._dataloader_open = False
        self._interval_steps = 0
        self._governor.restart(time.perf_counter())
        self._phase_open = None
        self._tail_open = False
        self.active = True

    def end(self) -> None:
        """The run ends: no more steps; a step cut short is not measured."""
        self.active = False
        self.take_back_quiet_steps()
        self._measuring = False
        self.discard_phases()

    def report(self, *, resolve_final: bool = False) -> None:
        """Report now: the steps counted ahead are taken back, and the report hook runs."""
        self.take_back_quiet_steps()
        stepped = self._steps_since_report > 0
        self._steps_since_report = 0
        self._report(resolve_final, stepped, self.active)

    # -------------------------------------------------------------- hot path
    def step_start(self, step: int, *, phase: str | None = None) -> None:
        """Open the step window. Hot path: one clock read or CUDA event record.

        Args:
            step: The global step index.
            phase: With ``windows.phases``, the phase window the step begins with
                (``"forward"``, ``"forward_backward"``), opened at the same mark; the
                ``dataloader`` phase closes there too.
        """
        if self._quiet_left or not self.active:
            return
        # Optimiser hook: the power-limit profiler switches limits at step boundaries
        # (before the compute; in a tiled step window it falls with the fetch; the profiler times its own steps).
        if self.power_step_start is not None:
            self.power_step_start(step)
        # The first step after an evaluation: one mark ends the evaluation's tail and, if the step is
        # measured, opens its windows, so the two tile (None: no tail open, the step takes its own mark).
        token = self.close_eval_tail() if self._tail_open else None
        if self._skip:  # not a measured step (windows.sample_fraction)
            self._skip -= 1
            if not self._skip & UNMEASURED_TIMING_MASK:
                self._time_unmeasured = True  # its step_end times itself: auto's budget covers these too
            return
        t0 = time.perf_counter()
        self._measuring = True
        self._step_index = step
        meter = self._meter
        if self._phase_windows:
            if token is None:
                token = self._mark()  # the compute begins: dataloader | forward
            if self._dataloader_open:
                meter.end_at("dataloader", token)
                self._dataloader_open = False
            if phase is not None:
                meter.begin_at(phase, token)
                self._phase_open = phase
            if self._epoch_measured % 16 == 0:  # a clock read every 16 measured steps, not every step
                self._maybe_reanchor()
            if self._step_windows and not meter.is_open("step"):
                meter.begin_at("step", token)  # no boundary before it (no epoch_start): from here
        elif self._step_windows and not meter.is_open("step"):
            # Most measured steps opened at the last boundary (the previous step's end mark)
            # and take no mark here; one with no boundary before it begins now.
            meter.begin_at("step", self._mark() if token is None else token)
        self._governor.hook_s += time.perf_counter() - t0

    def step_end(self, step: int, *, num_samples: int | None = None, num_tokens: int | None = None) -> Decision:
        """Close the step window; every ``logging.interval_steps`` steps, queue step metrics.

        Step windows tile the timeline: a measured step's end mark is also the start of
        the next step's window when that one is measured too (one mark per measured step),
        so the batch fetch between two steps belongs to the step after it. The step before
        a measured one, if unmeasured, takes that start mark here. With ``windows.phases``
        the open phase (e.g. ``optimizer``) closes and the next step's ``dataloader`` phase
        opens at the same mark.

        Args:
            step: The global step index.
            num_samples: Training samples in the step (per process), for energy per sample.
            num_tokens: Input tokens in the step, for energy per token.

        Returns:
            Whether to stop training.
        """
        if self._quiet_left:  # counted ahead by _plan_quiet_steps
            self._quiet_left -= 1
            return CONTINUE
        if not self.active:
            return CONTINUE
        timed = None  # perf_counter at entry when this unmeasured step is timed (auto's budget)
        if self._measuring:
            self._close_step_windows(num_samples, num_tokens)
        elif not self._skip and (self._step_windows or self._phase_windows):  # the next step is measured: it opens here
            t0 = time.perf_counter()
            self._open_step_at(self._mark())
            self._governor.hook_s += time.perf_counter() - t0
        elif self._time_unmeasured:
            timed = time.perf_counter()
        if self.power_step_end is not None:
            self.power_step_end(step, num_samples)
        self._epoch_steps += 1
        self._totals.steps += 1
        self._steps_since_report += 1
        self._interval_steps += 1
        if self._steps_since_report >= self._sampling.report_every:
            self.timed_report()
            timed, self._time_unmeasured = None, False  # a report is timed on its own
        if self._interval_steps >= self._sampling.report_every:
            self._governor.observe(self._sampling, self._interval_steps)  # no quiet step is counted ahead here
            self._interval_steps = 0
            timed, self._time_unmeasured = None, False  # the interval it would count in has ended
        decide = self.step_decision
        decision = CONTINUE if decide is None else decide()
        if timed is not None:
            governor = self._governor
            governor.unmeasured_s += time.perf_counter() - timed
            governor.unmeasured_timed += 1
            self._time_unmeasured = False
        if not decision.stop_training:
            self._plan_quiet_steps()
        return decision

    def _plan_quiet_steps(self) -> None:
        """Count the coming steps that need nothing from the session now, so their calls return at once.

        Under ``windows.sample_fraction`` most steps are unmeasured, and each of their
        calls runs right after a step of training with cold caches: every attribute it
        touches costs. Steps that are unmeasured, untimed, before the next report and
        timing interval, with no power limiter or stop decision to serve, are counted here
        in one go (step counters and skips); their ``step_start`` and ``step_end`` then
        read one attribute. Any other call takes back the steps not yet taken
        (:meth:`take_back_quiet_steps`) before it reads a counter.
        """
        skip = self._skip
        if not skip or self._dataloader_open or self.power_step_start is not None or self.step_decision is not None:
            return
        if not self._plans_quiet_steps:  # the reference path (plans_quiet_steps)
            return
        if self._tail_open:  # an evaluation inside this step: the next step_start must end its tail
            return
        untimed = (skip & UNMEASURED_TIMING_MASK or UNMEASURED_TIMING_MASK + 1) - 1  # before the next timed step
        every = self._sampling.report_every
        count = min(untimed, every - 1 - self._steps_since_report, every - 1 - self._interval_steps)
        if count <= 0:
            return
        self._count_steps_ahead(count)
        self._quiet_left = count

    def take_back_quiet_steps(self) -> None:
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
        self._interval_steps += steps

    def _close_step_windows(self, num_samples: int | None, num_tokens: int | None) -> None:
        """Close a measured step's windows at one end mark; draw how many steps to skip next.

        The same mark opens the next step's windows when that step is measured too.
        """
        t0 = time.perf_counter()
        meter = self._meter
        token = self._mark() if self._step_windows or self._phase_windows else None  # neither: nothing to mark
        if self._step_windows:
            # run_step: the step's place among every step taken (0-based, a resumed run's included).
            info = {"step": self._step_index, "run_step": self._totals.steps, "num_samples": num_samples,
                    "num_tokens": num_tokens, MEASURE_PROBABILITY: self._draw_probability,
                    EVALUATIONS_BEFORE: self._evaluations}  # fmt: skip
            if self._warmup_left:
                info["warmup"] = True
                self._warmup_left -= 1
                self._warmup_done += 1
            meter.end_at("step", token, info)
        if self._phase_open is not None:
            meter.end_at(self._phase_open, token)
            self._phase_open = None
        self._measuring = False
        self._epoch_measured += 1
        governor = self._governor
        governor.measured += 1
        self._draw_next_skip()
        if self._force_next:
            self._force_next = False
            self._skip, self._draw_probability = 0, 1.0
        if not self._skip and token is not None:
            self._open_step_at(token)
        governor.hook_s += time.perf_counter() - t0

    def measure_next_step(self) -> None:
        """Measure the step after the current one, whatever the sampling draws (its chance: 1).

        For the last step before a pause (an evaluation, the epoch's end, the run's end): with it
        measured, the steps since the last measured one form a stretch of steps only, which the
        epoch ledger and the ``steps`` record measure whole, instead of estimating them from means
        or leaving an epoch's last steps with none (docs/concepts.md, "Because the windows tile").
        Called during a step, before its :meth:`step_end`, the next step's window opens at that
        step's end mark; between steps, at the next step's start. Measured with certainty, the step
        weighs 1 in the means (each step the sampling drew weighs 1 / its chance), so it stands for
        itself only when other steps were measured near it. The draws after it go on from a fresh
        gap: the gaps are geometric, so every other step keeps its chance.
        """
        if not self.active or not (self._step_windows or self._phase_windows):
            return
        self.take_back_quiet_steps()
        if self._measuring:
            self._force_next = True  # its windows close at step_end, which draws the next gap: forced there
        elif self._skip:
            self._skip, self._draw_probability = 0, 1.0

    def _draw_next_skip(self) -> None:
        """Draw the unmeasured steps before the next measured one, noting the share they were drawn with."""
        if self._warmup_left:
            self._skip, self._draw_probability = 0, 1.0
        else:
            self._draw_probability = self._sampling.fraction
            self._skip = self._sampling.next_skip()

    def _open_step_at(self, token: Any) -> None:
        """Open the next (measured) step's window, and its ``dataloader`` phase, at boundary ``token``."""
        if self._step_windows:
            self._meter.begin_at("step", token)
        if self._phase_windows:
            self._meter.begin_at("dataloader", token)  # the batch fetch until the step's compute begins
            self._dataloader_open = True

    def open_step_at_boundary(self, token: Any | None) -> None:
        """At an epoch start or after an evaluation: open the next step's windows if it is measured.

        Args:
            token: A mark already taken at this boundary (shared), or None to take one if needed.
        """
        self.take_back_quiet_steps()
        if self._skip or not (self._step_windows or self._phase_windows):
            return
        self._open_step_at(self._mark() if token is None else token)

    def _maybe_reanchor(self) -> None:
        # Sub-sample-period phases need the GPU-CPU clock offset fresh: drift of ~10 ppm
        # would otherwise shift boundaries by a 20 ms sample within an hour-long epoch.
        now_s = self._clock.now_s()
        if now_s - self._anchored_s >= PHASE_REANCHOR_S:
            started = time.perf_counter()
            self._timer.anchor()  # one device sync per 30 s
            self._anchored_s = now_s
            # Most of a sync is the queued GPU work finishing, not work of ours: keep it out of the budget.
            self._governor.hook_s -= time.perf_counter() - started

    # ---------------------------------------------------------- step phases
    def phase_begin(self, name: str) -> None:
        """Open phase window ``name`` (one of :data:`~zeus_callbacks.measurement._step_phases.PHASES`).

        A no-op unless ``windows.phases`` is on and the step is measured
        (``windows.sample_fraction``). Hot path: one clock read or CUDA event record.
        ``dataloader`` is opened and closed by :meth:`step_end` / :meth:`step_start` themselves;
        where one phase ends as the next begins, :meth:`phase_switch` takes one mark for both.
        """
        if self._measuring and self._phase_windows:  # most steps: unmeasured, one read
            t0 = time.perf_counter()
            self._meter.begin_at(name, self._mark())
            self._phase_open = name
            self._governor.hook_s += time.perf_counter() - t0

    def phase_end(self, name: str) -> None:
        """Close phase window ``name`` (a no-op unless ``windows.phases`` is on, or if it is not open)."""
        if self._measuring and self._phase_windows and self._meter.is_open(name):
            t0 = time.perf_counter()
            self._meter.end_at(name, self._mark())
            if self._phase_open == name:
                self._phase_open = None
            self._governor.hook_s += time.perf_counter() - t0

    def phase_switch(self, ended: str, begun: str) -> None:
        """End phase ``ended`` and begin phase ``begun`` at one shared mark (they tile the step exactly).

        A no-op unless ``windows.phases`` is on and the step is measured; ``ended`` need not be open.
        """
        if self._measuring and self._phase_windows:  # most steps: unmeasured, one read
            t0 = time.perf_counter()
            meter = self._meter
            token = self._mark()
            meter.end_at(ended, token)
            meter.begin_at(begun, token)
            self._phase_open = begun
            self._governor.hook_s += time.perf_counter() - t0

    def phase_discard(self, name: str) -> None:
        """Drop an open phase window unmeasured (e.g. no optimizer step after this micro-batch)."""
        if self._measuring and self._phase_windows:  # most steps: unmeasured, one read
            self._meter.discard(name)
            if self._phase_open == name:
                self._phase_open = None

    def discard_phases(self) -> None:
        """Drop the open step and phase windows (an epoch's or the run's end)."""
        self._meter.discard("step")  # a step window opened ahead of a step that did not come
        if self._phase_windows:
            for name in PHASES:
                self._meter.discard(name)
            self._phase_open = None
            self._dataloader_open = False

    # ----------------------------------------------------- epochs and pauses
    def begin_epoch(self) -> None:
        """A new epoch: re-anchor CUDA event timing once, reset the epoch's counters, resume timing."""
        self.take_back_quiet_steps()
        self._timer.anchor()
        self._anchored_s = self._clock.now_s()
        self._epoch_steps = 0
        self._epoch_measured = 0
        self._governor.resume()

    def timed_report(self) -> None:
        """Report now, its time charged to auto sampling's budget."""
        t0 = time.perf_counter()
        self.report()
        self._governor.report_s += time.perf_counter() - t0

    def charge_report_s(self, report_s: float) -> None:
        """Charge ``report_s`` (s) of a report made elsewhere (an epoch's end) to auto sampling's budget."""
        self._governor.report_s += report_s

    def eval_begins(self) -> None:
        """An evaluation begins: timing pauses; a step window opened ahead is dropped.

        The next measured step's window then opens at its own :meth:`step_start`, not where the
        evaluation ends: what comes between (the other callbacks' evaluation hooks, the evaluation's
        exchange between ranks, a checkpoint) is no step's (an outside tester: 202 ms against 26 ms)
        but the :data:`EVAL_TAIL` window's (:meth:`open_eval_tail`).
        """
        self.pause_timing()
        self._evaluations += 1
        if not self._measuring:  # the window opened ahead would otherwise hold the whole evaluation
            self._meter.discard("step")
            if self._phase_windows:
                self._meter.discard("dataloader")
                self._dataloader_open = False

    def open_eval_tail(self, token: Any) -> None:
        """An evaluation ended at mark ``token``: open the :data:`EVAL_TAIL` window there.

        Not inside a measured step (an evaluation the loop runs within a step): the step's window holds
        what follows the evaluation. The tail ends at the next boundary (:meth:`step_start`,
        :meth:`close_eval_tail`).
        """
        if self._measuring:
            return
        self._meter.begin_at(EVAL_TAIL, token)
        self._tail_open = True

    def close_eval_tail(self, token: Any | None = None) -> Any | None:
        """End the :data:`EVAL_TAIL` window at boundary ``token`` (an evaluation's start, an epoch's, the run's end).

        Args:
            token: A mark already taken at this boundary (shared), or None to take one if a tail is open.

        Returns:
            The boundary's mark: ``token``, or the one taken here (None: no tail was open and none given).
        """
        if not self._tail_open:
            return token
        self._tail_open = False
        if token is None:
            token = self._mark()
        # where it ends among the steps: the ledger measures the steps from here to the next step window
        self._meter.end_at(EVAL_TAIL, token, {"run_step": self._totals.steps, EVALUATIONS_BEFORE: self._evaluations})
        return token

    def pause_timing(self) -> None:
        """Training pauses (epoch end, evaluation): the pause is no step's time."""
        self._governor.pause()

    @property
    def evaluations(self) -> int:
        """Evaluation starts and ends so far (odd while one is open): :data:`EVALUATIONS_BEFORE`."""
        return self._evaluations

    def eval_ends(self) -> None:
        """An evaluation ends: timing resumes; the evaluation count moves on (even again: none open)."""
        self._evaluations += 1
        self.resume_timing()

    def resume_timing(self) -> None:
        """Training resumes after a pause."""
        self._governor.resume()
