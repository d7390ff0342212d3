"""``zeus-callbacks restore``: put back the power limits a killed run left in its restore marker."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from zeus_callbacks.backends.base import BackendError
from zeus_callbacks.errors import NotAMarker
from zeus_callbacks.optimizers.power_limit.marker import MARKER_NAME, restore_from_marker


def restore_command(config_path: str | None = None, marker: str | None = None, *, as_json: bool = False) -> int:
    """``zeus-callbacks restore``: restore the limits in a leftover marker, print what was done.

    Args:
        config_path: The run's YAML configuration (backend, ``logging.log_dir``, marker path).
        marker: The marker file, overriding the configuration's.
        as_json: Print one JSON object instead of lines: ``restored`` (marker, gpu,
            limit_W per GPU) and ``failed`` (marker, error per marker kept).

    Returns:
        0 when restored (or nothing to restore), 1 when a limit could not be restored or a
        file is not a marker (it is kept).

    Raises:
        ConfigError: The configuration file is missing or invalid.
    """
    from zeus_callbacks.backends import get_backend
    from zeus_callbacks.config import load_config, parse_config

    cfg = load_config(config_path) if config_path else parse_config(None)
    if marker:
        paths = [Path(marker)]
    else:
        # This shell is no rank: look for the single-process marker and every rank's.
        base = Path(cfg.power_limit.restore_marker or Path(cfg.logging.log_dir) / MARKER_NAME)
        paths = [base, *sorted(base.parent.glob(f"{base.stem}.rank*{base.suffix}"))]
    paths = [p for p in paths if p.exists()]
    report: dict[str, list[dict[str, Any]]] = {"restored": [], "failed": []}
    if not paths:
        print(json.dumps(report) if as_json else "no power-limit restore marker found: nothing to restore")
        return 0
    backend = get_backend(cfg.backend, virtual=cfg.virtual)
    try:
        for path in paths:
            try:
                restored = restore_from_marker(path, backend)
            except NotAMarker as exc:
                report["failed"].append({"marker": str(path), "error": f"{exc}; it was left untouched"})
                if not as_json:
                    print(f"zeus-callbacks: {exc}; it was left untouched", file=sys.stderr)
                continue
            except BackendError as exc:
                report["failed"].append({"marker": str(path), "error": str(exc)})
                if not as_json:
                    print(f"cannot restore the power limits in {path}: {exc}", file=sys.stderr)
                continue
            for index, limit in (restored or {}).items():
                report["restored"].append({"marker": str(path), "gpu": index, "limit_W": limit})
                if not as_json:
                    print(f"GPU {index}: power limit restored to {limit:.0f} W ({path.name})")
    finally:
        backend.close()
    if as_json:
        print(json.dumps(report, indent=2))
    return 1 if report["failed"] else 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``restore`` and its options on the command's subparsers."""
    restore = sub.add_parser("restore", help="put back the power limits recorded in a restore marker")
    restore.add_argument("--config", help="YAML configuration of the run (backend, log_dir, restore_marker)")
    restore.add_argument("--marker", help="the marker file; default: the configuration's")
    restore.add_argument("--json", action="store_true", help="print what was restored (and what failed) as JSON")
    restore.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run :func:`restore_command` with the command line's options; returns its exit status."""
    return restore_command(config_path=args.config, marker=args.marker, as_json=args.json)
