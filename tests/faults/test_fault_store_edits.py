"""Hand-edited and bit-flipped store files: a StoreCorruptError naming the file, or a clean read — never a crash.

A real store (SQLite and JSON) is filled by the bandit through pruning into Thompson sampling;
then a table of hand edits (each a mistake a person makes editing the file) and a seeded set of
single-bit flips is applied to copies of it. Each copy is used the way ``zeus-callbacks show``
(read-only) and a run (open, suggest, report) use it. Every use either works or raises
:class:`StoreCorruptError` (or another :class:`StoreError`) whose message names the file; one
that raised has written nothing (the file's bytes are unchanged).
"""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from zeus_callbacks.cli._cmd_show import show
from zeus_callbacks.errors import StoreCorruptError, StoreError
from zeus_callbacks.optimizers.batch_size import BanditSettings, BatchSizeBandit
from zeus_callbacks.store import open_store

SETTINGS = BanditSettings((8, 16, 32), 16)
FLIPS_PER_KIND = 120
SEED = 20


def _fill(path: Path) -> None:
    with open_store(path) as store:
        bandit = BatchSizeBandit(store, "job", SETTINGS)
        for cost in (100.0, 120.0, 140.0, 105.0, 98.0):
            s = bandit.suggest()
            bandit.report(s.trial_id, energy_J=cost, time_s=1.0, cost=cost, converged=True)
        store.put_profile('{"gpu": "A40", "batch_size": 16}', {"limits": [{"limit_W": 200.0}], "chosen_limit_W": 200.0})


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("stores")
    made = {}
    for kind in ("sqlite", "json"):
        path = folder / f"base.{kind}"
        _fill(path)
        for extra in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            assert not extra.exists() or extra.stat().st_size == 0 or kind == "sqlite"
        made[kind] = path
    return made


def _copy(original: Path, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}{original.suffix}"
    shutil.copyfile(original, path)
    return path


def _use(path: Path) -> list[str]:
    """Use the store as show and a run do; the problems found (empty: all survived)."""
    problems = []

    def attempt(what: str, action: Callable[[], object]) -> None:
        before = path.read_bytes()
        try:
            action()
        except StoreError as exc:  # StoreCorruptError, StoreSchemaError, ...
            if path.name not in str(exc):
                problems.append(f"{what}: {type(exc).__name__} does not name the file: {exc}")
            if path.read_bytes() != before:
                problems.append(f"{what}: raised {type(exc).__name__} after writing to the file")
        except Exception as exc:  # a crash: the bug this test is about
            problems.append(f"{what}: {type(exc).__name__}: {exc}")

    def run() -> None:
        with open_store(path) as store:
            bandit = BatchSizeBandit(store, "job", SETTINGS)
            s = bandit.suggest()
            bandit.report(s.trial_id, energy_J=1.0, time_s=1.0, cost=100.0, converged=True)

    attempt("show", lambda: show(path))
    attempt("show --json", lambda: show(path, as_json=True))
    attempt("a run", run)
    return problems


