"""``superpose``: the superposition pipeline, design → solve → bootstrap → summary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from zeus_callbacks.measurement.finegrain._superposition.bootstrap import bootstrap, strata
from zeus_callbacks.measurement.finegrain._superposition.design import columns, design_matrix
from zeus_callbacks.measurement.finegrain._superposition.results import Superposition
from zeus_callbacks.measurement.finegrain._superposition.settings import SuperposeSettings
from zeus_callbacks.measurement.finegrain._superposition.solve import problem, solve
from zeus_callbacks.measurement.finegrain._superposition.summary import summarise
from zeus_callbacks.measurement.finegrain._superposition.timeline import (
    check_inputs,
    executions,
    pauses,
    sample_intervals,
)


def superpose(
    starts_s: Sequence[float] | np.ndarray,
    ends_s: Sequence[float] | np.ndarray,
    sample_times_s: Sequence[float] | np.ndarray,
    sample_power_W: Sequence[float] | np.ndarray,
    *,
    labels: Sequence[str] | np.ndarray | None = None,
    seed: int | np.random.Generator = 0,
    settings: SuperposeSettings | None = None,
    **options: Any,
) -> Superposition:
    """Superpose the samples of many executions into a power profile and energy per execution.

    FinGraV (Singhania, Aga, Ibrahim, arXiv 2412.12426, 2024), challenge C1 (low sampling rate),
    solved by penalised least squares after Lang & Rünger (Euro-Par 2013);
    :mod:`zeus_callbacks.measurement.finegrain` states the model and the modes. The executions'
    boundaries must be on the sample clock (e.g. by :class:`~zeus_callbacks.measurement._windows.CudaEventTimer`).

    Args:
        starts_s: Execution starts on the sample clock, shape (n,) (s), increasing.
        ends_s: Execution ends, shape (n,) (s), ``ends_s[i] > starts_s[i]``.
        sample_times_s: Sample timestamps, shape (m,) (s), increasing.
        sample_power_W: Sample values, shape (m,) (W).
        labels: Class of each execution, shape (n,); :data:`DROPPED` executions are fitted
            but not reported. Default: every execution is ``"all"``.
        seed: Seed or Generator of the bootstrap.
        settings: How to model and fit (:class:`SuperposeSettings`); default: its defaults.
        **options: Fields of :class:`SuperposeSettings` (``mode``, ``sensor_delay_s``,
            ``n_bins``, ``pre_s``, ``post_s``, ``n_pre``, ``n_post``, ``baseline_W``,
            ``launch_gap_s``, ``short_gap_s``, ``smoothing``, ``n_boot``, ``confidence``),
            overriding ``settings``.

    Returns:
        The :class:`Superposition`: one :class:`ProfileEstimate` per reported class, with
        ``power_W`` of shape (n_pre + n_bins + n_post,) (W; steady mode: n_bins) and energies
        per execution (J).

    Raises:
        ValueError: Mismatched shapes, no execution, fewer than 3 samples, a non-positive
            duration, a negative gap length, or an unknown mode.
        TypeError: A keyword that is not a field of :class:`SuperposeSettings`.
        numpy.linalg.LinAlgError: The normal equations are singular.
    """
    cfg = (settings if settings is not None else SuperposeSettings()).with_options(**options)
    starts, ends, times, power = check_inputs(starts_s, ends_s, sample_times_s, sample_power_W)
    execs = executions(starts, ends, labels, cfg)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)

    samples = sample_intervals(times, power, cfg.sensor_delay_s)
    gaps = pauses(execs, samples.median_interval_s, cfg)
    design = design_matrix(execs, samples, gaps, columns(execs, cfg), cfg)
    prob = problem(design, samples, cfg)
    owners = strata(execs, samples, gaps, design.columns)

    theta = solve(prob, np.ones(samples.m))
    replicates = bootstrap(prob, owners, cfg.n_boot, rng)
    return summarise(cfg, execs, gaps, design, prob, theta, replicates, int(owners.idle_rows.size))
