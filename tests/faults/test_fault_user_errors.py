"""Bad inputs: one clear message naming the problem, and no traceback for a user error.

- every field of the YAML model (generated from the pydantic model) given a value of the
  wrong type, and every section given a scalar: ``validate-config`` exits 1 and names the
  file and exactly that field;
- an unknown key, a missing file, a file that is not a mapping, a file that is not YAML:
  the same, through the installed command in a subprocess (stderr has no "Traceback");
- a store written by a newer schema, a file that is not a store: refused with the file's
  name, left untouched, by the session and by the ``show`` and ``simulate`` commands;
- an unwritable log directory: the session refuses to start, naming the directory.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from tests.timeouts import CHILD_TIMEOUT_S
from zeus_callbacks.cli import main as cli
from zeus_callbacks.config import TargetConfig, ZeusConfig
from zeus_callbacks.session import EnergySession
from zeus_callbacks.store import StoreError, open_store

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = {TargetConfig: {"metric": "val_acc", "value": 0.9}}  # valid values of required fields


def _submodel(annotation) -> type[BaseModel] | None:
    for arg in (annotation, *typing.get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _wrong_value(annotation):
    """A value of the wrong type for ``annotation`` (one pydantic's lax mode cannot coerce)."""
    args = typing.get_args(annotation) or (annotation,)
    origins = {typing.get_origin(a) or a for a in args}
    if _submodel(annotation) is not None:
        return "not-a-section"
    if list in origins and not origins & {int, float}:
        return "not-a-list"
    if typing.Literal in origins:
        return "no-such-choice"
    if bool in origins:
        return "perhaps"
    if origins & {int, float}:
        return "not-a-number"
    return ["a", "list"]  # str, Path


def _field_cases(model: type[BaseModel] = ZeusConfig, prefix: tuple[str, ...] = ()):
    """(dotted path, config dict) for every field and section, each with one wrong-typed value."""
    for name, info in model.model_fields.items():
        path = (*prefix, name)
        sub = _submodel(info.annotation)
        yield ".".join(path), _nest(path, _wrong_value(info.annotation))
        if sub is not None:
            for dotted, data in _field_cases(sub, path):
                yield dotted, _fill_required(sub, path, data)


def _nest(path: tuple[str, ...], value) -> dict:
    for key in reversed(path):
        value = {key: value}
    return value


def _fill_required(model: type[BaseModel], path: tuple[str, ...], data: dict) -> dict:
    node = data
    for key in path:
        node = node[key]
    for name, value in REQUIRED.get(model, {}).items():
        node.setdefault(name, value)
    return data


FIELD_CASES = dict(_field_cases())


def test_the_generator_covers_every_field():
    assert len(FIELD_CASES) > 60
    for section in ("virtual", "sampling", "windows", "logging", "power_limit", "batch_size", "store"):
        fields = ZeusConfig.model_fields[section].annotation.model_fields
        assert {f"{section}.{name}" for name in fields} <= FIELD_CASES.keys()
    assert {"batch_size.target.metric", "batch_size.target.value"} <= FIELD_CASES.keys()


@pytest.mark.parametrize("dotted", list(FIELD_CASES))
def test_every_wrongly_typed_field_is_named(tmp_path, capsys, dotted, record_fault):
    path = tmp_path / "zeus.yaml"
    path.write_text(yaml.safe_dump(FIELD_CASES[dotted]))
    code = cli(["validate-config", str(path)])
    captured = capsys.readouterr()
    err_lines = captured.err.strip().splitlines()
    problems = [line for line in err_lines[1:] if not line.startswith(f"  {dotted}")]
    ok = (
        code == 1
        and err_lines[:1] == [f"invalid zeus-callbacks configuration in {path}:"]
        and len(err_lines) >= 2
        and not problems  # every error line is about this field: one problem, named
        and "Traceback" not in captured.err
    )
    record_fault("bad input: wrong-typed YAML field", ok)
    assert ok, (code, captured.err)


def _command(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "zeus_callbacks.cli", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_file_level_mistakes_through_the_command(tmp_path, record_fault):
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("backend: virtual\npower_limits: {enabled: true}\n")
    listed = tmp_path / "listed.yaml"
    listed.write_text("- backend: virtual\n")
    not_yaml = tmp_path / "broken.yaml"
    not_yaml.write_text("logging: {interval_steps: [1\n")
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("sampling: {poll_period_s: fast}\n")
    missing = tmp_path / "missing.yaml"
    expected = {  # file -> what the one message must say
        unknown: ["power_limits", "Extra inputs are not permitted"],
        listed: ["expected a mapping of settings, got list"],
        not_yaml: ["is not valid YAML"],
        wrong: ["sampling.poll_period_s", "valid number"],
        missing: ["configuration file not found"],
    }
    procs = {path: _command("validate-config", str(path)) for path in expected}
    failures = {}
    for path, proc in procs.items():
        out, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
        ok = (
            proc.returncode == 1
            and str(path) in err
            and all(s in err for s in expected[path])
            and "Traceback" not in err
            and not out
        )
        if not record_fault("bad input: configuration file", ok):
            failures[path.name] = (proc.returncode, err[-1500:])
    assert not failures, failures


def _newer_schema(kind: str, path: Path) -> None:
    with open_store(path, kind) as store:
        store.create_trial("job", 8)
    if kind == "sqlite":
        conn = sqlite3.connect(path)
        conn.execute("UPDATE schema_version SET version = 99")
        conn.commit()
        conn.close()
    else:
        doc = json.loads(path.read_text())
        doc["schema_version"] = 99
        path.write_text(json.dumps(doc))


def _not_a_store(kind: str, path: Path) -> None:
    path.write_bytes(b"PK\x03\x04 this is a zip file, not a store\n")


STORE_FILES = {
    "newer schema": (_newer_schema, "newer than this zeus-callbacks"),
    "not a store": (_not_a_store, "left untouched"),
}


@pytest.mark.parametrize("kind", ["sqlite", "json"])
@pytest.mark.parametrize("what", list(STORE_FILES))
def test_bad_store_file_is_refused_by_the_session(tmp_path, kind, what, record_fault, virtual_backend):
    make, says = STORE_FILES[what]
    path = tmp_path / f"store.{kind}"
    make(kind, path)
    before = path.read_bytes()
    config = {
        "backend": "virtual",
        "logging": {"log_dir": str(tmp_path / "logs"), "run_name": "r"},
        "store": {"backend": kind, "path": str(path)},
        "batch_size": {"enabled": True, "batch_sizes": [8, 16], "default_batch_size": 8},
    }
    session = EnergySession(config, backend=virtual_backend, is_main_process=True)
    with pytest.raises(StoreError) as info:
        session.train_start()
    ok = (
        str(path) in str(info.value)
        and says in str(info.value)
        and path.read_bytes() == before
        and not session.started
        and not any(t.name == "zeus-power-sampler" for t in threading.enumerate())
    )
    record_fault("bad input: store file", ok)
    assert ok, str(info.value)


STORE_COMMANDS = {
    "show": lambda path: ("show", str(path)),
    "simulate": lambda path: (
        "simulate",
        "--gpu",
        "V100",
        "--workload",
        "cifar100",
        "--recurrences",
        "1",
        "--store",
        str(path),
    ),
}


@pytest.mark.parametrize("command", list(STORE_COMMANDS))
@pytest.mark.parametrize("kind", ["sqlite", "json"])
@pytest.mark.parametrize("what", list(STORE_FILES))
def test_bad_store_file_is_refused_by_the_command(tmp_path, command, kind, what, record_fault):
    make, says = STORE_FILES[what]
    path = tmp_path / f"store.{kind}"
    make(kind, path)
    before = path.read_bytes()
    proc = _command(*STORE_COMMANDS[command](path))
    _, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
    ok = (
        proc.returncode not in (0, None)
        and str(path) in err
        and says in err
        and "Traceback" not in err
        and path.read_bytes() == before
    )
    record_fault("bad input: store file", ok)
    assert ok, (proc.returncode, err[-1500:])


def test_unwritable_log_directory_is_named_before_training(tmp_path, record_fault, virtual_backend):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the log directory should be\n")
    log_dir = blocker / "logs"  # unwritable even for root: its parent is a file
    session = EnergySession(
        {"backend": "virtual", "logging": {"log_dir": str(log_dir), "run_name": "r"}},
        backend=virtual_backend,
        is_main_process=True,
    )
    with pytest.raises(OSError) as info:
        session.train_start()
    ok = (
        str(log_dir) in str(info.value)
        and not session.started
        and not any(t.name == "zeus-power-sampler" for t in threading.enumerate())
    )
    record_fault("bad input: unwritable log directory", ok)
    assert ok, str(info.value)


NOT_MARKERS = {  # name -> content (None: a directory); none of these is a restore marker
    "zeus.yaml": b"job_id: precious\nbackend: virtual\n",
    "run.jsonl": b'{"event": "run_start", "run_name": "r"}\n{"event": "run_end", "run_name": "r"}\n',
    "notes.json": b'{"a": 1}\n',
    "bad_limit.json": b'{"pid": 1, "gpus": [{"index": 0, "original_limit_W": "x"}]}\n',
    "torn.json": b'{"pid": 1, "backend": "nvml", "gpus": [{"index": 0, "orig',
    "empty.json": b"",
    "a_directory": None,
}


def _snapshot(path: Path):
    return "dir" if path.is_dir() else path.read_bytes()


@pytest.mark.parametrize("name", list(NOT_MARKERS))
def test_restore_refuses_and_keeps_what_is_not_a_marker(tmp_path, name, record_fault):
    path = tmp_path / name
    if NOT_MARKERS[name] is None:
        path.mkdir()
        (path / "inside.txt").write_text("kept\n")
    else:
        path.write_bytes(NOT_MARKERS[name])
    before = _snapshot(path)
    proc = _command("restore", "--marker", str(path))
    out, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
    messages = [line for line in err.splitlines() if "restore marker" in line]
    ok = (
        proc.returncode == 1
        and path.exists()
        and _snapshot(path) == before
        and len(messages) == 1
        and str(path) in messages[0]
        and "left untouched" in messages[0]
        and "Traceback" not in err
        and "restored" not in out
    )
    record_fault("bad input: restore marker", ok)
    assert ok, (proc.returncode, out, err[-1500:])


ARGUMENT_CASES = {
    "simulate --recurrences -1": ("simulate", "--recurrences", "-1"),
    "simulate --steps-per-epoch 0": ("simulate", "--steps-per-epoch", "0"),
    "simulate --eta-knob 2": ("simulate", "--eta-knob", "2"),
    "simulate --eta-knob nan": ("simulate", "--eta-knob", "nan"),
    "simulate --beta-knob 0": ("simulate", "--beta-knob", "0"),
    "profile-kernel --max-time 0": ("profile-kernel", "matmul", "--max-time", "0", "--backend", "virtual"),
    "profile-kernel --size 0": ("profile-kernel", "matmul", "--size", "0", "--backend", "virtual"),
    "profile-kernel --target-ci 1": ("profile-kernel", "matmul", "--target-ci", "1", "--backend", "virtual"),
}


def test_out_of_range_arguments_are_refused_by_argparse(record_fault):
    procs = {case: _command(*args) for case, args in ARGUMENT_CASES.items()}
    failures = {}
    for case, proc in procs.items():
        out, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
        option = next(a for a in ARGUMENT_CASES[case] if a.startswith("--"))
        last = err.strip().splitlines()[-1] if err.strip() else ""
        # argparse's usage error: status 2, the option named on the last line, nothing run
        ok = proc.returncode == 2 and f"argument {option}: must be" in last and "Traceback" not in err and not out
        if not record_fault("bad input: command-line argument", ok):
            failures[case] = (proc.returncode, err[-800:])
    assert not failures, failures


def _config_cases(tmp_path: Path) -> dict[str, tuple[tuple[str, ...], str]]:
    broken = tmp_path / "broken.yaml"
    broken.write_text("logging: {interval_steps: [1\n")
    jsonl = tmp_path / "short.jsonl"
    jsonl.write_text('{"event": "run_end"}\n')
    folder = tmp_path / "folder"
    folder.mkdir(exist_ok=True)
    missing = tmp_path / "missing.yaml"
    return {  # case -> (command, what the one message must say)
        "restore --config missing": (("restore", "--config", str(missing)), f"not found: {missing}"),
        "restore --config bad YAML": (("restore", "--config", str(broken)), "is not valid YAML"),
        "show DIR": (("show", str(folder)), f"store {folder} is a directory"),
        "simulate --store DIR": (
            ("simulate", "--recurrences", "1", "--store", str(folder)),
            f"store {folder} is a directory",
        ),
    }


def test_runtime_input_errors_are_one_message(tmp_path, record_fault):
    cases = _config_cases(tmp_path)
    procs = {case: _command(*args) for case, (args, _) in cases.items()}
    failures = {}
    for case, proc in procs.items():
        _, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
        says = cases[case][1]
        ok = proc.returncode == 1 and says in err and "Traceback" not in err
        if not record_fault("bad input: command input file", ok):
            failures[case] = (proc.returncode, err[-1500:])
    assert not failures, failures


def _wal_store(path: Path) -> None:
    with open_store(path, "sqlite") as store:
        store.create_trial("job", 8)


READ_ONLY_CASES = {  # name -> how the file is made, and whether `show` must accept it
    "empty file": (lambda p: p.write_bytes(b""), False),
    "sqlite store": (_wal_store, True),
    "read-only sqlite store": (lambda p: (_wal_store(p), p.chmod(0o444)), True),
}


@pytest.mark.parametrize("what", list(READ_ONLY_CASES))
@pytest.mark.parametrize("command", ["show", "plot bandit"])
def test_reading_commands_never_write_the_store(tmp_path, what, command, record_fault):
    make, is_store = READ_ONLY_CASES[what]
    folder = tmp_path / "stores"
    folder.mkdir()
    path = folder / "zeus.db"
    make(path)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    args = (
        ("show", str(path))
        if command == "show"
        else ("plot", "bandit", str(path), "job", "-o", str(tmp_path / "bandit.png"))
    )
    proc = _command(*args)
    _, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
    after = {p.name: p.read_bytes() for p in folder.iterdir()}
    # show: 0 on a store; plot bandit: 1 (the trial never finished); both 1 on what is not a store
    expected = (0 if command == "show" else 1) if is_store else 1
    ok = proc.returncode == expected and after == before and "Traceback" not in err
    if not is_store:
        ok = ok and f"{path} is an empty file, not a zeus-callbacks store" in err
    record_fault("bad input: store file", ok)
    assert ok, (proc.returncode, sorted(after), err[-1500:])
