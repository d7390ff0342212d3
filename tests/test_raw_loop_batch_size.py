"""A raw loop under the batch-size bandit: a trial is recorded only at the batch size the loop trained at.

An outside tester ran ``examples/raw_loop.py`` twice with ``batch_size.enabled: true``: both runs trained
at 32 (the example's ``--batch-size``), but the second trial was recorded at 16, the bandit's suggestion
the loop never asked for. The example now takes the suggestion; a loop that never says which batch size
it trained at records no trial (it is withdrawn, with one warning); one that trains at another size has
its trial recorded at that size (as the Lightning and Hugging Face callbacks do).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
from pathlib import Path

import pytest

import zeus_callbacks
from zeus_callbacks import CallOrderError, suggest_batch_size
from zeus_callbacks.store import open_store

ROOT = Path(__file__).resolve().parents[1]
TRAIN_DIGITS = 1437  # 80 % of scikit-learn's 1,797 digits: the example's training split


def load_example(name: str):
    """``examples/<name>.py`` as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"{name}_example", ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def spy_on_loaders(monkeypatch, example) -> list[int]:
    """The batch size of every ``example.digits_loaders`` call, in order: the sizes the example trained at."""
    trained: list[int] = []
    build = example.digits_loaders

    def spy(batch_size: int = 32):
        trained.append(int(batch_size))
        return build(batch_size)

    monkeypatch.setattr(example, "digits_loaders", spy)
    return trained


def bandit_yaml(tmp_path: Path, *, target: bool = True) -> Path:
    """examples/zeus.yaml's settings with the bandit on, on the virtual GPU, its store a SQLite file in tmp_path.

    ``target`` False: no target (a loop that never evaluates); the pruning then moves on after each run.
    """
    config = tmp_path / "zeus.yaml"
    config.write_text(
        "job_id: digits-nightly\n"
        "backend: virtual\n"
        "virtual: {gpu: A40, workload: imagenet}\n"
        f"logging: {{interval_steps: 10, log_dir: {tmp_path / 'zeus_logs'}}}\n"
        "batch_size:\n"
        "  enabled: true\n"
        "  batch_sizes: [16, 32, 64]\n"
        "  default_batch_size: 32\n"
        + ("  target: {metric: val/acc, value: 0.5, direction: max}\n" if target else "")
        + f"store: {{backend: sqlite, path: {tmp_path / 'store.sqlite'}}}\n"
    )
    return config


@pytest.mark.timeout(600)
def test_the_raw_loop_example_records_each_trial_at_the_batch_size_it_trained(tmp_path, monkeypatch):
    # The outside tester's case, run as they ran it: the example's main() twice, a real SQLite store file.
    monkeypatch.chdir(tmp_path)
    example = load_example("raw_loop")
    trained = spy_on_loaders(monkeypatch, example)
    config = bandit_yaml(tmp_path)
    summaries = [example.main(["--config", str(config), "--epochs", "1"])["summary"] for _ in range(2)]
    with open_store(tmp_path / "store.sqlite") as store:
        trials = store.list_trials("digits-nightly")
    assert len(trained) == 2 and [t.status for t in trials if t.status == "running"] == []
    recorded = [t for t in trials if t.status != "withdrawn"]
    assert [t.batch_size for t in recorded] == trained  # each run's trial at the size its loader had
    assert trained[1] != trained[0]  # the bandit moved on to another size, and the loop followed it
    for size, summary in zip(trained, summaries, strict=True):  # the loop honoured should_stop: never more steps
        assert summary["steps"] <= math.ceil(TRAIN_DIGITS / size)


# ---------------------------------------------------------------------- a small raw loop, on a manual clock
STEP_S = 0.05


def bandit_config(tmp_path: Path, **batch_size: object) -> dict:
    return {
        "backend": "virtual",
        "job_id": "nightly",
        "logging": {"log_dir": str(tmp_path), "interval_steps": 3},
        "batch_size": {
            "enabled": True,
            "batch_sizes": [16, 32, 64],
            "default_batch_size": 32,
            "target": {"metric": "val/acc", "value": 0.5, "direction": "max"},
            **batch_size,
        },
        "store": {"backend": "sqlite", "path": str(tmp_path / "store.sqlite")},
    }


