"""The ``zeus-callbacks`` command. Subcommands: ``restore`` (power limits a killed run left changed)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: Arguments (default ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 1 when a limit could not be restored.
    """
    parser = argparse.ArgumentParser(prog="zeus-callbacks")
    sub = parser.add_subparsers(dest="command", required=True)
    restore = sub.add_parser("restore", help="put back the power limits recorded in a restore marker")
    restore.add_argument("--config", help="YAML configuration of the run (backend, log_dir, restore_marker)")
    restore.add_argument("--marker", help="the marker file; default: the configuration's")
    args = parser.parse_args(argv)
    if args.command == "restore":
        from zeus_callbacks.optimizers.power_limit import restore_command

        return restore_command(config_path=args.config, marker=args.marker)
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
