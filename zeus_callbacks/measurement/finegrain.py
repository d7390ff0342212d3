"""Fine-grain energy of short, repeated executions from a coarse power-sample stream.

Pure functions (numpy only, no framework, no sensor calls) implementing the FinGraV
methodology (Singhania, Aga, Ibrahim: *FinGraV: Methodology for Fine-Grain GPU Power
Visibility and Insights*, AMD, arXiv 2412.12426, 2024):

- **Execution-time binning** (FinGraV's answer to its challenge C3, execution-time
  variation): :func:`bin_executions` groups executions by duration and keeps the dominant group;
  throttled or contended executions are dropped, counted, and warned about when too many.
- **Superposition** (FinGraV, challenge C1, low sampling rate; after Lang & Rünger,
  Euro-Par 2013): the samples of many executions, each mapped onto its execution's timeline, are combined into one power
  profile. :func:`superpose` writes every sample as a linear measurement of that profile
  and solves for it by least squares, so windows much shorter than the sensor's 20 ms
  averaging are resolved when executions fall at random phases of the sampler.
- **Power-profile differentiation** (FinGraV, challenge C4, power variance across
  executions): :func:`differentiate` separates first-execution, warming and steady-state profiles and
  warns when their energies differ by more than 10 % (misreading them cost up to ~80 % in
  FinGraV's measurements).

Time base and units: every time is in seconds on the *sample clock* (NVML sample
timestamps are the CPU realtime clock; window boundaries are put on it by
:class:`~zeus_callbacks.measurement.windows.CudaEventTimer`). Powers are W, energies J.

Sample model (as in :mod:`~zeus_callbacks.measurement.attribution`): sample ``k`` with
timestamp ``t_k`` and value ``p_k`` is the mean power over ``(t_{k-1} - d, t_k - d]`` where
``d`` is the sensor delay. Its energy ``p_k (t_k - t_{k-1})`` is therefore the integral of
the true power over that interval, a linear function of the profile:

    p_k Δ_k = Σ_j g_j · A[k, j] + c · (Δ_k − Σ_j A[k, j]) + noise

where ``A[k, j]`` is the time (s) sample ``k``'s interval spends in profile bin ``j`` of any
execution, ``g_j`` the power of bin ``j`` (W) and ``c`` the baseline (idle) power of time
outside every execution (in steady mode, pauses and run tails have levels of their own,
see below). A first-difference smoothness penalty fixes what the data cannot
(e.g. the shape of a 1 ms execution run back-to-back under a 20 ms sensor: its level, and
hence its energy, stays determined by the data).

Modes:

- ``"steady"``: back-to-back executions. The launch gap after an execution (shorter than
  half its duration, or than ``launch_gap_s``) belongs to it, so ``energy_J`` is what the
  long back-to-back reference measures: energy of the run / number of executions. Time
  outside every execution is not all idle, so it is not all modelled at the baseline:

  * a *pause* between executions of at most ``short_gap_s`` (a sync between chunks of
    back-to-back work, a few ms) gets one free power level of its own, ``gap_power_W``:
    the GPU is still near full power then (on an H200 power decays over 40–60 ms after
    work stops, DESIGN.md), and modelling it at the idle baseline would push the
    excess into the executions (+1–2 % at 1 ms on an H200 with 0.25 s chunks);
  * the ``post_s`` after the last execution of a run (a longer pause, or the end) gets
    another free level, ``tail_power_W``, so the power tail after a run does not bias the
    baseline fitted from the idle samples.

  Neither is part of any execution's energy: the back-to-back reference has no pauses,
  and one tail per run is negligible in it.
- ``"isolated"``: executions separated by idle gaps (≥ ``pre_s + post_s``). Each
  execution's timeline is extended by ``pre_s`` before and ``post_s`` after, so the delayed
  rise and the power tail after the work (40–60 ms on an H200) are attributed to it.

Energies reported (per execution, mean over the executions of a class):

- ``energy_J`` (gross): ``Σ_inside g_j w_j + Σ_pre/post (g_j − c) w_j``: the power during
  the execution plus what the tail adds above baseline.
- ``dynamic_energy_J``: ``energy_J − c · duration_s``: the baseline (idle) power over the
  execution's own duration is subtracted; ``None`` when the baseline is unknown.

Confidence intervals come from a bootstrap over executions (each sample belongs to the
execution whose extended window holds its midpoint; idle samples are resampled as a
separate stratum), percentile method, with a seeded :class:`numpy.random.Generator`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

logger = logging.getLogger(__name__)

Mode = Literal["steady", "isolated"]
DROPPED = "dropped"
"""Label of executions that are fitted (their power must go somewhere) but not reported."""
DIFFERENCE_WARNING = 0.10
"""Relative energy difference between first / warming / steady profiles that warrants a warning."""


# ------------------------------------------------------------------------------ binning
@dataclass(frozen=True)
class Binning:
    """Executions grouped by duration (FinGraV execution-time binning, challenge C3).

    Attributes:
        keep: Which executions are kept, shape (n,) bool.
        reference_s: The duration executions are compared with (median of all) (s).
        groups: ``(low_s, high_s, count)`` of each duration group, log-spaced by
            ``rel_tol``, most populated first.
        dropped: How many executions were dropped.
        dropped_fraction: ``dropped / n`` (0 when n = 0).
        too_many_dropped: True when ``dropped_fraction`` exceeded the allowed fraction
            (a warning was logged).
    """

    keep: np.ndarray
    reference_s: float
    groups: tuple[tuple[float, float, int], ...]
    dropped: int
    dropped_fraction: float
    too_many_dropped: bool


def bin_executions(
    durations_s: Sequence[float] | np.ndarray,
    *,
    rel_tol: float = 0.1,
    max_drop_fraction: float = 0.2,
    warn: bool = True,
) -> Binning:
    """Keep executions whose duration is within ``rel_tol`` of the median; drop the rest.

    FinGraV bins executions by their execution time and analyses the dominant bin only,
    because an execution that took longer (throttled, contended, preempted) has a
    different power profile and would blur the superposition.

    Args:
        durations_s: Duration of each execution, shape (n,) (s); must be > 0.
        rel_tol: Half-width of the kept bin relative to the median duration.
        max_drop_fraction: Warn (once per call) when more than this fraction is dropped.
        warn: Log that warning here; False for a caller that bins again and again and warns
            once itself (:func:`binning_warning`).

    Returns:
        The :class:`Binning`.

    Raises:
        ValueError: A duration is not positive, or ``rel_tol`` is not positive.

    Example:
        >>> b = bin_executions([1.0, 1.01, 0.99, 1.0, 3.0])
        >>> b.keep.tolist(), b.dropped
        ([True, True, True, True, False], 1)
    """
    d = np.asarray(durations_s, dtype=np.float64)
    if rel_tol <= 0:
        raise ValueError(f"rel_tol must be > 0, got {rel_tol}")
    if d.size and not np.all(d > 0):
        raise ValueError("execution durations must be positive")
    if d.size == 0:
        return Binning(np.zeros(0, bool), math.nan, (), 0, 0.0, False)
    ref = float(np.median(d))
    keep = np.abs(d / ref - 1.0) <= rel_tol
    # Report the duration histogram in log-spaced bins of relative width rel_tol.
    width = math.log1p(rel_tol) * 2
    idx = np.floor((np.log(d / ref) + width / 2) / width).astype(int)
    groups = []
    for b in np.unique(idx):
        sel = d[idx == b]
        groups.append((float(sel.min()), float(sel.max()), int(sel.size)))
    groups.sort(key=lambda g: -g[2])
    dropped = int(d.size - keep.sum())
    fraction = dropped / d.size
    too_many = fraction > max_drop_fraction
    binning = Binning(keep, ref, tuple(groups), dropped, fraction, too_many)
    if too_many and warn:
        binning_warning(binning, max_drop_fraction)
    return binning


def binning_warning(binning: Binning, max_drop_fraction: float = 0.2) -> None:
    """Log the one warning for a binning that dropped more than ``max_drop_fraction`` of the executions."""
    logger.warning(
        "zeus-callbacks: execution-time binning dropped %d of %d executions (%.0f%% > %.0f%%): durations "
        "vary a lot (throttling, contention?); the profile describes the %.3g ms bin only",
        binning.dropped,
        binning.keep.size,
        100 * binning.dropped_fraction,
        100 * max_drop_fraction,
        binning.reference_s * 1e3,
    )


# ------------------------------------------------------------------------ superposition
@dataclass(frozen=True)
class ProfileEstimate:
    """Power profile and energy per execution of one class of executions.

    Attributes:
        label: The class (``"all"``, ``"first"``, ``"warming"``, ``"steady"``, ...).
        executions: Executions behind the estimate.
        duration_s: Mean duration of an execution's own timeline (s); in steady mode it
            includes the launch gap that follows it.
        energy_J: Gross energy per execution (J); see the module docstring.
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
    """Result of :func:`superpose`.

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


def _bin_edges(
    start: float, end: float, lo: float, hi: float, pre_s: float, post_s: float, n_pre: int, n_in: int, n_post: int
) -> np.ndarray:
    parts = []
    if n_pre:
        parts.append(np.linspace(start - pre_s, start, n_pre + 1)[:-1])
    parts.append(np.linspace(start, end, n_in + 1))
    if n_post:
        parts.append(np.linspace(end, end + post_s, n_post + 1)[1:])
    return np.clip(np.concatenate(parts), lo, hi)


def _overlap_with(a: np.ndarray, b: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Time each interval ``(a_k, b_k]`` spends in the disjoint, sorted intervals ``(lo_i, hi_i]`` (s)."""
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    if lo.size == 0:
        return np.zeros_like(a)
    knots = np.column_stack([lo, hi]).ravel()
    cum = np.concatenate(([0.0], np.cumsum(hi - lo)))
    covered = np.column_stack([cum[:-1], cum[1:]]).ravel()  # time covered up to each knot
    return np.interp(b, knots, covered) - np.interp(a, knots, covered)


