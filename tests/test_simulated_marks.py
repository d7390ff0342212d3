"""Every figure from simulated data says so, and power-limit results on the virtual GPU say time is not simulated.

Issue 26 item 3. Each case runs the real :class:`~zeus_callbacks.session.EnergySession`, profiler
or command on the virtual GPU and reads back what a user gets: the JSONL log, the summary, the
``report`` text, the PNG's text chunks (:func:`tests.png_text.png_text`) and the figure's title and
texts as matplotlib saves them (a spy on ``Figure.savefig`` that records and then saves).
"""

from __future__ import annotations

import json

import pytest
from matplotlib.figure import Figure

from tests.png_text import png_text
from zeus_callbacks._plots import SIMULATED_KEY, SIMULATED_MARK, TIME_NOTE_KEY
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.cli import main
from zeus_callbacks.measurement.kernel_profiler import ProfileResult, profile
from zeus_callbacks.optimizers.power_limit._time_note import slowdown_words, time_note
from zeus_callbacks.reporting import read_jsonl
from zeus_callbacks.session import EnergySession

STEP_S = 0.25  # one training step (s): CPU-bound, the same at every power limit


class CpuClock:
    """A clock the test moves by hand but that is not a ManualClock: it stands for the real clock.

    On the real clock a CPU-bound step takes as long at every power limit; the test advances it
    by the same ``STEP_S`` whatever the limit, as a training run on a machine without a GPU does.
    (A :class:`ManualClock` marks a caller that applies the trace's time, like the simulator.)
    """

    def __init__(self, start_s: float) -> None:
        self._now_s = start_s

    def now_s(self) -> float:
        return self._now_s

    def advance(self, dt_s: float) -> None:
        self._now_s += dt_s


@pytest.fixture
def saved_figures(monkeypatch):
    """Each figure's suptitle-level texts and axes titles, as they are when matplotlib saves it."""
    seen: list[list[str]] = []
    original = Figure.savefig

    def spy(fig, *args, **kwargs):
        seen.append([t.get_text() for t in fig.texts] + [ax.get_title() for ax in fig.axes])
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return seen


def _profile_run(tmp_path, clock, *, scale_by_trace: bool, name: str = "pl"):
    """A run with power-limit profiling until the profiler chooses; returns the summary and the backend."""
    backend = VirtualGPUBackend(clock=clock, noise_W=3.0, seed=0)
    config = {
        "backend": "virtual",
        "windows": {"sample_fraction": 1.0},
        "logging": {"log_dir": str(tmp_path), "run_name": name, "interval_steps": 5},
        "power_limit": {"enabled": True, "warmup_steps": 1, "min_profile_steps": 4, "profile_steps": 6},
    }
    session = EnergySession(config, backend=backend, is_main_process=True)
    session.train_start()
    session.epoch_start(0)
    after = 0
    for step in range(300):
        session.step_start(step)
        factor = backend.step_time_factor(backend.power_limit_W(0)) if scale_by_trace else 1.0
        clock.advance(STEP_S * factor)
        session.sampler.poll_once()
        session.step_end(step, num_samples=32)
        if session.power_limiter.result is not None:
            after += 1
            if after > 3:
                break
    session.epoch_end(0)
    summary = session.train_end()
    return summary, backend


def test_power_limit_results_on_the_real_clock_say_time_is_not_simulated(tmp_path, saved_figures, capsys):
    summary, backend = _profile_run(tmp_path, CpuClock(1_000.0), scale_by_trace=False)
    records = read_jsonl(summary.jsonl_path)
    (profile_rec,) = [r for r in records if r["event"] == "power_limit_profile"]
    chosen = profile_rec["chosen_limit_W"]
    assert chosen is not None
    # The artefact the note is about: every limit's steps took STEP_S, whatever the trace says.
    times = {row["time_per_step_s"] for row in profile_rec["limits"] if row["time_per_step_s"] is not None}
    assert max(times) == pytest.approx(min(times), rel=1e-6) and len(profile_rec["limits"]) > 1
    slowdown = backend.step_time_factor(chosen)
    note = summary.time_note
    assert note is not None and "not a saving" in note and f"makes the job {slowdown_words(slowdown)})" in note
    end = next(r for r in records if r["event"] == "run_end")
    assert end["time_note"] == note == profile_rec["time_note"]
    assert f"TIME NOT SIMULATED: {note}" in str(summary)
    assert main(["report", str(summary.jsonl_path)]) == 0
    report = " ".join(capsys.readouterr().out.split())  # the text is wrapped at 80 columns
    assert f"TIME NOT SIMULATED: {note}" in report
    # The PNG written during the run: marked simulated, with the note, on the figure and in its text chunks.
    png = tmp_path / "pl.power_limit.png"
    chunks = png_text(png)
    assert chunks[SIMULATED_KEY] == SIMULATED_MARK and chunks[TIME_NOTE_KEY] == note
    (texts,) = saved_figures
    assert SIMULATED_MARK in texts
    assert any(t.startswith("TIME NOT SIMULATED:") and " ".join(t.split()).endswith(note) for t in texts)


