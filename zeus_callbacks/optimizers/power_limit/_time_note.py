"""Whether a power-limit profile's times are real: on the virtual GPU with the real clock they are not.

The virtual GPU simulates power from a Zeus trace; a power limit lowers that power at once. The
trace also says a low limit makes the job slower (e.g. 2.76x at 100 W for an A40), but on the
real clock a step takes as long as this machine's CPU takes, at any limit. Profiling then compares
limits at equal time: a low limit's energy looks smaller, and the "saving" is an artefact of the
simulation. Only a caller that drives a :class:`~zeus_callbacks.backends.base.ManualClock` by the
trace's time per step (the simulator, ``zeus-callbacks simulate``) simulates time as well.
"""

from __future__ import annotations

from zeus_callbacks.optimizers.power_limit._actuator import PowerLimitActuator

SAME_SPEED_REL = 0.005
"""A time factor within this of 1 reads "no slower": ``1.00x slower`` says nothing true."""


def slowdown_words(factor: float) -> str:
    """A time factor (time at a limit / time at the maximum, > 0) in words.

    Example:
        >>> slowdown_words(2.761), slowdown_words(1.001), slowdown_words(0.95)
        ('2.76x slower', 'no slower', '1.05x faster')
    """
    if abs(factor - 1.0) <= SAME_SPEED_REL:
        return "no slower"
    if factor > 1.0:
        return f"{factor:.2f}x slower"
    return f"{1.0 / factor:.2f}x faster"


def time_note(backend: PowerLimitActuator, limit_W: float) -> str | None:
    """Why power-limit results on ``backend`` do not show the time a limit costs, or None when they do.

    ``limit_W``: where to quote the trace's slowdown (W). None for a measured GPU, and for the virtual
    GPU on a clock the caller drives (the simulator applies the trace's time).
    """
    if not backend.simulated or backend.clock_is_manual:
        return None
    slowdown = getattr(backend, "step_time_factor", None)  # the virtual GPU's trace
    trace = (
        f" (its trace says {limit_W:.0f} W makes the job {slowdown_words(slowdown(limit_W))})"
        if callable(slowdown)
        else ""
    )
    return (
        "the virtual GPU simulates power, not time: step times are this machine's clock, which no power "
        f"limit slows{trace}. Limits are compared at equal time, so a lower limit's lower energy is not a saving."
    )
