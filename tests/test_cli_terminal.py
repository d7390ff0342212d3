"""What the command writes to a terminal: progress bars only on a TTY, pure ``--json``, 80-column tables."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

from tests.timeouts import CHILD_TIMEOUT_S
from zeus_callbacks._terminal import TERMINAL_COLUMNS
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.cli import main
from zeus_callbacks.optimizers.power_limit import ProfileKey
from zeus_callbacks.reporting import read_jsonl
from zeus_callbacks.session import EnergySession
from zeus_callbacks.store.profile_cache import StoreProfileCache

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
SIMULATE = ["simulate", "--gpu", "V100", "--workload", "cifar100", "--recurrences", "3"]
PROFILE = ["profile-kernel", "matmul", "--size", "64", "--dtype", "fp32", "--backend", "virtual",
           "--max-time", "0.6", "--min-time", "0.5"]  # fmt: skip


def _command(args: list[str], cwd: Path, *, tty_stderr: bool) -> tuple[int, str, str]:
    """Run ``zeus-callbacks ARGS``; stdout is a pipe, stderr a pseudo-terminal (80x24) or a pipe."""
    cmd = [sys.executable, "-m", "zeus_callbacks.cli", *args]
    if not tty_stderr:
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=ENV, timeout=CHILD_TIMEOUT_S)
        return done.returncode, done.stdout, done.stderr
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, TERMINAL_COLUMNS, 0, 0))
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the child closed its end
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, cwd=cwd, env=ENV, text=True)
    os.close(slave)
    out, _ = proc.communicate(timeout=CHILD_TIMEOUT_S)
    reader.join(timeout=10)
    os.close(master)
    return proc.returncode, out, b"".join(chunks).decode("utf-8", "replace")


def test_simulate_shows_a_bar_on_a_terminal_and_only_there(tmp_path):
    code, out, err = _command(SIMULATE, tmp_path, tty_stderr=True)
    assert code == 0 and "recurrences:" in err and "/3 [" in err, err  # the bar, out of 3 recurrences
    assert "3 recurrence(s)" in out and "recurrences:" not in out
    code, out, err = _command(SIMULATE, tmp_path, tty_stderr=False)
    assert code == 0 and "3 recurrence(s)" in out and err == ""
    code, out, err = _command([*SIMULATE, "--no-progress"], tmp_path, tty_stderr=True)
    assert code == 0 and "recurrences:" not in err and "3 recurrence(s)" in out


def test_simulate_json_is_pure_json_and_never_draws_a_bar(tmp_path):
    code, out, err = _command([*SIMULATE, "--json"], tmp_path, tty_stderr=True)
    assert code == 0 and "recurrences:" not in err
    runs = [json.loads(line) for line in out.splitlines()]
    assert [r["index"] for r in runs] == [0, 1, 2] and all(r["energy_J"] > 0 for r in runs)


def test_profile_kernel_bar_on_a_terminal_and_pure_json_to_stdout(tmp_path):
    code, out, err = _command(PROFILE, tmp_path, tty_stderr=True)
    assert code == 0 and "measuring:" in err and "energy/execution" in out
    code, out, err = _command(PROFILE, tmp_path, tty_stderr=False)
    assert code == 0 and "measuring:" not in err and "energy/execution" in out
    code, out, err = _command([*PROFILE, "--json"], tmp_path, tty_stderr=True)
    assert code == 0 and "measuring:" not in err
    result = json.loads(out)
    assert result["executions_used"] > 0 and len(result["power_W"]) == len(result["time_s"])
    code, out, err = _command([*PROFILE, "--no-progress"], tmp_path, tty_stderr=True)
    assert code == 0 and "measuring:" not in err and "energy/execution" in out


def _assert_fits(text: str) -> None:
    wide = [line for line in text.splitlines() if len(line) > TERMINAL_COLUMNS]
    assert not wide, wide


@pytest.fixture
def power_limit_run(tmp_path, manual_clock) -> Path:
    """A run log with epochs and a power-limit profile, from a real session on a writable virtual GPU."""
    backend = VirtualGPUBackend(clock=manual_clock, noise_W=0.0, read_only=False)
    config = {
        "logging": {"log_dir": str(tmp_path), "run_name": "a-rather-long-run-name-for-the-report-header"},
        "power_limit": {"enabled": True, "warmup_steps": 0, "min_profile_steps": 2, "profile_steps": 3,
                        "step_W": 100.0, "cache": False, "plot": False},
    }  # fmt: skip
    session = EnergySession(config, backend=backend)
    session.train_start()
    for epoch in range(3):
        session.epoch_start(epoch)
        for step in range(70 * epoch, 70 * (epoch + 1)):
            session.step_start(step)
            manual_clock.advance(0.2)
            session.sampler.poll_once()
            session.step_end(step, num_samples=8)
        session.epoch_end(epoch)
    session.train_end()
    backend.close()
    return tmp_path / "a-rather-long-run-name-for-the-report-header.jsonl"


def test_tables_fit_80_columns(tmp_path, capsys, power_limit_run, monkeypatch):
    monkeypatch.chdir(tmp_path)  # file names as a user types them; a long path is the user's own line
    store = Path("store.sqlite")
    assert main([*SIMULATE[:-1], "12", "--power-limit", "jit", "--store", str(store), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.count("converged") + out.count("early_stopped") >= 12
    _assert_fits(out)
    # A profile of the real power-limit profiler, cached in the store under its JSON key.
    record = next(r for r in read_jsonl(power_limit_run) if r["event"] == "power_limit_profile")
    assert record["chosen_limit_W"] is not None and len(record["limits"]) > 1
    key = ProfileKey("a-long-job-id/for/the-show-table", "Virtual A40 (zeus_nsdi23 imagenet/resnet50 bs 256)", 256, 1,
                     "cost")  # fmt: skip
    StoreProfileCache(store).put(key, {"chosen_limit_W": record["chosen_limit_W"], "limits": record["limits"]})
    assert main(["show", str(store)]) == 0
    out = capsys.readouterr().out
    assert "model mean" in out and "measured mean" in out and "trial(s)" in out and "power-limit profiles" in out
    assert f"chosen {record['chosen_limit_W']:g} W" in out
    _assert_fits(out)
    assert main(["report", power_limit_run.name]) == 0
    out = capsys.readouterr().out
    said = " ".join(out.split())  # the line is wrapped at 80 columns
    assert f"power limit {record['chosen_limit_W']:.1f} W chosen by profiling, in force from step" in said
    assert len([line for line in out.splitlines() if line.split()[0] in ("0", "1", "2")]) == 3  # one per epoch
    _assert_fits(out)


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path):
    # `zeus-callbacks simulate --json | head -1`: the lines are flushed one by one, so the second write hits a
    # closed pipe.
    cmd = [sys.executable, "-m", "zeus_callbacks.cli", *SIMULATE, "--json", "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, env=ENV, text=True)
    first = json.loads(proc.stdout.readline())
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=CHILD_TIMEOUT_S)
    assert first["index"] == 0 and proc.returncode == 1 and "Traceback" not in err and "BrokenPipe" not in err


def test_a_table_is_plain_ascii_right_aligned_with_a_rule_under_its_headers():
    from zeus_callbacks._terminal import table

    text = table(["batch", "cost", "alive"], [[256, 1234.5, True], [8, None, False]])
    assert text.splitlines() == [
        "batch    cost  alive",
        "----- ------- ------",
        "  256  1234.5   True",
        "    8       -  False",
    ]
    assert text.isascii()  # no box-drawing characters, no colour codes
