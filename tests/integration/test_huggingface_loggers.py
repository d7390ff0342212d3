"""What the Hugging Face Trainer's loggers get, read back from real TensorBoard event files.

Real Trainers on the CPU measuring the virtual GPU: every step report since the last HF
log reaches the next log, every epoch reaches them at the step it ended at, a failure's totals
still reach TensorBoard, an early stop at an evaluation logs the total once, and every logged step
flags the energy as simulated, once.
"""

from __future__ import annotations

import functools
import logging

import pytest
from transformers import Trainer, TrainerCallback, TrainingArguments

from tests.integration.helpers import SampledClock, manual_virtual_backend, read_scalars, virtual_config
from tests.integration.test_huggingface import RandomTokens, clocked_lm, tiny_lm
from zeus_callbacks import ZeusTrainerCallback
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.reporting import is_own_metric, read_jsonl


def train_args(tmp_path, **kwargs) -> TrainingArguments:
    settings = {
        "output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 4, "report_to": ["tensorboard"],
        "save_strategy": "no", "disable_tqdm": True, "use_cpu": True,
    }  # fmt: skip
    settings.update(kwargs)
    return TrainingArguments(**settings)


def clocked_run(config: dict, step_s: float = 0.03):
    """The callback, measuring the config's virtual GPU on a manual clock, and the tiny LM whose forwards advance it.

    On the wall clock these tests slept 30 ms a step so that the sampler thread covered the steps before
    each log; how many steps a report held still depended on when a loaded machine ran that thread. On
    this clock the sensor is read after every forward: a report holds every step before it.
    """
    clock = SampledClock(1_000.0)
    callback = ZeusTrainerCallback(config, backend=manual_virtual_backend(config, clock))
    clock.adapter = callback
    return callback, clocked_lm(clock, step_s)


def scalars_of(tmp_path) -> dict[str, list[tuple[int, float]]]:
    """The TensorBoard scalars, without the Trainer's ``train/`` prefix."""
    return {tag.removeprefix("train/"): values for tag, values in read_scalars(tmp_path / "out").items()}


def test_each_log_merges_every_step_report_since_the_last_log(tmp_path):
    # Reports every 3 steps, HF logs every 10: three or four reports fall in each log's interval.
    callback, model = clocked_run(virtual_config(tmp_path, interval_steps=3))
    args = train_args(tmp_path, max_steps=20, logging_steps=10)
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(200))
    callback.attach(trainer)
    trainer.train()

    scalars = scalars_of(tmp_path)
    records = read_jsonl(callback.summary.jsonl_path)
    reports = [r for r in records if r["event"] == "steps" and r["count"]]
    warmup = [r for r in records if r["event"] == "warmup"]
    assert len(reports) > 3, "the test needs more step reports than HF logs"
    counts = dict(scalars["energy/step_count"])
    assert sorted(counts) == [10, 20]
    # Every measured step is in exactly one logged interval (the warm-up step is reported apart).
    measured = sum(r["count"] for r in reports)
    assert measured == 20 - sum(len(r["steps"]) for r in warmup)
    assert sum(counts.values()) == measured
    # energy/step_J and time/step_s are the means over each interval's steps: their sums are the JSONL's.
    step_J, step_s = dict(scalars["energy/step_J"]), dict(scalars["time/step_s"])
    assert sum(step_J[s] * n for s, n in counts.items()) == pytest.approx(
        sum(r["energy_J_mean"] * r["count"] for r in reports), rel=1e-5
    )
    assert sum(step_s[s] * n for s, n in counts.items()) == pytest.approx(
        sum(r["time_s_mean"] * r["count"] for r in reports), rel=1e-5
    )
    summary = callback.summary
    # The run's mean step (the results' energy/run_step_mean_J) is the same steps' mean: no warm-up step in it.
    assert summary.step_energy_J * measured == pytest.approx(sum(r["energy_J_mean"] * r["count"] for r in reports))
    # The running total at each log holds the steps logged so far (and the warm-up step).
    totals = dict(scalars["energy/total_J"])
    warmup_J = sum(r["energy_J"] for r in warmup)
    logged_J = 0.0
    for step in sorted(counts):
        logged_J += step_J[step] * counts[step]
        assert logged_J + warmup_J <= totals[step] * (1 + 1e-6), step
    assert totals[20] == pytest.approx(summary.energy_J, rel=1e-6)


class StopAtFirstEvaluation(TrainerCallback):
    """Stops training from on_evaluate, as EarlyStoppingCallback does (after that step's periodic log)."""

    def on_evaluate(self, args, state, control, **kwargs):
        control.should_training_stop = True


