"""A training exception, Ctrl-C, SIGTERM and SIGKILL at seeded random steps of power-limit profiling.

Each case is a child process (``power_limit_child.py``) profiling on the virtual GPU,
which starts at ``ORIGINAL_W``. The virtual GPU's limit lives in the child's memory, so
the evidence is what the child leaves: its setter calls, in order, its restore marker,
its JSONL log, and the limit it printed just before the fault. After an exception,
SIGINT or SIGTERM the last setter call must put ``ORIGINAL_W`` back and the marker must be
gone; after SIGKILL the marker must hold ``ORIGINAL_W`` and the next start must set it
back (with one setter call) and remove the marker.
"""

from __future__ import annotations

import dataclasses
import json
import random
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.faults.power_limit_child import ORIGINAL_W
from tests.once_per_run import once_per_run
from tests.test_power_limit_signals import SpyBackend
from tests.timeouts import CHILD_TIMEOUT_S
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.optimizers.power_limit import MARKER_NAME
from zeus_callbacks.reporting import read_jsonl
from zeus_callbacks.session import EnergySession

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("power_limit_child.py")
MODES = ("exception", "exception_uncaught", "sigint", "sigterm", "sigkill")
CASES_PER_MODE = 3
PROFILING_STEPS = range(1, 28)  # the limit differs from ORIGINAL_W here (the profile ends near step 30)
PHASES = ("start", "mid", "end")
EXPECTED_RC = {
    "exception": 1,
    "exception_uncaught": 1,
    "sigint": -signal.SIGINT,
    "sigterm": -signal.SIGTERM,
    "sigkill": -signal.SIGKILL,
}
EXPECTED_STATUS = {
    "exception": "failed",
    "exception_uncaught": "interrupted",
    "sigint": "interrupted",
    "sigterm": "interrupted",
}

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


@dataclass
class Case:
    mode: str
    step: int
    phase: str
    log_dir: Path
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""

    @property
    def name(self) -> str:
        return f"{self.mode}@{self.step}/{self.phase}"

    def setter_calls_W(self) -> list[float]:
        path = self.log_dir / "setter_calls.txt"
        return [float(x) for x in path.read_text().split()[1::2]] if path.exists() else []

    def limit_at_fault_W(self) -> float | None:
        lines = [line for line in self.stdout.splitlines() if line.startswith("LIMIT ")]
        return float(lines[0].split()[1]) if lines else None


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, list[Case]]:
    """Every case's run (once per test run, whichever worker asks first), by mode."""
    ran = [
        Case(**{**c, "log_dir": Path(c["log_dir"])}) for c in once_per_run(tmp_path_factory, "pl-faults", _run_cases)
    ]
    return {mode: [c for c in ran if c.mode == mode] for mode in MODES}


def _run_cases(folder: Path) -> list[dict]:
    """Run every case at once (seeded steps and phases) in ``folder`` and collect what the children left."""
    rng = random.Random(20261129)
    planned = []
    for mode in MODES:
        for k in range(CASES_PER_MODE):
            (log_dir := folder / f"{mode}-{k}").mkdir()
            planned.append(Case(mode, rng.choice(PROFILING_STEPS), rng.choice(PHASES), log_dir))
    procs = [
        subprocess.Popen(
            [sys.executable, str(CHILD), str(c.log_dir), c.mode, str(c.step), c.phase],
            cwd=ROOT,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(c.log_dir)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for c in planned
    ]
    for case, proc in zip(planned, procs, strict=True):  # 15 children at once: slow on a loaded machine
        case.stdout, case.stderr = proc.communicate(timeout=CHILD_TIMEOUT_S)
        case.returncode = proc.returncode
    return [{**dataclasses.asdict(c), "log_dir": str(c.log_dir)} for c in planned]


def _problems_after_exit(case: Case) -> list[str]:
    """A run that ended in-process (exception, SIGINT, SIGTERM): restored, marker gone, log ended."""
    problems = []
    calls = case.setter_calls_W()
    if not calls or calls[-1] != ORIGINAL_W:
        problems.append(f"last setter call {calls[-1:]} is not the original {ORIGINAL_W} W")
    if (case.log_dir / MARKER_NAME).exists():
        problems.append("restore marker left behind")
    records = read_jsonl(case.log_dir / "child.jsonl")
    end = records[-1] if records else {}
    if end.get("event") != "run_end" or end.get("status") != EXPECTED_STATUS[case.mode]:
        problems.append(
            f"log ends with {end.get('event')} {end.get('status')}, not run_end {EXPECTED_STATUS[case.mode]}"
        )
    if end.get("power_limit_W") != ORIGINAL_W:
        problems.append(f"run_end reports power_limit_W {end.get('power_limit_W')}")
    return problems


def _problems_after_sigkill(case: Case) -> list[str]:
    """SIGKILL: the marker holds the original; the next start restores it with one setter call."""
    marker_path = case.log_dir / MARKER_NAME
    if not marker_path.exists():
        return ["no restore marker after SIGKILL"]
    marker = json.loads(marker_path.read_text())
    problems = []
    if [g["original_limit_W"] for g in marker["gpus"]] != [ORIGINAL_W]:
        problems.append(f"marker holds {marker['gpus']}")
    left_W = case.limit_at_fault_W()
    calls = case.setter_calls_W()
    if not calls or calls[-1] != left_W:
        problems.append(f"the last setter call {calls[-1:]} is not the limit reported at the kill ({left_W} W)")
    # The next start, in a fresh process (here: this one) whose GPU still runs at the leftover limit.
    backend = SpyBackend(clock=ManualClock(1000.0), read_only=False)
    backend.set_power_limit_W(0, left_W)
    backend.calls.clear()
    session = EnergySession(
        {"backend": "virtual", "logging": {"log_dir": str(case.log_dir), "run_name": "next"}},
        backend=backend,
        is_main_process=True,
    )
    session.train_start()
    try:
        if backend.calls != [(0, ORIGINAL_W)] or backend.power_limit_W(0) != ORIGINAL_W:
            problems.append(f"next start made setter calls {backend.calls}")
        if marker_path.exists():
            problems.append("the next start left the marker")
    finally:
        session.train_end()
        backend.close()
    return problems


@pytest.mark.parametrize("mode", MODES)
def test_original_limit_is_back(cases, mode, record_fault):
    failures = {}
    for case in cases[mode]:
        # Preconditions: the fault hit while profiling had the limit changed, and the process ended as expected.
        assert case.limit_at_fault_W() not in (None, ORIGINAL_W), (case.name, case.stdout, case.stderr[-2000:])
        assert case.returncode == EXPECTED_RC[mode], (case.name, case.returncode, case.stderr[-2000:])
        problems = _problems_after_sigkill(case) if mode == "sigkill" else _problems_after_exit(case)
        if not record_fault(f"power-limit profiling: {mode}", not problems):
            failures[case.name] = problems
    assert not failures, failures
