"""Step-time overhead of the callbacks on the two example jobs, and their energy summaries.

Runs ``examples/lightning_digits.py`` and ``examples/hf_text.py`` with and without the
callback, interleaved (on, off, on, off, ...) so machine noise hits both alike, and
reports the median time per step of each and their ratio. On a shared GPU run it with
``ZEUS_CALLBACKS_READ_ONLY=1``; it reads the power limit before and after and fails if
they differ.

    ZEUS_CALLBACKS_READ_ONLY=1 python benchmarks/example_overhead.py --rounds 3 --out results/

With ``--gpus N`` (N > 1) the jobs run data-parallel, one process per GPU: Lightning with
``--devices N`` (DDP), the HF Trainer under ``torchrun --standalone --nproc_per_node N``. Each
run with the callback is then checked: the summary covers N processes, has one energy per GPU,
those sum to the total, and the run wrote one JSONL log (not one per rank).

    ZEUS_CALLBACKS_READ_ONLY=1 NCCL_NVLS_ENABLE=0 python benchmarks/example_overhead.py --gpus 2 --out results/

``--checks-only`` runs each job with the callback only (the summary and the multi-GPU checks, no ratio):
the test suite's check of the examples' data-parallel paths.

``--smoke`` runs short jobs (CPU and the virtual GPU are fine; with ``--gpus 2`` on the CPU each
process gets its own virtual GPU, the second drawing 60 W more).

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

JOBS = ("lightning_digits", "hf_text")
JOB_ARGS = {
    "lightning_digits": ["--epochs", "10"],
    "hf_text": ["--max-steps", "300", "--layers", "6", "--width", "512", "--batch-size", "32", "--block", "256"],
}
SMOKE_ARGS = {
    "lightning_digits": ["--epochs", "1"],
    "hf_text": ["--max-steps", "12", "--layers", "1", "--width", "64", "--batch-size", "8", "--block", "64"],
}
# Without a GPU, --gpus N needs N virtual GPUs per process; the second one draws more so the two differ.
SMOKE_MULTI_CONFIG = """\
job_id: example-overhead-smoke
backend: auto
virtual: {{gpu: A40, workload: imagenet, num_devices: {gpus}, power_offset_W: {offsets}}}
logging: {{interval_steps: 5, log_dir: zeus_logs}}
"""


def job_command(job: str, gpus: int, smoke: bool) -> list[str]:
    """The command line of one example job on ``gpus`` GPUs (one process per GPU when > 1)."""
    script = str(ROOT / "examples" / f"{job}.py")
    args = (SMOKE_ARGS if smoke else JOB_ARGS)[job]
    if gpus <= 1:
        return [sys.executable, script, *args]
    if job == "lightning_digits":
        return [sys.executable, script, *args, "--devices", str(gpus)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}", script, *args]


def check_multi_gpu(job: str, summary: dict, gpus: int, logs_written: int) -> dict:
    """Check a data-parallel run's summary: every GPU measured once, one log. Raises SystemExit if not."""
    gpu_energy_J = summary["gpu_energy_J"]
    problems = []
    if summary["world_size"] != gpus:
        problems.append(f"world size {summary['world_size']}, expected {gpus}")
    if len(gpu_energy_J) != gpus:
        problems.append(f"{len(gpu_energy_J)} per-GPU energies, expected {gpus}")
    # The total is the sum of the per-GPU figures; allow float rounding only.
    if abs(sum(gpu_energy_J) - summary["energy_J"]) > 1e-6 * max(summary["energy_J"], 1.0):
        problems.append(f"per-GPU energies sum to {sum(gpu_energy_J):.3f} J, total {summary['energy_J']:.3f} J")
    # Two ranks reading the same GPU would report the same energy to the last digit.
    if len(set(gpu_energy_J)) != len(gpu_energy_J):
        problems.append(f"identical per-GPU energies {gpu_energy_J}: one GPU measured twice?")
    if logs_written != 1:
        problems.append(f"{logs_written} JSONL logs written, expected 1")
    if problems:
        raise SystemExit(f"{job} on {gpus} GPUs: " + "; ".join(problems))
    spread = (max(gpu_energy_J) - min(gpu_energy_J)) / (sum(gpu_energy_J) / len(gpu_energy_J))
    return {"world_size": gpus, "gpu_energy_J": gpu_energy_J, "gpu_energy_spread": spread, "jsonl_logs": 1}


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


