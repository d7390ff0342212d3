"""Which steps get windows, and how often steps are reported, within a training-thread budget.

A boundary mark is a CUDA event record: ~4–7 µs of the training thread on an H200, and a
step with phases takes four of them, then has its times read and attributed at the next
report (docs/results/finegrain.md). On a 40 ms step that is nothing; on a CPU-bound 1 ms
step it is several percent. The FinGraV estimate (arXiv 2412.12426) combines many
executions that fall at random phases of the sensor; it does not need every one of them.
So :class:`WindowSampling` measures a random subset of steps, as large as the budget
allows, and spaces the reports so that their fixed cost fits too.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np

_SMOOTHING = 0.3  # weight of the newest report in the running estimates
MIN_FRACTION = 1e-3
"""The smallest fraction of steps auto mode measures."""
logger = logging.getLogger(__name__)

MEASURE_PROBABILITY = "measure_probability"
"""A measured step window's info key: the chance it had of being measured (the share in force at its draw)."""

_MAX_REPORT_SPAN_S = 5.0  # auto mode never stretches the report interval past this much training
WINDOWS_PER_REPORT = 16
"""Auto mode spaces reports so that each carries about this many measured steps."""


class WindowSampling:
    """Choose the measured steps and the report interval.

    Fixed mode measures ``fraction`` of the steps. Auto mode (``fraction=None``) times the
    session's hooks on the measured steps, its reports and the step period, and keeps
    their sum under ``max_overhead`` of the step time:

    - ``c = (hooks + report) / measured steps`` of an interval (s): a measured step's whole
      cost, its share of the report included;
    - ``u``: what an unmeasured step's calls cost (s), from the ones the session times (its
      ``step_end``; the few checks of ``step_start`` on such a step are not timed). Every step
      pays ``u`` or ``c``, so the budget is ``(1 − f)·u + f·c ≤ max_overhead · T``;
    - fraction ``f = min(1, (max_overhead · T − u) / (c − u))``, ``T`` the step period (s), and
      the least fraction when ``u`` alone uses the budget;
    - report interval ``max(interval_steps, ⌈16 / f⌉)`` steps when ``f < 1`` and ``stretch_reports`` (one
      process: under several, reports are collectives and keep the configured cadence on
      every rank), so that a report carries ~16 measured steps and its fixed part stays a
      small share of ``c``; at most 5 s of steps. A longer interval than ``interval_steps`` is
      announced (a warning); with every step measured (``f = 1``) reports keep ``interval_steps``.
      Each time the share then falls below half of the share last announced, a further warning
      gives the new share and interval (at most ~10 over a run: the share is at least 0.1 %).

    Estimates are smoothed over reports. The measured steps are a random subset: the
    gaps between them are geometric draws of a seeded generator, so no periodic pattern
    of the loop (gradient accumulation, logging cadence) lines up with the choice, and
    every step is measured with probability ``f``.

    Args:
        fraction: Fraction of steps to measure, in [MIN_FRACTION, 1]; None for auto.
        max_overhead: Auto mode's budget, a fraction of the step time, in (0, 1).
        interval_steps: The configured steps between reports (the least interval).
        stretch_reports: Whether auto mode may lengthen the report interval.
        seed: Seed of the generator that draws the gaps (the same on every rank).
        shared: Several processes draw together: :meth:`observe` only proposes a share
            (:attr:`wanted`); the share in force changes when :meth:`agree` is called with the one every
            rank takes (the least proposed, at each report), so the ranks measure the same steps.
        announce: Warn (once) when reports come less often than ``interval_steps`` (off: no step
            energy is reported, e.g. ``windows.step`` off).

    Raises:
        ValueError: ``fraction`` or ``max_overhead`` out of range.
    """

    def __init__(
        self,
        fraction: float | None,
        max_overhead: float,
        interval_steps: int,
        *,
        stretch_reports: bool,
        seed: int = 0,
        announce: bool = True,
        shared: bool = False,
    ) -> None:
        if fraction is not None and not MIN_FRACTION <= fraction <= 1:
            raise ValueError(f"fraction must be in [{MIN_FRACTION:g}, 1], got {fraction}")
        if not 0 < max_overhead < 1:
            raise ValueError(f"max_overhead must be in (0, 1), got {max_overhead}")
        self.auto = fraction is None
        self.fraction = 1.0 if fraction is None else float(fraction)
        self.wanted = self.fraction  # the share this process's budget allows (== fraction unless shared)
        self.shared = shared
        self.max_overhead = max_overhead
        self.interval_steps = interval_steps
        self.report_every = interval_steps
        self.stretch_reports = stretch_reports
        self._rng = random.Random(seed)
        self._step_s: float | None = None
        self._cost_s: float | None = None  # per measured step, hooks and report share
        self._unmeasured_s: float | None = None  # per unmeasured step, its calls
        self._announce = announce
        self._told_fraction: float | None = None  # the share the last warning stated (None: none yet)

    def next_skip(self) -> int:
        """Steps to leave unmeasured before the next measured one (0 when every step is measured)."""
        f = self.fraction
        if f >= 1.0:
            return 0
        # Geometric on {0, 1, ...} with success probability f: mean (1 - f) / f.
        return int(math.log(1.0 - self._rng.random()) / math.log1p(-f))

    def agree(self, fraction: float) -> None:
        """Several processes: take ``fraction``, the share every rank agreed on (the least :attr:`wanted`).

        Called at the same report on every rank with the same value: the gaps drawn from then on
        (one seed everywhere) are the same on every rank.
        """
        if self.auto:
            self.fraction = min(1.0, max(MIN_FRACTION, fraction))

    def observe(
        self,
        *,
        steps: int,
        elapsed_s: float,
        hook_s: float,
        measured: int,
        report_s: float,
        unmeasured_s: float = 0.0,
        unmeasured_timed: int = 0,
    ) -> None:
        """Take one report interval's timings and update the fraction and the report interval.

        Args:
            steps: Steps in the interval.
            elapsed_s: Wall time of the interval (s).
            hook_s: Time the hooks of its measured steps took (s).
            measured: Steps measured in it.
            report_s: Time the report at its end took (s).
            unmeasured_s: Time the calls of the timed unmeasured steps took (s).
            unmeasured_timed: How many unmeasured steps were timed.
        """
        if not self.auto or steps <= 0 or elapsed_s <= 0:
            return
        self._step_s = _smooth(self._step_s, elapsed_s / steps)
        if measured:
            self._cost_s = _smooth(self._cost_s, (hook_s + report_s) / measured)
        if unmeasured_timed:
            self._unmeasured_s = _smooth(self._unmeasured_s, unmeasured_s / unmeasured_timed)
        if self._cost_s:
            budget_s, floor_s = self.max_overhead * self._step_s, self._unmeasured_s or 0.0
            if self._cost_s <= floor_s:
                wanted = 1.0  # measuring a step costs no more than skipping it
            else:
                wanted = (budget_s - floor_s) / (self._cost_s - floor_s)
            self.wanted = min(1.0, max(MIN_FRACTION, wanted))
            if not self.shared:
                self.fraction = self.wanted
        if self.stretch_reports:
            if self.fraction >= 1.0:  # every step measured: a report of interval_steps steps fits the budget
                self.report_every = self.interval_steps
                return
            most = max(self.interval_steps, int(_MAX_REPORT_SPAN_S / self._step_s))
            self.report_every = min(most, max(self.interval_steps, math.ceil(WINDOWS_PER_REPORT / self.fraction)))
            if self._announce and self._told_fraction is None and self.report_every > self.interval_steps:
                self._told_fraction = self.fraction
                # "+ epoch ends": else a run whose epochs are shorter than the interval reads as if its
                # step energy came more rarely than it does.
                logger.warning(  # one short line: a progress bar wraps a long one into several
                    "zeus-callbacks: measuring %.1f%% of steps (auto); "
                    "step energy every %d steps (not %d) + epoch ends",
                    100 * self.fraction, self.report_every, self.interval_steps,
                )  # fmt: skip
            elif self._told_fraction is not None and self.fraction < self._told_fraction / 2:
                logger.warning(
                    "zeus-callbacks: now measuring %.2f%% of steps (was %.2f%%); "
                    "step energy every %d steps + epoch ends",
                    100 * self.fraction, 100 * self._told_fraction, self.report_every,
                )  # fmt: skip
                self._told_fraction = self.fraction


def inverse_probability_weights(end_info: Sequence[dict[str, Any] | None] | np.ndarray) -> np.ndarray:
    """Each measured step's weight, 1 / the chance it had of being measured (Horvitz-Thompson), shape (m,).

    Auto sampling's share follows the step time (a budget that is a share of it), so the slow
    stretches of a loaded machine get more of their steps measured than the fast ones; a plain
    mean of the measured steps then overstates the step. Weighed by 1 / p, every step
    counts once in expectation, whatever the share was when it came.

    Args:
        end_info: The windows' end infos (:attr:`~zeus_callbacks.measurement._windows.WindowBatch.end_info`);
            a window without :data:`MEASURE_PROBABILITY` (every step measured) weighs 1.
    """
    return np.fromiter(
        (1.0 / info.get(MEASURE_PROBABILITY, 1.0) if info else 1.0 for info in end_info),
        dtype=float, count=len(end_info),
    )  # fmt: skip


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else old + _SMOOTHING * (new - old)
