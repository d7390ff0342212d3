"""What the adapters (Lightning, Hugging Face, ``measure()``) share: configuration, the session per run, policies.

The adapters themselves only translate hooks.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, TypeVar

from zeus_callbacks.backends.base import GPUBackend
from zeus_callbacks.config import ZeusConfig, load_config, parse_config
from zeus_callbacks.reporting import RunSummary
from zeus_callbacks.session import EnergySession

logger = logging.getLogger(__name__)

AdapterT = TypeVar("AdapterT", bound="SessionAdapter")

ConfigArg = ZeusConfig | dict[str, Any] | str | Path | None
"""What an adapter's ``config`` argument may be."""


def resolve_config(config: ConfigArg) -> ZeusConfig:
    """Accept a ZeusConfig, a mapping of settings, a YAML path, or None (defaults).

    Raises:
        ConfigError: The file or the settings are invalid.
    """
    return load_config(config) if isinstance(config, (str, Path)) else parse_config(config)


class SessionAdapter:
    """The framework-independent part of a callback: its configuration and the session of each run.

    Arguments, errors and attributes: as the adapters document them (``ZeusCallback``, ...).
    """

    def __init__(self, config: ConfigArg = None, backend: GPUBackend | None = None) -> None:
        self.config = resolve_config(config)
        self._backend = backend
        self.session = EnergySession(self.config, backend=backend)
        self.summary: RunSummary | None = None

    @classmethod
    def from_yaml(cls: type[AdapterT], path: str | Path, **kwargs: Any) -> AdapterT:
        """Build the callback from a YAML file (see ``docs/configuration.md``).

        Raises:
            ConfigError: The file is missing or invalid.
        """
        return cls(load_config(path), **kwargs)

    def _new_session(self, *, is_main_process: bool | None, device_index: int | None) -> EnergySession:
        """A fresh session for a run (a checkpoint restore then loads its totals); forgets the last summary.

        ``is_main_process`` None: the session decides (``RANK`` is 0).
        """
        self.session = EnergySession(
            self.config, backend=self._backend, is_main_process=is_main_process, device_index=device_index
        )
        self.summary = None
        return self.session

    def _run_name(self, framework_name: str | None) -> str | None:
        """The run's name: ``logging.run_name`` if set, else the framework's name for the run (or None)."""
        return self.config.logging.run_name or framework_name

    def _use_batch_size(self, suggested: int | None, used: int, what: str, advice: str) -> None:
        """The framework trains at ``used``: if the bandit ``suggested`` another size, warn; record the trial there.

        ``what`` names the framework's setting in the warning, ``advice`` ends it (why it differs, what to do).
        """
        if suggested is not None and used != suggested:
            logger.warning("zeus-callbacks: %s is %d, not the suggested %d%s %d", what, used, suggested, advice, used)
            self.session.use_batch_size(used)