class SeenLogs(TrainerCallback):
    """Every logs dict the Trainer's reporters get (it runs after them, on the same dict)."""

    def __init__(self) -> None:
        self.logs: list[tuple[int, dict]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append((state.global_step, dict(logs or {})))


def test_an_early_stop_at_an_evaluation_logs_the_total_once(tmp_path):
    callback, model = clocked_run(virtual_config(tmp_path, interval_steps=2))
    seen = SeenLogs()
    args = train_args(
        tmp_path, max_steps=20, logging_steps=4, eval_strategy="steps", eval_steps=8, per_device_eval_batch_size=4
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=RandomTokens(200), eval_dataset=RandomTokens(8),
        callbacks=[StopAtFirstEvaluation(), seen],
    )  # fmt: skip
    callback.attach(trainer)
    output = trainer.train()

    summary = callback.summary
    assert summary.steps == 8 and summary.status == "completed"
    scalars = scalars_of(tmp_path)
    for tag in ("energy/total_J", "time/total_s", "energy/step_J", "eval/energy_J"):
        steps = [step for step, _ in scalars[tag]]
        assert len(steps) == len(set(steps)), f"{tag}: two points at one step: {scalars[tag]}"
    assert [step for step, _ in scalars["energy/total_J"]] == [4, 8]
    # The results still hold the run's totals (TensorBoard's last total is the periodic log's, before the evaluation).
    assert output.metrics["energy/total_J"] == pytest.approx(summary.energy_J)
    assert output.metrics["time/total_s"] == pytest.approx(summary.time_s)
    assert scalars["energy/total_J"][-1][1] < summary.energy_J
    # Every step whose logs carry energy flags it as simulated, once: the evaluation's log at 8 follows the
    # periodic log at 8, which has the flag.
    energy_logs = [(step, logs) for step, logs in seen.logs if any(is_own_metric(k) for k in logs)]
    # The evaluation's figures under HF's eval_ names: its reporters file them under eval/, beside eval/loss.
    assert any("eval_energy_J" in logs and "energy/eval_J" not in logs for _, logs in energy_logs)
    flags = [step for step, logs in energy_logs if logs.get("energy/simulated") == 1.0]
    assert flags == sorted({step for step, _ in energy_logs}), energy_logs
    assert scalars["energy/simulated"] == [(step, 1.0) for step in flags]
    # The epoch ended at the stop (8): the final log carries it, the periodic log at 8 came before it ended.
    assert scalars["energy/epoch_J"] == [(8, pytest.approx(summary.epoch_energy_J[0]))]
    assert all(r["simulated"] is True for r in read_jsonl(summary.jsonl_path))


def test_a_failing_training_step_still_sends_the_totals_to_tensorboard(tmp_path):
    callback, model = clocked_run(virtual_config(tmp_path, interval_steps=2))
    args = train_args(tmp_path, max_steps=12, logging_steps=4)
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(200))
    callback.attach(trainer)
    calls = {"n": 0}
    original = type(trainer).training_step

    def failing_step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 7:
            raise RuntimeError("planted failure")
        return original(self, *args, **kwargs)

    trainer.training_step = failing_step.__get__(trainer)
    with pytest.raises(RuntimeError, match="planted failure"):
        trainer.train()

    summary = callback.summary
    assert summary.status == "failed" and summary.steps == 6
    scalars = scalars_of(tmp_path)
    # At the step that failed (7), after the periodic log at 4: the run's totals, flagged, and the steps since.
    assert scalars["energy/total_J"][-1] == (7, pytest.approx(summary.energy_J, rel=1e-6))
    assert scalars["time/total_s"][-1] == (7, pytest.approx(summary.time_s, rel=1e-6))
    assert scalars["energy/simulated"][-1] == (7, 1.0)
    assert sum(n for _, n in scalars["energy/step_count"]) == 5  # steps 1-6 but the warm-up step
    assert not any(is_own_metric(k) for entry in trainer.state.log_history for k in entry)


