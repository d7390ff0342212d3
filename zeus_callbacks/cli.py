"""The ``zeus-callbacks`` command.

Subcommands:
    validate-config FILE   check a YAML configuration; exit 1 with the errors if invalid
    report RUN.jsonl       print a run's energy, time, power limit and per-epoch breakdown
    restore                put back the power limits a killed run left changed (its marker file)
    simulate ...           replay a recurring job on the Zeus traces (see ``zeus-callbacks simulate -h``)
    show STORE             jobs, arms (posterior mean and spread), trials and profiles of a store
    plot power-limit RUN.jsonl | plot bandit STORE JOB | plot profile PROFILE.json
                           the power-limit frontier with the chosen point, the bandit's history, or a
                           fine-grain power profile (``profile-kernel --json``), to PNG
    profile-kernel         fine-grain energy per execution of a demo kernel or ``module:function``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from zeus_callbacks.cli_args import float_in, int_at_least
from zeus_callbacks.cli_format import TERMINAL_COLUMNS, fmt, progress_bar
from zeus_callbacks.config import ConfigError, load_config
from zeus_callbacks.errors import ZeusCallbacksError
from zeus_callbacks.reporting import NotAnEnergyLog, read_jsonl


def _validate_config(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(config.model_dump(mode="json"), indent=2))
    else:
        print(f"{args.file}: valid (backend {config.backend}, job_id {config.job_id!r})")
    return 0


def _report(args: argparse.Namespace) -> int:
    path = Path(args.run)
    try:
        records = read_jsonl(path)
    except FileNotFoundError:
        print(f"zeus-callbacks: no such energy log: {path}", file=sys.stderr)
        return 1
    except NotAnEnergyLog as exc:
        print(f"zeus-callbacks: {exc}", file=sys.stderr)
        return 1
    if not records:
        print(f"zeus-callbacks: {path} holds no records", file=sys.stderr)
        return 1
    end = next((r for r in reversed(records) if r.get("event") == "run_end"), None)
    epochs = [r for r in records if r.get("event") == "epoch"]
    if args.json:
        print(json.dumps({"run_end": end, "epochs": epochs}, indent=2))
        return 0
    if end is None:
        print(f"{path}: the run has no run_end record (still running, or killed before it ended)")
    else:
        profile = next((r for r in reversed(records) if r.get("event") == "power_limit_profile"), None)
        chosen = None if profile is None else profile.get("chosen_limit_W")
        limits = f"power limit at the end {fmt(end.get('power_limit_W'))} W" + (
            "" if chosen is None else f", chosen by profiling {fmt(chosen)} W"
        )
        if profile is not None and profile.get("finished") is False:
            limits += f" (profiling did not finish: {len(profile.get('limits') or [])} limits measured)"
        missing = [k for k in ("run_name", "status", "energy_J", "time_s", "steps") if k not in end]
        print(
            f"run {fmt(end.get('run_name'))} ({fmt(end.get('status'))})\n"
            + textwrap.fill(
                f"on {fmt(end.get('backend'))}", TERMINAL_COLUMNS, initial_indent="  ", subsequent_indent="     "
            )
            + f"\n  energy {fmt(end.get('energy_J'))} J over {fmt(end.get('time_s'))} s"
            f" (mean {fmt(end.get('mean_power_W'))} W)"
            f"\n  {fmt(end.get('steps'))} steps, {limits}"
            + (f"\n  (the run_end record lacks {', '.join(missing)}: shown as -)" if missing else "")
        )
    if epochs:
        print("  epoch   energy_J   counter_J     time_s   power_W")
        for r in epochs:
            counter = "n/a" if r.get("counter_energy_J") is None else fmt(r["counter_energy_J"])
            row = f"  {fmt(r.get('epoch')):>5} {fmt(r.get('energy_J')):>10} {counter:>11} "
            print(f"{row}{fmt(r.get('time_s'), '.2f'):>10} {fmt(r.get('power_W_mean')):>9}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from zeus_callbacks.cli_store import show

    if "://" not in args.store and not Path(args.store).exists():  # a database URL is opened, not stat'ed
        print(f"zeus-callbacks: no such store: {args.store}", file=sys.stderr)
        return 1
    print(show(args.store, as_json=args.json))  # a StoreError is reported by main()
    return 0


def _plot(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.is_dir():  # -o DIR: a file in it, named after the plot
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
            plot_profile(profile.get("limits") or [], profile.get("chosen_limit_W"), out, partial=partial)
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
            from zeus_callbacks.cli_store import plot_bandit_history

            if not args.job:
                print("zeus-callbacks: plot bandit needs the job id: plot bandit STORE JOB", file=sys.stderr)
                return 1
            plot_bandit_history(args.source, args.job, out)
    except (FileNotFoundError, ZeusCallbacksError) as exc:  # not a log / profile / store, or nothing to plot
        print(f"zeus-callbacks: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


def _restore(args: argparse.Namespace) -> int:
    from zeus_callbacks.cli_restore import restore_command

    return restore_command(config_path=args.config, marker=args.marker, as_json=args.json)


def _demo_kernel(args: argparse.Namespace):
    """Build the callable to profile: a builtin torch demo or ``module:function``."""
    if ":" in args.kernel:
        import importlib

        module, _, attr = args.kernel.partition(":")
        try:
            return getattr(importlib.import_module(module), attr), args.kernel
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot import the kernel {args.kernel!r}: {exc}") from exc
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    if device == "cpu" and dtype != torch.float32:
        dtype = torch.float32
    n = args.size
    if args.kernel == "matmul":
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)

        def matmul() -> None:
            for _ in range(args.chain):
                torch.mm(a, b)

        return matmul, f"matmul {n}x{n} {args.dtype} x{args.chain} on {device}"
    if args.kernel == "copy":
        src = torch.empty(n * 2**20 // 4, device=device, dtype=torch.float32)
        dst = torch.empty_like(src)

        def copy() -> None:
            for _ in range(args.chain):
                dst.copy_(src)

        return copy, f"copy {n} MiB x{args.chain} on {device}"
    raise ValueError(f"unknown kernel {args.kernel!r}: choose matmul, copy or module:function")


def _profile_kernel(args: argparse.Namespace) -> int:
    from zeus_callbacks.backends import get_backend
    from zeus_callbacks.measurement.profiler import profile

    try:
        fn, name = _demo_kernel(args)
    except (ValueError, ImportError, AttributeError) as exc:
        print(f"zeus-callbacks: {exc}", file=sys.stderr)
        return 1
    backend = get_backend(args.backend)
    bar = progress_bar(args.max_time, "measuring", enabled=not args.no_progress and args.json is None, unit="s")

    def progress(elapsed_s: float, rel_ci: float | None) -> None:
        bar.update(min(elapsed_s, args.max_time) - bar.n)
        if rel_ci is not None:
            bar.set_postfix_str(f"CI ±{rel_ci:.1%} (target ±{args.target_ci:.1%})", refresh=False)

    to_stdout = args.json == "-"
    try:
        if backend.name == "virtual":  # no real sensor: the virtual GPU is busy while fn runs
            inner = fn

            def fn() -> None:
                backend.set_utilization(1.0)  # type: ignore[attr-defined]
                inner()
                backend.set_utilization(0.0)  # type: ignore[attr-defined]

            backend.set_utilization(0.0)  # type: ignore[attr-defined]
        result = profile(
            fn, mode=args.mode, target_ci=args.target_ci, backend=backend, gpu_index=args.gpu,
            max_time_s=args.max_time, min_time_s=min(args.min_time, args.max_time), name=name,
            json_path=None if to_stdout else args.json, plot_path=args.plot, progress=progress,
        )  # fmt: skip
    finally:
        bar.close()
        backend.close()
    if to_stdout:
        print(json.dumps(result.as_dict(), indent=1))
        return 0
    lo, hi = result.energy_ci_J
    print(
        f"{result.name} ({result.mode}, {result.timer}) on {result.device}\n"
        f"  energy/execution {result.energy_J * 1e3:.4g} mJ  95% CI [{lo * 1e3:.4g}, {hi * 1e3:.4g}] mJ"
        f"  over {result.executions_used} executions ({result.executions_dropped} dropped)\n"
        f"  duration {result.duration_s * 1e3:.4g} ms, mean power {result.energy_J / result.duration_s:.1f} W, "
        f"baseline {result.baseline_W if result.baseline_W is None else round(result.baseline_W, 1)} W "
        f"({result.baseline_source})"
    )
    if not result.target_met:  # also `target_met: false` in --json
        print(f"  the target CI ±{args.target_ci:.1%} was not reached in {result.measurement_time_s:.1f} s: "
              "raise --max-time, or --chain for a longer execution")
    if lo < 0:
        print("  the CI's lower end is below 0 J: too few executions for this kernel's energy; it is the "
              "bootstrap's interval, not clipped, so read it as 'not resolved'")
    return 0


def _package_version() -> str:
    """The version of the package this command runs (``zeus_callbacks._version``, its one source)."""
    from zeus_callbacks._version import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``zeus-callbacks`` command."""
    parser = argparse.ArgumentParser(prog="zeus-callbacks", description="GPU energy for training runs.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    validate = sub.add_parser("validate-config", help="check a YAML configuration file")
    validate.add_argument("file")
    validate.add_argument("--json", action="store_true", help="print the validated configuration as JSON")
    validate.set_defaults(func=_validate_config)
    report = sub.add_parser("report", help="summarise a run's JSONL energy log")
    report.add_argument("run", help="path of the run's .jsonl file")
    report.add_argument("--json", action="store_true")
    report.set_defaults(func=_report)
    restore = sub.add_parser("restore", help="put back the power limits recorded in a restore marker")
    restore.add_argument("--config", help="YAML configuration of the run (backend, log_dir, restore_marker)")
    restore.add_argument("--marker", help="the marker file; default: the configuration's")
    restore.add_argument("--json", action="store_true", help="print what was restored (and what failed) as JSON")
    restore.set_defaults(func=_restore)
    sub.add_parser("simulate", help="replay a recurring job on the Zeus traces (options: simulate -h)")
    show = sub.add_parser("show", help="jobs, arms, trials and power-limit profiles of a store")
    show.add_argument("store", help="the SQLite or JSON store file")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=_show)
    plot = sub.add_parser(
        "plot", help="plot a power-limit profile (a run log), a bandit history (a store) or a fine-grain power profile"
    )
    plot.add_argument("what", choices=["power-limit", "bandit", "profile"])
    plot.add_argument(
        "source", help="power-limit: the run's .jsonl; bandit: the store file; profile: the profile-kernel --json file"
    )
    plot.add_argument("job", nargs="?", help="bandit: the job id")
    plot.add_argument("-o", "--out", default="zeus_plot.png", help="PNG file to write (a folder: zeus_WHAT.png in it)")
    plot.set_defaults(func=_plot)
    prof = sub.add_parser("profile-kernel", help="fine-grain energy per execution of a kernel (FinGraV)")
    prof.add_argument("kernel", nargs="?", default="matmul", help="matmul, copy, or module:function (no arguments)")
    prof.add_argument("--size", type=int_at_least(1), default=4096, help="matmul: matrix side; copy: MiB")
    prof.add_argument("--chain", type=int_at_least(1), default=1, help="kernels per execution")
    prof.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    prof.add_argument("--mode", choices=["steady", "isolated"], default="steady")
    prof.add_argument(
        "--target-ci", type=float_in(0, 1, low_open=True, high_open=True), default=0.02,
        help="relative CI half-width to reach, in (0, 1)",
    )  # fmt: skip
    prof.add_argument("--max-time", type=float_in(0, low_open=True), default=10.0, help="most seconds of measurement")
    prof.add_argument("--min-time", type=float_in(0, low_open=True), default=1.0, help="least seconds of measurement")
    prof.add_argument("--backend", choices=["auto", "nvml", "amdsmi", "virtual"], default="auto")
    prof.add_argument("--gpu", type=int_at_least(0), default=0, help="backend index of the GPU")
    prof.add_argument(
        "--json", nargs="?", const="-", metavar="FILE",
        help="write the result as JSON to FILE; --json alone prints it (no summary, no progress bar)",
    )  # fmt: skip
    prof.add_argument("--no-progress", action="store_true", help="no progress bar (shown only on a terminal)")
    prof.add_argument("--plot", help="save the power-profile plot (PNG) here")
    prof.set_defaults(func=_profile_kernel)
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
        from zeus_callbacks.simulate import main as simulate_main

        return simulate_main(argv[1:], prog="zeus-callbacks simulate")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
