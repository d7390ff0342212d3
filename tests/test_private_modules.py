"""Every module outside the public API is private: its name, or a package's above it, starts with ``_``.

The public modules are the list under "Public API" in docs/architecture.md; docs/, examples/ and the
README import from those only.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "zeus_callbacks"


def _public_list() -> list[str]:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert "## Public API" in doc, "docs/architecture.md lists no public modules (a '## Public API' section)"
    section = doc.split("## Public API", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^- `(zeus_callbacks[\w.]*)`", section, re.M)


def _modules() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "__pycache__" in parts or parts[-1] == "__main__":
            continue
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def _private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def test_the_public_list_names_public_modules_that_exist():
    public = _public_list()
    assert len(public) >= 10 and len(set(public)) == len(public)
    assert not [name for name in public if name not in _modules()], "listed but missing"
    assert not [name for name in public if _private(name)], "listed but private"


def test_every_module_not_listed_is_private():
    public = set(_public_list())
    offenders = [name for name in _modules() if name not in public and not _private(name)]
    assert not offenders, f"add a leading underscore, or list them under Public API: {offenders}"


def test_docs_examples_and_readme_import_public_modules_only():
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").glob("*.py"))]
    imported = re.compile(r"^\s*(?:from|import)\s+(zeus_callbacks[\w.]*)|python -m (zeus_callbacks[\w.]*)", re.M)
    offenders = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in texts
        for match in imported.finditer(path.read_text(encoding="utf-8"))
        for name in match.groups()
        if name and _private(name)
    )
    assert not offenders, offenders
