"""``zeus-callbacks validate-config FILE``: check a YAML configuration; exit 1 with the errors if invalid."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from zeus_callbacks.config import ConfigError, load_config
from zeus_callbacks.errors import TraceFormatError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``validate-config`` and its options on the command's subparsers."""
    validate = sub.add_parser("validate-config", help="check a YAML configuration file")
    validate.add_argument("file")
    validate.add_argument("--json", action="store_true", help="print the validated configuration as JSON")
    validate.set_defaults(func=run)


def _blocking_file(folder: Path) -> Path | None:
    """The existing non-folder at ``folder`` or above it that keeps it from being a folder, or None."""
    for path in (folder, *folder.parents):
        if path.exists():
            return None if path.is_dir() else path
    return None


def run(args: argparse.Namespace) -> int:
    """Validate ``args.file``; print a one-line verdict (or the configuration as JSON).

    With ``virtual.trace`` (and ``backend`` ``auto`` or ``virtual``), the sweep and its
    training paths are read and checked too; a ``logging.log_dir`` that a file keeps from being a
    folder is an error (the run would fail at its start).

    Returns:
        0 when valid, 1 (the errors on stderr) when not.
    """
    try:
        config = load_config(args.file)
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
    blocked = _blocking_file(Path(config.logging.log_dir))
    if blocked is not None:  # the run would fail at its start: say so now
        print(f"invalid zeus-callbacks configuration in {args.file}:\n  logging.log_dir: {config.logging.log_dir} "
              f"cannot be a folder: {blocked} is a file", file=sys.stderr)  # fmt: skip
        return 1
    if args.json:
        print(json.dumps(config.model_dump(mode="json"), indent=2))
    else:
        print(f"{args.file}: valid (backend {config.backend}, job_id {config.job_id!r})")
    return 0
