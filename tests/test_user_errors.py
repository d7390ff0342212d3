"""Mistakes a user makes, each with a clear message and no lost data."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.timeouts import CHILD_TIMEOUT_S
from zeus_callbacks import ConfigError
from zeus_callbacks.cli import main as cli
from zeus_callbacks.config import load_config, parse_config
from zeus_callbacks.reporting import JsonlWriter, read_jsonl
from zeus_callbacks.session import EnergySession


def test_two_runs_with_one_name_get_their_own_logs(tmp_path, virtual_backend):
    config = {"logging": {"log_dir": str(tmp_path), "run_name": "nightly"}}
    first, second = EnergySession(config, backend=virtual_backend), EnergySession(config, backend=virtual_backend)
    first.train_start()
    second.train_start()  # started while the first is still running
    first.train_end()
    second.train_end()
    assert {first.run_name, second.run_name} == {"nightly", "nightly-1"}
    for session in (first, second):
        records = read_jsonl(tmp_path / f"{session.run_name}.jsonl")
        assert [r["event"] for r in records].count("run_start") == 1
        assert records[0]["run_name"] == session.run_name


def test_unknown_virtual_workload_fails_at_validation():
    with pytest.raises(ConfigError, match=r"virtual\.workload: .*unknown workload 'mnist'.*imagenet"):
        parse_config({"virtual": {"workload": "mnist"}})


def test_yaml_errors_name_the_file(tmp_path):
    bad = tmp_path / "zeus.yaml"
    bad.write_text("logging:\n  interval_steps: [1\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert str(bad) in str(info.value) and "zeus.yaml" in str(info.value).split("not valid YAML", 1)[1]
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(ConfigError, match="not a text"):
        load_config(binary)


@pytest.mark.parametrize(
    "content",
    [None, b"\x89PNG\r\n\x1a\n\x00", b"[1, 2]\n[3]\n", b'{"no_event": 1}\n', b"just text\nmore text\n"],
    ids=["folder", "binary", "json-lists", "no-event", "text"],
)
def test_report_refuses_what_is_not_an_energy_log(tmp_path, capsys, content):
    path = tmp_path / "x.jsonl"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    assert cli(["report", str(path)]) == 1
    err = capsys.readouterr().err
    assert "not a zeus-callbacks energy log" in err and "Traceback" not in err


def test_callback_import_without_its_framework_says_what_to_install(tmp_path):
    code = textwrap.dedent(
        """
        import sys
        sys.modules["lightning"] = None  # as if PyTorch Lightning were not installed
        try:
            from zeus_callbacks import ZeusCallback
        except ImportError as exc:
            print(exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    assert "ZeusCallback needs PyTorch Lightning" in done.stdout
    assert "pip install 'zeus-callbacks[lightning]'" in done.stdout


def test_a_named_backend_that_is_missing_fails_before_training(tmp_path, monkeypatch):
    import lightning.pytorch as L

    from tests.fakes.fake_pynvml import FakePyNVML
    from zeus_callbacks import ZeusCallback
    from zeus_callbacks.backends import BackendUnavailable

    monkeypatch.setitem(sys.modules, "pynvml", FakePyNVML(num_gpus=0))
    callback = ZeusCallback({"backend": "nvml", "logging": {"log_dir": str(tmp_path)}})

    class Model(L.LightningModule):
        def training_step(self, batch, batch_idx):
            raise AssertionError("training must not start")

        def configure_optimizers(self):
            return None

    trainer = L.Trainer(accelerator="cpu", callbacks=[callback], logger=False, enable_progress_bar=False)
    with pytest.raises(BackendUnavailable, match="backend: auto"):
        trainer.fit(Model(), [0])


SIGTERM_SCRIPT = """
import sys, time
from zeus_callbacks.session import EnergySession
session = EnergySession({"backend": "virtual", "logging": {"log_dir": sys.argv[1], "run_name": "killed",
                                                            "interval_steps": 2}})
session.train_start()
session.epoch_start(0)
step = 0
while True:
    session.step_start(step)
    time.sleep(0.01)
    session.step_end(step)
    step += 1
"""


def test_sigterm_ends_the_log_and_still_kills_the_process(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", SIGTERM_SCRIPT, str(tmp_path)])
    log = tmp_path / "killed.jsonl"
    deadline = time.monotonic() + CHILD_TIMEOUT_S  # a hang guard: start-up is slow under load
    while time.monotonic() < deadline and not (log.exists() and '"steps"' in log.read_text()):
        time.sleep(0.05)
    assert log.exists(), "the run never started"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=CHILD_TIMEOUT_S) == -signal.SIGTERM  # the default action still happens
    records = read_jsonl(log)
    assert records[-1]["event"] == "run_end" and records[-1]["status"] == "interrupted"
    assert records[-1]["steps"] >= 2 and records[-1]["energy_J"] > 0


def test_a_record_written_by_a_signal_handler_in_the_middle_of_a_write_is_kept(tmp_path):
    # The SIGTERM test failed once in a full run: its handler wrote run_end while the main thread was flushing
    # the same log, the buffered file refused the re-entry (RuntimeError: reentrant call inside BufferedWriter)
    # and the log ended at the record before. The fake refuses a re-entered write as io's buffer does.
    writer = JsonlWriter(tmp_path, "run")
    real = writer._file

    class RefusesReentry:
        inside = False

        def write(self, text):
            if self.inside:
                raise RuntimeError("reentrant call inside <_io.BufferedWriter name='run.jsonl'>")
            return real.write(text)

        def flush(self):
            self.inside = True
            try:
                writer.write({"event": "run_end", "status": "interrupted"})  # the handler, mid-flush
                real.flush()
            finally:
                self.inside = False

        def __getattr__(self, name):
            return getattr(real, name)

    writer._file = RefusesReentry()
    writer.write({"event": "steps", "steps": 2})
    writer._file = real
    writer.close()
    assert sorted(r["event"] for r in read_jsonl(writer.path)) == ["run_end", "steps"]  # both whole


def test_report_of_a_run_end_that_lacks_fields_shows_dashes(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text('{"event": "run_end", "run_name": "r", "energy_J": 12.5}\n{"event": "epoch", "epoch": 0}\n')
    assert cli(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "run r (-)" in out and "energy 12.5 J (0.00347 Wh) over - s" in out
    assert "lacks status, time_s, steps" in out and "power limit - W" in out
    assert out.strip().splitlines()[-1].split() == ["0", "-", "n/a", "-", "-"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a read-only file anyway")
def test_a_read_only_store_refuses_to_start_saying_what_to_do(tmp_path, virtual_backend):
    from zeus_callbacks.store import StoreError, open_store

    path = tmp_path / "store.sqlite"
    with open_store(path) as store:
        store.create_trial("job", 8)
    path.chmod(0o444)
    before = path.read_bytes()
    config = {
        "backend": "virtual",
        "logging": {"log_dir": str(tmp_path / "logs"), "run_name": "r"},
        "store": {"path": str(path)},
        "batch_size": {"enabled": True, "batch_sizes": [8, 16]},
    }
    session = EnergySession(config, backend=virtual_backend, is_main_process=True)
    with pytest.raises(StoreError, match=r"is not writable .*store\.path to another file"):
        session.train_start()
    assert path.read_bytes() == before and not session.started


LIGHTNING_SIGTERM_SCRIPT = """
import sys, time, torch, lightning.pytorch as L
from pathlib import Path
from torch.utils.data import DataLoader, TensorDataset

class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        time.sleep(0.01)
        if batch_idx == 5:
            (Path(sys.argv[1]) / "training").write_text("steps run")
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), 0.1)

callbacks = []
if sys.argv[2] == "with":
    from zeus_callbacks.integrations.lightning import ZeusCallback
    callbacks = [ZeusCallback({"backend": "virtual", "logging": {"log_dir": sys.argv[1], "run_name": "killed"}})]
trainer = L.Trainer(max_epochs=1, callbacks=callbacks, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
try:
    trainer.fit(Model(), DataLoader(TensorDataset(torch.randn(40000, 4)), batch_size=4))
finally:
    if callbacks:  # what a user reads from the callback after the run
        s = callbacks[0].summary
        (Path(sys.argv[1]) / "summary").write_text("none" if s is None else f"{s.status} {s.steps}")
"""


def test_lightning_sigterm_exit_status_is_lightnings(tmp_path):
    statuses = {}
    for mode in ("without", "with"):
        folder = tmp_path / mode
        folder.mkdir()
        process = subprocess.Popen(
            [sys.executable, "-c", LIGHTNING_SIGTERM_SCRIPT, str(folder), mode],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + CHILD_TIMEOUT_S  # a hang guard: start-up is slow under load
        while time.monotonic() < deadline and not (folder / "training").exists():
            time.sleep(0.05)
        assert (folder / "training").exists(), f"{mode}: training never started"
        process.send_signal(signal.SIGTERM)
        statuses[mode] = process.wait(timeout=CHILD_TIMEOUT_S)
    # Lightning's SIGTERMException is a SystemExit without a code: the callback must not change that
    assert statuses["with"] == statuses["without"] == 0
    records = read_jsonl(tmp_path / "with" / "killed.jsonl")
    assert records[-1]["event"] == "run_end" and records[-1]["status"] == "interrupted"
    # The session ended the run inside the SIGTERM handler; the callback still hands its summary over.
    assert (tmp_path / "with" / "summary").read_text() == f"interrupted {records[-1]['steps']}"


@pytest.mark.parametrize(
    ("example", "config", "message"),
    [
        (
            "lightning_digits.py",
            "logging:\n  interval_stepz: 3\n",
            "logging.interval_stepz: Extra inputs are not permitted",
        ),
        ("hf_text.py", None, "configuration file not found"),
    ],
)
def test_the_examples_reject_a_bad_config_in_one_message(tmp_path, example, config, message):
    """A typo'd or missing --config stops the example before training: a usage error, no traceback."""
    from pathlib import Path

    path = tmp_path / "zeus.yaml"
    if config is not None:
        path.write_text(config)
    script = Path(__file__).resolve().parents[1] / "examples" / example
    done = subprocess.run([sys.executable, str(script), "--config", str(path)], capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{example}: error: --config: " in done.stderr and message in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()  # nothing trained, no log written


def test_the_lightning_example_reports_an_unopenable_store_in_one_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    config = tmp_path / "zeus.yaml"
    config.write_text(
        "backend: virtual\n"
        f"logging: {{log_dir: {tmp_path / 'logs'}}}\n"
        f"store: {{path: {tmp_path}}}\n"  # a directory: not a store file
        "batch_size: {enabled: true, batch_sizes: [16, 32], default_batch_size: 16}\n"
    )
    example = Path(__file__).resolve().parents[1] / "examples" / "lightning_digits.py"
    done = subprocess.run(
        [sys.executable, str(example), "--epochs", "1", "--config", str(config), "--log-dir", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("zeus-callbacks: ")
