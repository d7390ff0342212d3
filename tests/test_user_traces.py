"""User traces: a power-limit sweep of any GPU in the Zeus summary_power format drives the virtual GPU."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from zeus_callbacks.backends import get_backend, traces
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import IDLE_FRACTION_OF_MAX_LIMIT, IDLE_POWER_W, VirtualGPUBackend
from zeus_callbacks.config import ConfigError, parse_config
from zeus_callbacks.session import EnergySession
from zeus_callbacks.simulate import simulate

HEADER = ["gpu", "dataset", "network", "batch_size", "optimizer", "power_limit", "time_per_epoch", "average_power"]
# An RTX 6000-like card (100-260 W) training one model at two batch sizes.
LIMITS_W = [100, 140, 180, 220, 260]
TIME_S = {64: [30.0, 24.0, 21.0, 20.0, 19.8], 128: [26.0, 20.5, 18.0, 17.2, 17.0]}
POWER_W = {64: [98.0, 135.0, 168.0, 190.0, 196.0], 128: [99.0, 138.0, 175.0, 205.0, 214.0]}


def write_trace(path: Path, *, gpu: str | None = "RTX 6000", idle_W: float | None = None) -> Path:
    header = HEADER + (["idle_power"] if idle_W is not None else [])
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for bs in TIME_S:
            for limit, t, p in zip(LIMITS_W, TIME_S[bs], POWER_W[bs], strict=True):
                row = [gpu or "", "mydata", "mynet", bs, "sgd", limit, t, p]
                writer.writerow(row + ([idle_W] if idle_W is not None else []))
    return path


def write_train(path: Path) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(traces.TRAIN_COLUMNS)
        for bs, epochs in ((64, (3, 4, "nan")), (128, (4, 5, 6))):
            for run, epoch in enumerate(epochs):
                writer.writerow(["mydata", "mynet", bs, "sgd", 0.1, run, 0.5, 1])  # an easier target
                writer.writerow(["mydata", "mynet", bs, "sgd", 0.1, run, 0.9, epoch])
    return path


# -- names ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "name"), [("v100", "V100"), (" a40 ", "A40"), ("RTX 6000", "RTX 6000"), ("rtx   6000", "rtx 6000")]
)
def test_normalize_gpu_accepts_any_model(raw, name):
    assert traces.normalize_gpu(raw) == name


def test_an_empty_gpu_name_and_an_unbundled_gpu_without_trace_are_refused():
    with pytest.raises(ValueError, match="empty"):
        traces.normalize_gpu("  ")
    with pytest.raises(ValueError, match=r"V100, A40.*virtual\.trace"):
        VirtualGPUBackend(gpu="RTX 6000")


# -- reading ----------------------------------------------------------------------
def test_a_user_trace_drives_the_virtual_gpu(tmp_path):
    path = write_trace(tmp_path / "summary_power_rtx6000.csv")
    clock = ManualClock(0.0)
    backend = VirtualGPUBackend(trace=path, clock=clock, noise_W=0.0, read_only=False, batch_size=64)
    assert backend.gpu == "RTX 6000"
    assert backend.device_name(0) == "Virtual RTX 6000 (summary_power_rtx6000.csv mydata/mynet bs 64)"
    assert backend.power_limit_constraints_W(0) == (100.0, 260.0)
    assert backend.average_power_W(180.0) == POWER_W[64][2]
    assert backend.epoch_time_s(120.0) == pytest.approx(np.mean(TIME_S[64][:2]))
    backend.set_power_limit_W(0, 140.0)
    clock.advance(1.0)
    samples = backend.power_samples_since(0, -math.inf)
    assert np.mean([s.power_W for s in samples]) == pytest.approx(POWER_W[64][1])
    # No idle power anywhere: a fraction of the maximum limit, below the lowest busy power.
    assert backend.idle_power_W == pytest.approx(min(IDLE_FRACTION_OF_MAX_LIMIT * 260.0, min(POWER_W[64])))
    # The default batch size of a user workload is its largest.
    assert VirtualGPUBackend(trace=path).batch_size == 128


def test_idle_power_comes_from_the_config_then_the_file(tmp_path):
    path = write_trace(tmp_path / "card.csv", idle_W=22.5)
    assert VirtualGPUBackend(trace=path).idle_power_W == 22.5
    assert VirtualGPUBackend(trace=path, idle_power_W=30.0).idle_power_W == 30.0
    # A bundled GPU's figure applies to a user trace of that model.
    assert VirtualGPUBackend(trace=write_trace(tmp_path / "v.csv", gpu="v100")).idle_power_W == IDLE_POWER_W["V100"]


def test_the_gpu_name_comes_from_the_argument_the_column_or_the_file_name(tmp_path):
    assert traces.read_trace(write_trace(tmp_path / "a.csv"), gpu="L40S").gpu == "L40S"
    assert traces.read_trace(write_trace(tmp_path / "b.csv")).gpu == "RTX 6000"
    assert traces.read_trace(write_trace(tmp_path / "summary_power_t4.csv", gpu=None)).gpu == "t4"


def test_a_bundled_file_read_as_a_user_trace_gives_the_same_curves():
    path = Path(traces.__file__).resolve().parents[1] / "data" / "zeus_nsdi23" / "summary_power_v100.csv"
    user = traces.read_trace(path)
    assert user.gpu == "V100" and not user.bundled
    bundled = traces.load_power_trace("V100")
    assert set(user.curves) == set(bundled)
    for key, curve in bundled.items():
        assert np.array_equal(user.curves[key].average_power_W, curve.average_power_W)
    # cifar100 has two sweeps (adadelta, adam): the paper's name picks the paper's one; others need the full name.
    assert traces.get_workload("cifar100", user) == traces.WORKLOADS["cifar100"]
    assert "cifar100/shufflenetv2/adam" in traces.available_workloads(user)
    assert traces.get_workload("cifar100/shufflenetv2/adam", user).optimizer == "adam"


def test_an_ambiguous_user_workload_lists_the_full_names(tmp_path):
    path = tmp_path / "two.csv"
    write_trace(path)
    with path.open("a", newline="") as f:
        csv.writer(f).writerow(["RTX 6000", "mydata", "othernet", 64, "sgd", 100, 10.0, 90.0])
    trace = traces.read_trace(path)
    with pytest.raises(ValueError, match="ambiguous.*mydata/mynet/sgd, mydata/othernet/sgd"):
        traces.get_workload("mydata", trace)
    with pytest.raises(ValueError, match="'nope' is not in the trace"):
        traces.get_workload("nope", trace)


@pytest.mark.parametrize(
    ("edit", "pattern"),
    [
        (lambda rows: [[c for c in r if c != "average_power"] for r in rows[:1]] + rows[1:],
         r"no column 'average_power'"),
        (lambda rows: rows[:2] + [rows[2][:6] + ["fast"] + rows[2][7:]] + rows[3:],
         r"line 3: column 'time_per_epoch': 'fast' is not a number"),
        (lambda rows: rows[:2] + [rows[2][:7] + ["-5"]] + rows[3:],
         r"line 3: column 'average_power': '-5' must be a finite number > 0"),
        (lambda rows: rows + [rows[1]], r"column 'power_limit': 100 W appears twice for mydata/mynet/64/sgd"),
        (lambda rows: rows + [["A100"] + rows[1][1:5] + ["999"] + rows[1][6:]], r"column 'gpu' names several GPUs"),
        (lambda rows: rows[:2] + [rows[2][:3] + ["6.5"] + rows[2][4:]] + rows[3:],
         r"line 3: column 'batch_size': '6.5' is not a whole number"),
        (lambda rows: rows[:1], "has no rows"),
    ],
)  # fmt: skip
def test_a_bad_trace_names_the_file_and_the_column(tmp_path, edit, pattern):
    good = write_trace(tmp_path / "good.csv")
    rows = list(csv.reader(good.open()))
    bad = tmp_path / "bad.csv"
    with bad.open("w", newline="") as f:
        csv.writer(f).writerows(edit(rows))
    with pytest.raises(traces.TraceFormatError, match=pattern) as info:
        traces.read_trace(bad)
    assert str(bad) in str(info.value)


def test_a_missing_file_and_a_bad_training_path_file_are_named(tmp_path):
    with pytest.raises(traces.TraceFormatError, match=r"not found: .*nowhere\.csv"):
        traces.read_trace(tmp_path / "nowhere.csv")
    train = tmp_path / "train.csv"
    train.write_text("dataset,network,batch_size,optimizer,learning_rate,run,target_metric,target_epoch\n"
                     "mydata,mynet,64,sgd,0.1,0,0.9,three\n")  # fmt: skip
    with pytest.raises(traces.TraceFormatError, match=r"train\.csv, line 2: column 'target_epoch'"):
        traces.read_trace(write_trace(tmp_path / "t.csv"), train_path=train)


# -- configuration ------------------------------------------------------------------
def test_config_virtual_trace_builds_the_backend(tmp_path):
    path = write_trace(tmp_path / "card.csv", idle_W=20.0)
    cfg = parse_config({"backend": "virtual", "virtual": {"trace": str(path), "gpu": "RTX  6000", "batch_size": 64}})
    assert cfg.virtual.gpu == "RTX 6000"
    backend = get_backend("virtual", virtual=lambda: virtual_kwargs(cfg))
    assert backend.device_name(0).startswith("Virtual RTX 6000 (card.csv mydata/mynet bs 64")
    assert backend.idle_power_W == 20.0
    cfg = parse_config({"virtual": {"trace": str(path), "idle_power_W": 25.0}})
    backend = get_backend("virtual", virtual=lambda: virtual_kwargs(cfg))
    assert (backend.gpu, backend.workload.dataset, backend.idle_power_W) == ("RTX 6000", "mydata", 25.0)


def test_config_refuses_an_unbundled_gpu_without_trace_and_names_a_bad_file(tmp_path):
    with pytest.raises(ConfigError, match=r"virtual\.gpu: .*V100, A40.*virtual\.trace"):
        parse_config({"virtual": {"gpu": "RTX 6000"}})
    bad = tmp_path / "bad.csv"
    bad.write_text("power_limit,time_per_epoch\n100,1\n")
    cfg = parse_config({"virtual": {"trace": str(bad)}})
    with pytest.raises(traces.TraceFormatError, match=r"bad\.csv: no column 'dataset', 'network'"):
        get_backend("virtual", virtual=lambda: virtual_kwargs(cfg))


def test_a_session_runs_end_to_end_on_a_user_trace(tmp_path):
    path = write_trace(tmp_path / "card.csv")
    clock = ManualClock(0.0)
    cfg = parse_config({"backend": "virtual", "virtual": {"trace": str(path), "noise_W": 0.0, "batch_size": 64},
                        "logging": {"log_dir": str(tmp_path / "logs"), "jsonl": False}})  # fmt: skip
    backend = VirtualGPUBackend(**virtual_kwargs(cfg), clock=clock)
    session = EnergySession(cfg, backend=backend, is_main_process=True)
    session.train_start()
    for step in range(20):
        session.step_start(step)
        clock.advance(0.5)
        session.sampler.poll_once(read_counter=False)
        session.step_end(step, num_samples=64)
    summary = session.train_end()
    assert summary.energy_J == pytest.approx(POWER_W[64][-1] * 10.0, rel=0.02)


# -- simulator ------------------------------------------------------------------------
def test_simulate_replays_a_user_trace_with_its_training_paths(tmp_path):
    trace = traces.read_trace(write_trace(tmp_path / "card.csv"), train_path=write_train(tmp_path / "train.csv"))
    workload = traces.get_workload("mydata", trace)
    assert (workload.target_metric, workload.max_epochs, workload.default_batch_size) == (0.9, 6, 128)
    runs = simulate(trace, "mydata", 4, seed=0, power_limit="jit")
    assert len(runs) == 4 and {r.batch_size for r in runs} <= {64, 128}
    assert all(r.energy_J > 0 for r in runs)
    assert all(LIMITS_W[0] <= r.power_limit_W <= LIMITS_W[-1] for r in runs)


def test_simulate_needs_training_paths_for_a_user_trace(tmp_path):
    trace = traces.read_trace(write_trace(tmp_path / "card.csv"))
    with pytest.raises(ValueError, match="no training paths for mydata"):
        simulate(trace, "mydata", 1)


def _write_paths(path: Path, rows: list[tuple[int, float, object]]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(traces.TRAIN_COLUMNS)
        for run, (bs, target, epoch) in enumerate(rows):
            writer.writerow(["mydata", "mynet", bs, "sgd", 0.1, run, target, epoch])
    return path


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        # No run reaches the target: the epoch budget would be made up.
        ([(64, 0.9, "nan"), (128, 0.9, "")], "reaches its target 0.9"),
        # Paths only at batch size 128: batch size 64 would never converge, whatever the trace says.
        ([(128, 0.9, 4), (128, 0.9, 5)], "for batch size(s) 64"),
    ],
)
def test_simulate_refuses_training_paths_that_cannot_drive_every_arm(tmp_path, rows, message):
    trace = traces.read_trace(write_trace(tmp_path / "card.csv"), train_path=_write_paths(tmp_path / "t.csv", rows))
    with pytest.raises(ValueError, match=re.escape(message)):
        simulate(trace, "mydata", 1)
    # Given only the arms that have paths, the same trace runs.
    if message.startswith("for batch"):
        assert simulate(trace, "mydata", 1, batch_sizes=[128])[0].batch_size == 128


# -- command line -------------------------------------------------------------------------
def test_the_simulate_command_replays_a_user_trace(tmp_path, capsys):
    from zeus_callbacks.cli import main

    trace, train = write_trace(tmp_path / "card.csv"), write_train(tmp_path / "train.csv")
    args = ["simulate", "--trace", str(trace), "--train-trace", str(train), "--recurrences", "2", "--json"]
    assert main(args) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert len(lines) == 2 and all(r["batch_size"] in TIME_S for r in lines)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "RTX 6000"], "V100, A40"),
        (["--train-trace", "x.csv"], "--train-trace needs --trace"),
        (["--trace", "missing.csv"], "not found: missing.csv"),
        (["--trace", "{trace}"], "card.csv has no training paths for mydata"),  # was a traceback
        (["--trace", "{trace}", "--train-trace", "{never}"], "reaches its target 0.9"),
    ],
)
def test_the_simulate_command_names_a_bad_gpu_or_file(args, message, capsys, tmp_path):
    from zeus_callbacks.cli import main

    files = {"trace": write_trace(tmp_path / "card.csv"), "never": _write_paths(tmp_path / "t.csv", [(64, 0.9, "")])}
    args = [a.format(**files) for a in args]
    with pytest.raises(SystemExit) as info:
        main(["simulate", *args, "--recurrences", "1"])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def virtual_kwargs(cfg):
    """The virtual GPU's keyword arguments for a parsed configuration (the trace read here, not in the config)."""
    from zeus_callbacks.backends.virtual import virtual_backend_kwargs

    return virtual_backend_kwargs(cfg.virtual)
