"""The powercap (RAPL) reader against a fake /sys/class/powercap tree: wraps, stuck, unreadable, vanishing."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeus_callbacks.backends.rapl import PERMISSION_FIX, STILL_AFTER_S, RaplReader, counter_delta_uj, discover

RANGE_UJ = 262_143_328_850  # a real package's max_energy_range_uj


def zone(root: Path, name: str, label: str, energy_uj: int, max_uj: int = RANGE_UJ) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "name").write_text(f"{label}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    return path


def set_uj(path: Path, value: int) -> None:
    (path / "energy_uj").write_text(f"{value}\n")


@pytest.fixture
def tree(tmp_path):
    """Two sockets, each with a package and a DRAM zone, plus zones the reader leaves out."""
    root = tmp_path / "powercap"
    zones = {
        "package-0": zone(root, "intel-rapl:0", "package-0", 1_000_000),
        "dram-0": zone(root, "intel-rapl:0:1", "dram", 5_000),
        "package-1": zone(root, "intel-rapl:1", "package-1", 2_000_000),
        "dram-1": zone(root, "intel-rapl:1:1", "dram", 7_000),
    }
    zone(root, "intel-rapl:0:0", "core", 10)  # not a package or DRAM domain
    zone(root, "intel-rapl-mmio:0", "package-0", 10)  # another interface's zone
    return root, zones


def test_discovers_package_and_dram_per_socket(tree):
    root, _ = tree
    assert [d.label for d in discover(root)] == ["package-0", "dram-0", "package-1", "dram-1"]
    assert discover(root / "missing") == []  # no RAPL (a VM): nothing, no error


def test_energy_across_a_wrap_in_joules(tree):
    root, zones = tree
    reader = RaplReader(root, clock=lambda: 0.0)  # one instant: a static fake counter is not "still"
    reader.start()
    set_uj(zones["package-0"], RANGE_UJ - 500_000)  # +RANGE - 1.5 J
    set_uj(zones["package-1"], 3_000_000)  # +1 J
    set_uj(zones["dram-0"], 6_000)
    set_uj(zones["dram-1"], 9_000)
    reader.read()
    set_uj(zones["package-0"], 1_500_000)  # wrapped: +0.5 J to the end of the range, +1.5 J after 0
    energy = reader.read()
    # approx: µJ -> J is a float division
    assert energy.domains_J["package-0"] == pytest.approx((RANGE_UJ - 1_500_000 + 2_000_000) / 1e6, rel=1e-15)
    assert energy.cpu_J == pytest.approx((RANGE_UJ + 500_000) / 1e6 + 1.0)  # approx: the sum of two floats
    assert energy.dram_J == pytest.approx(0.003)  # approx: µJ -> J division
    assert energy.reasons == {}


def test_unreadable_counter_warns_once_with_the_fix_and_is_unknown_not_0(tree, caplog, monkeypatch):
    root, zones = tree
    real_read_text = Path.read_text

    def read_text(self, *args, **kwargs):
        if self.name == "energy_uj" and self.parent.name.startswith("intel-rapl:0"):
            raise PermissionError(13, "Permission denied", str(self))
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)  # as root, chmod cannot make a file unreadable
    reader = RaplReader(root, clock=lambda: 0.0)
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks.backends.rapl"):
        reader.start()
        set_uj(zones["package-1"], 2_500_000)
        energy = reader.read()
        reader.read()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and PERMISSION_FIX in warnings[0].getMessage()
    assert "chmod" in PERMISSION_FIX and "root" in PERMISSION_FIX
    assert energy.cpu_J is None and energy.dram_J is None  # a socket unknown: the sum is unknown
    assert energy.domains_J["package-1"] == pytest.approx(0.5) and energy.domains_J["package-0"] is None
    assert "not readable" in energy.reasons["package-0"]


def test_a_vanishing_domain_becomes_unknown_with_its_reason(tree, caplog):
    root, zones = tree
    reader = RaplReader(root, clock=lambda: 0.0)
    reader.start()
    set_uj(zones["dram-1"], 8_000)
    reader.read()
    (zones["dram-1"] / "energy_uj").unlink()
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks.backends.rapl"):
        energy = reader.read()
        reader.read()
    assert energy.dram_J is None and energy.domains_J["dram-1"] is None and "vanished" in energy.reasons["dram-1"]
    assert energy.domains_J["dram-0"] == pytest.approx(0.0)  # unchanged twice: not yet stuck
    assert energy.cpu_J == pytest.approx(0.0)
    assert len([r for r in caplog.records if "dram-1" in r.getMessage()]) == 1


def test_a_stuck_counter_becomes_unknown(tree):
    root, zones = tree
    now = [0.0]
    reader = RaplReader(root, stuck_reads=3, clock=lambda: now[0])
    reader.start()
    for value in (1_100_000, 1_100_000, 1_100_000):
        now[0] += 1.0
        set_uj(zones["package-0"], value)
        set_uj(zones["package-1"], 2_000_000 + value)
        energy = reader.read()
    # Two equal readings a second apart after a move: unknown in that reading (not moved), not yet stuck.
    assert energy.domains_J["package-0"] is None and "not moved" in energy.reasons["package-0"]
    now[0] += 1.0
    set_uj(zones["package-0"], 1_100_000)
    energy = reader.read()
    assert energy.domains_J["package-0"] is None and "stuck" in energy.reasons["package-0"]
    assert energy.cpu_J is None


def test_a_counter_that_moves_again_is_known_again_and_quick_equal_readings_are_left_alone(tree):
    root, zones = tree
    now = [0.0]
    reader = RaplReader(root, stuck_reads=3, clock=lambda: now[0])
    reader.start()
    now[0] += 1.0
    set_uj(zones["package-0"], 1_500_000)  # +0.5 J
    assert reader.read().domains_J["package-0"] == pytest.approx(0.5)  # approx: µJ -> J division
    for _ in range(5):  # an epoch's end, its report, the next epoch's start: µs apart, equal
        now[0] += STILL_AFTER_S / 10
        assert reader.read().domains_J["package-0"] == pytest.approx(0.5)
    now[0] += 1.0
    assert reader.read().domains_J["package-0"] is None  # a second without a move: this reading is unknown
    now[0] += 1.0
    set_uj(zones["package-0"], 3_500_000)  # it moves again (+2 J since the last move): known, not stuck
    energy = reader.read()
    assert energy.domains_J["package-0"] == pytest.approx(2.5) and "package-0" not in energy.reasons
    with pytest.raises(ValueError, match="stuck_reads"):
        RaplReader(root, stuck_reads=1)


def test_readings_further_apart_than_a_wrap_make_the_domain_unknown(tree):
    root, zones = tree
    now = [0.0]
    reader = RaplReader(root, clock=lambda: now[0])
    reader.start()
    limit_s = reader.domains[0].wrap_safe_s
    assert limit_s == pytest.approx(RANGE_UJ / 1e6 / 1000.0)  # the range at 1 kW; approx: float division
    now[0] = limit_s * 0.9
    set_uj(zones["package-0"], 2_000_000)
    assert reader.read().domains_J["package-0"] == pytest.approx(1.0)
    reader.read_if_due(period_s=1e9)  # not due: no reading
    now[0] += limit_s * 1.1  # one wrap or two? it cannot be told
    set_uj(zones["package-0"], 3_000_000)
    energy = reader.read()
    assert energy.domains_J["package-0"] is None and "wraps may be missed" in energy.reasons["package-0"]
    assert energy.cpu_J is None


@settings(max_examples=200, deadline=None)
@given(
    max_range=st.integers(min_value=10, max_value=2**40),
    start_fraction=st.floats(min_value=0, max_value=1, exclude_max=True),
    increments=st.lists(st.floats(min_value=0, max_value=1, exclude_max=True), min_size=1, max_size=50),
)
def test_energy_from_the_wrapped_counter_equals_the_true_increments(max_range, start_fraction, increments):
    # Each true increment is below the range (the reader is read more often than the counter wraps).
    true = [int(f * max_range) for f in increments]
    counter = int(start_fraction * max_range)
    total = 0
    for step in true:
        nxt = (counter + step) % max_range
        total += counter_delta_uj(counter, nxt, max_range)
        counter = nxt
    assert total == sum(true)


@settings(max_examples=30, deadline=None)
@given(increments=st.lists(st.integers(min_value=1, max_value=999), min_size=1, max_size=20))
def test_the_reader_sums_wrapped_increments_from_the_tree(tmp_path_factory, increments):
    root = tmp_path_factory.mktemp("powercap")
    path = zone(root, "intel-rapl:0", "package-0", 900, max_uj=1000)
    reader = RaplReader(root, clock=lambda: 0.0)  # a 1 mJ range wraps in 1 µs at 1 kW: readings at one instant
    reader.start()
    value = 900
    for step in increments:
        value = (value + step) % 1000
        set_uj(path, value)
        reader.read()
    assert reader.energy().domains_J["package-0"] == pytest.approx(
        sum(increments) / 1e6, rel=1e-15
    )  # approx: J division
    assert os.fspath(reader.domains[0].path) == os.fspath(path)


# ------------------------------------------------------------------ in the run record (node.rapl)
def _session_run(tmp_path, virtual_backend, manual_clock, root, between=None, **extra):
    from zeus_callbacks.session import EnergySession

    session = EnergySession(
        {"logging": {"log_dir": str(tmp_path / "logs"), "run_name": "n", "interval_steps": 2},
         "node": {"rapl": True, "powercap_root": str(root)}, **extra},
        backend=virtual_backend,
    )  # fmt: skip
    session.train_start()
    session.epoch_start(0)
    for step in range(4):
        session.step_start(step)
        manual_clock.advance(0.5)
        session.sampler.poll_once()
        session.step_end(step)
    session.epoch_end(0)
    if between is not None:
        between()
    return session, session.train_end()


def test_the_run_record_holds_cpu_dram_and_node_energy(tmp_path, tree, virtual_backend, manual_clock):
    from zeus_callbacks.reporting import read_jsonl

    root, zones = tree

    def burn():  # what the CPUs drew during the run: package-0 wraps
        set_uj(zones["package-0"], 400_000)  # +RANGE - 1 J + 0.4 J
        set_uj(zones["package-1"], 12_000_000)  # +10 J
        set_uj(zones["dram-0"], 1_005_000)  # +1 J
        set_uj(zones["dram-1"], 2_007_000)  # +2 J

    set_uj(zones["package-0"], RANGE_UJ - 1_000_000)
    session, summary = _session_run(tmp_path, virtual_backend, manual_clock, root, between=burn)
    cpu_J = (1_000_000 + 400_000) / 1e6 + 10.0
    # approx: µJ -> J divisions and sums of floats
    assert summary.cpu_energy_J == pytest.approx(cpu_J) and summary.dram_energy_J == pytest.approx(3.0)
    assert summary.node_energy_J == pytest.approx(summary.energy_J + cpu_J + 3.0)
    assert summary.node_energy_note == "GPU + CPU package + DRAM"
    end = [r for r in read_jsonl(tmp_path / "logs" / "n.jsonl") if r["event"] == "run_end"][-1]
    assert end["cpu_energy_J"] == pytest.approx(cpu_J) and end["node_energy_J"] == pytest.approx(summary.node_energy_J)
    totals = session.totals()
    assert totals["energy/cpu_J"] == pytest.approx(cpu_J) and totals["energy/dram_J"] == pytest.approx(3.0)
    assert totals["energy/node_J"] == pytest.approx(summary.node_energy_J)
    assert "CPU/DRAM" in str(summary)


def test_an_unreadable_counter_leaves_the_node_figure_unknown_and_the_gpu_figures_alone(
    tmp_path, tree, virtual_backend, manual_clock, monkeypatch, caplog
):
    root, _ = tree
    real_read_text = Path.read_text

    def read_text(self, *args, **kwargs):
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(self))
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks.backends.rapl"):
        session, summary = _session_run(tmp_path, virtual_backend, manual_clock, root)
    assert summary.energy_J > 0 and summary.cpu_energy_J is None and summary.node_energy_J is None
    assert "unknown: package-0" in summary.node_energy_note and "chmod" in summary.node_energy_note
    assert len([r for r in caplog.records if "CPU/DRAM energy unavailable" in r.getMessage()]) == 1
    assert "energy/node_J" not in session.totals() and "energy/total_J" in session.totals()


def test_without_node_rapl_no_cpu_figures(tmp_path, virtual_backend, manual_clock, capsys):
    from zeus_callbacks.cli import main
    from zeus_callbacks.session import EnergySession
    from zeus_callbacks.session._node import NODE_OFF

    session = EnergySession({"logging": {"log_dir": str(tmp_path), "run_name": "x"}}, backend=virtual_backend)
    session.train_start()
    summary = session.train_end()
    # Null figures, with the reason (as each epoch record gives it); nothing printed: nothing was asked for.
    assert summary.cpu_energy_J is None and summary.node_energy_J is None and summary.node_energy_note == NODE_OFF
    assert "CPU/DRAM" not in str(summary)
    capsys.readouterr()
    assert main(["report", str(summary.jsonl_path)]) == 0
    assert "CPU" not in capsys.readouterr().out


# ------------------------------------------------------------------ per epoch (node.rapl)
def _epochs_run(tmp_path, backend, manual_clock, root, burns, *, node=None):
    """Epochs of two 0.5 s steps; ``burns[i]()`` moves the counters inside epoch i (between its readings)."""
    from zeus_callbacks.session import EnergySession

    node = {"rapl": True, "powercap_root": str(root)} if node is None else node
    session = EnergySession(
        {"logging": {"log_dir": str(tmp_path / "logs"), "run_name": "e"}, "node": node}, backend=backend
    )
    session.train_start()
    logged = []
    for epoch, burn in enumerate(burns):
        session.epoch_start(epoch)
        for step in range(2):
            session.step_start(step)
            manual_clock.advance(0.5)
            session.sampler.poll_once()
            session.step_end(step)
        burn()
        logged.append(session.epoch_end(epoch, report=True))
    return session, session.train_end(), logged


def _log_records(tmp_path, event):
    from zeus_callbacks.reporting import read_jsonl

    return [r for r in read_jsonl(tmp_path / "logs" / "e.jsonl") if r["event"] == event]


def _mover(zones):
    values = {label: int((path / "energy_uj").read_text()) for label, path in zones.items()}

    def move(**uj):
        def burn():
            for label, delta in uj.items():
                values[label] = (values[label] + delta) % RANGE_UJ
                set_uj(zones[label], values[label])

        return burn

    return move


def test_each_epoch_holds_the_cpu_dram_and_node_energy_between_its_readings(
    tmp_path, tree, virtual_backend, manual_clock
):
    root, zones = tree
    set_uj(zones["package-0"], RANGE_UJ - 1_000_000)  # package-0 wraps in epoch 0
    move = _mover(zones)
    burns = [
        move(**{"package-0": 3_000_000, "package-1": 10_000_000, "dram-0": 1_000_000, "dram-1": 2_000_000}),
        move(**{"package-0": 4_000_000, "package-1": 6_000_000, "dram-0": 500_000, "dram-1": 250_000}),
    ]
    session, summary, logged = _epochs_run(tmp_path, virtual_backend, manual_clock, root, burns)
    epochs = _log_records(tmp_path, "epoch")
    expected = [(3.0 + 10.0, 1.0 + 2.0), (4.0 + 6.0, 0.5 + 0.25)]  # (CPU J, DRAM J): the µJ moved above / 1e6
    for record, metrics, (cpu_J, dram_J) in zip(epochs, logged, expected, strict=True):
        # approx: µJ -> J divisions and sums of floats
        assert record["cpu_energy_J"] == pytest.approx(cpu_J) and record["dram_energy_J"] == pytest.approx(dram_J)
        assert record["energy_J"] > 0  # the GPU part, from the samples
        assert record["node_energy_J"] == pytest.approx(record["energy_J"] + cpu_J + dram_J)
        assert record["node_energy_note"] == "GPU + CPU package + DRAM"
        assert metrics["energy/epoch_cpu_J"] == pytest.approx(cpu_J)
        assert metrics["energy/epoch_dram_J"] == pytest.approx(dram_J)
        assert metrics["energy/epoch_node_J"] == pytest.approx(record["node_energy_J"])
    # Nothing moved outside the epochs: the run's CPU/DRAM energy is the epochs' sum.
    assert summary.cpu_energy_J == pytest.approx(sum(r["cpu_energy_J"] for r in epochs))
    assert summary.dram_energy_J == pytest.approx(sum(r["dram_energy_J"] for r in epochs))


def test_a_domain_lost_in_an_epoch_leaves_that_epochs_figure_unknown_with_the_reason(
    tmp_path, tree, virtual_backend, manual_clock
):
    root, zones = tree
    move = _mover(zones)
    everything = {"package-0": 1_000_000, "package-1": 1_000_000, "dram-0": 1_000_000, "dram-1": 1_000_000}

    def lose_dram_1():
        move(**{k: v for k, v in everything.items() if k != "dram-1"})()
        (zones["dram-1"] / "energy_uj").unlink()

    session, summary, logged = _epochs_run(
        tmp_path, virtual_backend, manual_clock, root, [move(**everything), lose_dram_1]
    )
    first, second = _log_records(tmp_path, "epoch")
    assert first["dram_energy_J"] == pytest.approx(2.0) and first["node_energy_J"] is not None
    assert second["cpu_energy_J"] == pytest.approx(2.0)  # the packages were read: known
    assert second["dram_energy_J"] is None and second["node_energy_J"] is None  # never 0 for unknown
    assert "unknown: dram-1: " in second["node_energy_note"] and "vanished" in second["node_energy_note"]
    assert "energy/epoch_cpu_J" in logged[1] and "energy/epoch_J" in logged[1]
    assert "energy/epoch_dram_J" not in logged[1] and "energy/epoch_node_J" not in logged[1]


def test_unreadable_counters_give_null_epoch_figures_with_the_fix(
    tmp_path, tree, virtual_backend, manual_clock, monkeypatch
):
    root, _ = tree
    real_read_text = Path.read_text

    def read_text(self, *args, **kwargs):
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(self))
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    _, _, logged = _epochs_run(tmp_path, virtual_backend, manual_clock, root, [lambda: None])
    (record,) = _log_records(tmp_path, "epoch")
    assert record["cpu_energy_J"] is None and record["node_energy_J"] is None and record["energy_J"] > 0
    assert "not readable" in record["node_energy_note"] and "chmod" in record["node_energy_note"]
    assert not any(key.startswith(("energy/epoch_cpu", "energy/epoch_node")) for key in logged[0])


def test_without_a_node_option_the_epoch_figures_are_null_and_say_so(tmp_path, virtual_backend, manual_clock):
    from zeus_callbacks.session._node import NODE_OFF

    _, summary, logged = _epochs_run(tmp_path, virtual_backend, manual_clock, tmp_path, [lambda: None], node={})
    (record,) = _log_records(tmp_path, "epoch")
    assert (record["cpu_energy_J"], record["dram_energy_J"], record["node_energy_J"]) == (None, None, None)
    assert record["node_energy_note"] == NODE_OFF
    assert "energy/epoch_node_J" not in logged[0]
    # run_end says the same as the epoch (it said null before).
    (end,) = _log_records(tmp_path, "run_end")
    assert (end["cpu_energy_J"], end["dram_energy_J"], end["node_energy_J"]) == (None, None, None)
    assert end["node_energy_note"] == summary.node_energy_note == NODE_OFF


# ------------------------------------------------------------------ the virtual CPU (node.virtual_cpu)
def test_the_virtual_cpu_is_power_per_core_times_the_process_cpu_time():
    from zeus_callbacks.backends._virtual_cpu import VirtualCpu

    cpu_s = [40.0]
    cpu = VirtualCpu(8.0, cpu_time_s=lambda: cpu_s[0])
    cpu.start()
    cpu_s[0] += 1.5  # 1.5 s of CPU time (e.g. two threads busy for 0.75 s)
    energy = cpu.read()
    assert energy.cpu_J == pytest.approx(8.0 * 1.5) and energy.dram_J is None  # approx: float product
    assert cpu.simulated and not cpu.has_dram and "SIMULATED" in cpu.parts and "8 W per busy core" in cpu.parts
    with pytest.raises(ValueError, match="power_per_core_W"):
        VirtualCpu(0.0)


@pytest.fixture
def fake_cpu_time(monkeypatch):
    """The process's CPU time as the test moves it (s), and how often it was read."""
    from zeus_callbacks.backends import _virtual_cpu as virtual_cpu

    state = {"s": 100.0, "reads": 0}

    def cpu_time_s():
        state["reads"] += 1
        return state["s"]

    monkeypatch.setattr(virtual_cpu, "process_cpu_time_s", cpu_time_s)
    return state


