"""What one lease renewal costs: a store opened per renewal, or one handle kept for them all.

The lease keeper (``zeus_callbacks/store/_lease.py``) renews the heartbeats of a process's running
trials every ``min(30 s, lease_grace_s / 5)``. Two ways to do one renewal, timed on the same store
holding ``--trials`` running trials of this process:

- ``reopen``: ``store.reopen()`` (a new connection, the schema check, the scan for dead trials),
  ``renew_leases``, ``close``: what the keeper did before it kept a handle;
- ``kept``: ``renew_leases`` on one store object opened once.

Then ``keeper``: the real keeper thread, run for ``--seconds`` at a short grace period
(``--grace-s``; one renewal every grace / 5) with the main thread asleep; it reports the renewals
made (counted through ``renew_leases``) and the process CPU time per renewal, so it measures
whichever way the installed code renews.

    PYTHONPATH=. python benchmarks/lease_renewal.py            # SQLite and JSON
    ZEUS_CALLBACKS_TEST_DB_URL=postgresql://... PYTHONPATH=. python benchmarks/lease_renewal.py

PostgreSQL runs when ``ZEUS_CALLBACKS_TEST_DB_URL`` names a server (the store uses that database).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from zeus_callbacks.store import Store, open_store
from zeus_callbacks.store._lease import KEEPER, lease_owner


def _percentiles_ms(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)
    return {
        "p50_ms": round(1e3 * statistics.median(ordered), 3),
        "p90_ms": round(1e3 * ordered[int(0.9 * (len(ordered) - 1))], 3),
    }


def direct(store: Store, ids: set[int], strategy: str, n: int) -> dict:
    """Time ``n`` renewals of ``ids`` the ``reopen`` or the ``kept`` way."""
    owner, samples = lease_owner(), []
    for _ in range(n):
        t0 = time.perf_counter()
        if strategy == "reopen":
            fresh = store.reopen()
            assert fresh is not None
            with fresh:
                kept = fresh.renew_leases(owner, ids)
        else:
            kept = store.renew_leases(owner, ids)
        samples.append(time.perf_counter() - t0)
        assert kept == ids, (kept, ids)
    return {"renewals": n, **_percentiles_ms(samples)}


def keeper(location: str, trials: int, grace_s: float, seconds: float) -> dict:
    """Run the real keeper thread for ``seconds`` on ``trials`` trials; CPU per renewal."""
    renewals = []
    with open_store(location, lease_grace_s=grace_s) as probe:
        cls = type(probe)  # the backend's class: count its renew_leases calls
    original = cls.renew_leases

    def counting(self, owner, trial_ids):
        renewals.append(time.monotonic())
        return original(self, owner, trial_ids)

    cls.renew_leases = counting  # type: ignore[method-assign]
    try:
        with open_store(location, lease_grace_s=grace_s) as store:
            made = [store.create_trial("bench-keeper", 8) for _ in range(trials)]  # held by the keeper
            cpu0, wall0 = time.process_time(), time.monotonic()
            time.sleep(seconds)
            cpu_s, wall_s = time.process_time() - cpu0, time.monotonic() - wall0
            count = sum(1 for t in renewals if t >= wall0)
            for trial in made:
                store.finish_trial(
                    trial.trial_id, status="completed", energy_J=1.0, time_s=1.0, cost=1.0, converged=True
                )
    finally:
        cls.renew_leases = original  # type: ignore[method-assign]
        KEEPER.release_all()
    return {"renewals": count, "wall_s": round(wall_s, 2), "cpu_ms_per_renewal": round(1e3 * cpu_s / max(count, 1), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=4, help="running trials held (default 4)")
    ap.add_argument("--renewals", type=int, default=300, help="renewals per direct strategy (default 300)")
    ap.add_argument("--seconds", type=float, default=3.0, help="how long the keeper runs (s, default 3)")
    ap.add_argument("--grace-s", type=float, default=0.1, help="lease grace of the keeper run (s, default 0.1)")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        locations = {"sqlite": str(Path(tmp) / "lease.sqlite"), "json": str(Path(tmp) / "lease.json")}
        if os.environ.get("ZEUS_CALLBACKS_TEST_DB_URL"):
            locations["postgresql"] = os.environ["ZEUS_CALLBACKS_TEST_DB_URL"]
        for backend, location in locations.items():
            with open_store(location) as store:
                ids = {store.create_trial("bench", 8, pid=os.getpid()).trial_id for _ in range(args.trials)}
                KEEPER.release_all()  # only this benchmark renews them
                for strategy in ("reopen", "kept"):
                    row = {"backend": backend, "strategy": strategy, **direct(store, ids, strategy, args.renewals)}
                    results.append(row)
                    print(json.dumps(row), flush=True)
            row = {
                "backend": backend,
                "strategy": "keeper",
                **keeper(location, args.trials, args.grace_s, args.seconds),
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
