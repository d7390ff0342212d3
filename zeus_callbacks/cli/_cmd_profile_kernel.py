"""``zeus-callbacks profile-kernel``: fine-grain energy per execution of a demo kernel or ``module:function``."""

from __future__ import annotations

import argparse
import json
import sys

from zeus_callbacks._argtypes import float_in, int_at_least
from zeus_callbacks._terminal import progress_bar
from zeus_callbacks._units import readable_interval_J, readable_joules, significant_figures
from zeus_callbacks.cli._cmd_plot import SIMULATED_SUFFIX

MARKED_IN = "the printed result, its JSON (simulated: true) and its plot"
"""What marks a virtual-GPU profile SIMULATED, for the fallback's warning: it writes no run records."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``profile-kernel`` and its options on the command's subparsers."""
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
    prof.set_defaults(func=run)


def _demo_kernel(args: argparse.Namespace):
    """Build the callable to profile: a builtin torch demo or ``module:function``."""
    if ":" in args.kernel:
        import importlib
        import inspect

        module, _, attr = args.kernel.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot import the kernel {args.kernel!r}: {exc}") from exc
        if not callable(fn):
            raise ValueError(f"the kernel {args.kernel!r} is a {type(fn).__name__}, not a function")
        try:
            inspect.signature(fn).bind()
        except TypeError as exc:  # it needs arguments the profiler cannot give
            raise ValueError(f"the kernel {args.kernel!r} must take no arguments ({exc})") from None
        except ValueError:  # no signature (a builtin): it is tried as it is
            pass
        return fn, args.kernel
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    dtype = dtype if device == "cuda" else torch.float32
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


def run(args: argparse.Namespace) -> int:
    """Profile the kernel ``args.kernel`` and print its energy per execution (or write it as JSON).

    Returns:
        0, or 1 when the kernel cannot be built or imported.
    """
    from zeus_callbacks.backends import get_backend
    from zeus_callbacks.measurement.kernel_profiler import profile

    try:
        fn, name = _demo_kernel(args)
    except (ValueError, ImportError, AttributeError) as exc:
        print(f"zeus-callbacks: {exc}", file=sys.stderr)
        return 1
    backend = get_backend(args.backend, marked_in=MARKED_IN)
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
    if result.energy_ci_J is None:
        interval = "  no 95% CI"
    else:
        lo, hi = result.energy_ci_J
        interval = f"  95% CI {readable_interval_J(lo, hi, result.energy_J, figures=4)}"
    print(
        f"{result.name} ({result.mode}, {result.timer}) on {result.device}"
        + ("\n  SIMULATED (virtual GPU): power from a trace, not measured" if result.simulated else "")
        + f"\n  energy/execution {readable_joules(result.energy_J, figures=4)}{interval}"
        f"  over {result.executions_used} execution{'' if result.executions_used == 1 else 's'}"
        f" ({result.executions_dropped} dropped)\n"
        f"  duration {significant_figures(result.duration_s * 1e3, 4)} ms, "
        f"mean power {result.energy_J / result.duration_s:.1f} W, "
        f"baseline {result.baseline_W if result.baseline_W is None else round(result.baseline_W, 1)} W "
        f"({result.baseline_source})"
    )
    if result.ci_reason is not None:  # also null CI fields, `ci_reason` and `target_met: false` in --json
        print(
            f"  no confidence interval: {result.ci_reason}; the target CI ±{args.target_ci:.1%} is not met: "
            "raise --max-time, or lower --chain / --size for shorter executions"
        )
    elif not result.target_met:  # also `target_met: false` in --json
        print(
            f"  the target CI ±{args.target_ci:.1%} was not reached in {result.measurement_time_s:.1f} s: "
            "raise --max-time, or --chain for a longer execution"
        )
    if result.energy_ci_J is not None and result.energy_ci_J[0] < 0:
        print(
            "  the CI's lower end is below 0 J: too few executions for this kernel's energy; it is the "
            "bootstrap's interval, not clipped, so read it as 'not resolved'"
        )
    for path in (args.json, args.plot):  # as every command that writes a file says so (docs/cli.md)
        if path is not None:
            print(f"wrote {path}" + (SIMULATED_SUFFIX if result.simulated else ""))
    return 0
