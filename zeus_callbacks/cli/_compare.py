"""Several runs side by side (``report A.jsonl B.jsonl``) and the logs' records as CSV (``report --csv DIR``).

The figures compared are :data:`zeus_callbacks._run_log.COMPARED`, from each log's ``run_end``
record; a figure a log lacks is ``-`` in the table and null in JSON. The CSV files hold every
``steps``, ``epoch``, ``eval`` and ``run_end`` record of the logs, one file per record type, for
pandas (``pd.read_csv``) or the ``csv`` module.
"""

from __future__ import annotations

import csv
import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zeus_callbacks._atomic_io import atomic_output
from zeus_callbacks._run_log import COMPARED, last_record, run_figures
from zeus_callbacks._terminal import TERMINAL_COLUMNS, fmt
from zeus_callbacks._units import three_figures

Log = tuple[Path, list[dict[str, Any]]]
"""One energy log: its path and its records (:func:`zeus_callbacks.reporting.read_jsonl`)."""

CSV_RECORDS = ("steps", "epoch", "eval", "run_end")
"""The record types ``--csv`` writes, one file each (``<type>.csv``)."""

NODE_FIGURES = ("cpu_energy_J", "dram_energy_J", "node_energy_J")
"""The node rows: a null one is marked, and its run_end's ``node_energy_note`` is a footnote."""

_SPECS = {"energy_J": ".1f", "time_s": ".1f", "mean_power_W": ".1f", "power_limit_W": ".0f"}


def run_labels(logs: Sequence[Log]) -> list[str]:
    """One label per log: its run name; the file name where that name is missing or shared with another log."""
    names = [run_figures(records).get("run_name") or path.stem for path, records in logs]
    return [name if names.count(name) == 1 else str(path) for name, (path, _) in zip(names, logs, strict=True)]


def _cell(key: str, value: Any) -> str:
    if key == "energy_Wh" and isinstance(value, float):
        return three_figures(value)
    return fmt(value, _SPECS.get(key, ".1f"))


def comparison_table(logs: Sequence[Log]) -> str:
    """The runs side by side: one row per figure of :data:`COMPARED`, one column per run (``-``: missing).

    Columns that do not fit an 80-column terminal go to a further block below, the row labels repeated.
    A null CPU/DRAM/node figure is ``- (a)``, its run's ``node_energy_note`` a footnote under the table.
    Below the table, a ``TIME NOT SIMULATED:`` line for each run with a ``time_note`` (power-limit
    results on the virtual GPU with the real clock), which its ``time note`` row points to.
    """
    labels = run_labels(logs)
    figures = [run_figures(records) for _, records in logs]
    notes = [_node_note(records) for _, records in logs]
    marks: dict[str, str] = {}  # a null node figure's reason -> its footnote mark, (a), (b), ... in order of use
    rows = []
    for key, label in COMPARED:
        cells = [_cell(key, f.get(key)) for f in figures]
        if key in NODE_FIGURES:
            for i, (f, note) in enumerate(zip(figures, notes, strict=True)):
                if f.get(key) is None and note:
                    mark = f"({chr(ord('a') + len(marks))})" if len(marks) < 26 else "(*)"
                    cells[i] += " " + marks.setdefault(note, mark)
        rows.append((label, cells))
    rows.append(("simulated", ["yes" if f["simulated"] else "no" for f in figures]))
    rows.append(("time note", ["below" if f["time_note"] else "none" for f in figures]))
    label_w = max(len(label) for label, _ in rows)
    widths = [max(len(labels[i]), *(len(cells[i]) for _, cells in rows)) for i in range(len(labels))]
    blocks: list[list[int]] = []
    block: list[int] = []
    used = label_w
    for i, w in enumerate(widths):
        if block and used + 2 + w > TERMINAL_COLUMNS:
            blocks.append(block)
            block, used = [], label_w
        block.append(i)
        used += 2 + w
    blocks.append(block)
    lines = []
    for block in blocks:
        lines.append(" " * label_w + "".join("  " + labels[i].rjust(widths[i]) for i in block))
        lines += [label.ljust(label_w) + "".join("  " + cells[i].rjust(widths[i]) for i in block)
                  for label, cells in rows]  # fmt: skip
        lines.append("")
    for note, mark in marks.items():
        lines.append(textwrap.fill(f"{mark} CPU/DRAM/node n/a: {note}", TERMINAL_COLUMNS, subsequent_indent="    "))
    for label, f in zip(labels, figures, strict=True):
        if not f["ended"]:
            lines.append(f"{label}: no run_end record (still running, or killed before it ended): shown as -")
    if any(f["simulated"] for f in figures):
        lines.append("SIMULATED energy (virtual GPU, not measured) where simulated says yes")
    for label, f in zip(labels, figures, strict=True):
        if f["time_note"]:
            lines.append(textwrap.fill(f"{label}: TIME NOT SIMULATED: {f['time_note']}", TERMINAL_COLUMNS,
                                       subsequent_indent="    "))  # fmt: skip
    return "\n".join(lines).rstrip("\n")


