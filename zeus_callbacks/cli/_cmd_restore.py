"""``zeus-callbacks restore``: put back the power limits a killed run left in its restore marker."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from zeus_callbacks.backends.base import BackendError
from zeus_callbacks.errors import NotAMarker, UnsafeFile
from zeus_callbacks.optimizers.power_limit._marker import MARKER_NAME, rank_marker_globs, restore_from_marker


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``restore`` and its options on the command's subparsers."""
    restore = sub.add_parser("restore", help="put back the power limits recorded in a restore marker")
    restore.add_argument("--config", help="YAML configuration of the run (backend, log_dir, restore_marker)")
    restore.add_argument("--marker", help="the marker file; default: the configuration's")
    restore.add_argument("--json", action="store_true", help="print what was restored (and what failed) as JSON")
    restore.add_argument(
        "--force", action="store_true",
        help="restore even if the marker's owner is still running (it will not restore its limits then)",
    )  # fmt: skip
    restore.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``zeus-callbacks restore``: restore the limits in a leftover marker, print what was done per GPU.

    The restore protocol (docs/reliability.md#the-restore-protocol): a marker whose owner is
    alive is refused unless ``--force``; GPUs are matched by UUID; the marker is deleted only when
    every GPU in it is back, otherwise it keeps the GPUs still to restore. ``--json`` prints one
    object instead of lines: ``restored`` (marker, gpu, uuid, limit_W, action per GPU that is
    back), ``kept`` (marker, gpu, uuid, action, detail per GPU not restored), ``failed`` (marker,
    error per marker refused or unreadable).

    Returns:
        0 when every GPU of every marker is back (or, without ``--marker``, none was found), 1 otherwise:
        a ``--marker`` that does not exist, an owner alive, a GPU not seen, in use or refused by the
        driver, or a file that is not a marker or not this user's (it is kept).

    Raises:
        ConfigError: The configuration file is missing or invalid.
    """
    from zeus_callbacks.backends import get_backend
    from zeus_callbacks.config import load_config, parse_config

    cfg = load_config(args.config) if args.config else parse_config(None)
    as_json, marker = args.json, args.marker
    if marker:
        paths = [Path(marker)]
        if not (paths[0].exists() or paths[0].is_symlink()):  # named on purpose: its absence is an error
            if as_json:
                print(json.dumps({"restored": [], "kept": [], "failed": [
                    {"marker": marker, "error": f"no restore marker at {marker}"}]}))  # fmt: skip
            else:
                print(f"zeus-callbacks: no restore marker at {marker}", file=sys.stderr)
            return 1
    else:
        # This shell is no rank: look for the single-process marker and every rank's.
        base = Path(cfg.power_limit.restore_marker or Path(cfg.logging.log_dir) / MARKER_NAME)
        ranks = {p for pattern in rank_marker_globs(base) for p in base.parent.glob(pattern)}  # every host's
        paths = [base, *sorted(ranks)]
    paths = [p for p in paths if p.exists() or p.is_symlink()]
    report: dict[str, list[dict[str, Any]]] = {"restored": [], "kept": [], "failed": []}

    def say(line: str, *, error: bool = False) -> None:
        if not as_json:
            print(line, file=sys.stderr if error else sys.stdout)

    if not paths:
        print(json.dumps(report) if as_json else "no power-limit restore marker found: nothing to restore")
        return 0
    from zeus_callbacks.backends.virtual import virtual_backend_kwargs

    backend = get_backend(cfg.backend, virtual=lambda: virtual_backend_kwargs(cfg.virtual))
    try:
        for path in paths:
            try:
                outcome = restore_from_marker(path, backend, force=args.force)
            except (NotAMarker, UnsafeFile) as exc:
                report["failed"].append({"marker": str(path), "error": f"{exc}; it was left untouched"})
                say(f"zeus-callbacks: {exc}; it was left untouched", error=True)
                continue
            except (BackendError, OSError) as exc:
                report["failed"].append({"marker": str(path), "error": str(exc)})
                say(f"zeus-callbacks: cannot restore the power limits in {path}: {exc}", error=True)
                continue
            if outcome is None:
                continue
            if outcome.refused is not None:
                report["failed"].append({"marker": str(path), "error": f"refused: {outcome.refused}"})
                say(f"{path}: refused: {outcome.refused}", error=True)
                continue
            for r in outcome.gpus:
                entry = {"marker": str(path), "gpu": r.gpu.index, "uuid": r.gpu.uuid, "action": r.action}
                if r.back:
                    report["restored"].append({**entry, "limit_W": r.limit_W})
                else:
                    report["kept"].append({**entry, "detail": r.detail})
                say(f"{r.describe()} ({path.name})", error=not r.back)
            if outcome.removed:
                say(f"{path}: every GPU is back; marker removed")
            else:
                say(f"{path}: kept, holding the GPUs not restored", error=True)
    finally:
        backend.close()
    if as_json:
        print(json.dumps(report, indent=2))
    return 1 if report["failed"] or report["kept"] else 0
