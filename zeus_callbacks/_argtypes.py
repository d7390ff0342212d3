"""argparse types with ranges: a bad number is refused at the command line, in argparse's words.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> _ = parser.add_argument("--n", type=int_at_least(1))
    >>> parser.parse_args(["--n", "3"]).n
    3
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer ≥ ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be ≥ {low}, got {value}")
        return value

    parse.__name__ = f"integer ≥ {low}"
    return parse


def float_in(
    low: float | None = None, high: float | None = None, *, low_open: bool = False, high_open: bool = False
) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in [``low``, ``high``] (a bound None: none; ``*_open``: excluded)."""
    left = "" if low is None else ("(" if low_open else "[") + f"{low:g}"
    right = "" if high is None else f"{high:g}" + (")" if high_open else "]")
    if low is not None and high is not None:
        wanted = f"in {left}, {right}"
    elif low is not None:
        wanted = f"{'>' if low_open else '≥'} {low:g}"
    elif high is not None:
        wanted = f"{'<' if high_open else '≤'} {high:g}"
    else:
        wanted = "finite"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        bad = not math.isfinite(value)
        if low is not None:
            bad = bad or value < low or (low_open and value == low)
        if high is not None:
            bad = bad or value > high or (high_open and value == high)
        if bad:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text}")
        return value

    parse.__name__ = f"number {wanted}"
    return parse
