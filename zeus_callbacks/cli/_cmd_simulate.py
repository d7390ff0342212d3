"""``zeus-callbacks simulate ...``: replay a recurring job on the Zeus traces.

The simulator owns its options (``zeus-callbacks simulate -h``): :func:`main` hands it the
arguments after ``simulate`` before the command's parser sees them.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def add_parser(sub: argparse._SubParsersAction) -> None:
    """List ``simulate`` in the command's help (its options are the simulator's own)."""
    sub.add_parser("simulate", help="replay a recurring job on the Zeus traces (options: simulate -h)")


def main(argv: Sequence[str]) -> int:
    """Run the simulator with ``argv`` (the arguments after ``simulate``); returns its exit status."""
    from zeus_callbacks.simulate import main as simulate_main

    return simulate_main(argv, prog="zeus-callbacks simulate")
