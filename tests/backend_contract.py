"""A contract test suite that every :class:`GPUBackend` must pass.

Apply it to a backend by subclassing :class:`BackendContract` in a ``test_*.py`` file
and overriding the ``make_backend`` fixture::

    class TestVirtualContract(BackendContract):
        @pytest.fixture
        def make_backend(self):
            gpu = VirtualGPU(...)                      # shared state, so a read-only
            made = []                                  # backend sees the same limits
            def make(read_only=False):
                backend = VirtualBackend(gpu, clock=clock, read_only=read_only)
                made.append(backend)
                return backend
            yield make
            for backend in made:
                backend.close()

``make(read_only=...)`` must accept ``True``, ``False`` and ``None`` (None: from
``ZEUS_CALLBACKS_READ_ONLY``), and every backend it returns must see the same devices.
Time moves with :meth:`BackendContract.advance`: a
:class:`~zeus_callbacks.backends.base.ManualClock` is advanced, any other clock is
slept on; override it when a backend needs more (e.g. stepping a simulator).

Class attributes tune the plausibility checks, and ``may_change_power_limit = False``
skips every test that needs a writable backend (real, shared GPUs).

:func:`backend_factory` is the body of such a ``make_backend`` fixture, and
:class:`VendorBackendTests` holds the tests the NVML and amdsmi backends share.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from itertools import pairwise

import pytest

from zeus_callbacks.backends.base import (
    READ_ONLY_ENV,
    BackendError,
    BackendUnavailable,
    GPUBackend,
    ManualClock,
    PermissionDenied,
    PowerSample,
    ReadOnlyError,
)


class BackendContract:
    """Mixin of contract tests; subclasses provide the ``make_backend`` fixture."""

    #: Plausible range of one power reading (W).
    min_power_W: float = 1.0
    max_power_W: float = 3000.0
    #: Time the energy test lets pass (s); ≥ 2 refreshes of the slowest counter.
    energy_interval_s: float = 0.5
    #: Set False for real, shared GPUs: no writable backend is ever made.
    may_change_power_limit: bool = True

    # -- hooks -----------------------------------------------------------------------
    @pytest.fixture
    def make_backend(self):
        raise NotImplementedError("override the make_backend fixture in the subclass")

    @pytest.fixture
    def backend(self, make_backend) -> GPUBackend:
        return make_backend(read_only=not self.may_change_power_limit)

    def advance(self, backend: GPUBackend, dt_s: float) -> None:
        """Let ``dt_s`` seconds pass on ``backend``'s clock."""
        if isinstance(backend.clock, ManualClock):
            backend.clock.advance(dt_s)
        else:
            time.sleep(dt_s)

    def _writable(self, make_backend) -> GPUBackend:
        if not self.may_change_power_limit:
            pytest.skip("this backend's GPUs must not be changed (may_change_power_limit=False)")
        return make_backend(read_only=False)

    # -- identity --------------------------------------------------------------------
    def test_has_devices(self, backend):
        assert isinstance(backend.device_count(), int)
        assert backend.device_count() >= 1

    def test_names(self, backend):
        assert isinstance(backend.name, str) and backend.name
        for i in range(backend.device_count()):
            name = backend.device_name(i)
            assert isinstance(name, str) and name.strip()
        assert backend.name in backend.describe()

    def test_sample_period_positive(self, backend):
        assert 0 < backend.sample_period_s <= 1.0

    # -- samples -----------------------------------------------------------------------
    def _drain(self, backend: GPUBackend, index: int, since_s: float, polls: int, gap_s: float):
        out: list[PowerSample] = []
        for _ in range(polls):
            self.advance(backend, gap_s)
            batch = backend.power_samples_since(index, since_s)
            assert isinstance(batch, list)
            for sample in batch:
                assert isinstance(sample, PowerSample)
                assert sample.timestamp_s > since_s, "a sample is not newer than since_s"
            stamps = [s.timestamp_s for s in batch]
            assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps), "samples not strictly increasing"
            if batch:
                since_s = batch[-1].timestamp_s
            out.extend(batch)
        return out

    def test_samples_newer_monotonic_and_plausible(self, backend):
        for i in range(backend.device_count()):
            start_s = backend.clock.now_s()
            backend.power_samples_since(i, start_s)  # primes pollers
            samples = self._drain(backend, i, start_s, polls=8, gap_s=0.06)
            assert samples, "no power sample in ~0.5 s"
            stamps = [s.timestamp_s for s in samples]
            assert all(b > a for a, b in pairwise(stamps))
            assert stamps[-1] <= backend.clock.now_s() + 1e-3, "a sample is from the future"
            for s in samples:
                assert self.min_power_W <= s.power_W <= self.max_power_W, s

    def test_samples_since_the_future_is_empty(self, backend):
        backend.power_samples_since(0, backend.clock.now_s())
        self.advance(backend, 0.05)
        assert backend.power_samples_since(0, backend.clock.now_s() + 3600.0) == []

    # -- energy ------------------------------------------------------------------------
    def test_energy_counter_increases_plausibly(self, backend):
        for i in range(backend.device_count()):
            e0 = backend.energy_counter_J(i)
            t0 = backend.clock.now_s()
            self.advance(backend, self.energy_interval_s)
            e1 = backend.energy_counter_J(i)
            dt = backend.clock.now_s() - t0
            assert isinstance(e0, float) and isinstance(e1, float)
            assert e1 > e0, "energy counter did not increase"
            mean_W = (e1 - e0) / dt
            assert 0.5 * self.min_power_W <= mean_W <= 1.5 * self.max_power_W, mean_W

    # -- power limits ------------------------------------------------------------------
    def test_constraints_ordered_and_limit_inside(self, backend):
        for i in range(backend.device_count()):
            low, high = backend.power_limit_constraints_W(i)
            assert 0 < low <= high <= 10 * self.max_power_W
            assert low <= backend.power_limit_W(i) <= high

    def test_read_only_setter_refuses_and_changes_nothing(self, make_backend):
        backend = make_backend(read_only=True)
        assert backend.read_only
        for i in range(backend.device_count()):
            before = backend.power_limit_W(i)
            low, _ = backend.power_limit_constraints_W(i)
            with pytest.raises(ReadOnlyError):
                backend.set_power_limit_W(i, low)
            assert backend.power_limit_W(i) == before

    def test_read_only_from_environment(self, make_backend, monkeypatch):
        monkeypatch.setenv(READ_ONLY_ENV, "1")
        backend = make_backend(read_only=None)
        assert backend.read_only
        before = backend.power_limit_W(0)
        with pytest.raises(ReadOnlyError):
            backend.set_power_limit_W(0, backend.power_limit_constraints_W(0)[0])
        assert backend.power_limit_W(0) == before

    def test_out_of_range_limit_is_refused(self, make_backend):
        backend = self._writable(make_backend)
        for i in range(backend.device_count()):
            before = backend.power_limit_W(i)
            low, high = backend.power_limit_constraints_W(i)
            for bad in (low - 1.0, high + 1.0):
                with pytest.raises(ValueError):
                    backend.set_power_limit_W(i, bad)
            assert backend.power_limit_W(i) == before

    def test_set_get_round_trip(self, make_backend):
        backend = self._writable(make_backend)
        for i in range(backend.device_count()):
            original = backend.power_limit_W(i)
            low, high = backend.power_limit_constraints_W(i)
            target = low if abs(original - low) > 1.0 else high
            try:
                backend.set_power_limit_W(i, target)
                assert backend.power_limit_W(i) == pytest.approx(target, abs=0.5)
                other = make_backend(read_only=True)
                assert other.power_limit_W(i) == pytest.approx(target, abs=0.5)
            finally:
                backend.set_power_limit_W(i, original)
            assert backend.power_limit_W(i) == pytest.approx(original, abs=0.5)

    # -- lifecycle ---------------------------------------------------------------------
    def test_close_is_idempotent(self, make_backend):
        backend = make_backend(read_only=True)
        backend.close()
        backend.close()


