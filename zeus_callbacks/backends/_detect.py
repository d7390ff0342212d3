"""Is there a GPU on this machine at all? Answered without the vendor libraries.

``backend: auto`` may fall back to the virtual GPU only where there is no GPU: a GPU
that is present but cannot be measured (NVML or amdsmi failing, permission denied, MIG)
must give measurement *unavailable*, never simulated energy. The vendor library is not
trusted to answer that question, since it is the thing that failed; this module looks
for the device nodes the drivers create (``/dev/nvidia0``..., ``/dev/kfd``) and asks
CUDA (through torch, only when torch is already imported) how many devices it sees.

Every probe is injectable so tests can describe a machine without having one.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_NVIDIA_NODE = re.compile(r"^nvidia[0-9]+$")


@dataclass(frozen=True)
class GPUPresence:
    """What the machine shows of its GPUs, independent of any vendor library.

    Attributes:
        nvidia_nodes: ``/dev/nvidia<N>`` device nodes found (names, sorted).
        cuda_devices: Devices CUDA reports (0 when torch is not imported or sees none).
        amd_kfd: Whether ``/dev/kfd`` (the ROCm compute node) exists.
    """

    nvidia_nodes: tuple[str, ...] = ()
    cuda_devices: int = 0
    amd_kfd: bool = False

    @property
    def any_gpu(self) -> bool:
        """True when any sign of a GPU was found."""
        return bool(self.nvidia_nodes) or self.cuda_devices > 0 or self.amd_kfd

    @property
    def count(self) -> int:
        """How many GPUs the signs point to (at least 1 when :attr:`any_gpu`)."""
        return max(len(self.nvidia_nodes), self.cuda_devices, 1 if self.any_gpu else 0)

    def describe(self) -> str:
        """One line naming what was found, e.g. ``"/dev/nvidia0, 1 CUDA device"``."""
        parts = [f"/dev/{name}" for name in self.nvidia_nodes]
        if self.cuda_devices:
            parts.append(f"{self.cuda_devices} CUDA device(s)")
        if self.amd_kfd:
            parts.append("/dev/kfd")
        return ", ".join(parts) or "no GPU"


def _torch_cuda_count() -> int:
    """CUDA's device count through torch, only if torch is imported already (0 otherwise or on error)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    try:
        return int(torch.cuda.device_count())
    except Exception:  # a broken CUDA install: the device nodes still tell
        return 0


def detect_gpus(dev_dir: str | Path = "/dev", *, cuda_count: Callable[[], int] = _torch_cuda_count) -> GPUPresence:
    """Look for GPUs without the vendor libraries: device nodes in ``dev_dir``, and CUDA's ``cuda_count()``."""
    root = Path(dev_dir)
    try:
        names = sorted(p.name for p in root.iterdir() if _NVIDIA_NODE.match(p.name))
    except OSError:
        names = []
    return GPUPresence(nvidia_nodes=tuple(names), cuda_devices=cuda_count(), amd_kfd=(root / "kfd").exists())
