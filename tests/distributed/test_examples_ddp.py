"""The two example jobs, data-parallel on two CPU processes (gloo), through the overhead benchmark.

This is the command the two-GPU H200 run uses (``benchmarks/example_overhead.py --gpus 2``), with
short jobs and a virtual GPU per process, so the examples' DDP paths and the benchmark's checks
cannot rot while no two-GPU machine is at hand.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.timeouts import CHILD_TIMEOUT_S

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(400)
def test_examples_run_data_parallel_and_are_measured_once_per_gpu(tmp_path):
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "example_overhead.py"),
        "--smoke",
        "--checks-only",  # the runs without the callback only time the overhead, which no test asserts
        "--gpus",
        "2",
        "--rounds",
        "1",
        "--out",
        str(tmp_path / "report"),
        "--work",
        str(tmp_path / "work"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, cwd=ROOT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    report = json.loads((tmp_path / "report" / "example_overhead.json").read_text())
    assert report["gpus"] == 2
    for job in ("lightning_digits", "hf_text"):
        summary = report[job]["summary"]
        (check,) = report[job]["multi_gpu_checks"]
        assert summary["world_size"] == 2 == check["world_size"]  # two processes, both in the group
        assert len(summary["gpu_energy_J"]) == 2
        assert math.isclose(sum(summary["gpu_energy_J"]), summary["energy_J"], rel_tol=1e-9)
        # The second virtual GPU draws 60 W more: its energy must be the larger.
        assert summary["gpu_energy_J"][1] > summary["gpu_energy_J"][0]
        assert check["jsonl_logs"] == 1  # one log for the run, not one per rank
    assert report["power_limits_before_W"] == report["power_limits_after_W"]
