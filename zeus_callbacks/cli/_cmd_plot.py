"""``zeus-callbacks plot``: a run's course or power-limit profile (a log), a bandit history or a power profile, to PNG.

The figures themselves are drawn in :mod:`zeus_callbacks._plots`; this module finds what to plot.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from zeus_callbacks._run_log import impossible_figures, is_simulated, last_record, run_course, time_note_of
from zeus_callbacks._terminal import name_impossible_figures, print_time_note
from zeus_callbacks.errors import NotAnEnergyLog, NothingToPlot, ZeusCallbacksError
from zeus_callbacks.reporting import is_energy_log, no_such_job, not_a_store_but_a_log, read_jsonl
from zeus_callbacks.store import open_store


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``plot`` and its options on the command's subparsers."""
    plot = sub.add_parser(
        "plot",
        help="plot a run's power and energy per step or its power-limit profile (a run log), a bandit history "
        "(a store) or a fine-grain power profile",
    )
    plot.add_argument("what", choices=["run", "power-limit", "bandit", "profile"])
    plot.add_argument(
        "source",
        help="run, power-limit: the run's .jsonl; bandit: the store file; profile: the profile-kernel --json file",
    )
    plot.add_argument("job", nargs="?", help="bandit: the job id")
    plot.add_argument(
        "-o", "--out", default="zeus_plot.png",
        help="PNG file to write; a folder (existing, or ending in /: created) gets zeus_WHAT.png in it",
    )  # fmt: skip
    plot.set_defaults(func=run)


SIMULATED_SUFFIX = " (SIMULATED: virtual GPU)"
"""Added to ``wrote FILE`` by every plot of virtual-GPU data, as the figure itself is marked."""


