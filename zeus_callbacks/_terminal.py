"""Terminal output of the ``zeus-callbacks`` command and the simulator: numbers, tables and progress bars.

Tables are laid out by ``rich``, sized to their content (plain ASCII, no colour) and kept
within an 80-column terminal by the callers' choice of columns; numbers are short (integers as
integers, large floats without decimals). Progress bars (tqdm) go to stderr, and only when stderr is a terminal, so
pipes, log files and ``--json`` output never see them.
"""

from __future__ import annotations

import io
import math
import sys
import textwrap
from typing import Any

TERMINAL_COLUMNS = 80
"""Width every table and summary line of the command is kept within."""


def fmt(value: Any, spec: str = ".1f") -> str:
    """One table cell: ``-`` for None/NaN, integers as integers, floats ≥ 10⁴ without decimals."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if not isinstance(value, float):  # integers (and anything not a number) as they are
        return str(value)
    if spec == ".1f" and abs(value) >= 1e4:
        return f"{value:.0f}"
    return format(value, spec)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """Right-aligned columns sized to their widest cell, two spaces apart, a dashed rule under the headers.

    Laid out by ``rich`` in plain ASCII without colour, never wrapped (the callers keep within
    :data:`TERMINAL_COLUMNS`); cells go through :func:`fmt`.
    """
    from rich.box import Box
    from rich.console import Console
    from rich.table import Table

    # Only a dashed rule under the headers: no edges, no column lines (a space stands between columns).
    rule_under_headers = Box("    \n    \n -  \n    \n    \n    \n    \n    \n", ascii=True)
    grid = Table(box=rule_under_headers, show_edge=False, pad_edge=False, padding=(0, 0, 0, 1), header_style=None)
    for header in headers:
        grid.add_column(header, justify="right", no_wrap=True)
    for row in rows:
        grid.add_row(*(fmt(c) for c in row))
    out = io.StringIO()
    Console(file=out, width=10_000, color_system=None, force_terminal=False, highlight=False).print(grid)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def progress_bar(total: float | None, desc: str, *, enabled: bool = True, unit: str = "it"):
    """A tqdm bar on stderr (a context manager), a no-op unless ``enabled`` and stderr is a terminal.

    ``total`` None: an open-ended count. ``enabled`` is False for ``--no-progress`` and ``--json``.
    """
    from tqdm import tqdm

    show = enabled and sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not show, leave=False, dynamic_ncols=True)


def name_impossible_figures(source: object, figures: list[str] | tuple[str, ...]) -> bool:
    """Name on stderr each of the log ``source``'s :func:`~zeus_callbacks._run_log.impossible_figures`; True if any."""
    for what in figures:
        print(f"zeus-callbacks: {source}: {what}: no run writes that; the log was edited or not written by "
              "zeus-callbacks, so what is shown from it is not to be trusted", file=sys.stderr)  # fmt: skip
    return bool(figures)


def wrap(text: str, hang: str = "     ") -> str:
    """``text`` filled to the terminal's width, indented two spaces, its further lines by ``hang``."""
    return textwrap.fill(text, TERMINAL_COLUMNS, initial_indent="  ", subsequent_indent=hang)


def print_time_note(note: str | None) -> None:
    """Print a log's ``time_note`` (power-limit results on the virtual GPU: time not simulated), if any."""
    if note:
        print(wrap(f"TIME NOT SIMULATED: {note}", "    "))