def train(m, clock, batch_size: int, steps: int = 4) -> None:
    """One epoch of ``steps`` steps of ``batch_size`` samples and an evaluation that reaches the target."""
    with m.epoch():
        for _ in range(steps):
            with m.step(num_samples=batch_size):
                clock.advance(STEP_S)
                m.session.sampler.poll_once()
        with m.evaluation() as results:
            results["val/acc"] = 0.9


def trials(tmp_path: Path) -> list:
    with open_store(tmp_path / "store.sqlite") as store:
        return store.list_trials("nightly")


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "batch size" in r.getMessage()]


def test_a_loop_that_never_says_its_batch_size_records_no_trial_and_says_so_once(
    tmp_path, virtual_backend, manual_clock, caplog
):
    config = bandit_config(tmp_path)
    with zeus_callbacks.measure(config, backend=virtual_backend) as m:  # the first run says: recorded
        first = m.suggested_batch_size
        m.use_batch_size(first)
        train(m, manual_clock, first)
    assert first == 32 and m.should_stop  # the default batch size first; the target reached asks to stop
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        with zeus_callbacks.measure(config, backend=virtual_backend) as m:  # trains at 32, never asks nor says
            train(m, manual_clock, 32)
    (warning,) = warnings_of(caplog)
    assert "never said which batch size it trained at" in warning and "withdrawn, not recorded" in warning
    assert "suggested batch size 16, trial 2" in warning and "m.use_batch_size(size)" in warning
    assert "measure(config, batch_size=size)" in warning
    one, two = trials(tmp_path)
    assert (one.batch_size, one.status, one.converged) == (32, "completed", True)
    assert two.status == "withdrawn" and two.cost is None and not two.converged  # no observation of 16
    assert two.info["reason"] == "withdrawn: the loop never said which batch size it trained at"
    with zeus_callbacks.measure(config, backend=virtual_backend) as m:  # the bandit did not move: 16 again
        assert m.suggested_batch_size == 16
        m.use_batch_size(16)
        train(m, manual_clock, 16)
    assert [(t.batch_size, t.status) for t in trials(tmp_path)][2] == (16, "completed")


def test_a_failed_run_that_never_said_its_batch_size_is_withdrawn_not_counted_against_the_suggestion(
    tmp_path, virtual_backend, manual_clock, caplog
):
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"), pytest.raises(RuntimeError, match="boom"):
        with zeus_callbacks.measure(bandit_config(tmp_path), backend=virtual_backend) as m:
            train(m, manual_clock, 32)
            raise RuntimeError("boom")
    assert m.summary is not None and m.summary.status == "failed"
    (trial,) = trials(tmp_path)
    assert trial.status == "withdrawn"  # not "failed": a failure would count against batch size 32
    assert len(warnings_of(caplog)) == 1


def test_a_loop_that_trains_at_another_size_has_its_trial_recorded_at_that_size(
    tmp_path, virtual_backend, manual_clock, caplog
):
    # As the Lightning and HF callbacks do for a loader they cannot change: warn, record the size trained.
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        with zeus_callbacks.measure(bandit_config(tmp_path), backend=virtual_backend) as m:
            assert m.suggested_batch_size == 32
            m.use_batch_size(64)
            train(m, manual_clock, 64)
    (warning,) = warnings_of(caplog)
    assert "this loop trains at (use_batch_size()) is 64, not the suggested 32" in warning
    assert "m.suggested_batch_size" in warning and "The trial is recorded at 64" in warning
    (trial,) = trials(tmp_path)
    assert (trial.batch_size, trial.status) == (64, "completed")


