"""CI: a plain install (core dependencies only) imports the package and runs a session.

With `pip install .` alone (no extras, no torch) import the package and every public name, and
run a short EnergySession on the virtual GPU, and create a SQLite store (its Alembic migrations
are package data: a wheel without them cannot create one).
"""

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import zeus_callbacks
from zeus_callbacks import EnergySession, ZeusCallbacksError, ZeusConfig, __all__, load_config  # noqa: F401
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend

for framework in ("torch", "lightning", "transformers", "accelerate", "matplotlib"):
    if importlib.util.find_spec(framework) is not None:
        sys.exit(f"core smoke: {framework} is installed; this check needs a venv with the core dependencies only")

for name in __all__:
    if name in ("ZeusCallback", "ZeusTrainerCallback"):
        try:
            getattr(zeus_callbacks, name)
        except ImportError as exc:  # the adapters need their framework: a clear message, not a traceback
            assert "pip install" in str(exc), exc
        else:
            sys.exit(f"core smoke: {name} imported without its framework")
    else:
        getattr(zeus_callbacks, name)

with tempfile.TemporaryDirectory() as tmp:
    clock = ManualClock(1_000.0)
    backend = VirtualGPUBackend(clock=clock, read_only=True)
    config = ZeusConfig.model_validate({"backend": "virtual", "logging": {"log_dir": tmp, "interval_steps": 5}})
    session = EnergySession(config, backend=backend)
    session.train_start(run_name="core-smoke")
    steps = 20
    for epoch in range(2):
        session.epoch_start(epoch)
        for step in range(epoch * steps, (epoch + 1) * steps):
            session.step_start(step)
            clock.advance(0.05)
            session.step_end(step, num_samples=32)
        session.epoch_end(epoch)
    summary = session.train_end()
    assert summary.steps == 2 * steps, summary
    assert summary.energy_J is not None and summary.energy_J > 0, summary
    logs = list(Path(tmp).glob("*.jsonl"))
    assert len(logs) == 1, logs
    events = [json.loads(line)["event"] for line in logs[0].read_text().splitlines()]
    assert events[0] == "run_start" and events[-1] == "run_end", events
    from zeus_callbacks.store import SCHEMA_VERSION, open_store

    with open_store(Path(tmp) / "zeus_store.sqlite") as store:
        store.create_trial("smoke", 8)
    with open_store(Path(tmp) / "zeus_store.sqlite", read_only=True) as store:
        assert [t.batch_size for t in store.list_trials("smoke")] == [8]
    import sqlite3

    conn = sqlite3.connect(Path(tmp) / "zeus_store.sqlite")
    assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == f"{SCHEMA_VERSION:04d}"
    conn.close()
print(
    f"core smoke: zeus-callbacks {zeus_callbacks.__version__} imported and ran {summary.steps} steps "
    f"({summary.energy_J:.1f} J, simulated) with the core dependencies only"
)
