"""Reading a YAML configuration file safely: PyYAML's safe loader, a size cap, no repeated key, no alias bomb.

What the file says is checked elsewhere (:func:`zeus_callbacks.config.parse_config`); this module
only turns a file into plain data, or a :class:`~zeus_callbacks.errors.ConfigError` naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from zeus_callbacks.errors import ConfigError

MAX_YAML_ALIASES = 100  # a real configuration uses a handful; an alias bomb uses thousands
MAX_CONFIG_BYTES = 1 << 20


class _DuplicateKey(yaml.constructor.ConstructorError):
    """A YAML mapping gives the same key twice (lines are 1-based)."""

    def __init__(self, key: Any, line: int, first_line: int) -> None:
        super().__init__(problem=f"duplicate key {key!r}")
        self.key, self.line, self.first_line = key, line, first_line


class _TooManyAliases(yaml.YAMLError):
    """A YAML document uses more aliases than any configuration needs (an alias bomb)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key repeated in one mapping is an error.

    ``yaml.safe_load`` keeps the last of two equal keys, so a second ``logging:`` section
    would silently replace the first. Merge keys (``<<: *anchor``) may still be overridden.
    """

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        """Compose the next node, counting aliases (``*anchor``): more than ``MAX_YAML_ALIASES`` is an alias bomb."""
        if self.check_event(yaml.AliasEvent):
            self._aliases = getattr(self, "_aliases", 0) + 1
            if self._aliases > MAX_YAML_ALIASES:
                raise _TooManyAliases()
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """Construct the mapping after checking that no key is given twice (else :class:`_DuplicateKey`)."""
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:  # an unhashable key: the base constructor reports it
                continue
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise _DuplicateKey(key, line, first_line[key])
            first_line[key] = line
        return super().construct_mapping(node, deep=deep)


def read_yaml_file(path: str | Path) -> Any:
    """The plain data of a YAML file (None for an empty file), read with :class:`_UniqueKeyLoader`.

    Raises:
        ConfigError: The file is missing, unreadable, larger than ``MAX_CONFIG_BYTES``, not UTF-8,
            not YAML, repeats a key, or uses more than ``MAX_YAML_ALIASES`` aliases; names the file.
    """
    path = Path(path)
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes: not a zeus-callbacks configuration")
        with path.open(encoding="utf-8") as stream:  # a stream: PyYAML's errors then name the file
            data = yaml.load(stream, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: safe
    except FileNotFoundError:
        raise ConfigError(f"zeus-callbacks configuration file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read zeus-callbacks configuration {path}: {exc.strerror}") from None
    except UnicodeError:
        raise ConfigError(f"{path} is not a text (UTF-8) YAML file") from None
    except _DuplicateKey as exc:
        raise ConfigError(
            f"{path}: line {exc.line}: duplicate key {exc.key!r} (already given at line {exc.first_line}); "
            "give each key once"
        ) from None
    except _TooManyAliases:
        raise ConfigError(
            f"{path} uses more than {MAX_YAML_ALIASES} YAML aliases (*name); write the values out"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    return data
