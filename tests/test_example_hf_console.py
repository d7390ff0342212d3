"""examples/hf_text.py prints a few energy figures a log on the console; the loggers get every key (issue 26).

The Trainer's progress callback printed each log whole: some twenty energy keys a log buried the
loss. The example runs as a user runs it (tiny sizes, the CPU, the virtual GPU), its console lines
are read back, and TensorBoard's scalars show that nothing was taken from the loggers.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.helpers import read_scalars
from tests.timeouts import CHILD_TIMEOUT_S
from zeus_callbacks import reporting as metric

ROOT = Path(__file__).resolve().parents[1]
SHOWN = {metric.STEP_ENERGY_J, metric.MEAN_POWER_W, metric.TOTAL_ENERGY_J, metric.SIMULATED, "eval_energy_J"}
"""The energy keys the example's console may show (its CONSOLE_ENERGY_KEYS)."""


def console_logs(stdout: str) -> list[dict]:
    """The logs the Trainer's progress callback printed (one dict a line)."""
    return [ast.literal_eval(line) for line in stdout.splitlines() if line.startswith("{'")]


def test_the_hf_example_shows_a_few_energy_figures_and_logs_every_key(tmp_path):
    config = tmp_path / "zeus.yaml"
    config.write_text(
        f"backend: virtual\nwindows: {{sample_fraction: 1.0}}\nlogging: {{log_dir: {tmp_path / 'zeus_logs'}}}\n"
    )
    tiny = ["--max-steps", "4", "--batch-size", "4", "--block", "32", "--layers", "1", "--width", "32"]
    command = [sys.executable, str(ROOT / "examples" / "hf_text.py"), "--config", str(config), *tiny,
               "--output-dir", str(tmp_path / "out"), "--report-to", "tensorboard"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}  # this checkout's package, the CPU
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, cwd=tmp_path, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    logs = console_logs(done.stdout)
    assert any("eval_loss" in log for log in logs)  # the Trainer's logs: its evaluations', its final one below
    shown = {key for log in logs for key in log if metric.is_own_metric(key)}
    assert shown <= SHOWN, f"the console shows {sorted(shown - SHOWN)} too"
    final = next(log for log in logs if "train_loss" in log)
    assert metric.TOTAL_ENERGY_J in final
    assert any("eval_energy_J" in log for log in logs)
    # TensorBoard got every key: the run-level and per-step figures the console leaves out among them.
    tags = {tag.removeprefix("train/") for tag in read_scalars(tmp_path / "out")}
    hidden = {metric.TOTAL_TIME_S, metric.RUN_MEAN_POWER_W, metric.STEP_COUNT, metric.ENERGY_PER_SAMPLE_J}
    assert hidden <= tags, sorted(tags)
    assert {metric.TOTAL_ENERGY_J, "eval/energy_J"} <= tags
