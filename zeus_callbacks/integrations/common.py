"""What both framework adapters share: turning their ``config`` argument into a ZeusConfig."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zeus_callbacks.config import ZeusConfig, load_config, parse_config


def resolve_config(config: ZeusConfig | dict[str, Any] | str | Path | None) -> ZeusConfig:
    """Accept a ZeusConfig, a mapping of settings, a YAML path, or None (defaults).

    Raises:
        ConfigError: The file or the settings are invalid.
    """
    if isinstance(config, (str, Path)):
        return load_config(config)
    return parse_config(config)
