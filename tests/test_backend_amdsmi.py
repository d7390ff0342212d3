"""AMDSMIBackend against a fake amdsmi, plus the backend contract."""

from __future__ import annotations

import builtins
import logging
import sys

import pytest

from zeus_callbacks.backends._amdsmi import MIN_POLL_INTERVAL_S, AMDSMIBackend
from zeus_callbacks.backends.base import (
    BackendUnavailable,
    ManualClock,
    NotSupported,
    PermissionDenied,
    SensorError,
    WallClock,
)

try:
    from tests.backend_contract import BackendContract, VendorBackendTests, backend_factory
    from tests.fakes import fake_amdsmi as fa
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from backend_contract import BackendContract, VendorBackendTests, backend_factory
    from fakes import fake_amdsmi as fa

T0 = 1_800_000_000.0
LOGGER = "zeus_callbacks.backends._amdsmi"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for env in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZEUS_CALLBACKS_READ_ONLY"):
        monkeypatch.delenv(env, raising=False)


@pytest.fixture
def clock():
    return ManualClock(T0)


@pytest.fixture(params=["energy_accumulator", "power"])
def fake(request, clock):
    return fa.FakeAMDSMI(num_gpus=2, time_fn=clock.now_s, energy_key=request.param)


@pytest.fixture
def backend(fake, clock):
    b = AMDSMIBackend(amdsmi_module=fake, clock=clock, read_only=False)
    yield b
    b.close()


def _factory(fake, clock):
    return backend_factory(lambda read_only: AMDSMIBackend(amdsmi_module=fake, clock=clock, read_only=read_only))


class TestAMDSMIContractVirtualTime(BackendContract):
    @pytest.fixture
    def make_backend(self, fake, clock):
        yield from _factory(fake, clock)


class TestAMDSMIContractRealTime(BackendContract):
    energy_interval_s = 0.1

    @pytest.fixture
    def make_backend(self):
        yield from _factory(fa.FakeAMDSMI(num_gpus=1), WallClock())


# -- what amdsmi shares with NVML (tests/backend_contract.py) -----------------------------------
class TestAMDSMIVendor(VendorBackendTests):
    backend_cls = AMDSMIBackend
    module_kwarg = "amdsmi_module"
    fake_cls = fa.FakeAMDSMI
    vendor_module = "amdsmi"
    unavailable_prefix = "AMD backend unavailable"
    shutdown_func = "amdsmi_shut_down"
    setter_func = "amdsmi_set_power_cap"
    no_permission_error = fa.AmdSmiLibraryException
    limit_attr = "power_cap_uW"
    limit_units_per_W = 1_000_000.0
    limits_W = (200.0, 750.0)
    set_W = 412.5


# -- units ------------------------------------------------------------------------------------
def test_energy_ticks_times_resolution_in_joules(backend, fake, clock):
    e0 = backend.energy_counter_J(0)
    assert e0 == pytest.approx(fake.gpus[0].tick_offset * 15.3e-6)
    fake.set_load(600.0)
    clock.advance(2.0)
    assert backend.energy_counter_J(0) - e0 == pytest.approx(1200.0, abs=20e-6)


@pytest.mark.parametrize("resolution_uJ", [1.0, 15.3, 15.625])
def test_resolution_scaling(clock, resolution_uJ):
    fake = fa.FakeAMDSMI(time_fn=clock.now_s, counter_resolution_uJ=resolution_uJ, energy_key="power")
    backend = AMDSMIBackend(amdsmi_module=fake, clock=clock)
    e0 = backend.energy_counter_J(0)
    clock.advance(1.0)
    assert backend.energy_counter_J(0) - e0 == pytest.approx(fa.DEFAULT_IDLE_W, abs=resolution_uJ * 1e-6)


def test_unknown_energy_key_is_a_sensor_error(backend, fake, monkeypatch):
    monkeypatch.setattr(fake, "amdsmi_get_energy_count", lambda h: {"joules": 1, "counter_resolution": 1.0})
    with pytest.raises(SensorError, match="energy_accumulator"):
        backend.energy_counter_J(0)


def test_power_is_energy_over_time_between_polls(backend, fake, clock):
    assert backend.power_samples_since(0, 0.0) == []  # primes
    fake.set_load(500.0)
    clock.advance(0.02)
    (sample,) = backend.power_samples_since(0, 0.0)
    assert sample.timestamp_s == clock.now_s()
    assert sample.power_W == pytest.approx(500.0, rel=2e-3)
    clock.advance(MIN_POLL_INTERVAL_S / 2)
    assert backend.power_samples_since(0, 0.0) == []  # too soon: the poll is kept
    clock.advance(MIN_POLL_INTERVAL_S)
    (sample,) = backend.power_samples_since(0, 0.0)
    assert sample.power_W == pytest.approx(500.0, rel=2e-3)
    assert backend.power_samples_since(0, clock.now_s() + 1.0) == []


