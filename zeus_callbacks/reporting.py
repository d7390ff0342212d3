"""Metric names (the one place they are defined), the JSONL energy log and run summaries.

Every key logged to TensorBoard / W&B is listed in :data:`METRICS` with its unit;
``docs/metrics.md`` is generated from it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from zeus_callbacks._footprint import ENERGY_BASES, CarbonEstimate, CostEstimate
from zeus_callbacks._units import readable_energy, three_figures, wh_from_J
from zeus_callbacks.errors import EnergyLogError, NotAnEnergyLog

logger = logging.getLogger(__name__)

STEP_ENERGY_J = "energy/step_J"
STEP_COUNT = "energy/step_count"
STEP_POWER_SAMPLES = "energy/step_power_samples"
STEP_TIME_S = "time/step_s"
STEP_CPU_ENERGY_J = "energy/step_cpu_J"
STEP_DRAM_ENERGY_J = "energy/step_dram_J"
STEP_NODE_ENERGY_J = "energy/step_node_J"
WARMUP_ENERGY_J = "energy/warmup_J"
WARMUP_TIME_S = "time/warmup_s"
MEAN_POWER_W = "power/mean_W"
ENERGY_PER_SAMPLE_J = "energy/per_sample_J"
ENERGY_PER_TOKEN_J = "energy/per_token_J"
POWER_LIMIT_W = "power_limit/W"
POWER_LIMIT_CHOSEN_W = "power_limit/chosen_W"
POWER_LIMIT_PROFILING_STEPS = "power_limit/profiling_steps"
EPOCH_ENERGY_J = "energy/epoch_J"
EPOCH_COUNTER_ENERGY_J = "energy/epoch_counter_J"
EPOCH_TIME_S = "time/epoch_s"
EPOCH_MEAN_POWER_W = "power/epoch_mean_W"
EPOCH_PARTIAL = "energy/epoch_partial"
EPOCH_OTHER_J = "energy/epoch_other_J"
EPOCH_CPU_ENERGY_J = "energy/epoch_cpu_J"
EPOCH_DRAM_ENERGY_J = "energy/epoch_dram_J"
EPOCH_NODE_ENERGY_J = "energy/epoch_node_J"
EVAL_ENERGY_J = "energy/eval_J"
EVAL_TIME_S = "time/eval_s"
# The Hugging Face Trainer's reporters file a key under ``eval/`` only when it starts with ``eval_``
# (every other key goes under ``train/``): its logs carry the evaluation figures under these names.
HF_EVAL_NAMES = {EVAL_ENERGY_J: "eval_energy_J", EVAL_TIME_S: "eval_time_s"}
TOTAL_ENERGY_J = "energy/total_J"
PHASES_EXPLAINED = "energy/phases_explained"
TOTAL_TIME_S = "time/total_s"
PROGRESS_BAR_ENERGY = "energy_kJ"
# On the virtual GPU the bar's figure is simulated: its own name says so (the bar shows no energy/simulated flag).
# Short: the bar puts it after the user's metrics, and an 80-column terminal cuts the line's end.
PROGRESS_BAR_SIMULATED_ENERGY = "sim_energy_kJ"
_OLD_BAR_KEYS = ("simulated_energy_kJ",)  # an older release's name for it: still ours in a framework's metrics
# Run-level figures (a framework's results: the HF Trainer's train_results.json), from the RunSummary.
RUN_STEP_ENERGY_J = "energy/run_step_mean_J"
RUN_STEP_TIME_S = "time/run_step_mean_s"
RUN_MEAN_POWER_W = "power/run_mean_W"
RUN_STEP_COUNT = "energy/run_step_count"
CO2_G = "energy/co2_g"
CPU_ENERGY_J = "energy/cpu_J"
DRAM_ENERGY_J = "energy/dram_J"
NODE_ENERGY_J = "energy/node_J"
RUN_COST = "cost/run"
SIMULATED = "energy/simulated"
UNAVAILABLE = "energy/unavailable"


NODE_OFF = "node.rapl and node.virtual_cpu are off: no CPU/DRAM energy reader"
"""``node_energy_note`` of the records (epoch, run_end) when no node figure was asked for."""


def window_energy_key(name: str) -> str:
    """Metric key of a user-named window's energy (e.g. ``energy/window/forward_J``)."""
    return f"energy/window/{name}_J"


def phase_key(name: str, stat: str = "") -> str:
    """Metric key of a step phase's per-epoch figure (``energy/phase/forward_J``, ``..._ci_low_J``, ``..._count``)."""
    if stat == "count":
        return f"energy/phase/{name}_count"
    return f"energy/phase/{name}_{stat}_J" if stat else f"energy/phase/{name}_J"


def gpu_energy_key(index: int) -> str:
    """Metric key of one GPU's epoch energy when several GPUs are measured (``energy/gpu0_J``)."""
    return f"energy/gpu{index}_J"


