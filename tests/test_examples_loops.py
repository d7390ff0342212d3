"""The raw-loop and Fabric examples run as a user runs them, and their energy logs hold the run.

Each example trains two short epochs on the digits on the CPU with the virtual GPU reporting
power; the JSONL log it wrote is read back (step reports, epoch records, the run's total), and
for Fabric the TensorBoard scalars it handed to Fabric's logger.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import read_scalars
from tests.timeouts import CHILD_TIMEOUT_S
from zeus_callbacks.reporting import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 2
BATCH_SIZE = 128
STEPS_PER_EPOCH = 12  # ceil(1437 training digits / 128)
REL = 1e-9  # sums of the same floats in another order


def run_example(tmp_path: Path, example: str, *extra: str) -> tuple[dict, list[dict]]:
    """Run ``examples/<example>.py`` on a virtual GPU; its summary JSON and its JSONL records."""
    config = tmp_path / "zeus.yaml"
    config.write_text(
        "backend: virtual\n"
        "windows: {sample_fraction: 1.0}\n"  # every step measured: the step records are checked
        f"logging: {{interval_steps: 5, log_dir: {tmp_path / 'zeus_logs'}}}\n"
    )
    out = tmp_path / "summary.json"
    script = ROOT / "examples" / f"{example}.py"
    sizes = ["--epochs", str(EPOCHS), "--batch-size", str(BATCH_SIZE)]
    command = [sys.executable, str(script), "--config", str(config), *sizes, "--summary-json", str(out), *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}  # this checkout's package, the CPU
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, cwd=tmp_path, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "(completed)" in done.stdout and f"{example}: {EPOCHS} epochs" in done.stdout  # the summary was printed
    result = json.loads(out.read_text())
    return result, read_jsonl(result["summary"]["jsonl_path"])


def check_run(result: dict, records: list[dict]) -> None:
    """What both examples' logs must hold: every step reported once, two measured epochs, the total."""
    by_event: dict[str, list[dict]] = {}
    for record in records:
        by_event.setdefault(record["event"], []).append(record)
    (end,) = by_event["run_end"]
    summary = result["summary"]
    assert end["status"] == summary["status"] == "completed"
    assert end["simulated"] is True  # the virtual GPU: every figure says so
    assert end["steps"] == EPOCHS * STEPS_PER_EPOCH and end["epochs"] == EPOCHS
    assert end["energy_J"] == pytest.approx(summary["energy_J"], rel=REL) and end["energy_J"] > 0
    steps = by_event["steps"]
    assert sum(r["steps"] + r["warmup_steps"] for r in steps) == EPOCHS * STEPS_PER_EPOCH
    assert all(r["energy_J_mean"] > 0 and r["energy_J_per_sample"] > 0 for r in steps if r["count"])
    epochs = by_event["epoch"]
    assert [r["epoch"] for r in epochs] == list(range(EPOCHS))
    for record in epochs:
        assert record["complete"] and record["energy_J"] > 0 and record["time_s"] > 0
        ledger = record["ledger"]
        parts_J = ledger["warmup_J"] + ledger["steps_J"] + ledger["eval_J"] + ledger["eval_tail_J"] + ledger["other_J"]
        assert parts_J == pytest.approx(record["energy_J"], rel=REL)  # every step measured: the ledger sums
    assert sum(r["energy_J"] for r in epochs) <= end["energy_J"]  # the epochs lie inside the run


@pytest.mark.timeout(300)
def test_the_raw_loop_example_logs_its_epochs_steps_and_evaluations(tmp_path):
    result, records = run_example(tmp_path, "raw_loop")
    check_run(result, records)
    evals = [r for r in records if r["event"] == "eval"]
    assert [r["step"] for r in evals] == [STEPS_PER_EPOCH * (i + 1) for i in range(EPOCHS)]
    assert all(r["energy_J"] > 0 for r in evals)
    for record in [r for r in records if r["event"] == "epoch"]:
        assert record["ledger"]["eval_J"] > 0  # the evaluation is inside the epoch, apart from its steps
    accuracies = [r["metrics"]["val/acc"] for r in records if r["event"] == "evaluate"]
    assert len(accuracies) == EPOCHS and accuracies[-1] == pytest.approx(result["val_acc"], rel=REL)