# -- validation against socket power -------------------------------------------------------------
def test_counter_checked_against_socket_power_once(backend, fake, clock, caplog):
    fake.set_power_info_scale(2.0)  # socket power reads double the truth
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(10):
            clock.advance(0.02)
            backend.power_samples_since(0, 0.0)
    assert fake.calls["amdsmi_get_power_info"] == 1
    mismatches = [r for r in caplog.records if "socket power" in r.getMessage()]
    assert len(mismatches) == 1


def test_agreeing_socket_power_is_silent(backend, fake, clock, caplog):
    fake.set_power_info_scale(1.2)  # within 25 %
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(3):
            clock.advance(0.02)
            backend.power_samples_since(0, 0.0)
    assert not caplog.records


def test_socket_power_not_available_is_tolerated(backend, fake, clock):
    for gpu in fake.gpus:
        gpu.power_info_fields = {"average_socket_power": False, "current_socket_power": False}
    backend.power_samples_since(0, 0.0)
    clock.advance(0.02)
    assert len(backend.power_samples_since(0, 0.0)) == 1


# -- visible devices ------------------------------------------------------------------------------
@pytest.fixture
def fake4(clock):
    return fa.FakeAMDSMI(num_gpus=4, time_fn=clock.now_s)


@pytest.mark.parametrize(
    ("rocr", "hip", "expected"),
    [
        (None, "2,0", [2, 0]),
        ("1,2,3", None, [1, 2, 3]),
        ("1,2,3", "2", [3]),  # HIP indexes the devices ROCr left visible
        (None, "1,9,2", [1]),  # the list ends at the first bad entry
        (None, "1,1", [1]),
    ],
)
def test_visible_devices(monkeypatch, fake4, clock, rocr, hip, expected):
    if rocr is not None:
        monkeypatch.setenv("ROCR_VISIBLE_DEVICES", rocr)
    if hip is not None:
        monkeypatch.setenv("HIP_VISIBLE_DEVICES", hip)
    backend = AMDSMIBackend(amdsmi_module=fake4, clock=clock)
    assert [backend.amdsmi_index(i) for i in range(backend.device_count())] == expected


def test_visible_devices_route_to_the_right_gpu(monkeypatch, fake4, clock):
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "3")
    backend = AMDSMIBackend(amdsmi_module=fake4, clock=clock)
    backend.set_power_limit_W(0, 300.0)
    assert [g.power_cap_uW // 1_000_000 for g in fake4.gpus] == [750, 750, 750, 300]


@pytest.mark.parametrize("spec", ["", "-1", "7"])
def test_visible_devices_hiding_everything_is_unavailable(monkeypatch, fake4, clock, spec):
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", spec)
    with pytest.raises(BackendUnavailable, match="AMD backend unavailable.*no GPU visible"):
        AMDSMIBackend(amdsmi_module=fake4, clock=clock)
    assert not fake4.initialized


# -- errors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "expected", "kind"),
    [
        (fa.AmdSmiRetCode.ERR_NOT_SUPPORTED, NotSupported, None),
        (fa.AmdSmiRetCode.NOT_IMPLEMENTED, NotSupported, None),
        (fa.AmdSmiRetCode.ERR_NO_PERM, PermissionDenied, None),
        (fa.AmdSmiRetCode.ERR_IO, SensorError, "unknown"),
        (fa.AmdSmiRetCode.RETRY, SensorError, "unknown"),
    ],
)
def test_energy_counter_errors(backend, fake, code, expected, kind):
    fake.fail_next("amdsmi_get_energy_count", code)
    with pytest.raises(expected) as info:
        backend.energy_counter_J(0)
    assert isinstance(info.value.__cause__, fa.AmdSmiLibraryException)
    if kind:
        assert info.value.kind == kind
    backend.energy_counter_J(0)


def test_sample_stream_unsupported_is_a_sensor_error(backend, fake):
    fake.make_unsupported("amdsmi_get_energy_count")
    with pytest.raises(SensorError) as info:
        backend.power_samples_since(0, 0.0)
    assert info.value.kind == "not_supported"


@pytest.mark.parametrize("func", ["amdsmi_get_power_cap_info", "amdsmi_set_power_cap"])
def test_power_cap_errors(backend, fake, func):
    fake.fail_next(func, fa.AmdSmiRetCode.ERR_NOT_SUPPORTED)
    with pytest.raises(NotSupported):
        backend._set_power_limit_W(0, 300.0) if "set" in func else backend.power_limit_W(0)


def test_counter_going_backwards(backend, fake, clock, caplog):
    backend.power_samples_since(0, 0.0)
    backend.energy_counter_J(0)
    fake.counter_backwards(0)
    clock.advance(0.02)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        with pytest.raises(SensorError) as info:
            backend.power_samples_since(0, 0.0)
        assert info.value.kind == "counter_backwards"
        with pytest.raises(SensorError):
            backend.energy_counter_J(0)
    clock.advance(0.02)
    (sample,) = backend.power_samples_since(0, 0.0)  # re-primed on the new value
    assert sample.power_W == pytest.approx(fa.DEFAULT_IDLE_W, rel=0.01)
    # The backend raises; the sampler warns once per kind (tests/test_sampler.py), so no warning here.
    assert [r for r in caplog.records if "backwards" in r.getMessage()] == []


