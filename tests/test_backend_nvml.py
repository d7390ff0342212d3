"""NVMLBackend against a faithful fake of pynvml (an H200), plus the backend contract."""

from __future__ import annotations

import logging
import math
import threading
import time

import pytest

from zeus_callbacks.backends._nvml import NVMLBackend
from zeus_callbacks.backends.base import (
    BackendUnavailable,
    ManualClock,
    NotSupported,
    PermissionDenied,
    ReadOnlyError,
    SensorError,
    WallClock,
)

try:
    from tests.backend_contract import BackendContract, VendorBackendTests, backend_factory
    from tests.fakes import fake_pynvml as fp
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from backend_contract import BackendContract, VendorBackendTests, backend_factory
    from fakes import fake_pynvml as fp

T0 = 1_800_000_000.0  # a realtime instant on the 100 ms sensor grid


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("ZEUS_CALLBACKS_READ_ONLY", raising=False)


@pytest.fixture
def clock():
    return ManualClock(T0)


@pytest.fixture
def fake(clock):
    return fp.FakePyNVML(num_gpus=2, time_fn=clock.now_s)


@pytest.fixture
def backend(fake, clock):
    b = NVMLBackend(nvml_module=fake, clock=clock, read_only=False)
    yield b
    b.close()


def _factory(fake, clock):
    return backend_factory(lambda read_only: NVMLBackend(nvml_module=fake, clock=clock, read_only=read_only))


# -- the contract, three ways ---------------------------------------------------------------
class TestNVMLContractVirtualTime(BackendContract):
    @pytest.fixture
    def make_backend(self, fake, clock):
        yield from _factory(fake, clock)


class TestNVMLContractRealTime(BackendContract):
    energy_interval_s = 0.25

    @pytest.fixture
    def make_backend(self):
        yield from _factory(fp.FakePyNVML(num_gpus=1), WallClock())


class TestNVMLContractFieldFallback(BackendContract):
    @pytest.fixture
    def make_backend(self, fake, clock):
        fake.make_unsupported("nvmlDeviceGetSamples")
        yield from _factory(fake, clock)


# -- what NVML shares with amdsmi (tests/backend_contract.py) -----------------------------------
class TestNVMLVendor(VendorBackendTests):
    backend_cls = NVMLBackend
    module_kwarg = "nvml_module"
    fake_cls = fp.FakePyNVML
    vendor_module = "pynvml"
    unavailable_prefix = "NVIDIA backend unavailable"
    shutdown_func = "nvmlShutdown"
    setter_func = "nvmlDeviceSetPowerManagementLimit"
    no_permission_error = fp.NVMLError_NoPermission
    limit_attr = "limit_mW"
    limit_units_per_W = 1000.0
    limits_W = (200.0, 700.0)
    set_W = 250.5


def _real_nvml_usable() -> bool:
    try:
        NVMLBackend(read_only=True).close()
    except BackendUnavailable:
        return False
    return True


@pytest.mark.skipif(not _real_nvml_usable(), reason="no NVIDIA GPU/driver here")
class TestNVMLContractRealGPU(BackendContract):
    """Runs only on a machine with a GPU; strictly read-only (shared GPUs)."""

    may_change_power_limit = False
    energy_interval_s = 0.3

    @pytest.fixture
    def make_backend(self):
        yield from backend_factory(lambda read_only: NVMLBackend(read_only=True if read_only is False else read_only))

    def test_matches_h200_probe(self, backend):
        if "H200" not in backend.device_name(0):
            pytest.skip("not an H200")
        assert backend.power_limit_constraints_W(0) == (200.0, 700.0)
        assert backend.power_source(0) == "samples"


# -- units against the fake's known truth -------------------------------------------------
def test_samples_convert_mW_to_W_and_us_to_s(backend, fake, clock):
    fake.set_load(500.0)
    clock.advance(1.0)
    samples = backend.power_samples_since(0, T0 + 0.1)
    assert len(samples) == 45  # (T0+0.1, T0+1.0] on a 20 ms grid
    assert all(s.power_W == 500.0 for s in samples)
    assert samples[0].timestamp_s == pytest.approx(T0 + 0.12, abs=1e-6)
    assert samples[-1].timestamp_s == pytest.approx(T0 + 1.0, abs=1e-6)


def test_samples_follow_a_varying_truth(backend, fake, clock):
    def truth(t):
        return 400.0 + 200.0 * math.sin(2 * math.pi * (t - T0) / 0.37)

    fake.set_power_function(truth, index=0)
    clock.advance(2.0)
    samples = backend.power_samples_since(0, T0)
    assert len(samples) == 100
    for s in samples:
        expected = fake.gpus[0].model.mean_power_W(s.timestamp_s - fp.H200_SAMPLE_WINDOW_S, s.timestamp_s)
        assert s.power_W == pytest.approx(expected, abs=1e-3)


