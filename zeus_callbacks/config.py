"""The YAML configuration: one pydantic v2 model for the whole file.

Every section forbids unknown keys, so a typo fails loudly with the field's path
(``logging.interval_step: Extra inputs are not permitted``) instead of being ignored.
The sections ``power_limit``, ``batch_size`` and ``store`` are reserved for the
optimisers and the persistent store. Reading the file itself (safe loader, repeated keys,
size cap) is :mod:`zeus_callbacks._yaml_file`'s job.
"""

from __future__ import annotations

import datetime
import difflib
import logging
import reprlib
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from zeus_callbacks._grid_intensity import grid_intensity
from zeus_callbacks._yaml_file import MAX_CONFIG_BYTES as MAX_CONFIG_BYTES  # re-exported: it lived here
from zeus_callbacks._yaml_file import MAX_YAML_ALIASES as MAX_YAML_ALIASES  # re-exported: it lived here
from zeus_callbacks._yaml_file import read_yaml_file
from zeus_callbacks.backends._virtual_cpu import DEFAULT_POWER_PER_CORE_W
from zeus_callbacks.errors import ConfigError
from zeus_callbacks.measurement._overhead import MIN_FRACTION

# Bounds that keep a run physical: a value outside them is a typo or a unit mistake, and some
# (a 1e-12 W grid step, a 1e12 s sample buffer) would exhaust memory or hang the run.
MAX_BATCH_SIZE = 2**31 - 1  # fits every framework's int and the store's integer columns
MAX_SEED = 2**32 - 1  # numpy's seed range
MAX_VIRTUAL_GPUS = 64
MAX_BUFFER_S = 86_400.0  # a day of 20 ms samples: ~4.3 M samples
MAX_INTENSITY_G_PER_KWH = 2000.0  # above any grid's average (coal plants emit ~1000 gCO2e/kWh): a unit mistake
_ECHO_CHARS = 80  # an error message quotes at most this much of a bad value
_ECHO = reprlib.Repr()  # keyword arguments need Python 3.12
logger = logging.getLogger(__name__)
_ECHO.maxlevel, _ECHO.maxlist, _ECHO.maxdict, _ECHO.maxstring, _ECHO.maxother = 2, 4, 4, _ECHO_CHARS, _ECHO_CHARS


class _Section(BaseModel):
    # allow_inf_nan=False: a NaN target or an infinite period would never converge or never fire
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class VirtualGPUConfig(_Section):
    """Settings of the virtual GPU (used when ``backend`` is ``virtual``, or ``auto`` finds no GPU)."""

    trace: Path | None = Field(
        None,
        description="A power-limit sweep of your own GPU: a CSV in the Zeus summary_power format (columns dataset, "
        "network, batch_size, optimizer, power_limit, time_per_epoch, average_power; optional gpu, idle_power; see "
        "docs/backends.md). Default: the bundled Zeus trace of gpu.",
    )
    train_trace: Path | None = Field(
        None, description="Training paths for trace, in the Zeus summary_train format (the simulator samples them)."
    )
    gpu: str = Field(
        "A40",
        description="GPU model: A40 or V100 (the bundled Zeus traces), or, with trace, any name (unset: the "
        "trace's gpu column, else its file name).",
    )
    workload: str = Field(
        "imagenet",
        description="Trace workload by dataset: cifar100, imagenet, librispeech, movielens-1m, sentiment140 or "
        "squad; with trace, one of its datasets (unset: its first).",
    )
    batch_size: int | None = Field(
        None, gt=0, le=MAX_BATCH_SIZE, description="Trace batch size; default: the workload's."
    )
    idle_power_W: float | None = Field(
        None,
        ge=0,
        le=10_000,
        description="Idle power (W); default: the trace's idle_power column, else a per-GPU figure.",
    )
    num_devices: int = Field(1, ge=1, le=MAX_VIRTUAL_GPUS, description="How many virtual GPUs this process sees.")
    noise_W: float = Field(3.0, ge=0, le=1000, description="Standard deviation of the sensor noise (W).")
    sample_period_s: float = Field(0.02, ge=0.001, le=10, description="Power sample period (s); 20 ms like an H200.")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Seed of the sensor noise.")

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str, info: ValidationInfo) -> str:
        from zeus_callbacks.backends.traces import known_bundled_gpu, normalize_gpu

        if info.data.get("trace") is None:
            known_bundled_gpu(value)  # raises, naming the bundled GPUs and virtual.trace (reads no file)
        return normalize_gpu(value)

    @field_validator("workload")
    @classmethod
    def _known_workload(cls, value: str, info: ValidationInfo) -> str:
        from zeus_callbacks.backends.traces import WORKLOADS

        if info.data.get("trace") is None and value not in WORKLOADS:
            raise ValueError(f"unknown workload {value!r}; choose one of {', '.join(sorted(WORKLOADS))}")
        return value

    power_offset_W: float | list[float] = Field(
        0.0, description="Power added to every (or, as a list, to each) virtual GPU (W): makes GPUs differ."
    )


