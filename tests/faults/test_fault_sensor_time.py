"""Bounded sensor time and physically impossible samples (issue 20 item 4).

A sensor call that never returns, or takes 5 s, must not hold the training thread: every hook
(epoch end, train end) waits for the sensor at most ``sampling.sensor_timeout_s`` plus the epoch
flush (``EPOCH_FLUSH_TIMEOUT_S``); the run says ``degraded`` with ``sensor_timeout`` (and
``slow_sensor_call`` once a slow call returns) in ``faults``, and SIGTERM still ends the process.
The hooks' waits are recorded (tests/faults/blocking.py), not timed: each has a timeout, and those that
ran out add up to no more than that bound, however long a loaded machine takes to run the hook.
A NaN, a negative, an absurdly high power or a sample stamped in the future is rejected, counted
in ``run_end``'s ``rejected_samples`` and marks the run degraded; at constant power the rejected
sample's neighbour covers its interval, so the run's energy equals a clean run's.
"""

from __future__ import annotations

import math
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fakes import fake_pynvml as fp
from tests.faults.blocking import BlockingWaits
from zeus_callbacks.backends._nvml import NVMLBackend
from zeus_callbacks.backends.base import GPUBackend, ManualClock, PowerSample
from zeus_callbacks.measurement._sampler import FALLBACK_MAX_POWER_W, MAX_POWER_FACTOR, PowerSampler
from zeus_callbacks.reporting import read_jsonl
from zeus_callbacks.session import EnergySession
from zeus_callbacks.session._run import EPOCH_FLUSH_TIMEOUT_S

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("sensor_hang_child.py")
T0 = 1_800_000_000.0  # on the fakes' 100 ms sensor grid
STEP_S = 0.1
LOAD_W = 300.0
SENSOR_TIMEOUT_S = 0.5
# The longest a hook may wait on a stuck sensor: the epoch flush, plus one sensor timeout for the poll
# in flight when the flush deadline passes (the sum of the timeouts of its waits that ran out).
HOOK_BOUND_S = EPOCH_FLUSH_TIMEOUT_S + SENSOR_TIMEOUT_S
HANG_GUARD_S = 60.0  # how long a test waits for a thread or a child to get somewhere: a hang guard only


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _session(tmp_path: Path, clock: ManualClock, run_name: str = "run", sensor_timeout_s: float = SENSOR_TIMEOUT_S):
    fake = fp.FakePyNVML(num_gpus=1, time_fn=clock.now_s)
    fake.set_load(LOAD_W)
    backend = NVMLBackend(nvml_module=fake, clock=clock, read_only=True)
    session = EnergySession(
        {
            "backend": "nvml",
            "sampling": {"sensor_timeout_s": sensor_timeout_s},
            "logging": {"log_dir": str(tmp_path), "run_name": run_name},
        },
        backend=backend,
        is_main_process=True,
    )
    return fake, backend, session


def _steps(session: EnergySession, clock: ManualClock, first: int, count: int, *, poll: bool) -> None:
    for step in range(first, first + count):
        session.step_start(step)
        clock.advance(STEP_S)
        if poll:
            session.sampler.poll_once()  # what the sampler thread does, in step with the manual clock
        session.step_end(step, num_samples=8)


def _waits(fn, *args):
    """``fn(*args)`` and the blocking waits it made on this thread."""
    with BlockingWaits() as waits:
        out = fn(*args)
    return out, waits


def _bounded(waits: BlockingWaits) -> bool:
    return not waits.unbounded and waits.waited_s <= HOOK_BOUND_S


def test_never_returning_sensor_call_does_not_block_hooks(tmp_path, record_fault):
    clock = ManualClock(T0)
    fake, backend, session = _session(tmp_path, clock)
    session.train_start()
    try:
        session.epoch_start(0)
        _steps(session, clock, 0, 10, poll=True)
        fake.hang("nvmlDeviceGetSamples")  # never returns until released
        assert fake.wait_hung(1, HANG_GUARD_S)  # the sampler thread's next poll is stuck in it
        _steps(session, clock, 10, 10, poll=False)
        _, epoch0 = _waits(session.epoch_end, 0)
        session.epoch_start(1)
        _steps(session, clock, 20, 5, poll=False)
        _, epoch1 = _waits(session.epoch_end, 1)
        summary, end = _waits(session.train_end)
    finally:
        fake.release()  # let the abandoned sampler thread go
        backend.close()
    run_end = read_jsonl(summary.jsonl_path)[-1]
    checks = {
        "epoch_end bounded": _bounded(epoch0),
        "a later epoch_end does not wait again": epoch1.waits == [],
        "train_end bounded": _bounded(end),
        "run completed": summary.status == "completed" and summary.steps == 25,
        "degraded, reason sensor_timeout": summary.degraded and summary.faults.get("sensor_timeout", 0) >= 1,
        "run_end says so": run_end["event"] == "run_end"
        and run_end["degraded"] is True
        and run_end["faults"].get("sensor_timeout", 0) >= 1,
    }
    record_fault("sensor time: hung call", all(checks.values()))
    assert all(checks.values()), (checks, epoch0.waits, epoch1.waits, end.waits, summary.faults)