METRICS: dict[str, str] = {
    STEP_ENERGY_J: "J — mean GPU energy per training step over the logging interval (summed over GPUs)",
    STEP_COUNT: "steps — how many steps the mean in energy/step_J covers: with a window or between two windows",
    STEP_POWER_SAMPLES: "samples — power samples behind energy/step_J",
    STEP_TIME_S: "s — mean step time over the logging interval",
    MEAN_POWER_W: "W — mean GPU power during the interval's steps",
    ENERGY_PER_SAMPLE_J: "J — GPU energy per training sample over the interval",
    ENERGY_PER_TOKEN_J: "J — GPU energy per input token (HF Trainer with include_num_input_tokens_seen)",
    STEP_CPU_ENERGY_J: "J — CPU package energy per training step, summed over sockets, over the spans between "
    "CPU/DRAM readings at step reports that the interval's steps records hold (their cpu_energy_J / node_steps; a "
    "span holds all its time: evaluations, an epoch's turn); node.rapl, SIMULATED with node.virtual_cpu beside the "
    "virtual GPU; logged when known",
    STEP_DRAM_ENERGY_J: "J — DRAM energy per training step over the same spans (RAPL dram domains, node.rapl); "
    "logged when known",
    STEP_NODE_ENERGY_J: "J — GPU + CPU package (+ DRAM) energy per training step over the same spans (the GPU part "
    "is the spans' energy from the power samples, not energy/step_J); logged when every part is known",
    POWER_LIMIT_W: "W — power limit in force (mean over the measured GPUs)",
    POWER_LIMIT_CHOSEN_W: "W — power limit the profiler chose (or took from the cache), logged once",
    POWER_LIMIT_PROFILING_STEPS: "steps — training steps spent profiling power limits, logged once",
    WARMUP_ENERGY_J: "J — GPU energy of the run's warm-up steps (windows.warmup_steps), kept out of energy/step_J; "
    "logged once",
    WARMUP_TIME_S: "s — time of the run's warm-up steps, logged once",
    EPOCH_ENERGY_J: "J — GPU energy of the training epoch, from the power samples",
    EPOCH_COUNTER_ENERGY_J: "J — the same epoch from the hardware energy counter (cross-check)",
    EPOCH_TIME_S: "s — epoch wall time",
    EPOCH_MEAN_POWER_W: "W — mean GPU power over the epoch",
    EPOCH_OTHER_J: "J — the epoch's energy outside every warm-up, step, evaluation and evaluation-tail window "
    "(the stretch after the last step, the wait before an evaluation): warm-up + steps + evaluations + their "
    "tails (the ledger's eval_tail_J) + this = the epoch",
    EPOCH_PARTIAL: "flag — 1 with an epoch's figures when the run resumed from a checkpoint inside that epoch "
    "(they cover only the steps after the checkpoint; the steps before are in the carried run total), or when "
    "the run ended inside it (max_steps, an interruption, a failure: they cover the steps it took)",
    EPOCH_CPU_ENERGY_J: "J — CPU package energy of the training epoch, summed over sockets, between readings at "
    "its start and end (node.rapl; SIMULATED with node.virtual_cpu beside the virtual GPU); logged when known",
    EPOCH_DRAM_ENERGY_J: "J — DRAM energy of the training epoch (RAPL dram domains, node.rapl); logged when known",
    EPOCH_NODE_ENERGY_J: "J — energy/epoch_J + energy/epoch_cpu_J (+ energy/epoch_dram_J where the CPU has a DRAM "
    "domain: the epoch record's node_energy_note names the parts); logged when every part is known",
    EVAL_ENERGY_J: "J — GPU energy of the last evaluation loop (every rank's GPUs under DDP)",
    EVAL_TIME_S: "s — time of the last evaluation loop",
    TOTAL_ENERGY_J: "J — GPU energy of the whole run (train start to end)",
    TOTAL_TIME_S: "s — wall time of the whole run",
    RUN_MEAN_POWER_W: "W — mean GPU power of the whole run (energy/total_J / time/total_s), logged once at the end",
    RUN_STEP_ENERGY_J: "J — the run's mean step energy after its warm-up steps: the steps records' means weighed by "
    "the steps each stands for; logged once at the end",
    RUN_STEP_TIME_S: "s — the run's mean step time after its warm-up steps, weighed the same way; logged once at "
    "the end",
    RUN_STEP_COUNT: "steps — the training steps the run took, logged once at the end",
    CPU_ENERGY_J: "J — CPU package energy of the run, summed over sockets (Linux powercap RAPL, node.rapl; "
    "SIMULATED with node.virtual_cpu beside the virtual GPU), logged once at the end",
    DRAM_ENERGY_J: "J — DRAM energy of the run, summed over sockets (RAPL dram domains, node.rapl), logged once at "
    "the end",
    NODE_ENERGY_J: "J — the run's GPU + CPU package + DRAM energy (node.rapl; DRAM where the CPU has a DRAM domain: "
    "run_end's node_energy_note names the parts), logged once at the end; not the whole machine (fans, disks, "
    "the power supply's losses)",
    CO2_G: "g — ESTIMATED CO2e of the run's energy: energy/node_J where the node was measured, else "
    "energy/total_J (the GPUs), / 3.6e6 × carbon intensity (gCO2e/kWh, carbon.intensity_g_per_kWh or "
    "carbon.region's yearly average), logged once at the end; the run_end record holds the factor, its source "
    "and the energy_basis (docs/node_energy.md)",
    RUN_COST: "currency — ESTIMATED electricity cost of the run's energy (energy/node_J where measured, else "
    "energy/total_J) / 3.6e6 × cost.price_per_kWh, in cost.currency (the run_end record names it and the "
    "energy_basis), logged once at the end",
    "energy/window/<name>_J": "J — energy of the last execution of a user-named window",
    "energy/gpu<i>_J": "J — one GPU's energy in the epoch, when several GPUs are measured (ranks in order)",
    "energy/phase/<phase>_J": "J — energy per execution of a step phase (forward, backward, forward_backward, "
    "optimizer, dataloader) over the epoch, superposed on the power samples (windows.phases; this process's GPUs)",
    "energy/phase/<phase>_ci_low_J": "J — lower end of its 95 % confidence interval (bootstrap over executions)",
    "energy/phase/<phase>_ci_high_J": "J — upper end of its 95 % confidence interval",
    "energy/phase/<phase>_count": "executions — how many executions of the phase the epoch had",
    PHASES_EXPLAINED: "fraction — share of the epoch's energy the phase windows explain (sum of phase "
    "energies / epoch energy)",
    PROGRESS_BAR_ENERGY: "kJ — run energy so far (progress bar only)",
    PROGRESS_BAR_SIMULATED_ENERGY: "kJ — SIMULATED run energy so far on the virtual GPU, in place of energy_kJ "
    "(progress bar only)",
    SIMULATED: "flag — 1 at every logged step with metrics when the virtual GPU is in use: the energy figures are "
    "simulated from traces, not measured; also in the HF Trainer's results (TrainOutput.metrics)",
    UNAVAILABLE: "flag — 1 at every logged step with metrics when a GPU is present but cannot be measured: no "
    "energy or power figure is logged (see the warning and run_start's measurement_note); also in the HF "
    "Trainer's results",
}


