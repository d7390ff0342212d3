"""Every energy figure is right or says it is not (issue 16 items 1-3), one test per "Why" case.

The cases run a real EnergySession on a manual clock over the real NVML / amdsmi backends driven
by the fake vendor libraries (tests/fakes, modelled on the H200 probes: samples every 20 ms, the
energy counter changing every 100 ms in mJ), or over the virtual GPU, and read the real JSONL log
back. The clock starts on the fakes' 100 ms grid (as tests/faults/test_fault_sensors.py).
"""

from __future__ import annotations

import logging
import math
import re
import sys

import pytest

from tests.fakes import fake_amdsmi as fa
from tests.fakes import fake_pynvml as fp
from zeus_callbacks import reporting as metric
from zeus_callbacks.backends import GPUPresence, detect_gpus, get_backend
from zeus_callbacks.backends._amdsmi import AMDSMIBackend
from zeus_callbacks.backends._nvml import NVMLBackend
from zeus_callbacks.backends._unavailable import UnavailableBackend
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.measurement._attribution import COUNTER_MIN_PERIODS
from zeus_callbacks.reporting import read_jsonl
from zeus_callbacks.session import EnergySession

T0 = 1_800_000_000.0  # realtime seconds, on the fakes' 100 ms sensor grid
STEP_S = 0.1
LOAD_W = 300.0
NVML_COUNTER_PERIOD_S = NVMLBackend.energy_counter_period_s  # 0.1 s, measured on the H200
WARN = logging.WARNING


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)


def _session(tmp_path, backend, name="run", **config):
    cfg = {
        "backend": backend.name if backend.name in ("nvml", "amdsmi", "virtual") else "auto",
        "windows": {"sample_fraction": 1.0},
        "logging": {"log_dir": str(tmp_path), "run_name": name, "interval_steps": 5},
        **config,
    }
    return EnergySession(cfg, backend=backend, is_main_process=True)


