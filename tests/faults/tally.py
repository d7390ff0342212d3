"""The fault-injection and truth-or-flag tallies, summed over pytest-xdist workers.

Each worker counts into this module's dicts; at the end of its session it hands a snapshot to the
controller (``config.workeroutput``), which merges them and prints one summary (tests/conftest.py).
Run without xdist, the same process counts and prints.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

FAULTS: dict[str, list[int]] = defaultdict(lambda: [0, 0])
"""Category -> [tried, survived]."""

TRUTH: dict[str, int] = {"schedules": 0, "violations": 0, "checked": 0, "flagged_or_null": 0}
"""The truth-or-flag property suite's counts (tests/faults/truth_or_flag.py)."""

CUDA: dict[str, int] = {
    "schedules": 0,
    "violations": 0,
    "clock": 0,
    "cuda": 0,
    "lightning": 0,
    "hf": 0,
    "ledgers": 0,
    "known": 0,
}
"""The fake-CUDA truth-or-flag suite's counts (tests/faults/fake_cuda_schedules.py): schedules by timer and
hook order, those with a violation, and the epoch records that carried a ledger."""

RAPL: dict[str, int] = {"schedules": 0, "violations": 0, "checked": 0, "null": 0}
"""The RAPL truth-or-flag suite's counts (tests/faults/rapl_schedules.py): schedules, those with a violation,
figures checked against the fake's true energy and figures null with a reason."""

WORKER_OUTPUT_KEY = "zeus_callbacks_tally"


def record_fault(category: str, survived: bool) -> bool:
    """Count one fault case of ``category``; returns ``survived``."""
    entry = FAULTS[category]
    entry[0] += 1
    entry[1] += bool(survived)
    return bool(survived)


def snapshot() -> dict[str, Any]:
    """Both tallies as plain JSON-able data (what a worker sends the controller)."""
    return {"faults": {k: list(v) for k, v in FAULTS.items()}, "truth": dict(TRUTH), "cuda": dict(CUDA),
            "rapl": dict(RAPL)}  # fmt: skip


def merge(data: dict[str, Any]) -> None:
    """Add a worker's :func:`snapshot` to this process's tallies."""
    for category, (tried, survived) in data.get("faults", {}).items():
        FAULTS[category][0] += tried
        FAULTS[category][1] += survived
    for key, value in data.get("truth", {}).items():
        TRUTH[key] = TRUTH.get(key, 0) + value
    for key, value in data.get("cuda", {}).items():
        CUDA[key] = CUDA.get(key, 0) + value
    for key, value in data.get("rapl", {}).items():
        RAPL[key] = RAPL.get(key, 0) + value


def write_summary(terminalreporter) -> None:
    """Print the per-category breakdown and the two lines docs/reliability.md quotes."""
    if TRUTH["schedules"]:
        terminalreporter.write_sep("-", "truth-or-flag property suite")
        terminalreporter.write_line(
            f"  figures: {TRUTH['checked']} checked against the truth, {TRUTH['flagged_or_null']} flagged or null"
        )
        terminalreporter.write_line(f"truth-or-flag: {TRUTH['schedules']} schedules, {TRUTH['violations']} violations")
    if CUDA["schedules"]:
        c = CUDA
        terminalreporter.write_line(
            f"fake-cuda truth-or-flag: {c['schedules']} schedules (clock: {c['clock']}, cuda: {c['cuda']}; "
            f"lightning-order: {c['lightning']}, hf-order: {c['hf']}), {c['violations']} violations "
            f"({c['ledgers']} epoch ledgers checked; {c['known']} negative phase estimates kept out)"
        )
    if RAPL["schedules"]:
        r = RAPL
        terminalreporter.write_line(
            f"rapl truth-or-flag: {r['schedules']} schedules, {r['violations']} violations "
            f"({r['checked']} figures checked against the truth, {r['null']} null with a reason)"
        )
    if not FAULTS:
        return
    terminalreporter.write_sep("-", "fault-injection suite")
    for category in sorted(FAULTS):
        tried, survived = FAULTS[category]
        terminalreporter.write_line(f"  {category}: {tried} tried, {survived} survived")
    tried = sum(t for t, _ in FAULTS.values())
    survived = sum(s for _, s in FAULTS.values())
    terminalreporter.write_line(f"faults: {tried} tried, {survived} survived")