_OWN_PREFIXES = ("energy/", "power/", "time/", "power_limit/", "cost/")


def is_own_metric(key: str, eval_prefixes: Collection[str] = ("eval",)) -> bool:
    """True for keys this package logs (so they are not mistaken for validation metrics).

    Args:
        key: A metric name.
        eval_prefixes: The Hugging Face Trainer's evaluation prefixes whose ``<prefix>_energy_J`` and
            ``<prefix>_time_s`` are ours (:data:`HF_EVAL_NAMES` renamed): ``eval`` (one dataset) by default;
            the Trainer callback adds each ``eval_<name>`` it produced in the run, so a user's validation
            metric of such a form (``eval_x_energy_J``) stays the user's, a possible ``batch_size.target``.
    """
    if key.startswith(_OWN_PREFIXES) or key in (PROGRESS_BAR_ENERGY, PROGRESS_BAR_SIMULATED_ENERGY, *_OLD_BAR_KEYS):
        return True
    suffixes = [name.removeprefix("eval") for name in HF_EVAL_NAMES.values()]  # "_energy_J", "_time_s"
    return any(key == prefix + suffix for prefix in eval_prefixes for suffix in suffixes)


def run_metrics(summary: RunSummary) -> dict[str, float]:
    """The run-level figures of ``summary`` under run-level names (a framework's final results).

    ``energy/total_J`` (J) and ``time/total_s`` (s) of the whole run (every GPU; resumed runs
    included), ``power/run_mean_W`` (W), ``energy/run_step_mean_J`` (J) and
    ``time/run_step_mean_s`` (s): the run's mean step after its warm-up steps
    (:attr:`RunSummary.step_energy_J`), ``energy/run_step_count`` (steps taken), and the estimates
    ``energy/co2_g`` (g CO2e) and ``cost/run`` (the configured currency) when configured, and with
    ``node.rapl`` (or ``node.virtual_cpu``) ``energy/cpu_J``, ``energy/dram_J`` and ``energy/node_J`` (J). A figure the
    run could not measure (no measured step: NaN in the summary) is left out rather than given
    as a number. On the virtual GPU the flag ``energy/simulated`` (1) comes with them, and on a GPU that
    cannot be measured ``energy/unavailable`` (1): results read apart from the logs still say what they are.

    Args:
        summary: The ended run's summary.

    Returns:
        Metric name → value (plain floats).
    """
    values = {
        TOTAL_ENERGY_J: summary.energy_J,
        TOTAL_TIME_S: summary.time_s,
        RUN_MEAN_POWER_W: summary.mean_power_W,
        RUN_STEP_ENERGY_J: summary.step_energy_J,
        RUN_STEP_TIME_S: summary.step_time_s,
        RUN_STEP_COUNT: float(summary.steps),
        CPU_ENERGY_J: summary.cpu_energy_J,
        DRAM_ENERGY_J: summary.dram_energy_J,
        NODE_ENERGY_J: summary.node_energy_J,
        CO2_G: summary.carbon.co2_g if summary.carbon is not None else None,
        RUN_COST: summary.cost.cost if summary.cost is not None else None,
    }
    figures = {key: float(v) for key, v in values.items() if v is not None and math.isfinite(v)}
    if summary.simulated:
        figures[SIMULATED] = 1.0
    elif summary.measurement == "unavailable":
        figures[UNAVAILABLE] = 1.0
    return figures


