"""Restore paths that kill the process: SIGTERM (restored by the handler) and SIGKILL (next start)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.timeouts import CHILD_TIMEOUT_S
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.optimizers.power_limit import MARKER_NAME
from zeus_callbacks.session import EnergySession

ROOT = Path(__file__).resolve().parents[1]
ORIGINAL_W = 275.0

CHILD = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from zeus_callbacks.backends.base import ManualClock
    from zeus_callbacks.backends.virtual import VirtualGPUBackend
    from zeus_callbacks.session import EnergySession

    log_dir = Path(sys.argv[1])
    calls = log_dir / "setter_calls.txt"

    class Recording(VirtualGPUBackend):
        def _set_power_limit_W(self, index, limit_W):
            super()._set_power_limit_W(index, limit_W)
            with open(calls, "a") as fh:
                fh.write(f"{index} {limit_W}\\n")

    clock = ManualClock(1000.0)
    backend = Recording(clock=clock)
    backend.set_power_limit_W(0, ORIGINAL_W)
    config = {"backend": "virtual", "logging": {"log_dir": str(log_dir), "run_name": "child"},
              "power_limit": {"enabled": True, "warmup_steps": 0}}
    session = EnergySession(config, backend=backend, is_main_process=True)
    session.train_start()
    step = 0
    while backend.power_limit_W(0) == ORIGINAL_W:
        session.step_start(step)
        clock.advance(0.2)
        session.step_end(step, num_samples=8)
        step += 1
    print("CHANGED", backend.power_limit_W(0), flush=True)
    while True:
        time.sleep(0.05)
    """
).replace("ORIGINAL_W", repr(ORIGINAL_W))

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def start_child(tmp_path: Path) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("CHANGED"):
        proc.kill()
        raise AssertionError(f"child did not change the limit: {line!r} {proc.stderr.read()}")
    assert float(line.split()[1]) != ORIGINAL_W
    return proc


def test_sigterm_restores_the_original_limit_then_dies_by_sigterm(tmp_path):
    proc = start_child(tmp_path)
    assert (tmp_path / MARKER_NAME).exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=CHILD_TIMEOUT_S) == -signal.SIGTERM  # the default behaviour is kept
    calls = (tmp_path / "setter_calls.txt").read_text().split()
    assert float(calls[-1]) == ORIGINAL_W  # the last setter call put the original back
    assert not (tmp_path / MARKER_NAME).exists()


class SpyBackend(VirtualGPUBackend):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.calls: list[tuple[int, float]] = []

    def _set_power_limit_W(self, index: int, limit_W: float) -> None:
        self.calls.append((index, limit_W))
        super()._set_power_limit_W(index, limit_W)


def test_sigkill_leaves_the_marker_and_the_next_start_restores(tmp_path):
    proc = start_child(tmp_path)
    proc.kill()
    assert proc.wait(timeout=CHILD_TIMEOUT_S) == -signal.SIGKILL
    marker = json.loads((tmp_path / MARKER_NAME).read_text())
    name = marker["gpus"][0]["name"]
    assert marker["gpus"] == [{"index": 0, "uuid": None, "name": name, "original_limit_W": ORIGINAL_W}]

    # A fresh process: the virtual GPU's limit is whatever the kill left (here 150 W).
    backend = SpyBackend(clock=ManualClock(1000.0))
    backend.set_power_limit_W(0, 150.0)
    backend.calls.clear()
    session = EnergySession(
        {"backend": "virtual", "logging": {"log_dir": str(tmp_path), "run_name": "next"}},
        backend=backend,
        is_main_process=True,
    )
    session.train_start()
    assert backend.calls == [(0, ORIGINAL_W)]
    assert backend.power_limit_W(0) == ORIGINAL_W and session.power_limit_W == ORIGINAL_W
    assert not (tmp_path / MARKER_NAME).exists()
    session.train_end()


