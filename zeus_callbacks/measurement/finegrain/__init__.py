"""Fine-grain energy of short, repeated executions from a coarse power-sample stream.

Pure functions (numpy only, no framework, no sensor calls) implementing the FinGraV
methodology (Singhania, Aga, Ibrahim: *FinGraV: Methodology for Fine-Grain GPU Power
Visibility and Insights*, AMD, arXiv 2412.12426, 2024):

- **Execution-time binning** (FinGraV's answer to its challenge C3, execution-time
  variation; :mod:`._binning`): :func:`bin_executions` groups executions by duration and keeps the
  dominant group; throttled or contended executions are dropped, counted, and warned about when too many.
- **CPU–GPU time synchronisation** is the caller's: window boundaries are put on the sample
  clock by :class:`~zeus_callbacks.measurement._windows.CudaEventTimer`, and ``sensor_delay_s``
  shifts the samples onto them.
- **Superposition** (FinGraV, challenge C1, low sampling rate; after Lang & Rünger,
  Euro-Par 2013; :mod:`._superposition`): the samples of many executions, each mapped onto its
  execution's timeline, are combined into one power profile. :func:`superpose` writes every
  sample as a linear measurement of that profile and solves for it by least squares, so windows
  much shorter than the sensor's 20 ms averaging are resolved when executions fall at random
  phases of the sampler.
- **Power-profile differentiation** (FinGraV, challenge C4, power variance across
  executions; :mod:`._differentiate`): :func:`differentiate` separates first-execution, warming
  and steady-state profiles and warns when their energies differ by more than 10 % (misreading
  them cost up to ~80 % in FinGraV's measurements).

Time base and units: every time is in seconds on the *sample clock* (NVML sample
timestamps are the CPU realtime clock; window boundaries are put on it by
:class:`~zeus_callbacks.measurement._windows.CudaEventTimer`). Powers are W, energies J.

Sample model (as in :mod:`~zeus_callbacks.measurement._attribution`): sample ``k`` with
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

Every option of the fit is a field of :class:`SuperposeSettings` (also accepted as a keyword of
:func:`superpose`). Modes:

- ``"steady"``: back-to-back executions. The launch gap after an execution (shorter than
  half its duration, or than ``launch_gap_s``) belongs to it, so ``energy_J`` is what the
  long back-to-back reference measures: energy of the run / number of executions. Time
  outside every execution is not all idle, so it is not all modelled at the baseline:

  * a *pause* between executions of at most ``short_gap_s`` (a sync between chunks of
    back-to-back work, a few ms) gets one free power level of its own, ``gap_power_W``:
    the GPU is still near full power then (on an H200 power decays over 40–60 ms after
    work stops, docs/hardware.md#sample-semantics), and modelling it at the idle baseline would push the
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
separate stratum), percentile method, with a seeded :class:`numpy.random.Generator`. Such an
interval needs at least :func:`min_executions_for_interval` executions (4 at 95 %);
:func:`interval_reason` says why there is none below that.
"""

from zeus_callbacks.measurement.finegrain._binning import Binning, bin_executions, binning_warning
from zeus_callbacks.measurement.finegrain._differentiate import (
    DIFFERENCE_WARNING,
    Differentiation,
    differentiate,
    position_labels,
)
from zeus_callbacks.measurement.finegrain._superposition import (
    DROPPED,
    Mode,
    ProfileEstimate,
    SuperposeSettings,
    Superposition,
    interval_reason,
    min_executions_for_interval,
    superpose,
)

__all__ = [
    "DIFFERENCE_WARNING",
    "DROPPED",
    "Binning",
    "Differentiation",
    "Mode",
    "ProfileEstimate",
    "SuperposeSettings",
    "Superposition",
    "bin_executions",
    "binning_warning",
    "differentiate",
    "interval_reason",
    "min_executions_for_interval",
    "position_labels",
    "superpose",
]
