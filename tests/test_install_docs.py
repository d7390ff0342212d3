"""The install lines in README and docs work as written: each extra brings what the commands after it import.

No new venv is built here (no network on the test machines): instead each documented command's
Python file is parsed for its imports, and every third-party module must come from a
distribution the documented extra requires (resolved through pyproject.toml, extras of extras
included). ``torch`` is installed by the command itself (README) or by the user for their CUDA.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (3.10 would need tomli)

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    """The distribution a requirement names, normalised (``jsonargparse[signatures]>=4`` -> ``jsonargparse``)."""
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def extra_distributions(extra: str) -> set[str]:
    """Every distribution ``pip install '.[extra]'`` installs by name (extras of this package expanded)."""
    names = {_name(r) for r in PROJECT["dependencies"]}
    todo, seen = [extra], set()
    while todo:
        current = todo.pop()
        seen.add(current)
        for requirement in PROJECT["optional-dependencies"][current]:
            inner = re.fullmatch(r"zeus-callbacks\[([^\]]+)\]", requirement)
            if inner:
                todo.extend(e for e in inner.group(1).split(",") if e not in seen)
            else:
                names.add(_name(requirement))
    return names


def third_party_imports(path: Path) -> set[str]:
    """Top-level modules a script imports that are neither the standard library nor this package."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module.split(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and m not in ("zeus_callbacks", "__future__")}


@functools.cache
def _packages_distributions() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def providers(module: str) -> set[str]:
    """Distributions that provide top-level ``module`` here (installed metadata)."""
    return {d.lower().replace("_", "-") for d in _packages_distributions().get(module, [])}


LOCAL = {p.stem for p in (ROOT / "tests").rglob("*.py")} | {p.name for p in (ROOT / "tests").rglob("*") if p.is_dir()}
LOCAL |= {"tests"} | {p.stem for p in (ROOT / "benchmarks").glob("*.py")}  # the suite's own (and benchmarks')
LOCAL |= {p.stem for p in (ROOT / "examples").glob("*.py")}  # fabric_loop imports raw_loop
SUITE = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py"))

DOCUMENTED = [
    # (file with the install line, the extra it installs, the command run after it, the files that command runs)
    ("README.md", "examples", "python examples/lightning_digits.py", ["examples/lightning_digits.py"]),
    ("README.md", "dev", "python -m pytest -q", SUITE),
    ("docs/getting-started.md", "examples", "python examples/lightning_digits.py", ["examples/lightning_digits.py"]),
    ("docs/getting-started.md", "examples", "python examples/hf_text.py", ["examples/hf_text.py"]),
    ("docs/raw_loops.md", "examples", "python examples/raw_loop.py", ["examples/raw_loop.py"]),
    ("docs/raw_loops.md", "examples", "python examples/fabric_loop.py", ["examples/fabric_loop.py"]),
]


@pytest.mark.parametrize(
    ("doc", "extra", "command", "files"), DOCUMENTED, ids=lambda v: v if isinstance(v, str) else ""
)
def test_the_documented_extra_brings_every_import_of_the_command_after_it(doc, extra, command, files):
    text = (ROOT / doc).read_text()
    assert f'.[{extra}]"' in text and command in text  # the install line and the command are still documented
    installed = extra_distributions(extra) | {"torch"}  # torch: pinned in the command, or the user's CUDA build
    for path in files:
        for module in sorted(third_party_imports(ROOT / path) - LOCAL):
            found = providers(module)
            assert found, f"{path} imports {module}, which nothing installed here provides"
            assert found & installed, f"{path} imports {module} ({found}); pip install '.[{extra}]' lacks it"


def test_the_lightning_extra_has_what_lightning_cli_needs():
    # LightningCLI refuses to start without jsonargparse[signatures]; before it was in [dev] only.
    assert any(r.replace(" ", "").startswith("jsonargparse[signatures]")
               for r in PROJECT["optional-dependencies"]["lightning"])  # fmt: skip
    assert "jsonargparse" in extra_distributions("lightning")
