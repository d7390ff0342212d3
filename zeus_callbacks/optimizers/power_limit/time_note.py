"""Whether a power-limit profile's times are real: on the virtual GPU with the real clock they are not.

The virtual GPU simulates power from a Zeus trace; a power limit lowers that power at once. The
trace also says a low limit makes the job slower (e.g. 2.76x at 100 W for an A40), but on the
real clock a step takes as long as this machine's CPU takes, at any limit. Profiling then compares
limits at equal time: a low limit's energy looks smaller, and the "saving" is an artefact of the
simulation. Only a caller that drives a :class:`~zeus_callbacks.backends.base.ManualClock` by the
trace's time per step (the simulator, ``zeus-callbacks simulate``) simulates time as well.
"""

from __future__ import annotations

from zeus_callbacks.optimizers.power_limit.actuator import PowerLimitActuator


def time_note(backend: PowerLimitActuator, limit_W: float) -> str | None:
    """Why power-limit results on ``backend`` do not show the time a limit costs, or None when they do.

    Args:
        backend: The backend the profile ran on.
        limit_W: The limit to quote the trace's slowdown at (W): the chosen one, else the lowest profiled.

    Returns:
        The note in words (it quotes the trace's slowdown at ``limit_W`` when the backend has a trace),
        or None for a measured GPU, and for the virtual GPU on a clock the caller drives
        (:class:`~zeus_callbacks.backends.base.ManualClock`: the simulator applies the trace's time).
    """
    if not backend.simulated or backend.clock_is_manual:
        return None
    slowdown = getattr(backend, "step_time_factor", None)  # the virtual GPU's trace
    trace = (
        f" (its trace says {limit_W:.0f} W makes the job {slowdown(limit_W):.2f}x slower)" if callable(slowdown) else ""
    )
    return (
        "the virtual GPU simulates power, not time: step times are this machine's clock, which no power "
        f"limit slows{trace}. Limits are compared at equal time, so a lower limit's lower energy is not a saving."
    )
