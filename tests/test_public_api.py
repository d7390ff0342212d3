"""Every public name imports from where users (docs, examples) import it, as the same kind.

The list is explicit on purpose: moving code between modules must keep these import paths
working (a re-export is enough), and a move that drops one fails here. New public names may
be added freely; add them to the table to keep them.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

import zeus_callbacks

EXCEPTION, CLASS, FUNCTION, MODULE, CONSTANT = "exception", "class", "function", "module", "constant"

PUBLIC: dict[str, dict[str, str]] = {
    "zeus_callbacks": {
        "ConfigError": EXCEPTION, "Decision": CLASS, "EnergySession": CLASS, "RunSummary": CLASS,
        "ZeusCallback": CLASS, "ZeusConfig": CLASS, "ZeusTrainerCallback": CLASS,
        "get_backend": FUNCTION, "load_config": FUNCTION, "suggest_batch_size": FUNCTION,
        "measure": FUNCTION, "Measurement": CLASS, "CallOrderError": EXCEPTION,
    },
    "zeus_callbacks.session": {"EnergySession": CLASS, "Decision": CLASS, "default_gpu_indices": FUNCTION},
    "zeus_callbacks.config": {
        "ConfigError": EXCEPTION, "ZeusConfig": CLASS, "VirtualGPUConfig": CLASS, "SamplingConfig": CLASS,
        "WindowsConfig": CLASS, "LoggingConfig": CLASS, "PowerLimitConfig": CLASS, "TargetConfig": CLASS,
        "BatchSizeConfig": CLASS, "StoreConfig": CLASS, "parse_config": FUNCTION, "load_config": FUNCTION,
        "MAX_CONFIG_BYTES": CONSTANT, "MAX_YAML_ALIASES": CONSTANT,  # re-exported from yaml_file
    },
    "zeus_callbacks.backends": {
        "BackendError": EXCEPTION, "BackendUnavailable": EXCEPTION, "NotSupported": EXCEPTION,
        "PermissionDenied": EXCEPTION, "ReadOnlyError": EXCEPTION, "SensorError": EXCEPTION,
        "Clock": CLASS, "GPUBackend": CLASS, "ManualClock": CLASS, "PowerSample": CLASS, "WallClock": CLASS,
        "get_backend": FUNCTION, "read_only_from_env": FUNCTION,
    },
    "zeus_callbacks.backends.base": {"GPUBackend": CLASS, "ManualClock": CLASS, "WallClock": CLASS},
    "zeus_callbacks.backends.virtual": {"VirtualGPUBackend": CLASS},
    "zeus_callbacks.backends.traces": {
        "normalize_gpu": FUNCTION, "get_workload": FUNCTION, "power_curve": FUNCTION,
        "available_batch_sizes": FUNCTION, "default_batch_size": FUNCTION, "time_per_epoch_s_at": FUNCTION,
        "epoch_energy_J_at": FUNCTION, "average_power_W_at": FUNCTION, "load_train_trace": FUNCTION,
    },
    "zeus_callbacks.store": {
        "SCHEMA_VERSION": CONSTANT, "BanditState": CLASS, "JobRecord": CLASS, "Store": CLASS,
        "StoreCorruptError": EXCEPTION, "StoreError": EXCEPTION, "StoreSchemaError": EXCEPTION,
        "TrialRecord": CLASS, "open_store": FUNCTION, "store_location": FUNCTION,
    },
    "zeus_callbacks.store.profile_cache": {"StoreProfileCache": CLASS},
    "zeus_callbacks.reporting": {
        "RunSummary": CLASS, "JsonlWriter": CLASS, "NotAnEnergyLog": EXCEPTION, "read_jsonl": FUNCTION,
        "window_energy_key": FUNCTION, "phase_key": FUNCTION, "gpu_energy_key": FUNCTION, "is_own_metric": FUNCTION,
        "STEP_ENERGY_J": CONSTANT, "EPOCH_ENERGY_J": CONSTANT, "TOTAL_ENERGY_J": CONSTANT, "POWER_LIMIT_W": CONSTANT,
    },
    "zeus_callbacks.simulate": {
        "Recurrence": CLASS, "simulate": FUNCTION, "training_paths": FUNCTION, "epoch_cost": FUNCTION,
        "best_power_limit_W": FUNCTION, "real_steps_per_epoch": FUNCTION, "format_recurrences": FUNCTION,
        "main": FUNCTION,
    },
    "zeus_callbacks.measurement.kernel_profiler": {"profile": FUNCTION, "isolated_gap_s": FUNCTION},
    "zeus_callbacks.measurement.finegrain": {"differentiate": FUNCTION, "superpose": FUNCTION},
    "zeus_callbacks.optimizers.cost": {"ZeusCost": CLASS},
    "zeus_callbacks.optimizers.batch_size": {
        "BanditPhase": CLASS, "BanditSettings": CLASS, "ArmPosterior": CLASS, "Suggestion": CLASS,
        "BatchSizeBandit": CLASS, "prior_from_costs": FUNCTION, "gaussian_posterior": FUNCTION,
        "gaussian_tail_mean": FUNCTION, "pooled_relative_variance": FUNCTION, "eliminate_arms": FUNCTION,
        "satisficing_choice": FUNCTION, "observation_weights": FUNCTION, "scaled_learning_rate": FUNCTION,
        "suggest_batch_size": FUNCTION, "BatchSizeController": CLASS, "EarlyStopRule": CLASS,
        "SuggestedBatchSize": CLASS,
    },
    "zeus_callbacks.optimizers.power_limit": {
        "Objective": CLASS, "LimitProfile": CLASS, "ProfilerPhase": CLASS, "ProfilerState": CLASS,
        "ProfileSettings": CLASS,
        "PowerLimitProfiler": CLASS, "ProfileKey": CLASS, "ProfileCache": CLASS, "JsonProfileCache": CLASS,
        "NotAMarker": EXCEPTION, "RestoreMarker": CLASS, "PowerLimitResult": CLASS, "PowerLimitController": CLASS,
        "power_limit_grid_W": FUNCTION, "is_unimodal": FUNCTION, "write_marker": FUNCTION, "marker_path": FUNCTION,
        "read_marker": FUNCTION, "restore_from_marker": FUNCTION, "RestoreOutcome": CLASS, "GpuRestore": CLASS,
        "MarkerGpu": CLASS, "GpuLock": CLASS, "Owner": CLASS,
    },
    "zeus_callbacks.errors": {
        "ZeusCallbacksError": EXCEPTION, "NothingToPlot": EXCEPTION, "TraceFormatError": EXCEPTION,
        "UnsafeFile": EXCEPTION, "StoreUnavailableError": EXCEPTION,
    },  # fmt: skip
    "zeus_callbacks.integrations.lightning": {"ZeusCallback": CLASS},
    "zeus_callbacks.integrations.huggingface": {"ZeusTrainerCallback": CLASS},
    "zeus_callbacks.cli": {"main": FUNCTION},
}  # fmt: skip

CASES = [(module, name, kind) for module, names in PUBLIC.items() for name, kind in names.items()]


def kind_of(value: object) -> str:
    if inspect.ismodule(value):
        return MODULE
    if inspect.isclass(value):
        return EXCEPTION if issubclass(value, BaseException) else CLASS
    if callable(value):  # functions, and wrapped ones (functools.lru_cache)
        return FUNCTION
    return CONSTANT


@pytest.mark.parametrize(("module", "name", "kind"), CASES, ids=[f"{m}.{n}" for m, n, _ in CASES])
def test_public_name_imports_as_its_kind(module, name, kind):
    value = getattr(importlib.import_module(module), name)
    assert kind_of(value) == kind


def test_top_level_all_keeps_every_listed_name_and_each_resolves():
    assert set(PUBLIC["zeus_callbacks"]) <= set(zeus_callbacks.__all__)
    for name in zeus_callbacks.__all__:
        assert getattr(zeus_callbacks, name) is not None


def test_top_level_names_are_the_submodules_objects():
    from zeus_callbacks.config import ZeusConfig
    from zeus_callbacks.integrations.lightning import ZeusCallback
    from zeus_callbacks.session import EnergySession

    assert zeus_callbacks.EnergySession is EnergySession
    assert zeus_callbacks.ZeusConfig is ZeusConfig
    assert zeus_callbacks.ZeusCallback is ZeusCallback


def test_config_errors_stay_value_errors():
    # Old `except ValueError` clauses keep catching them, whatever error root is added above.
    assert issubclass(zeus_callbacks.ConfigError, ValueError)
    with pytest.raises(ValueError):
        zeus_callbacks.ZeusConfig.model_validate({"logging": {"interval_step": 1}})  # pydantic's, a ValueError
    with pytest.raises(zeus_callbacks.ConfigError):
        zeus_callbacks.EnergySession({"logging": {"interval_step": 1}})