def test_a_suggestion_made_before_the_run_is_claimed_by_measure_and_recorded_at_its_size(
    tmp_path, virtual_backend, manual_clock, caplog
):
    config = bandit_config(tmp_path)
    size = suggest_batch_size(config)  # before the loaders are built, as for the HF Trainer
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        with zeus_callbacks.measure(config, backend=virtual_backend, batch_size=size) as m:
            assert m.suggested_batch_size == size == 32
            train(m, manual_clock, size)
    assert warnings_of(caplog) == []
    (trial,) = trials(tmp_path)  # its trial, claimed: not a second one
    assert (trial.batch_size, trial.status) == (32, "completed")


def test_with_the_bandit_off_there_is_no_suggestion_and_nothing_to_say(tmp_path, virtual_backend, manual_clock, caplog):
    config = {"backend": "virtual", "logging": {"log_dir": str(tmp_path)}}
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        with zeus_callbacks.measure(config, backend=virtual_backend) as m:
            assert m.suggested_batch_size is None
            m.use_batch_size(8)  # harmless: nothing is recorded
            train(m, manual_clock, 8)
        with zeus_callbacks.measure(config, backend=virtual_backend) as m:  # never says: nothing to warn about
            train(m, manual_clock, 8)
    assert warnings_of(caplog) == []
    assert not (tmp_path / "store.sqlite").exists()


def test_the_batch_size_calls_refuse_misuse_clearly(tmp_path, virtual_backend):
    m = zeus_callbacks.measure(bandit_config(tmp_path), backend=virtual_backend)
    with pytest.raises(CallOrderError, match="suggested_batch_size outside a run"):
        _ = m.suggested_batch_size
    with pytest.raises(CallOrderError, match=r"use_batch_size\(\) outside a run"):
        m.use_batch_size(32)
    with pytest.raises(TypeError, match=r"measure\(batch_size=...\): the batch size must be an int, not bool"):
        zeus_callbacks.measure(bandit_config(tmp_path), batch_size=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 1, not 0"):
        zeus_callbacks.measure(bandit_config(tmp_path), batch_size=0)
    with m:
        with pytest.raises(TypeError, match="not str"):
            m.use_batch_size("32")  # type: ignore[arg-type]
        m.use_batch_size(m.suggested_batch_size)


@pytest.mark.timeout(600)
def test_the_fabric_example_records_each_trial_at_the_batch_size_it_trained(tmp_path, monkeypatch):
    # The same two runs through Lightning Fabric: the suggestion is drawn before the loaders and handed to measure().
    # With a target: the example evaluates inside its run (an outside tester found it evaluating after the run, so
    # every trial was recorded not converged though val/acc reached the target).
    pytest.importorskip("lightning")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))  # fabric_loop imports raw_loop's model and data
    example = load_example("fabric_loop")
    trained = spy_on_loaders(monkeypatch, example)
    config = bandit_yaml(tmp_path)
    results = [
        example.main(["--config", str(config), "--epochs", "1", "--log-dir", str(tmp_path / "runs")]) for _ in range(2)
    ]
    with open_store(tmp_path / "store.sqlite") as store:
        trials = store.list_trials("digits-nightly")
    assert [t.batch_size for t in trials] == trained and trained[1] != trained[0]
    assert all(t.status in ("completed", "early_stopped") for t in trials)  # one trial a run, claimed: none withdrawn
    assert all(r["val_acc"] >= 0.5 and r["should_stop"] for r in results)  # the target reached: asked to stop
    assert [t.converged for t in trials] == [True, True]


# ---------------------------------------------------------------------- said late, said twice (outside tester, round 2)
def train_steps(m, clock, batch_size: int, steps: int = 4) -> None:
    """One epoch of ``steps`` steps marked with step_start/step_end, no evaluation."""
    m.epoch_start()
    for _ in range(steps):
        m.step_start()
        clock.advance(STEP_S)
        m.session.sampler.poll_once()
        m.step_end(num_samples=batch_size)
    m.epoch_end()