def _node_note(records: list[dict[str, Any]]) -> str | None:
    """The run_end record's ``node_energy_note`` (why a CPU/DRAM/node figure is null, or the parts it holds)."""
    end = last_record(records, "run_end")
    note = None if end is None else end.get("node_energy_note")
    return note if isinstance(note, str) and note else None


def comparison_json(logs: Sequence[Log]) -> str:
    """The compared figures as JSON, ``{"runs": [...]}``: one object per log, in the order given.

    Each object holds ``run``, ``log``, ``run_name``, the :data:`COMPARED` keys, ``ended``, ``simulated``
    and ``time_note``. A figure a log lacks is null; ``time_note`` is null unless the run's power-limit
    results come from the virtual GPU on the real clock (time not simulated).
    """
    runs = [{"run": label, "log": str(path), **run_figures(records)}
            for label, (path, records) in zip(run_labels(logs), logs, strict=True)]  # fmt: skip
    return json.dumps({"runs": runs}, indent=2)


def _flat(record: dict[str, Any]) -> dict[str, Any]:
    """A record as one CSV row: a mapping field becomes ``field.key`` columns, a list or deeper value JSON text."""
    row: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            for sub, inner in value.items():
                row[f"{key}.{sub}"] = json.dumps(inner) if isinstance(inner, (dict, list)) else inner
        else:
            row[key] = json.dumps(value) if isinstance(value, list) else value
    return row


def write_csv(logs: Sequence[Log], directory: Path) -> list[Path]:
    """Write ``<directory>/<type>.csv`` (created if missing; replaced atomically) for each of :data:`CSV_RECORDS`.

    A row is one such record of the logs: ``run`` (the label of :func:`run_labels`) and ``log`` (the file), then
    the record's fields in the order first seen (``event`` left out: the file names it). A field a record lacks,
    or holds as null, is an empty cell (pandas reads NaN); a mapping field (an epoch's ``ledger``, run_end's
    ``carbon``) becomes one ``field.key`` column per key, a list (``gpu_energy_J``) its JSON text. A type no log
    holds gets a file with the ``run`` and ``log`` header only. Returns the files written (OSError: one cannot be).
    """
    labels = run_labels(logs)
    written = []
    for kind in CSV_RECORDS:
        rows = [{"run": label, "log": str(path), **_flat({k: v for k, v in r.items() if k != "event"})}
                for label, (path, records) in zip(labels, logs, strict=True)
                for r in records if r.get("event") == kind]  # fmt: skip
        columns = list(dict.fromkeys(["run", "log", *(key for row in rows for key in row)]))
        path = directory / f"{kind}.csv"
        with atomic_output(path, "w") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns, lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        written.append(path)
    return written