def test_sample_buffer_keeps_about_2_4_s(backend, clock):
    clock.advance(10.0)
    samples = backend.power_samples_since(0, 0.0)
    assert 115 <= len(samples) <= 121
    assert samples[-1].timestamp_s - samples[0].timestamp_s == pytest.approx(2.38, abs=0.03)


def test_no_new_samples_is_empty_not_an_error(backend, fake, clock):
    clock.advance(0.1)
    last = backend.power_samples_since(0, T0)[-1].timestamp_s
    before = fake.calls["nvmlDeviceGetSamples"]
    assert backend.power_samples_since(0, last) == []  # NVML raised NVMLError_NotFound
    assert fake.calls["nvmlDeviceGetSamples"] == before + 1
    clock.advance(0.02)
    assert len(backend.power_samples_since(0, last)) == 1


def test_energy_counter_mJ_to_J(backend, fake, clock):
    e0 = backend.energy_counter_J(0)
    assert e0 == fp.H200_ENERGY_AT_START_mJ / 1000
    fake.set_load(500.0)
    clock.advance(1.0)
    e1 = backend.energy_counter_J(0)
    assert e1 - e0 == pytest.approx(fake.true_energy_J(T0, T0 + 1.0), abs=1e-3)
    assert e1 - e0 == pytest.approx(500.0, abs=1e-3)


def test_energy_counter_refreshes_every_100_ms(backend, fake, clock):
    fake.set_load(700.0)
    e0 = backend.energy_counter_J(0)
    clock.advance(0.05)
    assert backend.energy_counter_J(0) == e0
    clock.advance(0.06)
    assert backend.energy_counter_J(0) == pytest.approx(e0 + 70.0, abs=1e-3)


def test_sampling_never_touches_the_slow_energy_counter(clock):
    fake = fp.FakePyNVML(time_fn=clock.now_s, call_cost_s=fp.H200_CALL_COST_S)
    backend = NVMLBackend(nvml_module=fake, clock=clock)
    since, total = T0, 0
    for _ in range(50):
        clock.advance(0.02)
        batch = backend.power_samples_since(0, since)
        if batch:
            since, total = batch[-1].timestamp_s, total + len(batch)
        backend.power_limit_W(0)
    assert total >= 49  # ManualClock's float drift may hold the last one back
    # Counted, not timed: sampling made none of the calls that cost milliseconds on the H200.
    slow = [func for func, cost_s in fp.H200_CALL_COST_S.items() if cost_s >= 1e-3]
    assert slow == ["nvmlDeviceGetTotalEnergyConsumption"]
    assert [fake.calls[func] for func in slow] == [0]
    backend.energy_counter_J(0)
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1  # the counter read is that slow call
    backend.close()


# -- CUDA_VISIBLE_DEVICES ------------------------------------------------------------------------
@pytest.fixture
def fake4(clock):
    return fp.FakePyNVML(num_gpus=4, time_fn=clock.now_s)


def test_cuda_visible_devices_integers(monkeypatch, fake4, clock):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    backend = NVMLBackend(nvml_module=fake4, clock=clock)
    assert backend.device_count() == 2
    assert [backend.nvml_index(i) for i in range(2)] == [2, 0]
    assert backend.device_uuid(0) == fake4.gpus[2].uuid
    fake4.set_load(600.0, index=2)
    clock.advance(0.5)
    assert backend.power_samples_since(0, T0 + 0.1)[-1].power_W == 600.0
    assert backend.power_samples_since(1, T0 + 0.1)[-1].power_W == fp.H200_IDLE_W
    backend.set_power_limit_W(0, 300.0)
    assert [g.limit_mW for g in fake4.gpus] == [700_000, 700_000, 300_000, 700_000]
    with pytest.raises(IndexError):
        backend.device_name(2)