def _train(session, clock, steps, *, epoch_steps=None, at_step=None):
    """Run ``steps`` steps of STEP_S manual seconds, draining the sensor each step like the sampler
    thread; ``at_step(step)`` runs before step ``step``. Epochs of ``epoch_steps`` steps (default: one)."""
    epoch_steps = epoch_steps or steps
    session.train_start()
    metrics = []
    try:
        for step in range(steps):
            if step % epoch_steps == 0:
                session.epoch_start(step // epoch_steps)
            if at_step is not None:
                at_step(step)
            session.step_start(step)
            clock.advance(STEP_S)
            session.sampler.poll_once()
            session.step_end(step, num_samples=8)
            metrics.append(session.pop_metrics())
            if (step + 1) % epoch_steps == 0:
                session.epoch_end(step // epoch_steps)
                metrics.append(session.pop_metrics())
    finally:
        summary = session.train_end()
    return summary, read_jsonl(summary.jsonl_path), metrics


def _nvml(clock, num_gpus=1):
    fake = fp.FakePyNVML(num_gpus=num_gpus, time_fn=clock.now_s)
    return fake, NVMLBackend(nvml_module=fake, clock=clock, read_only=True)


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == WARN and r.name.startswith("zeus_callbacks")]


# ---------------------------------------------------------------- item 1: honest backend choice
def test_detect_gpus_reads_device_nodes_and_cuda(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidiactl").touch()  # a control node alone is no GPU
    (dev / "nvidia-uvm").touch()
    assert not detect_gpus(dev, cuda_count=lambda: 0).any_gpu
    assert detect_gpus(dev, cuda_count=lambda: 2).count == 2
    (dev / "nvidia0").touch()
    (dev / "nvidia1").touch()
    found = detect_gpus(dev, cuda_count=lambda: 0)
    assert found.nvidia_nodes == ("nvidia0", "nvidia1") and found.count == 2
    (dev / "nvidia0").unlink()
    (dev / "nvidia1").unlink()
    (dev / "kfd").touch()
    assert detect_gpus(dev, cuda_count=lambda: 0).amd_kfd


def _break_nvml(fake, how):
    if how == "nvmlInit fails":
        fake.fail_always("nvmlInit", fp.NVML_ERROR_DRIVER_NOT_LOADED)
    elif how == "permission denied":
        fake.fail_always("nvmlInit", fp.NVML_ERROR_NO_PERMISSION)
    elif how == "count fails":
        fake.fail_always("nvmlDeviceGetCount", fp.NVML_ERROR_UNKNOWN)
    elif how == "name fails":
        fake.fail_always("nvmlDeviceGetName", fp.NVML_ERROR_UNKNOWN)
    elif how == "MIG":
        fake.set_mig(0, True)


CAUSE_AND_FIX = {  # what the one warning must name: the cause, and the fix for it
    "nvmlInit fails": ("nvmlInit failed", "driver"),
    "permission denied": ("nvmlInit failed", "access"),
    "count fails": ("cannot enumerate", "driver"),
    "name fails": ("cannot read the name", "driver"),
    "MIG": ("MIG mode", "MIG disabled"),
    "CUDA_VISIBLE_DEVICES names a MIG instance": ("MIG-", "MIG disabled"),
}


@pytest.fixture
def broken_machine(monkeypatch):
    """A machine with one NVIDIA GPU whose NVML fails as asked; amdsmi absent."""

    def make(how):
        clock = ManualClock(T0)
        fake = fp.FakePyNVML(num_gpus=1, time_fn=clock.now_s)
        _break_nvml(fake, how)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        monkeypatch.setitem(sys.modules, "amdsmi", None)  # import amdsmi raises ImportError
        return GPUPresence(nvidia_nodes=("nvidia0",), cuda_devices=1)

    return make


@pytest.mark.parametrize("how", list(CAUSE_AND_FIX))
def test_auto_on_a_gpu_nvml_cannot_measure_is_unavailable_not_simulated(broken_machine, caplog, monkeypatch, how):
    presence = broken_machine(how)
    if how.startswith("CUDA_VISIBLE_DEVICES"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-4f1c2d3e-0000-5555-aaaa-123456789abc")
    caplog.set_level(WARN, logger="zeus_callbacks")
    backend = get_backend("auto", detect=lambda: presence)
    assert isinstance(backend, UnavailableBackend) and not backend.measurable and not backend.simulated
    (warning,) = _warnings(caplog)
    cause, fix = CAUSE_AND_FIX[how]
    assert "cannot be measured" in warning and cause in warning and fix in warning, warning
    assert "virtual" not in warning.split("Fix:")[0]


def test_auto_without_any_gpu_is_the_virtual_gpu_and_says_so(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    caplog.set_level(WARN, logger="zeus_callbacks")
    backend = get_backend("auto", detect=lambda: GPUPresence())
    assert isinstance(backend, VirtualGPUBackend) and backend.simulated
    (warning,) = _warnings(caplog)
    assert "no GPU on this machine" in warning and "SIMULATED" in warning


def test_no_page_says_auto_gives_the_virtual_gpu_to_a_gpu_it_cannot_measure():
    # Issue 26: docs/getting-started.md said auto falls back to the virtual GPU where a GPU exists but cannot be
    # measured (MIG); get_backend gives such a GPU an UnavailableBackend (the test above), never simulated figures.
    from tests.test_docs_plain import pages, sentences

    wrong = [
        f"{page.name}: {sentence.text}"
        for page in pages()
        for sentence in sentences(page.read_text(encoding="utf-8"))
        if re.search(r"falls? back to the virtual GPU", sentence.text)
        and re.search(r"cannot be measured|MIG|usable", sentence.text)
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("machine", ["no GPU", "a GPU NVML cannot measure"])
@pytest.mark.parametrize(("rank", "local_rank", "warns"), [(0, 0, True), (1, 1, False), (2, 0, True)])
def test_the_fallback_is_announced_once_a_machine_not_by_every_rank(
    broken_machine, caplog, monkeypatch, machine, rank, local_rank, warns
):
    # Issue 26: under torchrun every rank opened backend: auto and printed the same warning. This process
    # mirrors rank `rank` of a 4-process, 2-node job (the session reads RANK and LOCAL_RANK, as under torchrun):
    # rank 0 and the other node's local rank 0 say it; rank 1 logs it at INFO only.
    import zeus_callbacks.backends as backends

    if machine == "no GPU":
        monkeypatch.setitem(sys.modules, "pynvml", None)
        monkeypatch.setitem(sys.modules, "amdsmi", None)
        presence = GPUPresence()
    else:
        presence = broken_machine("nvmlInit fails")
    monkeypatch.setattr(backends, "detect_gpus", lambda: presence)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    caplog.set_level(logging.INFO, logger="zeus_callbacks")
    backend = EnergySession({"backend": "auto"}).open_backend()
    try:
        said = [r.getMessage() for r in caplog.records if "no GPU on this machine" in r.getMessage()
                or "cannot be measured" in r.getMessage()]  # fmt: skip
        assert len(said) == 1  # the message is there on every rank (at INFO on the quiet ones)
        assert len(_warnings(caplog)) == (1 if warns else 0)
    finally:
        backend.close()


def test_unmeasurable_gpu_run_trains_on_with_every_energy_figure_null(tmp_path, broken_machine, caplog, monkeypatch):
    presence = broken_machine("nvmlInit fails")
    import zeus_callbacks.backends as backends

    monkeypatch.setattr(backends, "detect_gpus", lambda: presence)  # the session opens backend: auto itself
    caplog.set_level(WARN, logger="zeus_callbacks")
    session = EnergySession(
        {
            "backend": "auto",
            "windows": {"sample_fraction": 1.0},
            "logging": {"log_dir": str(tmp_path), "run_name": "run", "interval_steps": 5},
        },
        is_main_process=True,
    )
    clock_for_steps = ManualClock(T0)  # the unavailable backend's own clock is the wall clock; steps take none
    summary, records, metrics = _train(session, clock_for_steps, 20, epoch_steps=10)
    assert summary.status == "completed" and summary.steps == 20  # training continued
    assert len(_warnings(caplog)) == 1  # one warning, however many steps
    assert summary.measurement == "unavailable" and not summary.simulated
    assert math.isnan(summary.energy_J) and summary.counter_energy_J is None and math.isnan(summary.step_energy_J)
    assert summary.coverage == 0.0 and summary.complete is False
    assert all(math.isnan(e) for e in summary.epoch_energy_J) and len(summary.epoch_energy_J) == 2
    assert "MEASUREMENT UNAVAILABLE" in str(summary) and "nvmlInit failed" in str(summary)
    start, end = records[0], records[-1]
    assert start["measurement"] == "unavailable" and "Fix:" in start["measurement_note"]
    assert end["event"] == "run_end" and end["energy_J"] is None and end["measurement"] == "unavailable"
    for record in records:
        for key in ("energy_J", "energy_J_mean", "counter_energy_J", "energy_J_per_sample"):
            assert record.get(key) is None, (record["event"], key, record.get(key))
    logged = {k for m in metrics for k in m}
    assert metric.UNAVAILABLE in logged
    assert not [k for k in logged if k.startswith(("energy/", "power/")) and k != metric.UNAVAILABLE]
    assert metric.TOTAL_ENERGY_J not in session.totals() and session.progress_bar_metrics() == {}


def test_virtual_gpu_says_simulated_everywhere(tmp_path):
    clock = ManualClock(1000.0)
    backend = VirtualGPUBackend(clock=clock, noise_W=0.0)
    summary, records, metrics = _train(_session(tmp_path, backend), clock, 10)
    assert records[0]["simulated"] is True and records[0]["measurement"] == "simulated"
    assert records[-1]["simulated"] is True and records[-1]["measurement"] == "simulated"
    assert summary.simulated and "SIMULATED" in str(summary).splitlines()[0]
    batches = [m for m in metrics if m]
    assert batches and all(m[metric.SIMULATED] == 1.0 for m in batches)
    assert _session(tmp_path, backend, name="x").totals() == {}  # nothing before a run starts
    # Every record says so, not only run_start and run_end: a steps or epoch line read alone too.
    assert {"steps", "warmup", "epoch"} <= {r["event"] for r in records}
    assert all(r["simulated"] is True for r in records), [r["event"] for r in records if r.get("simulated") is not True]


def test_virtual_gpu_flags_the_epoch_and_evaluation_figures_returned_directly(tmp_path):
    """epoch_end() and eval_end(report=True) hand figures to adapters directly: flagged like pop_metrics."""
    clock = ManualClock(1000.0)
    session = _session(tmp_path, VirtualGPUBackend(clock=clock, noise_W=0.0))
    session.train_start()
    session.epoch_start(0)
    for step in range(3):
        session.step_start(step)
        clock.advance(STEP_S)
        session.sampler.poll_once()
        session.step_end(step)
    session.eval_start()
    clock.advance(STEP_S)
    session.sampler.poll_once()
    evaluation = session.eval_end(report=True)
    session.evaluate({"loss": 1.0})
    clock.advance(STEP_S)
    session.sampler.poll_once()
    epoch = session.epoch_end(0)
    summary = session.train_end()
    assert evaluation[metric.EVAL_ENERGY_J] > 0 and evaluation[metric.SIMULATED] == 1.0
    assert epoch[metric.EPOCH_ENERGY_J] > 0 and epoch[metric.SIMULATED] == 1.0
    records = read_jsonl(summary.jsonl_path)
    assert {"eval", "evaluate", "epoch", "steps"} <= {r["event"] for r in records}
    assert all(r["simulated"] is True for r in records)


@pytest.mark.parametrize("flag", [metric.SIMULATED, metric.UNAVAILABLE])
def test_the_loggers_get_each_flag_once_per_step(tmp_path, flag):
    """An evaluation's log after a report at one step: one flag point there, not two."""
    if flag == metric.SIMULATED:
        backend = VirtualGPUBackend(clock=ManualClock(1000.0), noise_W=0.0)
    else:
        backend = UnavailableBackend(GPUPresence(nvidia_nodes=("nvidia0",)), "nvmlInit failed", "load the driver")
    session = _session(tmp_path, backend)
    report = session.flagged({metric.STEP_TIME_S: 0.1})
    evaluation = session.flagged({metric.EVAL_TIME_S: 1.0})
    assert report[flag] == evaluation[flag] == 1.0
    assert session.once_per_step(report, 4) == report
    assert session.once_per_step(evaluation, 4) == {metric.EVAL_TIME_S: 1.0}
    assert session.once_per_step(report, 8) == report  # a new step: flagged again
    assert session.once_per_step({flag: 1.0}, 8) == {}  # nothing left to log
    assert session.once_per_step({metric.STEP_TIME_S: 0.1}, 8) == {metric.STEP_TIME_S: 0.1}


def test_a_measured_gpu_writes_every_record_as_not_simulated(tmp_path):
    clock = ManualClock(T0)
    fake, backend = _nvml(clock)
    fake.set_load(LOAD_W)
    summary, records, metrics = _train(_session(tmp_path, backend), clock, 10)
    backend.close()
    assert not summary.simulated and summary.measurement == "measured"
    assert all(r["simulated"] is False for r in records)
    assert not [m for m in metrics if metric.SIMULATED in m]


@pytest.mark.parametrize("simulated", [True, False], ids=["virtual", "nvml"])
def test_the_progress_bar_names_simulated_energy_as_simulated(tmp_path, simulated):
    # An outside tester (issue 26): the bar showed energy_kJ on the virtual GPU, unmarked.
    clock = ManualClock(T0)
    if simulated:
        backend = VirtualGPUBackend(clock=clock, noise_W=0.0)
    else:
        fake, backend = _nvml(clock)
        fake.set_load(LOAD_W)
    session = _session(tmp_path, backend)
    session.train_start()
    for step in range(3):
        session.step_start(step)
        clock.advance(STEP_S)
        session.sampler.poll_once()
        session.step_end(step)
    bar = session.progress_bar_metrics()
    total_J = session.totals()[metric.TOTAL_ENERGY_J]
    session.train_end()
    backend.close()
    shown = metric.PROGRESS_BAR_SIMULATED_ENERGY if simulated else metric.PROGRESS_BAR_ENERGY
    assert bar == {shown: pytest.approx(total_J / 1e3, abs=5e-4)}  # the run so far in kJ, rounded to 1 J
    assert metric.is_own_metric(shown)
    assert metric.is_own_metric("simulated_energy_kJ")  # the bar's longer name before: still ours, never a target


# ---------------------------------------------------------------- item 2: faults never invent energy
def test_gpu_lost_mid_run_reports_only_the_covered_half_and_flags_it(tmp_path):
    """100 steps at 300 W losing the GPU at step 50: not the whole 3,000 J, and run_end says incomplete."""
    clock = ManualClock(T0)
    fake, backend = _nvml(clock)
    fake.set_load(LOAD_W)
    lost_at = 50

    def lose(step):
        if step == lost_at:
            for func in (
                "nvmlDeviceGetSamples",
                "nvmlDeviceGetTotalEnergyConsumption",
                "nvmlDeviceGetPowerManagementLimit",
                "nvmlDeviceGetPowerUsage",
            ):
                fake.fail_always(func, fp.NVML_ERROR_GPU_IS_LOST)

    summary, records, _ = _train(_session(tmp_path, backend), clock, 100, at_step=lose)
    backend.close()
    covered_J = LOAD_W * lost_at * STEP_S  # 1,500 J truly measured
    reach_J = LOAD_W * backend.sample_period_s  # at most one sample period is extrapolated
    assert covered_J * 0.99 <= summary.energy_J <= covered_J + reach_J
    assert not summary.complete and summary.coverage == pytest.approx(lost_at / 100, abs=0.01)
    end = records[-1]
    assert end["complete"] is False and end["coverage"] == pytest.approx(0.5, abs=0.01) and end["degraded"] is True
    (epoch,) = [r for r in records if r["event"] == "epoch"]
    assert epoch["complete"] is False and epoch["covered_s"] == pytest.approx(lost_at * STEP_S, abs=0.03)
    assert "INCOMPLETE" in str(summary)


def test_counter_stands_in_for_a_missing_power_stream(tmp_path):
    """A device with a counter and no power stream: not 0 J, the counter's differences, resolution stated."""
    clock = ManualClock(T0)
    fake, backend = _nvml(clock)
    for func in ("nvmlDeviceGetSamples", "nvmlDeviceGetFieldValues", "nvmlDeviceGetPowerUsage"):
        fake.make_unsupported(func)
    fake.set_load(LOAD_W)
    steps = 50
    summary, records, _ = _train(_session(tmp_path, backend), clock, steps)
    backend.close()
    truth_J = LOAD_W * steps * STEP_S
    # Counter stamps are off by at most half a counter period at each end (docs/concepts.md).
    assert summary.energy_J == pytest.approx(truth_J, abs=LOAD_W * NVML_COUNTER_PERIOD_S)
    assert summary.energy_source == "samples+counter" and summary.counter_resolution_J == 1e-3
    assert records[-1]["counter_resolution_J"] == 1e-3 and records[-1]["energy_source"] == "samples+counter"
    (epoch,) = [r for r in records if r["event"] == "epoch"]
    assert epoch["energy_J"] == pytest.approx(truth_J, abs=LOAD_W * NVML_COUNTER_PERIOD_S)


@pytest.mark.parametrize("stuck_after_s", [0.0, 2.0])
def test_stuck_amdsmi_counter_warns_once_and_the_power_stream_takes_over(tmp_path, caplog, stuck_after_s):
    """A counter that stops advancing at 200 W (from the start, or after 2 s of a 12 s run)."""
    clock = ManualClock(T0)
    fake = fa.FakeAMDSMI(num_gpus=1, time_fn=clock.now_s)
    backend = AMDSMIBackend(amdsmi_module=fake, clock=clock, read_only=True)
    power_W, steps = 200.0, 120
    fake.set_load(power_W)
    fake.stick_counter(0, at_s=T0 + stuck_after_s)
    caplog.set_level(WARN, logger="zeus_callbacks")
    summary, _, _ = _train(_session(tmp_path, backend), clock, steps)
    backend.close()
    truth_J = power_W * steps * STEP_S
    # One poll interval may pass before the counter is seen stuck, and the first poll only primes.
    assert summary.energy_J == pytest.approx(truth_J, abs=2 * power_W * STEP_S)
    stuck = [m for m in _warnings(caplog) if "stopped advancing" in m]
    assert len(stuck) == 1 and "socket power" in stuck[0]


def test_counter_reset_drops_one_interval_and_the_cross_check_goes_on(tmp_path, caplog):
    clock = ManualClock(T0)
    fake, backend = _nvml(clock)
    fake.set_load(LOAD_W)
    steps = 60  # 6 s = 60 counter periods: long enough for a cross-check
    caplog.set_level(WARN, logger="zeus_callbacks")

    def reset(step):
        if step == steps // 2:
            fake.counter_backwards(0, by_mJ=1_000_000)

    summary, records, _ = _train(_session(tmp_path, backend), clock, steps, at_step=reset)
    backend.close()
    assert not summary.degraded and summary.faults == {} and summary.counter_resets == 1
    assert summary.energy_J == pytest.approx(LOAD_W * steps * STEP_S, rel=1e-6)  # the samples were exact
    (epoch,) = [r for r in records if r["event"] == "epoch"]
    assert epoch["counter_resets"] == 1 and epoch["degraded"] is False
    # The cross-check goes on; its stamps (both ends and the reset's) are each off by at most half a period.
    assert epoch["counter_energy_J"] == pytest.approx(epoch["energy_J"], abs=2 * LOAD_W * NVML_COUNTER_PERIOD_S)
    assert records[-1]["counter_resets"] == 1
    assert len([m for m in _warnings(caplog) if "backwards" in m]) == 1


# ---------------------------------------------------------------- item 3: counter cross-checks
def test_short_spans_get_no_cross_check_never_a_number_that_means_nothing(tmp_path):
    """A 1 s run (10 counter periods) and 50 ms epochs (no counter tick): null, not 270 J or 0.0."""
    clock = ManualClock(T0 + 0.05)  # between two counter ticks
    fake, backend = _nvml(clock)
    fake.set_load(LOAD_W)
    summary, records, metrics = _train(_session(tmp_path, backend), clock, 10, epoch_steps=1)
    backend.close()
    assert summary.counter_energy_J is None
    epochs = [r for r in records if r["event"] == "epoch"]
    assert len(epochs) == 10 and all(r["counter_energy_J"] is None for r in epochs)
    assert not [m for m in metrics if metric.EPOCH_COUNTER_ENERGY_J in m]
    # The samples' figure is there (the first 20 ms sample straddles the load's start: 0.2 % at most).
    assert summary.energy_J == pytest.approx(LOAD_W * 1.0, rel=0.01)


def test_a_null_counter_figure_says_why_in_the_records_and_the_report(tmp_path, capsys):
    """The 1 s run and 100 ms epochs of the test above: each null counter figure carries its reason."""
    from zeus_callbacks.cli import main

    clock = ManualClock(T0 + 0.05)
    fake, backend = _nvml(clock)
    fake.set_load(LOAD_W)
    summary, records, _ = _train(_session(tmp_path, backend), clock, 10, epoch_steps=1)
    backend.close()
    min_span_s = COUNTER_MIN_PERIODS * NVML_COUNTER_PERIOD_S
    # "update periods" (0.1 s, how often the counter changes), not sampling.energy_counter_period_s (the 1 s reads).
    short = (f"shorter than {min_span_s:g} s on nvml ({COUNTER_MIN_PERIODS} counter update periods of "
             f"{NVML_COUNTER_PERIOD_S:g} s)")  # fmt: skip
    epochs = [r for r in records if r["event"] == "epoch"]
    assert len(epochs) == 10
    assert all(r["counter_energy_J"] is None and r["counter_energy_note"].startswith(short) for r in epochs)
    (end,) = [r for r in records if r["event"] == "run_end"]
    assert summary.counter_energy_J is None and end["counter_energy_note"] == summary.counter_energy_note
    assert summary.counter_energy_note.startswith(short)
    capsys.readouterr()
    assert main(["report", str(summary.jsonl_path)]) == 0
    text = capsys.readouterr().out
    rows = [line.split() for line in text.splitlines() if line.split()[:1] in ([str(e)] for e in range(10))]
    assert len(rows) == 10 and all(row[2:4] == ["n/a", "(a)"] for row in rows)  # one reason: one mark
    assert f"(a) counter_J n/a: {short}" in " ".join(text.split())


def test_the_summary_says_why_its_counter_figure_is_null(tmp_path):
    """Outside tester: a null run counter figure left the summary's energy line without a word."""
    clock = ManualClock(T0 + 0.05)
    fake, backend = _nvml(clock)
    fake.set_load(LOAD_W)
    summary, _, _ = _train(_session(tmp_path, backend), clock, 10, epoch_steps=1)  # 1 s: too short
    backend.close()
    assert summary.counter_energy_J is None
    (line,) = [line for line in str(summary).splitlines() if line.startswith("  energy ")]
    short = f"shorter than {COUNTER_MIN_PERIODS * NVML_COUNTER_PERIOD_S:g} s on nvml"
    assert re.search(rf"\(energy counter: n/a, {short} \([^)]*\)\)$", line), line  # the first clause only


def test_a_short_reason_is_a_notes_first_clause_and_keeps_its_gpu():
    from zeus_callbacks.reporting import short_reason

    assert short_reason("shorter than 2 s on nvml (20 periods of 0.1 s): over fewer, off") == (
        "shorter than 2 s on nvml (20 periods of 0.1 s)"
    )
    assert short_reason("GPU 1: no readings bracket it: see docs") == "GPU 1: no readings bracket it"
    assert short_reason("no energy counter on the nvml backend") == "no energy counter on the nvml backend"


def test_a_gpu_without_an_energy_counter_says_so_instead_of_a_figure(tmp_path):
    clock = ManualClock(T0)
    fake, backend = _nvml(clock)
    fake.set_load(LOAD_W)
    fake.make_unsupported("nvmlDeviceGetTotalEnergyConsumption")
    steps = 40  # 4 s = 40 counter periods: long enough, were there a counter
    summary, records, _ = _train(_session(tmp_path, backend), clock, steps)
    backend.close()
    (epoch,) = [r for r in records if r["event"] == "epoch"]
    assert epoch["counter_energy_J"] is None and epoch["energy_J"] > 0
    assert epoch["counter_energy_note"] == "no energy counter on the nvml backend"
    assert summary.counter_energy_note == "no energy counter on the nvml backend"


def test_a_known_counter_figure_has_no_note(tmp_path):
    clock = ManualClock(T0 + 0.037)
    fake, backend = _nvml(clock)
    fake.set_load(LOAD_W)
    summary, records, _ = _train(_session(tmp_path, backend), clock, 40)
    backend.close()
    (epoch,) = [r for r in records if r["event"] == "epoch"]
    assert epoch["counter_energy_J"] is not None and epoch["counter_energy_note"] is None
    assert summary.counter_energy_J is not None and summary.counter_energy_note is None


def test_a_counter_figure_unknown_on_another_rank_says_so():
    # The ranks exchange numbers only: a rank whose own counter gave a figure words the sum's NaN itself.
    from zeus_callbacks.session._log_records import COUNTER_ON_ANOTHER_RANK, counter_note

    assert counter_note(math.nan, None) == COUNTER_ON_ANOTHER_RANK
    assert counter_note(math.nan, "no energy counter on the nvml backend") == "no energy counter on the nvml backend"
    assert counter_note(123.0, None) is None


def test_long_span_cross_check_is_within_the_documented_bound(tmp_path):
    """Over N counter periods the counter is off by at most 1/N of the energy at steady power (docs)."""
    clock = ManualClock(T0 + 0.037)  # off the counter's grid
    fake, backend = _nvml(clock)
    fake.set_load(LOAD_W)
    steps = 40
    summary, records, _ = _train(_session(tmp_path, backend), clock, steps)
    backend.close()
    (epoch,) = [r for r in records if r["event"] == "epoch"]
    periods = epoch["time_s"] / NVML_COUNTER_PERIOD_S
    assert periods >= COUNTER_MIN_PERIODS
    assert epoch["counter_energy_J"] == pytest.approx(epoch["energy_J"], abs=epoch["energy_J"] / periods)
