"""The standalone profiler on the virtual GPU, where the truth is known."""

from __future__ import annotations

import json
import re

import pytest

from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.measurement.kernel_profiler import profile

EXEC_S = 0.005


def make(seed=0):
    clock = ManualClock(1_000.0)
    backend = VirtualGPUBackend(clock=clock, noise_W=3.0, utilization=0.0, read_only=True, seed=seed)

    def kernel():  # 5 ms of full utilization on the virtual GPU
        backend.set_utilization(1.0)
        clock.advance(EXEC_S)
        backend.set_utilization(0.0)

    busy_W = backend.average_power_W(backend.power_limit_W(0))
    return backend, kernel, busy_W, backend.idle_power_W


@pytest.mark.parametrize("mode", ["steady", "isolated"])
def test_profile_recovers_the_virtual_gpu_energy(mode, tmp_path):
    backend, kernel, busy_W, idle_W = make()
    target = 0.02 if mode == "steady" else 0.06
    res = profile(
        kernel, mode=mode, backend=backend, target_ci=target, min_time_s=1.0, max_time_s=20.0,
        json_path=tmp_path / "p.json", plot_path=tmp_path / "p.png", n_boot=100,
    )  # fmt: skip
    truth_J = busy_W * EXEC_S
    assert res.timer == "clock" and res.mode == mode
    assert res.energy_J == pytest.approx(truth_J, rel=1.5 * target)
    assert res.energy_ci_J[0] <= truth_J <= res.energy_ci_J[1]
    assert res.baseline_W == pytest.approx(idle_W, abs=2.0)
    assert res.dynamic_energy_J == pytest.approx((busy_W - idle_W) * EXEC_S, rel=2 * target)
    assert res.target_met and res.rel_ci_halfwidth <= target
    assert res.duration_s == pytest.approx(EXEC_S, rel=0.01)
    assert res.executions_used > 20 and res.executions_dropped == 0
    if mode == "steady":
        assert res.warmup_executions > 0
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["energy_J"] == res.energy_J and len(data["power_W"]) == len(data["time_s"])
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_profile_rejects_a_callable_that_takes_no_time():
    backend, _, _, _ = make()
    with pytest.raises(ValueError, match="advance the clock"):
        profile(lambda: None, backend=backend, max_time_s=1.0)
    with pytest.raises(ValueError, match="mode"):
        profile(lambda: None, backend=backend, mode="burst")  # type: ignore[arg-type]