class SamplingConfig(_Section):
    """The background power sampler."""

    poll_period_s: float = Field(
        0.1, gt=0, le=1.0, description="How often the sampler thread drains the power stream (s)."
    )
    energy_counter_period_s: float = Field(
        1.0, ge=0.01, le=3600, description="How often the sampler reads the energy counter for cross-checks (s)."
    )
    buffer_s: float = Field(
        900.0,
        ge=1,
        le=MAX_BUFFER_S,
        description="Seconds of raw power samples kept in memory (ring buffer). Longer windows stay exact: "
        "the sampler keeps a running energy integral (every sample for this long, every second for 48 h).",
    )
    sensor_timeout_s: float = Field(
        0.5,
        ge=0.01,
        le=60,
        description="The longest the training thread waits for a sensor read (s), at an epoch end, the run's "
        "end or any hook; a read that takes longer is abandoned (the run is marked degraded, fault "
        "sensor_timeout) and a vendor call slower than this counts as slow_sensor_call. Default: five poll "
        "periods.",
    )


class WindowsConfig(_Section):
    """Which windows are measured."""

    step: bool = Field(True, description="Measure training steps (all, or a random sample: sample_fraction).")
    epoch: bool = Field(True, description="Measure every training epoch.")
    eval: bool = Field(True, description="Measure every evaluation loop.")
    phases: bool = Field(
        False,
        description="Measure the phases of the measured steps (forward, backward, optimizer, dataloader; "
        "forward_backward in the HF Trainer) and log their energy per epoch with a 95 % CI (FinGraV).",
    )
    sample_fraction: Literal["auto"] | float = Field(
        "auto",
        description="Fraction of the steps that get step and phase windows, in [0.001, 1], chosen at random; "
        "auto: as many as fit in windows.max_overhead of the step time (every step of a 40 ms step, a few "
        "percent of a CPU-bound 1 ms step). The run, epoch and eval windows (when on) cover every step.",
    )
    max_overhead: float = Field(
        0.002,
        gt=0,
        lt=0.5,
        description="Auto sample_fraction's budget: the fraction of the step time the windows may cost the "
        "training thread (hooks of measured steps, reports and the HF Trainer's logs built from them, and the "
        "calls of unmeasured steps as timed from inside; with one process, reports are spaced out to fit). "
        "No effect beside a numeric sample_fraction (a setting warning says so).",
    )
    warmup_steps: int = Field(
        1,
        ge=0,
        le=100_000,
        description="The run's first steps (autotuning, caches, data-loader workers starting): always measured "
        "and reported apart (the warmup record, energy/warmup_J), never in energy/step_J or the steps record's "
        "means; 0: none.",
    )
    sensor_delay_s: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Lag of the power samples behind the power they report (s); default: the backend's "
        "own figure (4 ms for NVML, from the H200 step test; 0 for the virtual GPU).",
    )

    @field_validator("sample_fraction", "max_overhead", mode="before")
    @classmethod
    def _no_booleans(cls, value: Any) -> Any:
        if isinstance(value, bool):  # YAML's yes/true would pass as 1.0
            raise ValueError("must be a number, not true/false")
        return value

    @field_validator("sample_fraction")
    @classmethod
    def _fraction_in_range(cls, value: Any) -> Any:
        if value != "auto" and not MIN_FRACTION <= value <= 1:
            # no "got" here: the ConfigError message adds the value as written
            raise ValueError(f"sample_fraction must be 'auto' or a number in [{MIN_FRACTION:g}, 1]")
        return value