def test_beside_the_virtual_gpu_without_rapl_the_cpu_is_simulated_and_flagged(
    tmp_path, wall_virtual_backend, fake_cpu_time
):
    from zeus_callbacks.reporting import read_jsonl
    from zeus_callbacks.session import EnergySession

    node = {"virtual_cpu": True, "virtual_cpu_power_per_core_W": 5.0, "powercap_root": str(tmp_path / "none")}
    session = EnergySession(
        {"logging": {"log_dir": str(tmp_path / "logs"), "run_name": "v"}, "node": node}, backend=wall_virtual_backend
    )
    session.train_start()
    session.epoch_start(0)
    for step in range(3):
        session.step_start(step)
        time.sleep(0.03)  # the wall clock: the virtual GPU draws power while it runs
        session.step_end(step)
    fake_cpu_time["s"] += 2.0  # the process used 2 s of CPU time in the epoch
    metrics = session.epoch_end(0, report=True)
    fake_cpu_time["s"] += 0.5  # and 0.5 s after it
    summary = session.train_end()
    records = read_jsonl(tmp_path / "logs" / "v.jsonl")
    (epoch,) = [r for r in records if r["event"] == "epoch"]
    assert epoch["cpu_energy_J"] == pytest.approx(5.0 * 2.0)  # approx: float product
    assert epoch["dram_energy_J"] is None  # the virtual CPU simulates no DRAM
    gpu_J = epoch["energy_J"]  # null only if no sample covered the epoch (a stalled machine): then so is the node's
    assert epoch["node_energy_J"] == (None if gpu_J is None else pytest.approx(gpu_J + epoch["cpu_energy_J"]))
    assert metrics["energy/epoch_cpu_J"] == pytest.approx(10.0) and metrics["energy/simulated"] == 1.0
    assert summary.cpu_energy_J == pytest.approx(5.0 * 2.5) and summary.dram_energy_J is None
    assert summary.node_energy_J == pytest.approx(summary.energy_J + summary.cpu_energy_J)
    # Flagged wherever it appears: every record that carries it says simulated, and the notes and summary say so.
    carrying = [r for r in records if r.get("cpu_energy_J") is not None]
    assert [r["event"] for r in carrying] == ["steps", "epoch", "run_end"]  # an epoch's steps come before it
    assert all(r["simulated"] is True for r in carrying)
    # The steps record's span: the run's start to the epoch end's report, which holds the 2 s of CPU time.
    assert carrying[0]["cpu_energy_J"] == pytest.approx(5.0 * 2.0) and carrying[0]["node_steps"] == 3
    assert all("SIMULATED" in r["node_energy_note"] and "5 W per busy core" in r["node_energy_note"] for r in carrying)
    assert summary.simulated and "SIMULATED" in str(summary)