def test_a_batch_size_said_after_steps_ran_withdraws_the_trial_with_one_warning(
    tmp_path, virtual_backend, manual_clock, caplog
):
    # The tester's case: the loop trained at 8, then said the suggestion; the trial was recorded at 32, never trained.
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        with zeus_callbacks.measure(bandit_config(tmp_path), backend=virtual_backend) as m:
            suggested = m.suggested_batch_size
            train_steps(m, manual_clock, 8)
            m.use_batch_size(suggested)
    (warning,) = warnings_of(caplog)
    assert "use_batch_size(32) after 4 training steps had run" in warning and "withdrawn, not recorded" in warning
    assert "before the first step" in warning and "trial 1" in warning
    (trial,) = trials(tmp_path)
    assert (trial.status, trial.cost) == ("withdrawn", None)
    assert trial.info["reason"] == "withdrawn: the loop said its batch size after training steps had run"


@pytest.mark.parametrize("by_measure", [False, True], ids=["use_batch_size-twice", "measure-then-use_batch_size"])
def test_two_different_batch_sizes_said_in_one_run_withdraw_the_trial_with_one_warning(
    tmp_path, virtual_backend, manual_clock, caplog, by_measure
):
    config = bandit_config(tmp_path)
    size = suggest_batch_size(config) if by_measure else None
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        with zeus_callbacks.measure(config, backend=virtual_backend, batch_size=size) as m:
            if not by_measure:
                m.use_batch_size(m.suggested_batch_size)
            m.use_batch_size(64)  # before any step, but a second, different size: the run's size is mixed
            m.use_batch_size(16)  # a third: still one warning
            train(m, manual_clock, 64)
    (warning,) = warnings_of(caplog)
    first = "measure(batch_size=...)" if by_measure else "use_batch_size()"
    assert f"said two batch sizes: 32 ({first}), then 64 (use_batch_size())" in warning
    assert "withdrawn, not recorded" in warning and "say it once" in warning
    assert "is not known for sure" in warning and "mixed" not in warning  # no step had run at either size
    (trial,) = trials(tmp_path)
    assert trial.status == "withdrawn"
    assert trial.info["reason"] == "withdrawn: the loop said two batch sizes (32, then 64)"


def test_the_same_batch_size_said_twice_or_after_steps_is_fine(tmp_path, virtual_backend, manual_clock, caplog):
    config = bandit_config(tmp_path)
    size = suggest_batch_size(config)
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        with zeus_callbacks.measure(config, backend=virtual_backend, batch_size=size) as m:
            m.use_batch_size(32)
            train(m, manual_clock, 32)
            m.use_batch_size(32)  # the same size again, after steps: nothing new said
    assert warnings_of(caplog) == []
    (trial,) = trials(tmp_path)
    assert (trial.batch_size, trial.status) == (32, "completed")


def test_a_refused_batch_size_is_named_in_the_end_of_run_warning(tmp_path, virtual_backend, manual_clock, caplog):
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        with zeus_callbacks.measure(bandit_config(tmp_path), backend=virtual_backend) as m:
            with pytest.raises(ValueError, match="at least 1"):
                m.use_batch_size(0)
            with pytest.raises(TypeError, match="not float"):
                m.use_batch_size(128.0)  # type: ignore[arg-type]
            train(m, manual_clock, 32)
    (warning,) = warnings_of(caplog)
    assert (
        "never said a valid batch size" in warning and "(refused: use_batch_size(0), use_batch_size(128.0))" in warning
    )
    assert "never said which batch size it trained at" not in warning
    (trial,) = trials(tmp_path)
    assert trial.status == "withdrawn"


def test_use_batch_size_takes_any_integral_but_not_a_float_bool_or_str(tmp_path, virtual_backend, manual_clock):
    np = pytest.importorskip("numpy")
    with zeus_callbacks.measure(bandit_config(tmp_path), backend=virtual_backend) as m:
        for wrong, kind in ((True, "bool"), (128.0, "float"), ("128", "str"), (np.float64(128), "float64")):
            with pytest.raises(TypeError, match=f"must be an int, not {kind}"):
                m.use_batch_size(wrong)  # type: ignore[arg-type]
        m.use_batch_size(np.int64(64))
        train(m, manual_clock, 64)
    (trial,) = trials(tmp_path)
    assert (trial.batch_size, trial.status) == (64, "completed")
    with zeus_callbacks.measure(bandit_config(tmp_path), backend=virtual_backend, batch_size=np.int32(16)) as m:
        train(m, manual_clock, 16)
    assert [(t.batch_size, t.status) for t in trials(tmp_path)][1] == (16, "completed")


