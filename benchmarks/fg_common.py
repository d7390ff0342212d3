"""Shared pieces of the fine-grain benchmarks: device set-up, GEMM chains, counter reads, limit checks.

Real runs use the NVML backend and CUDA (set ZEUS_CALLBACKS_READ_ONLY=1 on a shared GPU);
``--smoke`` runs use the virtual GPU on the wall clock and tiny CPU kernels, whose power
is marked by toggling the virtual GPU's utilization around each execution.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy.stats import linregress  # noqa: E402

from zeus_callbacks.backends import get_backend  # noqa: E402
from zeus_callbacks.backends.base import GPUBackend  # noqa: E402


@dataclass
class Device:
    backend: GPUBackend
    smoke: bool
    torch_device: str

    def sync(self) -> None:
        if self.torch_device == "cuda":
            torch.cuda.synchronize()

    def busy(self, fn: Callable[[], Any]) -> Callable[[], None]:
        """On the virtual GPU, mark it busy while fn runs (real GPUs need nothing)."""
        if not self.smoke:
            return fn
        backend = self.backend

        def wrapped() -> None:
            backend.set_utilization(1.0)  # type: ignore[attr-defined]
            fn()
            backend.set_utilization(0.0)  # type: ignore[attr-defined]

        return wrapped


def open_device(smoke: bool) -> Device:
    # `timeout` sends SIGTERM: turn it into SystemExit so results are still written in `finally`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    if smoke:
        backend = get_backend("virtual", read_only=True)
        backend.set_utilization(0.0)  # type: ignore[attr-defined]
        return Device(backend, True, "cpu")
    if os.environ.get("ZEUS_CALLBACKS_READ_ONLY", "") in ("", "0"):
        raise SystemExit("set ZEUS_CALLBACKS_READ_ONLY=1: this benchmark runs on shared GPUs")
    return Device(get_backend("nvml", read_only=True), False, "cuda")


def gemm_chain(dev: Device, target_ms: float) -> tuple[Callable[[], None], float, str]:
    """A chain of bf16 GEMMs lasting about ``target_ms`` (CPU fp32 in smoke mode); returns fn, ms, label."""
    if dev.smoke:  # a sleep stands in for the kernel: stable durations even on a busy CPU
        seconds = target_ms / 1e3

        def fake() -> None:
            time.sleep(seconds)

        return dev.busy(fake), time_ms(dev, fake, reps=5), f"sleep {target_ms:g} ms (virtual GPU busy)"
    n, dtype = (4096 if target_ms < 3 else 8192), torch.bfloat16
    a = torch.randn(n, n, device=dev.torch_device, dtype=dtype)
    b = torch.randn(n, n, device=dev.torch_device, dtype=dtype)
    out = torch.empty_like(a)
    for _ in range(3):
        torch.mm(a, b, out=out)
    one_ms = time_ms(dev, lambda: torch.mm(a, b, out=out), reps=20)
    k = max(1, round(target_ms / one_ms))

    def chain() -> None:
        for _ in range(k):
            torch.mm(a, b, out=out)

    ms = time_ms(dev, chain, reps=max(3, int(200 / max(target_ms, 1))))
    return chain, ms, f"bf16 GEMM {n}x{n} x{k}"


HBM_BYTES_PER_S = 4.8e12  # H200 HBM3e peak; a copy reads and writes each byte once


def copy_chain(dev: Device, target_ms: float) -> tuple[Callable[[], None], float, str]:
    """Device-to-device copies (``dst.copy_(src)``) lasting about ``target_ms``; returns fn, ms, label.

    One copy of ``target_ms × 4.8 TB/s / 2`` bytes up to ~10 ms (2.4 GB at 1 ms); longer
    targets repeat a 9.6 GB copy. Smoke mode copies 1 MB on the CPU and sleeps the rest.
    """
    if dev.smoke:
        src, dst = torch.randn(1 << 18), torch.empty(1 << 18)
        seconds = target_ms / 1e3

        def fake() -> None:
            dst.copy_(src)
            time.sleep(seconds)

        return dev.busy(fake), time_ms(dev, fake, reps=5), f"copy 1 MB + sleep {target_ms:g} ms (virtual GPU busy)"
    nbytes = int(min(target_ms, 4.0) * 1e-3 * HBM_BYTES_PER_S / 2)
    numel = nbytes // 2  # bf16
    src = torch.randn(numel, device=dev.torch_device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    one_ms = time_ms(dev, lambda: dst.copy_(src), reps=10)
    k = max(1, round(target_ms / one_ms))

    def chain() -> None:
        for _ in range(k):
            dst.copy_(src)

    ms = time_ms(dev, chain, reps=max(3, int(200 / max(target_ms, 1))))
    return chain, ms, f"copy {nbytes / 1e9:.2f} GB x{k}"


def time_ms(dev: Device, fn: Callable[[], Any], reps: int) -> float:
    dev.sync()
    if dev.torch_device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1e3 / reps


@dataclass(frozen=True)
class CounterTicks:
    """Energy-counter ticks found by polling the counter continuously.

    A tick's time is the end of the first read that showed the new value. The tick lies
    between the moments the counter was sampled by that read and the previous one; if each
    read samples it at the same point of the call, that is within ``uncertainty_s`` (the end
    of that read minus the end of the previous one: the read's duration plus any pause)
    before ``time_s``, and a constant offset cancels between two ticks.

    Attributes:
        time_s: Tick times, shape (n,) (s, backend clock).
        uncertainty_s: Their uncertainty, shape (n,) (s).
        energy_J: Counter value after each tick, shape (n,) (J).
    """

    time_s: np.ndarray
    uncertainty_s: np.ndarray
    energy_J: np.ndarray


def ticks_from_reads(reads: Any) -> CounterTicks:
    """Ticks from counter reads ``[(read_start_s, read_end_s, value_J), ...]`` in time order."""
    r = np.asarray(reads, dtype=np.float64).reshape(-1, 3)
    changed = np.flatnonzero(np.diff(r[:, 2]) != 0) + 1
    return CounterTicks(r[changed, 1], r[changed, 1] - r[changed - 1, 1], r[changed, 2])


def mean_power_between(ticks: CounterTicks, t_lo: float, t_hi: float) -> dict:
    """Mean power between the first tick at or after ``t_lo`` and the last at or before ``t_hi``.

    Returns a dict with ``power_W``, ``t0_s``, ``t1_s``, ``energy_J`` and ``rel_err``: the
    worst-case relative error from the tick times, ``(u0 + u1) / (t1 − t0)``.

    Raises:
        ValueError: Fewer than two ticks in the interval.
    """
    i = np.flatnonzero((ticks.time_s >= t_lo) & (ticks.time_s <= t_hi))
    if i.size < 2:
        raise ValueError(f"fewer than 2 counter ticks in [{t_lo:.3f}, {t_hi:.3f}] s")
    a, b = i[0], i[-1]
    dt = ticks.time_s[b] - ticks.time_s[a]
    energy = ticks.energy_J[b] - ticks.energy_J[a]
    rel_err = float((ticks.uncertainty_s[a] + ticks.uncertainty_s[b]) / dt)
    return {"power_W": energy / dt, "t0_s": float(ticks.time_s[a]), "t1_s": float(ticks.time_s[b]),
            "energy_J": float(energy), "rel_err": rel_err}  # fmt: skip


def fitted_power(ticks: CounterTicks, t_lo: float, t_hi: float) -> dict:
    """Power as the slope of counter energy over tick time in ``[t_lo, t_hi]`` (least squares).

    For a constant power (idle): every tick counts, so the tick-time errors average out
    instead of resting on two ticks. Returns ``power_W``, ``se_W`` (standard error of the
    slope from the residuals) and ``ticks``.

    Raises:
        ValueError: Fewer than three ticks in the interval.
    """
    i = np.flatnonzero((ticks.time_s >= t_lo) & (ticks.time_s <= t_hi))
    if i.size < 3:
        raise ValueError(f"fewer than 3 counter ticks in [{t_lo:.3f}, {t_hi:.3f}] s")
    fit = linregress(ticks.time_s[i] - ticks.time_s[i].mean(), ticks.energy_J[i])
    return {"power_W": float(fit.slope), "se_W": float(fit.stderr), "ticks": int(i.size)}


class CounterPoller:
    """Reads the energy counter continuously from a background thread (a context manager).

    An H200 counter read takes 3-5 ms and the counter moves every ~100 ms: polling between
    calls of the workload instead would time a tick to within a whole execution (100 ms).
    Each read is recorded as ``(start_s, end_s, value_J)`` on the backend clock.

    Args:
        backend: The open backend.
        index: GPU index.
        min_interval_s: Least time from one read's start to the next (0: back to back; the
            virtual GPU answers at once, so smoke runs wait 2 ms).
    """

    def __init__(self, backend: GPUBackend, index: int = 0, min_interval_s: float = 0.0) -> None:
        self.backend, self.index, self.min_interval_s = backend, index, min_interval_s
        self._reads: list[tuple[float, float, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="counter-poller", daemon=True)

    def _run(self) -> None:
        clock = self.backend.clock
        while not self._stop.is_set():
            t0 = clock.now_s()
            value = self.backend.energy_counter_J(self.index)
            t1 = clock.now_s()
            with self._lock:
                self._reads.append((t0, t1, value))
            if self.min_interval_s:
                time.sleep(max(0.0, self.min_interval_s - (t1 - t0)))

    def __enter__(self) -> CounterPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def reads(self) -> list[tuple[float, float, float]]:
        """A copy of the reads so far."""
        with self._lock:
            return list(self._reads)

    def ticks(self) -> CounterTicks:
        """The ticks seen so far."""
        return ticks_from_reads(self.reads())

    def wait_tick_after(self, t_s: float, timeout_s: float = 1.0) -> None:
        """Block until a tick later than ``t_s`` has been seen (or ``timeout_s`` passed)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ticks = self.ticks()
            if ticks.time_s.size and ticks.time_s[-1] > t_s:
                return
            time.sleep(0.01)


def power_limit_W() -> str | None:
    """The power limit as nvidia-smi reports it (None without nvidia-smi)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=power.limit,enforced.power.limit", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=float), encoding="utf-8")
