"""``zeus-callbacks``: the argument parser and :func:`main`, the one place user errors become exit status 1.

Each subcommand's options and action live in its own module (see :mod:`zeus_callbacks.cli`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from zeus_callbacks._version import __version__
from zeus_callbacks.cli import _cmd_plot as plot
from zeus_callbacks.cli import _cmd_profile_kernel as profile_kernel
from zeus_callbacks.cli import _cmd_report as report
from zeus_callbacks.cli import _cmd_restore as restore
from zeus_callbacks.cli import _cmd_show as show
from zeus_callbacks.cli import _cmd_simulate as simulate
from zeus_callbacks.cli import _cmd_store as store
from zeus_callbacks.cli import _cmd_validate_config as validate_config
from zeus_callbacks.config import ConfigError
from zeus_callbacks.errors import ZeusCallbacksError

COMMANDS = (validate_config, report, restore, simulate, show, plot, profile_kernel, store)
"""The subcommand modules, in the order ``zeus-callbacks --help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``zeus-callbacks`` command."""
    parser = argparse.ArgumentParser(prog="zeus-callbacks", description="GPU energy for training runs.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status.

    Our own errors about the user's input (a configuration, a store, a restore marker)
    end the command here with their one-line message and status 1, never a traceback.
    """
    try:
        return _run(list(sys.argv[1:] if argv is None else argv))
    except ConfigError as exc:  # its message names the file: "invalid zeus-callbacks configuration in ..."
        print(exc, file=sys.stderr)
        return 1
    except ZeusCallbacksError as exc:  # a store, a restore marker, a log: the message names the file
        print(f"zeus-callbacks: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `zeus-callbacks simulate | head`: the reader left early, not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 1


def _run(argv: list[str]) -> int:
    if argv[:1] == ["simulate"]:  # the simulator owns its options
        return simulate.main(argv[1:])
    args = build_parser().parse_args(argv)
    return args.func(args)