def test_a_plain_int_copy_of_a_suggestion_is_named_in_the_warning(tmp_path, virtual_backend, manual_clock, caplog):
    config = bandit_config(tmp_path)
    size = suggest_batch_size(config)
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        with zeus_callbacks.measure(config, backend=virtual_backend, batch_size=int(size)) as m:
            train(m, manual_clock, int(size))
    (warning,) = [w for w in warnings_of(caplog) if "plain int" in w]
    assert "measure(batch_size=32) was given a plain int" in warning
    assert "suggestion made before the run (batch size 32, trial 1) was not claimed" in warning and "trial 2" in warning
    assert "as returned, not copied with int()" in warning
    assert [(t.trial_id, t.status) for t in trials(tmp_path)][1] == (2, "completed")
    del size


OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.10 GiB total capacity)\n"
    "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
)


@pytest.mark.parametrize("kind", ["sqlite", "json", "postgresql"])
def test_a_batch_size_pruned_for_failing_names_the_last_failure(tmp_path, virtual_backend, manual_clock, capsys, kind):
    # docs/batch_size.md promises `(last: CUDA out of memory)`; show printed `(last: the run failed)`: the
    # failed run's exception was never stored with its trial.
    from tests.store_contract import new_location
    from zeus_callbacks.cli import main

    location = new_location(kind, tmp_path)
    config = bandit_config(tmp_path, batch_sizes=[16, 32], target=None)
    config["store"] = {"url": location} if kind == "postgresql" else {"backend": kind, "path": location}
    for _ in range(2):  # max_failures: 2
        with pytest.raises(RuntimeError, match="CUDA out of memory"):
            with zeus_callbacks.measure(config, backend=virtual_backend) as m:
                m.use_batch_size(m.suggested_batch_size)
                train(m, manual_clock, m.suggested_batch_size)
                raise RuntimeError(OOM)
    reason = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.10 GiB total capacity)"
    pruned = f"failed 2 times in a row (last: {reason})"
    # Outside tester: `show` said so only once the next run had drawn its suggestion. Right after the second
    # failure, before any suggestion, it says what that suggestion will see.
    capsys.readouterr()
    assert main(["show", location]) == 0
    assert f"batch size 32 pruned: {pruned}" in capsys.readouterr().out
    assert main(["show", location, "--json"]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    assert job["failed_arms"] == {"32": pruned}
    with open_store(location) as store:
        failed = [t for t in store.list_trials("nightly") if t.status == "failed"]
        bandit = store.get_bandit("nightly")
    assert [t.info["error"] for t in failed] == [reason, reason]  # the type and the first line, in every store
    assert bandit.state["failed_arms"] == {"32": pruned} and bandit.state["survivors"] == [16]
    assert suggest_batch_size(config) == 16  # 32 pruned: the next suggestion moves on, as show said
    with open_store(location) as store:
        assert store.get_bandit("nightly").state["failed_arms"] == {"32": pruned}


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_runs_that_crashed_before_evaluating_are_told_they_failed_not_to_check_the_metric_name(
    tmp_path, virtual_backend, manual_clock, caplog, kind
):
    # Outside tester: while no run had reached the target, runs that crashed before their first evaluation got
    # "no run reported the metric at all: check its name". The hint names the failure now.
    config = bandit_config(tmp_path)
    config["store"] = {"backend": kind, "path": str(tmp_path / f"store.{kind}")}
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        with zeus_callbacks.measure(config, backend=virtual_backend) as m:
            m.use_batch_size(m.suggested_batch_size)
            raise RuntimeError(OOM)  # before any step or evaluation
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        assert suggest_batch_size(config) == 32  # held: no run has reached the target
    (hint,) = [r.getMessage() for r in caplog.records if "no run has reached the target" in r.getMessage()]
    assert "the runs failed before any evaluation reported it (last: RuntimeError: CUDA out of memory." in hint
    assert "check its name" not in hint
