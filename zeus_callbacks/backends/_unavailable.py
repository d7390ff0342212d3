"""The backend of a GPU that is present but cannot be measured.

``backend: auto`` opens it when a GPU exists (:mod:`zeus_callbacks.backends._detect`) but
neither NVML nor amdsmi can measure it (the library fails to start, permission denied,
MIG). Training goes on; it yields no power sample and has no energy counter, so every
energy figure of the run is null, and the records say ``measurement: "unavailable"``
with the cause. It never invents a number.
"""

from __future__ import annotations

from zeus_callbacks.backends._detect import GPUPresence
from zeus_callbacks.backends.base import DeviceIdentity, GPUBackend, NotSupported, PowerSample


class UnavailableBackend(GPUBackend):
    """A GPU this process cannot measure: no samples, no counter, no power limit.

    ``cause`` (the vendor libraries' messages) says why, ``fix`` what the user can do about it.
    """

    name = "unavailable"
    measurable = False

    def __init__(self, presence: GPUPresence, cause: str, fix: str) -> None:
        super().__init__(read_only=True)
        self.presence = presence
        self.cause = cause
        self.fix = fix

    def device_count(self) -> int:
        """Return how many GPUs the machine shows (at least 1)."""
        return max(self.presence.count, 1)

    def device_name(self, index: int) -> str:
        """Return ``"unmeasurable GPU"``: the vendor library that would name it failed."""
        return "unmeasurable GPU"

    def device_identity(self, index: int) -> DeviceIdentity:
        """Return the index only: the vendor library that would name the device failed (``note`` says how)."""
        return DeviceIdentity(
            index=index, backend_index=None, uuid=None, name=self.device_name(index),
            note=f"the vendor library that would identify the GPU failed ({self.cause})",
        )  # fmt: skip

    def power_samples_since(self, index: int, since_s: float) -> list[PowerSample]:
        """Return no sample: the GPU cannot be measured."""
        return []

    def energy_counter_J(self, index: int) -> float:
        """Raise :class:`NotSupported`: the GPU cannot be measured."""
        raise NotSupported(f"GPU {index} cannot be measured ({self.cause})")

    def power_limit_constraints_W(self, index: int) -> tuple[float, float]:
        """Raise :class:`NotSupported`: the power limit cannot be read."""
        raise NotSupported(f"GPU {index}'s power limit cannot be read ({self.cause})")

    def power_limit_W(self, index: int) -> float:
        """Raise :class:`NotSupported`: the power limit cannot be read."""
        raise NotSupported(f"GPU {index}'s power limit cannot be read ({self.cause})")

    def _set_power_limit_W(self, index: int, limit_W: float) -> None:
        raise NotSupported(f"GPU {index}'s power limit cannot be set ({self.cause})")

    def describe(self) -> str:
        """Return ``"unavailable: <what was found> (<cause>)"``."""
        return f"unavailable: {self.presence.describe()} cannot be measured ({self.cause})"
