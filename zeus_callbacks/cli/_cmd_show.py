"""``zeus-callbacks show STORE``: jobs, arms (posterior and measured cost), trials and profiles of a store."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from zeus_callbacks._terminal import fmt, table, wrap
from zeus_callbacks.optimizers.batch_size import BanditSettings, BatchSizeBandit
from zeus_callbacks.optimizers.batch_size._bandit_state import StoredState, read_state
from zeus_callbacks.reporting import is_energy_log, no_such_job, not_a_store_but_a_log
from zeus_callbacks.store import open_store
from zeus_callbacks.store._base import Store, TrialRecord, dead_trials


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``show`` and its options on the command's subparsers."""
    show = sub.add_parser("show", help="jobs, arms, trials and power-limit profiles of a store")
    show.add_argument("store", help="the SQLite or JSON store file, or a database URL (store.url)")
    show.add_argument("job", nargs="?", help="show this job only (as in plot bandit STORE JOB)")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print what the store ``args.store`` holds (``--json``: as one JSON object).

    Returns:
        0, or 1 when there is no such file, it is a JSONL energy log (``report`` reads those), or
        the store has no job ``args.job``.
    """
    if "://" not in args.store and not Path(args.store).exists():  # a database URL is opened, not stat'ed
        print(f"zeus-callbacks: no such store: {args.store}", file=sys.stderr)
        return 1
    if "://" not in args.store and is_energy_log(args.store):  # not a damaged store: nothing to move away
        print(f"zeus-callbacks: {not_a_store_but_a_log(args.store)}", file=sys.stderr)
        return 1
    try:
        print(show(args.store, as_json=args.json, job_id=args.job))  # a StoreError is reported by main()
    except KeyError as exc:
        print(f"zeus-callbacks: {exc.args[0]}", file=sys.stderr)
        return 1
    return 0


def _state(store: Store, job_id: str) -> StoredState | None:
    """The job's bandit state, checked (None before its first suggestion)."""
    stored = store.get_bandit(job_id)
    return read_state(stored.state, store.location, job_id) if stored is not None and stored.state else None


def arm_summaries(store: Store, job_id: str, state: StoredState | None) -> list[dict[str, Any]]:
    """Each arm's cost for one job of bandit state ``state``, as the model and as measured (empty: no observation).

    ``mean_cost``, ``std_cost`` and ``observations`` are the posterior's (the model's mean, its
    standard deviation and the effective, age-weighted number of observations); with one trial the
    posterior mean sits between that trial's cost and the prior. ``measured_mean_cost`` is the plain
    mean of the costs the bandit observed for the arm (completed and early-stopped trials; an
    early-stopped cost is its cost at the stop), over ``measured_trials`` trials; None without one.
    """
    if state is None:
        return []
    sizes = tuple(state.batch_sizes)
    bandit = BatchSizeBandit(store, job_id, BanditSettings(sizes, state.start))
    try:
        posteriors = bandit.posteriors(arms=sizes)
    except ValueError:  # no observation yet: no prior
        return []
    observed = {b: [cost for cost, _ in pairs] for b, pairs in bandit.observations().items()}
    survivors = set(state.survivors)
    failed = state.failed_arms
    return [
        {
            "batch_size": b,
            "mean_cost": p.mean,
            "std_cost": p.std,
            "observations": p.n,
            "measured_mean_cost": sum(observed[b]) / len(observed[b]) if observed.get(b) else None,
            "measured_trials": len(observed.get(b, [])),
            "survivor": b in survivors,
            "pruned_reason": failed.get(str(b)),
        }
        for b, p in sorted(posteriors.items())
    ]


