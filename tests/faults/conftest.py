"""The fault-injection suite's tally: every fault case tried, and whether it was survived.

A test calls the ``record_fault`` fixture once per fault it injects, with whether the
product survived it (what "survived" means is stated next to each category in
``docs/reliability.md``). The session ends (tests/conftest.py) with a per-category breakdown and one final
line ``faults: N tried, N survived``; the truth-or-flag property suite (test_truth_or_flag.py) adds
``truth-or-flag: N schedules, V violations``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.faults import tally


@pytest.fixture
def record_fault() -> Callable[[str, bool], bool]:
    """``record_fault(category, survived)`` counts one fault case; returns ``survived``."""
    return tally.record_fault