@dataclass
class RunSummary:
    """What a run measured, end to end.

    Attributes:
        run_name: Name of the run (also the JSONL file's stem).
        status: ``"completed"``, ``"failed"`` or ``"interrupted"``.
        backend: One-line description of the backend and its GPUs.
        energy_J: GPU energy of the run, summed over GPUs (J); NaN (null in the log) when unknown:
            ``measurement`` unavailable, or ``energy_note``.
        time_s: Wall time of the run (s).
        steps: Training steps taken (every ``step_end``, measured or not: ``windows.sample_fraction``).
        epochs: Training epochs run, one per entry of ``epoch_energy_J``: an epoch cut short by the
            end of training (``max_steps``, an interruption) counts, as its energy is measured.
        mean_power_W: ``energy_J / time_s`` (W).
        step_energy_J: Mean energy per step after the warm-up steps (J), NaN without a measured one:
            the ``steps`` records' means weighed by the steps each stands for, so ``step_energy_J`` × those
            steps is the records' estimate of their energy. A record's mean is over its steps with a window
            and the stretches between them where it could use those (measured, not sampled), else over
            its measured steps, each weighed by 1/p, ``p`` its chance of being measured
            (``windows.sample_fraction: auto`` measures a larger share where steps are slow: a plain mean
            would overstate the step). A sample's estimate can exceed what the whole run holds, which
            no mean of its steps can: both step means are then scaled down by one factor, so that
            × the steps they stand for they are at most ``energy_J`` and ``time_s``. Those steps are
            the steps after warm-up; in a resumed run, its own after its warm-up and the checkpoint's
            measured ones (the state's ``estimated_steps``), never the checkpoint's steps that no
            mean holds (saved before a sample covered them, or before their report), which a resumed
            run's means would otherwise be held to as if they were as long.
        step_time_s: Mean step time, estimated alike (s), NaN without steps; × the steps it stands for,
            at most ``time_s``.
        epoch_energy_J: Energy of each epoch (J); for an epoch the run resumed inside, of its steps after
            the checkpoint only (its ``epoch`` record says ``resumed_mid_epoch``).
        power_limit_W: Power limit in force at the end (W): after profiling, the original one, restored.
        chosen_power_limit_W: The limit power-limit profiling (or its cache) chose (W); None when
            none was chosen (profiling off, unfinished, or a failure).
        power_limit_from_step: The training step (0-based) from which the chosen limit was in force.
        power_limit_applied: Whether the chosen limit was applied (False in observe mode: chosen only).
        counter_energy_J: The run's energy from the hardware energy counter (J), when known.
        counter_energy_note: Why ``counter_energy_J`` is None (the run shorter than 20 counter update periods,
            the counter's readings not bracketing it, no counter on this backend; as the epoch record's
            ``counter_energy_note``); None when it is known. The printed summary's energy line gives its
            first clause: ``(energy counter: n/a, shorter than 2 s on nvml (...))``.
        faults: Sensor faults counted on this process, by kind.
        jsonl_path: The JSONL log, when written.
        world_size: Processes whose GPUs the figures cover (1 without DDP).
        gpu_energy_J: Each measured GPU's energy over the run, ranks in order (J).
        degraded: A sensor fault on any rank made the measurement incomplete.
        rejected_samples: Power samples this process rejected as physically impossible, by reason
            (``non_finite``, ``negative``, ``above_max``, ``future_timestamp``, ``timestamp_backwards``);
            any rejection marks the run degraded.
        measurement: ``"measured"``, ``"simulated"`` (the virtual GPU) or ``"unavailable"`` (a GPU
            that cannot be measured: every energy figure is null).
        simulated: True when the energy is simulated (the virtual GPU).
        measurement_note: Why measurement is unavailable and how to fix it; on a multi-process run
            that ended after a failure (each rank ends alone), that the figures are this process's
            GPUs only (`world_size` of them; the summary and `report` print it as `PARTIAL:`). None
            otherwise.
        time_note: Power-limit profiling on the virtual GPU with the real clock: its power is simulated
            but its time is not (a lower limit does not slow the steps as the trace says), so the
            profile compares limits at equal time and a lower limit's lower energy is no saving
            (the summary and ``report`` print it as ``TIME NOT SIMULATED:``). None otherwise.
        coverage: Share of the run's time the power samples cover, in [0, 1] (the least over ranks).
        complete: True when the samples cover the whole run (coverage 1).
        counter_resets: Times an energy counter went backwards (each leaves one interval out of the
            counter series; the cross-check goes on).
        energy_source: Where the energy came from: ``"samples"`` (the power stream), or
            ``"samples+counter"`` where a power stream failed and counter differences took over.
        counter_resolution_J: The energy counter's resolution (J), stated when the counter is a source.
        energy_Wh: ``energy_J`` in watt-hours (Wh; 1 Wh = 3600 J), for people; None when the energy is
            unknown. Derived from ``energy_J`` when the summary is made.
        carbon: The run's ESTIMATED CO2 (``co2_g``, g CO2e = energy (J) / 3.6e6 × ``intensity_g_per_kWh``)
            with the factor and its ``intensity_source``; the energy is the node's where it was measured,
            else the GPUs' (``energy_basis``: ``node`` or ``gpu``); ``co2_g`` null with a ``reason`` when the
            energy is unknown. None when no carbon intensity is configured (``carbon`` section).
        cost: The run's ESTIMATED electricity cost (``cost`` = energy (J) / 3.6e6 × ``price_per_kWh``, in
            ``currency``), on the same ``energy_basis``; ``cost`` null with a ``reason`` when the energy is
            unknown. None when no price is configured (``cost`` section).
        cpu_energy_J: With ``node.rapl``: the CPU packages' energy over the run, summed over sockets (J,
            Linux powercap RAPL); with ``node.virtual_cpu`` beside the virtual GPU where RAPL cannot be read,
            SIMULATED (``node_energy_note`` says so and states the model); None when off or unknown
            (``node_energy_note`` says why).
        dram_energy_J: With ``node.rapl``: the DRAM domains' energy (J); None when off, unknown, or the CPU
            has no DRAM domain.
        node_energy_J: ``energy_J`` + ``cpu_energy_J`` (+ ``dram_energy_J`` where a DRAM domain exists) (J);
            None when off or any part is unknown.
        node_energy_note: With ``node.rapl`` or ``node.virtual_cpu``: the parts ``node_energy_J`` holds (a
            simulated CPU says ``SIMULATED``), or why a figure is unknown; with both off, ``node.rapl and
            node.virtual_cpu are off: no CPU/DRAM energy reader``, as in each epoch record.
        measured_steps: Steps after warm-up that ``step_energy_J`` and ``step_time_s`` come from: those with
            a window, and those between two windows measured as the stretches that hold them where the
            ``steps`` records used those. Fewer than the steps under ``windows.sample_fraction`` when
            stretches could not be used: those figures are then estimates from a sample. The printed
            summary says "mean of N measured steps". None where not known.
        energy_note: Why ``energy_J`` is unknown on a GPU that was measured: the run resumed from a
            checkpoint whose energy so far was not measured (saved before any power sample covered the
            run's start), so the total cannot hold those steps; ``counter_energy_J`` is then null too.
            The epochs, steps and evaluations of this run keep their figures. None otherwise.
    """

    run_name: str
    status: str
    backend: str
    energy_J: float
    time_s: float
    steps: int
    epochs: int
    mean_power_W: float
    step_energy_J: float
    step_time_s: float
    epoch_energy_J: list[float] = field(default_factory=list)
    power_limit_W: float | None = None
    chosen_power_limit_W: float | None = None
    power_limit_from_step: int | None = None
    power_limit_applied: bool = False
    counter_energy_J: float | None = None
    counter_energy_note: str | None = None
    faults: dict[str, int] = field(default_factory=dict)
    jsonl_path: str | None = None
    world_size: int = 1
    gpu_energy_J: list[float] = field(default_factory=list)
    degraded: bool = False
    rejected_samples: dict[str, int] = field(default_factory=dict)
    measurement: str = "measured"
    simulated: bool = False
    measurement_note: str | None = None
    time_note: str | None = None
    coverage: float | None = None
    complete: bool = True
    counter_resets: int = 0
    energy_source: str = "samples"
    counter_resolution_J: float | None = None
    carbon: CarbonEstimate | None = None
    cost: CostEstimate | None = None
    cpu_energy_J: float | None = None
    dram_energy_J: float | None = None
    node_energy_J: float | None = None
    node_energy_note: str | None = None
    measured_steps: int | None = None
    energy_note: str | None = None
    energy_Wh: float | None = field(init=False)

    def __post_init__(self) -> None:
        self.energy_Wh = wh_from_J(self.energy_J)

    def _sampled_steps_note(self) -> str:
        """``(mean of N measured steps)``: what the step figures stand on (nothing when not known)."""
        measured = self.measured_steps
        return f"   (mean of {measured:,} measured steps)" if measured else ""

    def as_dict(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict."""
        return asdict(self)

    def _power_limit_line(self, fmt: Any) -> str:
        """The limit training ran at: the chosen one and from which step, else the one in force."""
        if self.chosen_power_limit_W is None:
            return fmt(self.power_limit_W, "W")
        if not self.power_limit_applied:
            return (f"{fmt(self.power_limit_W, 'W')} (observe mode: profiling would choose "
                    f"{fmt(self.chosen_power_limit_W, 'W')}; nothing was changed)")  # fmt: skip
        return (f"{fmt(self.chosen_power_limit_W, 'W')} chosen, in force from step {self.power_limit_from_step}"
                f" (original {fmt(self.power_limit_W, 'W')}, restored at the end)")  # fmt: skip

    def _estimate_lines(self) -> list[str]:
        """The CO2 and cost estimates, each with the factor it used (or why it is unknown)."""
        lines = []
        of = " of simulated energy" if self.simulated else ""
        if self.carbon is not None:
            c = self.carbon
            factor = f"{c.intensity_g_per_kWh:g} gCO2e/kWh, {c.intensity_source}"
            figure = "unknown" if c.co2_g is None else f"{three_figures(c.co2_g)} g CO2e{of}"
            lines.append(f"  CO2 (ESTIMATE) {figure} at {factor}, on {ENERGY_BASES[c.energy_basis]}"
                         + (f": {c.reason}" if c.reason else ""))  # fmt: skip
        if self.cost is not None:
            k = self.cost
            figure = "unknown" if k.cost is None else f"{three_figures(k.cost)} {k.currency}{of}"
            lines.append(f"  cost (ESTIMATE) {figure} at {k.price_per_kWh:g} {k.currency}/kWh, on "
                         f"{ENERGY_BASES[k.energy_basis]}" + (f": {k.reason}" if k.reason else ""))  # fmt: skip
        return lines

    def _counter_part(self, fmt: Callable[[float | None, str], str]) -> str:
        """The energy line's cross-check: the counter's figure, or ``n/a`` with the short reason, or nothing."""
        if self.counter_energy_J is not None and math.isfinite(self.counter_energy_J):
            return f"   (energy counter: {fmt(self.counter_energy_J, 'J')})"
        if self.counter_energy_note:  # e.g. a DDP run whose ranks' figures do not all stand
            return f"   (energy counter: n/a, {short_reason(self.counter_energy_note)})"
        return ""

    def __str__(self) -> str:
        def fmt(value: float | None, unit: str, scale: float = 1.0) -> str:
            if value is None or (isinstance(value, float) and math.isnan(value)):
                return "n/a"
            return f"{value / scale:,.3f} {unit}"

        lines = [
            f"zeus-callbacks run {self.run_name!r} ({self.status}) on {self.backend}"
            + ("   SIMULATED energy (virtual GPU, not measured)" if self.simulated else ""),
            f"  energy        {fmt(self.energy_J, 'J')}"
            + (f" ({readable_energy(self.energy_J)})" if self.energy_Wh is not None else "")
            + self._counter_part(fmt),
            f"  time          {fmt(self.time_s, 's')}",
            f"  mean power    {fmt(self.mean_power_W, 'W')}",
            f"  steps         {self.steps}   energy/step {fmt(self.step_energy_J, 'J')}"
            f"   time/step {fmt(self.step_time_s, 'ms', 1e-3)}" + self._sampled_steps_note(),
            f"  epochs        {self.epochs}   energy/epoch "
            + (", ".join(fmt(e, "J") for e in self.epoch_energy_J[-5:]) or "n/a (no epoch ran)")
            + (f" (last 5 of {len(self.epoch_energy_J)})" if len(self.epoch_energy_J) > 5 else ""),
            f"  power limit   {self._power_limit_line(fmt)}",
        ]
        parts = energy_parts(self.energy_J, self.epoch_energy_J)
        if parts is not None:
            lines.insert(6, f"  parts         {parts}")
        if self.world_size > 1 or len(self.gpu_energy_J) > 1:
            per_gpu = ", ".join(fmt(e, "J") for e in self.gpu_energy_J)
            lines.append(f"  GPUs          {len(self.gpu_energy_J)} over {self.world_size} process(es): {per_gpu}")
        if self.measurement == "unavailable":
            lines.append(f"  MEASUREMENT UNAVAILABLE: {self.measurement_note or 'the GPU cannot be measured'}")
        elif self.measurement_note:  # e.g. a DDP run that ended on a failure: one rank's figures
            lines.append(f"  PARTIAL: {self.measurement_note}")
        elif not self.complete and self.coverage is not None:
            lines.append(
                f"  INCOMPLETE: samples cover {100 * self.coverage:.1f} % of the run; energy is that part's only"
            )
        if self.energy_note:  # a resumed run whose checkpoint held no measured energy
            lines.append(f"  ENERGY UNKNOWN: {self.energy_note}")
        if self.time_note:
            lines.append(f"  TIME NOT SIMULATED: {self.time_note}")
        if self.energy_source != "samples":
            lines.append(
                f"  energy source {self.energy_source} (counter resolution {fmt(self.counter_resolution_J, 'J')})"
            )
        if self.counter_resets:
            lines.append(f"  counter resets {self.counter_resets} (each interval left out of the counter cross-check)")
        if self.degraded or self.faults:
            lines.append(f"  DEGRADED: sensor faults {dict(self.faults) or 'on another rank'}")
            if self.rejected_samples:
                lines.append(f"  rejected samples {dict(self.rejected_samples)}")
        if self.node_energy_note is not None and self.node_energy_note != NODE_OFF:  # off: nothing was asked for
            lines.append(f"  CPU/DRAM      CPU {fmt(self.cpu_energy_J, 'J')}, DRAM {fmt(self.dram_energy_J, 'J')}; "
                         f"node {fmt(self.node_energy_J, 'J')} ({self.node_energy_note})")  # fmt: skip
        lines += self._estimate_lines()
        if self.jsonl_path:
            lines.append(f"  log           {self.jsonl_path}")
        return "\n".join(lines)


def short_reason(note: str) -> str:
    """A note's first clause, for a one-line summary: its words up to the first ``": "``.

    A leading ``"GPU i: "`` (which GPU the note is about) is kept. E.g. ``"shorter than 2 s on nvml
    (20 counter update periods of 0.1 s): over fewer ..."`` gives ``"shorter than 2 s on nvml (20 counter
    update periods of 0.1 s)"``.
    """
    gpu = re.match(r"GPU \d+: ", note)
    prefix = gpu.group(0) if gpu else ""
    return prefix + note[len(prefix) :].split(": ", 1)[0]


def energy_parts(energy_J: object, epoch_energy_J: object) -> str | None:
    """Which parts make up a run's energy, as one line for the summary and ``report``.

    The epochs' windows and what lies outside every epoch window add up to the total. Outside:
    set-up before the first epoch, evaluations or steps after an epoch's end, the end of the run,
    and on a resumed run the part of the resumed epoch before the checkpoint. Inside an epoch,
    its record's ``ledger`` splits warm-up, steps, evaluations, their tails and the rest (no estimate here:
    a mean step times a step count mixes warm-up and carried steps into the figure).

    Args:
        energy_J: The run's energy (J).
        epoch_energy_J: Each epoch's energy (J), a list.

    Returns:
        The line, or None when no epoch ran, the total or an epoch is unknown, or the epochs
        hold more than the total (a figure this line must not turn into a negative rest).
    """
    split = energy_split(energy_J, epoch_energy_J)
    if split is None:
        return None
    epochs_J, outside_J = split
    total_J = epochs_J + outside_J
    assert isinstance(epoch_energy_J, list)  # energy_split returned figures: a list of epochs
    return (
        f"{len(epoch_energy_J)} epoch(s) {epochs_J:,.3f} J ({100 * epochs_J / total_J:.1f} %) + outside every epoch "
        f"{outside_J:,.3f} J ({100 * outside_J / total_J:.1f} %: set-up, steps or evaluations after an epoch, the "
        "end, a resumed epoch's part before the checkpoint); each epoch record's ledger splits its epoch"
    )


def energy_split(energy_J: object, epoch_energy_J: object) -> tuple[float, float] | None:
    """A run's energy split into its epochs' sum and what lies outside every epoch (the :func:`energy_parts` line).

    Args:
        energy_J: The run's energy (J), ``run_end``'s ``energy_J``.
        epoch_energy_J: Each epoch's energy (J), a list, ``run_end``'s ``epoch_energy_J``.

    Returns:
        ``(epochs_J, outside_J)``, which add up to ``energy_J`` (J); None when no epoch ran, the
        total or an epoch is unknown, or the epochs hold more than the total (never a negative rest).
    """
    if not isinstance(epoch_energy_J, list) or not epoch_energy_J or not _finite_number(energy_J):
        return None
    if not all(_finite_number(e) for e in epoch_energy_J):
        return None
    total_J, epochs_J = float(energy_J), float(sum(epoch_energy_J))
    outside_J = total_J - epochs_J
    if total_J <= 0 or outside_J < -1e-6 * total_J:  # more than rounding: the figures disagree
        return None
    return epochs_J, max(outside_J, 0.0)


def _finite_number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def file_stem(run_name: str) -> str:
    """``run_name`` as a plain file name inside the log directory.

    Path separators and control characters become ``_``, leading dots are dropped (no ``..``,
    no hidden file), the name is cut to 200 characters; an empty result is ``run``.

    Args:
        run_name: A run name from the configuration or a framework's logger.

    Returns:
        A name with no path component.
    """
    stem = "".join("_" if ch in "/\\" or ord(ch) < 32 else ch for ch in run_name).lstrip(".")[:200]
    return stem or "run"


class JsonlWriter:
    """Write one JSON object per line to a run's own energy log.

    Every run gets a new file: ``<log_dir>/<run_name>.jsonl``, or ``<run_name>-1.jsonl``,
    ``-2``, ... when that name is taken (created exclusively, so two runs started at
    once never share a file). Records are flushed one by one, so a crash loses at most
    the record being written. An unwritable directory raises :class:`EnergyLogError` (an
    ``OSError``) at construction, before training starts.

    Args:
        log_dir: Directory of the log (created if missing).
        run_name: Preferred file stem; a name a framework gave (a logger's ``exp/1``) is made a plain
            file name first (:func:`file_stem`), so the log stays inside ``log_dir``.

    Attributes:
        path: The file actually written.
        run_name: Its stem (the preferred name, or with a ``-N`` suffix).
    """

    def __init__(self, log_dir: Path, run_name: str) -> None:
        log_dir = Path(log_dir)
        run_name = file_stem(run_name)
        self._writing = False  # inside write(): a call now is re-entered (a signal handler)
        try:
            log_dir.mkdir(parents=True, exist_ok=True)
            for attempt in range(10_000):
                self.run_name = run_name if attempt == 0 else f"{run_name}-{attempt}"
                self.path = log_dir / f"{self.run_name}.jsonl"
                try:
                    # created exclusively; appended, so a re-entered write's line is never overwritten (write)
                    self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o666)
                    self._file = os.fdopen(self._fd, "w", encoding="utf-8")
                    break
                except FileExistsError:
                    continue
            else:
                raise FileExistsError(f"too many runs named {run_name!r} in {log_dir}")
        except OSError as exc:  # no package name: the callers that print it prefix "zeus-callbacks:"
            raise EnergyLogError(exc.errno, f"cannot write the energy log in {log_dir}: {exc.strerror or exc}") from exc

    def write(self, record: dict[str, Any]) -> None:
        """Write one record (NaN/inf become null).

        A signal handler (SIGTERM's ``run_end``) may run while this thread is inside a write; the
        buffered file refuses such a re-entry (``RuntimeError: reentrant call``) and the record was
        lost. A re-entered write goes past the buffer to the file's append-only descriptor, on a new line.
        """
        if self._file.closed:
            return
        line = json.dumps(_json_safe(record), sort_keys=False) + "\n"
        if self._writing:  # past the buffer, on the same append-only descriptor
            os.write(self._fd, ("\n" + line).encode("utf-8"))  # after any part of the interrupted record
            return
        self._writing = True
        try:
            self._file.write(line)
            self._file.flush()
        finally:
            self._writing = False

    def close(self) -> None:
        """Flush, fsync and close (idempotent)."""
        if not self._file.closed:
            self._file.flush()
            try:
                os.fsync(self._file.fileno())
            except OSError:
                pass
            self._file.close()


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def is_energy_log(path: str | Path) -> bool:
    """True when ``path`` is a file whose first line is an energy-log record (a JSON object with an ``event``).

    Reads at most 64 KiB of it; a store (SQLite's binary pages, a JSON store's document) is not one.
    """
    try:
        with open(path, encoding="utf-8") as file:
            line = file.readline(65536)
            while line and not line.strip():
                line = file.readline(65536)
        record = json.loads(line)
    except (OSError, UnicodeError, ValueError):
        return False
    return isinstance(record, dict) and isinstance(record.get("event"), str)


def not_a_store_but_a_log(path: str | Path) -> str:
    """What to say when an energy log is given where a store is expected."""
    return f"{path} is a zeus-callbacks energy log (JSONL), not a store: read it with `zeus-callbacks report {path}`"


def no_such_job(store: str | Path, job_id: str, job_ids: Sequence[str]) -> str:
    """What ``show STORE JOB`` and ``plot bandit STORE JOB`` say when the store has no job ``job_id``.

    Args:
        store: The store as given on the command line.
        job_id: The job asked for.
        job_ids: The store's jobs (listed, so that a typo can be seen).
    """
    return f"no job {job_id!r} in {store} (its jobs: {', '.join(job_ids) or 'none'})"


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSONL energy log, skipping a torn last line (crash mid-write).

    Returns:
        The records, each a dict with an ``event`` key, in file order.

    Raises:
        FileNotFoundError: The file does not exist.
        NotAnEnergyLog: The file is a folder, binary, or holds lines that are not
            energy-log records (a torn last line alone is tolerated).
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise NotAnEnergyLog(f"{path} is a folder, not a zeus-callbacks energy log") from None
    except (OSError, UnicodeError) as exc:
        raise NotAnEnergyLog(f"{path} is not a zeus-callbacks energy log: {exc}") from None
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines) and records:
                logger.warning("zeus-callbacks: ignoring a torn last line in %s", path)
                continue
            raise NotAnEnergyLog(f"{path} is not a zeus-callbacks energy log (line {number} is not JSON)") from None
        if not isinstance(record, dict) or "event" not in record:
            raise NotAnEnergyLog(f"{path} is not a zeus-callbacks energy log (line {number} is not a record)")
        records.append(record)
    return records
