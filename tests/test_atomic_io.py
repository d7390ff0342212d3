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


def test_sort_keys_orders_the_written_object(tmp_path):
    path = tmp_path / "store.json"
    write_json_atomic(path, {"b": 1, "a": {"d": 2, "c": 3}}, sort_keys=True)
    text = path.read_text()
    assert text.index('"a"') < text.index('"b"') and text.index('"c"') < text.index('"d"')
    assert json.loads(text) == {"a": {"c": 3, "d": 2}, "b": 1}


def test_the_json_store_writes_through_the_shared_writer(tmp_path, monkeypatch):
    from zeus_callbacks import _atomic_io as atomic_io
    from zeus_callbacks.store import open_store

    writes = []
    real = atomic_io.write_json_atomic

    def spy(path, data, **kw):
        writes.append((path, kw))
        real(path, data, **kw)

    monkeypatch.setattr("zeus_callbacks.store._json_store.write_json_atomic", spy)
    with open_store(tmp_path / "zeus_store.json") as store:
        store.create_trial("job", 32, None)
    assert writes and all(kw == {"sort_keys": True} for _, kw in writes)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