class LoggingConfig(_Section):
    """Where and how often energy is reported."""

    interval_steps: int = Field(
        50,
        ge=1,
        le=10**9,
        description="Log step energy (mean over the interval) every this many steps; with one process and "
        "auto windows.sample_fraction, very short steps that are measured as a sample are reported less often, "
        "so reports fit the budget. A warning says so, and again each time the measured share falls below half "
        "of the share last announced. The interval is set again at each report.",
    )
    log_dir: Path = Field(Path("zeus_logs"), description="Directory of the JSONL energy log.")
    jsonl: bool = Field(True, description="Write the JSONL energy log.")
    progress_bar: bool = Field(True, description="Show the run's energy on the progress bar (Lightning).")
    run_name: str | None = Field(
        None,
        description="Name of the run, the stem of its JSONL file (-1, -2, ... is appended when that file exists). "
        "Default: with Lightning, the logger's <name>-<version> (e.g. lightning_digits-0; a string version alone); "
        "with the Hugging Face Trainer, the last part of TrainingArguments.run_name; otherwise (no logger or "
        "run_name, or an EnergySession used directly) the start time, run-YYYYmmdd-HHMMSS. It names a file "
        "inside log_dir: no path separator, no '..', at most 200 characters.",
    )

    @field_validator("run_name")
    @classmethod
    def _a_file_name(cls, value: str | None) -> str | None:
        if value is not None and (problem := run_name_problem(value)):
            raise ValueError(problem)
        return value


class PowerLimitConfig(_Section):
    """Just-in-time power-limit profiling (Zeus NSDI '23 §4.3; see docs/power_limit.md)."""

    enabled: bool = Field(False, description="Profile power limits at the start of training.")
    objective: Literal["energy", "time", "zeus_cost", "max_slowdown"] = Field(
        "zeus_cost",
        description="What the chosen limit minimises: energy, time, zeus_cost (eta_knob) or max_slowdown "
        "(lowest energy within max_slowdown x the time at the maximum limit).",
    )
    eta_knob: float = Field(0.5, ge=0, le=1, description="Energy weight of zeus_cost (Zeus eq. 2).")
    max_slowdown: float = Field(1.1, ge=1, le=100, description="Slowdown factor allowed by the max_slowdown objective.")
    step_W: float = Field(
        25.0,
        ge=1,
        le=1000,
        description="Largest spacing of the grid limits (W): the device's range is cut into equal parts at most "
        "this wide, both ends included (the Zeus grid where it divides the range).",
    )
    search: Literal["unimodal", "sweep"] = Field(
        "unimodal",
        description="unimodal: both ends, a noise-aware golden-section search, a sweep fallback where the curve is not "
        "unimodal, a few limits off the grid near the best; sweep: every grid limit.",
    )
    warmup_steps: int = Field(2, ge=0, le=100_000, description="Warm-up steps after each limit change (0 is valid).")
    warmup_s: float = Field(0.0, ge=0, le=3600, description="Minimum warm-up time after each limit change (s).")
    min_profile_steps: int = Field(
        4,
        ge=2,
        le=100_000,
        description="Fewest profiled steps per limit, unless its interval is already clearly above the best's.",
    )
    profile_steps: int = Field(40, ge=1, le=100_000, description="Most profiled steps per limit.")
    profile_s: float | None = Field(
        None, gt=0, le=86_400, description="Most profiled time per limit (s); none: no limit."
    )
    rel_ci: float = Field(
        0.01,
        gt=0,
        lt=1,
        description="Stop a limit's window once its 95% Student-t interval is within this fraction "
        "(or it measures no cheaper than the best so far).",
    )
    job_steps: int | None = Field(
        None,
        ge=1,
        le=10**9,
        description="Training steps the job is expected to run; when set, the search measures the best limits "
        "again while the rest of the job repays it (a longer job profiles more); none: the steps the fit has left, "
        "from Lightning or the HF Trainer (unknown for an endless fit).",
    )
    plot: bool = Field(True, description="Plot time vs energy per limit to <log_dir>/<run_name>.power_limit.png.")
    cache: bool = Field(True, description="Reuse a profile stored for the same job, GPU, batch size, world size.")
    cache_path: Path | None = Field(None, description="Profile cache file; default: <log_dir>/power_limit_cache.json.")
    cache_in: Literal["file", "store"] = Field(
        "file",
        description="Where profiles are cached: file (the JSON file cache_path) or store (the store file of the "
        "store section, beside the batch-size trials).",
    )
    restore_marker: Path | None = Field(
        None, description="Restore marker file; default: <log_dir>/power_limit_restore.json."
    )


