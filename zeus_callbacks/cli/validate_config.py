"""``zeus-callbacks validate-config FILE``: check a YAML configuration; exit 1 with the errors if invalid."""

from __future__ import annotations

import argparse
import json
import sys

from zeus_callbacks.config import ConfigError, load_config


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``validate-config`` and its options on the command's subparsers."""
    validate = sub.add_parser("validate-config", help="check a YAML configuration file")
    validate.add_argument("file")
    validate.add_argument("--json", action="store_true", help="print the validated configuration as JSON")
    validate.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Validate ``args.file``; print a one-line verdict (or the configuration as JSON).

    Returns:
        0 when valid, 1 (the errors on stderr) when not.
    """
    try:
        config = load_config(args.file)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(config.model_dump(mode="json"), indent=2))
    else:
        print(f"{args.file}: valid (backend {config.backend}, job_id {config.job_id!r})")
    return 0
