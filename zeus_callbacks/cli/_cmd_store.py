"""``zeus-callbacks store copy``: copy a store's records into a new store of any kind (SQLite, JSON, a database)."""

from __future__ import annotations

import argparse

from zeus_callbacks.optimizers.batch_size._bandit_state import read_state
from zeus_callbacks.store import StoreCorruptError, copy_store, store_location
from zeus_callbacks.store._stored_records import Snapshot


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``store`` (and its ``copy``) on the command's subparsers."""
    store = sub.add_parser("store", help="copy a store into another (SQLite, JSON or a database)")
    actions = store.add_subparsers(dest="store_command", required=True)
    copy = actions.add_parser(
        "copy",
        help="copy every job, trial, bandit state and profile of SRC into DST, a new empty store",
        description="Copy every record of SRC into DST, which must hold no job yet; SRC is only read. "
        "Each is a store file (.sqlite, .db: SQLite; .json: JSON) or a database URL (postgresql://...). "
        "Trial ids, times and bandit versions are kept. A bandit state that `show` would refuse as malformed "
        "is refused here too, naming the job and the field, and nothing is written.",
    )
    copy.add_argument("src", help="the store to read (a file or a database URL)")
    copy.add_argument("dst", help="the store to write: a new file, or a database with no zeus-callbacks job")
    copy.set_defaults(func=run)


def _check_bandit_states(records: Snapshot, location: str) -> None:
    """Refuse a source whose bandit state of a job ``show`` (and the bandit) would refuse as malformed.

    Raises:
        StoreCorruptError: Names the store, the job and the field.
    """
    for bandit in records.bandits:
        if not bandit.state:  # an empty one: before the job's first suggestion
            continue
        try:
            read_state(bandit.state, location, bandit.job_id)
        except StoreCorruptError as exc:
            raise StoreCorruptError(f"not copied, nothing was written: {exc} (show refuses it too)") from exc


def run(args: argparse.Namespace) -> int:
    """Copy ``args.src`` into ``args.dst`` and say what was copied; returns 0.

    Raises:
        StoreError: A store cannot be opened, the destination holds jobs, or a bandit state of the
            source is malformed (nothing written).
    """
    jobs, trials, bandits, profiles = copy_store(args.src, args.dst, check=_check_bandit_states)
    print(
        f"copied {jobs} job(s), {trials} trial(s), {bandits} bandit state(s) and {profiles} profile(s) "
        f"from {store_location(args.src)} to {store_location(args.dst)}"
    )
    return 0