def test_every_epoch_reaches_tensorboard_at_its_own_step_when_epochs_are_shorter_than_logging_steps(tmp_path):
    # 3 steps an epoch (12 samples, batch 4), HF logs every 5 steps: epochs end at 3, 6, 9 and 12, logs
    # come at 5, 10 and 12 (the final log). Before, each log carried only the last epoch it had seen.
    steps_per_epoch, epochs, logging_steps = 3, 4, 5
    callback, model = clocked_run(virtual_config(tmp_path, interval_steps=2))
    seen = SeenLogs()
    args = train_args(tmp_path, num_train_epochs=epochs, logging_steps=logging_steps)
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(4 * steps_per_epoch), callbacks=[seen])
    callback.attach(trainer)
    trainer.train()

    records = read_jsonl(callback.summary.jsonl_path)
    epoch_records = [r for r in records if r["event"] == "epoch"]
    assert [r["epoch"] for r in epoch_records] == list(range(epochs))
    assert logging_steps > steps_per_epoch, "the test needs two epochs between two logs"
    scalars = scalars_of(tmp_path)
    # Every epoch once, at the global step it ended at, with the JSONL's energy and time.
    ends = [steps_per_epoch * (e + 1) for e in range(epochs)]
    assert [s for s, _ in scalars["energy/epoch_J"]] == ends
    assert [v for _, v in scalars["energy/epoch_J"]] == pytest.approx([r["energy_J"] for r in epoch_records])
    assert [v for _, v in scalars["time/epoch_s"]] == pytest.approx([r["time_s"] for r in epoch_records])
    assert callback.summary.epoch_energy_J == pytest.approx([r["energy_J"] for r in epoch_records])
    # The Trainer's own logs are unchanged: at 5 and 10, then the final one at 12; the epochs that
    # ended where it did not log (3, 6, 9) come as logs of their own, outside log_history.
    assert [e["step"] for e in trainer.state.log_history] == [5, 10, 12]
    assert not any(is_own_metric(k) for entry in trainer.state.log_history for k in entry)
    own = [step for step, logs in seen.logs if logs and all(is_own_metric(k) for k in logs)]
    assert own == [3, 6, 9]
    assert [step for step, logs in seen.logs if "energy/epoch_J" in logs] == ends  # 12: in the final log
    # The reporters got the steps in order: no point below one already logged (W&B's step rule).
    logged_steps = [step for step, _ in seen.logs]
    assert logged_steps == sorted(logged_steps)
    # One flag per step, at every step that got energy.
    flagged = [s for s, _ in scalars["energy/simulated"]]
    assert flagged == sorted(set(ends + [5, 10]))


def test_an_evaluation_at_a_logging_step_leaves_one_simulated_point_per_step(tmp_path):
    # eval_steps == logging_steps: at 4, 8 and 12 the periodic log and the evaluation's log share the step.
    callback, model = clocked_run(virtual_config(tmp_path, interval_steps=2))
    seen = SeenLogs()
    args = train_args(
        tmp_path, max_steps=12, logging_steps=4, eval_strategy="steps", eval_steps=4, per_device_eval_batch_size=4
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=RandomTokens(200), eval_dataset=RandomTokens(8), callbacks=[seen]
    )
    callback.attach(trainer)
    trainer.train()

    scalars = scalars_of(tmp_path)
    evals = [r for r in read_jsonl(callback.summary.jsonl_path) if r["event"] == "eval"]
    assert [s for s, _ in scalars["eval/energy_J"]] == [4, 8, 12]
    assert "energy/eval_J" not in scalars and "eval/time_s" in scalars  # not under train/ (issue 26)
    assert [v for _, v in scalars["eval/energy_J"]] == pytest.approx([r["energy_J"] for r in evals])
    # Two logs carried energy at each of those steps; the flag has one point at each.
    energy_steps = [step for step, logs in seen.logs if any(is_own_metric(k) for k in logs)]
    assert sorted(energy_steps) == [4, 4, 8, 8, 12, 12]
    assert scalars["energy/simulated"] == [(4, 1.0), (8, 1.0), (12, 1.0)]