def test_cuda_visible_devices_uuid_prefix(monkeypatch, fake4, clock):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{fake4.gpus[3].uuid[:12]},{fake4.gpus[1].uuid}")
    backend = NVMLBackend(nvml_module=fake4, clock=clock)
    assert [backend.nvml_index(i) for i in range(2)] == [3, 1]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("1,7,2", [1]), ("1,1,2", [1]), (" 3 , 2 ", [3, 2]), ("0,GPU-ffff-nope,1", [0])],
)
def test_cuda_visible_devices_stops_at_invalid_entry(monkeypatch, fake4, clock, caplog, spec, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks.backends._nvml"):
        backend = NVMLBackend(nvml_module=fake4, clock=clock)
    assert [backend.nvml_index(i) for i in range(backend.device_count())] == expected
    assert ("names no" in caplog.text) == (len(expected) < len(spec.split(",")))


@pytest.mark.parametrize("spec", ["", "-1", "9", "GPU-"])
def test_cuda_visible_devices_hiding_everything_is_unavailable(monkeypatch, fake4, clock, spec):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    with pytest.raises(BackendUnavailable, match="NVIDIA backend unavailable.*no GPU visible"):
        NVMLBackend(nvml_module=fake4, clock=clock)
    assert not fake4.initialized


# -- MIG ----------------------------------------------------------------------------------
def test_mig_device_is_refused_by_name(fake, clock):
    fake.set_mig(1)
    with pytest.raises(BackendUnavailable, match="MIG") as info:
        NVMLBackend(nvml_module=fake, clock=clock)
    assert fake.gpus[1].uuid in str(info.value)
    assert "NVIDIA H200" in str(info.value)
    assert not fake.initialized  # NVML was shut down again


def test_mig_device_hidden_by_cuda_visible_devices_is_fine(monkeypatch, fake, clock):
    fake.set_mig(1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert NVMLBackend(nvml_module=fake, clock=clock).device_count() == 1


def test_mig_uuid_in_cuda_visible_devices_is_refused(monkeypatch, fake, clock):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-4f2d1c3a-0000-1111-2222-333344445555")
    with pytest.raises(BackendUnavailable, match="MIG-4f2d1c3a"):
        NVMLBackend(nvml_module=fake, clock=clock)


def test_gpu_without_mig_support_is_fine(fake, clock):
    for gpu in fake.gpus:
        gpu.mig_capable = False
    assert NVMLBackend(nvml_module=fake, clock=clock).device_count() == 2


# -- fallbacks -------------------------------------------------------------------------------
def test_fallback_to_field_186_warns_once(backend, fake, clock, caplog):
    fake.make_unsupported("nvmlDeviceGetSamples", index=0)
    fake.set_load(450.0)
    got = []
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks.backends._nvml"):
        for _ in range(30):
            clock.advance(0.02)
            got += backend.power_samples_since(0, T0)
    assert backend.power_source(0) == "field"
    assert backend.power_source(1) == "samples"  # per device
    assert len(got) == 6  # one per 100 ms field refresh in 0.6 s
    assert all(s.power_W == 450.0 for s in got)
    assert all(round(s.timestamp_s * 1e6) % 100_000 == 0 for s in got)  # the field's own timestamps
    assert fake.calls["nvmlDeviceGetSamples"] == 1  # never retried
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "'field'" in warnings[0].getMessage()


def test_fallback_to_power_usage_when_field_unsupported_too(backend, fake, clock, caplog):
    fake.make_unsupported("nvmlDeviceGetSamples")
    fake.make_field_unsupported(fp.NVML_FI_DEV_POWER_INSTANT)
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks.backends._nvml"):
        for _ in range(5):
            clock.advance(0.2)
            samples = backend.power_samples_since(0, T0)
            assert len(samples) == 1
            assert samples[0].timestamp_s == clock.now_s()
            assert samples[0].power_W == pytest.approx(fp.H200_IDLE_W)
    assert backend.power_source(0) == "power_usage"
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2  # samples->field->usage


def test_no_power_source_at_all_is_a_sensor_error(backend, fake, clock):
    fake.make_unsupported("nvmlDeviceGetSamples")
    fake.make_field_unsupported(fp.NVML_FI_DEV_POWER_INSTANT)
    fake.make_unsupported("nvmlDeviceGetPowerUsage")
    with pytest.raises(SensorError) as info:
        backend.power_samples_since(0, T0)
    assert info.value.kind == "not_supported"
    assert isinstance(info.value.__cause__, fp.NVMLError_NotSupported)


# -- error translation -------------------------------------------------------------------------
SENSOR_CASES = [
    (fp.NVMLError_GpuIsLost, "gpu_lost"),
    (fp.NVMLError_Unknown, "unknown"),
    (fp.NVMLError_Timeout, "unknown"),
    (fp.NVMLError_ResetRequired, "gpu_lost"),
]


@pytest.mark.parametrize(("error", "kind"), SENSOR_CASES)
def test_energy_counter_errors_become_sensor_errors(backend, fake, error, kind):
    fake.fail_next("nvmlDeviceGetTotalEnergyConsumption", error)
    with pytest.raises(SensorError) as info:
        backend.energy_counter_J(0)
    assert info.value.kind == kind
    assert isinstance(info.value.__cause__, error)
    backend.energy_counter_J(0)  # a one-shot fault: the next read works


@pytest.mark.parametrize(("error", "kind"), SENSOR_CASES)
def test_sample_errors_become_sensor_errors(backend, fake, clock, error, kind):
    fake.fail_next("nvmlDeviceGetSamples", error, count=2)
    clock.advance(0.1)
    for _ in range(2):
        with pytest.raises(SensorError) as info:
            backend.power_samples_since(0, T0)
        assert info.value.kind == kind
        assert isinstance(info.value.__cause__, fp.NVMLError)
    assert backend.power_source(0) == "samples"  # a fault is not a reason to fall back
    assert len(backend.power_samples_since(0, T0)) == 5


def test_energy_counter_not_supported(backend, fake):
    fake.make_unsupported("nvmlDeviceGetTotalEnergyConsumption")
    with pytest.raises(NotSupported) as info:
        backend.energy_counter_J(0)
    assert isinstance(info.value.__cause__, fp.NVMLError_NotSupported)


@pytest.mark.parametrize(
    ("func", "call"),
    [
        ("nvmlDeviceGetPowerManagementLimit", lambda b: b.power_limit_W(0)),
        ("nvmlDeviceGetPowerManagementLimitConstraints", lambda b: b.power_limit_constraints_W(0)),
        ("nvmlDeviceSetPowerManagementLimit", lambda b: b._set_power_limit_W(0, 300.0)),
    ],
)
@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (fp.NVMLError_NotSupported, NotSupported),
        (fp.NVMLError_NoPermission, PermissionDenied),
        (fp.NVMLError_GpuIsLost, SensorError),
        (fp.NVMLError_Unknown, SensorError),
    ],
)
def test_power_limit_errors_are_translated(backend, fake, func, call, error, expected):
    fake.fail_next(func, error)
    with pytest.raises(expected) as info:
        call(backend)
    assert not isinstance(info.value, ReadOnlyError)
    assert isinstance(info.value.__cause__, error)