def run(job: str, with_callback: bool, work: Path, round_index: int, command: list[str], config: Path) -> dict:
    summary = work / f"{job}_{'on' if with_callback else 'off'}_{round_index}.json"
    command = [*command, "--summary-json", str(summary), "--config", str(config)]
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
    parser.add_argument("--jobs", nargs="+", choices=JOBS, default=list(JOBS))
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per job; more than 1 runs data-parallel")
    parser.add_argument("--smoke", action="store_true", help="short jobs, for a CPU check of the script")
    parser.add_argument(
        "--checks-only",
        action="store_true",
        help="run each job with the callback only: its summary and multi-GPU checks, no overhead ratio",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="zeus-overhead-"))
    work.mkdir(parents=True, exist_ok=True)
    config = ROOT / "examples" / "zeus.yaml"
    if args.gpus > 1 and power_limits_W() is None:
        config = work / "zeus_multi_virtual.yaml"
        offsets = [60.0 * i for i in range(args.gpus)]
        config.write_text(SMOKE_MULTI_CONFIG.format(gpus=args.gpus, offsets=offsets))
    log_dir = work / "zeus_logs"
    before = power_limits_W()
    report: dict = {
        "read_only": os.environ.get("ZEUS_CALLBACKS_READ_ONLY"),
        "gpus": args.gpus,
        "smoke": args.smoke,
        "power_limits_before_W": before,
    }
    for job in args.jobs:
        command = job_command(job, args.gpus, args.smoke)
        per_step = {True: [], False: []}
        wall = {True: [], False: []}
        summaries, checks = [], []
        for r in range(args.rounds):
            for with_callback in (True,) if args.checks_only else (True, False):
                logs_before = len(list(log_dir.glob("*.jsonl"))) if log_dir.exists() else 0
                result = run(job, with_callback, work, r, command, config)
                per_step[with_callback].append(result["median_step_s"])
                wall[with_callback].append(result["wall_s"])
                if with_callback:
                    summaries.append(result["summary"])
                    if args.gpus > 1:
                        logs_written = len(list(log_dir.glob("*.jsonl"))) - logs_before
                        checks.append(check_multi_gpu(job, result["summary"], args.gpus, logs_written))
        on = statistics.median(per_step[True])
        off = statistics.median(per_step[False]) if per_step[False] else None  # None: --checks-only
        report[job] = {
            "step_time_s_on": per_step[True],
            "step_time_s_off": per_step[False],
            "median_ratio_on_off": on / off if off else None,
            "wall_s_on": wall[True],
            "wall_s_off": wall[False],
            "wall_ratio_on_off": statistics.median(wall[True]) / statistics.median(wall[False]) if off else None,
            "summary": summaries[-1],
            "command": command,
        }
        if checks:
            report[job]["multi_gpu_checks"] = checks
        without = f"{1e3 * off:.3f} ms without, ratio {on / off:.4f}" if off else "not run without (--checks-only)"
        print(f"{job}: median time/step {1e3 * on:.3f} ms with the callback, {without}", flush=True)
    after = power_limits_W()
    report["power_limits_after_W"] = after
    (args.out / "example_overhead.json").write_text(json.dumps(report, indent=2))
    if before != after:
        raise SystemExit(f"POWER LIMIT CHANGED: before {before} W, after {after} W")
    print(
        json.dumps(
            {job: _rounded(report[job]["median_ratio_on_off"]) for job in args.jobs} | {"power_limit_unchanged": True}
        )
    )


def _rounded(ratio: float | None) -> float | None:
    return None if ratio is None else round(ratio, 4)


if __name__ == "__main__":
    main()