def test_a_real_gpu_never_gets_the_virtual_cpu(tmp_path, manual_clock, fake_cpu_time, caplog):
    from tests.fakes import fake_pynvml as fp
    from zeus_callbacks.backends._nvml import NVMLBackend
    from zeus_callbacks.reporting import read_jsonl
    from zeus_callbacks.session import EnergySession

    backend = NVMLBackend(nvml_module=fp.FakePyNVML(num_gpus=1, time_fn=manual_clock.now_s), clock=manual_clock,
                          read_only=True)  # fmt: skip
    node = {"virtual_cpu": True, "powercap_root": str(tmp_path / "none")}  # no RAPL on this machine
    session = EnergySession(
        {"logging": {"log_dir": str(tmp_path / "logs"), "run_name": "r"}, "node": node}, backend=backend
    )
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        session.train_start()
    session.epoch_start(0)
    for step in range(2):
        session.step_start(step)
        manual_clock.advance(0.5)
        session.sampler.poll_once()
        session.step_end(step)
    fake_cpu_time["s"] += 2.0
    session.epoch_end(0)
    summary = session.train_end()
    backend.close()
    assert fake_cpu_time["reads"] == 0  # never read: no simulated figure beside a real GPU
    (epoch,) = [r for r in read_jsonl(tmp_path / "logs" / "r.jsonl") if r["event"] == "epoch"]
    for figures in (epoch, summary.as_dict()):
        assert figures["cpu_energy_J"] is None and figures["node_energy_J"] is None
        assert "only beside the virtual GPU" in figures["node_energy_note"]
        assert "SIMULATED" not in figures["node_energy_note"]
    assert summary.energy_J > 0 and not summary.simulated
    assert any("node.virtual_cpu" in r.getMessage() for r in caplog.records)