def show(store_path: str | Path, *, as_json: bool = False, job_id: str | None = None) -> str:
    """Describe a store: jobs, the bandit's arms, trials and power-limit profiles.

    Args:
        store_path: The store file or database URL.
        as_json: One JSON object instead of tables.
        job_id: Only this job (and the power-limit profiles keyed by it); None: everything.

    Raises:
        StoreError: The file is not a store, is corrupt or is from a newer version.
        KeyError: ``job_id`` is not a job of the store (the message lists the jobs).
    """
    with open_store(store_path, read_only=True) as store:
        report: dict[str, Any] = {"store": str(store_path), "jobs": [], "profiles": {}}
        jobs = store.list_jobs()
        if job_id is not None:
            chosen = [job for job in jobs if job.job_id == job_id]
            if not chosen:
                raise KeyError(no_such_job(store_path, job_id, [job.job_id for job in jobs]))
            jobs = chosen
        for job in jobs:
            state = _state(store, job.job_id)
            trials = store.list_trials(job.job_id)
            dead = {t.trial_id: reason for t, reason in dead_trials(trials, store.lease_grace_s)}
            failed = {} if state is None else state.failed_arms  # batch size → why it was pruned for failing
            report["jobs"].append(
                {
                    "job_id": job.job_id,
                    "phase": state and state.phase,
                    "min_cost": state and state.min_cost,
                    "arms": arm_summaries(store, job.job_id, state),
                    "failed_arms": {str(int(b)): str(r) for b, r in sorted(failed.items(), key=lambda kv: int(kv[0]))},
                    "trials": [
                        {
                            "trial_id": t.trial_id,
                            "batch_size": t.batch_size,
                            "power_limit_W": t.power_limit_W,
                            "status": t.status,
                            # A withdrawn trial (a suggestion no run claimed) never ran, a running one has
                            # not ended: neither has a verdict yet.
                            "converged": None if t.status in ("withdrawn", "running") else t.converged,
                            "energy_J": t.energy_J,
                            "time_s": t.time_s,
                            "cost": t.cost,
                            "note": dead_note(t, dead.get(t.trial_id), store.lease_grace_s) or trial_note(t.info),
                        }
                        for t in trials
                    ],
                }
            )
        for key in store.list_profiles():
            if job_id is None or (_profile_fields(key) or {}).get("job_id") == job_id:
                report["profiles"][key] = store.get_profile(key)
    if as_json:
        return json.dumps(report, indent=2)
    out = [f"store {store_path}", f"{len(report['jobs'])} job(s), {len(report['profiles'])} power-limit profile(s)"]
    for job in report["jobs"]:
        out.append(f"\njob {job['job_id']}  phase {fmt(job['phase'])}  best converged cost {fmt(job['min_cost'])}")
        if job["arms"]:
            keys = ["batch_size", "mean_cost", "std_cost", "observations", "measured_mean_cost", "measured_trials"]
            arm_rows = [[a[k] for k in keys] + [a["survivor"]] for a in job["arms"]]
            for row in arm_rows:  # observations are a float in the posterior; whole counts read better
                row[3] = int(row[3]) if float(row[3]).is_integer() else row[3]
            # The bandit's posterior (its model) is named as such: with one trial its mean is not that trial's cost.
            # "measured trials": the trials whose cost the bandit observed, not every trial of the arm.
            headers = ["batch", "model mean", "model spread", "model n", "measured mean", "measured trials", "alive"]
            out.append(table(headers, arm_rows))
        for batch_size, reason in job["failed_arms"].items():
            out.append(f"batch size {batch_size} pruned: {reason}")
        trials = job["trials"]
        out.append(f"{len(trials)} trial(s)" + (" (last 10):" if len(trials) > 10 else ":"))
        rows = [list(t.values())[:-1] for t in trials[-10:]]  # a trial's fields but its note, in the headers' order
        if rows:
            out.append(table(["id", "batch", "limit_W", "status", "conv", "energy_J", "time_s", "cost"], rows))
        for t in trials[-10:]:  # why a figure is missing, under the table (a column would not fit a console)
            if t["note"]:
                out.append(wrap(f"trial {t['trial_id']}: {t['note']}", "    "))
    if report["profiles"]:
        out.append("\npower-limit profiles:")
    for key, profile in report["profiles"].items():
        fields = _profile_fields(key)
        key_text = key if fields is None else ", ".join(f"{name} {value}" for name, value in fields.items())
        out.append(wrap(key_text, "    "))
        out.append(f"    {_profile_text(profile)}")
    return "\n".join(out)


def dead_note(trial: TrialRecord, reason: str | None, lease_grace_s: float) -> str | None:
    """Why a trial still ``running`` in the store is dead, for ``show`` (None: not dead, as far as can be told).

    ``reason`` is :func:`~zeus_callbacks.store._base.dead_trials`'s. ``show`` opens the store read-only, so
    it only says so: the next run that opens the store for writing marks the trial failed.
    """
    if reason == "process died":
        return f"running (process {trial.pid} on this host is gone: the next run marks it failed)"
    if reason == "lease expired":
        return (
            f"running (no heartbeat from host {trial.host} for over {lease_grace_s:g} s: its lease expired, "
            "the next run marks it failed)"
        )
    return None


_RUN_ENDS = {
    "failed": "the run failed (its exception is in its JSONL log): counted against its batch size",
    "interrupted": "the run was interrupted (Ctrl-C, SIGTERM): not counted against its batch size",
}


def trial_note(info: dict[str, Any]) -> str | None:
    """Why a trial's energy or cost is missing, from its ``info`` (None: nothing is missing, or no reason kept).

    A run that did not complete says how it ended (``run_status``: failed or interrupted, and whether
    that counts against its batch size); a trial ended for it says why (``reason``: process died,
    withdrawn). A run whose energy was not measured says why (``energy_note``) and that its cost is
    not an observation (``not_observed``).
    """
    parts = [_RUN_ENDS.get(str(info.get("run_status")), ""), *(str(info.get(key) or "") for key in
             ("reason", "energy_note", "not_observed"))]  # fmt: skip
    return "; ".join(part for part in parts if part) or None


def _profile_fields(key: str) -> dict[str, Any] | None:
    """A profile key's fields (the power-limit profiler's keys are JSON, with ``job_id``); None: the simulator's."""
    try:
        fields = json.loads(key)
    except ValueError:
        return None
    return fields if isinstance(fields, dict) else None


def _profile_text(profile: Any) -> str:
    """How many limits a cached power-limit profile holds, their range and the chosen one (W)."""
    if not isinstance(profile, dict):
        return f"({type(profile).__name__})"
    limits = profile.get("limits_W")  # the simulator's profiles
    if limits is None and isinstance(profile.get("limits"), list):  # the power-limit profiler's
        limits = [r.get("limit_W") for r in profile["limits"] if isinstance(r, dict)]
    chosen = profile.get("chosen_limit_W", profile.get("best_W"))
    parts = []
    values = [float(v) for v in limits or [] if isinstance(v, (int, float))]
    if values:
        parts.append(f"{len(values)} limits, {min(values):g}–{max(values):g} W")
    parts.append("chosen " + (f"{chosen:g} W" if isinstance(chosen, (int, float)) else "none (observe only)"))
    return ", ".join(parts)
