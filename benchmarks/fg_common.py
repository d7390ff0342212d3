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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

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


def counter_edge(dev: Device, timeout_s: float = 0.5, work: Callable[[], Any] | None = None) -> tuple[float, float]:
    """Wait for the energy counter to tick (it moves every ~100 ms) and return (time_s, energy_J) of the tick.

    ``work``, when given, is called between reads so the GPU stays busy while we wait.
    """
    backend = dev.backend
    first = backend.energy_counter_J(0)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = backend.energy_counter_J(0)
        if value != first:
            return backend.clock.now_s(), value
        if work is not None:
            work()
        elif dev.smoke:
            time.sleep(0.002)
    return backend.clock.now_s(), backend.energy_counter_J(0)


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
