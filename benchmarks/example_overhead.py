"""Step-time overhead of the callbacks on the two example jobs, and their energy summaries.

Runs ``examples/lightning_digits.py`` and ``examples/hf_text.py`` with and without the
callback, interleaved (on, off, on, off, ...) so machine noise hits both alike, and
reports the median time per step of each and their ratio. On a shared GPU run it with
``ZEUS_CALLBACKS_READ_ONLY=1``; it reads the power limit before and after and fails if
they differ.

    ZEUS_CALLBACKS_READ_ONLY=1 python benchmarks/example_overhead.py --rounds 3 --out results/

The last line printed is one JSON object with the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

JOBS = {
    "lightning_digits": [sys.executable, str(ROOT / "examples" / "lightning_digits.py"), "--epochs", "10"],
    "hf_text": [
        sys.executable,
        str(ROOT / "examples" / "hf_text.py"),
        "--max-steps",
        "300",
        "--layers",
        "6",
        "--width",
        "512",
        "--batch-size",
        "32",
        "--block",
        "256",
    ],
}


def power_limits_W() -> list[float] | None:
    """Read every GPU's power limit through our own NVML backend (None without NVIDIA)."""
    from zeus_callbacks.backends import BackendUnavailable, get_backend

    try:
        backend = get_backend("nvml", read_only=True)
    except BackendUnavailable:
        return None
    try:
        return [backend.power_limit_W(i) for i in range(backend.device_count())]
    finally:
        backend.close()


def run(job: str, with_callback: bool, work: Path, round_index: int) -> dict:
    summary = work / f"{job}_{'on' if with_callback else 'off'}_{round_index}.json"
    command = [*JOBS[job], "--summary-json", str(summary), "--config", str(ROOT / "examples" / "zeus.yaml")]
    if not with_callback:
        command.append("--no-callback")
    log = work / f"{job}_{'on' if with_callback else 'off'}_{round_index}.log"
    with open(log, "w") as stream:
        finished = subprocess.run(command, cwd=work, stdout=stream, stderr=subprocess.STDOUT)
    if finished.returncode != 0:
        raise SystemExit(f"{job} failed (exit {finished.returncode}); its output:\n{log.read_text()[-4000:]}")
    return json.loads(summary.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("example_overhead"), help="where the JSON report goes")
    parser.add_argument("--work", type=Path, help="where the runs write their logs (default: a temporary folder)")
    parser.add_argument("--jobs", nargs="+", default=list(JOBS))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="zeus-overhead-"))
    work.mkdir(parents=True, exist_ok=True)
    before = power_limits_W()
    report: dict = {"read_only": os.environ.get("ZEUS_CALLBACKS_READ_ONLY"), "power_limits_before_W": before}
    for job in args.jobs:
        per_step = {True: [], False: []}
        wall = {True: [], False: []}
        summaries = []
        for r in range(args.rounds):
            for with_callback in (True, False):
                result = run(job, with_callback, work, r)
                per_step[with_callback].append(result["median_step_s"])
                wall[with_callback].append(result["wall_s"])
                if with_callback:
                    summaries.append(result["summary"])
        on, off = statistics.median(per_step[True]), statistics.median(per_step[False])
        report[job] = {
            "step_time_s_on": per_step[True],
            "step_time_s_off": per_step[False],
            "median_ratio_on_off": on / off,
            "wall_s_on": wall[True],
            "wall_s_off": wall[False],
            "wall_ratio_on_off": statistics.median(wall[True]) / statistics.median(wall[False]),
            "summary": summaries[-1],
        }
        print(
            f"{job}: median time/step {1e3 * on:.3f} ms with the callback, {1e3 * off:.3f} ms without, "
            f"ratio {on / off:.4f}",
            flush=True,
        )
    after = power_limits_W()
    report["power_limits_after_W"] = after
    (args.out / "example_overhead.json").write_text(json.dumps(report, indent=2))
    if before != after:
        raise SystemExit(f"POWER LIMIT CHANGED: before {before} W, after {after} W")
    print(
        json.dumps(
            {job: round(report[job]["median_ratio_on_off"], 4) for job in args.jobs} | {"power_limit_unchanged": True}
        )
    )


if __name__ == "__main__":
    main()