def test_five_second_sensor_call_is_flagged_and_hooks_stay_short(tmp_path, record_fault):
    clock = ManualClock(T0)
    fake, backend, session = _session(tmp_path, clock)
    session.train_start()
    try:
        session.epoch_start(0)
        _steps(session, clock, 0, 10, poll=True)
        fake.hang("nvmlDeviceGetSamples", seconds=5.0)  # every call now takes 5 s of real time
        assert fake.wait_hung(1, HANG_GUARD_S)  # the sampler thread's next poll is in the first one
        _steps(session, clock, 10, 10, poll=False)
        _, epoch0 = _waits(session.epoch_end, 0)
        session.epoch_start(1)
        _steps(session, clock, 20, 10, poll=False)
        # A long epoch: the first 5 s call returns (counted slow) and the thread's next poll starts another.
        assert fake.wait_hung(2, HANG_GUARD_S)
        _, epoch1 = _waits(session.epoch_end, 1)
        summary, end = _waits(session.train_end)
    finally:
        fake.release()
        backend.close()
    checks = {
        "epoch_end bounded": _bounded(epoch0) and _bounded(epoch1),
        "train_end bounded": _bounded(end),
        "slow call counted": summary.faults.get("slow_sensor_call", 0) >= 1,
        "waits cut short counted": summary.faults.get("sensor_timeout", 0) >= 1,
        "degraded": summary.degraded,
    }
    record_fault("sensor time: 5 s call", all(checks.values()))
    assert all(checks.values()), (checks, epoch0.waits, epoch1.waits, end.waits, summary.faults)


def test_sigterm_ends_a_process_whose_sensor_hangs(tmp_path, record_fault):
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(tmp_path)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = ""
        deadline = time.monotonic() + HANG_GUARD_S  # interpreter start and imports on a loaded machine
        assert proc.stdout is not None
        while time.monotonic() < deadline and "EPOCH_END" not in line and proc.poll() is None:
            if select.select([proc.stdout], [], [], 0.1)[0]:
                line += proc.stdout.readline()
        reached = "EPOCH_END" in line
        # The child's epoch_end: the sum of the timeouts of its waits that ran out, and its waits without one.
        waited_s, unbounded = (float(x) for x in line.split("EPOCH_END", 1)[1].split()[:2]) if reached else (0, 0)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=HANG_GUARD_S)
            ended = True
        except subprocess.TimeoutExpired:
            ended = False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = proc.stderr.read() if proc.stderr is not None else ""
    records = read_jsonl(tmp_path / "child.jsonl") if (tmp_path / "child.jsonl").exists() else []
    end = records[-1] if records else {}
    checks = {
        "epoch_end returned while the sensor hung": reached and unbounded == 0 and waited_s <= HOOK_BOUND_S,
        "SIGTERM ended the process": ended and proc.returncode == -signal.SIGTERM,
        "run_end written, degraded": end.get("event") == "run_end"
        and end.get("degraded") is True
        and end.get("faults", {}).get("sensor_timeout", 0) >= 1,
    }
    record_fault("sensor time: SIGTERM while hung", all(checks.values()))
    assert all(checks.values()), (checks, line, proc.returncode, stderr[-2000:])


BAD_SAMPLES = {  # name: (corrupt_next_sample kwargs, rejection reason)
    "NaN": ({"power_W": math.nan}, "non_finite"),
    "-1e6 W": ({"power_W": -1e6}, "negative"),
    "1e9 W": ({"power_W": 1e9}, "above_max"),
    "a sample from the future": ({"shift_s": 60.0}, "future_timestamp"),
}


