"""Terminal output of the ``zeus-callbacks`` command: numbers, tables and progress bars.

Tables are sized to their content and kept within an 80-column terminal by the callers'
choice of columns; numbers are short (integers as integers, large floats without
decimals). Progress bars (tqdm) go to stderr, and only when stderr is a terminal, so
pipes, log files and ``--json`` output never see them.
"""

from __future__ import annotations

import math
import sys
from typing import Any

TERMINAL_COLUMNS = 80
"""Width every table and summary line of the command is kept within."""


def fmt(value: Any, spec: str = ".1f") -> str:
    """One table cell: ``-`` for None/NaN, integers as integers, floats ≥ 10⁴ without decimals."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if spec == ".1f" and abs(value) >= 1e4:
        return f"{value:.0f}"
    return format(value, spec)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """Right-aligned columns sized to their widest cell, a dashed rule under the headers."""
    cells = [headers] + [[fmt(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def progress_bar(total: float | None, desc: str, *, enabled: bool = True, unit: str = "it"):
    """A tqdm bar on stderr, disabled unless ``enabled`` and stderr is a terminal.

    Args:
        total: The count (or seconds) at 100 %; None for an open-ended count.
        desc: Label in front of the bar.
        enabled: False for ``--no-progress`` and ``--json``.
        unit: Unit of ``total`` (``"it"``, ``"s"``, ``"recurrence"``).

    Returns:
        A ``tqdm`` instance (a no-op one when disabled); use it as a context manager.
    """
    from tqdm import tqdm

    show = enabled and sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not show, leave=False, dynamic_ncols=True)


def name_impossible_figures(source: object, figures: list[str] | tuple[str, ...]) -> bool:
    """Name on stderr each figure of the log ``source`` that no run writes; True when there was one.

    Args:
        source: The log (its path), as the user named it.
        figures: From :func:`zeus_callbacks.run_log.impossible_figures`.
    """
    for what in figures:
        print(f"zeus-callbacks: {source}: {what}: no run writes that; the log was edited or not written by "
              "zeus-callbacks, so what is shown from it is not to be trusted", file=sys.stderr)  # fmt: skip
    return bool(figures)