class TargetConfig(_Section):
    """The validation metric a recurrence must reach (its *target*)."""

    metric: str = Field(..., min_length=1, description="Validation metric name, as the framework logs it.")
    value: float = Field(..., description="Threshold the metric must reach.")
    direction: Literal["max", "min"] = Field(
        "max", description="max: reached when metric >= value (accuracy); min: when metric <= value (loss, WER)."
    )

    def reached(self, metric_value: float) -> bool:
        """True when ``metric_value`` meets the target."""
        return metric_value >= self.value if self.direction == "max" else metric_value <= self.value

    def better(self, metric_value: float, than: float) -> bool:
        """True when ``metric_value`` is closer to (or further past) the target than ``than``."""
        return metric_value > than if self.direction == "max" else metric_value < than


class BatchSizeConfig(_Section):
    """Batch-size optimisation across recurrences of ``job_id`` (Zeus NSDI '23, §4.2–4.4)."""

    enabled: bool = Field(False, description="Suggest batch sizes across recurrences.")
    batch_sizes: list[int] | None = Field(None, description="Candidate batch sizes (required when enabled).")
    default_batch_size: int | None = Field(
        None,
        gt=0,
        le=MAX_BATCH_SIZE,
        description="Batch size pruning starts from (required when enabled; one of batch_sizes).",
    )
    target: TargetConfig | None = Field(None, description="Target metric; without one no run counts as converged.")
    stop_at_target: bool = Field(True, description="Stop training once the target is reached.")
    stop_agreement_steps: int = Field(
        20,
        ge=1,
        description="Several processes: the ranks agree on early stopping every this many steps (one small "
        "collective) and at each evaluation end; a single process checks every step, without collectives.",
    )
    eta_knob: float = Field(0.5, ge=0, le=1, description="Weight of energy in the cost (ZeusCost).")
    beta_knob: float | None = Field(
        2.0, gt=1, description="Stop a run whose cost exceeds beta_knob x the best converged cost; null: never."
    )
    max_power_W: float | None = Field(
        None, gt=0, le=1e7, description="MaxPower of the cost (W, all GPUs); default: maximum power limit x GPUs."
    )
    pruning_rounds: int = Field(
        1, ge=1, description="Pruning rounds before Thompson sampling (Zeus: 2; the pooled noise variance needs 1)."
    )
    seed: int = Field(
        0, ge=0, le=MAX_SEED, description="Seed of the bandit's generator (its state then lives in the store)."
    )
    prior_std_rel: float = Field(1.0, gt=0, description="Prior standard deviation of an arm's cost, relative.")
    noise_floor_rel: float = Field(0.05, gt=0, description="Floor of an arm's cost standard deviation, relative.")
    window: int | None = Field(None, ge=1, description="Use only each arm's last N observations (drift).")
    discount: float | None = Field(None, gt=0, le=1, description="Weight discount**age per observation (drift).")
    prune_cost_ratio: float | None = Field(
        1.5,
        ge=1,
        description="Pruning also ends a direction at a size costing more than this x the round's cheapest "
        "converged size; null: only non-convergence does (Zeus). While pruning, runs stop early at this x the "
        "best converged cost when that is below beta_knob. With prune_cost_ratio_no_descent set, it applies only "
        "after a size that lowered the cheapest converged cost.",
    )
    prune_cost_ratio_no_descent: float | None = Field(
        1.3,
        ge=1,
        description="Replaces prune_cost_ratio for a pruning candidate whose direction is not descending (the first "
        "size away from the start, or one after a size that did not lower the round's cheapest converged cost); "
        "null: prune_cost_ratio for every candidate.",
    )
    elimination_z: float | None = Field(
        2.0,
        gt=0,
        description="Thompson sampling skips arms whose lower confidence bound (mean - z sd) exceeds the best "
        "arm's upper bound (mean + z sd); null: samples every surviving arm.",
    )
    satisficing_rel: float | None = Field(
        0.01,
        ge=0,
        lt=1,
        description="Satisficing Thompson sampling: of the arms drawn within this fraction of the lowest draw, "
        "play the one with the lowest posterior mean; null: plain Thompson sampling.",
    )
    explore_stop_z: float | None = Field(
        2.0,
        gt=0,
        description="Stop a Thompson-sampling run of an arm other than the best (lowest posterior mean) once its "
        "cost passes the best arm's mean + z noise sd; the stopped cost counts at its Gaussian tail mean; "
        "null: only beta_knob stops such runs.",
    )
    max_failures: int | None = Field(
        2,
        ge=1,
        le=1000,
        description="Prune a batch size whose last this many finished runs all failed (a crash, out of memory, a "
        "killed process; an interruption does not count); the reason is shown by zeus-callbacks show; null: "
        "failures never prune.",
    )
    lr_scaling: Literal["none", "linear", "sqrt"] = Field(
        "none", description="Scale the learning rate with the batch size (relative to default_batch_size)."
    )
    module_attr: str = Field(
        "batch_size", min_length=1, description="Lightning: batch-size attribute of the module/datamodule (hparams)."
    )
    lr_attr: str | None = Field(None, description="Lightning: learning-rate attribute; default: lr or learning_rate.")

    @field_validator("batch_sizes")
    @classmethod
    def _sizes_valid(cls, value: list[int] | None) -> list[int] | None:
        if value is not None:
            if not value or min(value) <= 0 or len(set(value)) != len(value):
                raise ValueError("must be distinct positive integers")
            if max(value) > MAX_BATCH_SIZE:
                raise ValueError(f"a batch size must be at most {MAX_BATCH_SIZE}")
            value = sorted(value)
        return value

    @model_validator(mode="after")
    def _complete_when_enabled(self) -> BatchSizeConfig:
        if self.enabled:
            if not self.batch_sizes or self.default_batch_size is None:
                raise ValueError("batch_sizes and default_batch_size are required when enabled")
        if self.batch_sizes and self.default_batch_size is not None and self.default_batch_size not in self.batch_sizes:
            raise ValueError(f"default_batch_size {self.default_batch_size} is not in batch_sizes {self.batch_sizes}")
        return self


