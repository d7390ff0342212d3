"""Energy of the phases of a training step (forward, backward, optimizer, dataloader) per epoch.

The adapters mark phase boundaries through the session (one clock read or CUDA event
each, nothing else on the training thread). At the end of an epoch
:class:`PhaseTracker` superposes the epoch's phase executions on the power samples
(FinGraV, arXiv 2412.12426; :func:`~zeus_callbacks.measurement.finegrain.superpose`
in steady mode with one class per phase), which separates phases much shorter than the
20 ms sensor, and reports per phase the energy per execution with its 95 % CI, the number
of executions, and the fraction of the epoch's energy the phases explain.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from zeus_callbacks.measurement._sampler import PowerSampler
from zeus_callbacks.measurement._windows import WindowBatch
from zeus_callbacks.measurement.finegrain import superpose

logger = logging.getLogger(__name__)

PHASES = ("dataloader", "forward", "backward", "forward_backward", "optimizer")
"""Phase window names. ``forward_backward`` is used where the framework has no hook between
the two (the Hugging Face Trainer)."""


@dataclass(frozen=True)
class PhaseStats:
    """One phase over one epoch.

    Attributes:
        name: Phase name (one of :data:`PHASES`).
        executions: Executions of the phase in the epoch.
        energy_J: Energy per execution, summed over the measured GPUs (J).
        energy_ci_J: 95 % CI of ``energy_J``, bootstrap over executions (J).
        time_s: Mean duration of an execution (s).
        total_J: The phase's energy over the epoch (J): ``energy_J × executions``, divided by
            ``measured_fraction`` (the executions of the steps left unmeasured are estimated).
        measured_fraction: Fraction of the epoch's steps that were measured
            (``windows.sample_fraction``; 1 when every step was).
        superposed: Executions behind ``energy_J`` (the most recent ones whose samples are
            still buffered, at most ``max_executions``).
        unresolved_reason: Why ``energy_J`` and ``total_J`` are None (the samples could not
            resolve the phase); None when they are known.
    """

    name: str
    executions: int
    energy_J: float | None
    energy_ci_J: tuple[float, float]
    time_s: float
    total_J: float | None
    superposed: int
    measured_fraction: float = 1.0
    unresolved_reason: str | None = None


UNRESOLVED = (
    "the superposition's estimate fell below zero: the samples cannot tell this phase apart from its "
    "neighbours (too short, or too regular against the sensor period, in this epoch)"
)
"""Why a phase has no energy figure when its superposed estimate is negative."""


class PhaseTracker:
    """Collect attributed phase windows of the current epoch and summarise them.

    Args:
        sampler: The session's power sampler (its raw samples feed the superposition).
        max_executions: Most recent phase executions superposed per epoch (bounds the
            epoch-end cost); the counts and totals still cover every execution.
        n_boot: Bootstrap replicates of the CIs.
    """

    def __init__(self, sampler: PowerSampler, *, max_executions: int = 4000, n_boot: int = 100) -> None:
        self.sampler = sampler
        self.max_executions = max_executions
        self.n_boot = n_boot
        self._batches: list[WindowBatch] = []

    def add_batch(self, batch: WindowBatch) -> None:
        """Keep attributed phase windows of the current epoch (one report's, in close order)."""
        if batch.size:
            self._batches.append(batch)

    def epoch_summary(self, *, measured_fraction: float = 1.0) -> list[PhaseStats]:
        """Summarise and forget the epoch's phases; empty when none was recorded.

        Args:
            measured_fraction: Fraction of the epoch's steps that had phase windows, in
                (0, 1]; each phase's ``total_J`` is scaled up by its inverse.
        """
        batches, self._batches = self._batches, []
        if not batches:
            return []
        names = np.concatenate([b.names for b in batches])
        starts = np.concatenate([b.start_s for b in batches])
        ends = np.concatenate([b.end_s for b in batches])
        energy = np.concatenate([b.energy_J for b in batches])
        kept = ends > starts
        names, starts, ends, energy = names[kept], starts[kept], ends[kept], energy[kept]
        if not len(names):
            return []
        durations = ends - starts
        masks = {n: names == n for n in PHASES}
        present = [n for n in PHASES if masks[n].any()]
        counts = {n: int(masks[n].sum()) for n in present}
        times = {n: float(np.mean(durations[masks[n]])) for n in present}
        recent = np.argsort(starts, kind="stable")[-self.max_executions :]  # as sorted() by start: stable
        estimates = self._superpose(starts[recent], ends[recent], names[recent].tolist(), times)
        stats = []
        for n in present:
            if n in estimates:
                value, ci, used = estimates[n]
            else:  # too few samples: the plain per-window attribution
                value, ci, used = float(np.mean(energy[masks[n]])), (math.nan, math.nan), 0
            if not value >= 0:  # below zero (or NaN): the fit could not tell this phase apart, not a figure
                reason = UNRESOLVED if used else "no sample covers this phase's windows"
                stats.append(PhaseStats(n, counts[n], None, ci, times[n], None, used, measured_fraction, reason))
                continue
            total_J = value * counts[n] / measured_fraction
            ci = (max(0.0, ci[0]), ci[1]) if math.isfinite(ci[0]) else ci  # energy is never below 0
            stats.append(PhaseStats(n, counts[n], value, ci, times[n], total_J, used, measured_fraction))
        return stats

    def _superpose(
        self, starts: np.ndarray, ends: np.ndarray, labels: list[str], mean_s: dict[str, float]
    ) -> dict[str, tuple[float, tuple[float, float], int]]:
        out: dict[str, tuple[float, tuple[float, float], int]] = {}
        for index in self.sampler.gpu_indices:
            t, p = self.sampler.samples(index)
            if len(t) < 10:  # an epoch of a few sensor periods: nothing to superpose
                return {}
            covered = starts >= t[0]
            if covered.sum() < 2:
                return {}
            try:
                res = superpose(
                    starts[covered], ends[covered], t, p, mode="steady",
                    sensor_delay_s=self.sampler.sensor_delay_s, n_bins=1, n_boot=self.n_boot,
                    labels=[lab for lab, c in zip(labels, covered, strict=True) if c],
                )  # fmt: skip
            except (ValueError, np.linalg.LinAlgError) as exc:
                logger.info("zeus-callbacks: phase superposition failed (%s); using per-window attribution", exc)
                return {}
            for name, prof in res.profiles.items():
                # The superposed executions give the phase's power; scale it by the mean
                # duration of *every* execution of the epoch (early ones may be unsampled).
                scale = mean_s[name] / prof.duration_s if prof.duration_s > 0 else 1.0
                energy, (lo, hi), used = out.get(name, (0.0, (0.0, 0.0), 0))
                out[name] = (
                    energy + scale * prof.energy_J,
                    (lo + scale * prof.energy_ci_J[0], hi + scale * prof.energy_ci_J[1]),  # conservative over GPUs
                    prof.executions,
                )
        return out
