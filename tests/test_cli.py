import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import zeus_callbacks
from zeus_callbacks.cli import main
from zeus_callbacks.session import EnergySession


def test_validate_config_accepts_a_good_file_and_names_bad_fields(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text("backend: virtual\nlogging: {interval_steps: 7}\n")
    assert main(["validate-config", str(good)]) == 0
    assert "valid" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("backend: virtual\nlogging: {interval_step: 7}\n")
    assert main(["validate-config", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "logging.interval_step" in err and "Traceback" not in err


def test_validate_config_prints_a_setting_without_effect_on_stderr_and_stays_valid(tmp_path, capsys, caplog):
    # Issue 26: windows.max_overhead beside a numeric windows.sample_fraction was called valid, silently.
    path = tmp_path / "fixed.yaml"
    path.write_text("backend: virtual\nwindows: {sample_fraction: 0.5, max_overhead: 0.01}\n")
    assert main(["validate-config", str(path)]) == 0
    captured = capsys.readouterr()
    assert "valid" in captured.out
    (line,) = captured.err.splitlines()
    assert line.startswith(f"{path}: warning: windows.max_overhead has no effect")
    assert not caplog.records  # printed once, not logged as well


def test_validate_config_warns_of_a_batch_size_search_without_job_id_or_target(tmp_path, capsys):
    # Before, batch_size.enabled without job_id or target was called valid, silently (outside tester): the
    # trials then go to the shared job "default", and without a target no run converges.
    path = tmp_path / "bs.yaml"
    path.write_text("backend: virtual\nbatch_size: {enabled: true, batch_sizes: [16, 32], default_batch_size: 32}\n")
    assert main(["validate-config", str(path)]) == 0
    captured = capsys.readouterr()
    assert "valid" in captured.out
    job, target = captured.err.splitlines()
    assert job.startswith(f"{path}: warning: batch_size.enabled without job_id: the trials go to job 'default'")
    assert target.startswith(f"{path}: warning: batch_size.enabled without batch_size.target: no run converges")
    path.write_text(
        "backend: virtual\njob_id: nightly\nbatch_size: {enabled: true, batch_sizes: [16, 32], "
        "default_batch_size: 32, target: {metric: val/acc, value: 0.9}}\n"
    )
    assert main(["validate-config", str(path)]) == 0
    assert capsys.readouterr().err == ""


def test_validate_config_refuses_a_repeated_section(tmp_path, capsys):
    path = tmp_path / "twice.yaml"
    path.write_text("logging: {interval_steps: 7}\nbackend: virtual\nlogging: {jsonl: false}\n")
    assert main(["validate-config", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"{path}: line 3: duplicate key 'logging' (already given at line 1); give each key once\n"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_validate_config_refuses_a_log_dir_that_cannot_be_created(tmp_path, capsys):
    # It said "valid" for log_dir /proc/nope; the run then failed at its start. Root passes
    # os.access there, so this also covers the probe.
    path = tmp_path / "zeus.yaml"
    path.write_text("backend: virtual\nlogging: {log_dir: /proc/nope/logs}\n")
    assert main(["validate-config", str(path)]) == 1
    err = capsys.readouterr().err
    # The permission check passes there: the message says what failed, not "not writable" beside ENOENT.
    assert "logging.log_dir: /proc/nope/logs: it cannot be created: creating a folder in /proc failed (" in err
    assert "not writable" not in err


def test_validate_config_says_what_failed_when_a_folder_cannot_be_made_in_a_writable_looking_log_dir(
    tmp_path, capsys, monkeypatch
):
    # The permission check passes, the probe fails (a read-only mount): the errno text is the reason.
    import errno
    import tempfile

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    path = tmp_path / "zeus.yaml"
    path.write_text(f"backend: virtual\nlogging: {{log_dir: {tmp_path}}}\n")
    assert main(["validate-config", str(path)]) == 1
    err = capsys.readouterr().err
    expected = f"logging.log_dir: {tmp_path}: the log cannot be written there: creating a folder in {tmp_path} failed"
    assert expected in err
    assert os.strerror(errno.EROFS) in err and "not writable" not in err


def test_validate_config_refuses_a_log_dir_without_write_permission(tmp_path, capsys, monkeypatch):
    # The permission check, as a user other than root sees a folder of mode 0o555.
    shut = tmp_path / "shut"
    shut.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == shut else real_access(p, mode))
    path = tmp_path / "zeus.yaml"
    path.write_text(f"backend: virtual\nlogging: {{log_dir: {shut}}}\n")
    assert main(["validate-config", str(path)]) == 1
    assert f"logging.log_dir: {shut} is not writable" in capsys.readouterr().err


def test_validate_config_creates_nothing_for_a_log_dir_to_come(tmp_path, capsys):
    # A writable parent is enough; the check leaves the parent as it found it.
    parent = tmp_path / "runs"
    parent.mkdir()
    path = tmp_path / "zeus.yaml"
    path.write_text(f"backend: virtual\nlogging: {{log_dir: {parent / 'a' / 'b'}}}\n")
    assert main(["validate-config", str(path)]) == 0
    assert list(parent.iterdir()) == []


def test_validate_config_refuses_a_log_dir_under_a_file(tmp_path, capsys):
    (tmp_path / "plain").write_text("x")
    path = tmp_path / "zeus.yaml"
    path.write_text(f"backend: virtual\nlogging: {{log_dir: {tmp_path / 'plain' / 'logs'}}}\n")
    assert main(["validate-config", str(path)]) == 1
    assert f"{tmp_path / 'plain'} is a file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (None, "power-limit trace not found"),
        ("X,d,n,64,sgd,100,30,-90\n", "line 2: column 'average_power': '-90' must be a finite number > 0"),
    ],
)
def test_validate_config_reads_the_virtual_trace(tmp_path, capsys, rows, message):
    # It said "valid" for a virtual.trace that is missing or broken; training then failed at its start.
    sweep = tmp_path / "sweep.csv"
    if rows is not None:
        sweep.write_text("gpu,dataset,network,batch_size,optimizer,power_limit,time_per_epoch,average_power\n" + rows)
    path = tmp_path / "zeus.yaml"
    path.write_text(f"backend: virtual\nvirtual: {{trace: {sweep}}}\n")
    assert main(["validate-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "virtual.trace" in err and message in err and str(sweep.name) in err and "Traceback" not in err
    # A readable sweep is valid.
    sweep.write_text("gpu,dataset,network,batch_size,optimizer,power_limit,time_per_epoch,average_power\n"
                     "X,d,n,64,sgd,100,30,90\nX,d,n,64,sgd,200,20,150\n")  # fmt: skip
    assert main(["validate-config", str(path)]) == 0


def train_one_epoch(session: EnergySession, clock) -> None:
    """Start ``session`` and run one epoch of four 0.5 s steps on the manual clock."""
    session.train_start()
    run_epoch(session, clock)


def run_epoch(session: EnergySession, clock) -> None:
    """One epoch (0) of four 0.5 s steps on the manual clock, in a started session."""
    session.epoch_start(0)
    for step in range(4):
        session.step_start(step)
        clock.advance(0.5)
        session.sampler.poll_once()
        session.step_end(step)
    session.epoch_end(0)


def test_report_summarises_a_run(tmp_path, capsys, virtual_backend, manual_clock):
    session = EnergySession(
        {"logging": {"log_dir": str(tmp_path), "run_name": "r1", "interval_steps": 2}},
        backend=virtual_backend,
    )
    train_one_epoch(session, manual_clock)
    summary = session.train_end()
    assert main(["report", str(tmp_path / "r1.jsonl")]) == 0
    out = capsys.readouterr().out
    assert f"{summary.energy_J:.1f} J" in out and "4 steps" in out
    assert "  SIMULATED energy (virtual GPU, not measured)" in out.splitlines()  # the virtual GPU's say so here too
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 1


def test_report_without_run_end_still_says_simulated(tmp_path, capsys, virtual_backend, manual_clock):
    # A log cut before run_end (killed run) printed its epochs with no word that they were simulated.
    session = EnergySession({"logging": {"log_dir": str(tmp_path), "run_name": "r1"}}, backend=virtual_backend)
    train_one_epoch(session, manual_clock)
    session.train_end()
    log = tmp_path / "r1.jsonl"
    killed = tmp_path / "killed.jsonl"
    killed.write_text("".join(line for line in log.read_text().splitlines(keepends=True) if '"run_end"' not in line))
    assert main(["report", str(killed)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "no run_end record" in out[0]
    assert "  SIMULATED energy (virtual GPU, not measured)" in out
    assert any(row.split()[0] == "0" for row in out[2:])  # the epoch row is still there
    # A log from before the simulated flag: the virtual backend it names still says so.
    old = tmp_path / "old.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    old.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "simulated"}) + "\n" for r in rows))
    assert main(["report", str(old)]) == 0
    assert "  SIMULATED energy (virtual GPU, not measured)" in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("module", ["zeus_callbacks.cli", "zeus_callbacks"])  # a new user tried the second first
def test_console_script_entry_point_runs(module):
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "validate-config" in done.stdout


def test_version_prints_the_installed_version(capsys):
    expected = f"zeus-callbacks {metadata.version('zeus-callbacks')}\n"
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out == expected
    done = subprocess.run([sys.executable, "-m", "zeus_callbacks.cli", "--version"], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, expected, "")


def test_the_version_has_one_source():
    from zeus_callbacks._version import __version__

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'version = { attr = "zeus_callbacks._version.__version__" }' in pyproject
    assert not re.search(r'^version = "', pyproject, flags=re.M)  # no second, hand-kept copy
    assert zeus_callbacks.__version__ == __version__ == metadata.version("zeus-callbacks")


def test_simulate_subcommand_runs_recurrences(tmp_path, capsys):
    import json

    store = tmp_path / "store.sqlite"
    args = ["simulate", "--gpu", "V100", "--workload", "cifar100", "--recurrences", "3", "--store", str(store)]
    args.append("--json")
    assert main(args) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 3 and store.exists()


def test_show_labels_the_posterior_and_gives_the_measured_mean_beside_it(tmp_path, capsys):
    # Issue 26 (outside tester): with one trial of cost 1224.0 `show` printed "mean cost 1224.5":
    # the bandit's posterior mean, which the prior pulls off the measured cost, read as a measured mean.
    store = tmp_path / "store.sqlite"
    args = ["simulate", "--gpu", "A40", "--workload", "cifar100", "--recurrences", "3", "--store", str(store)]
    assert main(args) == 0
    capsys.readouterr()
    assert main(["show", str(store), "--json"]) == 0
    job = json.loads(capsys.readouterr().out)["jobs"][0]
    costs: dict[int, list[float]] = {}
    for trial in job["trials"]:
        costs.setdefault(trial["batch_size"], []).append(trial["cost"])
    tried = [arm for arm in job["arms"] if arm["batch_size"] in costs]
    assert tried and all(len(costs[arm["batch_size"]]) == 1 for arm in tried)
    for arm in tried:
        assert arm["measured_trials"] == 1
        assert arm["measured_mean_cost"] == pytest.approx(costs[arm["batch_size"]][0], rel=1e-12)
        assert arm["mean_cost"] != pytest.approx(arm["measured_mean_cost"], rel=1e-6)  # the prior pulls it
    untried = [arm for arm in job["arms"] if arm["batch_size"] not in costs]
    assert untried and all(arm["measured_mean_cost"] is None and arm["measured_trials"] == 0 for arm in untried)
    assert main(["show", str(store)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("batch") and "alive" in line)
    assert header.split() == "batch model mean model spread model n measured mean measured trials alive".split()
    assert "mean cost" not in "\n".join(lines)  # no unlabelled model figure


def test_show_and_plot_read_a_simulated_store(tmp_path, capsys):
    store = tmp_path / "store.sqlite"
    args = ["simulate", "--gpu", "A40", "--workload", "cifar100", "--recurrences", "12", "--store", str(store)]
    assert main(args) == 0
    capsys.readouterr()
    assert main(["show", str(store)]) == 0
    out = capsys.readouterr().out
    assert "job " in out and "model mean" in out and "measured mean" in out and "trial(s)" in out
    assert main(["show", str(store), "--json"]) == 0
    import json

    report = json.loads(capsys.readouterr().out)
    job = report["jobs"][0]
    assert len(job["trials"]) == 12 and job["arms"]
    assert all(arm["std_cost"] > 0 for arm in job["arms"])  # the variance floor: no frozen arm
    png = tmp_path / "bandit.png"
    assert main(["plot", "bandit", str(store), job["job_id"], "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    not_a_store = tmp_path / "x.sqlite"
    not_a_store.write_text("hello")
    assert main(["show", str(not_a_store)]) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_plot_power_limit_from_a_run_log(tmp_path, capsys, virtual_backend, manual_clock):
    config = {
        "logging": {"log_dir": str(tmp_path), "run_name": "pl"},
        "power_limit": {"enabled": True, "warmup_steps": 0, "min_profile_steps": 2, "profile_steps": 3,
                        "step_W": 100.0, "cache": False, "plot": False},
    }  # fmt: skip
    session = EnergySession(config, backend=virtual_backend)
    session.train_start()
    session.epoch_start(0)
    for step in range(200):
        session.step_start(step)
        manual_clock.advance(0.2)
        session.sampler.poll_once()
        session.step_end(step, num_samples=8)
    session.train_end()
    png = tmp_path / "pl.png"
    assert main(["plot", "power-limit", str(tmp_path / "pl.jsonl"), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_show_of_an_unreachable_database_url_masks_the_password(capsys):
    pytest.importorskip("sqlalchemy", reason="the database store needs the postgres extra")
    code = main(["show", "postgresql://user:s3cret@127.0.0.1:1/db"])
    err = capsys.readouterr().err
    assert code == 1 and "s3cret" not in err and "user:***@127.0.0.1:1/db" in err


def test_a_run_with_no_epoch_says_why_it_has_no_energy_per_epoch(tmp_path, capsys, virtual_backend, manual_clock):
    session = EnergySession({"logging": {"log_dir": str(tmp_path), "run_name": "r"}}, backend=virtual_backend)
    session.train_start()
    manual_clock.advance(0.5)
    summary = session.train_end()  # stopped before its first epoch began
    assert summary.epochs == 0 and summary.epoch_energy_J == []
    (line,) = [line for line in str(summary).splitlines() if "energy/epoch" in line]
    assert line.rstrip().endswith("energy/epoch n/a (no epoch ran)")


def test_simulate_refuses_zero_recurrences_rather_than_print_0_J(capsys):
    from zeus_callbacks.simulate import format_recurrences

    with pytest.raises(SystemExit) as stopped:
        main(["simulate", "--recurrences", "0"])
    assert stopped.value.code == 2
    assert "argument --recurrences: must be ≥ 1, got 0" in capsys.readouterr().err
    # The library's simulate() may run none: its table then says the figures are null, not 0 J.
    text = format_recurrences([])
    assert "null" in text and " 0 J" not in text


def test_show_and_plot_bandit_name_an_energy_log_and_point_to_report(tmp_path, capsys, virtual_backend, manual_clock):
    session = EnergySession({"logging": {"log_dir": str(tmp_path), "run_name": "r"}}, backend=virtual_backend)
    session.train_start()
    manual_clock.advance(0.5)
    log = session.train_end().jsonl_path
    said = f"zeus-callbacks: {log} is a zeus-callbacks energy log (JSONL), not a store: read it with " \
           f"`zeus-callbacks report {log}`"  # fmt: skip
    assert main(["show", log]) == 1
    assert capsys.readouterr().err.strip() == said  # no "move it away": nothing is wrong with the file
    assert main(["plot", "bandit", log, "job", "-o", str(tmp_path / "b.png")]) == 1
    assert capsys.readouterr().err.strip() == said
    assert main(["report", log]) == 0


def test_plot_of_a_missing_or_folder_log_is_one_line_naming_it(tmp_path, capsys):
    missing = tmp_path / "missing.jsonl"
    assert main(["plot", "power-limit", str(missing), "-o", str(tmp_path / "p.png")]) == 1
    assert capsys.readouterr().err == f"zeus-callbacks: no such energy log: {missing}\n"
    assert main(["plot", "power-limit", str(tmp_path), "-o", str(tmp_path / "p.png")]) == 1
    assert capsys.readouterr().err == f"zeus-callbacks: {tmp_path} is a folder, not a zeus-callbacks energy log\n"


def test_summary_and_report_name_the_parts_of_the_total(tmp_path, capsys, virtual_backend, manual_clock):
    # Issue 26: mean step x steps and the epochs did not add up to the total, and nothing said why.
    # Here 1.5 s of the run lies outside the epoch (set-up before it, an evaluation after it).
    session = EnergySession({"logging": {"log_dir": str(tmp_path), "run_name": "parts"}}, backend=virtual_backend)
    session.train_start()
    manual_clock.advance(1.0)  # set-up before the first epoch
    session.sampler.poll_once()
    run_epoch(session, manual_clock)
    session.eval_start()
    manual_clock.advance(0.5)
    session.sampler.poll_once()
    session.eval_end()
    summary = session.train_end()
    (epoch_J,) = summary.epoch_energy_J
    outside_J = summary.energy_J - epoch_J
    assert outside_J > 0.2 * summary.energy_J  # 1.5 of 3.5 s, at the trace's power
    (line,) = [line for line in str(summary).splitlines() if line.startswith("  parts")]
    assert f"1 epoch(s) {epoch_J:,.3f} J ({100 * epoch_J / summary.energy_J:.1f} %)" in line
    assert f"outside every epoch {outside_J:,.3f} J ({100 * outside_J / summary.energy_J:.1f} %" in line
    assert "about" not in line and "ledger" in line  # no mean-step estimate (it mixed in warm-up steps)
    assert main(["report", str(tmp_path / "parts.jsonl")]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the report wraps its lines
    assert f"parts: 1 epoch(s) {epoch_J:,.3f} J" in out and f"outside every epoch {outside_J:,.3f} J" in out


@pytest.mark.parametrize(
    ("energy_J", "epochs_J", "why"),
    [
        (10.0, [6.0, 5.0], "the epochs hold more than the total: no negative rest"),
        (10.0, [6.0, float("nan")], "an epoch unknown"),
        (float("nan"), [6.0], "the total unknown"),
        (10.0, [], "no epoch ran"),
    ],
)
def test_the_parts_line_is_left_out_rather_than_wrong(energy_J, epochs_J, why):
    from zeus_callbacks.reporting import energy_parts

    assert energy_parts(energy_J, epochs_J) is None, why


def test_show_gives_a_withdrawn_trial_no_converged_verdict(tmp_path, capsys):
    # Outside tester: a withdrawn trial (a suggestion no run claimed) was shown `converged: false`, a verdict
    # of a run that never was; completed trials keep theirs.
    from zeus_callbacks.store import open_store

    path = tmp_path / "store.sqlite"
    with open_store(path) as store:
        store.ensure_job("j")
        ran = store.create_trial("j", 32)
        store.finish_trial(ran.trial_id, status="completed", energy_J=10.0, time_s=2.0, cost=5.0, converged=False)
        unclaimed = store.create_trial("j", 64)
        store.finish_trial(
            unclaimed.trial_id, status="withdrawn", energy_J=None, time_s=None, cost=None, converged=False
        )
        running = store.create_trial("j", 16)  # a run still training: no verdict yet either
    assert main(["show", str(path), "j", "--json"]) == 0
    trials = {t["trial_id"]: t for t in json.loads(capsys.readouterr().out)["jobs"][0]["trials"]}
    assert trials[unclaimed.trial_id]["converged"] is None
    assert trials[running.trial_id]["converged"] is None
    assert trials[ran.trial_id]["converged"] is False
    assert main(["show", str(path), "j"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    (row,) = [r for r in rows if r[:1] == [str(unclaimed.trial_id)] and "withdrawn" in r]
    assert row == [str(unclaimed.trial_id), "64", "-", "withdrawn", "-", "-", "-", "-"]


def _first_arm(doc: dict, job: str) -> dict:
    return next(iter(doc["bandits"][job]["arms"].values()))


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda doc, job: doc["trials"][0].update(energy_J=-5), r"trial \d+ \(trials\[0\]\) field energy_J"),
        (lambda doc, job: next(iter(doc["bandits"][job]["arms"].values())).update(mean_cost="abc"), "field mean_cost"),
        (
            lambda doc, job: next(iter(doc["bandits"][job]["arms"].values())).update(observations=-1),
            "field observations",
        ),
    ],
    ids=["negative-energy", "cost-in-words", "negative-count"],
)
def test_show_refuses_an_impossible_value_in_a_json_store_and_leaves_it_untouched(tmp_path, capsys, edit, named):
    # Outside tester: `show` printed energy -5.0 and arms with a negative count or a cost "abc" as fine.
    store = tmp_path / "store.json"
    args = ["simulate", "--gpu", "A40", "--workload", "cifar100", "--recurrences", "3", "--store", str(store)]
    assert main(args) == 0
    doc = json.loads(store.read_text())
    (job,) = doc["bandits"]
    edit(doc, job)
    store.write_text(json.dumps(doc))
    before = store.read_bytes()
    capsys.readouterr()
    assert main(["show", str(store), job]) == 1
    err = capsys.readouterr().err
    assert re.search(named, err) and str(store) in err and "left untouched" in err and "Traceback" not in err
    assert store.read_bytes() == before


@pytest.mark.parametrize("suffix", ["json", "sqlite"])
def test_show_says_a_running_trials_process_is_gone_and_writes_nothing(tmp_path, capsys, suffix):
    # Outside tester: after a SIGKILL `show` listed the trial as running with no hint (the next run marks it failed).
    import multiprocessing

    from zeus_callbacks.store import open_store

    proc = multiprocessing.get_context("fork").Process(target=os.getpid)
    proc.start()
    proc.join()
    store = tmp_path / f"store.{suffix}"
    with open_store(store) as s:
        killed = s.create_trial("nightly", 32, pid=proc.pid)
        alive = s.create_trial("nightly", 64)  # this process's: alive
    before = store.read_bytes()
    assert main(["show", str(store), "nightly"]) == 0
    out = capsys.readouterr().out
    assert f"trial {killed.trial_id}: running (process {proc.pid} on this host is gone" in out
    assert f"trial {alive.trial_id}:" not in out
    assert main(["show", str(store), "nightly", "--json"]) == 0
    notes = {t["trial_id"]: t["note"] for t in json.loads(capsys.readouterr().out)["jobs"][0]["trials"]}
    assert str(proc.pid) in notes[killed.trial_id] and notes[alive.trial_id] is None
    assert store.read_bytes() == before  # show only says so: the trial is still running in the store
    assert not (tmp_path / f"store.{suffix}-wal").exists()