# -- availability and lifecycle -------------------------------------------------------------------
def test_missing_shared_library_is_unavailable(monkeypatch):
    real_import = builtins.__import__

    def failing_import(name, *args, **kwargs):
        if name == "amdsmi":
            raise OSError("libamd_smi.so: cannot open shared object file: No such file or directory")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    monkeypatch.setattr(builtins, "__import__", failing_import)
    with pytest.raises(BackendUnavailable, match="AMD backend unavailable.*libamd_smi.so") as info:
        AMDSMIBackend()
    assert isinstance(info.value.__cause__, OSError)


def test_init_failure_is_unavailable(fake, clock):
    fake.fail_next("amdsmi_init", fa.AmdSmiRetCode.DRM_ERROR)
    with pytest.raises(BackendUnavailable, match="AMD backend unavailable: amdsmi_init failed"):
        AMDSMIBackend(amdsmi_module=fake, clock=clock)


def test_names_from_asic_info(backend):
    assert backend.device_name(0) == fa.MI300X_NAME
    assert backend.describe() == f"amdsmi: 2 GPU(s) ({fa.MI300X_NAME})"


# -- a counter that stops inside a poll interval (issue 16 item 2) --------------------------------------------
def _poll_W(backend, clock, dt_s):
    clock.advance(dt_s)
    return [s.power_W for s in backend.power_samples_since(0, 0.0)]


def test_counter_stopping_mid_interval_is_doubted_then_counted_at_close(backend, fake, clock):
    fake.set_load(300.0)
    backend.power_samples_since(0, 0.0)
    assert _poll_W(backend, clock, 0.1) == [pytest.approx(300.0, rel=2e-3)]
    fake.stick_counter(0, at_s=clock.now_s() + 0.05)  # halfway through the next interval
    (half,) = _poll_W(backend, clock, 0.1)
    assert half == pytest.approx(150.0, rel=0.02)  # what the counter says: half the truth
    assert backend.readings_in_doubt(0, closing=False) is None  # a real drop or a stop: a later read tells
    assert backend.readings_in_doubt(0, closing=True) == "counter_stuck"  # a close cannot wait for it
    assert backend.readings_in_doubt(0, closing=True) is None  # reported once


def test_counter_stopping_mid_interval_is_counted_when_a_later_poll_sees_it_stopped(backend, fake, clock):
    fake.set_load(300.0)
    backend.power_samples_since(0, 0.0)
    _poll_W(backend, clock, 0.1)
    fake.stick_counter(0, at_s=clock.now_s() + 0.05)
    _poll_W(backend, clock, 0.1)
    assert _poll_W(backend, clock, 0.1) == [300.0]  # stopped: socket power from now on
    assert backend.readings_in_doubt(0, closing=False) == "counter_stuck"  # the half-counted interval


def test_a_close_soon_after_the_last_poll_settles_the_doubt(backend, fake, clock):
    fake.set_load(300.0)
    backend.power_samples_since(0, 0.0)
    _poll_W(backend, clock, 0.1)
    fake.stick_counter(0, at_s=clock.now_s() + 0.05)
    _poll_W(backend, clock, 0.1)
    # 6 ms later: too short for a power figure, long enough (> 5 refreshes) to see the counter has stopped
    assert _poll_W(backend, clock, 0.006) == [300.0]
    assert backend.readings_in_doubt(0, closing=False) == "counter_stuck"


def test_a_real_drop_in_power_is_not_doubted(backend, fake, clock):
    fake.set_load(700.0)
    backend.power_samples_since(0, 0.0)
    _poll_W(backend, clock, 0.1)
    clock.advance(0.05)
    fake.set_load(140.0)  # the load falls halfway through the interval: the counter's mean falls with it
    (mean,) = _poll_W(backend, clock, 0.05)
    assert mean == pytest.approx(420.0, rel=0.02)
    assert backend.readings_in_doubt(0, closing=True) is None  # socket power fell too: no doubt
    assert _poll_W(backend, clock, 0.1) == [pytest.approx(140.0, rel=2e-3)]


def test_counter_stopping_at_the_start_of_an_interval_is_caught_in_that_poll(backend, fake, clock):
    fake.set_load(121.0)
    backend.power_samples_since(0, 0.0)
    _poll_W(backend, clock, 0.1)
    fake.stick_counter(0, at_s=clock.now_s() + fake.refresh_s)  # one more refresh after the poll, then nothing
    assert _poll_W(backend, clock, 0.1) == [121.0]  # 1.2 W by the counter: impossible, so socket power
    assert backend.readings_in_doubt(0, closing=True) is None  # the interval is socket power's: known
