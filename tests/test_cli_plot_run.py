"""``zeus-callbacks plot run LOG.jsonl``: a real run's log, plotted by the command and read back (issue 26 item 2).

The logs come from real EnergySessions on a manual clock: the virtual GPU (settable, so power-limit
profiling switches the limit) and the repository's NVML fake (a measured, not simulated, run).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from zeus_callbacks._run_log import run_course
from zeus_callbacks.backends._nvml import NVMLBackend
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.cli import main
from zeus_callbacks.reporting import read_jsonl
from zeus_callbacks.session import EnergySession

try:
    from tests.fakes import fake_pynvml as fp
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from fakes import fake_pynvml as fp

Image = pytest.importorskip("PIL.Image", reason="reading the PNG back needs Pillow (a matplotlib dependency)")
pytest.importorskip("matplotlib", reason="plots need the plot extra")

EPOCHS = 3
STEPS_PER_EPOCH = 20
STEP_S = 0.25


def train(session: EnergySession, clock: ManualClock, *, epochs: int = EPOCHS, evaluate: bool = True) -> str:
    """Run ``epochs`` epochs of STEP_S steps, an evaluation after each; return the log's path."""
    session.train_start()
    step = 0
    for epoch in range(epochs):
        session.epoch_start(epoch)
        for _ in range(STEPS_PER_EPOCH):
            session.step_start(step)
            clock.advance(STEP_S)
            session.sampler.poll_once()
            session.step_end(step, num_samples=8)
            session.pop_metrics()
            step += 1
        session.epoch_end(epoch)
        if evaluate:
            session.eval_start()
            clock.advance(0.2)
            session.sampler.poll_once()
            session.eval_end()
            session.evaluate({"val/loss": 1.0 / (epoch + 1)})
    return session.train_end().jsonl_path


@pytest.fixture(scope="module")
def profiled_log(tmp_path_factory) -> str:
    """A virtual-GPU run whose power-limit profiling chose and applied a limit, with epochs and evaluations."""
    clock = ManualClock(1_000.0)
    backend = VirtualGPUBackend(clock=clock, noise_W=3.0, read_only=False, seed=0)
    config = {
        "logging": {"log_dir": str(tmp_path_factory.mktemp("logs")), "run_name": "profiled", "interval_steps": 5},
        "windows": {"sample_fraction": 1.0},
        "power_limit": {"enabled": True, "warmup_steps": 0, "min_profile_steps": 2, "profile_steps": 3,
                        "step_W": 50.0, "cache": False, "plot": False},
    }  # fmt: skip
    try:
        return train(EnergySession(config, backend=backend), clock)
    finally:
        backend.close()


def png_text(path) -> dict[str, str]:
    with Image.open(path) as image:
        return dict(image.text)


def test_plot_run_draws_a_real_run_and_says_what_it_shows(profiled_log, tmp_path, capsys):
    records = read_jsonl(profiled_log)
    end = records[-1]
    assert end["event"] == "run_end" and end["power_limit_applied"] is True  # the run switched its limit
    out = tmp_path / "plots" / "run.png"
    assert main(["plot", "run", profiled_log, "-o", str(out)]) == 0
    assert f"wrote {out} (SIMULATED: virtual GPU)" in capsys.readouterr().out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = png_text(out)
    assert text["Title"] == "profiled: power from the step reports' means (the log holds no power timeline)"
    said = text["Description"].splitlines()
    assert "simulated (virtual GPU)" in said
    assert f" power limit → {end['chosen_power_limit_W']:.0f} W" in said
    assert [line for line in said if re.fullmatch(r" epoch \d+", line)] == [f" epoch {e}" for e in range(EPOCHS)]
    assert {"evaluation", "evaluation (mean power)", "power-limit profiling", "power-limit switch"} <= set(said)


