"""``zeus-callbacks plot``: a power-limit profile (a run log), a bandit history (a store) or a power profile, to PNG.

The figures themselves are drawn in :mod:`zeus_callbacks.plots`; this module finds what to plot.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from zeus_callbacks.errors import NothingToPlot, ZeusCallbacksError
from zeus_callbacks.reporting import read_jsonl
from zeus_callbacks.store import open_store


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``plot`` and its options on the command's subparsers."""
    plot = sub.add_parser(
        "plot", help="plot a power-limit profile (a run log), a bandit history (a store) or a fine-grain power profile"
    )
    plot.add_argument("what", choices=["power-limit", "bandit", "profile"])
    plot.add_argument(
        "source", help="power-limit: the run's .jsonl; bandit: the store file; profile: the profile-kernel --json file"
    )
    plot.add_argument("job", nargs="?", help="bandit: the job id")
    plot.add_argument(
        "-o", "--out", default="zeus_plot.png",
        help="PNG file to write; a folder (existing, or ending in /: created) gets zeus_WHAT.png in it",
    )  # fmt: skip
    plot.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Draw the figure ``args.what`` of ``args.source`` into ``args.out``.

    Returns:
        0 when written, 1 (the reason on stderr) when there is nothing to plot or the source is unreadable.
    """
    out = Path(args.out)
    if out.is_dir() or args.out.endswith(("/", os.sep)):  # -o DIR/: a file in it (created), named after the plot
        out = out / f"zeus_{args.what}.png"
    elif not out.suffix:  # matplotlib would add .png itself; say the name it writes
        out = out.with_suffix(".png")
    try:
        if args.what == "power-limit":
            from zeus_callbacks.plots import plot_profile

            records = read_jsonl(args.source)
            profile = next((r for r in reversed(records) if r.get("event") == "power_limit_profile"), None)
            if profile is None:
                print(f"zeus-callbacks: {args.source} has no power_limit_profile record", file=sys.stderr)
                return 1
            partial = profile.get("finished") is False
            start = next((r for r in records if r.get("event") == "run_start"), {})
            simulated = str(start.get("backend", "")).startswith("virtual")
            plot_profile(profile.get("limits") or [], profile.get("chosen_limit_W"), out, partial=partial,
                         simulated=simulated)  # fmt: skip
            if partial:
                print(f"{args.source}: power-limit profiling did not finish; plotting the limits it measured")
        elif args.what == "profile":
            from zeus_callbacks.measurement.profiler import ProfileResult

            if args.job:
                print("zeus-callbacks: plot profile takes one file: plot profile PROFILE.json", file=sys.stderr)
                return 1
            try:
                result = ProfileResult.read_json(args.source)
            except FileNotFoundError:
                print(f"zeus-callbacks: no such profile file: {args.source}", file=sys.stderr)
                return 1
            result.plot(out)
        else:
            if not args.job:
                print("zeus-callbacks: plot bandit needs the job id: plot bandit STORE JOB", file=sys.stderr)
                return 1
            plot_bandit_history(args.source, args.job, out)
    except (FileNotFoundError, ZeusCallbacksError) as exc:  # not a log / profile / store, or nothing to plot
        print(f"zeus-callbacks: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:  # matplotlib missing: the extra to install, not a traceback
        if "matplotlib" not in str(exc):
            raise
        print(f"zeus-callbacks: plotting needs matplotlib: install zeus-callbacks[plot] "
              f"(pip install 'zeus-callbacks[plot]') ({exc})", file=sys.stderr)  # fmt: skip
        return 1
    print(f"wrote {out}")
    return 0


def plot_bandit_history(store_path: str | Path, job_id: str, path: str | Path) -> Path:
    """Plot each recurrence's cost of ``job_id`` in a store (see :func:`zeus_callbacks.plots.plot_bandit_costs`).

    Raises:
        StoreError: The store cannot be read.
        NothingToPlot: The job has no finished trial.
    """
    from zeus_callbacks.plots import plot_bandit_costs

    with open_store(store_path, read_only=True) as store:
        trials = [t for t in store.list_trials(job_id) if t.cost is not None]
    if not trials:
        raise NothingToPlot(f"job {job_id!r} has no finished trial in {store_path}")
    return plot_bandit_costs(trials, job_id, path, simulated=any(t.info.get("simulated") for t in trials))
