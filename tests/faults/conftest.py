"""The fault-injection suite's tally: every fault case tried, and whether it was survived.

A test calls the ``record_fault`` fixture once per fault it injects, with whether the
product survived it (what "survived" means is stated next to each category in
``docs/reliability.md``). The session ends with a per-category breakdown and one final
line ``faults: N tried, N survived``; the truth-or-flag property suite (test_truth_or_flag.py) adds
``truth-or-flag: N schedules, V violations``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import pytest

_TALLY: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # category -> [tried, survived]


def tally() -> dict[str, tuple[int, int]]:
    """Category -> (tried, survived), so far in this session."""
    return {category: (tried, survived) for category, (tried, survived) in _TALLY.items()}


@pytest.fixture
def record_fault() -> Callable[[str, bool], bool]:
    """``record_fault(category, survived)`` counts one fault case; returns ``survived``."""

    def record(category: str, survived: bool) -> bool:
        entry = _TALLY[category]
        entry[0] += 1
        entry[1] += bool(survived)
        return bool(survived)

    return record


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    from tests.faults.truth_or_flag import TALLY as TRUTH

    if TRUTH["schedules"]:
        terminalreporter.write_sep("-", "truth-or-flag property suite")
        terminalreporter.write_line(
            f"  figures: {TRUTH['checked']} checked against the truth, {TRUTH['flagged_or_null']} flagged or null"
        )
        terminalreporter.write_line(f"truth-or-flag: {TRUTH['schedules']} schedules, {TRUTH['violations']} violations")
    if not _TALLY:
        return
    terminalreporter.write_sep("-", "fault-injection suite")
    for category in sorted(_TALLY):
        tried, survived = _TALLY[category]
        terminalreporter.write_line(f"  {category}: {tried} tried, {survived} survived")
    tried = sum(t for t, _ in _TALLY.values())
    survived = sum(s for _, s in _TALLY.values())
    terminalreporter.write_line(f"faults: {tried} tried, {survived} survived")
