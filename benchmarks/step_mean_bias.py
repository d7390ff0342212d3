"""Is the run's mean step energy biased? The digits example on the virtual GPU, every step timed.

Under ``windows.sample_fraction: auto`` only a share of the steps gets a window, and auto
mode sets that share from the step time. This run times every step itself (batch end to
batch end: the span a step window covers), notes which steps the session measured, and
compares:

- the truth: the mean over every step after the warm-up step;
- the mean over the measured steps only (what ``RunSummary.step_*`` reports);
- the ``steps`` records' means, each scaled by the steps it stands for (``× steps``).

On the virtual GPU the power at one limit is nearly constant, so a step's energy follows
its time; the energy figures are compared with the run's total as well.

    python benchmarks/step_mean_bias.py --epochs 5 --out step_mean_bias.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning.pytorch as L

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from lightning_digits import DigitsCNN, DigitsData  # noqa: E402

from zeus_callbacks import ZeusCallback  # noqa: E402
from zeus_callbacks.reporting import read_jsonl  # noqa: E402


class StepTimes(L.Callback):
    """Every step's time (previous batch end, or epoch start, to its batch end) and whether it was measured."""

    def __init__(self, zeus: ZeusCallback) -> None:
        self.zeus = zeus
        self.steps: list[dict] = []
        self._last: float | None = None
        self._measured = False
        self._epoch = 0

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._last = time.perf_counter()
        self._epoch = trainer.current_epoch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._measured = self.zeus.session.measuring  # after ZeusCallback's step_start (list order)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        assert self._last is not None
        self.steps.append({"epoch": self._epoch, "batch": batch_idx, "time_s": now - self._last,
                           "measured": self._measured})  # fmt: skip
        self._last = now


def mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--out", help="write the figures to this JSON file")
    args = parser.parse_args()

    L.seed_everything(0, workers=True)
    log_dir = Path(tempfile.mkdtemp(prefix="step_mean_bias-"))
    zeus = ZeusCallback({
        "job_id": "step-mean-bias", "backend": "virtual", "virtual": {"gpu": "A40", "workload": "imagenet"},
        "logging": {"interval_steps": 10, "log_dir": str(log_dir), "run_name": "digits"},
    })  # fmt: skip
    clock = StepTimes(zeus)
    trainer = L.Trainer(
        max_epochs=args.epochs, accelerator=args.accelerator, devices=1, callbacks=[zeus, clock], logger=False,
        enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
    )  # fmt: skip
    trainer.fit(DigitsCNN(), datamodule=DigitsData(32))
    summary = zeus.summary
    assert summary is not None
    records = read_jsonl(summary.jsonl_path)
    reports = [r for r in records if r["event"] == "steps"]
    warmup = [r for r in records if r["event"] == "warmup"]
    warmup_n = sum(len(r["steps"]) for r in warmup)

    after_warmup = clock.steps[warmup_n:]
    times = [s["time_s"] for s in after_warmup]
    measured = [s["time_s"] for s in after_warmup if s["measured"]]
    unmeasured = [s["time_s"] for s in after_warmup if not s["measured"]]
    firsts = [s["time_s"] for s in after_warmup if s["batch"] == 0]
    scaled = [r for r in reports if r["energy_J_mean"] is not None]
    stood_for = sum(r["steps"] for r in scaled)
    result = {
        "epochs": args.epochs,
        "steps": summary.steps,
        "warmup_steps": warmup_n,
        "measured_steps": len(measured),
        "true_mean_step_s": mean(times),
        "measured_mean_step_s": mean(measured),
        "unmeasured_mean_step_s": mean(unmeasured),
        "first_step_of_epoch_mean_s": mean(firsts),
        "warmup_step_s": [s["time_s"] for s in clock.steps[:warmup_n]],
        "summary_step_time_s": summary.step_time_s,
        "summary_step_energy_J": summary.step_energy_J,
        "records_step_time_s": sum(r["time_s_mean"] * r["steps"] for r in scaled) / stood_for if stood_for else None,
        "records_step_energy_J": sum(r["energy_J_mean"] * r["steps"] for r in scaled) / stood_for
        if stood_for
        else None,
        "records_steps": stood_for,
        "warmup_energy_J": sum(r["energy_J"] or 0.0 for r in warmup),
        "summary_step_energy_x_steps_J": summary.step_energy_J * summary.steps,
        "records_energy_x_steps_plus_warmup_J": sum(r["energy_J_mean"] * r["steps"] for r in scaled)
        + sum(r["energy_J"] or 0.0 for r in warmup),
        "total_energy_J": summary.energy_J,
        "epochs_energy_J": sum(summary.epoch_energy_J),
        "total_time_s": summary.time_s,
        "all_steps_time_s": sum(s["time_s"] for s in clock.steps),
        "reports": [],
    }
    lo = 0
    for r in reports:  # each stands for the steps after the previous record's (warm-up left out)
        span = after_warmup[lo : lo + r["steps"]]
        lo += r["steps"]
        result["reports"].append({
            "count": r["count"], "steps": r["steps"], "time_s_mean": r["time_s_mean"],
            "true_time_s_mean": mean([s["time_s"] for s in span]),
            "measured_here_time_s_mean": mean([s["time_s"] for s in span if s["measured"]]),
        })  # fmt: skip
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
