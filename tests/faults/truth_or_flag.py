"""The truth-or-flag harness: run one fault schedule through a real EnergySession on a fake GPU.

A schedule is a short training run (epochs of steps on a fake clock) on the fake NVML or amdsmi
module, with a piecewise-constant true power and a list of sensor faults switched on and off at
step boundaries. :func:`run_schedule` plays it and returns every figure the run reported (each
``steps`` record, each epoch, the run) with its truth from the fake's :class:`PowerModel` and its
flags. :func:`violations` applies the invariant of issue 16 item 5: each figure is within its
tolerance of the truth, or null, or flagged (``degraded``, or ``complete: false``).

Tolerance of a window ``[a, b]`` (J): ``ABS_EPS_J`` for the clock's resolution, plus, for each change
of the true power within ``edge_s`` of the window, ``|ΔP| × edge_s``: a sample is the mean of the
previous ~15 ms and is seen ~16 ms late, one every 20 ms (docs/hardware.md#sample-semantics), so a
change smears over at most 20 + 15 + 16 = 51 ms < ``NVML_EDGE_S``; an amdsmi sample is the counter's
mean over one poll interval (one step here), so its edge is a step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fakes import fake_amdsmi as fa
from tests.fakes import fake_pynvml as fp
from tests.faults import tally as tallies
from tests.faults.scratch import scratch_dir
from zeus_callbacks.backends._amdsmi import AMDSMIBackend
from zeus_callbacks.backends._nvml import NVMLBackend
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.reporting import read_jsonl
from zeus_callbacks.session import EnergySession

T0 = 1_800_000_000.0  # realtime seconds on the fakes' 100 ms grid
NVML_EDGE_S = 0.06
# Timestamps near 1.8e9 s are floats with ~2.4e-7 s resolution and the fakes stamp in µs: two edges at
# 750 W and 1 µs give 1.5e-3 J; 0.01 J leaves room for the running integral's rounding.
ABS_EPS_J = 0.01
REL_EPS = 1e-6

NVML_FAULTS = (
    "lost",
    "samples_unknown",
    "unsupported_mid",
    "counter_reset",
    "bad_nan",
    "bad_negative",
    "bad_huge",
    "bad_future",
    "counter_lost",
    "counter_stuck",
)
AMDSMI_FAULTS = ("lost", "counter_reset", "power_info_lost", "counter_stuck")
AMDSMI_REFRESH_S = 0.001
"""The amdsmi energy counter refreshes every ~1 ms (docs/hardware.md): each edge of a window it measures
may be off by that long at the window's power."""


