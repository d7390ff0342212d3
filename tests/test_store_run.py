"""A run and its store: opened once and shared, and a store unreachable at run start never stops training.

- one open per run: the bandit's suggestion, its early-stop threshold, the trial's outcome and
  the power-limit profile cache (``cache_in: store``) share one store object, counted over real
  simulated recurrences (``suggest_batch_size()``, then the session) on SQLite, JSON and
  PostgreSQL (when ``ZEUS_CALLBACKS_TEST_DB_URL`` names a server);
- a database down at run start (a closed local port): the run trains at ``default_batch_size``
  with one warning naming the URL with its password masked, the profile cache misses instead of
  failing, the store is tried once (not again at each use), and the trial waits in a pending
  file that names the masked URL and holds no password.
"""

from __future__ import annotations

import json
import logging

import pytest

from tests.store_contract import new_location, require
from zeus_callbacks import simulate as sim
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.optimizers.batch_size import _batch_size_controller as recurring
from zeus_callbacks.session import EnergySession
from zeus_callbacks.store import open_store
from zeus_callbacks.store._json_store import JSONStore
from zeus_callbacks.store._sql_store import SQLStore


class _Opens:
    """Counts the writable store objects made, less the lease keeper's own (``reopen``: its handle per store)."""

    def __init__(self, monkeypatch, *classes) -> None:
        self.made = self.reopened = 0
        for cls in classes:
            self._wrap(monkeypatch, cls)

    def _wrap(self, monkeypatch, cls) -> None:
        init, reopen = cls.__init__, cls.reopen

        def counting_init(store, *args, **kwargs):
            self.made += not kwargs.get("read_only", False)
            init(store, *args, **kwargs)

        def counting_reopen(store):
            self.reopened += 1
            return reopen(store)

        monkeypatch.setattr(cls, "__init__", counting_init)
        monkeypatch.setattr(cls, "reopen", counting_reopen)

    @property
    def by_runs(self) -> int:
        return self.made - self.reopened


@pytest.mark.parametrize("kind", ["sqlite", "json", "postgresql"])
def test_each_run_opens_its_store_once_for_the_bandit_and_the_profile_cache(tmp_path, monkeypatch, kind):
    store_path = new_location(kind, tmp_path)
    opens = _Opens(monkeypatch, SQLStore, JSONStore)
    first, second = sim.simulate("A40", "squad", 2, power_limit="jit", batch_sizes=[32], store_path=store_path)
    # Recurrence 0 profiles and puts its profile; recurrence 1 reads it back: both through the run's store.
    assert (first.power_limit_source, second.power_limit_source) == ("profile", "cache")
    assert opens.by_runs == 2, (opens.made, opens.reopened)
    with open_store(store_path, read_only=True) as store:
        trials = store.list_trials()
        assert [t.status for t in trials] == ["completed", "completed"]
        assert len(store.list_profiles()) == 1


def test_a_database_down_at_run_start_trains_at_the_default_and_keeps_the_trial(tmp_path, monkeypatch, caplog):
    require("rdb-sqlite")  # SQLAlchemy
    pytest.importorskip("psycopg")
    attempts = []
    init = SQLStore.__init__

    def counting_init(store, *args, **kwargs):
        attempts.append(args[0] if args else kwargs["url"])
        init(store, *args, **kwargs)

    monkeypatch.setattr(SQLStore, "__init__", counting_init)
    url = "postgresql://user:pw@127.0.0.1:1/db"  # nothing listens on port 1
    cfg = {
        "backend": "virtual",
        "job_id": "nightly",
        "logging": {"log_dir": str(tmp_path / "logs"), "run_name": "r"},
        "store": {"url": url, "lock_timeout_s": 0.5},
        "batch_size": {"enabled": True, "batch_sizes": [16, 32, 64], "default_batch_size": 32},
        "power_limit": {"enabled": True, "cache_in": "store", "plot": False},
    }
    clock = ManualClock(1000.0)
    backend = VirtualGPUBackend(clock=clock, noise_W=0.0, read_only=False)
    session = EnergySession(cfg, backend=backend, is_main_process=True)
    with caplog.at_level(logging.WARNING):
        batch_size = session.suggest_batch_size()
        # Before, the warning said the trial "is kept in" the pending folder, where nothing was yet
        # (outside tester): it is written at the run's end, and the warning says so.
        assert not (tmp_path / "logs" / recurring.PENDING_DIR).exists()
        session.train_start()
        limiter = session.power_limiter
        step = 0
        while limiter.result is None and step < 400:  # profiles: the cache (the same store) misses
            session.step_start(step)
            clock.advance(0.25 * backend.step_time_factor(backend.power_limit_W(0)))
            session.step_end(step, num_samples=batch_size)
            step += 1
        summary = session.train_end()
    backend.close()
    pending = sorted((tmp_path / "logs" / recurring.PENDING_DIR).glob("*.json"))
    assert batch_size == 32 and summary.status == "completed" and summary.energy_J > 0
    assert limiter.result is not None and limiter.result.source == "profile"
    assert len(attempts) == 1  # one attempt per run: the cache and train end did not wait for it again
    start = [r.getMessage() for r in caplog.records if "without the bandit's suggestion" in r.getMessage()]
    assert len(start) == 1 and "user:***@127.0.0.1:1/db" in start[0] and "still failing" in start[0]
    assert f"at the run's end its trial is written to {tmp_path / 'logs' / recurring.PENDING_DIR} " in start[0]
    assert ":pw@" not in caplog.text
    assert len(pending) == 1 and ":pw@" not in pending[0].read_text()
    kept = json.loads(pending[0].read_text())
    assert (kept["store"], kept["trial_id"], kept["batch_size"], kept["job_id"]) == (
        "postgresql://user:***@127.0.0.1:1/db",
        None,
        32,
        "nightly",
    )
    assert kept["report"]["status"] == "completed" and kept["report"]["energy_J"] == pytest.approx(summary.energy_J)
