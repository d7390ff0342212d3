"""``zeus-callbacks report A.jsonl B.jsonl [--csv DIR]``: runs side by side, records as CSV (issue 26 item 2).

Two real runs on the virtual GPU and a manual clock: one at the limit in force, one that profiled
power limits and switched to the chosen one, so their figures differ.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from zeus_callbacks._units import J_PER_WH
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.cli import main
from zeus_callbacks.cli._compare import CSV_RECORDS
from zeus_callbacks.reporting import NODE_OFF, read_jsonl
from zeus_callbacks.session import EnergySession

ROWS = ["energy (J)", "energy (Wh)", "time (s)", "steps", "mean power (W)", "power limit (W)", "parts: epochs (J)",
        "parts: outside (J)", "CPU (J)", "DRAM (J)", "node (J)", "status", "simulated", "time note"]  # fmt: skip
CLI_MD = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def _run(log_dir, name: str, steps: int, step_s: float, **config) -> str:
    """A real run of two epochs of ``steps`` steps, an evaluation after each; returns its log."""
    clock = ManualClock(1_000.0)
    backend = VirtualGPUBackend(clock=clock, noise_W=3.0, read_only=False, seed=1)
    session = EnergySession({"logging": {"log_dir": str(log_dir), "run_name": name, "interval_steps": 5},
                             "windows": {"sample_fraction": 1.0}, **config}, backend=backend)  # fmt: skip
    session.train_start()
    step = 0
    for epoch in range(2):
        session.epoch_start(epoch)
        for _ in range(steps):
            session.step_start(step)
            clock.advance(step_s)
            session.sampler.poll_once()
            session.step_end(step, num_samples=4)
            step += 1
        session.epoch_end(epoch)
        session.eval_start()
        clock.advance(0.1)
        session.sampler.poll_once()
        session.eval_end()
        session.evaluate({"val/loss": 1.0})
    log = session.train_end().jsonl_path
    backend.close()
    return log


@pytest.fixture(scope="module")
def two_logs(tmp_path_factory) -> tuple[str, str]:
    logs = tmp_path_factory.mktemp("logs")
    plain = _run(logs, "plain", steps=12, step_s=0.2)
    profiled = _run(logs, "profiled", steps=20, step_s=0.25, power_limit={
        "enabled": True, "warmup_steps": 0, "min_profile_steps": 2, "profile_steps": 3, "step_W": 100.0,
        "cache": False, "plot": False})  # fmt: skip
    return plain, profiled


def _end(log: str) -> dict:
    (end,) = [r for r in read_jsonl(log) if r["event"] == "run_end"]
    return end


def parse_table(text: str) -> dict[str, dict[str, str]]:
    """The comparison table as {row label: {run: cell}} (one block: two runs fit 80 columns)."""
    lines = [line for line in text.splitlines() if line.strip()]
    runs = lines[0].split()
    table = {}
    for line in lines[1:]:
        label = next((r for r in ROWS if line.startswith(r)), None)
        if label is not None:
            # Cells are two spaces apart at least; a null node figure's cell is "- (a)", one space inside.
            table[label] = dict(zip(runs, re.split(r"\s{2,}", line[len(label) :].strip()), strict=True))
    return table


def test_two_logs_are_compared_one_column_per_run(two_logs, capsys):
    plain, profiled = two_logs
    assert main(["report", plain, profiled]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    table = parse_table(out)
    assert list(table) == ROWS
    for name, log in (("plain", plain), ("profiled", profiled)):
        end = _end(log)
        # Printed to one decimal: within half its last digit of the record.
        for label, key in (("energy (J)", "energy_J"), ("time (s)", "time_s"), ("mean power (W)", "mean_power_W")):
            assert abs(float(table[label][name]) - end[key]) <= 0.05, (label, name)
        # Three significant figures of the record's Wh.
        assert float(table["energy (Wh)"][name]) == pytest.approx(end["energy_J"] / J_PER_WH, rel=5e-3)
        assert int(table["steps"][name]) == end["steps"]
        # The parts of the single-run parts line: the epochs' sum and the rest, which add up to the total.
        epochs_J = sum(end["epoch_energy_J"])
        assert abs(float(table["parts: epochs (J)"][name]) - epochs_J) <= 0.05
        assert abs(float(table["parts: outside (J)"][name]) - (end["energy_J"] - epochs_J)) <= 0.05
        assert table["status"][name] == end["status"] == "completed"
        assert table["simulated"][name] == "yes"
        assert table["time note"][name] == "none"  # a manual clock: the simulator's time, nothing to note
    # The limit training ran at: the one in force, or the one profiling chose and applied.
    assert float(table["power limit (W)"]["plain"]) == _end(plain)["power_limit_W"]
    assert _end(profiled)["power_limit_applied"] is True
    assert float(table["power limit (W)"]["profiled"]) == _end(profiled)["chosen_power_limit_W"]
    assert "SIMULATED energy (virtual GPU, not measured)" in out
    # No node figure measured (node.rapl and node.virtual_cpu off): "-", never 0, and why (one reason: one mark).
    for row in ("CPU (J)", "DRAM (J)", "node (J)"):
        assert table[row] == {"plain": "- (a)", "profiled": "- (a)"}
    assert f"(a) CPU/DRAM/node n/a: {NODE_OFF}" in " ".join(out.split())


def test_node_figures_are_compared_where_a_run_has_them(two_logs, tmp_path, capsys):
    plain, _ = two_logs
    records = read_jsonl(plain)
    end_line = next(i for i, r in enumerate(records) if r["event"] == "run_end")
    # As a run on a RAPL machine writes them (the measurement itself: tests/test_rapl.py, test_node_steps.py).
    node = {"cpu_energy_J": 41.3, "dram_energy_J": 7.5, "node_energy_J": records[end_line]["energy_J"] + 48.8}
    lines = open(plain, encoding="utf-8").read().splitlines()
    lines[end_line] = json.dumps(dict(records[end_line], run_name="rapl", **node))
    with_node = tmp_path / "rapl.jsonl"
    with_node.write_text("\n".join(lines) + "\n")
    assert main(["report", plain, str(with_node)]) == 0
    table = parse_table(capsys.readouterr().out)
    assert table["CPU (J)"] == {"plain": "- (a)", "rapl": "41.3"}
    assert table["DRAM (J)"] == {"plain": "- (a)", "rapl": "7.5"}
    assert table["node (J)"]["plain"] == "- (a)"
    assert abs(float(table["node (J)"]["rapl"]) - node["node_energy_J"]) <= 0.05
    assert main(["report", plain, str(with_node), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["cpu_energy_J"] for r in runs] == [None, 41.3] and runs[1]["node_energy_J"] == node["node_energy_J"]


def test_a_null_node_figure_is_marked_and_its_reason_is_a_footnote(two_logs, tmp_path, capsys):
    # Outside tester: the CPU/DRAM/node rows showed a bare "-" though each run_end says why in node_energy_note.
    plain, profiled = two_logs
    records = read_jsonl(profiled)
    end_line = next(i for i, r in enumerate(records) if r["event"] == "run_end")
    why = "GPU + CPU packages (RAPL); unknown: DRAM: no DRAM domain readable"
    node = {"cpu_energy_J": 41.3, "dram_energy_J": None, "node_energy_J": None, "node_energy_note": why}
    lines = open(profiled, encoding="utf-8").read().splitlines()
    lines[end_line] = json.dumps(dict(records[end_line], run_name="rapl", **node))
    partly = tmp_path / "rapl.jsonl"
    partly.write_text("\n".join(lines) + "\n")
    assert main(["report", plain, str(partly)]) == 0
    out = capsys.readouterr().out
    table = parse_table(out)
    assert table["CPU (J)"] == {"plain": "- (a)", "rapl": "41.3"}  # a known figure has no mark
    assert table["DRAM (J)"] == {"plain": "- (a)", "rapl": "- (b)"}
    assert table["node (J)"] == {"plain": "- (a)", "rapl": "- (b)"}
    text = " ".join(out.split())
    assert f"(a) CPU/DRAM/node n/a: {NODE_OFF}" in text and f"(b) CPU/DRAM/node n/a: {why}" in text
    assert max(len(line) for line in out.splitlines()) <= 80


def test_a_killed_run_shows_dashes_for_what_it_lacks(two_logs, tmp_path, capsys):
    plain, profiled = two_logs
    killed = tmp_path / "killed.jsonl"  # a run killed before its end: no run_end line
    lines = open(profiled, encoding="utf-8").read().splitlines(keepends=True)
    killed.write_text("".join(line for line in lines if '"event": "run_end"' not in line))
    assert main(["report", plain, str(killed)]) == 0
    out = capsys.readouterr().out
    table = parse_table(out)
    # Named from its run_start; every figure "-", the two rows that need no run_end given.
    assert [table[row]["profiled"] for row in ROWS] == ["-"] * (len(ROWS) - 2) + ["yes", "none"]
    assert table["status"]["plain"] == "completed"
    assert "profiled: no run_end record (still running, or killed before it ended): shown as -" in out
    assert main(["report", plain, str(killed), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["run"] for r in runs] == ["plain", "profiled"] and runs[1]["log"] == str(killed)
    assert runs[1]["ended"] is False and runs[1]["energy_J"] is None and runs[1]["status"] is None
    assert runs[0]["energy_J"] == _end(plain)["energy_J"] and runs[0]["ended"] is True


def test_csv_holds_every_record_of_each_type_with_a_run_column(two_logs, tmp_path, capsys):
    plain, profiled = two_logs
    out_dir = tmp_path / "csv"
    assert main(["report", plain, profiled, "--csv", str(out_dir)]) == 0
    assert f"wrote {out_dir / 'steps.csv'}" in capsys.readouterr().out
    records = {name: read_jsonl(log) for name, log in (("plain", plain), ("profiled", profiled))}
    for kind in CSV_RECORDS:
        with open(out_dir / f"{kind}.csv", newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
        for name, recs in records.items():
            expected = [r for r in recs if r["event"] == kind]
            mine = [row for row in rows if row["run"] == name]
            assert len(mine) == len(expected) > 0, (kind, name)
        assert [row["run"] for row in rows] == sorted((row["run"] for row in rows), key=["plain", "profiled"].index)
    with open(out_dir / "epoch.csv", newline="", encoding="utf-8") as fh:
        epochs = list(csv.DictReader(fh))
    expected = [r for r in records["profiled"] if r["event"] == "epoch"]
    mine = [row for row in epochs if row["run"] == "profiled"]
    # Floats round-trip exactly (repr), a mapping becomes dotted columns, null an empty cell.
    assert [float(row["energy_J"]) for row in mine] == [r["energy_J"] for r in expected]
    assert [float(row["ledger.steps_J"]) for row in mine] == [r["ledger"]["steps_J"] for r in expected]
    assert [json.loads(row["gpu_energy_J"]) for row in mine] == [r["gpu_energy_J"] for r in expected]
    assert {row["covered_from_step"] for row in mine} == {""}
    with open(out_dir / "eval.csv", newline="", encoding="utf-8") as fh:
        evals = list(csv.DictReader(fh))
    assert {row["dataset"] for row in evals} == {""}  # the eval records' dataset: null (one unnamed dataset)


def test_csv_of_one_log_also_prints_its_summary(two_logs, tmp_path, capsys):
    plain, _ = two_logs
    assert main(["report", plain, "--csv", str(tmp_path / "one")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("run plain (completed)")
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == sorted(f"{k}.csv" for k in CSV_RECORDS)


def test_a_missing_log_among_several_is_named(two_logs, tmp_path, capsys):
    plain, _ = two_logs
    missing = tmp_path / "nowhere.jsonl"
    assert main(["report", plain, str(missing), "--csv", str(tmp_path / "c")]) == 1
    assert capsys.readouterr().err == f"zeus-callbacks: no such energy log: {missing}\n"
    assert not (tmp_path / "c").exists()


def test_cli_md_documents_both_report_json_shapes(two_logs, capsys):
    """One log: ``{"run_end", "epochs"}``; several: ``{"runs": [...]}``; the page lists each one's keys as printed."""
    plain, profiled = two_logs
    doc = " ".join(CLI_MD.read_text(encoding="utf-8").split())
    assert main(["report", "--json", plain]) == 0
    one = json.loads(capsys.readouterr().out)
    assert set(one) == {"run_end", "epochs"}
    assert one["run_end"] == _end(plain) and [e["event"] for e in one["epochs"]] == ["epoch", "epoch"]
    assert '| one | `{"run_end": {...}, "epochs": [{...}, ...]}`' in doc
    assert main(["report", "--json", plain, profiled]) == 0
    several = json.loads(capsys.readouterr().out)
    (documented,) = re.findall(r'\| several \| `\{"runs": \[\{([^}]*)\}, \.\.\.\]\}`', doc)
    keys = [k.strip().strip('"') for k in documented.split(",")]
    assert list(several) == ["runs"] and [list(run) for run in several["runs"]] == [keys, keys]


@pytest.mark.parametrize(
    ("value", "said"), [(-5.0, "energy_J (-5) is negative"), ("lots", 'energy_J ("lots") is not a number')]
)
def test_an_impossible_energy_in_a_log_is_named_and_fails_the_report(two_logs, tmp_path, capsys, value, said):
    plain, _ = two_logs
    edited = tmp_path / "edited.jsonl"  # hand edits an outside tester made: run_end energy_J -5, or "lots"
    records = read_jsonl(plain)
    lines = open(plain, encoding="utf-8").read().splitlines()
    end_line = next(i for i, r in enumerate(records) if r["event"] == "run_end")
    lines[end_line] = json.dumps(dict(records[end_line], energy_J=value))
    edited.write_text("\n".join(lines) + "\n")
    for args in ([str(edited)], [plain, str(edited)], [str(edited), "--csv", str(tmp_path / "csv")]):
        assert main(["report", *args]) == 1, args  # alone, side by side, and with the CSV files
        err = capsys.readouterr().err
        assert f"record {end_line + 1} (run_end)'s {said}" in err and "not to be trusted" in err
    assert main(["report", plain]) == 0  # the log as written passes