def _json_edit(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        doc = json.loads(path.read_text())
        change(doc)
        path.write_text(json.dumps(doc))

    return edit


def _raw(old: str, new: str) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        text = path.read_text()
        assert old in text, old
        path.write_text(text.replace(old, new, 1))

    return edit


def _set(obj: dict, key: str, value) -> None:
    obj[key] = value


JSON_EDITS: dict[str, Callable[[Path], None]] = {
    "batch_size text": _json_edit(lambda d: _set(d["trials"][0], "batch_size", "abc")),
    "unknown status": _json_edit(lambda d: _set(d["trials"][0], "status", "exploded")),
    "cost as a numeric string": _json_edit(lambda d: _set(d["trials"][1], "cost", "12")),
    "trial without an id": _json_edit(lambda d: d["trials"][0].pop("trial_id")),
    "trials an object": _json_edit(lambda d: _set(d, "trials", {})),
    "trial is null": _json_edit(lambda d: d["trials"].append(None)),
    "duplicate trial id": _json_edit(lambda d: _set(d["trials"][1], "trial_id", d["trials"][0]["trial_id"])),
    "next_trial_id behind": _json_edit(lambda d: _set(d, "next_trial_id", 1)),
    "jobs a list": _json_edit(lambda d: _set(d, "jobs", [])),
    "job created_at null": _json_edit(lambda d: _set(d["jobs"]["job"], "created_at", None)),
    "trial info text": _json_edit(lambda d: _set(d["trials"][0], "info", "text")),
    "started_at infinite": _json_edit(lambda d: _set(d["trials"][0], "started_at", 1e999)),
    "survivors text": _json_edit(lambda d: _set(d["bandits"]["job"]["state"], "survivors", "all")),
    "unknown phase": _json_edit(lambda d: _set(d["bandits"]["job"]["state"], "phase", "guessing")),
    "candidate not an arm": _json_edit(
        lambda d: (
            _set(d["bandits"]["job"]["state"], "phase", "pruning"),
            _set(d["bandits"]["job"]["state"], "candidate", 999),
        )
    ),
    "rng state garbage": _json_edit(lambda d: _set(d["bandits"]["job"]["state"], "rng", {"x": 1})),
    "arm key text": _json_edit(lambda d: _set(d["bandits"]["job"]["arms"], "abc", {})),
    "bandit version negative": _json_edit(lambda d: _set(d["bandits"]["job"], "version", -1)),
    "bandit state missing": _json_edit(lambda d: d["bandits"]["job"].pop("state")),
    "profile a list": _json_edit(lambda d: _set(d["profiles"], "k", [1, 2])),
    "format removed": _json_edit(lambda d: d.pop("format")),
    "schema_version text": _json_edit(lambda d: _set(d, "schema_version", "2")),
    "trailing comma": _raw('"profiles"', '"profiles",'),
    "NaN best cost": _raw('"min_cost": 98.0', '"min_cost": NaN'),
}


def _sql(*statements: str) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA ignore_check_constraints = ON")
        for statement in statements:
            conn.execute(statement)
        conn.commit()
        conn.close()

    return edit


SQLITE_EDITS: dict[str, Callable[[Path], None]] = {
    "batch_size text": _sql("UPDATE trials SET batch_size = 'abc' WHERE trial_id = 1"),
    "unknown status": _sql("UPDATE trials SET status = 'exploded' WHERE trial_id = 1"),
    "info not JSON": _sql("UPDATE trials SET info = '{not json' WHERE trial_id = 2"),
    "info a list": _sql("UPDATE trials SET info = '[1, 2]' WHERE trial_id = 2"),
    "started_at text": _sql("UPDATE trials SET started_at = 'yesterday' WHERE trial_id = 3"),
    "energy 'NaN' text": _sql("UPDATE trials SET energy_J = 'NaN' WHERE trial_id = 3"),
    "converged text": _sql("UPDATE trials SET converged = 'maybe' WHERE trial_id = 1"),
    "bandit state wrong shape": _sql("""UPDATE bandits SET state = '{"phase": 1}'"""),
    "bandit state not JSON": _sql("UPDATE bandits SET state = 'not json'"),
    "bandit version text": _sql("UPDATE bandits SET version = 'v'"),
    "arm state a list": _sql("UPDATE arms SET state = '[]'"),
    "arm batch size text": _sql("UPDATE arms SET batch_size = 'x' WHERE batch_size = 8"),
    "profile not JSON": _sql("UPDATE profiles SET table_json = '{'"),
    "job info text": _sql("UPDATE jobs SET info = 'nope'"),
    "job created_at text": _sql("UPDATE jobs SET created_at = 'then'"),
    "arms table dropped": _sql("DROP TABLE arms"),
    "schema_version emptied": _sql("DELETE FROM schema_version"),
    "schema_version text": _sql("UPDATE schema_version SET version = 'two'"),
}


@pytest.mark.parametrize("case", list(JSON_EDITS))
def test_hand_edited_json_store(originals, tmp_path, case, record_fault):
    path = _copy(originals["json"], tmp_path, "edited")
    JSON_EDITS[case](path)
    problems = _use(path)
    record_fault("store: hand edit", not problems)
    assert not problems, problems


@pytest.mark.parametrize("case", list(SQLITE_EDITS))
def test_hand_edited_sqlite_store(originals, tmp_path, case, record_fault):
    path = _copy(originals["sqlite"], tmp_path, "edited")
    SQLITE_EDITS[case](path)
    problems = _use(path)
    record_fault("store: hand edit", not problems)
    assert not problems, problems


def test_some_hand_edits_are_refused_naming_the_record(originals, tmp_path):
    """The message says which record and field, so the person who edited the file can find it."""
    path = _copy(originals["json"], tmp_path, "named")
    JSON_EDITS["batch_size text"](path)
    with pytest.raises(StoreCorruptError, match=r"named\.json: trial 1 \(trials\[0\]\) field batch_size"):
        open_store(path)
    path = _copy(originals["sqlite"], tmp_path, "named")
    SQLITE_EDITS["info not JSON"](path)
    with open_store(path) as store, pytest.raises(StoreCorruptError, match=r"named\.sqlite: trial 2 is malformed"):
        store.list_trials()


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_bit_flipped_store(originals, tmp_path, kind, record_fault):
    original = originals[kind]
    size = original.stat().st_size
    rng = random.Random(f"{SEED}-{kind}")
    failures = {}
    for i in range(FLIPS_PER_KIND):
        offset, bit = rng.randrange(size), rng.randrange(8)
        path = _copy(original, tmp_path, f"flip{i}")
        data = bytearray(path.read_bytes())
        data[offset] ^= 1 << bit
        path.write_bytes(bytes(data))
        problems = _use(path)
        if not record_fault(f"store: bit flip ({kind})", not problems):
            failures[(offset, bit)] = problems
        for extra in tmp_path.glob(f"flip{i}*"):
            extra.unlink()
    assert not failures, failures


def test_a_flipped_bit_in_an_index_is_refused_before_a_run_writes(originals, tmp_path):
    # A CI run's random flips once hit the trials_by_job index: the open read nothing there, a run then
    # created its trial (a write) and failed on the index afterwards. Flip each byte of the index's
    # cells (they fill the page from its end): every use survives or is refused with the file unchanged.
    original = originals["sqlite"]
    with sqlite3.connect(f"file:{original}?mode=ro", uri=True) as db:
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'trials_by_job'").fetchone()[0]
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
    page_end = root * page_size  # pages count from 1
    failures = {}
    for offset in range(page_end - 48, page_end):
        path = _copy(original, tmp_path, f"index{offset}")
        data = bytearray(path.read_bytes())
        data[offset] ^= 0x80
        path.write_bytes(bytes(data))
        problems = _use(path)
        if problems:
            failures[offset] = problems
        for extra in tmp_path.glob(f"index{offset}*"):
            extra.unlink()
    assert not failures, failures


def test_a_damaged_sqlite_store_gets_one_message_whatever_found_the_damage(originals, tmp_path):
    # Before, a file SQLite could not open said "is not a readable SQLite store (...) — move it away",
    # one its integrity check refused said "is damaged (SQLite's integrity check: ...)" (outside tester).
    original = originals["sqlite"]
    header = _copy(original, tmp_path, "header")  # SQLite's own header destroyed: "file is not a database"
    data = bytearray(header.read_bytes())
    data[:16] = b"not sqlite here!"
    header.write_bytes(bytes(data))
    with sqlite3.connect(f"file:{original}?mode=ro", uri=True) as db:
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'trials_by_job'").fetchone()[0]
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
    index = _copy(original, tmp_path, "index")  # a cell of an index: the file opens, its integrity check fails
    data = bytearray(index.read_bytes())
    data[root * page_size - 1] ^= 0x80
    index.write_bytes(bytes(data))
    messages = []
    for path in (header, index):
        before = path.read_bytes()
        with pytest.raises(StoreCorruptError) as info:
            open_store(path)
        assert path.read_bytes() == before
        messages.append(str(info.value))
    assert "integrity check" in messages[1] and "file is not a database" in messages[0]
    for path, message in zip((header, index), messages, strict=True):
        head, _, tail = message.partition(" (")
        assert head == f"store {path} is damaged: SQLite cannot read it", message
        assert tail.endswith(
            "; it was left untouched — restore it from a backup, or move it away to start a new store "
            "(the batch-size bandit then starts over)"
        ), message
