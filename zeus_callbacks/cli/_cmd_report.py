"""``zeus-callbacks report RUN.jsonl [RUN2.jsonl ...] [--csv DIR]``: one run in full, several side by side.

One run: its energy, time, power limit and per-epoch breakdown. Several: their figures side by side
(:mod:`zeus_callbacks.cli._compare`). ``--csv DIR``: their records as CSV files.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from zeus_callbacks._footprint import ENERGY_BASES
from zeus_callbacks._run_log import impossible_figures, is_simulated, last_record, time_note_of
from zeus_callbacks._terminal import fmt, name_impossible_figures, print_time_note, wrap
from zeus_callbacks._units import readable_energy, three_figures
from zeus_callbacks.cli import _compare as compare
from zeus_callbacks.optimizers.power_limit import limits_measured_text
from zeus_callbacks.reporting import NODE_OFF, energy_parts, read_jsonl


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``report`` and its options on the command's subparsers."""
    report = sub.add_parser("report", help="summarise a run's JSONL energy log; several logs: compare the runs")
    report.add_argument("run", nargs="+", metavar="RUN.jsonl", help="path of a run's .jsonl file (several: compared)")
    report.add_argument("--json", action="store_true")
    report.add_argument(
        "--csv", metavar="DIR",
        help="also write DIR/steps.csv, epoch.csv, eval.csv and run_end.csv: every such record of the logs, "
        "with run and log columns",
    )  # fmt: skip
    report.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the summary of each run log in ``args.run``: one log in full, several side by side.

    ``--json``: one log's run_end and epoch records, several logs' compared figures. ``--csv DIR``:
    the logs' records as CSV files too (:func:`zeus_callbacks.cli._compare.write_csv`).

    Returns:
        0, or 1 when a file is missing, not an energy log, or empty, or the CSV files cannot be written,
        or a log holds a negative or non-numeric energy or power figure (never written by the library: an
        edited or foreign log; :func:`~zeus_callbacks._run_log.impossible_figures`).
    """
    logs = []
    for name in args.run:
        path = Path(name)
        try:
            records = read_jsonl(path)  # not an energy log: main() names it
        except FileNotFoundError:
            print(f"zeus-callbacks: no such energy log: {path}", file=sys.stderr)
            return 1
        if not records:
            print(f"zeus-callbacks: {path} holds no records", file=sys.stderr)
            return 1
        logs.append((path, records))
    impossible = [(path, impossible_figures(records)) for path, records in logs]
    if len(logs) == 1:
        _report_one(*logs[0], as_json=args.json)
    else:
        print(compare.comparison_json(logs) if args.json else compare.comparison_table(logs))
    if args.csv:
        try:
            written = compare.write_csv(logs, Path(args.csv))
        except OSError as exc:
            print(f"zeus-callbacks: cannot write the CSV files in {args.csv}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        if not args.json:  # stdout stays one JSON document
            print("wrote " + ", ".join(str(p) for p in written))
    named = [name_impossible_figures(path, figures) for path, figures in impossible]
    return 1 if any(named) else 0


def _report_one(path: Path, records: list[dict], *, as_json: bool) -> None:
    """Print one run's summary (``as_json``: its run_end and epoch records)."""
    end = last_record(records, "run_end")
    epochs = [r for r in records if r.get("event") == "epoch"]
    if as_json:
        print(json.dumps({"run_end": end, "epochs": epochs}, indent=2))
        return
    # Every record carries ``simulated``; logs older than that flag name the virtual GPU as their
    # backend (what plot power-limit reads too): either way the figures below are simulated.
    simulated = is_simulated(records)
    profile = last_record(records, "power_limit_profile")
    if end is None:
        print(f"{path}: the run has no run_end record (still running, or killed before it ended)")
        if simulated:
            print("  SIMULATED energy (virtual GPU, not measured)")
        print_time_note(time_note_of(records))
    else:
        chosen = end.get("chosen_power_limit_W", None if profile is None else profile.get("chosen_limit_W"))
        if chosen is None:
            limits = f"power limit {fmt(end.get('power_limit_W'))} W"
        elif end.get("power_limit_applied") is False and "power_limit_from_step" in end:
            limits = (f"power limit {fmt(end.get('power_limit_W'))} W (observe mode: profiling would choose "
                      f"{fmt(chosen)} W; nothing was changed)")  # fmt: skip
        else:
            from_step = end.get("power_limit_from_step")
            limits = (f"power limit {fmt(chosen)} W chosen by profiling"
                      + ("" if from_step is None else f", in force from step {from_step}")
                      + f" (original {fmt(end.get('power_limit_W'))} W, restored at the end)")  # fmt: skip
        if profile is not None and profile.get("finished") is False:
            limits += f" (profiling did not finish: {_unfinished_profile(profile)})"
        missing = [k for k in ("run_name", "status", "energy_J", "time_s", "steps") if k not in end]
        print(f"run {fmt(end.get('run_name'))} ({fmt(end.get('status'))})")
        if simulated:
            print("  SIMULATED energy (virtual GPU, not measured)")
        if end.get("measurement") == "unavailable":
            print("  MEASUREMENT UNAVAILABLE")
        elif end.get("measurement_note"):
            print(wrap(f"PARTIAL: {end['measurement_note']}", "    "))
        print(wrap(f"on {_job_backend(end)}"))
        print(f"  energy {fmt(end.get('energy_J'))} J{_readable(end.get('energy_J'))} over {fmt(end.get('time_s'))} s"
              f" (mean {fmt(end.get('mean_power_W'))} W)")  # fmt: skip
        if end.get("energy_note"):  # a resumed run whose checkpoint held no measured energy
            print(wrap(f"ENERGY UNKNOWN: {end['energy_note']}", "    "))
        print(wrap(f"{fmt(end.get('steps'))} steps, {limits}"))
        if missing:
            print(f"  (the run_end record lacks {', '.join(missing)}: shown as -)")
        print_time_note(time_note_of(records))
        parts = energy_parts(end.get("energy_J"), end.get("epoch_energy_J"))
        devices = _device_lines(records, end.get("world_size"))
        for line in ([f"parts: {parts}"] if parts else []) + devices + _node_and_estimate_lines(end):
            print(wrap(line))
    if epochs:
        _print_epochs(epochs)