def test_the_virtual_cpu_stays_off_on_a_manual_clock_and_rapl_comes_first(
    tmp_path, tree, virtual_backend, wall_virtual_backend, fake_cpu_time
):
    from zeus_callbacks.config import NodeConfig
    from zeus_callbacks.session._node import open_node_reader

    missing = str(tmp_path / "none")
    reader, note = open_node_reader(NodeConfig(virtual_cpu=True, powercap_root=missing), virtual_backend)
    assert reader is None and "manual clock" in note  # the simulator's time is not the process's CPU time
    root, _ = tree
    reader, note = open_node_reader(NodeConfig(virtual_cpu=True, powercap_root=root), wall_virtual_backend)
    assert note is None and not reader.simulated and reader.parts == "GPU + CPU package + DRAM"
    reader, note = open_node_reader(NodeConfig(virtual_cpu=True, powercap_root=missing), wall_virtual_backend)
    assert note is None and reader.simulated
    assert open_node_reader(NodeConfig(), wall_virtual_backend) == (None, None)


def test_under_several_processes_rapl_is_read_by_local_rank_0_and_the_virtual_cpu_by_every_process(
    tmp_path, tree, wall_virtual_backend, monkeypatch, fake_cpu_time
):
    from zeus_callbacks.config import NodeConfig
    from zeus_callbacks.session._node import OTHER_LOCAL_RANK, open_node_reader

    root, _ = tree
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    reader, note = open_node_reader(NodeConfig(rapl=True, powercap_root=root), wall_virtual_backend)
    assert reader is None and "LOCAL_RANK" in note  # which processes share a node is unknown: no guess
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert open_node_reader(NodeConfig(rapl=True, powercap_root=root), wall_virtual_backend) == (None, OTHER_LOCAL_RANK)
    monkeypatch.setenv("LOCAL_RANK", "0")
    reader, note = open_node_reader(NodeConfig(rapl=True, powercap_root=root), wall_virtual_backend)
    assert note is None and not reader.simulated
    monkeypatch.setenv("LOCAL_RANK", "1")  # the virtual CPU models each process's own CPU time
    reader, note = open_node_reader(NodeConfig(virtual_cpu=True, powercap_root=tmp_path / "none"), wall_virtual_backend)
    assert note is None and reader.simulated