@pytest.mark.parametrize(
    ("factor", "words"),
    [(2.761, "2.76x slower"), (1.0, "no slower"), (1.004, "no slower"), (0.996, "no slower"), (1.02, "1.02x slower"),
     (0.8, "1.25x faster")],
)  # fmt: skip
def test_slowdown_words(factor, words):
    assert slowdown_words(factor) == words


def test_the_note_at_the_maximum_limit_says_no_slower():
    # It said "makes the job 1.00x slower" when the chosen limit was the maximum.
    backend = VirtualGPUBackend(clock=CpuClock(0.0), noise_W=0.0, seed=0)
    max_W = backend.power_limit_constraints_W(0)[1]
    assert backend.step_time_factor(max_W) == pytest.approx(1.0, abs=1e-9)
    note = time_note(backend, max_W)
    assert note is not None and f"{max_W:.0f} W makes the job no slower)" in note and "1.00x" not in note


def test_the_simulator_clock_applies_the_trace_time_and_has_no_note(tmp_path, saved_figures):
    # A ManualClock advanced by the trace's slowdown at each limit (as `zeus-callbacks simulate` does):
    # the times are the trace's, so there is nothing to warn about; the figure is still simulated.
    summary, _ = _profile_run(tmp_path, ManualClock(1_000.0), scale_by_trace=True)
    records = read_jsonl(summary.jsonl_path)
    (profile_rec,) = [r for r in records if r["event"] == "power_limit_profile"]
    assert summary.time_note is None and profile_rec["time_note"] is None
    assert "TIME NOT SIMULATED" not in str(summary)
    chunks = png_text(tmp_path / "pl.power_limit.png")
    assert chunks[SIMULATED_KEY] == SIMULATED_MARK and TIME_NOTE_KEY not in chunks
    (texts,) = saved_figures
    assert SIMULATED_MARK in texts and not any("TIME NOT SIMULATED" in t for t in texts)


def test_plot_power_limit_from_a_log_carries_the_mark_and_the_note(tmp_path, saved_figures):
    summary, _ = _profile_run(tmp_path, CpuClock(1_000.0), scale_by_trace=False)
    out = tmp_path / "again.png"
    assert main(["plot", "power-limit", str(summary.jsonl_path), "-o", str(out)]) == 0
    chunks = png_text(out)
    assert chunks[SIMULATED_KEY] == SIMULATED_MARK and chunks[TIME_NOTE_KEY] == summary.time_note
    assert SIMULATED_MARK in saved_figures[-1]