class StoreConfig(_Section):
    """The persistent store of jobs, trials, bandit state and power-limit profiles."""

    backend: Literal["sqlite", "json"] = Field(
        "sqlite", description="Store format of a store file; when not given, json for a store.path ending in .json."
    )
    path: Path | None = Field(None, description="Store file; default: <log_dir>/zeus_store.<ext>.")
    url: str | None = Field(
        None,
        description="Database URL instead of a file, for a store many nodes share: postgresql://user:password@host/db, "
        "mysql://..., any SQLAlchemy URL (pip install 'zeus-callbacks[postgres]'); sqlite:///path is the "
        "SQLite file path. Overrides backend and path.",
    )
    lease_grace_s: float = Field(
        300.0,
        ge=1.0,
        description="A running trial of another host whose heartbeat is older than this (s) is marked failed "
        "when the store is opened; use the same value on every node.",
    )
    lock_timeout_s: float = Field(
        30.0,
        ge=0.1,
        le=3600.0,
        description="How long (s) a store operation waits for another process's lock or transaction (a database: "
        "retries a transient error) before giving up: at run start the run then trains at default_batch_size "
        "without the bandit's suggestion; either way (start or end) the trial's outcome is written to "
        "<log_dir>/zeus_pending_trials at the run's end and recorded on the next open.",
    )

    @field_validator("url")
    @classmethod
    def _url_has_scheme(cls, value: str | None) -> str | None:
        if value is not None and "://" not in value:
            raise ValueError("must be a URL such as postgresql://user:password@host/db or sqlite:///path")
        return value

    @model_validator(mode="before")
    @classmethod
    def _backend_from_suffix(cls, data: Any) -> Any:
        # store.path: runs/zeus_store.json without a backend wrote a SQLite file under a .json name,
        # which show (and a reader by eye) then took for broken JSON.
        if isinstance(data, dict) and "backend" not in data and str(data.get("path") or "").lower().endswith(".json"):
            return {**data, "backend": "json"}
        return data

    @model_validator(mode="after")
    def _url_or_path(self) -> StoreConfig:
        if self.url is not None and self.path is not None:
            raise ValueError("set either store.url or store.path, not both")
        return self

    def resolved_path(self, log_dir: Path) -> Path:
        """The store file: ``path``, or ``<log_dir>/zeus_store.sqlite|json``."""
        return self.path if self.path is not None else Path(log_dir) / f"zeus_store.{self.backend}"

    def location(self, log_dir: Path) -> str | Path:
        """What :func:`~zeus_callbacks.store.open_store` opens: ``url`` if set, else :meth:`resolved_path`."""
        return self.url if self.url is not None else self.resolved_path(log_dir)