def backend_factory(construct: Callable[[bool | None], GPUBackend]) -> Iterator[Callable[..., GPUBackend]]:
    """Body of a ``make_backend`` fixture: yield ``make(read_only=False)``, then close all made.

    Use as ``yield from backend_factory(lambda read_only: MyBackend(..., read_only=read_only))``.
    """
    made: list[GPUBackend] = []

    def make(read_only: bool | None = False) -> GPUBackend:
        backend = construct(read_only)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


class VendorBackendTests:
    """Tests that the NVML and amdsmi backends share, run against their fake library.

    The test module provides the ``fake`` (two GPUs), ``clock`` and ``backend``
    (writable, on ``fake``) fixtures; the subclass sets the attributes below.
    """

    backend_cls: type[GPUBackend]
    #: The backend's keyword for the injected module (``"nvml_module"``).
    module_kwarg: str
    #: The fake module's class; ``fake_cls(num_gpus=..., time_fn=...)``.
    fake_cls: type
    #: The real module's import name and the start of ``BackendUnavailable`` messages.
    vendor_module: str
    unavailable_prefix: str
    shutdown_func: str
    setter_func: str
    #: The exception class a denied setter raises in the fake (the ``__cause__``).
    no_permission_error: type[BaseException]
    #: The fake GPU's attribute holding the limit, and its unit per watt.
    limit_attr: str
    limit_units_per_W: float
    #: ``(min, max)`` limit of the fake GPU (W), the default is the max; a settable value (W).
    limits_W: tuple[float, float]
    set_W: float

    def construct(self, fake, clock, **kwargs) -> GPUBackend:
        return self.backend_cls(**{self.module_kwarg: fake}, clock=clock, **kwargs)

    def test_power_limits_in_watts(self, backend, fake):
        low, high = self.limits_W
        assert backend.power_limit_constraints_W(1) == (low, high)
        assert backend.power_limit_W(1) == high
        backend.set_power_limit_W(1, self.set_W)
        assert getattr(fake.gpus[1], self.limit_attr) == round(self.set_W * self.limit_units_per_W)
        assert getattr(fake.gpus[0], self.limit_attr) == round(high * self.limit_units_per_W)
        assert backend.power_limit_W(1) == self.set_W

    def test_permission_denied_on_set(self, backend, fake):
        fake.deny_permission()
        with pytest.raises(PermissionDenied) as info:
            backend.set_power_limit_W(0, 300.0)
        assert not isinstance(info.value, ReadOnlyError)
        assert isinstance(info.value.__cause__, self.no_permission_error)
        assert getattr(fake.gpus[0], self.limit_attr) == round(self.limits_W[1] * self.limit_units_per_W)

    def test_read_only_never_calls_the_setter(self, fake, clock):
        backend = self.construct(fake, clock, read_only=True)
        with pytest.raises(ReadOnlyError):
            backend.set_power_limit_W(0, 300.0)
        assert fake.calls[self.setter_func] == 0

    def test_missing_module_is_unavailable(self, monkeypatch):
        monkeypatch.setitem(sys.modules, self.vendor_module, None)
        with pytest.raises(BackendUnavailable, match=self.unavailable_prefix) as info:
            self.backend_cls()
        assert isinstance(info.value.__cause__, ImportError)

    def test_no_gpu_is_unavailable(self, clock):
        fake = self.fake_cls(num_gpus=0, time_fn=clock.now_s)
        with pytest.raises(BackendUnavailable, match="no GPU"):
            self.construct(fake, clock)
        assert not fake.initialized

    def test_close_shuts_down_once(self, fake, clock):
        backend = self.construct(fake, clock)
        backend.close()
        backend.close()
        assert fake.calls[self.shutdown_func] == 1
        assert not fake.initialized
        with pytest.raises(BackendError):
            backend.energy_counter_J(0)
        with pytest.raises(BackendError):
            backend.power_limit_W(0)
