"""The RAPL truth-or-flag property suite (issue 29): CPU package and DRAM counters on a fake powercap tree.

Random schedules of readings (gaps from 1 ms to past a counter's shortest wrap time, package and DRAM
power, one or two sockets, with or without DRAM, small ranges that wrap often) with faults: counters stuck
and thawed, unreadable (PermissionError), vanishing. Every figure between two readings, and the record
layer's from the start, must be within its tolerance of the fake's true energy or null with a reason
(tests/faults/rapl_schedules.py). The session ends with
``rapl truth-or-flag: N schedules, V violations (C figures checked against the truth, K null with a reason)``.

What tests/test_rapl.py covers one case at a time (a wrap, a stuck counter, an unreadable or vanished zone,
a too-long gap) is drawn here in combination.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.faults.rapl_schedules import FAULT_KINDS, Reading, Schedule, run_schedule, tally
from zeus_callbacks.backends.rapl import MAX_DOMAIN_POWER_W, STILL_AFTER_S, UJ_PER_J

SCHEDULES = 300
MAX_READINGS = 10

# Ranges (µJ) and their shortest wrap times at MAX_DOMAIN_POWER_W: 5 ms (wraps between most readings),
# 0.5 s, and a real package's 262 s.
RANGES_UJ = (5_000_000, 500_000_000, 262_143_328_850)
# Gaps (s): below and above STILL_AFTER_S, around the short ranges' wrap times, and past the longest's.
GAPS_S = (0.001, 0.004, 0.006, 0.015, 0.03, 0.3, 0.6, 2.0, 300.0)
PACKAGE_W = st.floats(1.0, 400.0, allow_nan=False)  # an idle to a busy package
DRAM_W = st.floats(0.1, 60.0, allow_nan=False)


@st.composite
def schedules(draw) -> Schedule:
    """A random fake tree and schedule of readings with faults."""
    sockets = draw(st.integers(1, 2))
    dram = draw(st.booleans())
    kinds = ["package", "dram"] * sockets if dram else ["package"] * sockets
    ranges = tuple(draw(st.sampled_from(RANGES_UJ)) for _ in kinds)
    starts = tuple(draw(st.integers(0, r - 1)) for r in ranges)
    count = draw(st.integers(1, MAX_READINGS))
    readings = []
    for _ in range(count):
        power = tuple(draw(PACKAGE_W if kind == "package" else DRAM_W) for kind in kinds)
        fault = st.tuples(st.integers(0, len(kinds) - 1), st.sampled_from(FAULT_KINDS))
        faults = tuple(draw(st.lists(fault, max_size=2))) if draw(st.integers(0, 3)) == 0 else ()
        readings.append(Reading(draw(st.sampled_from(GAPS_S)), power, faults))
    return Schedule(sockets, dram, ranges, starts, tuple(readings), stuck_reads=draw(st.integers(2, 4)))


def test_the_schedules_reach_both_sides_of_the_reader_limits():
    """The gaps straddle STILL_AFTER_S and the short ranges' wrap times, and the longest range's: not vacuous."""
    wrap_s = [r / UJ_PER_J / MAX_DOMAIN_POWER_W for r in RANGES_UJ]
    assert min(GAPS_S) < STILL_AFTER_S < max(GAPS_S)
    for limit_s in wrap_s:
        assert min(GAPS_S) < limit_s < max(GAPS_S)


@settings(
    max_examples=SCHEDULES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(schedules())
def test_every_cpu_and_dram_figure_is_true_or_null_with_a_reason(schedule):
    bad = tally(run_schedule(schedule))
    assert not bad, (schedule, bad[:5])


def _steady(gaps, power=(50.0,), faults=None, ranges=(RANGES_UJ[-1],), **kw):
    readings = tuple(Reading(g, power, (faults or {}).get(k, ())) for k, g in enumerate(gaps))
    return Schedule(1, False, ranges, (0,) * len(ranges), readings, **kw)


def test_the_suite_is_not_vacuous():
    """A clean schedule's figures are all checked against the truth and match; a wrap-heavy one too."""
    for schedule in (_steady([0.3] * 5), _steady([0.004] * 6, power=(900.0,), ranges=(RANGES_UJ[0],))):
        outcome = run_schedule(schedule)
        assert outcome.figures and all(f.value_J is not None for f in outcome.figures)
        assert not outcome.violations()


def test_a_counter_that_stalls_then_jumps_past_a_wrap_is_unknown_not_short():
    """Found building this suite: a counter stalled past its wrap time, then updated, read as one short step.

    The readings came often enough, but the counter did not move between them: the gap that bounds the wraps
    is the one since the reader last saw it move (each gap here is below the 5 ms range's wrap time).
    """
    gaps = [0.004] * 8
    schedule = _steady(gaps, power=(900.0,), ranges=(RANGES_UJ[0],), faults={1: ((0, "stuck"),), 4: ((0, "thaw"),)},
                       stuck_reads=4)  # fmt: skip
    outcome = run_schedule(schedule)
    assert not outcome.violations(), outcome.violations()[:5]
    late = [f for f in outcome.figures if f.what.startswith("package-0 ") and f.what.endswith("..8")]
    assert late and all(f.value_J is None and "wraps may be missed" in f.reason for f in late)


def test_a_frozen_counter_is_unknown_from_the_reading_that_shows_it():
    """The first equal reading STILL_AFTER_S after the last move is unknown already, not 0 J."""
    schedule = _steady([0.3, 0.3, 0.3, 0.3], faults={2: ((0, "stuck"),)})
    outcome = run_schedule(schedule)
    assert not outcome.violations()
    (figure,) = [f for f in outcome.figures if f.what == "package-0 2..3"]
    assert figure.value_J is None and "not moved" in figure.reason
