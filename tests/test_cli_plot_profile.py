"""``zeus-callbacks plot profile``: a real fine-grain profile from the virtual GPU, plotted by the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.timeouts import CHILD_TIMEOUT_S
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.cli import main
from zeus_callbacks.measurement.kernel_profiler import NotAProfile, ProfileResult, profile

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def profile_json(tmp_path_factory) -> tuple[Path, ProfileResult]:
    """A profile measured by the profiler on the virtual GPU (5 ms executions at full utilization)."""
    clock = ManualClock(1_000.0)
    backend = VirtualGPUBackend(clock=clock, noise_W=3.0, utilization=0.0, read_only=True, seed=0)

    def kernel() -> None:
        backend.set_utilization(1.0)
        clock.advance(0.005)
        backend.set_utilization(0.0)

    path = tmp_path_factory.mktemp("profile") / "kernel.json"
    result = profile(kernel, mode="isolated", backend=backend, target_ci=0.06, max_time_s=20.0, json_path=path,
                     n_boot=50, name="virtual 5 ms kernel")  # fmt: skip
    return path, result


def test_plot_profile_writes_a_readable_png_from_a_subprocess(profile_json, tmp_path):
    path, result = profile_json
    out = tmp_path / "plots" / "profile.png"
    done = subprocess.run(
        [sys.executable, "-m", "zeus_callbacks.cli", "plot", "profile", str(path), "-o", str(out)],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=CHILD_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stdout and out.stat().st_size > 0
    import matplotlib.pyplot as plt

    image = plt.imread(out)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image.std() > 0  # something was drawn, not a blank canvas
    assert result.executions_used > 20


def test_profile_json_reads_back_to_the_same_result(profile_json):
    path, result = profile_json
    again = ProfileResult.read_json(path)
    assert again.energy_ci_J == result.energy_ci_J and isinstance(again.energy_ci_J, tuple)
    assert json.loads(json.dumps(again.as_dict())) == json.loads(json.dumps(result.as_dict()))


def _plot(source: Path, tmp_path: Path, capsys) -> tuple[int, str]:
    out = tmp_path / "x.png"
    code = main(["plot", "profile", str(source), "-o", str(out)])
    err = capsys.readouterr().err
    assert not out.exists()
    return code, err


def test_plot_profile_names_a_missing_file(tmp_path, capsys):
    code, err = _plot(tmp_path / "nowhere.json", tmp_path, capsys)
    assert code == 1 and "no such profile file" in err and "nowhere.json" in err


def test_plot_profile_refuses_a_file_that_is_not_json(tmp_path, capsys):
    source = tmp_path / "notes.json"
    source.write_text("energy was high today\n")
    code, err = _plot(source, tmp_path, capsys)
    assert code == 1 and f"{source} is not JSON" in err


def test_plot_profile_refuses_json_of_another_kind(tmp_path, capsys):
    record = tmp_path / "record.json"  # a record of a run's energy log, not a profile
    record.write_text(json.dumps({"event": "run_end", "energy_J": 12.0, "time_s": 3.0}))
    code, err = _plot(record, tmp_path, capsys)
    assert code == 1 and f"{record} is not a fine-grain power profile" in err and "missing name" in err
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2, 3]")
    code, err = _plot(listing, tmp_path, capsys)
    assert code == 1 and "holds a JSON list" in err


def test_plot_profile_refuses_a_profile_with_broken_fields(profile_json, tmp_path, capsys):
    path, _ = profile_json
    data = json.loads(path.read_text())
    short = tmp_path / "short.json"
    short.write_text(json.dumps({**data, "power_W": data["power_W"][:-1]}))
    code, err = _plot(short, tmp_path, capsys)
    assert code == 1 and "equal, nonzero length" in err
    typed = tmp_path / "typed.json"
    typed.write_text(json.dumps({**data, "energy_J": "a lot"}))
    code, err = _plot(typed, tmp_path, capsys)
    assert code == 1 and "energy_J" in err
    with pytest.raises(NotAProfile):
        ProfileResult.from_dict({**data, "power_ci_W": [data["power_ci_W"][0]]})


def test_plot_says_the_file_it_really_wrote(tmp_path, capsys):
    from zeus_callbacks.cli import main as cli

    log = tmp_path / "run.jsonl"
    rows = [{"limit_W": w, "energy_per_step_J": 50.0 + w / 10, "time_per_step_s": 0.2 + 30 / w} for w in (300, 250)]
    log.write_text(json.dumps({"event": "power_limit_profile", "chosen_limit_W": 250, "limits": rows}) + "\n")
    folder = tmp_path / "plots"
    folder.mkdir()
    assert cli(["plot", "power-limit", str(log), "-o", str(folder)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {folder / 'zeus_power-limit.png'}"
    assert (folder / "zeus_power-limit.png").stat().st_size > 1000
    assert cli(["plot", "power-limit", str(log), "-o", str(tmp_path / "frontier")]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'frontier.png'}"
    assert (tmp_path / "frontier.png").exists()


def _keep_figures(monkeypatch) -> list:
    """Capture the figures the plot commands draw (instead of closing them) to read them back."""
    import matplotlib.pyplot as plt

    kept: list = []
    monkeypatch.setattr(plt, "close", kept.append)
    return kept


def test_plots_land_in_a_created_folder_say_simulated_and_keep_labels_and_recurrences_readable(
    tmp_path, capsys, monkeypatch
):
    from zeus_callbacks._plots import SIMULATED_MARK
    from zeus_callbacks.cli import main as cli

    store = tmp_path / "store.sqlite"
    assert cli(["simulate", "--gpu", "V100", "--workload", "cifar100", "--recurrences", "7", "--store", str(store),
                "--no-progress"]) == 0  # fmt: skip
    capsys.readouterr()
    # show STORE JOB, as plot bandit STORE JOB takes it (before: "unrecognized arguments").
    assert cli(["show", str(store), "sim/V100/cifar100"]) == 0
    out = capsys.readouterr().out
    assert "job sim/V100/cifar100" in out and "7 trial(s)" in out
    assert cli(["show", str(store), "nightly"]) == 1
    said = capsys.readouterr().err
    assert said == f"zeus-callbacks: no job 'nightly' in {store} (its jobs: sim/V100/cifar100)\n"
    # plot bandit words a missing job as show does (before: "job 'nightly' has no finished trial in ...").
    assert cli(["plot", "bandit", str(store), "nightly", "-o", str(tmp_path / "none.png")]) == 1
    assert capsys.readouterr().err == said and not (tmp_path / "none.png").exists()
    kept = _keep_figures(monkeypatch)
    # -o missing_dir/ : a file inside it, the folder created (before: missing_dir.png beside it).
    out = tmp_path / "missing_dir"
    assert cli(["plot", "bandit", str(store), "sim/V100/cifar100", "-o", f"{out}/"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out / 'zeus_bandit.png'} (SIMULATED: virtual GPU)"
    assert (out / "zeus_bandit.png").stat().st_size > 1000 and not (tmp_path / "missing_dir.png").exists()
    (fig,) = kept
    ticks = [t for t in fig.axes[0].get_xticks() if 0 <= t <= 6]
    assert ticks and all(float(t).is_integer() for t in ticks)  # whole recurrences only
    assert SIMULATED_MARK in [t.get_text() for t in fig.texts]
    # A deep missing folder for a file name is created too.
    assert cli(["plot", "bandit", str(store), "sim/V100/cifar100", "-o", str(tmp_path / "a" / "b" / "c.png")]) == 0
    assert (tmp_path / "a" / "b" / "c.png").exists()

    # A power-limit profile of 11 limits 10 W apart whose points crowd together: no two labels overlap.
    log = tmp_path / "run.jsonl"
    rows = [{"limit_W": w, "energy_per_step_J": 60.0 - w / 100, "time_per_step_s": 0.2 + 0.001 * (300 - w) / 10}
            for w in range(200, 310, 10)]  # fmt: skip
    log.write_text(
        json.dumps({"event": "run_start", "backend": "virtual: 1 GPU(s)"})
        + "\n"
        + json.dumps({"event": "power_limit_profile", "chosen_limit_W": 250, "limits": rows})
        + "\n"
    )
    kept.clear()
    assert cli(["plot", "power-limit", str(log), "-o", str(tmp_path / "pl.png")]) == 0
    (fig,) = kept
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    labels = [t for t in fig.axes[0].texts if t.get_text().endswith(" W")]
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert "250 W" in [t.get_text() for t in labels]  # the chosen limit keeps its label
    assert 1 < len(labels) <= len(rows)
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if a.overlaps(b)]
    assert SIMULATED_MARK in [t.get_text() for t in fig.texts]


@pytest.mark.parametrize("time_note", [None, "the virtual GPU simulates power, not time: " + "words " * 40])
def test_the_power_limit_png_keeps_every_label_on_the_canvas(tmp_path, monkeypatch, time_note):
    # Lower limits are slower: the lowest ("125 W") is the right-most point, and its label ran off the image.
    import struct

    from zeus_callbacks._plots import plot_profile

    rows = [{"limit_W": w, "time_per_step_s": 30.0 / w, "energy_per_step_J": 24.0 + w / 100}
            for w in range(125, 325, 25)]  # fmt: skip
    kept = _keep_figures(monkeypatch)
    png = plot_profile(rows, 200.0, tmp_path / "pl.png", simulated=True, time_note=time_note)
    (fig,) = kept
    renderer = fig.canvas.get_renderer()  # the one savefig drew with
    width, height = struct.unpack(">II", png.read_bytes()[16:24])  # the PNG's IHDR chunk
    assert (width, height) == (round(fig.bbox.width), round(fig.bbox.height))  # the canvas is the saved image
    canvas = fig.bbox
    labels = {t.get_text(): t.get_window_extent(renderer) for t in fig.axes[0].texts}
    assert "125 W" in labels and "200 W" in labels
    drawn = [fig.get_tightbbox(renderer).transformed(fig.dpi_scale_trans), *labels.values()]  # ticks, titles, notes
    for box in drawn:
        assert canvas.x0 - 0.5 <= box.x0 and box.x1 <= canvas.x1 + 0.5, (box, canvas)
        assert canvas.y0 - 0.5 <= box.y0 and box.y1 <= canvas.y1 + 0.5, (box, canvas)


def test_plot_without_matplotlib_names_the_extra(tmp_path, capsys, monkeypatch):
    import sys

    from zeus_callbacks.cli import main as cli

    log = tmp_path / "run.jsonl"
    rows = [{"limit_W": w, "energy_per_step_J": 50.0 + w / 10, "time_per_step_s": 0.2 + 30 / w} for w in (300, 250)]
    log.write_text(json.dumps({"event": "power_limit_profile", "chosen_limit_W": 250, "limits": rows}) + "\n")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert cli(["plot", "power-limit", str(log), "-o", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err
    assert "pip install 'zeus-callbacks[plot]'" in err and "Traceback" not in err
    assert err.count("zeus-callbacks[plot]") == 1, err  # the extra named once, not twice