def _inside(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Whether each ``x`` lies in one of the disjoint, sorted intervals ``(lo_i, hi_i]``."""
    keep = hi > lo
    knots = np.column_stack([lo[keep], hi[keep]]).ravel()
    return np.searchsorted(knots, x, side="left") % 2 == 1


def superpose(
    starts_s: Sequence[float] | np.ndarray,
    ends_s: Sequence[float] | np.ndarray,
    sample_times_s: Sequence[float] | np.ndarray,
    sample_power_W: Sequence[float] | np.ndarray,
    *,
    mode: Mode = "steady",
    sensor_delay_s: float = 0.0,
    labels: Sequence[str] | None = None,
    n_bins: int = 16,
    pre_s: float = 0.04,
    post_s: float = 0.1,
    n_pre: int = 2,
    n_post: int = 8,
    baseline_W: float | None = None,
    launch_gap_s: float | None = None,
    short_gap_s: float | None = None,
    smoothing: float = 1e-3,
    n_boot: int = 200,
    confidence: float = 0.95,
    seed: int | np.random.Generator = 0,
) -> Superposition:
    """Superpose the samples of many executions into a power profile and energy per execution.

    FinGraV (superposition of the executions' sample streams onto one execution
    timeline, with CPU–GPU time synchronisation done by the caller); the least-squares
    form follows Lang & Rünger (Euro-Par 2013). See the module docstring for the model.

    Args:
        starts_s: Execution starts on the sample clock, shape (n,) (s), increasing.
        ends_s: Execution ends, shape (n,) (s), ``ends_s[i] > starts_s[i]``.
        sample_times_s: Sample timestamps, shape (m,) (s), increasing.
        sample_power_W: Sample values, shape (m,) (W).
        mode: ``"steady"`` (back-to-back) or ``"isolated"`` (idle gaps between executions).
        sensor_delay_s: Lag of a sample behind the power it reports (s).
        labels: Class of each execution, shape (n,); :data:`DROPPED` executions are fitted
            but not reported. Default: every execution is ``"all"``.
        n_bins: Profile bins inside an execution.
        pre_s: Isolated mode: time before the start attributed to the execution (s).
        post_s: Isolated mode: time after the end (the power tail) attributed to it (s).
            Steady mode: time after the last execution of a run given the free tail
            level (s).
        n_pre: Isolated mode: bins before the start.
        n_post: Isolated mode: bins after the end.
        baseline_W: Known baseline power (W); default: fitted from idle samples.
        launch_gap_s: Steady mode: a gap after an execution shorter than this belongs to
            it (s); default: half the execution's duration. A caller whose back-to-back
            executions share boundary marks (gap exactly 0) passes 0, so that a real
            pause is never folded into an execution.
        short_gap_s: Steady mode: a longer gap up to this long is a pause with its own
            free power level (``gap_power_W``), not idle time at the baseline (s);
            default: 3 median sample intervals (the sensor cannot tell such a pause's
            power from its neighbours' by much more). 0: every pause is idle.
        smoothing: Weight of the first-difference smoothness penalty, relative to the data.
        n_boot: Bootstrap replicates (0: no CI; the intervals collapse to the estimate).
        confidence: CI level in (0, 1).
        seed: Seed or Generator of the bootstrap.

    Returns:
        The :class:`Superposition`.

    Raises:
        ValueError: Mismatched shapes, no execution, fewer than 3 samples, a non-positive
            duration, a negative gap length, or an unknown mode.
    """
    if mode not in ("steady", "isolated"):
        raise ValueError(f"mode must be 'steady' or 'isolated', got {mode!r}")
    starts = np.asarray(starts_s, dtype=np.float64)
    ends = np.asarray(ends_s, dtype=np.float64)
    times = np.asarray(sample_times_s, dtype=np.float64)
    power = np.asarray(sample_power_W, dtype=np.float64)
    if starts.shape != ends.shape or starts.ndim != 1 or starts.size == 0:
        raise ValueError("starts_s and ends_s must be 1-D arrays of the same, non-zero length")
    if times.shape != power.shape or times.size < 3:
        raise ValueError("need at least 3 power samples, with times and powers of the same shape")
    if not np.all(ends > starts):
        raise ValueError("every execution must end after it starts")
    if (launch_gap_s is not None and launch_gap_s < 0) or (short_gap_s is not None and short_gap_s < 0):
        raise ValueError("launch_gap_s and short_gap_s must be >= 0")
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    label_arr = np.array(["all"] * starts.size if labels is None else list(labels), dtype=object)
    if label_arr.shape != (starts.size,):
        raise ValueError("labels must have one entry per execution")
    label_arr = label_arr[order]
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)

    n = starts.size
    if mode == "steady":
        # The launch gap after an execution belongs to it when it is short (back-to-back).
        nxt = np.append(starts[1:], np.inf)
        gap = nxt - ends
        launch = 0.5 * (ends - starts) if launch_gap_s is None else launch_gap_s
        ends = np.where((gap >= 0) & (gap < launch), nxt, ends)
        n_pre_, n_post_, pre, post = 0, 0, 0.0, 0.0
    else:
        n_pre_, n_post_, pre, post = n_pre, n_post, pre_s, post_s
    # Extended windows, clipped so that consecutive ones never overlap.
    lo = starts - pre
    hi = ends + post
    hi[:-1] = np.minimum(hi[:-1], np.maximum(starts[1:] - pre, ends[:-1]))
    lo[1:] = np.maximum(lo[1:], hi[:-1])

    # Sample intervals after the delay shift; drop the first and any spanning a lost sample.
    b = times - sensor_delay_s
    a = np.empty_like(b)
    a[1:] = b[:-1]
    a[0] = np.nan
    delta = b - a
    med = np.nanmedian(delta[1:])
    valid = np.isfinite(delta) & (delta > 0) & (delta <= 2.5 * med)
    a, b, y_power = a[valid], b[valid], power[valid]
    delta = b - a
    y = y_power * delta  # energy of each sample interval (J)
    m = a.size

    # Steady mode: pauses between executions and the tail after each run (see the module docstring).
    gap_lo = gap_hi = tail_lo = tail_hi = np.zeros(0)
    if mode == "steady":
        short = 3 * med if short_gap_s is None else short_gap_s
        pause = np.append(starts[1:], np.inf) - ends
        is_gap = (pause > 0) & (pause <= short)
        gap_lo, gap_hi = ends[is_gap], (ends + pause)[is_gap]
        is_end = pause > short
        tail_lo = ends[is_end]
        tail_hi = np.minimum(ends + post_s, ends + pause)[is_end]

    classes = list(dict.fromkeys(label_arr.tolist()))
    nb = n_pre_ + n_bins + n_post_
    col0 = {c: k * nb for k, c in enumerate(classes)}
    n_tail = max(n_post, 1) if mode == "steady" else 0
    # Last columns: the pause (gap) level, the run tail's bins, the baseline.
    p = len(classes) * nb + 2 + n_tail
    GAP, TAIL = len(classes) * nb, len(classes) * nb + 1
    A = np.zeros((m, p))
    widths = np.zeros((n, nb))
    owner = np.full(m, -1, dtype=np.int64)
    mids = (a + b) / 2
    k_lo = np.searchsorted(b, lo, side="right")
    k_hi = np.searchsorted(a, hi, side="left")
    for i in range(n):
        edges = _bin_edges(starts[i], ends[i], lo[i], hi[i], pre, post, n_pre_, n_bins, n_post_)
        widths[i] = np.diff(edges)
        ks = slice(k_lo[i], k_hi[i])
        if k_hi[i] <= k_lo[i]:
            continue
        overlap = np.minimum(b[ks, None], edges[None, 1:]) - np.maximum(a[ks, None], edges[None, :-1])
        c0 = col0[label_arr[i]]
        A[ks, c0 : c0 + nb] += np.clip(overlap, 0.0, None)
        inside = (mids[ks] > lo[i]) & (mids[ks] <= hi[i])
        owner[ks][inside] = i
    A[:, GAP] = _overlap_with(a, b, gap_lo, gap_hi)
    tail_w = (post_s / n_tail) if n_tail else 0.0
    for j in range(n_tail):  # bin j of each tail: (end + j·w, end + (j+1)·w], clipped to the pause
        A[:, TAIL + j] = _overlap_with(
            a, b, np.minimum(tail_lo + j * tail_w, tail_hi), np.minimum(tail_lo + (j + 1) * tail_w, tail_hi)
        )
    A[:, -1] = np.clip(delta - A[:, :-1].sum(axis=1), 0.0, None)
    # Samples owned by a pause or a tail form their own bootstrap stratum, apart from idle ones.
    owner[(owner < 0) & (_inside(mids, gap_lo, gap_hi) | _inside(mids, tail_lo, tail_hi))] = -2

    idle_rows = np.flatnonzero(owner == -1)
    pause_rows = np.flatnonzero(owner == -2)
    idle_time = A[:, -1].sum()
    baseline_known = idle_time >= 2 * med
    c_prior = baseline_W if baseline_W is not None else float(np.median(y_power))

    # Penalties: first differences within each class; a weak prior on the baseline.
    rows = []
    for c in classes:
        for j in range(nb - 1):
            r = np.zeros(p)
            r[col0[c] + j], r[col0[c] + j + 1] = -1.0, 1.0
            rows.append(r)
    # Weak ties that the data override wherever they can tell: a pause's power continues the
    # executions' (a GPU cannot change power in a few ms; this matters when pauses are so
    # regular that they are collinear with the executions); a run's tail is smooth and decays
    # to the baseline.
    r = np.zeros(p)
    r[GAP], r[:GAP] = 1.0, -1.0 / GAP
    rows.append(r)
    for j in range(n_tail):
        r = np.zeros(p)
        r[TAIL + j], r[TAIL + j + 1 if j + 1 < n_tail else -1] = -1.0, 1.0
        rows.append(r)
    Dm = np.array(rows)
    penalty = Dm.T @ Dm
    prior = np.zeros(p)
    prior[-1] = 1.0
    if baseline_W is not None:
        prior_weight = 1e6  # a given baseline is fixed
    else:
        prior_weight = 1e-4 if baseline_known else 1.0

    def solve(weights: np.ndarray) -> np.ndarray:
        Aw = A * weights[:, None]
        G = Aw.T @ A
        rhs = Aw.T @ y
        scale = max(np.trace(G) / p, 1e-30)
        lam = smoothing * scale
        M = G + lam * penalty + prior_weight * scale * np.diag(prior) + 1e-9 * scale * np.eye(p)
        rhs = rhs + prior_weight * scale * prior * c_prior
        return np.linalg.solve(M, rhs)

    def summarise(theta: np.ndarray) -> dict[str, tuple[float, float, np.ndarray]]:
        c = theta[-1]
        out = {}
        for lab in classes:
            sel = label_arr == lab
            w = widths[sel].mean(axis=0)
            g = theta[col0[lab] : col0[lab] + nb]
            inside = slice(n_pre_, n_pre_ + n_bins)
            dur = float(w[inside].sum())
            gross = float(g[inside] @ w[inside]) + float((g[:n_pre_] - c) @ w[:n_pre_])
            gross += float((g[n_pre_ + n_bins :] - c) @ w[n_pre_ + n_bins :])
            out[lab] = (gross, gross - c * dur, g)
        return out

    theta = solve(np.ones(m))
    point = summarise(theta)
    boots: list[dict[str, tuple[float, float, np.ndarray]]] = []
    baselines = []
    for _ in range(n_boot):
        counts = np.zeros(n)
        for lab in classes:  # stratified: class sizes stay fixed
            members = np.flatnonzero(label_arr == lab)
            counts[members] += np.bincount(rng.integers(0, members.size, members.size), minlength=members.size)
        weights = np.where(owner >= 0, counts[np.maximum(owner, 0)], 0.0)
        for stratum in (idle_rows, pause_rows):
            if stratum.size:
                weights[stratum] = np.bincount(rng.integers(0, stratum.size, stratum.size), minlength=stratum.size)
        if not weights.any():
            continue
        th = solve(weights)
        baselines.append(th[-1])
        boots.append(summarise(th))

    alpha = (1 - confidence) / 2
    tail_any = bool(n_tail and A[:, TAIL:-1].any())

    def interval(values: list[float], fallback: float) -> tuple[float, float]:
        if not values:
            return (fallback, fallback)
        q = np.quantile(values, [alpha, 1 - alpha])
        return (float(q[0]), float(q[1]))

    if baseline_W is not None:
        base, source = float(baseline_W), "given"
    elif baseline_known:
        base, source = float(theta[-1]), "idle samples"
    else:
        base, source = None, "unknown"
    profiles = {}
    for lab in classes:
        if lab == DROPPED:
            continue
        sel = label_arr == lab
        w = widths[sel].mean(axis=0)
        rel = np.cumsum(w) - w / 2 - (w[:n_pre_].sum())
        dur = float(w[n_pre_ : n_pre_ + n_bins].sum())
        gross, dyn, g = point[lab]
        band = (
            np.quantile(np.array([bt[lab][2] for bt in boots]), [alpha, 1 - alpha], axis=0)
            if boots
            else (np.vstack([g, g]))
        )
        profiles[lab] = ProfileEstimate(
            label=str(lab),
            executions=int(sel.sum()),
            duration_s=dur,
            energy_J=gross,
            energy_ci_J=interval([bt[lab][0] for bt in boots], gross),
            dynamic_energy_J=dyn if base is not None else None,
            dynamic_energy_ci_J=interval([bt[lab][1] for bt in boots], dyn) if base is not None else None,
            time_s=rel,
            u=rel / dur if dur > 0 else rel,
            width_s=w,
            power_W=g.copy(),
            power_ci_W=np.asarray(band),
            mean_power_W=gross / dur if dur > 0 else math.nan,
        )
    subtracted = (
        "dynamic_energy_J = energy_J - baseline_W x duration_s (idle power over the execution's own time); "
        "energy_J keeps it"
        + ("; the tail above baseline after the end is included in both" if mode == "isolated" else "")
    )
    return Superposition(
        mode=mode,
        profiles=profiles,
        baseline_W=base,
        baseline_source=source,
        subtracted=subtracted,
        samples_used=int(m),
        idle_samples=int(idle_rows.size),
        sensor_delay_s=float(sensor_delay_s),
        confidence=float(confidence),
        n_boot=len(boots),
        gap_power_W=float(theta[GAP]) if A[:, GAP].any() else None,
        gap_time_s=float((gap_hi - gap_lo).sum()),
        tail_power_W=float(A[:, TAIL:-1].sum(axis=0) @ theta[TAIL:-1] / A[:, TAIL:-1].sum()) if tail_any else None,
        tail_time_s=float(np.clip(tail_hi - tail_lo, 0.0, None).sum()),
    )


# ----------------------------------------------------------------------- differentiation
@dataclass(frozen=True)
class Differentiation:
    """First-execution, warming and steady-state profiles (FinGraV power-profile differentiation, challenge C4).

    Attributes:
        result: The superposition with classes ``"first"``, ``"warming"``, ``"steady"``
            (a class without executions is absent).
        rel_diff: Relative energy difference of each class from ``"steady"``
            (``first``/``warming`` → ``(E_class − E_steady) / E_steady``).
        differs: Classes whose energy differs from steady by more than ``threshold``.
        threshold: The relative difference that triggers a warning.
    """

    result: Superposition
    rel_diff: dict[str, float] = field(default_factory=dict)
    differs: tuple[str, ...] = ()
    threshold: float = DIFFERENCE_WARNING


def position_labels(run_ids: Sequence[int] | np.ndarray, *, warm_executions: int = 5) -> np.ndarray:
    """Label each execution by its position in its run: first, warming or steady.

    A *run* is a burst of executions after idle (the same ``run_id``); its first
    execution starts from idle power, the next ``warm_executions`` may still be warming
    up (power overshoot and settling; DESIGN.md, H200 facts), the rest are steady.

    Args:
        run_ids: Run of each execution, in execution order, shape (n,).
        warm_executions: Executions after the first labelled ``"warming"``.

    Returns:
        Labels, shape (n,), dtype object.
    """
    ids = np.asarray(run_ids)
    labels = np.empty(ids.size, dtype=object)
    position = 0
    for i in range(ids.size):
        position = 0 if i == 0 or ids[i] != ids[i - 1] else position + 1
        labels[i] = "first" if position == 0 else ("warming" if position <= warm_executions else "steady")
    return labels


def differentiate(
    starts_s: Sequence[float] | np.ndarray,
    ends_s: Sequence[float] | np.ndarray,
    run_ids: Sequence[int] | np.ndarray,
    sample_times_s: Sequence[float] | np.ndarray,
    sample_power_W: Sequence[float] | np.ndarray,
    *,
    warm_executions: int = 5,
    threshold: float = DIFFERENCE_WARNING,
    keep: np.ndarray | None = None,
    n_bins: int = 2,
    **superpose_args: object,
) -> Differentiation:
    """Separate first-execution / warming / steady-state profiles and compare their energies.

    FinGraV (challenge C4): the first executions after idle draw a different power (rise, overshoot)
    than executions in steady state; averaging them together misstates both. Warns when
    a class's energy per execution differs from steady by more than ``threshold``.

    Args:
        starts_s: Execution starts, shape (n,) (s), in order.
        ends_s: Execution ends, shape (n,) (s).
        run_ids: Run (burst) of each execution, shape (n,).
        sample_times_s: Sample timestamps, shape (m,) (s).
        sample_power_W: Sample values, shape (m,) (W).
        warm_executions: Executions after the first counted as warming.
        threshold: Relative difference that triggers the warning (0.10 = 10 %).
        keep: Optional mask from :func:`bin_executions`; dropped executions are fitted
            under :data:`DROPPED` and not reported.
        n_bins: Profile bins per execution (few: the first-execution class has one
            execution per run, too few to resolve a fine shape).
        **superpose_args: Passed to :func:`superpose` (mode, sensor_delay_s, n_boot, ...).

    Returns:
        The :class:`Differentiation`.
    """
    labels = position_labels(run_ids, warm_executions=warm_executions)
    if keep is not None:
        labels = np.where(np.asarray(keep, bool), labels, DROPPED)
    result = superpose(
        starts_s,
        ends_s,
        sample_times_s,
        sample_power_W,
        labels=labels,
        n_bins=n_bins,
        **superpose_args,  # type: ignore[arg-type]
    )
    rel: dict[str, float] = {}
    differs = []
    steady = result.profiles.get("steady")
    if steady is not None and steady.energy_J:
        for lab in ("first", "warming"):
            prof = result.profiles.get(lab)
            if prof is None:
                continue
            # Compare power, not energy: a class may have a different mean duration.
            rel[lab] = (prof.mean_power_W - steady.mean_power_W) / steady.mean_power_W
            if abs(rel[lab]) > threshold:
                differs.append(lab)
    if differs:
        logger.warning(
            "zeus-callbacks: %s executions draw a power different from steady state by %s (> %.0f%%): "
            "report them separately (FinGraV power-profile differentiation)",
            "/".join(differs),
            ", ".join(f"{100 * rel[d]:+.0f}%" for d in differs),
            100 * threshold,
        )
    return Differentiation(result, rel, tuple(differs), threshold)