def _print_epochs(epochs: list[dict]) -> None:
    """The epoch table; a null counter figure is ``n/a`` with a footnote mark, its reason under the table."""
    print("  epoch   energy_J   counter_J     time_s   power_W")
    reasons: dict[str, str] = {}  # reason -> its mark, (a), (b), ... in order of first use
    for r in epochs:
        why = r.get("counter_energy_note")
        if r.get("counter_energy_J") is not None:
            counter = fmt(r["counter_energy_J"])
        elif isinstance(why, str) and why:  # logs older than the field have no reason: bare n/a
            mark = f"({chr(ord('a') + len(reasons))})" if len(reasons) < 26 else "(*)"
            counter = f"n/a {reasons.setdefault(why, mark)}"
        else:
            counter = "n/a"
        row = f"  {fmt(r.get('epoch')):>5} {fmt(r.get('energy_J')):>10} {counter:>11} "
        print(f"{row}{fmt(r.get('time_s'), '.2f'):>10} {fmt(r.get('power_W_mean')):>9}")
    for why, mark in reasons.items():
        print(wrap(f"{mark} counter_J n/a: {why}", "      "))


def _readable(energy_J: object) -> str:
    """`` (0.282 Wh)`` for a known energy (J) of a record, else nothing (a missing or null figure stays ``-``)."""
    if isinstance(energy_J, bool) or not isinstance(energy_J, (int, float)):
        return ""
    text = readable_energy(float(energy_J))
    return "" if text == "n/a" else f" ({text})"


def _device_lines(records: list[dict], world_size: object = None) -> list[str]:
    """Which device stood behind each measured GPU index (run_start's ``devices``; none in older logs).

    run_start is the main process's: under several processes (``world_size`` > 1) its devices are rank 0's
    alone, and a line above them says so (the header counts every rank's GPUs).
    """
    start = next((r for r in records if r.get("event") == "run_start"), {})
    backend = str(start.get("backend", "")).split(":")[0] or "backend"
    lines = []
    for d in start.get("devices") or []:
        if not isinstance(d, dict):
            continue
        line = f"GPU {fmt(d.get('index'))}: {backend} index {fmt(d.get('backend_index'))}, {fmt(d.get('uuid'))}"
        line += " (made up: a virtual GPU)" if d.get("virtual") else ""
        if (d.get("uuid") is None or d.get("backend_index") is None) and d.get("note"):
            line += f" ({d['note']})"
        lines.append(line)
    if lines and isinstance(world_size, int) and world_size > 1:
        lines.insert(0, f"GPU(s) of rank 0 only (the main process's; each of the {world_size} processes "
                        "measured its own, and the log names rank 0's):")  # fmt: skip
    return lines


