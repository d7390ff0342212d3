"""What a superposition reports: a power profile and energies per execution class."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ProfileEstimate:
    """Power profile and energy per execution of one class of executions.

    Attributes:
        label: The class (``"all"``, ``"first"``, ``"warming"``, ``"steady"``, ...).
        executions: Executions behind the estimate.
        duration_s: Mean duration of an execution's own timeline (s); in steady mode it
            includes the launch gap that follows it.
        energy_J: Gross energy per execution (J): the power during the execution plus, in isolated
            mode, what the power before and after it adds above the baseline
            (:mod:`zeus_callbacks.measurement.finegrain`).
        energy_ci_J: 95 % (or ``confidence``) interval of ``energy_J`` (J).
        dynamic_energy_J: ``energy_J − baseline_W × duration_s`` (J); None without a baseline.
        dynamic_energy_ci_J: Its interval (J); None without a baseline.
        time_s: Bin centres relative to the execution's start, shape (n_bins,) (s; negative
            before the start, ``> duration_s`` in the tail).
        u: Bin centres on the normalised timeline (0 = start, 1 = end), shape (n_bins,).
        width_s: Mean bin width, shape (n_bins,) (s).
        power_W: Estimated power in each bin, shape (n_bins,) (W).
        power_ci_W: Its interval, shape (2, n_bins) (W).
        mean_power_W: ``energy_J / duration_s`` (W).
    """

    label: str
    executions: int
    duration_s: float
    energy_J: float
    energy_ci_J: tuple[float, float]
    dynamic_energy_J: float | None
    dynamic_energy_ci_J: tuple[float, float] | None
    time_s: np.ndarray
    u: np.ndarray
    width_s: np.ndarray
    power_W: np.ndarray
    power_ci_W: np.ndarray
    mean_power_W: float

    @property
    def rel_ci_halfwidth(self) -> float:
        """Half the CI width relative to the estimate (``inf`` when the estimate is 0)."""
        lo, hi = self.energy_ci_J
        return (hi - lo) / 2 / abs(self.energy_J) if self.energy_J else math.inf


@dataclass(frozen=True)
class Superposition:
    """Result of :func:`~zeus_callbacks.measurement.finegrain.superpose`.

    Attributes:
        mode: ``"steady"`` or ``"isolated"``.
        profiles: One :class:`ProfileEstimate` per reported class label.
        baseline_W: Baseline (idle) power (W): fitted from idle samples, or the given
            value, or None when neither.
        baseline_source: ``"idle samples"``, ``"given"`` or ``"unknown"``.
        subtracted: Plain-words description of what ``dynamic_energy_J`` subtracts.
        samples_used: Power samples in the fit.
        idle_samples: Samples outside every execution's extended window.
        sensor_delay_s: The delay the samples were shifted by (s).
        confidence: The CI level.
        n_boot: Bootstrap replicates.
        gap_power_W: Steady mode: fitted power of the short pauses between executions (W);
            None when there were none.
        gap_time_s: Total time of those pauses (s).
        tail_power_W: Steady mode: fitted mean power over the ``post_s`` after each run (W);
            None when there was no such time.
        tail_time_s: Total time of those tails (s).
    """

    mode: str
    profiles: dict[str, ProfileEstimate]
    baseline_W: float | None
    baseline_source: str
    subtracted: str
    samples_used: int
    idle_samples: int
    sensor_delay_s: float
    confidence: float
    n_boot: int
    gap_power_W: float | None = None
    gap_time_s: float = 0.0
    tail_power_W: float | None = None
    tail_time_s: float = 0.0

    def __getitem__(self, label: str) -> ProfileEstimate:
        """Return the profile of class ``label``."""
        return self.profiles[label]
