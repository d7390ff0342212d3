"""The framework-free core every adapter talks to: :class:`EnergySession` and its parts.

The data path reads top-down: the adapters' hooks → :class:`EnergySession` (``core``) →
the started run's parts (``run``: backend, sampler, meter, timer, event log), the step
path (``scheduler``: which steps are measured, at what training-thread cost), the
power-limit glue (``power``), the batch-size glue (``batch``), the reports (``report``),
the rank exchanges (``aggregate``, ``agreement``), the records (``records``) and the
process-exit cleanups (``lifecycle``). ``scheduler``, ``power``, ``batch`` and ``report``
are base classes of the session (``part`` declares what they read of it).
"""

from zeus_callbacks.session.core import Decision, EnergySession, default_gpu_indices

__all__ = ["Decision", "EnergySession", "default_gpu_indices"]
