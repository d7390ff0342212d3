"""Tests of the YAML configuration: unknown keys, types, ranges and file errors."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from zeus_callbacks.config import ConfigError, ZeusConfig, load_config, parse_config, setting_warnings
from zeus_callbacks.store import open_configured_store

# Every nested section of the config, found from the model itself so a new section is covered too.
SECTIONS = sorted(
    name
    for name, info in ZeusConfig.model_fields.items()
    if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)
)


def write_yaml(directory: Path, text: str, name: str = "zeus.yaml") -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def config_error(data) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value


def test_sections_are_discovered():
    assert {"virtual", "sampling", "windows", "logging", "power_limit", "batch_size", "store"} <= set(SECTIONS)


@pytest.mark.parametrize("section", SECTIONS)
def test_unknown_key_in_every_section_names_its_dotted_path(tmp_path, section):
    path = write_yaml(tmp_path, yaml.safe_dump({section: {"no_such_setting": 1}}))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert f"{section}.no_such_setting" in message
    assert str(path) in message


def test_unknown_top_level_key_is_named():
    assert "no_such_setting" in str(config_error({"no_such_setting": True}))


def test_a_typo_of_a_real_key_suggests_the_field(tmp_path):
    path = write_yaml(tmp_path, "windows:\n  sample_fracton: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "windows.sample_fracton" in str(info.value)
    assert "did you mean 'sample_fraction'" in str(info.value)


@pytest.mark.parametrize(
    ("data", "suggestion"),
    [
        ({"loging": {}}, "did you mean 'logging'"),  # a top-level section
        ({"batch_size": {"target": {"metrc": "acc", "value": 1}}}, "did you mean 'metric'"),  # behind "| None"
    ],
)
def test_suggestions_look_in_the_right_section(data, suggestion):
    assert suggestion in str(config_error(data))


def test_no_suggestion_for_a_key_like_no_field():
    message = str(config_error({"windows": {"zzzz": 1}}))
    assert "windows.zzzz" in message
    assert "did you mean" not in message


def test_typo_of_a_real_key_is_reported_not_ignored():
    message = str(config_error({"logging": {"interval_step": 5}}))
    assert "logging.interval_step" in message
    assert "logging.interval_steps" not in message


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"logging": {"interval_steps": "often"}}, "logging.interval_steps"),
        ({"virtual": {"noise_W": "loud"}}, "virtual.noise_W"),
        ({"windows": {"step": "sometimes"}}, "windows.step"),
        ({"backend": "cuda"}, "backend"),
        ({"virtual": {"gpu": "H100"}}, "virtual.gpu"),
        ({"store": {"backend": "postgres"}}, "store.backend"),
        ({"gpu_indices": "zero"}, "gpu_indices"),
        ({"logging": 5}, "logging"),
    ],
)
def test_wrong_types_name_the_field(data, path):
    message = str(config_error(data))
    assert f"  {path}:" in message


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"logging": {"interval_steps": 0}}, "logging.interval_steps"),
        ({"virtual": {"noise_W": -0.5}}, "virtual.noise_W"),
        ({"virtual": {"num_devices": 0}}, "virtual.num_devices"),
        ({"virtual": {"sample_period_s": 0}}, "virtual.sample_period_s"),
        ({"sampling": {"poll_period_s": 0}}, "sampling.poll_period_s"),
        ({"sampling": {"poll_period_s": 2.5}}, "sampling.poll_period_s"),
        ({"sampling": {"buffer_s": -1}}, "sampling.buffer_s"),
        ({"windows": {"sensor_delay_s": -0.01}}, "windows.sensor_delay_s"),
        ({"job_id": ""}, "job_id"),
        ({"gpu_indices": []}, "gpu_indices"),
        ({"gpu_indices": [0, 1, 0]}, "gpu_indices"),
        ({"gpu_indices": [-1]}, "gpu_indices"),
    ],
)
def test_out_of_range_values_name_the_field(data, path):
    message = str(config_error(data))
    assert f"  {path}:" in message


def test_every_bad_field_is_listed():
    message = str(config_error({"logging": {"interval_steps": 0}, "virtual": {"noise_W": -1}}))
    assert "logging.interval_steps" in message
    assert "virtual.noise_W" in message


def test_valid_settings_are_kept(tmp_path):
    settings = {
        "backend": "virtual",
        "gpu_indices": [1, 0],
        "logging": {"interval_steps": 7, "log_dir": str(tmp_path / "logs")},
        "virtual": {"num_devices": 2, "noise_W": 0.0},
    }
    cfg = load_config(write_yaml(tmp_path, yaml.safe_dump(settings)))
    assert cfg.backend == settings["backend"]
    assert cfg.gpu_indices == settings["gpu_indices"]
    assert cfg.logging.interval_steps == settings["logging"]["interval_steps"]
    assert cfg.logging.log_dir == Path(settings["logging"]["log_dir"])
    assert cfg.virtual.num_devices == settings["virtual"]["num_devices"]


def test_missing_file_names_the_file(tmp_path):
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read a file whatever its mode")
def test_unreadable_file_names_the_file(tmp_path):
    path = write_yaml(tmp_path, "job_id: secret\n")
    path.chmod(0)
    try:
        with pytest.raises(ConfigError) as info:
            load_config(path)
    finally:
        path.chmod(0o600)
    assert str(path) in str(info.value)


def test_directory_instead_of_file_is_a_config_error(tmp_path):
    # Unreadable even for root: reading a directory fails with an OSError.
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_not_yaml_names_the_file(tmp_path):
    path = write_yaml(tmp_path, "logging: [1, 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert info.value.__cause__ is None


def test_yaml_list_is_not_a_mapping(tmp_path):
    path = write_yaml(tmp_path, "- backend\n- virtual\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert str(path) in message
    assert "mapping" in message
    assert "list" in message


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n"])
def test_empty_file_gives_defaults(tmp_path, text):
    assert load_config(write_yaml(tmp_path, text)) == ZeusConfig()


def test_none_and_config_pass_through():
    assert parse_config(None) == ZeusConfig()
    cfg = ZeusConfig(job_id="kept")
    assert parse_config(cfg) is cfg


@pytest.mark.parametrize(
    ("section", "key", "text"),
    [
        ("virtual", "noise_W", "1e-5"),
        ("windows", "sensor_delay_s", "2e-2"),
        ("sampling", "poll_period_s", "5E-2"),
    ],
)
def test_exponent_strings_are_coerced_for_float_fields(tmp_path, section, key, text):
    yaml_text = f"{section}:\n  {key}: {text}\n"
    # The premise: PyYAML (YAML 1.1) reads these as strings, not floats.
    assert isinstance(yaml.safe_load(yaml_text)[section][key], str)
    cfg = load_config(write_yaml(tmp_path, yaml_text))
    value = getattr(getattr(cfg, section), key)
    assert isinstance(value, float)
    assert value == float(text)


def test_messages_carry_no_traceback_or_pydantic_chain():
    error = config_error({"logging": {"interval_steps": 0, "bogus": 1}})
    message = str(error)
    assert error.__cause__ is None
    assert error.__suppress_context__
    assert "Traceback" not in message
    assert "errors.pydantic.dev" not in message
    assert "ValidationError" not in message


def test_config_error_is_a_value_error():
    assert isinstance(config_error({"backend": 3}), ValueError)


def test_yaml_numbers_and_dates_for_text_fields_suggest_quoting(tmp_path):
    path = tmp_path / "zeus.yaml"
    path.write_text("job_id: 123\nlogging: {run_name: 2024-01-01}\ngpu_indices: [0, 0]\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    lines = str(info.value).splitlines()
    assert '  job_id: Input should be a valid string (got 123); quote it in the YAML file: job_id: "123"' in lines
    assert any(
        line.startswith("  logging.run_name:") and "(got 2024-01-01)" in line and 'run_name: "2024-01-01"' in line
        for line in lines
    )
    assert "  gpu_indices: Value error, must be distinct non-negative indices (got [0, 0])" in lines
    assert "datetime" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "key", "line", "first_line"),
    [
        ("logging:\n  interval_steps: 10\nbackend: virtual\nlogging:\n  jsonl: false\n", "logging", 4, 1),
        ("logging:\n  interval_steps: 10\n  jsonl: false\n  interval_steps: 20\n", "interval_steps", 4, 2),
        ("virtual: {gpu: A40, gpu: V100}\n", "gpu", 1, 1),
    ],
)
def test_a_repeated_key_is_refused_with_its_line(tmp_path, text, key, line, first_line):
    path = write_yaml(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: line {line}: duplicate key {key!r} (already given at line {first_line}); give each key once"
    )
    assert info.value.__cause__ is None


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    # "<<: *anchor" followed by one of the merged keys is an override, not a repeated key.
    text = "power_limit: &shared {enabled: false, eta_knob: 0.3}\nbatch_size:\n  <<: *shared\n  eta_knob: 0.7\n"
    cfg = load_config(write_yaml(tmp_path, text))
    assert (cfg.power_limit.eta_knob, cfg.batch_size.eta_knob) == (0.3, 0.7)


@pytest.mark.parametrize(("written", "shown"), [("2", "2"), ("0.0001", "0.0001"), ("-1", "-1")])
def test_an_out_of_range_sample_fraction_shows_the_value_once(tmp_path, written, shown):
    path = write_yaml(tmp_path, f"windows: {{sample_fraction: {written}}}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).splitlines() == [
        f"invalid zeus-callbacks configuration in {path}:",
        f"  windows.sample_fraction: Value error, sample_fraction must be 'auto' or a number in [0.001, 1] "
        f"(got {shown})",
    ]


def test_a_json_store_path_opens_a_json_store(tmp_path, capsys):
    # store.path: x.json with no backend wrote a SQLite file under the .json name; show called it broken JSON.
    import json

    from zeus_callbacks.cli import main as cli

    config = parse_config({"store": {"path": str(tmp_path / "s.json")}})
    with open_configured_store(config.store, tmp_path) as store:
        store.ensure_job("j")
    assert json.loads((tmp_path / "s.json").read_text())  # the file is JSON, readable by eye
    assert cli(["show", str(tmp_path / "s.json")]) == 0 and "job j" in capsys.readouterr().out
    # An explicit backend still wins over the suffix; other suffixes stay SQLite.
    assert parse_config({"store": {"path": "s.json", "backend": "sqlite"}}).store.backend == "sqlite"
    assert parse_config({"store": {"path": "s.db"}}).store.backend == "sqlite"
    # The choice survives a dump and reload (a checkpoint's saved configuration).
    assert parse_config(config.model_dump(mode="json")).store.backend == "json"


def test_max_overhead_beside_a_numeric_sample_fraction_is_a_setting_warning(tmp_path, caplog):
    # Issue 26: windows.max_overhead is auto sampling's budget; beside sample_fraction: 0.5 it did nothing, silently.
    path = write_yaml(tmp_path, "windows: {sample_fraction: 0.5, max_overhead: 0.01}\n")
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks.config"):
        config = load_config(path)
    (message,) = setting_warnings(config)
    assert "windows.max_overhead has no effect" in message and "windows.sample_fraction is 0.5" in message
    assert [r.getMessage() for r in caplog.records] == [f"zeus-callbacks: {path}: {message}"]
    caplog.clear()
    # Either key alone does what it says, and a dump read back (the HF callback's saved state) adds nothing.
    fraction_only = parse_config({"windows": {"sample_fraction": 0.5}})
    assert (
        setting_warnings(fraction_only) == setting_warnings(parse_config(fraction_only.model_dump(mode="json"))) == []
    )
    assert setting_warnings(parse_config({"windows": {"max_overhead": 0.01}})) == []
    assert not caplog.records