@pytest.mark.timeout(300)
def test_the_fabric_example_logs_its_run_and_hands_energy_to_fabrics_logger(tmp_path):
    result, records = run_example(tmp_path, "fabric_loop", "--log-dir", str(tmp_path / "runs"))
    check_run(result, records)
    scalars = read_scalars(tmp_path / "runs")
    epochs = [r for r in records if r["event"] == "epoch"]
    logged = [value for _, value in sorted(scalars["energy/epoch_J"])]
    assert logged == pytest.approx([r["energy_J"] for r in epochs], rel=1e-6)  # TensorBoard keeps float32
    assert scalars["energy/step_J"]  # the step reports reached the logger too


@pytest.mark.timeout(300)
def test_the_lightning_examples_log_dir_holds_both_its_logs_and_says_so(tmp_path):
    # An outside tester's case: --log-dir had no help text and moved TensorBoard's folder only, the
    # JSONL energy log staying in the config's logging.log_dir (here tmp_path/zeus_logs).
    config = tmp_path / "zeus.yaml"
    config.write_text(f"backend: virtual\nlogging: {{log_dir: {tmp_path / 'zeus_logs'}}}\n")
    out = tmp_path / "summary.json"
    script = str(ROOT / "examples" / "lightning_digits.py")
    command = [sys.executable, script, "--config", str(config), "--epochs", "1", "--batch-size", str(BATCH_SIZE),
               "--summary-json", str(out), "--log-dir", str(tmp_path / "runs")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, cwd=tmp_path, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    jsonl = Path(json.loads(out.read_text())["summary"]["jsonl_path"])
    assert jsonl.parent == tmp_path / "runs" and read_jsonl(jsonl)[-1]["event"] == "run_end"
    assert read_scalars(tmp_path / "runs" / "lightning_digits")["energy/epoch_J"]  # TensorBoard's, in the same folder
    assert not (tmp_path / "zeus_logs").exists()
    done = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S, cwd=tmp_path, env=env)  # fmt: skip
    help_text = " ".join(done.stdout.split())  # argparse wraps the lines
    assert done.returncode == 0 and "TensorBoard's (DIR/lightning_digits/) and the JSONL energy log" in help_text


@pytest.mark.timeout(300)
def test_a_log_dir_that_cannot_be_a_folder_is_one_line_before_training(tmp_path):
    # An outside tester's case: logging.log_dir under a file gave 8 frames of traceback in every example,
    # and validate-config called the file valid.
    (tmp_path / "afile").write_text("a file, not a folder")
    config = tmp_path / "zeus.yaml"
    config.write_text(f"backend: virtual\nlogging: {{log_dir: {tmp_path / 'afile' / 'sub'}}}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    command = [sys.executable, str(ROOT / "examples" / "raw_loop.py"), "--config", str(config), "--epochs", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, cwd=tmp_path, env=env)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    # One line naming the package once (it read "zeus-callbacks: [Errno 20] cannot write the zeus-callbacks
    # energy log ..."), with the errno, the directory and why.
    (said,) = [line for line in done.stderr.splitlines() if "cannot write" in line]
    directory = tmp_path / "afile" / "sub"
    why = f"[Errno {errno.ENOTDIR}] cannot write the energy log in {directory}: {os.strerror(errno.ENOTDIR)}"
    assert said == f"zeus-callbacks: {why}"
    assert "raw_loop: 1 epochs" not in done.stdout  # it stopped before training
    from zeus_callbacks.cli import main

    assert main(["validate-config", str(config)]) == 1
