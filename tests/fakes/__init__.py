"""Faithful fakes of the vendor GPU libraries (``pynvml``, ``amdsmi``) for tests.

Each fake is an object that quacks like the vendor module (same function names,
constants and exception classes) and is injected into a backend through its
``nvml_module=`` / ``amdsmi_module=`` argument, or into ``sys.modules``.

This package holds what both fakes share:

* :class:`PowerModel`: the *true* power of a fake GPU as a function of time, so a
  test knows exactly what a sensor should have reported;
* :class:`FaultPlan`: scripted faults ("the next 3 calls of X raise Y").

The per-vendor sensor behaviour (update periods, buffers, units, call costs) lives in
``fake_pynvml.py`` and ``fake_amdsmi.py``; the numbers come from the H200 probes in
``shared/h200/``.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from collections.abc import Callable
from itertools import pairwise

US_PER_S = 1_000_000


def to_us(t_s: float) -> int:
    """Return ``t_s`` seconds as integer microseconds (rounded), the fakes' time grid."""
    return int(round(t_s * US_PER_S))


class PowerModel:
    """The true power draw of one fake GPU over time.

    By default the GPU idles at ``idle_W``. :meth:`set_load` switches to a constant
    power from now on (keeping history, so past sensor windows stay consistent);
    :meth:`set_power_function` replaces the whole history with ``fn(t_s) -> W``.
    Energy over piecewise-constant stretches is exact; over a function it uses the
    midpoint rule with ``step_s`` steps.
    """

    def __init__(self, idle_W: float = 121.0, time_fn: Callable[[], float] = time.time, step_s: float = 0.001) -> None:
        self.time_fn = time_fn
        self.step_s = step_s
        self._lock = threading.RLock()
        self._base: float | Callable[[float], float] = float(idle_W)
        self._step_starts: list[float] = []
        self._step_powers: list[float] = []

    def now_s(self) -> float:
        """Return the fake's current time (s)."""
        return self.time_fn()

    def set_load(self, power_W: float, at_s: float | None = None) -> None:
        """Draw ``power_W`` watts from ``at_s`` (default: now) on; earlier history is kept."""
        at_s = self.now_s() if at_s is None else at_s
        with self._lock:
            cut = bisect.bisect_left(self._step_starts, at_s)
            del self._step_starts[cut:]
            del self._step_powers[cut:]
            self._step_starts.append(at_s)
            self._step_powers.append(float(power_W))

    def set_power_function(self, fn: Callable[[float], float]) -> None:
        """Replace the whole power history with ``fn(t_s) -> W``."""
        with self._lock:
            self._base = fn
            self._step_starts.clear()
            self._step_powers.clear()

    def power_W(self, t_s: float) -> float:
        """Return the true power at time ``t_s`` (W)."""
        with self._lock:
            k = bisect.bisect_right(self._step_starts, t_s) - 1
            if k >= 0:
                return self._step_powers[k]
            return self._base(t_s) if callable(self._base) else self._base

    def energy_J(self, t0_s: float, t1_s: float) -> float:
        """Return the true energy drawn in ``[t0_s, t1_s]`` (J)."""
        if t1_s <= t0_s:
            return 0.0
        with self._lock:
            cuts = [t for t in self._step_starts if t0_s < t < t1_s]
            edges = [t0_s, *cuts, t1_s]
            total = 0.0
            for a, b in pairwise(edges):
                k = bisect.bisect_right(self._step_starts, a) - 1
                if k >= 0:
                    total += self._step_powers[k] * (b - a)
                elif not callable(self._base):
                    total += self._base * (b - a)
                else:
                    total += self._integrate_base(a, b)
            return total

    def mean_power_W(self, t0_s: float, t1_s: float) -> float:
        """Return the mean true power over ``[t0_s, t1_s]`` (W)."""
        if t1_s <= t0_s:
            return self.power_W(t1_s)
        return self.energy_J(t0_s, t1_s) / (t1_s - t0_s)

    def _integrate_base(self, a: float, b: float) -> float:
        fn = self._base
        assert callable(fn)
        n = max(1, int((b - a) / self.step_s + 0.5))
        h = (b - a) / n
        return sum(fn(a + (i + 0.5) * h) for i in range(n)) * h


