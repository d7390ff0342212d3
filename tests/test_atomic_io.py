"""The one atomic JSON writer: all or nothing, and no temp file left behind on failure."""

import json

import pytest

from zeus_callbacks._atomic_io import write_json_atomic


def test_writes_and_replaces(tmp_path):
    path = tmp_path / "sub" / "state.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "state.json"
    write_json_atomic(path, {"a": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": object()})  # not JSON-serialisable, fails mid-dump
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_a_failed_rename_keeps_the_old_file_and_leaves_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    write_json_atomic(path, {"a": 1})

    def refuse(src, dst):  # a full disk or a vanished directory at the last moment
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("zeus_callbacks._atomic_io.os.replace", refuse)
    with pytest.raises(OSError):
        write_json_atomic(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_the_json_store_writes_through_the_shared_writer(tmp_path, monkeypatch):
    import json

    from zeus_callbacks import _atomic_io as atomic_io
    from zeus_callbacks.store import open_store

    writes = []
    real = atomic_io.atomic_output

    def spy(path, *args, **kw):
        writes.append(path)
        return real(path, *args, **kw)

    monkeypatch.setattr("zeus_callbacks.store._json_store.atomic_output", spy)
    path = tmp_path / "zeus_store.json"
    with open_store(path) as store:
        store.create_trial("job", 32, None)
    assert writes and all(str(p) == str(path) for p in writes)
    text = path.read_text()
    doc = json.loads(text)  # one record a line, and valid JSON
    (trial_line,) = [line for line in text.splitlines() if '"trial_id": 1' in line]
    assert json.loads(trial_line.strip().rstrip(",")) == doc["trials"][0]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