def test_profile_kernel_cli_on_the_virtual_gpu(tmp_path, capsys):
    from zeus_callbacks.cli import main

    args = ["profile-kernel", "matmul", "--size", "128", "--chain", "10", "--dtype", "fp32", "--backend", "virtual"]
    args += [
        "--max-time",
        "0.6",
        "--min-time",
        "0.5",
        "--json",
        str(tmp_path / "k.json"),
        "--plot",
        str(tmp_path / "k.png"),
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "energy/execution" in out and "95% CI" in out
    assert re.search(r"95% CI \[-?[\d,.]+, -?[\d,.]+\] (mJ|J|kJ) ", out) and "e+" not in out and "e-" not in out, out
    data = json.loads((tmp_path / "k.json").read_text())
    assert data["executions_used"] > 0 and len(data["power_W"]) == len(data["time_s"])
    assert (tmp_path / "k.png").exists()
    assert main(["profile-kernel", "nosuchkernel", "--backend", "virtual"]) == 1


def test_profile_kernel_on_the_fallback_gpu_announces_its_files_and_says_what_marks_them(
    tmp_path, capsys, caplog, monkeypatch
):
    # Outside tester: --json FILE and --plot FILE were written silently (docs/cli.md: every written plot is
    # announced, `(SIMULATED: virtual GPU)` on the virtual GPU), and the fallback's warning named run records
    # (run_start, run_end) that profile-kernel never writes.
    import logging
    import sys

    import zeus_callbacks.backends as backends
    from zeus_callbacks.backends import GPUPresence
    from zeus_callbacks.cli import main

    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    monkeypatch.setattr(backends, "detect_gpus", lambda: GPUPresence())  # no GPU: auto gives the virtual one
    caplog.set_level(logging.WARNING, logger="zeus_callbacks")
    json_path, png_path = tmp_path / "k.json", tmp_path / "k.png"
    args = ["profile-kernel", "matmul", "--size", "64", "--dtype", "fp32", "--max-time", "0.3", "--min-time", "0.2"]
    assert main([*args, "--no-progress", "--json", str(json_path), "--plot", str(png_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == [f"wrote {json_path} (SIMULATED: virtual GPU)", f"wrote {png_path} (SIMULATED: virtual GPU)"]
    (warning,) = [r.getMessage() for r in caplog.records if "no GPU on this machine" in r.getMessage()]
    assert "run_start" not in warning and "the printed result, its JSON (simulated: true) and its plot" in warning


@pytest.mark.parametrize(
    ("kernel", "reason"),
    [("nosuch:fn", "No module named 'nosuch'"), ("json:nosuchfn", "module 'json' has no attribute 'nosuchfn'")],
)
def test_profile_kernel_says_which_kernel_cannot_be_imported(capsys, kernel, reason):
    from zeus_callbacks.cli import main

    assert main(["profile-kernel", kernel, "--backend", "virtual"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"zeus-callbacks: cannot import the kernel {kernel!r}: {reason}\n"


def test_a_binning_that_drops_too_much_is_warned_about_once_per_run(caplog):
    import logging

    clock = ManualClock(1_000.0)
    backend = VirtualGPUBackend(clock=clock, noise_W=3.0, utilization=0.0, read_only=True, seed=1)
    calls = [0]

    def uneven():  # every third execution takes 3x as long: a third dropped, above the 20 % allowed
        calls[0] += 1
        backend.set_utilization(1.0)
        clock.advance(EXEC_S * (3 if calls[0] % 3 == 0 else 1))
        backend.set_utilization(0.0)

    with caplog.at_level(logging.WARNING):
        res = profile(uneven, backend=backend, target_ci=0.001, min_time_s=1.0, max_time_s=6.0, n_boot=50)
    assert res.executions_dropped > 0.2 * (res.executions_used + res.executions_dropped)
    assert not res.target_met  # 0.1 % is out of reach in 6 s: said in the result (and its JSON)
    assert sum("binning dropped" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("mode", ["steady", "isolated"])
def test_work_before_the_profile_stays_out_of_it(mode):
    """The sensor keeps ~2.4 s of history (NVML, and the virtual GPU like it): samples of work
    that ran before ``profile()`` was called are no idle time of its own."""
    backend, kernel, busy_W, idle_W = make(seed=3)
    backend.set_utilization(1.0)  # the caller's previous work, up to the call
    backend.clock.advance(2.0)
    backend.set_utilization(0.0)
    res = profile(kernel, mode=mode, backend=backend, target_ci=0.06, min_time_s=4.0, max_time_s=4.0, n_boot=50)
    assert res.baseline_W == pytest.approx(idle_W, abs=2.0)  # 2 s at busy_W would lift it by tens of W
    assert res.energy_J == pytest.approx(busy_W * EXEC_S, rel=0.1)


def test_isolated_gap_leaves_idle_samples_around_each_execution():
    from zeus_callbacks.measurement.kernel_profiler import isolated_gap_s

    # 20 ms sensor: 40 ms before + 100 ms after the execution, plus 1 to 6 sample periods of idle.
    assert isolated_gap_s(0.02) == pytest.approx((0.16, 0.26))
    # A 1 ms sensor keeps the floors of the margins (40 ms, 100 ms).
    assert isolated_gap_s(0.001) == pytest.approx((0.141, 0.146))


def test_one_execution_has_no_interval_and_does_not_meet_the_target(tmp_path):
    # Issue 26: the README's command measured one execution and printed a 95 % CI of width 0 with
    # target_met true. Here one 2 s execution outlasts max_time_s = 1.5 s: one measured execution.
    backend, _, _, _ = make()
    clock = backend.clock

    def long_kernel():
        backend.set_utilization(1.0)
        clock.advance(2.0)
        backend.set_utilization(0.0)

    res = profile(long_kernel, mode="isolated", backend=backend, target_ci=0.5, min_time_s=1.0, max_time_s=1.5,
                  n_boot=50, json_path=tmp_path / "one.json")  # fmt: skip
    assert res.executions_used == 1
    assert res.energy_ci_J is None and res.dynamic_energy_ci_J is None and res.power_ci_W is None
    assert res.rel_ci_halfwidth is None and not res.target_met
    assert "1 execution measured" in res.ci_reason and "at least 4" in res.ci_reason
    data = json.loads((tmp_path / "one.json").read_text())
    assert data["energy_ci_J"] is None and data["power_ci_W"] is None and data["rel_ci_halfwidth"] is None
    assert data["target_met"] is False and data["ci_reason"] == res.ci_reason
    assert res.energy_J > 0  # the point estimate stays: only the interval is not there


def test_the_profiler_measures_until_an_interval_has_its_executions():
    # 0.6 s executions: at min_time_s = 1 s two are measured, and two noise-free-ish executions give a
    # bootstrap width near 0 that "meets" a 20 % target. The profiler goes on until it has the 4 an
    # interval needs at 95 % (min_executions_for_interval) before it may stop on the target.
    from zeus_callbacks.measurement.finegrain import min_executions_for_interval

    backend, _, _, _ = make()
    clock = backend.clock

    def slow_kernel():
        backend.set_utilization(1.0)
        clock.advance(0.6)
        backend.set_utilization(0.0)

    res = profile(slow_kernel, mode="isolated", backend=backend, target_ci=0.2, min_time_s=1.0, max_time_s=20.0,
                  n_boot=50)  # fmt: skip
    assert res.executions_used >= min_executions_for_interval(0.95) == 4
    assert res.ci_reason is None and res.energy_ci_J is not None and res.target_met


def test_profile_kernel_cli_says_there_is_no_interval_from_one_execution(tmp_path, capsys, monkeypatch):
    # The command end to end on the virtual GPU (real clock): a 0.3 s kernel against --max-time 0.2
    # measures one execution whatever the machine's load (a sleep lasts at least its time).
    from matplotlib.figure import Figure

    from tests.png_text import png_text
    from zeus_callbacks._plots import SIMULATED_KEY, SIMULATED_MARK
    from zeus_callbacks.cli import main

    titles: list[str] = []  # each figure's axes titles as matplotlib saves it (then it is saved)
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (titles.extend(ax.get_title() for ax in fig.axes),
                                                                  save(fig, *a, **k))[1])  # fmt: skip
    args = ["profile-kernel", "tests.test_profiler:sleepy_kernel", "--backend", "virtual", "--mode", "isolated",
            "--max-time", "0.2", "--no-progress", "--plot", str(tmp_path / "k.png")]  # fmt: skip
    assert main([*args, "--json", str(tmp_path / "k.json")]) == 0
    out = capsys.readouterr().out
    assert "no 95% CI" in out and "no confidence interval: 1 execution measured" in out
    assert "SIMULATED (virtual GPU)" in out and "95% CI [" not in out and "over 1 execution (" in out
    # ~0.3 s at ~100-300 W: tens of joules, printed as such (it was "9.21e+04 mJ")
    assert re.search(r"energy/execution [\d,.]+ J ", out) and "e+" not in out, out
    data = json.loads((tmp_path / "k.json").read_text())
    assert data["executions_used"] == 1 and data["energy_ci_J"] is None and data["target_met"] is False
    assert data["simulated"] is True and "at least 4" in data["ci_reason"]
    # Both plots of a profile without an interval: no band, "no 95 % CI" in the title, marked simulated.
    assert main(["plot", "profile", str(tmp_path / "k.json"), "-o", str(tmp_path / "again.png")]) == 0
    for png in ("k.png", "again.png"):
        assert png_text(tmp_path / png)[SIMULATED_KEY] == SIMULATED_MARK
    assert len(titles) == 2 and all("no 95 % CI" in t and t.endswith(", 1 execution") for t in titles)


def sleepy_kernel() -> None:
    """A 0.3 s 'kernel' for the command's test (module:function, no arguments)."""
    import time

    time.sleep(0.3)