def run(args: argparse.Namespace) -> int:
    """Draw the figure ``args.what`` of ``args.source`` into ``args.out``.

    Prints ``wrote FILE``, with :data:`SIMULATED_SUFFIX` when the data come from the virtual GPU, then
    what the figure cannot show (``TIME NOT SIMULATED:`` and ``note:`` lines) where that applies.

    Returns:
        0 when written, 1 (the reason on stderr) when there is nothing to plot or the source is unreadable,
        or when the log holds figures no run writes (drawn, then named on stderr).
    """
    out = Path(args.out)
    if out.is_dir() or args.out.endswith(("/", os.sep)):  # -o DIR/: a file in it (created), named after the plot
        out = out / f"zeus_{args.what}.png"
    elif not out.suffix:  # matplotlib would add .png itself; say the name it writes
        out = out.with_suffix(".png")
    plotters = {"run": _plot_run, "power-limit": _plot_power_limit, "bandit": _plot_bandit, "profile": _plot_profile}
    try:
        drawn = plotters[args.what](args, out)  # None: refused, the reason on stderr
    except (FileNotFoundError, ZeusCallbacksError) as exc:  # not a log / profile / store, or nothing to plot
        if isinstance(exc, FileNotFoundError) and exc.filename == str(out):  # -o in a folder that cannot hold it
            print(f"zeus-callbacks: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        else:
            print(f"zeus-callbacks: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:  # matplotlib missing: the extra to install, not a traceback
        if "matplotlib" not in str(exc):
            raise
        # plots._pyplot's own message already names the extra; name it once
        detail = "" if "zeus-callbacks[plot]" in str(exc) else f" ({exc})"
        print(f"zeus-callbacks: plotting needs matplotlib: install it with "
              f"pip install 'zeus-callbacks[plot]'{detail}", file=sys.stderr)  # fmt: skip
        return 1
    except OSError as exc:  # the PNG cannot be written there (-o in a missing or read-only place)
        print(f"zeus-callbacks: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if drawn is None:  # refused; the reason is on stderr
        return 1
    print(f"wrote {out}" + (SIMULATED_SUFFIX if drawn.simulated else ""))
    print_time_note(drawn.time_note)
    for line in drawn.lines:
        print(line)
    return 1 if name_impossible_figures(args.source, drawn.impossible) else 0


@dataclass(frozen=True)
class Drawn:
    """What a plot command drew, for the lines it prints after ``wrote FILE``."""

    simulated: bool  # the data come from the virtual GPU
    time_note: str | None = None  # the log's time_note (time not simulated)
    lines: tuple[str, ...] = ()  # further lines to print: notes, a partial profile
    impossible: tuple[str, ...] = ()  # figures no run writes (_run_log.impossible_figures): named, then exit 1


def _plot_profile(args: argparse.Namespace, out: Path) -> Drawn | None:
    """``plot profile PROFILE.json``: a ``profile-kernel --json`` file's power profile."""
    from zeus_callbacks.measurement.kernel_profiler import ProfileResult

    if args.job:
        print("zeus-callbacks: plot profile takes one file: plot profile PROFILE.json", file=sys.stderr)
        return None
    try:
        result = ProfileResult.read_json(args.source)
    except FileNotFoundError:
        print(f"zeus-callbacks: no such profile file: {args.source}", file=sys.stderr)
        return None
    result.plot(out)
    return Drawn(simulated=result.simulated)


def _plot_bandit(args: argparse.Namespace, out: Path) -> Drawn | None:
    """``plot bandit STORE JOB``: each recurrence's cost (:func:`zeus_callbacks._plots.plot_bandit_costs`).

    None (the reason on stderr) when the store has no job ``JOB``, worded as ``show`` words it.

    Raises:
        StoreError: The store cannot be read.
        NothingToPlot: The job has no finished trial.
    """
    from zeus_callbacks._plots import plot_bandit_costs

    if not args.job:
        print("zeus-callbacks: plot bandit needs the job id: plot bandit STORE JOB", file=sys.stderr)
        return None
    if is_energy_log(args.source):
        print(f"zeus-callbacks: {not_a_store_but_a_log(args.source)}", file=sys.stderr)
        return None
    with open_store(args.source, read_only=True) as store:
        job_ids = [job.job_id for job in store.list_jobs()]
        trials = [t for t in store.list_trials(args.job) if t.cost is not None] if args.job in job_ids else []
    if args.job not in job_ids:  # as show says it
        print(f"zeus-callbacks: {no_such_job(args.source, args.job, job_ids)}", file=sys.stderr)
        return None
    if not trials:
        raise NothingToPlot(f"job {args.job!r} has no finished trial in {args.source}")
    simulated = any(t.info.get("simulated") for t in trials)  # a trial on the virtual GPU: the figure says so
    plot_bandit_costs(trials, args.job, out, simulated=simulated)
    return Drawn(simulated=simulated)


def _read_log(source: str) -> list[dict] | None:
    """The log's records, or None (the reason on stderr) when there is no such file."""
    try:
        return read_jsonl(source)
    except FileNotFoundError:
        print(f"zeus-callbacks: no such energy log: {source}", file=sys.stderr)
        return None


def _plot_power_limit(args: argparse.Namespace, out: Path) -> Drawn | None:
    """``plot power-limit LOG.jsonl``: the log's power-limit profile (:func:`zeus_callbacks._plots.plot_profile`)."""
    from zeus_callbacks._plots import plot_profile

    records = _read_log(args.source)
    if records is None:
        return None
    profile = last_record(records, "power_limit_profile")
    if profile is None:
        print(f"zeus-callbacks: {args.source} has no power_limit_profile record", file=sys.stderr)
        return None
    partial = profile.get("finished") is False
    simulated = is_simulated(records)  # the profile record carries ``simulated`` too
    time_note = time_note_of(records)
    rows, chosen = profile_rows(profile, args.source)
    plot_profile(rows, chosen, out, partial=partial, simulated=simulated, time_note=time_note)
    unfinished = f"{args.source}: power-limit profiling did not finish; plotting the limits it measured"
    return Drawn(simulated=simulated, time_note=time_note, lines=(unfinished,) if partial else ())


def _plot_run(args: argparse.Namespace, out: Path) -> Drawn | None:
    """``plot run LOG.jsonl``: the run's course (:func:`zeus_callbacks._plots.plot_run`); errors go to :func:`run`."""
    from zeus_callbacks._plots import plot_run

    if args.job:
        print("zeus-callbacks: plot run takes one file: plot run RUN.jsonl", file=sys.stderr)
        return None
    records = _read_log(args.source)
    if records is None:
        return None
    course = run_course(records, args.source)
    plot_run(course, out)
    return Drawn(simulated=course.simulated, time_note=course.time_note,
                 lines=tuple(f"  note: {note}" for note in course.notes),
                 impossible=tuple(impossible_figures(records)))  # fmt: skip


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def profile_rows(profile: dict, source: str) -> tuple[list[dict], float | None]:
    """The measured rows and the chosen limit of a ``power_limit_profile`` record, checked.

    Raises:
        NotAnEnergyLog: The record's ``limits`` is not a list of rows with a numeric ``limit_W`` and
            numeric (or null) ``time_per_step_s`` / ``energy_per_step_J``, or ``chosen_limit_W`` is
            neither a number nor null.
        NothingToPlot: No row has a measurement.
    """
    limits, chosen = profile.get("limits") or [], profile.get("chosen_limit_W")
    rows_ok = isinstance(limits, list) and all(
        isinstance(row, dict)
        and _number(row.get("limit_W"))
        and all(row.get(k) is None or _number(row.get(k)) for k in ("time_per_step_s", "energy_per_step_J"))
        for row in limits
    )
    if not rows_ok or (chosen is not None and not _number(chosen)):
        raise NotAnEnergyLog(
            f"{source}: its power_limit_profile record is malformed (limits must be rows with a numeric limit_W "
            "and numeric or null time_per_step_s and energy_per_step_J; chosen_limit_W a number or null)"
        )
    measured = [r for r in limits if _number(r.get("time_per_step_s")) and _number(r.get("energy_per_step_J"))]
    if not measured:
        raise NothingToPlot(f"{source}: its power_limit_profile record has no measured limit")
    return limits, chosen
