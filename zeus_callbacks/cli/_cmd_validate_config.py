"""``zeus-callbacks validate-config FILE``: check a YAML configuration; exit 1 with the errors if invalid."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from zeus_callbacks.config import ConfigError, batch_size_warnings, load_config, setting_warnings
from zeus_callbacks.errors import TraceFormatError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``validate-config`` and its options on the command's subparsers."""
    validate = sub.add_parser("validate-config", help="check a YAML configuration file")
    validate.add_argument("file")
    validate.add_argument("--json", action="store_true", help="print the validated configuration as JSON")
    validate.set_defaults(func=run)


def _log_dir_problem(folder: Path) -> str | None:
    """Why a run could not write its log in ``folder``, or None when it could.

    The nearest existing path at or above ``folder`` must be a folder the process may write in. A
    permission check comes first; root passes it almost everywhere (even in /proc), so a temporary
    folder is then made and removed there: the check leaves nothing behind.
    """
    for path in (folder, *folder.parents):
        if path.exists():
            break
    else:
        return None
    if not path.is_dir():
        return f"{folder} cannot be a folder: {path} is a file"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{folder} is not writable" if path == folder else f"{folder} cannot be created: {path} is not writable"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".zeus-callbacks-check-", dir=path))
    except OSError as exc:  # the permission check passed: say what failed, with the system's words for why
        what = "the log cannot be written there" if path == folder else "it cannot be created"
        return f"{folder}: {what}: creating a folder in {path} failed ({exc.strerror})"
    return None


def run(args: argparse.Namespace) -> int:
    """Validate ``args.file``; print a one-line verdict (or the configuration as JSON).

    With ``virtual.trace`` (and ``backend`` ``auto`` or ``virtual``), the sweep and its
    training paths are read and checked too; a ``logging.log_dir`` that a file keeps from being a
    folder, or that cannot be created or written, is an error (the run would fail at its start).

    Settings that have no effect beside the others (:func:`~zeus_callbacks.config.setting_warnings`),
    and a batch-size search without ``job_id`` or ``batch_size.target``
    (:func:`~zeus_callbacks.config.batch_size_warnings`), are printed on stderr, one line each; they
    leave the file valid.

    Returns:
        0 when valid (with or without warnings), 1 (the errors on stderr) when not.
    """
    try:
        config = load_config(args.file, warn=False)  # printed below, not logged as well
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    if config.virtual.trace is not None and config.backend in ("auto", "virtual"):
        from zeus_callbacks.backends.virtual import virtual_backend_kwargs

        try:  # read now, as the virtual GPU would at train start: a bad sweep is caught before training
            virtual_backend_kwargs(config.virtual)
        except TraceFormatError as exc:
            print(f"invalid zeus-callbacks configuration in {args.file}:\n  virtual.trace: {exc}", file=sys.stderr)
            return 1
    problem = _log_dir_problem(Path(config.logging.log_dir))
    if problem is not None:  # the run would fail at its start: say so now
        print(f"invalid zeus-callbacks configuration in {args.file}:\n  logging.log_dir: {problem}", file=sys.stderr)
        return 1
    for message in setting_warnings(config) + batch_size_warnings(config):
        print(f"{args.file}: warning: {message}", file=sys.stderr)
    if args.json:
        print(json.dumps(config.model_dump(mode="json"), indent=2))
    else:
        print(f"{args.file}: valid (backend {config.backend}, job_id {config.job_id!r})")
    return 0