class CarbonConfig(_Section):
    """The grid carbon intensity behind the run's CO2 estimate (``energy/co2_g``); offline, nothing is fetched.

    Give at most one of ``intensity_g_per_kWh`` (your grid's figure) and ``region`` (looked up in the
    bundled yearly table, :mod:`zeus_callbacks._grid_intensity`); with neither, no CO2 figure is made.
    """

    intensity_g_per_kWh: float | None = Field(
        None,
        ge=0,
        le=MAX_INTENSITY_G_PER_KWH,
        description="Carbon intensity of the electricity the run uses (gCO2e/kWh), e.g. your provider's or grid "
        "operator's figure. The run's CO2 estimate is energy (kWh) x this.",
    )
    region: str | None = Field(
        None,
        description="ISO 3166-1 alpha-2 country code (DE, FR, IN, ...) whose 2023 yearly average intensity the "
        "bundled table holds (Our World in Data / Ember, CC BY 4.0; docs/node_energy.md lists the codes). "
        "Instead of intensity_g_per_kWh.",
    )

    @field_validator("region")
    @classmethod
    def _region_known(cls, value: str | None) -> str | None:
        return None if value is None else grid_intensity(value).region  # ValueError: the codes the table has

    @model_validator(mode="after")
    def _one_source(self) -> CarbonConfig:
        if self.intensity_g_per_kWh is not None and self.region is not None:
            raise ValueError("give intensity_g_per_kWh or region, not both")
        return self


class CostConfig(_Section):
    """The electricity price behind the run's cost estimate (``cost/run``)."""

    price_per_kWh: float | None = Field(
        None,
        ge=0,
        description="Price of a kilowatt-hour in currency; the run's cost estimate is energy (kWh) x this. "
        "Unset: no cost figure.",
    )
    currency: str | None = Field(
        None,
        min_length=1,
        max_length=16,
        description="Currency of price_per_kWh (EUR, USD, ...), shown with the cost; required with price_per_kWh.",
    )

    @model_validator(mode="after")
    def _currency_named(self) -> CostConfig:
        if self.price_per_kWh is not None and self.currency is None:
            raise ValueError("price_per_kWh needs its currency: set cost.currency (e.g. EUR)")
        return self


class NodeConfig(_Section):
    """CPU package and DRAM energy of the node from the Linux powercap interface (RAPL), beside the GPUs'.

    Where no RAPL counter can be read, a simulated CPU stands in beside the virtual GPU (``virtual_cpu``).
    """

    rapl: bool = Field(
        False,
        description="Read the CPU package and DRAM energy counters (/sys/class/powercap/intel-rapl*) at the run's "
        "start and end and at each epoch's: energy/cpu_J, energy/dram_J and energy/node_J (GPUs + CPU + DRAM), "
        "and per epoch energy/epoch_cpu_J, energy/epoch_dram_J, energy/epoch_node_J. Recent kernels let "
        "only root read them (docs/node_energy.md says how to allow it). Under several processes each node's "
        "local rank 0 reads them, so each node is counted once.",
    )
    powercap_root: Path = Field(
        Path("/sys/class/powercap"), description="The powercap folder (another path where sysfs is mounted elsewhere)."
    )
    virtual_cpu: bool = Field(
        False,
        description="On the virtual GPU only, where no RAPL package counter can be read: a SIMULATED CPU package "
        "(this process's CPU time × virtual_cpu_power_per_core_W; no DRAM) gives energy/cpu_J and energy/node_J, "
        "flagged simulated. Turns the node figures on as node.rapl does (RAPL is tried first). Never used beside "
        "a real GPU: there the CPU energy is null with the reason (docs/node_energy.md).",
    )
    virtual_cpu_power_per_core_W: float = Field(
        DEFAULT_POWER_PER_CORE_W,
        gt=0,
        le=100,
        description="The virtual CPU's power per busy core (W); default: Intel Xeon Platinum 8480+ TDP 350 W / "
        "56 cores (a nominal figure, not a measurement).",
    )