def test_an_attached_callback_measures_the_whole_evaluation_from_its_first_batch(tmp_path):
    # An evaluation of one batch: the window used to open at the first on_prediction_step, after
    # that batch, and measured 0.5 ms of a 308 ms evaluation. Attached, it opens as evaluate() begins.
    # On a manual clock (a training step 30 ms, the evaluation's batch 150 ms, nothing else moves it)
    # the window's time says exactly what it holds, however loaded the machine.
    step_s, eval_s = 0.03, 0.15
    clock = ManualClock(1_000.0)
    config = virtual_config(tmp_path, interval_steps=2)
    callback = ZeusTrainerCallback(config, backend=manual_virtual_backend(config, clock))
    args = train_args(tmp_path, max_steps=4, logging_steps=2, eval_strategy="steps", eval_steps=2,
                      per_device_eval_batch_size=8)  # fmt: skip
    model = tiny_lm()
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(40), eval_dataset=RandomTokens(8))
    callback.attach(trainer)
    forward = model.forward

    @functools.wraps(forward)
    def timed_forward(*a, **kw):
        clock.advance(step_s if model.training else eval_s)  # the one evaluation batch takes eval_s
        return forward(*a, **kw)

    model.forward = timed_forward
    seen = SeenLogs()
    trainer.add_callback(seen)
    trainer.train()

    evals = [r for r in read_jsonl(callback.summary.jsonl_path) if r["event"] == "eval"]
    runtimes = [logs["eval_runtime"] for _, logs in seen.logs if "eval_runtime" in logs]
    assert len(evals) == len(runtimes) == 2
    for record in evals:
        # The window holds the whole evaluation (its batch included) and none of the training steps around it.
        assert record["time_s"] == pytest.approx(eval_s)
        assert record["energy_J"] > 0
        assert record["dataset"] is None  # one unnamed evaluation dataset
    points = scalars_of(tmp_path)["eval/energy_J"]
    assert [v for _, v in points] == pytest.approx([r["energy_J"] for r in evals], rel=1e-6)


def test_several_evaluation_datasets_each_get_their_own_energy_tag(tmp_path):
    # An outside tester: with eval_dataset={"a": ..., "b": ...} both datasets' energy landed on eval/energy_J.
    callback, model = clocked_run(virtual_config(tmp_path, interval_steps=2))
    args = train_args(
        tmp_path, max_steps=8, logging_steps=4, eval_strategy="steps", eval_steps=4, per_device_eval_batch_size=4
    )
    datasets = {"a": RandomTokens(8), "b": RandomTokens(16)}
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(200), eval_dataset=datasets)
    callback.attach(trainer)
    trainer.train()

    scalars = read_scalars(tmp_path / "out")
    evals = [r for r in read_jsonl(callback.summary.jsonl_path) if r["event"] == "eval"]
    assert len(evals) == 4  # two datasets at steps 4 and 8, in the Trainer's order a, b
    assert [r["dataset"] for r in evals] == ["a", "b", "a", "b"]  # each JSONL record names its dataset
    # The evaluate records hold the Trainer's metrics (eval_a_loss...), not our eval_<name> figures.
    for record in (r for r in read_jsonl(callback.summary.jsonl_path) if r["event"] == "evaluate"):
        assert not [k for k in record["metrics"] if k.endswith(("_energy_J", "_time_s"))], record
    for i, name in enumerate(datasets):
        assert f"eval/{name}_loss" in scalars  # the Trainer's own tag, beside which ours must sit
        points = scalars[f"eval/{name}_energy_J"]
        assert [s for s, _ in points] == [4, 8]
        assert [v for _, v in points] == pytest.approx([evals[i]["energy_J"], evals[2 + i]["energy_J"]])
        assert [s for s, _ in scalars[f"eval/{name}_time_s"]] == [4, 8]
    assert "eval/energy_J" not in scalars


def test_evaluation_at_each_epoch_end_opens_no_step_window_twice(tmp_path, caplog):
    # An outside tester (issue 26): eval_strategy="epoch" warned "window 'step' opened again before it was closed".
    # The evaluation comes after on_epoch_end; its end opened the next step's window, which the next epoch's start
    # opened again.
    epochs, steps_per_epoch, batch = 2, 4, 4
    callback, model = clocked_run(virtual_config(tmp_path, interval_steps=2))
    args = train_args(tmp_path, num_train_epochs=epochs, eval_strategy="epoch", per_device_train_batch_size=batch,
                      per_device_eval_batch_size=batch, logging_steps=2)  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(steps_per_epoch * batch),
                      eval_dataset=RandomTokens(batch))  # fmt: skip
    callback.attach(trainer)
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        trainer.train()

    assert not [r.getMessage() for r in caplog.records if "opened again" in r.getMessage()]
    records = read_jsonl(callback.summary.jsonl_path)
    total_steps = epochs * steps_per_epoch
    assert callback.summary.steps == total_steps
    steps = [r for r in records if r["event"] == "steps"]
    assert sum(r["steps"] + r["warmup_steps"] for r in steps) == total_steps
    # Every step measured (sample_fraction 1): warm-up steps in their record, the rest counted in the steps records.
    warmup = sum(len(r["steps"]) for r in records if r["event"] == "warmup")
    assert sum(r["count"] for r in steps) + warmup == total_steps
    ends = [(steps_per_epoch * (i + 1)) for i in range(epochs)]
    assert [r["end_step"] for r in records if r["event"] == "epoch"] == ends
    assert [r["step"] for r in records if r["event"] == "eval"] == ends  # after each epoch's last step


