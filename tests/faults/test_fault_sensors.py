"""Sensor faults mid-run, through the fake vendor libraries and the real NVML / amdsmi backends.

Each case runs an EnergySession for ``STEPS`` steps on a manual clock, makes the sensor
fail from ``FAULT_FROM`` to ``FAULT_UNTIL`` (every read of the stream in between), and
checks: the run completes; the summary and the JSONL (``run_end`` and the ``steps``
records logged after the fault) say ``degraded`` with the fault's kind in ``faults``;
one warning for the fault kind however many reads failed, never one per step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from tests.fakes import fake_amdsmi as fa
from tests.fakes import fake_pynvml as fp
from zeus_callbacks.backends._amdsmi import AMDSMIBackend
from zeus_callbacks.backends._nvml import NVMLBackend
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.reporting import read_jsonl
from zeus_callbacks.session import EnergySession

T0 = 1_800_000_000.0  # realtime seconds, on the fakes' 100 ms sensor grid (as tests/test_backend_nvml.py)
STEP_S = 0.1
STEPS = 60
FAULT_FROM, FAULT_UNTIL = 15, 45  # 3 s of failing reads: ~30 sample drains, ~3 counter reads
INTERVAL_STEPS = 5
LOAD_W = 300.0
BACKWARDS_J = 1000.0  # a counter reset larger than what the GPU draws between two reads


@dataclass(frozen=True)
class SensorFault:
    vendor: str  # "nvml" or "amdsmi"
    inject: Callable  # (fake library) -> None, at FAULT_FROM
    kind: str  # the key expected in summary.faults
    pattern: str  # text every warning about this kind contains
    min_reads: int  # failing reads at least (shows the warning is not per read)


NOT_SUPPORTED_SOURCES = ("nvmlDeviceGetSamples", "nvmlDeviceGetFieldValues", "nvmlDeviceGetPowerUsage")


def _every_power_source_unsupported(fake: fp.FakePyNVML) -> None:
    for func in NOT_SUPPORTED_SOURCES:
        fake.make_unsupported(func)


FAULTS = {
    "nvml GPU_IS_LOST (power samples)": SensorFault(
        "nvml", lambda f: f.fail_always("nvmlDeviceGetSamples", fp.NVML_ERROR_GPU_IS_LOST), "gpu_lost", "gpu_lost", 20
    ),
    "nvml UNKNOWN (power samples)": SensorFault(
        "nvml", lambda f: f.fail_always("nvmlDeviceGetSamples", fp.NVML_ERROR_UNKNOWN), "unknown", "(unknown)", 20
    ),
    "nvml NOT_SUPPORTED (every power source)": SensorFault(
        "nvml", _every_power_source_unsupported, "not_supported", "not_supported", 20
    ),
    "nvml GPU_IS_LOST (energy counter)": SensorFault(
        "nvml",
        lambda f: f.fail_always("nvmlDeviceGetTotalEnergyConsumption", fp.NVML_ERROR_GPU_IS_LOST),
        "gpu_lost",
        "gpu_lost",
        2,
    ),
    # nvml energy counter backwards: a reset is not a fault (the samples are exact), see
    # tests/test_honest_figures.py::test_counter_reset_drops_one_interval_and_the_cross_check_goes_on.
    "amdsmi ERR_IO (energy count)": SensorFault(
        "amdsmi",
        lambda f: f.fail_always("amdsmi_get_energy_count", fa.AmdSmiRetCode.ERR_IO),
        "unknown",
        "(unknown)",
        20,
    ),
    "amdsmi ERR_NOT_SUPPORTED (energy count)": SensorFault(
        "amdsmi",
        lambda f: f.fail_always("amdsmi_get_energy_count", fa.AmdSmiRetCode.ERR_NOT_SUPPORTED),
        "not_supported",
        "not_supported",
        20,
    ),
    "amdsmi energy counter backwards": SensorFault(
        "amdsmi",
        lambda f: f.counter_backwards(0, by_ticks=round(BACKWARDS_J * 1e6 / f.counter_resolution_uJ)),
        "counter_backwards",
        "backwards",
        1,
    ),
}


def _make(vendor: str, clock: ManualClock):
    if vendor == "nvml":
        fake = fp.FakePyNVML(num_gpus=1, time_fn=clock.now_s)
        return fake, NVMLBackend(nvml_module=fake, clock=clock, read_only=True)
    fake = fa.FakeAMDSMI(num_gpus=1, time_fn=clock.now_s)
    return fake, AMDSMIBackend(amdsmi_module=fake, clock=clock, read_only=True)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.mark.parametrize("name", list(FAULTS))
def test_sensor_fault_mid_run_degrades_and_warns_once(tmp_path, caplog, name, record_fault):
    fault = FAULTS[name]
    clock = ManualClock(T0)
    fake, backend = _make(fault.vendor, clock)
    fake.set_load(LOAD_W)
    session = EnergySession(
        {
            "backend": fault.vendor,
            "windows": {"sample_fraction": 1.0},  # every step's report is checked
            "logging": {"log_dir": str(tmp_path), "run_name": "run", "interval_steps": INTERVAL_STEPS},
        },
        backend=backend,
        is_main_process=True,
    )
    caplog.set_level(logging.WARNING, logger="zeus_callbacks")
    session.train_start()
    session.epoch_start(0)
    try:
        for step in range(STEPS):
            if step == FAULT_FROM:
                caplog.clear()
                fault.inject(fake)
            if step == FAULT_UNTIL:
                fake.clear_faults()
            session.step_start(step)
            clock.advance(STEP_S)
            session.sampler.poll_once()  # what the sampler thread does, in step with the manual clock
            session.step_end(step, num_samples=8)
        session.epoch_end(0)
    finally:
        summary = session.train_end()
        backend.close()
    records = read_jsonl(summary.jsonl_path)
    end = records[-1]
    after_fault = [r for r in records if r["event"] == "steps" and r["last_step"] >= FAULT_FROM + INTERVAL_STEPS]
    warnings = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("zeus_callbacks")
    ]
    about_kind = [m for m in warnings if fault.pattern in m]
    checks = {
        "the run completed": summary.status == "completed" and summary.steps == STEPS,
        "energy still measured": summary.energy_J > 0,
        "summary degraded": summary.degraded and summary.faults.get(fault.kind, 0) >= fault.min_reads,
        "JSONL run_end degraded": end["event"] == "run_end"
        and end["degraded"] is True
        and end["faults"].get(fault.kind, 0) >= fault.min_reads,
        "JSONL steps after the fault degraded": bool(after_fault) and all(r["degraded"] for r in after_fault),
        "one warning for the kind": len(about_kind) == 1,
        # At most: a source fallback or two, the fault, the counter taking over a failed power stream.
        "warnings do not grow with steps": len(warnings) <= 4,
    }
    record_fault(f"sensor fault: {fault.vendor}", all(checks.values()))
    assert all(checks.values()), {
        "failed": [k for k, ok in checks.items() if not ok],
        "faults": summary.faults,
        "warnings": warnings,
    }
