"""The command line of a job script that plays several runs in one launch: its options split at ``--then``."""

from __future__ import annotations


def runs(argv: list[str]) -> list[list[str]]:
    """Each run's options: ``argv`` split at ``--then``."""
    split: list[list[str]] = [[]]
    for arg in argv:
        if arg == "--then":
            split.append([])
        else:
            split[-1].append(arg)
    return split