class FaultPlan:
    """Scripted faults for a fake vendor library, and a count of every call.

    Faults are keyed by vendor function name and, optionally, device index. A
    one-shot fault fires on the next ``count`` matching calls; a permanent one on
    every matching call until :meth:`clear`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: list[list] = []  # [func, index|None, remaining, make_exc]
        self._always: dict[tuple[str, int | None], Callable[[], BaseException]] = {}
        self.calls: Counter[str] = Counter()

    def fail_next(
        self, func: str, make_exc: Callable[[], BaseException], count: int = 1, index: int | None = None
    ) -> None:
        """Make the next ``count`` calls of ``func`` (on device ``index``, or any) raise."""
        with self._lock:
            self._next.append([func, index, int(count), make_exc])

    def fail_always(self, func: str, make_exc: Callable[[], BaseException], index: int | None = None) -> None:
        """Make every call of ``func`` (on device ``index``, or any) raise until :meth:`clear`."""
        with self._lock:
            self._always[(func, index)] = make_exc

    def clear(self) -> None:
        """Remove every scripted fault (call counts are kept)."""
        with self._lock:
            self._next.clear()
            self._always.clear()

    def check(self, func: str, index: int | None = None) -> None:
        """Count a call of ``func`` and raise the scripted fault, if any."""
        with self._lock:
            self.calls[func] += 1
            for entry in self._next:
                f, i, remaining, make_exc = entry
                if f == func and remaining > 0 and (i is None or i == index):
                    entry[2] -= 1
                    if entry[2] == 0:
                        self._next.remove(entry)
                    raise make_exc()
            make_exc = self._always.get((func, index)) or self._always.get((func, None))
        if make_exc is not None:
            raise make_exc()


class FakeLibrary:
    """What both fake vendor modules share: devices with a :class:`PowerModel`, the
    init reference count, call costs, fault injection and load controls.

    Subclasses set the ``_INIT_FUNC``, ``_NOT_SUPPORTED``, ``_NO_PERMISSION`` and
    ``_SET_LIMIT_FUNC`` class attributes and implement :meth:`_exc_factory` (how a
    vendor error is built) and :meth:`_uninitialized` (the error a call before init
    raises). ``self.gpus`` holds objects with a ``model`` (:class:`PowerModel`).

    Args:
        time_fn: The clock the sensors run on (s).
        call_cost_s: Seconds each named function sleeps per call (real ``time.sleep``).
    """

    _INIT_FUNC: str = ""
    _NOT_SUPPORTED: int = 0
    _NO_PERMISSION: int = 0
    _SET_LIMIT_FUNC: str = ""

    def __init__(self, *, time_fn: Callable[[], float], call_cost_s: dict[str, float] | None) -> None:
        self.time_fn = time_fn
        self.call_cost_s = dict(call_cost_s or {})
        self.faults = FaultPlan()
        self._lock = threading.Lock()
        self._init_count = 0
        self.gpus: list = []
        self._hangs: dict[str, float | None] = {}
        self._release = threading.Event()
        self._hung = threading.Condition(self._lock)
        self._hung_calls = 0  # calls that began blocking since the last hang()

    # -- hooks -------------------------------------------------------------------------
    def _exc_factory(self, error) -> Callable[[], BaseException]:
        raise NotImplementedError

    def _uninitialized(self) -> BaseException:
        raise NotImplementedError

    # -- test controls -------------------------------------------------------------------
    @property
    def calls(self):
        """Calls per vendor function name (a ``Counter``)."""
        return self.faults.calls

    @property
    def initialized(self) -> bool:
        """True while at least one init is not matched by a shutdown."""
        return self._init_count > 0

    def _targets(self, index: int | None) -> list:
        return self.gpus if index is None else [self.gpus[index]]

    def set_load(self, power_W: float, index: int | None = None, at_s: float | None = None) -> None:
        """Make GPU ``index`` (default: all) draw ``power_W`` watts from now on."""
        for gpu in self._targets(index):
            gpu.model.set_load(power_W, at_s)

    def set_power_function(self, fn: Callable[[float], float], index: int | None = None) -> None:
        """Make GPU ``index`` (default: all) draw ``fn(t_s)`` watts at every time."""
        for gpu in self._targets(index):
            gpu.model.set_power_function(fn)

    def true_energy_J(self, t0_s: float, t1_s: float, index: int = 0) -> float:
        """Return the energy GPU ``index`` truly drew in ``[t0_s, t1_s]`` (J)."""
        return self.gpus[index].model.energy_J(t0_s, t1_s)

    def fail_next(self, func: str, error, count: int = 1, index: int | None = None) -> None:
        """Make the next ``count`` calls of ``func`` (on device ``index``, or any) raise ``error``."""
        self.faults.fail_next(func, self._exc_factory(error), count, index)

    def fail_always(self, func: str, error, index: int | None = None) -> None:
        """Make every call of ``func`` (on device ``index``, or any) raise ``error`` until cleared."""
        self.faults.fail_always(func, self._exc_factory(error), index)

    def make_unsupported(self, func: str, index: int | None = None) -> None:
        """Make ``func`` fail with the vendor's "not supported" error for good."""
        self.fail_always(func, self._NOT_SUPPORTED, index)

    def deny_permission(self, func: str | None = None, index: int | None = None) -> None:
        """Make ``func`` (default: the power-limit setter) fail with "no permission" for good."""
        self.fail_always(func or self._SET_LIMIT_FUNC, self._NO_PERMISSION, index)

    def clear_faults(self) -> None:
        """Remove every scripted fault (device state such as counters is kept)."""
        self.faults.clear()

    def hang(self, func: str, seconds: float | None = None) -> None:
        """Make every later call of ``func`` block: ``seconds`` of real time, or (None) until :meth:`release`.

        A driver call that never returns (a wedged GPU) or takes seconds (a busy driver) is seen in the
        field (issue 20); the call blocks on an event, so it holds no lock of the fake and the GIL is free.
        """
        with self._lock:
            self._hangs[func] = seconds
            self._release.clear()
            self._hung_calls = 0

    def wait_hung(self, calls: int = 1, timeout_s: float = 60.0) -> bool:
        """Wait until ``calls`` calls have begun blocking since :meth:`hang` (``timeout_s`` only guards a hang).

        Returns:
            True once they have; False when ``timeout_s`` passed first.
        """
        with self._hung:
            return self._hung.wait_for(lambda: self._hung_calls >= calls, timeout_s)

    def release(self) -> None:
        """End every hang: blocked calls return (and go on as normal calls), later ones do not block."""
        with self._lock:
            self._hangs.clear()
            self._release.set()

    # -- internals ---------------------------------------------------------------------
    def _begin(self, func: str, index: int | None) -> None:
        """Count a call, raise a scripted fault, sleep its cost, refuse it before init."""
        self.faults.check(func, index)
        if func in self._hangs:
            with self._hung:
                self._hung_calls += 1
                self._hung.notify_all()
            self._release.wait(self._hangs.get(func))
        cost = self.call_cost_s.get(func, 0.0)
        if cost > 0:
            time.sleep(cost)
        if func != self._INIT_FUNC and self._init_count == 0:
            raise self._uninitialized()

    def _count_init(self, delta: int) -> None:
        with self._lock:
            self._init_count += delta