def test_a_user_metric_named_like_an_evaluation_energy_stays_the_users(tmp_path):
    # An outside tester (issue 26): every eval*_energy_J key counted as ours, so a user's validation metric named
    # so (eval_x_energy_J, from compute_metrics' x_energy_J) never reached the evaluate record or batch_size.target.
    callback, model = clocked_run(virtual_config(tmp_path, interval_steps=2))
    args = train_args(tmp_path, max_steps=4, logging_steps=4, eval_strategy="steps", eval_steps=4,
                      per_device_eval_batch_size=4)  # fmt: skip
    user_J = 1.5  # the user's own figure, whatever it means to them

    def compute_metrics(_prediction) -> dict[str, float]:
        return {"x_energy_J": user_J}

    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(16), eval_dataset=RandomTokens(4),
                      compute_metrics=compute_metrics)  # fmt: skip
    callback.attach(trainer)
    trainer.train()

    records = read_jsonl(callback.summary.jsonl_path)
    (evaluate,) = [r for r in records if r["event"] == "evaluate"]
    assert evaluate["metrics"]["eval_x_energy_J"] == user_J
    assert "eval_energy_J" not in evaluate["metrics"] and "eval_time_s" not in evaluate["metrics"]  # ours
    assert [r["dataset"] for r in records if r["event"] == "eval"] == [None]


class SlowAfterEvaluation(TrainerCallback):
    """A later callback whose ``on_evaluate`` takes ``pause_s`` on ``clock``: Trainer work after an evaluation."""

    def __init__(self, clock: ManualClock, pause_s: float) -> None:
        self.clock, self.pause_s = clock, pause_s

    def on_evaluate(self, args, state, control, **kwargs):
        self.clock.advance(self.pause_s)


def test_the_step_after_an_evaluation_begins_at_its_own_step_begin(tmp_path):
    # An outside tester (2 processes): the step after the evaluation at step 10 took 202 ms against 26 ms, its
    # window opened where the evaluation ended, and held what the Trainer and the session did after that (the
    # other callbacks' on_evaluate, the evaluation's exchange between ranks) before the next on_step_begin.
    # On a manual clock: every training forward 30 ms, a later callback's on_evaluate 200 ms.
    step_s, pause_s = 0.03, 0.2
    clock = SampledClock(1_000.0)
    config = virtual_config(tmp_path, interval_steps=1)
    callback = ZeusTrainerCallback(config, backend=manual_virtual_backend(config, clock))
    clock.adapter = callback
    args = train_args(tmp_path, max_steps=8, logging_steps=4, eval_strategy="steps", eval_steps=4,
                      per_device_eval_batch_size=8)  # fmt: skip
    trainer = Trainer(model=clocked_lm(clock, step_s), args=args, train_dataset=RandomTokens(40),
                      eval_dataset=RandomTokens(8), callbacks=[SlowAfterEvaluation(clock, pause_s)])  # fmt: skip
    callback.attach(trainer)
    trainer.train()

    steps = [r for r in read_jsonl(callback.summary.jsonl_path) if r["event"] == "steps" and r["count"]]
    assert len(steps) == 7  # one a record (interval_steps=1) after the warm-up step
    # Each step's window holds its forward only: the step after the evaluation too (step 4, 230 ms before).
    assert [r["time_s_mean"] for r in steps] == pytest.approx([step_s] * len(steps), rel=1e-6)
    # What followed each evaluation up to the next on_step_begin (the later callback's 200 ms) is the ledger's
    # eval_tail, not other: the epoch is explained by warm-up, steps, evaluations and their tails.
    records = read_jsonl(callback.summary.jsonl_path)
    evals = [r for r in records if r["event"] == "eval"]
    (epoch,) = [r for r in records if r["event"] == "epoch"]
    ledger = epoch["ledger"]
    assert len(evals) == 2 and ledger["eval_tail_s"] == pytest.approx(len(evals) * pause_s, rel=1e-6)
    assert ledger["eval_tail_J"] > 0 and ledger["other_s"] == pytest.approx(0.0, abs=1e-9)
    assert ledger["other_J"] <= 1e-3 * epoch["energy_J"]
    parts = [ledger[f"{k}_J"] for k in ("warmup", "steps", "eval", "eval_tail", "other")]
    assert sum(parts) == pytest.approx(epoch["energy_J"], rel=1e-9)
