"""The settings of a superposition, and the label of executions fitted but not reported."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

Mode = Literal["steady", "isolated"]
MODES: tuple[Mode, ...] = ("steady", "isolated")
DROPPED = "dropped"
"""Label of executions that are fitted (their power must go somewhere) but not reported."""


@dataclass(frozen=True)
class SuperposeSettings:
    """How :func:`~zeus_callbacks.measurement.finegrain.superpose` models and fits the samples.

    The model is FinGraV's superposition (arXiv 2412.12426, challenge C1, low sampling rate)
    written as penalised least squares after Lang & Rünger (Euro-Par 2013); see
    :mod:`zeus_callbacks.measurement.finegrain` for the equations.

    Attributes:
        mode: ``"steady"`` (back-to-back executions) or ``"isolated"`` (idle gaps between them).
        sensor_delay_s: Lag of a sample behind the power it reports (s).
        n_bins: Profile bins inside an execution.
        pre_s: Isolated mode: time before the start attributed to the execution (s).
        post_s: Isolated mode: time after the end (the power tail) attributed to it (s).
            Steady mode: time after the last execution of a run given the free tail level (s).
        n_pre: Isolated mode: bins before the start.
        n_post: Isolated mode: bins after the end. Steady mode: bins of the run tail
            (at least 1).
        baseline_W: Known baseline power (W); None: fitted from idle samples.
        launch_gap_s: Steady mode: a gap after an execution shorter than this belongs to it
            (s); None: half the execution's duration. A caller whose back-to-back executions
            share boundary marks (gap exactly 0) passes 0, so that a real pause is never
            folded into an execution.
        short_gap_s: Steady mode: a longer gap up to this long is a pause with its own free
            power level (``gap_power_W``), not idle time at the baseline (s); None: 3 median
            sample intervals (the sensor cannot tell such a pause's power from its
            neighbours' by much more). 0: every pause is idle.
        smoothing: Weight of the first-difference smoothness penalty, relative to the data.
        n_boot: Bootstrap replicates (0: no CI; the intervals collapse to the estimate).
        confidence: CI level in (0, 1).

    Raises:
        ValueError: An unknown ``mode``, or a negative ``launch_gap_s`` / ``short_gap_s``
            (on construction).
    """

    mode: Mode = "steady"
    sensor_delay_s: float = 0.0
    n_bins: int = 16
    pre_s: float = 0.04
    post_s: float = 0.1
    n_pre: int = 2
    n_post: int = 8
    baseline_W: float | None = None
    launch_gap_s: float | None = None
    short_gap_s: float | None = None
    smoothing: float = 1e-3
    n_boot: int = 200
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be 'steady' or 'isolated', got {self.mode!r}")
        if (self.launch_gap_s is not None and self.launch_gap_s < 0) or (
            self.short_gap_s is not None and self.short_gap_s < 0
        ):
            raise ValueError("launch_gap_s and short_gap_s must be >= 0")

    @property
    def steady(self) -> bool:
        """True in steady (back-to-back) mode."""
        return self.mode == "steady"

    @property
    def window_pre_s(self) -> float:
        """Time before each start in an execution's extended window (s): ``pre_s``, 0 in steady mode."""
        return 0.0 if self.steady else self.pre_s

    @property
    def window_post_s(self) -> float:
        """Time after each end in an execution's extended window (s): ``post_s``, 0 in steady mode."""
        return 0.0 if self.steady else self.post_s

    @property
    def window_n_pre(self) -> int:
        """Profile bins before each start: ``n_pre``, 0 in steady mode."""
        return 0 if self.steady else self.n_pre

    @property
    def window_n_post(self) -> int:
        """Profile bins after each end: ``n_post``, 0 in steady mode (the run tail has its own bins)."""
        return 0 if self.steady else self.n_post

    @property
    def n_tail(self) -> int:
        """Bins of the free run-tail level: ``max(n_post, 1)`` in steady mode, none in isolated mode."""
        return max(self.n_post, 1) if self.steady else 0

    def with_options(self, **options: Any) -> SuperposeSettings:
        """These settings with some fields replaced (the keyword form of :func:`superpose`).

        Args:
            **options: Fields of :class:`SuperposeSettings` and their new values.

        Returns:
            A new, validated :class:`SuperposeSettings` (``self`` when there is nothing to replace).

        Raises:
            TypeError: A keyword that is not a field.
            ValueError: An invalid value (see the class).
        """
        return dataclasses.replace(self, **options) if options else self