def test_the_course_places_every_record_on_the_step_axis(profiled_log):
    from zeus_callbacks._plots import figure_text, run_figure

    records = read_jsonl(profiled_log)
    course = run_course(records)
    end = records[-1]
    # The warm-up and steps records tile the run's steps: the last one ends at the run's step count.
    assert course.spans[0].first_step == 0 and course.spans[-1].end_step == end["steps"] == EPOCHS * STEPS_PER_EPOCH
    assert all(a.end_step == b.first_step for a, b in zip(course.spans[:-1], course.spans[1:], strict=True)
               if not b.warmup and not a.warmup)  # fmt: skip
    # Each epoch ends, and its evaluation begins, after STEPS_PER_EPOCH more steps.
    assert course.epoch_ends == [(e, float((e + 1) * STEPS_PER_EPOCH)) for e in range(EPOCHS)]
    assert [e.step for e in course.evals] == [(e + 1) * STEPS_PER_EPOCH for e in range(EPOCHS)]
    assert course.switch.step == end["power_limit_from_step"] and course.switch.limit_W == end["chosen_power_limit_W"]
    fig = run_figure(course)
    try:
        power_axis, energy_axis = fig.axes
        # The blue segments are the steps records' means, in log order, one per record with a mean.
        means = [r["power_W_mean"] for r in records if r["event"] == "steps" and r["power_W_mean"] is not None]
        (blue,) = [c for c in power_axis.collections if c.get_label() == "step-report mean power"]
        assert [seg[0][1] for seg in blue.get_segments()] == means
        per_step = [r["energy_J_mean"] for r in records if r["event"] == "steps" and r["energy_J_mean"] is not None]
        (blue_e,) = [c for c in energy_axis.collections if c.get_label() == "step-report mean"]
        assert [seg[0][1] for seg in blue_e.get_segments()] == per_step
        assert "simulated (virtual GPU)" in figure_text(fig)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_a_measured_run_carries_no_simulated_mark(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    clock = ManualClock(1_800_000_000.0)  # realtime seconds, on the fake's 100 ms sensor grid
    fake = fp.FakePyNVML(num_gpus=1, time_fn=clock.now_s)
    fake.set_load(400.0)
    backend = NVMLBackend(nvml_module=fake, clock=clock, read_only=True)
    config = {"backend": "nvml", "windows": {"sample_fraction": 1.0},
              "logging": {"log_dir": str(tmp_path), "run_name": "measured", "interval_steps": 5}}  # fmt: skip
    log = train(EnergySession(config, backend=backend, is_main_process=True), clock, epochs=1, evaluate=False)
    out = tmp_path / "measured.png"
    assert main(["plot", "run", log, "-o", str(out)]) == 0
    assert "SIMULATED" not in capsys.readouterr().out
    said = png_text(out)["Description"]
    assert "simulated" not in said and "the log holds no power timeline" in said


def test_an_old_log_without_epoch_steps_says_its_epochs_are_not_marked(profiled_log, tmp_path, capsys):
    old = tmp_path / "old.jsonl"
    rows = [{k: v for k, v in r.items() if k != "end_step"} for r in read_jsonl(profiled_log)]
    old.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "old.png"
    assert main(["plot", "run", str(old), "-o", str(out)]) == 0
    note = f"{EPOCHS} epoch end(s) not marked: the log predates epoch.end_step"
    assert f"note: {note}" in capsys.readouterr().out
    assert note in png_text(out)["Description"]


def test_a_log_without_a_measured_step_is_one_line_naming_it(tmp_path, capsys, virtual_backend, manual_clock):
    session = EnergySession({"logging": {"log_dir": str(tmp_path), "run_name": "empty"}}, backend=virtual_backend)
    session.train_start()
    manual_clock.advance(0.5)
    log = session.train_end().jsonl_path
    out = tmp_path / "empty.png"
    assert main(["plot", "run", log, "-o", str(out)]) == 1
    assert capsys.readouterr().err == (
        f"zeus-callbacks: {log}: no step report with a measured power (no steps record with a mean)\n"
    )
    assert not out.exists()


def test_without_matplotlib_the_command_names_the_extra(profiled_log, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    out = tmp_path / "run.png"
    assert main(["plot", "run", profiled_log, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    said = "zeus-callbacks: plotting needs matplotlib: install it with pip install 'zeus-callbacks[plot]'"
    assert err.startswith(said)
    assert err.count("zeus-callbacks[plot]") == 1 and not out.exists()


def test_a_resumed_run_is_laid_on_the_run_s_own_step_count(tmp_path, manual_clock):
    # A run resumed from a checkpoint counts its steps on from the checkpoint's (eval.step, epoch.end_step):
    # its step reports must start there too, or the evaluations would sit a checkpoint's steps off.
    first_backend = VirtualGPUBackend(clock=manual_clock, noise_W=0.0, read_only=True)
    config = {"logging": {"log_dir": str(tmp_path), "run_name": "first", "interval_steps": 5},
              "windows": {"sample_fraction": 1.0}}  # fmt: skip
    first = EnergySession(config, backend=first_backend)
    train(first, manual_clock, epochs=1)
    state = first.state_dict()
    backend = VirtualGPUBackend(clock=manual_clock, noise_W=0.0, read_only=True)
    second = EnergySession({**config, "logging": {**config["logging"], "run_name": "second"}}, backend=backend)
    second.load_state_dict(state)
    records = read_jsonl(train(second, manual_clock, epochs=2))
    assert records[0]["resumed_steps"] == STEPS_PER_EPOCH
    course = run_course(records)
    assert course.spans[0].first_step == STEPS_PER_EPOCH
    assert course.spans[-1].end_step == 3 * STEPS_PER_EPOCH == records[-1]["steps"]
    ends = [(e + 1) * STEPS_PER_EPOCH for e in (1, 2)]  # the second run's epochs follow the checkpoint's
    assert [step for _, step in course.epoch_ends] == [e.step for e in course.evals] == ends


def test_observe_mode_switches_nothing_and_says_so(tmp_path, manual_clock):
    backend = VirtualGPUBackend(clock=manual_clock, noise_W=3.0, read_only=True, seed=0)  # limits cannot change
    config = {"logging": {"log_dir": str(tmp_path), "run_name": "observe", "interval_steps": 5},
              "windows": {"sample_fraction": 1.0},
              "power_limit": {"enabled": True, "warmup_steps": 0, "cache": False, "plot": False}}  # fmt: skip
    records = read_jsonl(train(EnergySession(config, backend=backend), manual_clock))
    (profile,) = [r for r in records if r["event"] == "power_limit_profile"]
    end = records[-1]
    assert profile["source"] == "observe" and end["power_limit_applied"] is False
    out = tmp_path / "observe.png"
    assert main(["plot", "run", end["jsonl_path"], "-o", str(out)]) == 0
    said = png_text(out)["Description"].splitlines()
    assert end["chosen_power_limit_W"] is None  # only the current limit was measured: nothing to choose
    assert " power-limit profiling (observe): no limit chosen, none changed" in said
    assert "power-limit switch" not in said and not any("→" in line for line in said)
    # The dashed limit is the one read at the start, kept for the whole run.
    course = run_course(records)
    assert [(s.first_step, s.end_step, s.limit_W) for s in course.limits] == [
        (0, EPOCHS * STEPS_PER_EPOCH, records[0]["power_limit_W"])
    ]


def test_evaluations_of_named_datasets_each_get_their_own_marker_and_legend_entry(tmp_path, manual_clock):
    # The HF Trainer's eval_dataset={"a": ..., "b": ...}: two evaluations at each step (an outside tester
    # found their diamonds on top of one another, unlabelled).
    from zeus_callbacks._plots import run_figure

    backend = VirtualGPUBackend(clock=manual_clock, noise_W=3.0, read_only=False, seed=0)
    session = EnergySession({"logging": {"log_dir": str(tmp_path), "run_name": "two_sets"},
                             "windows": {"sample_fraction": 1.0}}, backend=backend)  # fmt: skip
    session.train_start()
    for step in range(2 * STEPS_PER_EPOCH):
        session.step_start(step)
        manual_clock.advance(STEP_S)
        session.sampler.poll_once()
        session.step_end(step, num_samples=8)
        if (step + 1) % STEPS_PER_EPOCH == 0:
            for dataset, seconds in (("a", 0.2), ("b", 0.6)):
                session.eval_start()
                manual_clock.advance(seconds)
                session.sampler.poll_once()
                session.eval_end(dataset=dataset)
    log = session.train_end().jsonl_path
    backend.close()
    records = read_jsonl(log)
    course = run_course(records)
    assert [e.dataset for e in course.evals] == ["a", "b", "a", "b"]
    fig = run_figure(course)
    try:
        power_axis = fig.axes[0]
        marks = {c.get_label(): c for c in power_axis.collections if c.get_label().startswith("evaluation ")}
        assert set(marks) == {"evaluation a (mean power)", "evaluation b (mean power)"}
        for dataset in ("a", "b"):
            mine = [r for r in records if r["event"] == "eval" and r["dataset"] == dataset]
            offsets = marks[f"evaluation {dataset} (mean power)"].get_offsets()
            assert list(offsets[:, 0]) == [r["step"] for r in mine]
            assert list(offsets[:, 1]) == pytest.approx([r["energy_J"] / r["time_s"] for r in mine], rel=1e-9)
        paths = [tuple(map(tuple, c.get_paths()[0].vertices.round(6))) for c in marks.values()]
        assert paths[0] != paths[1]  # two marker shapes
        legend = [t.get_text() for t in power_axis.get_legend().get_texts()]
        assert "evaluation a (mean power)" in legend and "evaluation b (mean power)" in legend
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_a_log_with_impossible_figures_is_drawn_then_named_and_exits_1(profiled_log, tmp_path, capsys):
    # An outside tester's hand edit: a steps record at -50 J a step and -300 W; `report` refused it, `plot run`
    # drew a -300 W bar and exited 0.
    records = read_jsonl(profiled_log)
    k = next(i for i, r in enumerate(records) if r["event"] == "steps" and r["energy_J_mean"] is not None)
    records[k] = dict(records[k], energy_J_mean=-50.0, power_W_mean=-300.0)
    edited = tmp_path / "edited.jsonl"
    edited.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["plot", "run", str(edited), "-o", str(tmp_path / "p.png")]) == 1
    err = capsys.readouterr().err
    assert f"record {k + 1} (steps)'s energy_J_mean (-50) is negative" in err
    assert f"record {k + 1} (steps)'s power_W_mean (-300) is negative" in err
    assert main(["plot", "run", profiled_log, "-o", str(tmp_path / "ok.png")]) == 0  # as written: fine


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no file can be created")
def test_an_output_that_cannot_be_written_is_named_not_its_temp_file(profiled_log, capsys):
    # /proc refuses new files even to root (an outside tester's case): the message named ".x.png.<random>.tmp".
    assert main(["plot", "run", profiled_log, "-o", "/proc/x.png"]) == 1
    err = capsys.readouterr().err
    assert "cannot write /proc/x.png" in err and ".tmp" not in err


def test_an_evaluation_at_an_epoch_end_stays_visible_beside_the_epoch_line(profiled_log):
    # Issue 26's tester: the evaluation's dashed line lay on the epoch end's dotted line at the same step,
    # so only one of the two could be seen. Each evaluation also gets a triangle at the panel's top edge.
    from zeus_callbacks._plots import run_figure

    course = run_course(read_jsonl(profiled_log))
    epoch_steps = {step for _, step in course.epoch_ends}
    assert {e.step for e in course.evals} <= epoch_steps  # the case: every evaluation at an epoch's end
    fig = run_figure(course)
    try:
        for ax in fig.axes:
            triangles = [line for line in ax.get_lines() if line.get_marker() == "v"]
            assert sorted(float(t.get_xdata()[0]) for t in triangles) == sorted(e.step for e in course.evals)
            assert all(t.get_zorder() > 2 and t.get_color() == "tab:green" for t in triangles)
            dotted = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
            assert {float(line.get_xdata()[0]) for line in dotted} >= epoch_steps  # the epoch lines are still drawn
            dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--" and ln.get_color() == "tab:green"]
            assert dashed and min(d.get_zorder() for d in dotted) > max(d.get_zorder() for d in dashed)  # on top
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