def _run_with(tmp_path: Path, name: str, corrupt: dict | None):
    clock = ManualClock(T0)
    # No hang here: a generous sensor timeout, so that a vendor call slowed by a loaded machine (past the
    # 0.5 s the hang tests use, on the wall clock) cannot mark the clean run degraded (issue 25).
    fake, backend, session = _session(tmp_path, clock, run_name=name, sensor_timeout_s=60.0)
    session.train_start()
    try:
        session.epoch_start(0)
        _steps(session, clock, 0, 30, poll=True)
        if corrupt is not None:
            fake.corrupt_next_sample(**corrupt)
        _steps(session, clock, 30, 30, poll=True)
        session.epoch_end(0)
    finally:
        summary = session.train_end()
        backend.close()
    return summary


@pytest.mark.parametrize("name", list(BAD_SAMPLES))
def test_impossible_sample_is_rejected_counted_and_flagged(tmp_path, name, record_fault):
    corrupt, reason = BAD_SAMPLES[name]
    clean = _run_with(tmp_path, "clean", None)
    bad = _run_with(tmp_path, "bad", corrupt)
    end = read_jsonl(bad.jsonl_path)[-1]
    checks = {
        "clean run not degraded": not clean.degraded and clean.rejected_samples == {},
        "rejected and counted by reason": bad.rejected_samples == {reason: 1},
        "run_end carries rejected_samples": end["event"] == "run_end" and end["rejected_samples"] == {reason: 1},
        "degraded": bad.degraded and end["degraded"] is True,
        # At constant power the next sample covers the rejected one's 20 ms: nothing is lost or invented.
        "energy as the clean run's": math.isclose(bad.energy_J, clean.energy_J, rel_tol=1e-9),
    }
    record_fault("bad samples", all(checks.values()))
    assert all(checks.values()), (checks, bad.energy_J, clean.energy_J, bad.rejected_samples)


class _ScriptedSensor(GPUBackend):
    """A GPU whose sample reads return what the test scripts (out-of-order stamps included)."""

    name = "scripted"

    def __init__(self, clock: ManualClock, max_limit_W: float | None) -> None:
        super().__init__(clock=clock, read_only=True)
        self.batches: list[list[PowerSample]] = []
        self.max_limit_W = max_limit_W

    def device_count(self) -> int:
        return 1

    def device_name(self, index: int) -> str:
        return "scripted"

    def power_samples_since(self, index: int, since_s: float) -> list[PowerSample]:
        return self.batches.pop(0) if self.batches else []

    def energy_counter_J(self, index: int) -> float:
        from zeus_callbacks.errors import NotSupported

        raise NotSupported("no counter")

    def power_limit_constraints_W(self, index: int) -> tuple[float, float]:
        if self.max_limit_W is None:
            from zeus_callbacks.errors import NotSupported

            raise NotSupported("no limits")
        return (100.0, self.max_limit_W)

    def power_limit_W(self, index: int) -> float:
        return self.max_limit_W or 0.0

    def _set_power_limit_W(self, index: int, limit_W: float) -> None:
        raise AssertionError("not used")


def test_timestamp_going_backwards_is_rejected(record_fault):
    clock = ManualClock(100.0)
    backend = _ScriptedSensor(clock, max_limit_W=700.0)
    sampler = PowerSampler(backend, [0])
    backend.batches = [
        [PowerSample(99.0, 300.0), PowerSample(99.02, 300.0)],
        [PowerSample(98.5, 300.0), PowerSample(99.02, 300.0), PowerSample(99.04, 300.0)],
    ]
    sampler.poll_once()
    sampler.poll_once()
    times, _ = sampler.samples(0)
    ok = list(times) == [99.0, 99.02, 99.04] and dict(sampler.health.rejected) == {"timestamp_backwards": 1}
    ok = ok and sampler.health.degraded  # a repeated stamp (99.02) is a duplicate, not a fault
    record_fault("bad samples", ok)
    assert ok, (times, sampler.health.rejected)


@pytest.mark.parametrize("max_limit_W", [700.0, None])
def test_power_bound_is_twice_the_max_limit_or_the_fallback(max_limit_W):
    clock = ManualClock(100.0)
    backend = _ScriptedSensor(clock, max_limit_W=max_limit_W)
    sampler = PowerSampler(backend, [0])
    bound = MAX_POWER_FACTOR * max_limit_W if max_limit_W is not None else FALLBACK_MAX_POWER_W
    backend.batches = [[PowerSample(99.0, bound), PowerSample(99.02, bound * 1.001)]]
    sampler.poll_once()
    times, power = sampler.samples(0)
    assert list(power) == [bound] and dict(sampler.health.rejected) == {"above_max": 1}
