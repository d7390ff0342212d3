"""Golden-JSONL characterisation: each scenario's energy log must stay what it is today.

Every scenario (see :mod:`tests.golden.scenarios`) runs on a noise-free virtual GPU with a
manual clock, so its JSONL log is the same on every run and every machine. The test
normalises only what legitimately varies from run to run (the wall-clock time of the run's
start and the temporary directory in paths) and compares the rest with the checked-in
``data/<scenario>.jsonl``: strings, integers and booleans exactly; floats (energies, powers,
times, costs) to a relative 1e-9, so a refactoring that only reorders a sum still passes while
any change of behaviour fails.

Regenerate after an intended change of behaviour (and review the diff)::

    ZEUS_CALLBACKS_REGEN_GOLDEN=1 python -m pytest tests/golden
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.golden.scenarios import SCENARIOS

DATA = Path(__file__).with_name("data")
TWO_RANK_JOB = Path(__file__).with_name("two_rank_job.py")
REGEN = os.environ.get("ZEUS_CALLBACKS_REGEN_GOLDEN") == "1"
REL = 1e-9
WALL_KEYS = frozenset({"wall_time"})  # the host's wall clock at run start: varies by construction
TMP = "<tmp>"


def normalise(value: Any, tmp: str) -> Any:
    """``value`` with wall-clock times masked and the temporary directory ``tmp`` replaced by ``<tmp>``."""
    if isinstance(value, dict):
        return {k: "<wall>" if k in WALL_KEYS else normalise(v, tmp) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v, tmp) for v in value]
    if isinstance(value, str):
        return value.replace(tmp, TMP)
    return value


def read_records(paths: list[Path], tmp: Path) -> list[dict[str, Any]]:
    """The records of the JSONL files ``paths``, in order, each tagged with its file's name and normalised."""
    records = []
    for path in paths:
        for line in path.read_text().splitlines():
            record = normalise(json.loads(line), str(tmp))
            records.append({"file": path.name, **record})
    return records


def differences(got: Any, want: Any, where: str = "") -> list[str]:
    """Where ``got`` differs from ``want``: exact for all but floats, which agree to a relative REL."""
    if isinstance(want, dict) and isinstance(got, dict):
        if got.keys() != want.keys():
            return [f"{where}: keys {sorted(got)} != {sorted(want)}"]
        return [d for k in want for d in differences(got[k], want[k], f"{where}.{k}")]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{where}: {len(got)} items != {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True)) for d in differences(g, w, f"{where}[{i}]")]
    if isinstance(want, float) and isinstance(got, float) and not isinstance(got, bool):
        return [] if math.isclose(got, want, rel_tol=REL, abs_tol=1e-12) else [f"{where}: {got!r} != {want!r}"]
    if type(got) is not type(want) or got != want:
        return [f"{where}: {got!r} != {want!r}"]
    return []


def check_golden(name: str, records: list[dict[str, Any]]) -> None:
    """Compare ``records`` with ``data/<name>.jsonl`` (or rewrite it when regenerating)."""
    golden = DATA / f"{name}.jsonl"
    if REGEN:
        DATA.mkdir(exist_ok=True)
        golden.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        return
    assert golden.exists(), f"no golden file {golden}: run with ZEUS_CALLBACKS_REGEN_GOLDEN=1"
    want = [json.loads(line) for line in golden.read_text().splitlines()]
    events = [(r["file"], r["event"]) for r in records]
    assert events == [(r["file"], r["event"]) for r in want], "the sequence of records changed"
    found = [d for i, (g, w) in enumerate(zip(records, want, strict=True)) for d in differences(g, w, f"#{i}")]
    assert not found, f"{len(found)} difference(s) from {golden.name}:\n" + "\n".join(found[:40])


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_matches_golden(name, tmp_path):
    records = read_records(SCENARIOS[name](tmp_path), tmp_path)
    assert records and records[0]["event"] == "run_start" and records[-1]["event"] in ("run_end", "trial")
    check_golden(name, records)


def test_two_rank_peer_matches_golden(tmp_path):
    """Two real processes (gloo): rank 0's log and both ranks' summaries."""
    done = subprocess.run(
        [sys.executable, str(TWO_RANK_JOB), str(tmp_path)], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_records(sorted((tmp_path / "logs").glob("*.jsonl")), tmp_path)
    assert [r["file"] for r in records] == ["two_rank.jsonl"] * len(records)  # one writer: rank 0
    for rank in range(2):
        summary = json.loads((tmp_path / f"rank{rank}.json").read_text())
        records.append({"file": f"rank{rank}.json", "event": "summary", **normalise(summary, str(tmp_path))})
    check_golden("two_rank", records)
