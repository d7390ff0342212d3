"""Every error the package raises on purpose has one root and keeps its old builtin base."""

import pytest

from zeus_callbacks import errors
from zeus_callbacks.backends import base as backend_base
from zeus_callbacks.config import ConfigError, load_config
from zeus_callbacks.store import _base as store_base

OLD_BASES = {
    errors.ConfigError: ValueError,
    errors.NotAnEnergyLog: ValueError,
    errors.NotAProfile: ValueError,
    errors.NotAMarker: ValueError,
    errors.NothingToPlot: ValueError,
    errors.TraceFormatError: ValueError,
    errors.UnsafeFile: PermissionError,
    errors.EnergyLogError: OSError,  # JsonlWriter raised a plain OSError before it
    errors.CallOrderError: RuntimeError,
    errors.BackendError: RuntimeError,
    errors.BackendUnavailable: RuntimeError,
    errors.SensorError: RuntimeError,
    errors.NotSupported: RuntimeError,
    errors.PermissionDenied: RuntimeError,
    errors.ReadOnlyError: RuntimeError,
    errors.StoreError: RuntimeError,
    errors.StoreCorruptError: RuntimeError,
    errors.StoreSchemaError: RuntimeError,
    errors.StoreUnavailableError: RuntimeError,
    errors.StoreLockedError: RuntimeError,
    errors.StoreFullError: RuntimeError,
    errors.StorePermissionError: RuntimeError,
    errors.StoreValueError: ValueError,
}


@pytest.mark.parametrize("error", list(OLD_BASES), ids=lambda e: e.__name__)
def test_every_error_has_the_root_and_its_old_base(error):
    assert issubclass(error, errors.ZeusCallbacksError)
    assert issubclass(error, OLD_BASES[error])


def test_every_error_class_in_the_module_is_listed():
    defined = {v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, Exception)}
    assert defined - {errors.ZeusCallbacksError} == set(OLD_BASES)


def test_old_import_paths_are_the_same_classes():
    from zeus_callbacks.measurement.kernel_profiler import NotAProfile
    from zeus_callbacks.optimizers.power_limit import NotAMarker
    from zeus_callbacks.reporting import NotAnEnergyLog

    assert backend_base.SensorError is errors.SensorError
    assert backend_base.ReadOnlyError is errors.ReadOnlyError
    assert store_base.StoreCorruptError is errors.StoreCorruptError
    assert (NotAProfile, NotAMarker, NotAnEnergyLog, ConfigError) == (
        errors.NotAProfile,
        errors.NotAMarker,
        errors.NotAnEnergyLog,
        errors.ConfigError,
    )


def test_a_bad_config_is_caught_by_the_root(tmp_path):
    path = tmp_path / "zeus.yaml"
    path.write_text("no_such_key: 1\n")
    with pytest.raises(errors.ZeusCallbacksError, match="no_such_key"):
        load_config(path)


def test_sensor_error_keeps_its_kind():
    exc = errors.SensorError("GPU 0 is lost", kind="gpu_lost")
    assert exc.kind == "gpu_lost" and str(exc) == "GPU 0 is lost"