def test_plot_run_of_a_power_limit_run_on_the_real_clock_says_time_is_not_simulated(tmp_path, saved_figures, capsys):
    # The tester's case: plot run left the note out while plot power-limit and report showed it.
    summary, _ = _profile_run(tmp_path, CpuClock(1_000.0), scale_by_trace=False)
    note = summary.time_note
    assert note is not None
    capsys.readouterr()
    out = tmp_path / "run.png"
    assert main(["plot", "run", str(summary.jsonl_path), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"wrote {out} (SIMULATED: virtual GPU)\n")
    assert f"TIME NOT SIMULATED: {note}" in " ".join(printed.split())  # wrapped at 80 columns
    chunks = png_text(out)
    assert chunks[SIMULATED_KEY] == SIMULATED_MARK and chunks[TIME_NOTE_KEY] == note
    assert f"TIME NOT SIMULATED: {note}" in " ".join(chunks["Description"].split())
    texts = saved_figures[-1]  # the note under the axes, as matplotlib saved the figure
    assert any(t.startswith("TIME NOT SIMULATED:") and " ".join(t.split()).endswith(note) for t in texts)


def test_plot_run_on_the_simulator_clock_has_no_time_note(tmp_path, saved_figures, capsys):
    summary, _ = _profile_run(tmp_path, ManualClock(1_000.0), scale_by_trace=True)
    capsys.readouterr()
    out = tmp_path / "run.png"
    assert main(["plot", "run", str(summary.jsonl_path), "-o", str(out)]) == 0
    assert "TIME NOT SIMULATED" not in capsys.readouterr().out
    chunks = png_text(out)
    assert chunks[SIMULATED_KEY] == SIMULATED_MARK and TIME_NOTE_KEY not in chunks
    assert not any("TIME NOT SIMULATED" in t for t in saved_figures[-1])


def test_report_of_several_runs_says_which_one_s_time_is_not_simulated(tmp_path, capsys):
    # 125 W against 300 W on the virtual GPU: the run on the real clock must say its time is not simulated.
    real, _ = _profile_run(tmp_path / "real", CpuClock(1_000.0), scale_by_trace=False, name="real-clock")
    sim, _ = _profile_run(tmp_path / "sim", ManualClock(1_000.0), scale_by_trace=True, name="simulator")
    note = real.time_note
    assert note is not None and sim.time_note is None
    capsys.readouterr()
    assert main(["report", str(real.jsonl_path), str(sim.jsonl_path)]) == 0
    text = capsys.readouterr().out
    (row,) = [line for line in text.splitlines() if line.startswith("time note")]
    assert row.split()[2:] == ["below", "none"]  # one cell per run, in the order given
    assert f"real-clock: TIME NOT SIMULATED: {note}" in " ".join(text.split())
    assert "simulator: TIME NOT SIMULATED" not in text
    assert main(["report", "--json", str(real.jsonl_path), str(sim.jsonl_path)]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["time_note"] for r in runs] == [note, None]


def test_every_plot_of_simulated_data_says_so_when_it_writes(tmp_path, capsys):
    # plot run said "(SIMULATED: virtual GPU)" after "wrote X"; plot power-limit and plot profile did not.
    summary, _ = _profile_run(tmp_path, CpuClock(1_000.0), scale_by_trace=False)
    _virtual_profile(tmp_path, 0.005, mode="isolated", target_ci=0.1, max_time_s=5.0)
    capsys.readouterr()
    for what, source in (("power-limit", summary.jsonl_path), ("profile", tmp_path / "k.json"),
                         ("run", summary.jsonl_path)):  # fmt: skip
        out = tmp_path / f"{what}.png"
        assert main(["plot", what, str(source), "-o", str(out)]) == 0
        assert capsys.readouterr().out.splitlines()[0] == f"wrote {out} (SIMULATED: virtual GPU)", what
        assert png_text(out)[SIMULATED_KEY] == SIMULATED_MARK


def _virtual_profile(tmp_path, exec_s: float, **kwargs) -> ProfileResult:
    clock = ManualClock(1_000.0)
    backend = VirtualGPUBackend(clock=clock, noise_W=3.0, utilization=0.0, read_only=True, seed=0)

    def kernel() -> None:
        backend.set_utilization(1.0)
        clock.advance(exec_s)
        backend.set_utilization(0.0)

    return profile(kernel, backend=backend, json_path=tmp_path / "k.json", plot_path=tmp_path / "k.png",
                   n_boot=50, name="virtual kernel", **kwargs)  # fmt: skip


def test_profile_json_and_both_profile_plots_say_simulated(tmp_path, saved_figures):
    result = _virtual_profile(tmp_path, 0.005, mode="isolated", target_ci=0.1, max_time_s=5.0)
    assert result.simulated
    assert json.loads((tmp_path / "k.json").read_text())["simulated"] is True
    assert png_text(tmp_path / "k.png")[SIMULATED_KEY] == SIMULATED_MARK  # profile-kernel --plot
    out = tmp_path / "again.png"
    assert main(["plot", "profile", str(tmp_path / "k.json"), "-o", str(out)]) == 0  # plot profile
    assert png_text(out)[SIMULATED_KEY] == SIMULATED_MARK
    assert len(saved_figures) == 2 and all(SIMULATED_MARK in texts for texts in saved_figures)


def test_a_profile_json_written_before_the_field_is_read_as_simulated_from_its_device(tmp_path):
    result = _virtual_profile(tmp_path, 0.005, mode="isolated", target_ci=0.1, max_time_s=5.0)
    data = result.as_dict()
    del data["simulated"]
    assert ProfileResult.from_dict(data).simulated  # device "virtual: ..." says so
    assert not ProfileResult.from_dict({**data, "device": "nvml: 1 GPU(s) (NVIDIA H200)"}).simulated
