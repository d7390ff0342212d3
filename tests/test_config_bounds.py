"""Configuration values that would crash, hang or escape the log directory are refused with a clear message."""

import math

import pytest

from zeus_callbacks import config as cfg
from zeus_callbacks._distributed import launcher_env_int, launcher_world_size
from zeus_callbacks.config import ConfigError, load_config, parse_config
from zeus_callbacks.reporting import JsonlWriter, file_stem

# (dotted field, bad value, a word the message must contain)
OUT_OF_RANGE = [
    ("power_limit.step_W", 1e-12, "power_limit.step_W"),
    ("sampling.buffer_s", 1e12, "sampling.buffer_s"),
    ("virtual.num_devices", 100_000, "virtual.num_devices"),
    ("batch_size.seed", -1, "batch_size.seed"),
    ("virtual.seed", -5, "virtual.seed"),
    ("batch_size.default_batch_size", 10**20, "batch_size.default_batch_size"),
    ("power_limit.rel_ci", 2.0, "power_limit.rel_ci"),
    ("sampling.energy_counter_period_s", 1e-9, "sampling.energy_counter_period_s"),
    ("power_limit.warmup_s", math.inf, "power_limit.warmup_s"),
    ("virtual.noise_W", math.nan, "virtual.noise_W"),
]


def nested(dotted: str, value):
    section, key = dotted.split(".")
    return {section: {key: value}}


@pytest.mark.parametrize(("field", "value", "word"), OUT_OF_RANGE, ids=[c[0] for c in OUT_OF_RANGE])
def test_out_of_range_values_are_refused_naming_the_field(field, value, word):
    with pytest.raises(ConfigError, match=word):
        parse_config(nested(field, value))


def test_the_defaults_are_inside_every_bound():
    parse_config({})  # every default validates under the new bounds


def test_a_nan_target_is_refused():
    data = {
        "batch_size": {
            "enabled": True,
            "batch_sizes": [8, 16],
            "default_batch_size": 8,
            "target": {"metric": "acc", "value": float("nan")},
        }
    }
    with pytest.raises(ConfigError, match="batch_size.target.value"):
        parse_config(data)


def test_a_batch_size_list_beyond_the_store_integer_is_refused():
    with pytest.raises(ConfigError, match="at most"):
        parse_config({"batch_size": {"batch_sizes": [8, 10**20]}})


@pytest.mark.parametrize("name", ["../../x", "a/b", "a\\b", "..", "", "x" * 201, "bad\nname"])
def test_run_names_that_are_not_a_plain_file_name_are_refused(name):
    with pytest.raises(ConfigError, match="run_name"):
        parse_config({"logging": {"run_name": name}})


def test_a_plain_run_name_is_kept():
    assert parse_config({"logging": {"run_name": "nightly-2026.12.01"}}).logging.run_name == "nightly-2026.12.01"


def test_a_name_from_a_framework_stays_inside_the_log_dir(tmp_path):
    log_dir = tmp_path / "logs"
    writer = JsonlWriter(log_dir, "../../escape/1")
    writer.close()
    assert writer.path.parent == log_dir and writer.path.exists()
    assert file_stem("...") == "run" and "/" not in file_stem("a/b/c")


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path):
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 10):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{','.join([prev] * 12)}]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert len(path.read_bytes()) < 1000  # 12**10 strings once expanded
    with pytest.raises(ConfigError, match="aliases"):
        load_config(path)


def test_a_shared_nested_value_is_not_expanded_in_the_message(tmp_path):
    # under the alias limit, but 8**8 strings when printed in full
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 8):
        lines.append(f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 8)}]")
    path = tmp_path / "nested.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match="a7") as info:
        load_config(path)
    assert len(str(info.value)) < 2000


def test_a_few_aliases_are_still_fine(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("logging: &log {interval_steps: 10}\n")
    assert load_config(path).logging.interval_steps == 10


def test_an_oversized_file_is_refused(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * cfg.MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigError, match="larger than"):
        load_config(path)


def test_long_bad_values_are_truncated_in_the_message():
    with pytest.raises(ConfigError) as info:
        parse_config({"job_id": ["y" * 10_000]})
    assert len(str(info.value)) < 400


@pytest.mark.parametrize("raw", ["abc", "-3", "1.5"])
def test_a_malformed_launcher_variable_is_named(monkeypatch, raw):
    monkeypatch.setenv("WORLD_SIZE", raw)
    with pytest.raises(ConfigError, match="WORLD_SIZE"):
        launcher_world_size()


def test_launcher_variables_read_as_integers(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert launcher_env_int("LOCAL_RANK", 0) == 3 and launcher_world_size() == 1


@pytest.mark.parametrize("variable", ["RANK", "LOCAL_RANK"])
def test_a_malformed_rank_variable_stops_the_session_with_its_name(monkeypatch, variable, tmp_path):
    from zeus_callbacks import EnergySession
    from zeus_callbacks.backends.base import ManualClock
    from zeus_callbacks.backends.virtual import VirtualGPUBackend

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv(variable, "zero")
    backend = VirtualGPUBackend(clock=ManualClock(1000.0), read_only=True)
    with pytest.raises(ConfigError, match=variable):
        session = EnergySession({"backend": "virtual", "logging": {"log_dir": str(tmp_path)}}, backend=backend)
        session.train_start()
    backend.close()
