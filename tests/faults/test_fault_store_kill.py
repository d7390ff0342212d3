"""SIGKILL at random points while a store is written: every store still opens and holds every record committed.

One forked child per trial opens the store and writes in a loop (create, finish, profile,
bandit update); after each write *returns* it reports the record on a pipe. The parent
kills it (SIGKILL) after a seeded random delay counted from the fork, the store's open or the
writer's first committed write, reaps it, reopens the store and checks
each reported record. A fresh store file every ``TRIALS_PER_FILE`` kills makes some
kills land while the file is being created.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time

import pytest

from tests.store_contract import FAULT_KINDS, _open, exists, new_location
from zeus_callbacks.store import BanditState

KILLS_PER_BACKEND = 125  # five store files of 25 kills each; 200 took ~160 s a backend of a loaded CI machine
TRIALS_PER_FILE = 25
MAX_DELAY_S = 0.008
JOB = "killed"

pytestmark = pytest.mark.skipif(sys.platform == "win32" or not hasattr(os, "fork"), reason="POSIX fork and signals")


def _bump(state: BanditState) -> tuple[BanditState, int]:
    count = int(state.state.get("count", 0)) + 1
    return BanditState(state.job_id, {"count": count}, {8: {"n": count}}), count


def _writer(kind: str, path: str, kill_no: int, wfd: int) -> None:
    """Child body: write forever, reporting each write after it returned. Never returns."""
    code = 0
    try:
        store = _open(kind, path)
        os.write(wfd, b"O\n")
        i = 0
        while True:
            trial = store.create_trial(JOB, batch_size=8 + i % 4, power_limit_W=200.0, info={"kill": kill_no, "i": i})
            os.write(wfd, f"T {trial.trial_id}\n".encode())
            store.finish_trial(
                trial.trial_id, status="completed", energy_J=float(i), time_s=1.0, cost=float(i), converged=True
            )
            os.write(wfd, f"F {trial.trial_id} {i}\n".encode())
            if i % 3 == 0:
                store.put_profile(f"k{kill_no}", {"i": i, "limits_W": list(range(100, 300, 5))})
                os.write(wfd, f"P {i}\n".encode())
            if i % 4 == 1:
                count = store.update_bandit(JOB, _bump)
                os.write(wfd, f"B {count}\n".encode())
            i += 1
    except BaseException as exc:  # report it: the parent fails the trial
        os.write(wfd, f"E {type(exc).__name__}: {exc}".replace("\n", " ").encode() + b"\n")
        code = 3
    finally:
        os._exit(code)


def _kill_one(kind: str, path: str, kill_no: int, delay_s: float, start: str) -> list[str]:
    """Fork a writer, SIGKILL it ``delay_s`` after ``start``: the fork, its store open, or its first write."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(rfd)
        _writer(kind, path, kill_no, wfd)
    os.close(wfd)
    chunks = []
    wait_for = {"fork": None, "open": b"O\n", "first write": b"T "}[start]
    if wait_for is not None:  # wait for that report (or an error, or EOF)
        data = b""
        while chunk := os.read(rfd, 65536):
            chunks.append(chunk)
            data += chunk
            if wait_for in data or b"E " in data:
                break
    time.sleep(delay_s)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)  # reaped: a zombie would still look alive to the store
    while chunk := os.read(rfd, 65536):
        chunks.append(chunk)
    os.close(rfd)
    lines = b"".join(chunks).decode().splitlines()
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        lines.append(f"E child ended with status {status} before the kill")
    return lines


def _check(kind: str, path: str, lines: list[str], seen: dict) -> list[str]:
    """Problems with the store after one kill ([] when it survived)."""
    problems = [line for line in lines if line.startswith("E ")]
    created = {int(line.split()[1]) for line in lines if line.startswith("T ")}
    finished = {int(line.split()[1]): int(line.split()[2]) for line in lines if line.startswith("F ")}
    profile_i = max((int(line.split()[1]) for line in lines if line.startswith("P ")), default=None)
    bandit = max((int(line.split()[1]) for line in lines if line.startswith("B ")), default=None)
    seen["trials"] |= created
    if bandit is not None:
        seen["bandit"] = max(seen["bandit"], bandit)
    if profile_i is not None:
        seen["profiles"][seen["kill"]] = profile_i
    if not exists(kind, path):
        return problems + ([f"store {path} missing after {len(created)} committed trials"] if created else [])
    try:
        store = _open(kind, path)
    except Exception as exc:
        return [*problems, f"store does not open: {type(exc).__name__}: {exc}"]
    try:
        trials = {t.trial_id: t for t in store.list_trials(JOB)}
        if len(trials) != len(store.list_trials(JOB)):
            problems.append("duplicate trial ids")
        missing = sorted(seen["trials"] - trials.keys())
        if missing:
            problems.append(f"committed trials lost: {missing[:10]}")
        for trial_id, i in finished.items():
            t = trials.get(trial_id)
            if t is not None and (t.status != "completed" or t.energy_J != float(i)):
                problems.append(f"finished trial {trial_id} reads {t.status} {t.energy_J}")
        running = [t.trial_id for t in trials.values() if t.status == "running"]
        if running:
            problems.append(f"trials of the dead writer left running: {running}")
        for kill_no, i in seen["profiles"].items():
            profile = store.get_profile(f"k{kill_no}")
            if profile is None or profile["i"] < i:
                problems.append(f"profile k{kill_no} lost its committed write {i}: {profile and profile['i']}")
        state = store.get_bandit(JOB)
        count = 0 if state is None else int(state.state.get("count", 0))
        if count < seen["bandit"]:
            problems.append(f"bandit count {count} < committed {seen['bandit']}")
    finally:
        store.close()
    return problems


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_sigkill_while_writing_loses_no_committed_record(tmp_path, kind, record_fault):
    rng = random.Random(f"store-kill-{kind}")
    failures: list[str] = []
    early = after_write = waited_for_write = 0
    seen: dict = {}
    for kill_no in range(KILLS_PER_BACKEND):
        if kill_no % TRIALS_PER_FILE == 0:
            path = new_location(kind, tmp_path, f"{kill_no // TRIALS_PER_FILE}_store")
            seen = {"trials": set(), "bandit": 0, "profiles": {}}
        seen["kill"] = kill_no
        # A quarter of the kills count from the fork (some land while the store opens or is created),
        # half from the store's open, a quarter from the writer's first committed write: so, however
        # slow the machine, some kills land between committed writes.
        start = rng.choices(["fork", "open", "first write"], weights=[1, 2, 1])[0]
        waited_for_write += start == "first write"
        lines = _kill_one(kind, path, kill_no, rng.uniform(0.0, MAX_DELAY_S), start)
        after_write += any(line[:1] in "TFPB" for line in lines)
        early += "O" not in lines
        problems = _check(kind, path, lines, seen)
        if not record_fault(f"store SIGKILL ({kind})", not problems):
            failures.append(f"kill {kill_no}: {problems}")
    assert not failures, "\n".join(failures[:20])
    # The kills landed both before the store was open and after committed writes (each kind counted,
    # not the writes, whose number depends on the machine's speed).
    assert early > 0 and waited_for_write > 0 and after_write >= waited_for_write