def test_counter_going_backwards(backend, fake, clock, caplog):
    backend.energy_counter_J(0)
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks.backends._nvml"):
        for _ in range(2):
            fake.counter_backwards(0, by_mJ=5_000)
            with pytest.raises(SensorError) as info:
                backend.energy_counter_J(0)
            assert info.value.kind == "counter_backwards"
            clock.advance(0.1)
            backend.energy_counter_J(0)  # counts on from the new value
    # The backend raises; the sampler warns once per kind (tests/test_sampler.py), so no warning here.
    assert [r for r in caplog.records if "backwards" in r.getMessage()] == []


# -- availability and lifecycle ------------------------------------------------------------------
@pytest.mark.parametrize("error", [fp.NVMLError_DriverNotLoaded, fp.NVMLError_LibraryNotFound])
def test_nvml_init_failure_is_unavailable(fake, clock, error):
    fake.fail_next("nvmlInit", error)
    with pytest.raises(BackendUnavailable, match="NVIDIA backend unavailable: nvmlInit failed") as info:
        NVMLBackend(nvml_module=fake, clock=clock)
    assert isinstance(info.value.__cause__, error)


def test_real_pynvml_without_gpu_is_unavailable():
    pytest.importorskip("pynvml")
    if _real_nvml_usable():
        pytest.skip("a real NVIDIA GPU is present")
    with pytest.raises(BackendUnavailable, match="NVIDIA backend unavailable"):
        NVMLBackend()


def test_sampler_and_training_threads_interleave():
    fake = fp.FakePyNVML(num_gpus=1, call_cost_s={"nvmlDeviceGetTotalEnergyConsumption": 0.001})
    backend = NVMLBackend(nvml_module=fake, read_only=False)
    errors: list[BaseException] = []
    stop = threading.Event()

    def sampler():
        since = time.time() - 1.0
        try:
            while not stop.is_set():
                batch = backend.power_samples_since(0, since)
                if batch:
                    since = batch[-1].timestamp_s
                backend.energy_counter_J(0)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=sampler)
    thread.start()
    try:
        for k in range(200):
            backend.set_power_limit_W(0, 300.0 + k % 2)
            backend.power_limit_W(0)
    finally:
        stop.set()
        thread.join()
    assert not errors
    backend.close()


# -- the fake mirrors the real pynvml ----------------------------------------------------------
def test_fake_mirrors_real_pynvml_names_and_values():
    pynvml = pytest.importorskip("pynvml")
    for name in dir(fp):
        if name.startswith("NVML_") and hasattr(pynvml, name):
            assert getattr(pynvml, name) == getattr(fp, name), name
        if name.startswith("NVMLError_"):
            assert hasattr(pynvml, name), name
            assert pynvml.NVMLError(getattr(fp, name)._code).__class__.__name__ == name
    for name in ("NVML_TOTAL_POWER_SAMPLES", "NVML_FI_DEV_POWER_INSTANT", "NVML_ERROR_NOT_FOUND"):
        assert getattr(pynvml, name) == getattr(fp, name)
    assert type(fp.NVMLError(fp.NVML_ERROR_GPU_IS_LOST)) is fp.NVMLError_GpuIsLost
    assert fp.NVMLError_NotFound().value == fp.NVML_ERROR_NOT_FOUND