@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` from step ``start`` for ``length`` steps (one-shot kinds fire at ``start``)."""

    kind: str
    start: int
    length: int


@dataclass(frozen=True)
class Schedule:
    """A training run and the faults of its sensor."""

    vendor: str  # "nvml" or "amdsmi"
    epoch_steps: tuple[int, ...]
    step_s: float
    loads_W: tuple[tuple[int, float], ...]  # (step, W): the true power from that step's start on
    faults: tuple[Fault, ...] = ()
    bytes_name: bool = False
    unsupported_from_start: bool = False  # nvml: no power stream at all, the counter only


@dataclass
class Figure:
    """One reported figure, its truth and its flags."""

    what: str
    value_J: float | None
    truth_J: float
    tolerance_J: float
    flagged: bool

    @property
    def violation(self) -> bool:
        """Neither right, nor null, nor flagged."""
        if self.value_J is None or self.flagged:
            return False
        if not math.isfinite(self.value_J):
            return True  # NaN is not null: it is a number that says nothing
        return abs(self.value_J - self.truth_J) > self.tolerance_J


@dataclass
class Outcome:
    """What a schedule's run reported."""

    figures: list[Figure] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=dict)


def _edge_s(schedule: Schedule) -> float:
    return NVML_EDGE_S if schedule.vendor == "nvml" else max(NVML_EDGE_S, schedule.step_s)


def _make(schedule: Schedule, clock: ManualClock):
    if schedule.vendor == "nvml":
        fake: Any = fp.FakePyNVML(num_gpus=1, time_fn=clock.now_s)
        if schedule.bytes_name:
            fake.gpus[0].name = fp.H200_NAME.encode()
        if schedule.unsupported_from_start:
            for func in ("nvmlDeviceGetSamples", "nvmlDeviceGetFieldValues", "nvmlDeviceGetPowerUsage"):
                fake.make_unsupported(func)
        return fake, NVMLBackend(nvml_module=fake, clock=clock, read_only=True)
    fake = fa.FakeAMDSMI(num_gpus=1, time_fn=clock.now_s)
    if schedule.bytes_name:
        fake.gpus[0].name = fa.MI300X_NAME.encode()
    return fake, AMDSMIBackend(amdsmi_module=fake, clock=clock, read_only=True)


def _switch(fake: Any, schedule: Schedule, step: int) -> None:
    """Start and end the faults due at ``step``'s start."""
    nvml = schedule.vendor == "nvml"
    lost = fp.NVML_ERROR_GPU_IS_LOST if nvml else fa.AmdSmiRetCode.ERR_IO
    ending = [f for f in schedule.faults if f.start + f.length == step and f.length > 0]
    starting = [f for f in schedule.faults if f.start == step]
    for f in ending:
        if f.kind == "counter_stuck":
            fake.stick_counter(0, stuck=False)
    if ending:  # the device is found again: every timed fault is lifted, the active ones re-applied
        fake.clear_faults()
        if schedule.unsupported_from_start:
            for func in ("nvmlDeviceGetSamples", "nvmlDeviceGetFieldValues", "nvmlDeviceGetPowerUsage"):
                fake.make_unsupported(func)
        starting += [f for f in schedule.faults if f.start < step < f.start + f.length]
    for f in starting:
        if f.kind == "lost":
            for func in (
                (
                    "nvmlDeviceGetSamples",
                    "nvmlDeviceGetTotalEnergyConsumption",
                    "nvmlDeviceGetFieldValues",
                    "nvmlDeviceGetPowerUsage",
                )
                if nvml
                else ("amdsmi_get_energy_count", "amdsmi_get_power_info")
            ):
                fake.fail_always(func, lost)
        elif f.kind == "samples_unknown":
            fake.fail_always("nvmlDeviceGetSamples", fp.NVML_ERROR_UNKNOWN)
        elif f.kind == "counter_lost":
            fake.fail_always("nvmlDeviceGetTotalEnergyConsumption", lost)
        elif f.kind == "power_info_lost":
            fake.fail_always("amdsmi_get_power_info", lost)
        elif f.kind == "counter_stuck" and f.start == step:
            fake.stick_counter(0)
        elif f.kind == "unsupported_mid" and f.start == step:
            for func in ("nvmlDeviceGetSamples", "nvmlDeviceGetFieldValues", "nvmlDeviceGetPowerUsage"):
                fake.make_unsupported(func)
        elif f.kind == "counter_reset" and f.start == step:
            if nvml:
                fake.counter_backwards(0, by_mJ=5_000_000)
            else:
                fake.counter_backwards(0, by_ticks=round(5_000 * 1e6 / fake.counter_resolution_uJ))
        elif f.kind.startswith("bad_") and f.start == step:
            fake.corrupt_next_sample(
                **{
                    "bad_nan": {"power_W": math.nan},
                    "bad_negative": {"power_W": -1e6},
                    "bad_huge": {"power_W": 1e9},
                    "bad_future": {"shift_s": 60.0},
                }[f.kind]
            )


def run_schedule(schedule: Schedule, log_dir: Path | None = None) -> Outcome:
    """Play ``schedule`` through a real EnergySession and return its figures with their truth."""
    with scratch_dir() as tmp:
        return _run(schedule, Path(log_dir or tmp))


def _run(schedule: Schedule, log_dir: Path) -> Outcome:
    clock = ManualClock(T0)
    fake, backend = _make(schedule, clock)
    loads = dict(schedule.loads_W)
    if 0 in loads:
        fake.set_load(loads[0])
    changes: list[tuple[float, float]] = []  # (time, |ΔP|)
    session = EnergySession(
        {
            "backend": schedule.vendor,
            "windows": {"sample_fraction": 1.0},
            "logging": {"log_dir": str(log_dir), "run_name": "run", "interval_steps": 4},
        },
        backend=backend,
        is_main_process=True,
    )
    session.train_start()
    # The test plays the sampler thread (one poll per step, on the fake clock); the session's own
    # bounded polls still run (on a helper thread) wherever it asks for one.
    session.sampler.stop(final_drain=False)
    run_start = clock.now_s()
    epochs: list[tuple[float, float]] = []
    steps: list[tuple[float, float]] = []
    step = 0
    try:
        for e, count in enumerate(schedule.epoch_steps):
            session.epoch_start(e)
            epoch_start = clock.now_s()
            for _ in range(count):
                _switch(fake, schedule, step)
                if step in loads and step > 0:
                    before = fake.gpus[0].model.power_W(clock.now_s())
                    fake.set_load(loads[step])
                    changes.append((clock.now_s(), abs(loads[step] - before)))
                session.step_start(step)
                start = clock.now_s()
                clock.advance(schedule.step_s)
                session.sampler.poll_once()
                session.step_end(step, num_samples=8)
                steps.append((start, clock.now_s()))
                step += 1
            session.epoch_end(e)
            epochs.append((epoch_start, clock.now_s()))
    finally:
        summary = session.train_end()
        backend.close()
    run_end = clock.now_s()
    edge_s = _edge_s(schedule)
    max_W = max(w for _, w in schedule.loads_W) if schedule.loads_W else fake.gpus[0].model.power_W(run_start)

    def truth(a: float, b: float) -> float:
        return fake.true_energy_J(a, b)

    def tolerance(a: float, b: float) -> float:
        smear = sum(dp * edge_s for t, dp in changes if a - edge_s < t < b + edge_s)
        refresh = 2 * AMDSMI_REFRESH_S * max_W if schedule.vendor == "amdsmi" else 0.0
        return ABS_EPS_J + REL_EPS * truth(a, b) + smear + refresh

    out = Outcome(faults=dict(summary.faults))
    run_flagged = summary.degraded or getattr(summary, "complete", True) is False
    out.figures.append(
        Figure("run", summary.energy_J, truth(run_start, run_end), tolerance(run_start, run_end), run_flagged)
    )
    records = read_jsonl(summary.jsonl_path)
    for r in records:
        if r["event"] == "epoch":
            a, b = epochs[r["epoch"]]
            out.figures.append(
                Figure(
                    f"epoch {r['epoch']}",
                    r["energy_J"],
                    truth(a, b),
                    tolerance(a, b),
                    bool(r.get("degraded")) or r.get("complete") is False,
                )
            )
        elif r["event"] == "steps" and r.get("count"):
            idx = range(r["last_step"] - r["count"] + 1, r["last_step"] + 1)
            mean = r["energy_J_mean"]
            true_mean = sum(truth(*steps[k]) for k in idx) / len(idx)
            tol_mean = sum(tolerance(*steps[k]) for k in idx) / len(idx)
            out.figures.append(
                Figure(
                    f"steps {idx.start}-{idx.stop - 1}",
                    mean,
                    true_mean,
                    tol_mean,
                    bool(r.get("degraded")) or r.get("complete") is False,
                )
            )
    return out


def violations(outcome: Outcome) -> list[Figure]:
    """The figures that are neither right, nor null, nor flagged."""
    return [f for f in outcome.figures if f.violation]


TALLY = tallies.TRUTH
"""Counts of the property run, printed by tests/conftest.py as ``truth-or-flag: N schedules, V violations``."""


def tally(outcome: Outcome) -> list[Figure]:
    """Count one schedule's figures in :data:`TALLY` and return its violations."""
    bad = violations(outcome)
    TALLY["schedules"] += 1
    TALLY["violations"] += bool(bad)
    for f in outcome.figures:
        if f.value_J is None or f.flagged:
            TALLY["flagged_or_null"] += 1
        else:
            TALLY["checked"] += 1
    return bad