class ZeusConfig(_Section):
    """The whole zeus-callbacks configuration (one YAML file).

    Example:
        >>> cfg = ZeusConfig.model_validate({"backend": "virtual", "logging": {"interval_steps": 10}})
        >>> cfg.logging.interval_steps
        10
    """

    job_id: str = Field("default", min_length=1, description="Names the recurring job (store key).")
    backend: Literal["auto", "nvml", "amdsmi", "virtual"] = Field(
        "auto",
        description="GPU backend: auto = NVIDIA, else AMD, else (no GPU on the machine) the virtual GPU; a GPU "
        "that neither can measure gives measurement unavailable (null energy), never simulated figures.",
    )
    gpu_indices: list[int] | None = Field(
        None,
        description="GPUs this process measures; default: its local rank's GPU under a distributed "
        "launcher, else every visible GPU.",
    )
    virtual: VirtualGPUConfig = Field(default_factory=VirtualGPUConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    windows: WindowsConfig = Field(default_factory=WindowsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    power_limit: PowerLimitConfig = Field(default_factory=PowerLimitConfig)
    batch_size: BatchSizeConfig = Field(default_factory=BatchSizeConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    carbon: CarbonConfig = Field(default_factory=CarbonConfig)
    cost: CostConfig = Field(default_factory=CostConfig)
    node: NodeConfig = Field(default_factory=NodeConfig)

    @field_validator("gpu_indices")
    @classmethod
    def _indices_unique(cls, value: list[int] | None) -> list[int] | None:
        if value is not None:
            if not value:
                raise ValueError("must name at least one GPU, or be null for the default")
            if len(set(value)) != len(value) or min(value) < 0:
                raise ValueError("must be distinct non-negative indices")
        return value


def run_name_problem(run_name: str) -> str | None:
    """Why ``run_name`` cannot name a file inside the log directory, or None when it can.

    Args:
        run_name: A run name (the stem of ``<log_dir>/<run_name>.jsonl``).

    Returns:
        A one-line reason (a path separator, ``..``, empty, too long, a control character), or None.
    """
    if not run_name.strip():
        return "run_name must not be empty"
    if "/" in run_name or "\\" in run_name:
        return "run_name names a file inside log_dir: it must not contain a path separator"
    if run_name in (".", "..") or run_name.startswith(".."):
        return "run_name must not be '.' or start with '..'"
    if len(run_name) > 200:
        return "run_name must be at most 200 characters"
    if any(ord(ch) < 32 for ch in run_name):
        return "run_name must not contain control characters"
    return None


def _as_written(value: Any) -> str:
    """A value as the user wrote it in YAML: ``2024-01-01``, not ``datetime.date(2024, 1, 1)``."""
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    text = _ECHO.repr(value)  # bounded: a huge (or alias-shared, deeply nested) value is never expanded
    return text if len(text) <= _ECHO_CHARS else text[: _ECHO_CHARS - 3] + "..."


def _section_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The section model that holds the field at ``loc`` (``None`` where none does)."""
    model: type[BaseModel] = ZeusConfig
    for part in loc[:-1]:
        if not isinstance(part, str):
            continue  # a list index: the list's item type was found with its field
        field = model.model_fields.get(part)
        found = _model_in(field.annotation) if field is not None else None
        if found is None:
            return None
        model = found
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The first pydantic model inside an annotation (``X | None``, ``list[X]`` ...), else ``None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, tuple, dict):
        return next((found for found in map(_model_in, typing.get_args(annotation)) if found is not None), None)
    return None


def _did_you_mean(loc: tuple[int | str, ...]) -> str:
    """``"; did you mean 'x'?"`` for an unknown key close to one of its section's fields, else ``""``."""
    section = _section_at(loc)
    if section is None or not isinstance(loc[-1], str):
        return ""
    matches = difflib.get_close_matches(loc[-1], list(section.model_fields), n=1)
    return f"; did you mean {matches[0]!r}?" if matches else ""


def _format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"invalid zeus-callbacks configuration in {source}:"]
    for error in exc.errors():
        path = ".".join(str(part) for part in error["loc"]) or "<root>"
        value = error.get("input")
        line = f"  {path}: {error['msg']} (got {_as_written(value)})"
        if error.get("type") == "extra_forbidden" and error["loc"]:
            line += _did_you_mean(error["loc"])
        if error.get("type") == "string_type" and isinstance(value, (int, float, datetime.date, datetime.time)):
            # YAML read a number, a date or a boolean where text was meant
            line += f'; quote it in the YAML file: {error["loc"][-1]}: "{_as_written(value)}"'
        lines.append(line)
    return "\n".join(lines)


def setting_warnings(config: ZeusConfig) -> list[str]:
    """Settings that are valid but have no effect beside the others, one line each.

    Only values other than the defaults count, so a configuration dumped and read back (the HF
    callback's checkpointed state) warns as the one written did.

    Args:
        config: A validated configuration.

    Returns:
        One message per setting without effect, naming its dotted key and why (empty when none).
    """
    found = []
    windows = config.windows
    default_overhead = WindowsConfig.model_fields["max_overhead"].default
    if windows.sample_fraction != "auto" and windows.max_overhead != default_overhead:
        found.append(
            "windows.max_overhead has no effect: it is the budget of windows.sample_fraction: auto, "
            f"and windows.sample_fraction is {windows.sample_fraction:g}"
        )
    return found


def batch_size_warnings(config: ZeusConfig) -> list[str]:
    """What a batch-size search misses without ``job_id`` or ``batch_size.target``, one line each.

    Valid either way, and the bandit runs: without ``job_id`` its trials are those of job
    ``default``, which every configuration that names no job shares in that store; without a target
    no run converges, so the pruning removes no batch size (:attr:`BanditSettings.has_target
    <zeus_callbacks.optimizers.batch_size._bandit_settings.BanditSettings.has_target>`), no run is
    stopped early on cost (``beta_knob``: its threshold is the best converged cost) and the costs
    compared are whole runs', not the cost to a target. ``validate-config`` prints these; a run
    does not log them.

    Args:
        config: A validated configuration.

    Returns:
        One message per missing key, naming it and the consequence (empty when batch_size is off
        or both are set).
    """
    if not config.batch_size.enabled:
        return []
    found = []
    if config.job_id == ZeusConfig.model_fields["job_id"].default:
        found.append(
            f"batch_size.enabled without job_id: the trials go to job {config.job_id!r}, which every "
            "configuration that names no job shares in this store, so different trainings would mix in one "
            "search; set job_id to name this recurring job"
        )
    if config.batch_size.target is None:
        found.append(
            "batch_size.enabled without batch_size.target: no run converges, so the pruning removes no batch "
            "size, no run is stopped early on cost (beta_knob) and the bandit compares whole runs' costs, not "
            "the cost to reach a target; set batch_size.target {metric, value, direction}"
        )
    return found


def parse_config(data: Any, source: str = "<dict>", *, warn: bool = True) -> ZeusConfig:
    """Validate a mapping (e.g. parsed YAML) into a :class:`ZeusConfig`.

    Args:
        data: A mapping, ``None`` (all defaults) or an existing ``ZeusConfig``.
        source: Where the data came from, for error and warning messages.
        warn: Log each of :func:`setting_warnings` as a warning naming ``source``.

    Returns:
        The validated configuration.

    Raises:
        ConfigError: The data is not a mapping, has unknown keys or bad values; the
            message lists each offending field by its dotted path.
    """
    if isinstance(data, ZeusConfig):
        return data
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"invalid zeus-callbacks configuration in {source}: expected a mapping of settings, "
            f"got {type(data).__name__}"
        )
    try:
        config = ZeusConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, source)) from None
    if warn:
        for message in setting_warnings(config):
            logger.warning("zeus-callbacks: %s: %s", source, message)
    return config


def load_config(path: str | Path, *, warn: bool = True) -> ZeusConfig:
    """Read and validate a YAML configuration file (PyYAML's safe loader; repeated keys refused).

    Args:
        path: The YAML file.
        warn: Log each of :func:`setting_warnings` as a warning naming the file.

    Returns:
        The validated configuration.

    Raises:
        ConfigError: The file is missing, unreadable, not YAML, repeats a key, or invalid; the
            message names the file (and the field, for invalid values).
    """
    return parse_config(read_yaml_file(path), source=str(path), warn=warn)
