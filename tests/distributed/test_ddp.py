"""Real 2-process DDP runs on the CPU (gloo): aggregation, one writer, shared degraded mode.

Runs that need no process of their own share a launch (``--then``, once per test run): each
job's two processes import Lightning or Transformers (seconds of CPU each) once for several
runs, and each run keeps its own Trainer, callback, virtual GPUs and folder. A run that fails
on purpose, or whose claim is about what happens in fresh processes, has its own launch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import read_scalars
from tests.once_per_run import once_per_run
from tests.timeouts import CHILD_TIMEOUT_S
from zeus_callbacks.reporting import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
# The jobs run from tmp_path: put this checkout first, or they import the installed copy.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
JOB = Path(__file__).with_name("lightning_ddp_job.py")
HF_JOB = Path(__file__).with_name("hf_ddp_job.py")


# --standalone: a free rendezvous port, so concurrent runs cannot collide on 29500.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def run_job(out: Path, *extra: str, command: list[str] | None = None) -> list[dict]:
    command = command or [sys.executable, str(JOB), str(out), *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, cwd=out.parent, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    (out / "stderr.txt").write_text(done.stderr)  # both ranks' (Lightning's launcher shares the streams)
    return ranks_of(out, done.stderr)


def ranks_of(out: Path, stderr: str = "") -> list[dict]:
    """What each rank of the run in ``out`` wrote; there must be two."""
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    assert len(ranks) == 2, f"expected 2 ranks, got {len(ranks)}: {stderr[-2000:]}"
    return ranks


def shared_launch(folder: Path, launcher: list[str], runs: dict[str, list[str]]) -> dict[str, str]:
    """Run ``runs`` (name: the job's options) one after the other in one launch; each run's folder by name.

    Every run's folder gets the launch's stderr (both ranks', all runs'): a check on it sees more, not less.
    """
    outs = {name: folder / name for name in runs}
    command = list(launcher)
    for name, options in runs.items():
        outs[name].mkdir()
        command += [*(["--then"] if command != launcher else []), str(outs[name]), *options]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, cwd=folder, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    for out in outs.values():
        (out / "stderr.txt").write_text(done.stderr)
    return {name: str(out) for name, out in outs.items()}


@pytest.fixture(scope="module")
def lightning_runs(tmp_path_factory) -> dict[str, Path]:
    """The Lightning runs that share one 2-process launch, by name: each one's folder."""
    runs = {
        # First: its check that Lightning warned nothing must not miss a warning shown once per process.
        "session_backend": ["--session-backend"],
        "sums": ["--step-s", "0.05"],  # 50 ms steps on a manual clock: the ranks' windows are alike
        "faulty_rank": ["--faulty-rank", "1"],
        "evaluation": ["--step-s", "0.05", "--validate", "--overheads", "0.4", "0.001"],
        # Not first: Lightning deleted WORLD_SIZE when the earlier fits ended, and both ranks then shared one marker.
        # On the manual clock: on the wall clock, a loaded machine's late samples left profiling unfinished.
        "power_limit": ["--power-limit", "--step-s", "0.05"],
    }
    outs = once_per_run(tmp_path_factory, "ddp-lightning", lambda f: shared_launch(f, [sys.executable, str(JOB)], runs))
    return {name: Path(out) for name, out in outs.items()}


@pytest.fixture(scope="module")
def hf_runs(tmp_path_factory) -> dict[str, Path]:
    """The HF Trainer runs that share one torchrun launch, by name: each one's folder."""
    runs = {
        "sums": ["--step-s", "0.05"],  # 50 ms steps on a manual clock
        "evaluation": ["--evaluate"],
        # A manual clock: 50 ms a training step and a evaluation batch (2 batches of 4 of 16 samples on each rank).
        "eval_on_start": ["--evaluate", "--eval-on-start", "--step-s", "0.05", "--eval-s", "0.05"],
        "power_limit": ["--power-limit", "--step-s", "0.05"],  # not first: a later run profiles too
    }
    outs = once_per_run(tmp_path_factory, "ddp-hf", lambda f: shared_launch(f, [*TORCHRUN, str(HF_JOB)], runs))
    return {name: Path(out) for name, out in outs.items()}


def test_lightning_ddp_sums_ranks_and_writes_once(lightning_runs):
    out = lightning_runs["sums"]
    ranks = ranks_of(out)
    for rank in ranks:  # two real processes, both seeing the group
        assert rank["trainer_world_size"] == 2 and rank["accelerate_num_processes"] == 2
    assert len({rank["pid"] for rank in ranks}) == 2
    # Each rank measured only its own GPU.
    assert sorted(r["gpu_indices"][0] for r in ranks) == [0, 1] and all(len(r["gpu_indices"]) == 1 for r in ranks)
    summaries = [r["summary"] for r in ranks]
    for summary in summaries:
        assert summary["world_size"] == 2 and len(summary["gpu_energy_J"]) == 2
        # The total is the sum of the per-GPU energies, and every rank agrees on it.
        assert summary["energy_J"] == pytest.approx(sum(summary["gpu_energy_J"]), rel=1e-9)
        assert summary["energy_J"] == pytest.approx(summaries[0]["energy_J"], rel=1e-9)
    gpu0_J, gpu1_J = summaries[0]["gpu_energy_J"]
    # GPU 1 draws 60 W more (about +20 %). Each rank's window holds the same steps of the manual clock (on
    # the wall clock it was the rank's own run, as long as a loaded machine made it), so the energies
    # stand as the GPUs' powers do.
    power0_W, power1_W = (r["true_power_W"] for r in sorted(ranks, key=lambda r: r["gpu_indices"][0]))
    assert power1_W == pytest.approx(power0_W + 60.0)
    assert gpu1_J / gpu0_J == pytest.approx(power1_W / power0_W, rel=0.01)
    # The JSONL log and TensorBoard are written once, by the main process.
    logs = list((out / "zeus").glob("*.jsonl"))
    assert [p.name for p in logs] == ["ddp.jsonl"]
    records = read_jsonl(logs[0])
    assert [r["event"] for r in records].count("run_start") == 1
    epochs = [r for r in records if r["event"] == "epoch"]
    assert len(epochs) == 2 and all(r["ranks"] == 2 for r in epochs)
    for r in epochs:
        assert r["energy_J"] == pytest.approx(sum(r["gpu_energy_J"]), rel=1e-9)
    scalars = read_scalars(out / "tb")
    assert {"energy/gpu0_J", "energy/gpu1_J", "energy/epoch_J"} <= set(scalars)


def test_lightning_ddp_on_the_configs_virtual_gpus_names_each_ranks_gpu_and_warns_nothing(lightning_runs, capsys):
    # An outside tester's 2-process run: Lightning warned that sim_energy_kJ was logged without sync_dist,
    # both ranks' virtual GPUs were VIRTUAL-GPU-0, and the report listed rank 0's GPU under "2 GPU(s)".
    from zeus_callbacks.cli import main

    out = lightning_runs["session_backend"]  # the launch's first run
    ranks = ranks_of(out)
    assert [r["trainer_world_size"] for r in ranks] == [2, 2] and len({r["pid"] for r in ranks}) == 2
    assert [r["gpu_uuid"] for r in ranks] == ["VIRTUAL-GPU-RANK0-0", "VIRTUAL-GPU-RANK1-0"]
    stderr = (out / "stderr.txt").read_text()
    assert "sync_dist" not in stderr, stderr[-2000:]  # the progress bar's energy is the job's on every rank already
    (log,) = (out / "zeus").glob("*.jsonl")
    (start,) = [r for r in read_jsonl(log) if r["event"] == "run_start"]
    assert [d["uuid"] for d in start["devices"]] == ["VIRTUAL-GPU-RANK0-0"]  # the main process writes run_start
    capsys.readouterr()
    assert main(["report", str(log)]) == 0
    report = " ".join(capsys.readouterr().out.split())
    assert "2 GPU(s) over 2 processes" in report and "GPU(s) of rank 0 only" in report


def test_a_sensor_fault_on_one_rank_degrades_both(lightning_runs):
    ranks = ranks_of(lightning_runs["faulty_rank"])
    by_rank = {r["global_rank"]: r["summary"] for r in ranks}
    assert by_rank[1]["faults"] and not by_rank[0]["faults"]  # only rank 1 saw the fault
    assert by_rank[0]["degraded"] and by_rank[1]["degraded"]  # agreed through a collective
    assert by_rank[0]["status"] == by_rank[1]["status"] == "completed"


def test_a_failure_on_one_rank_ends_both_and_the_total_says_it_is_one_ranks(tmp_path, capsys):
    # After a failure each rank ends alone; run_end held rank 0's energy as the run's total, with
    # nothing but world_size 1 to tell (its epoch list mixed both ranks' epoch 0 with its own epoch 1).
    from zeus_callbacks.cli import main as cli

    out = tmp_path / "run"
    out.mkdir()
    done = subprocess.run([sys.executable, str(JOB), str(out), "--raise-on-rank", "1"], capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT_S, cwd=out.parent, env=ENV)  # fmt: skip
    assert done.returncode != 0 and "planted failure on rank 1" in done.stderr
    (log,) = (out / "zeus").glob("*.jsonl")  # still written once, by the main process
    records = read_jsonl(log)
    end = records[-1]
    assert end["event"] == "run_end" and end["status"] == "failed"
    epochs = [r for r in records if r["event"] == "epoch"]
    assert epochs[0]["ranks"] == 2  # before the failure: both ranks
    assert end["world_size"] == 1 and len(end["gpu_energy_J"]) == 1
    assert "1 of 2 ranks" in end["measurement_note"]
    printed = done.stdout + done.stderr
    assert printed.count("zeus-callbacks run 'ddp' (failed)") == 1 and "PARTIAL: " in printed  # summary once
    assert cli(["report", str(log)]) == 0
    assert "  PARTIAL: this process's GPUs only (1 of 2 ranks)" in capsys.readouterr().out


def test_hf_trainer_under_torchrun_sums_ranks_and_writes_once(hf_runs):
    out = hf_runs["sums"]
    ranks = ranks_of(out)
    assert all(r["trainer_world_size"] == 2 for r in ranks) and len({r["pid"] for r in ranks}) == 2
    assert sorted(r["gpu_indices"][0] for r in ranks) == [0, 1]
    summaries = [r["summary"] for r in ranks]
    for summary in summaries:
        assert summary["world_size"] == 2 and summary["steps"] == 12
        assert summary["energy_J"] == pytest.approx(sum(summary["gpu_energy_J"]), rel=1e-9)
        assert summary["energy_J"] == pytest.approx(summaries[0]["energy_J"], rel=1e-9)
    # GPU 1 draws 60 W more; both ranks' windows hold the same 12 steps of the manual clock.
    power0_W, power1_W = (r["true_power_W"] for r in sorted(ranks, key=lambda r: r["gpu_indices"][0]))
    assert power1_W == pytest.approx(power0_W + 60.0)
    gpu0_J, gpu1_J = summaries[0]["gpu_energy_J"]
    assert gpu1_J / gpu0_J == pytest.approx(power1_W / power0_W, rel=0.01)
    assert [p.name for p in (out / "zeus").glob("*.jsonl")] == ["hf-ddp.jsonl"]
    records = read_jsonl(out / "zeus" / "hf-ddp.jsonl")
    assert [r["event"] for r in records].count("run_end") == 1
    assert all(r["ranks"] == 2 for r in records if r["event"] == "steps")
    # The running totals of HF's periodic logs are the run's (all GPUs), identical on both ranks.
    logged = [r["logged_totals"] for r in ranks]
    # Logs at steps 4 and 8; the one at step 12, where training stops, leaves its values to the final log
    # at that same step (one point per step), which the probe does not count.
    assert [step for step, _, _ in logged[0]] == [4, 8] and logged[0] == logged[1]
    energies = [energy_J for _, energy_J, _ in logged[0]]
    assert energies == sorted(energies) and energies[-1] < summaries[0]["energy_J"]


def test_every_rank_applies_the_same_power_limit_at_the_same_step(lightning_runs):
    # A later fit in the same two processes: rank 0 used to observe, finding rank 1's restore marker at
    # its own path ("holds a file this run did not write"), once Lightning had deleted WORLD_SIZE.
    by_rank = _profiled_in_a_later_run(lightning_runs["power_limit"], "ddp.jsonl")
    limits0 = [tuple(x) for x in by_rank[0]["limits"]]
    limits1 = [tuple(x) for x in by_rank[1]["limits"]]
    assert limits0 == limits1  # same limit, same step, on both GPUs
    assert len({limit for _, limit in limits0}) >= 2  # the main rank's profiler did try limits
    original_W = limits0[0][1]
    assert by_rank[0]["limit_after_W"] == by_rank[1]["limit_after_W"] == original_W  # restored


def test_hf_trainer_under_torchrun_profiles_power_limits_in_a_later_run(hf_runs):
    # torchrun's WORLD_SIZE outlives a run (Lightning deletes its own): each rank keeps its own marker.
    by_rank = _profiled_in_a_later_run(hf_runs["power_limit"], "hf-ddp.jsonl")
    assert by_rank[0]["summary"]["chosen_power_limit_W"] is not None  # the main rank chose (not observe mode)
    assert all(r["summary"]["power_limit_W"] == 300.0 for r in by_rank.values())  # restored at the end


def _profiled_in_a_later_run(out: Path, log_name: str) -> dict[int, dict]:
    """What every later power-limit run in the same two processes must show; each rank's report by rank.

    Two processes of a world of 2; no rank took the other's restore marker for another run's; the main
    rank profiled (not observe mode); each rank removed its own marker.
    """
    ranks = ranks_of(out)
    assert len({r["pid"] for r in ranks}) == 2 and all(r["trainer_world_size"] == 2 for r in ranks)
    assert "did not write" not in (out / "stderr.txt").read_text()
    records = read_jsonl(out / "zeus" / log_name)
    assert [r["source"] for r in records if r["event"] == "power_limit_profile"] == ["profile"]
    assert not list((out / "zeus").glob("power_limit_restore*"))
    return {r["global_rank"]: r for r in ranks}


def test_batch_size_is_chosen_once_and_the_store_written_once(tmp_path):
    from zeus_callbacks.store import open_store

    out = tmp_path / "run"
    out.mkdir()
    store = tmp_path / "zeus.sqlite"
    for recurrence in range(2):
        for stale in out.glob("rank*.json"):
            stale.unlink()
        ranks = run_job(out, "--store", str(store))
        used = {r["batch_size_used"] for r in ranks}
        assert len(used) == 1, f"ranks trained with different batch sizes: {used}"
        with open_store(store) as opened:
            trials = opened.list_trials("ddp-job")
        assert len(trials) == recurrence + 1  # one trial per recurrence, not one per rank
        assert trials[-1].batch_size == used.pop() and trials[-1].status != "running"


def test_lightning_early_stop_is_agreed_at_the_same_step(tmp_path):
    from zeus_callbacks.config import parse_config
    from zeus_callbacks.optimizers.batch_size import BanditSettings, BatchSizeBandit
    from zeus_callbacks.store import open_store

    out = tmp_path / "run"
    out.mkdir()
    store_path = tmp_path / "zeus.sqlite"
    # Plant a cheap converged first recurrence at the default size (the job's own bandit settings):
    # the next one, pruning down to 8 (the first size below the start: prune_cost_ratio_no_descent,
    # 1.3), stops once its cost passes 1.3 x this cost.
    cfg = parse_config({"batch_size": {"enabled": True, "batch_sizes": [8, 16, 32], "default_batch_size": 16}})
    with open_store(store_path) as store:
        bandit = BatchSizeBandit(store, "ddp-job", BanditSettings.from_config(cfg.batch_size))
        first = bandit.suggest()
        bandit.report(first.trial_id, energy_J=100.0, time_s=0.2, cost=150.0, converged=True)
    max_epochs = 20
    ranks = run_job(out, "--store", str(store_path), "--max-epochs", str(max_epochs))
    assert all(r["trainer_world_size"] == 2 for r in ranks) and len({r["pid"] for r in ranks}) == 2
    assert {r["batch_size_used"] for r in ranks} == {8}
    steps = {r["stopped_at_step"] for r in ranks}
    assert len(steps) == 1, f"the ranks stopped at different steps: {steps}"
    (stopped_at,) = steps
    assert 0 < stopped_at < max_epochs * 256 // 8  # stopped early, not at the end of training
    assert stopped_at % 3 == 0  # at an agreement step (batch_size.stop_agreement_steps = 3)
    with open_store(store_path) as store:
        trials = store.list_trials("ddp-job")
    assert [t.status for t in trials] == ["completed", "early_stopped"]  # recorded once, by the main rank
    assert "exceeds prune_cost_ratio_no_descent 1.3 x best cost = 195" in trials[1].info["stop_reason"]


def test_hf_bandit_under_torchrun_suggests_once_and_stops_every_rank_together(tmp_path):
    from zeus_callbacks.store import open_store

    out = tmp_path / "run"
    out.mkdir()
    store_path = tmp_path / "zeus.sqlite"
    launcher = TORCHRUN
    runs = []
    # Recurrence 1 reaches its target at the first evaluation (step 4); recurrence 2 never can,
    # and its cost passes 1.3 x the first one's (prune_cost_ratio_no_descent while pruning).
    for recurrence, target_loss in enumerate(("1e9", "0")):
        for stale in out.glob("rank*.json"):
            stale.unlink()
        command = [*launcher, str(HF_JOB), str(out), "--store", str(store_path), "--target-loss", target_loss,
                   "--run-name", f"r{recurrence}"]  # fmt: skip
        ranks = run_job(out, command=command)
        assert all(r["trainer_world_size"] == 2 for r in ranks) and len({r["pid"] for r in ranks}) == 2
        # The group suggest_batch_size() made before TrainingArguments is the Trainer's (gloo, as asked).
        assert {r["process_group_backend"] for r in ranks} == {"gloo"}
        used = {(r["suggested_batch_size"], r["claimed_batch_size"], r["batch_size_used"]) for r in ranks}
        assert len(used) == 1 and len(set(used.pop())) == 1, f"ranks disagree on the batch size: {ranks}"
        steps = {r["stopped_at_step"] for r in ranks}
        assert len(steps) == 1, f"the ranks stopped at different steps: {steps}"
        with open_store(store_path) as store:
            trials = store.list_trials("hf-ddp-job")
        assert len(trials) == recurrence + 1  # one trial per recurrence, written by the main process
        assert trials[-1].batch_size == ranks[0]["batch_size_used"]
        runs.append((steps.pop(), trials[-1]))
    (step1, trial1), (step2, trial2) = runs
    assert step1 == 4 and (trial1.status, trial1.converged) == ("completed", True)  # stopped at the target
    assert trial2.status == "early_stopped"
    assert "exceeds prune_cost_ratio_no_descent 1.3 x best cost" in trial2.info["stop_reason"]
    assert trial2.batch_size != trial1.batch_size  # pruning moved on to another size
    assert 0 < step2 < 60 and step2 % 2 == 0  # early, at an agreement step (stop_agreement_steps = 2)


def test_lightning_ddp_evaluation_energy_sums_the_ranks_and_they_measure_the_same_steps(lightning_runs, capsys):
    # Issue 26. Each rank's eval record held its own GPU only (about half the ledger's eval_J on 2 ranks);
    # under auto sampling each rank settled its own share, so the ranks measured different steps; and
    # `report` printed "1 GPU(s)" for the 2-GPU job. Here the ranks' budgets differ 400-fold.
    from zeus_callbacks.cli import main as cli

    out = lightning_runs["evaluation"]
    ranks = ranks_of(out)
    assert len({r["pid"] for r in ranks}) == 2 and all(r["trainer_world_size"] == 2 for r in ranks)
    measured = [r["measured_steps"] for r in ranks]
    assert measured[0] == measured[1]  # one agreed share, one seed: the same steps on both GPUs
    assert 0 < len(measured[0]) < ranks[0]["summary"]["steps"]  # the least budget's share: not every step
    records = read_jsonl(out / "zeus" / "ddp.jsonl")
    evals = [r for r in records if r["event"] == "eval"]
    epochs = [r for r in records if r["event"] == "epoch"]
    assert len(evals) == len(epochs) == 2
    for ev, epoch in zip(evals, epochs, strict=True):
        assert ev["ranks"] == 2 and ev["ranks_note"] is None and ev["energy_J"] > 0
        # The ledger sums each rank's evaluation at the epoch's end: the eval record holds the same sum.
        assert ev["energy_J"] == pytest.approx(epoch["ledger"]["eval_J"], rel=1e-6)
        assert ev["time_s"] == pytest.approx(0.1, rel=0.05)  # 2 validation batches of 50 ms on each rank
    for steps in (r for r in records if r["event"] == "steps" and r["energy_J_mean"] is not None):
        assert steps["ranks"] == 2
    # The documented cadence on both ranks (logging.interval_steps 4, 8 steps an epoch): reports after batches 3 and
    # 7, at each epoch's end (logged at its global step, 8 and 16), after 11 and 15. A point needs every
    # rank's samples; the steps of a report without them go into the next one, and the records hold every step.
    scalars = read_scalars(out / "tb")
    assert {step for step, _ in scalars["energy/step_J"]} <= {3, 7, 8, 11, 15, 16}
    steps_records = [r for r in records if r["event"] == "steps"]
    assert sum(r["steps"] + r["warmup_steps"] for r in steps_records) == ranks[0]["summary"]["steps"] == 16
    logged = [value for _, value in scalars["energy/eval_J"]]
    assert logged == pytest.approx([ev["energy_J"] for ev in evals], rel=1e-6)
    assert cli(["report", str(out / "zeus" / "ddp.jsonl")]) == 0
    header = capsys.readouterr().out.split("\n  energy ")[0]
    assert "2 GPU(s) over 2 processes" in header and "1 GPU(s)" not in header


def test_hf_trainer_evaluation_energy_sums_the_ranks_under_torchrun(hf_runs):
    # Issue 26: the Trainer's own evaluations run on every process; their energy is summed over the ranks.
    out = hf_runs["evaluation"]
    ranks = ranks_of(out)
    assert all(r["trainer_world_size"] == 2 for r in ranks) and len({r["pid"] for r in ranks}) == 2
    records = read_jsonl(out / "zeus" / "hf-ddp.jsonl")
    evals = [r for r in records if r["event"] == "eval"]
    assert [r["step"] for r in evals] == [4, 8, 12]
    assert all(r["ranks"] == 2 and r["ranks_note"] is None and r["energy_J"] > 0 for r in evals)
    # The run's one (cut-short) epoch: its ledger sums each rank's evaluations at the epoch's end.
    (epoch,) = [r for r in records if r["event"] == "epoch"]
    assert sum(r["energy_J"] for r in evals) == pytest.approx(epoch["ledger"]["eval_J"], rel=1e-6)


def test_hf_eval_on_start_energy_sums_the_ranks_under_torchrun(hf_runs):
    # Issue 26: the Trainer's eval_on_start evaluation (before the first step) sets no should_evaluate flag;
    # its eval record held rank 0's GPU alone ("ranks": 1, a ranks_note) while later evaluations summed both.
    out = hf_runs["eval_on_start"]
    ranks = ranks_of(out)
    assert all(r["trainer_world_size"] == 2 and r["eval_on_start"] for r in ranks)
    assert len({r["pid"] for r in ranks}) == 2  # two processes
    records = read_jsonl(out / "zeus" / "hf-ddp.jsonl")
    evals = [r for r in records if r["event"] == "eval"]
    assert [r["step"] for r in evals] == [0, 4, 8, 12]
    assert all(r["ranks"] == 2 and r["ranks_note"] is None for r in evals)
    start = evals[0]
    assert start["time_s"] == pytest.approx(0.1, rel=0.05)
    # Both GPUs' power over the evaluation's 0.1 s; one rank's alone would be under 45 % of it (GPU 1 draws 60 W more).
    both_W = sum(r["true_power_W"] for r in ranks)
    assert start["energy_J"] == pytest.approx(both_W * start["time_s"], rel=0.1)
