"""What the power-limit optimiser needs of a GPU: read and set its limit, name it; nothing else.

The session hands the controller (and the restore protocol) the run's open backend, which
has these methods; the optimiser never imports a backend. The errors it catches are the
backend errors of :mod:`zeus_callbacks.errors`, re-exported here under the optimiser's names.
"""

from __future__ import annotations

from typing import Protocol

from zeus_callbacks.errors import BackendError as ActuatorError
from zeus_callbacks.errors import PermissionDenied as ActuatorPermissionDenied

__all__ = ["ActuatorError", "ActuatorPermissionDenied", "PowerLimitActuator"]


class PowerLimitActuator(Protocol):
    """The GPUs whose power limits the optimiser reads and sets (a GPU backend satisfies it).

    Every method may raise :data:`ActuatorError`; a setter the process may not use raises
    :data:`ActuatorPermissionDenied`. Limits are in W; ``index`` is a device index.

    Attributes:
        name: The backend's name, kept in the restore marker (``nvml``, ``amdsmi``, ``virtual``).
        simulated: True for the virtual GPU (its limits change no hardware).
        read_only: True when every setter refuses (observe mode).
    """

    name: str
    simulated: bool
    read_only: bool

    @property
    def clock_is_manual(self) -> bool:
        """True when the caller drives the clock (the simulator): times then follow the trace."""

    def device_count(self) -> int:
        """Number of GPUs visible."""

    def device_name(self, index: int) -> str:
        """The GPU's model name."""

    def device_uuid(self, index: int) -> str | None:
        """The GPU's UUID (None where there is none)."""

    def power_limit_constraints_W(self, index: int) -> tuple[float, float]:
        """The (lowest, highest) limit the GPU accepts (W)."""

    def power_limit_W(self, index: int) -> float:
        """The limit in force (W)."""

    def set_power_limit_W(self, index: int, limit_W: float) -> None:
        """Set the limit (W)."""