def test_on_a_machine_without_rapl_the_note_says_nothing_of_the_cpu_was_measured(tmp_path, manual_clock, caplog):
    """The H100 host of 2026-12-05 has no /sys/class/powercap: the note named 'GPU + CPU package' parts anyway."""
    from tests.fakes import fake_pynvml as fp
    from zeus_callbacks.backends._nvml import NVMLBackend
    from zeus_callbacks.reporting import read_jsonl
    from zeus_callbacks.session import EnergySession

    backend = NVMLBackend(nvml_module=fp.FakePyNVML(num_gpus=1, time_fn=manual_clock.now_s), clock=manual_clock,
                          read_only=True)  # fmt: skip
    root = tmp_path / "no-powercap"
    node = {"rapl": True, "powercap_root": str(root)}
    session = EnergySession(
        {"logging": {"log_dir": str(tmp_path / "logs"), "run_name": "r"}, "node": node}, backend=backend
    )
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        session.train_start()
    session.epoch_start(0)
    for step in range(2):
        session.step_start(step)
        manual_clock.advance(0.5)
        session.sampler.poll_once()
        session.step_end(step)
    session.epoch_end(0)
    summary = session.train_end()
    backend.close()
    (epoch,) = [r for r in read_jsonl(tmp_path / "logs" / "r.jsonl") if r["event"] == "epoch"]
    for figures in (epoch, summary.as_dict()):
        assert figures["cpu_energy_J"] is None and figures["dram_energy_J"] is None and figures["node_energy_J"] is None
        note = figures["node_energy_note"]
        assert "not measured" in note and str(root) in note and "GPU + CPU package" not in note, note
    assert any("no RAPL package domain" in r.getMessage() for r in caplog.records)