def _node_and_estimate_lines(end: dict) -> list[str]:
    """The run_end record's CPU/DRAM/node energy (``node.rapl``) and CO2 / cost estimates, each with its factor."""
    lines = []
    if end.get("node_energy_note") and end["node_energy_note"] != NODE_OFF:  # off: nothing was asked for
        lines.append(f"CPU {_joules(end.get('cpu_energy_J'))}, DRAM {_joules(end.get('dram_energy_J'))}, node "
                     f"{_joules(end.get('node_energy_J'))} ({end['node_energy_note']})")  # fmt: skip
    carbon, cost = end.get("carbon"), end.get("cost")
    if isinstance(carbon, dict):
        figure = "unknown" if carbon.get("co2_g") is None else f"{_figure(carbon['co2_g'])} g CO2e"
        reason = f": {carbon['reason']}" if carbon.get("reason") else ""
        lines.append(f"CO2 (ESTIMATE) {figure} at {fmt(carbon.get('intensity_g_per_kWh'), 'g')} gCO2e/kWh, "
                     f"{carbon.get('intensity_source')}{_basis(carbon)}{reason}")  # fmt: skip
    if isinstance(cost, dict):
        currency = cost.get("currency")
        figure = "unknown" if cost.get("cost") is None else f"{_figure(cost['cost'])} {currency}"
        lines.append(f"cost (ESTIMATE) {figure} at {fmt(cost.get('price_per_kWh'), 'g')} {currency}/kWh"
                     + _basis(cost) + (f": {cost['reason']}" if cost.get("reason") else ""))  # fmt: skip
    return lines


def _basis(estimate: dict) -> str:
    """``, on the node's energy ...`` for an estimate that names its energy basis (logs before it did: nothing)."""
    basis = estimate.get("energy_basis")
    return f", on {ENERGY_BASES[basis]}" if basis in ENERGY_BASES else ""


def _joules(value: object) -> str:
    """``12.345 J``, or ``n/a`` for an unknown figure (as the summary prints it)."""
    return "n/a" if value is None else f"{fmt(value)} J"


def _figure(value: object) -> str:
    """A record's estimate to three significant figures (never in e-notation); as written when not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return fmt(value)
    return three_figures(float(value))


def _unfinished_profile(profile: dict[str, Any]) -> str:
    """How much of an unfinished ``power_limit_profile`` was measured, in the run's own warning's words."""
    limits = profile.get("limits")
    rows = limits if isinstance(limits, list) else []
    measured = profile.get("limits_measured")
    if isinstance(measured, int) and not isinstance(measured, bool):
        return limits_measured_text(measured, len(rows))
    # a log from before limits_measured: which of its rows was still under test is unknown
    return f"{len(rows)} limit{'' if len(rows) == 1 else 's'} tried"


def _job_backend(end: dict[str, Any]) -> str:
    """The run_end record's backend line, with the job's GPU count under several processes.

    Logs written before the summary counted every rank's GPUs there name the main process's count
    (``1 GPU(s)`` on a 2-rank run): the count is then taken from ``gpu_energy_J`` (one per GPU, every rank).
    The devices named are the main process's, so ``this process's:`` reads ``rank 0's:``.
    """
    text = fmt(end.get("backend"))
    world = end.get("world_size")
    gpus = len(end.get("gpu_energy_J") or [])
    if isinstance(world, int) and world > 1 and gpus and " processes" not in text:
        text = re.sub(r"\d+ GPU\(s\)", f"{gpus} GPU(s) over {world} processes", text, count=1)
    # The run's own summary names its process's GPUs; the log is the main process's, read afterwards.
    return text.replace("(this process's: ", "(rank 0's: ", 1)
