"""Store concurrency benchmark: N processes record recurrences into one store at once.

Each process opens the store and records ``--recurrences`` recurrences the way the batch-size
bandit does: *suggest* (an atomic bandit update that picks an arm), *create* (the running
trial), *finish* (its outcome) and *update* (a second bandit update that observes the cost).
All processes start together (a barrier). Per backend and process count it prints the trials
lost (created minus found completed: must be 0), bandit updates lost (must be 0), errors,
and p50 / p99 latency (ms) of each operation, then one JSON line.

A second part (``--nodes``, PostgreSQL) runs two "nodes" (processes with different host
names) on one store: node a starts a trial and is SIGKILLed; node b opens the store every
0.1 s and reports how long after the kill it saw the trial marked failed (lease expired).

    python benchmarks/store_concurrency.py [--procs 16,64] [--recurrences 5] [--backends sqlite,json,postgresql]
                                           [--db-url postgresql://user:pw@host/db] [--nodes]

``--db-url`` (default ``$ZEUS_CALLBACKS_TEST_DB_URL``) is a server where the user may CREATE
DATABASE: each run gets a fresh database (``. .ci/postgres.sh`` starts a throw-away one).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import socket
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from zeus_callbacks.store import BanditState, open_store

OPS = ("open", "suggest", "create", "finish", "update")
_CTX = multiprocessing.get_context("fork")
JOB = "bench"


def _suggest(state: BanditState, worker: int) -> tuple[BanditState, int]:
    arms = {int(k): dict(v) for k, v in state.arms.items()} or {b: {"n": 0, "cost": 0.0} for b in (32, 64, 128, 256)}
    batch_size = min(arms, key=lambda b: (arms[b]["n"], b))  # least-tried arm, as a round-robin exploration
    arms[batch_size]["n"] += 1
    suggested = state.state.get("suggested", 0) + 1
    return BanditState(state.job_id, {**state.state, "suggested": suggested}, arms), batch_size


def _observe(state: BanditState, batch_size: int, cost: float) -> tuple[BanditState, None]:
    arms = {int(k): dict(v) for k, v in state.arms.items()}
    arms[batch_size]["cost"] += cost
    return BanditState(state.job_id, {**state.state, "observed": state.state.get("observed", 0) + 1}, arms), None


def _recorder(location: str, worker: int, recurrences: int, barrier, results) -> None:
    times: dict[str, list[float]] = {op: [] for op in OPS}
    errors: list[str] = []
    created = 0
    try:
        barrier.wait(120)
        t0 = time.perf_counter()
        store = open_store(location)
        times["open"].append(time.perf_counter() - t0)
        for i in range(recurrences):
            try:
                t0 = time.perf_counter()
                batch_size = store.update_bandit(JOB, lambda s: _suggest(s, worker))
                t1 = time.perf_counter()
                trial = store.create_trial(JOB, batch_size, 250.0, info={"worker": worker, "i": i})
                created += 1
                t2 = time.perf_counter()
                cost = float(batch_size) * (1.0 + 0.01 * worker)
                store.finish_trial(
                    trial.trial_id, status="completed", energy_J=cost, time_s=1.0, cost=cost, converged=True
                )
                t3 = time.perf_counter()
                store.update_bandit(JOB, lambda s, b=batch_size, c=cost: _observe(s, b, c))
                t4 = time.perf_counter()
                for op, dt in zip(OPS[1:], (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                    times[op].append(dt)
            except Exception as exc:  # count it and go on: the benchmark measures errors too
                errors.append(f"{type(exc).__name__}: {exc}")
        store.close()
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    results.put({"worker": worker, "times": times, "errors": errors, "created": created})


def _fresh_location(backend: str, workdir: Path, db_url: str | None, tag: str) -> str:
    if backend in ("sqlite", "json"):
        return str(workdir / f"{tag}.{backend}")
    if not db_url:
        raise SystemExit("postgresql needs --db-url or ZEUS_CALLBACKS_TEST_DB_URL (. .ci/postgres.sh starts one)")
    import sqlalchemy as sa

    from zeus_callbacks.store._sql_store import _with_installed_driver

    url = _with_installed_driver(sa.engine.make_url(db_url))
    database = f"zc_bench_{tag}_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {database}"))
    engine.dispose()
    return url.set(database=database).render_as_string(hide_password=False)


def run(backend: str, procs: int, recurrences: int, workdir: Path, db_url: str | None) -> dict:
    """One backend at one process count; returns its row."""
    location = _fresh_location(backend, workdir, db_url, f"{backend}{procs}")
    barrier, results = _CTX.Barrier(procs), _CTX.Queue()
    workers = [_CTX.Process(target=_recorder, args=(location, w, recurrences, barrier, results)) for w in range(procs)]
    start = time.perf_counter()
    for p in workers:
        p.start()
    reports = [results.get(timeout=600) for _ in workers]
    for p in workers:
        p.join(60)
    wall_s = time.perf_counter() - start
    with open_store(location) as store:
        trials = store.list_trials(JOB)
        bandit = store.get_bandit(JOB)
    created = sum(r["created"] for r in reports)
    completed = sum(t.status == "completed" for t in trials)
    expected = procs * recurrences
    observed = 0 if bandit is None else int(bandit.state.get("observed", 0))
    row = {
        "backend": backend,
        "procs": procs,
        "recurrences": expected,
        "trials_lost": created - completed,
        "trials_missing": expected - completed,
        "bandit_updates_lost": sum(len(r["times"]["update"]) for r in reports) - observed,
        "errors": sum(len(r["errors"]) for r in reports),
        "exit_codes_nonzero": sum(p.exitcode != 0 for p in workers),
        "wall_s": round(wall_s, 2),
    }
    for op in OPS:
        samples_ms = np.array([t for r in reports for t in r["times"][op]]) * 1e3
        row[f"{op}_p50_ms"] = round(float(np.percentile(samples_ms, 50)), 1) if samples_ms.size else None
        row[f"{op}_p99_ms"] = round(float(np.percentile(samples_ms, 99)), 1) if samples_ms.size else None
    row["first_errors"] = [e for r in reports for e in r["errors"]][:3]
    return row


def _node_a(location: str, grace_s: float, ready) -> None:
    socket.gethostname = lambda: "node-a"  # a different node than the parent
    store = open_store(location, lease_grace_s=grace_s)
    store.create_trial(JOB, 64)
    ready.set()
    time.sleep(3600)


def two_nodes(location: str, grace_s: float) -> dict:
    """Node a dies mid-trial; how long until node b's opens mark it failed."""
    ready = _CTX.Event()
    proc = _CTX.Process(target=_node_a, args=(location, grace_s, ready))
    proc.start()
    ready.wait(60)
    time.sleep(2 * grace_s)  # alive past the grace period: its heartbeats keep the trial running
    with open_store(location, lease_grace_s=grace_s) as store:
        alive_status = store.list_trials(JOB)[-1].status
    os.kill(proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    proc.join()
    while True:
        with open_store(location, lease_grace_s=grace_s) as store:
            trial = store.list_trials(JOB)[-1]
        if trial.status != "running" or time.monotonic() - killed > 10 * grace_s:
            break
        time.sleep(0.1)
    return {
        "grace_s": grace_s,
        "status_while_alive": alive_status,
        "status_after_kill": trial.status,
        "reason": trial.info.get("reason"),
        "detected_after_kill_s": round(time.monotonic() - killed, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", default="16,64")
    parser.add_argument("--recurrences", type=int, default=5)
    parser.add_argument("--backends", default="sqlite,json,postgresql")
    parser.add_argument("--db-url", default=os.environ.get("ZEUS_CALLBACKS_TEST_DB_URL"))
    parser.add_argument("--nodes", action="store_true", help="also the two-node lease-expiry run (PostgreSQL)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            for procs in (int(p) for p in args.procs.split(",")):
                row = run(backend, procs, args.recurrences, Path(tmp), args.db_url)
                rows.append(row)
                print(
                    f"{backend:10s} {procs:3d} procs: lost {row['trials_lost']} trials, "
                    f"{row['bandit_updates_lost']} bandit updates, {row['errors']} errors, {row['wall_s']} s; "
                    + ", ".join(f"{op} {row[f'{op}_p50_ms']}/{row[f'{op}_p99_ms']}" for op in OPS)
                    + " ms (p50/p99)",
                    flush=True,
                )
        nodes = None
        if args.nodes:
            nodes = two_nodes(_fresh_location("postgresql", Path(tmp), args.db_url, "nodes"), grace_s=2.0)
            print(f"two nodes: {nodes}")
    print(json.dumps({"rows": rows, "two_nodes": nodes}))


if __name__ == "__main__":
    main()
