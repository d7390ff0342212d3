"""``zeus-callbacks validate-config FILE``: check a YAML configuration; exit 1 with the errors if invalid."""

from __future__ import annotations

import argparse
import json
import sys

from zeus_callbacks.config import ConfigError, load_config
from zeus_callbacks.errors import TraceFormatError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``validate-config`` and its options on the command's subparsers."""
    validate = sub.add_parser("validate-config", help="check a YAML configuration file")
    validate.add_argument("file")
    validate.add_argument("--json", action="store_true", help="print the validated configuration as JSON")
    validate.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Validate ``args.file``; print a one-line verdict (or the configuration as JSON).

    With ``virtual.trace`` (and ``backend`` ``auto`` or ``virtual``), the sweep and its
    training paths are read and checked too.

    Returns:
        0 when valid, 1 (the errors on stderr) when not.
    """
    try:
        config = load_config(args.file)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    if config.virtual.trace is not None and config.backend in ("auto", "virtual"):
        try:  # read now, as the virtual GPU would at train start: a bad sweep is caught before training
            config.virtual.backend_kwargs()
        except TraceFormatError as exc:
            print(f"invalid zeus-callbacks configuration in {args.file}:\n  virtual.trace: {exc}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(config.model_dump(mode="json"), indent=2))
    else:
        print(f"{args.file}: valid (backend {config.backend}, job_id {config.job_id!r})")
    return 0
