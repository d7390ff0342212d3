"""Golden-JSONL characterisation of EnergySession: what a run writes must not change.

Each scenario drives the session deterministically (see ``harness.py``) and compares the
run's JSONL records, plus what the adapters would read through the public API
(``pop_metrics``, decisions, totals, the summary, ``state_dict``, the store), with
``data/<scenario>.jsonl``: strings, integers and booleans exactly, floats to the tolerance of
``tolerance.scenario_tolerance`` (derived from the scenario's fits)
(``ZEUS_CALLBACKS_GOLDEN_EXACT=1``: to the last bit). Regenerate after an intended change of behaviour::

    ZEUS_CALLBACKS_REGEN_GOLDEN=1 python -m pytest tests/golden
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.golden.harness import Loop, Rig, check_golden, finish, run_loop, start, store_lines
from tests.golden.tolerance import scenario_tolerance, solve_conditioning
from tests.timeouts import CHILD_TIMEOUT_S
from zeus_callbacks import suggest_batch_size


def scenario_plain(rig: Rig) -> None:
    """Step, epoch and eval windows, a user window, a failed run and a checkpoint resume."""
    config = rig.config(logging={"interval_steps": 5})
    session = rig.session(config)
    start(session, "plain")
    step = run_loop(rig, session, Loop(epochs=2, steps_per_epoch=12, num_tokens=96))
    with session.window("checkpoint", epoch=1):
        rig.clock.advance(0.3)
    finish(rig, session)
    state = session.state_dict()

    resumed = rig.session(config)
    resumed.load_state_dict(state)
    start(resumed, "plain-resumed")
    run_loop(rig, resumed, Loop(epochs=1, steps_per_epoch=7), first_step=step, first_epoch=2)
    finish(rig, resumed)

    failed = rig.session(config)
    start(failed, "plain-failed")
    run_loop(rig, failed, Loop(epochs=1, steps_per_epoch=3, eval_s=0.0))
    failed.epoch_start(1)
    failed.step_start(3)
    rig.clock.advance(0.02)
    rig.observe("exception_summary", returned=failed.exception(RuntimeError("boom")) is not None)
    finish(rig, failed)


def scenario_phases(rig: Rig) -> None:
    """windows.phases: forward/backward/optimizer/dataloader per epoch with their CIs."""
    config = rig.config(windows={"phases": True}, logging={"interval_steps": 10})
    session = rig.session(config)
    start(session, "phases")
    run_loop(rig, session, Loop(epochs=2, steps_per_epoch=60, step_s=0.04, phases=True))
    finish(rig, session)


def scenario_sample_fraction(rig: Rig) -> None:
    """A fixed windows.sample_fraction of 0.2: seeded draws, quiet steps, every step still counted."""
    config = rig.config(windows={"sample_fraction": 0.2}, logging={"interval_steps": 25})
    session = rig.session(config)
    start(session, "fraction")
    run_loop(rig, session, Loop(epochs=3, steps_per_epoch=80, step_s=0.03))
    finish(rig, session)


def scenario_power_limit(rig: Rig) -> None:
    """Just-in-time power-limit profiling, then a second run that applies the cached choice."""
    config = rig.config(power_limit={"enabled": True, "warmup_steps": 1, "min_profile_steps": 4})
    for name in ("profile", "cached"):
        session = rig.session(config)
        start(session, f"power-limit-{name}")
        run_loop(rig, session, Loop(epochs=4, steps_per_epoch=30, step_s=0.25, num_samples=32))
        finish(rig, session)
        rig.observe("limit_after_run", power_limit_W=rig.backend.power_limit_W(0))
    sources = [line["source"] for line in rig.lines if line["event"] == "power_limit_profile"]
    assert sources == ["profile", "cache"], sources  # the scenario covers what it says


def scenario_batch_size(tmp_path) -> list[dict]:
    """The batch-size bandit across recurrences against a real SQLite store (one virtual GPU per recurrence)."""
    store = tmp_path / "store.sqlite"
    epochs_to_target = {32: 3, 64: 2, 128: 2, 256: None}  # None: never reaches the target
    lines: list[dict] = []
    for recurrence in range(6):
        config = {
            "backend": "virtual",
            "job_id": "golden-bandit",
            "windows": {"sample_fraction": 1.0},
            "logging": {"log_dir": str(tmp_path / "logs"), "interval_steps": 10},
            "store": {"backend": "sqlite", "path": str(store)},
            "batch_size": {
                "enabled": True, "batch_sizes": sorted(epochs_to_target), "default_batch_size": 64, "seed": 3,
                "target": {"metric": "val/acc", "value": 0.6, "direction": "max"}, "eta_knob": 0.5, "beta_knob": 2.0,
            },
        }  # fmt: skip
        batch_size = suggest_batch_size(config)
        rig = Rig.create(tmp_path, workload="cifar100", batch_size=batch_size)
        session = rig.session(config)
        suggested = session.suggest_batch_size(batch_size)
        rig.observe("suggested", recurrence=recurrence, top_level=batch_size, session=suggested)
        start(session, f"recurrence-{recurrence}")
        target = epochs_to_target[batch_size]

        def accuracy(epoch: int, target=target) -> dict[str, float]:
            return {"val/acc": 0.6 if target is not None and epoch + 1 >= target else 0.4}

        steps = 2048 // batch_size  # a fixed data set: fewer, longer steps at larger batch sizes
        step_s = rig.backend.epoch_time_s(rig.backend.curve.max_limit_W) / 50 / steps  # epochs of 1/50 the trace
        run_loop(rig, session, Loop(epochs=5, steps_per_epoch=steps, step_s=step_s, num_samples=batch_size,
                                    eval_s=0.1, eval_metrics=accuracy))  # fmt: skip
        finish(rig, session)
        rig.backend.close()
        lines.extend(line for line in rig.lines)
    lines.extend(store_lines(store, "golden-bandit"))
    return lines


SINGLE = {
    "plain": scenario_plain,
    "phases": scenario_phases,
    "sample_fraction": scenario_sample_fraction,
    "power_limit": scenario_power_limit,
}


@pytest.mark.parametrize("name", sorted(SINGLE))
def test_single_process_scenario_matches_golden(name, tmp_path):
    rig = Rig.create(tmp_path, read_only=name != "power_limit")
    try:
        with solve_conditioning() as seen:
            SINGLE[name](rig)
    finally:
        rig.backend.close()
    assert any(line["event"] == "run_end" for line in rig.lines)
    check_golden(name, rig.lines, tmp_path, scenario_tolerance(seen))


def test_batch_size_bandit_matches_golden(tmp_path):
    with solve_conditioning() as seen:
        lines = scenario_batch_size(tmp_path)
    trials = [line for line in lines if line["event"] == "golden.store_trial"]
    assert len(trials) == 6 and len({t["batch_size"] for t in trials}) > 1  # the bandit explored
    check_golden("batch_size", lines, tmp_path, scenario_tolerance(seen))


TWO_RANK_JOB = Path(__file__).with_name("two_rank_job.py")


def test_two_rank_peer_matches_golden(tmp_path):
    """Two real processes (gloo): rank 0's log and what both ranks saw, the peer included."""
    command = [sys.executable, str(TWO_RANK_JOB), str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = []
    for rank in range(2):
        lines.extend({"rank": rank, **line} for line in json.loads((tmp_path / f"rank{rank}.json").read_text()))
    logs = sorted(p.name for p in (tmp_path / "logs").glob("*.jsonl"))
    assert logs == ["two-rank-power-limit.jsonl", "two-rank.jsonl"]
    assert not any(line["event"] == "run_start" for line in lines if line["rank"] == 1)  # one writer: rank 0
    sizes = {(line["rank"], line["world_size"]) for line in lines if "world_size" in line}
    assert sizes == {(0, 2), (1, 2)}, sizes  # both processes ran and each saw two
    seen = [tuple(s) for rank in range(2) for s in json.loads((tmp_path / f"rank{rank}_solves.json").read_text())]
    check_golden("two_rank", lines, tmp_path, scenario_tolerance(seen))
