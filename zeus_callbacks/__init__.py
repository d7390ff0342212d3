"""zeus-callbacks: GPU energy as a first-class training metric.

Public API:
    ZeusCallback: PyTorch Lightning callback (needs ``lightning``).
    ZeusTrainerCallback: Hugging Face ``transformers.Trainer`` callback (needs ``transformers``).
    EnergySession: the framework-free controller both use.
    measure: a raw PyTorch or Fabric loop's energy, as a context manager or a decorator.
    ZeusConfig, load_config: the YAML configuration.
    get_backend: open a GPU backend (``auto``, ``nvml``, ``amdsmi``, ``virtual``).
    suggest_batch_size: the batch-size bandit's choice for this recurrence (before data loaders exist).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from zeus_callbacks._version import __version__ as __version__
from zeus_callbacks.backends import get_backend
from zeus_callbacks.config import ZeusConfig, load_config
from zeus_callbacks.errors import CallOrderError, ConfigError, ZeusCallbacksError
from zeus_callbacks.integrations._loop import Measurement, measure
from zeus_callbacks.optimizers.batch_size import suggest_batch_size
from zeus_callbacks.reporting import RunSummary
from zeus_callbacks.session import Decision, EnergySession

if TYPE_CHECKING:
    from zeus_callbacks.integrations.huggingface import ZeusTrainerCallback
    from zeus_callbacks.integrations.lightning import ZeusCallback


__all__ = [
    "CallOrderError",
    "ConfigError",
    "ZeusCallbacksError",
    "Decision",
    "EnergySession",
    "Measurement",
    "RunSummary",
    "ZeusCallback",
    "ZeusConfig",
    "ZeusTrainerCallback",
    "get_backend",
    "load_config",
    "measure",
    "suggest_batch_size",
]


def __getattr__(name: str) -> Any:
    # The adapters import their framework; load them only when asked for.
    adapters = {
        "ZeusCallback": ("zeus_callbacks.integrations.lightning", "PyTorch Lightning", "lightning"),
        "ZeusTrainerCallback": ("zeus_callbacks.integrations.huggingface", "Hugging Face transformers", "hf"),
    }
    if name in adapters:
        module_name, framework, extra = adapters[name]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise ImportError(
                f"{name} needs {framework} ({exc.name} is not installed): pip install 'zeus-callbacks[{extra}]'"
            ) from exc
        return getattr(module, name)
    raise AttributeError(f"module 'zeus_callbacks' has no attribute {name!r}")