HF_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tests.integration.test_huggingface import make_trainer
    from zeus_callbacks import ZeusTrainerCallback
    from zeus_callbacks.backends.base import WallClock
    from zeus_callbacks.backends.virtual import VirtualGPUBackend

    tmp = Path(sys.argv[1])
    calls = tmp / "setter_calls.txt"

    class Recording(VirtualGPUBackend):
        def _set_power_limit_W(self, index, limit_W):
            super()._set_power_limit_W(index, limit_W)
            with open(calls, "a") as fh:
                fh.write(f"{index} {limit_W}\\n")

    backend = Recording(clock=WallClock(), read_only=False)
    backend.set_power_limit_W(0, ORIGINAL_W)
    config = {"backend": "virtual", "logging": {"log_dir": str(tmp / "zeus"), "run_name": "hf"},
              "power_limit": {"enabled": True, "warmup_steps": 0, "step_W": 100.0}}
    trainer = make_trainer(tmp, ZeusTrainerCallback(config, backend=backend), report_to="none", max_steps=50)
    model = trainer.model
    forward = model.forward
    count = {"n": 0}

    def failing_forward(input_ids=None, labels=None, **kwargs):
        count["n"] += 1
        if count["n"] == 6:
            assert backend.power_limit_W(0) != ORIGINAL_W, "the profiler should have changed the limit by now"
            raise RuntimeError("planted failure in a training step")
        return forward(input_ids=input_ids, labels=labels, **kwargs)

    model.forward = failing_forward
    trainer.train()
    """
).replace("ORIGINAL_W", repr(ORIGINAL_W))


def test_hf_exception_in_a_training_step_restores_at_exit(tmp_path):
    # HF has no exception hook: the exception leaves trainer.train() and the interpreter-exit
    # hook ends the run, which restores the limit and removes the marker.
    script = tmp_path / "hf_child.py"
    script.write_text(HF_CHILD)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    assert proc.returncode == 1 and "planted failure in a training step" in proc.stderr, proc.stderr[-2000:]
    calls = [float(x) for x in (tmp_path / "setter_calls.txt").read_text().split()[1::2]]
    assert len(set(calls)) >= 2 and calls[-1] == ORIGINAL_W
    assert not (tmp_path / "zeus" / MARKER_NAME).exists()


LINGERING = textwrap.dedent(
    """
    import os, signal, sys
    import lightning.pytorch as L
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from zeus_callbacks.backends.base import ManualClock
    from zeus_callbacks.backends.virtual import VirtualGPUBackend
    from zeus_callbacks.session import EnergySession

    log_dir = sys.argv[1]
    # A run left open (never ended): its cleanup keeps our SIGTERM handler installed over the default.
    left = EnergySession({"backend": "virtual", "logging": {"log_dir": log_dir, "run_name": "left"}},
                         backend=VirtualGPUBackend(clock=ManualClock(1000.0)), is_main_process=True)
    left.train_start()
    assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)

    class Stops(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            if self.global_step == 3:
                os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's preemption: Lightning stops at its next check
            x, y = batch
            return nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=log_dir)
    ended = "normally"
    try:
        trainer.fit(Stops(), data)
    except BaseException as exc:  # Lightning stops the fit at its next check (SIGTERMException, or an exit)
        ended = type(exc).__name__
    print("FIT ENDED", ended, "RECEIVED", trainer.received_sigterm, flush=True)
    """
)


def test_a_handler_left_by_an_open_run_leaves_a_sigterm_to_lightning_instead_of_killing_the_process(tmp_path):
    # Lightning composes its SIGTERM handler with the one installed before it. Ours, left by a run that was
    # never ended, then ran under Lightning's and took the default action: the process died of SIGTERM (a
    # pytest worker crashed on it) where Lightning alone stops the fit at its next check.
    script = tmp_path / "child.py"
    script.write_text(LINGERING)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
        timeout=CHILD_TIMEOUT_S, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # not -SIGTERM: the process lived on
    assert "FIT ENDED" in done.stdout and "RECEIVED True" in done.stdout  # Lightning's handler saw it too
    assert "zeus-callbacks: SIGTERM: ending the energy log" in done.stderr  # our cleanup ran first
    records = [json.loads(line) for line in (tmp_path / "left.jsonl").read_text().splitlines()]
    assert records[-1]["event"] == "run_end"  # the open run was ended by it, nothing lost
