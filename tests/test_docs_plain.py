"""Docs a newcomer reads in one pass: short sentences (issue 26, point 5).

What counts as prose: every line of ``README.md`` and ``docs/*.md`` outside fenced code
blocks, headings, HTML comments and link definitions. ``docs/results/`` is left out: those
pages are measurement logs. Table cells count too: a cell is split into sentences like a
paragraph when it holds a full stop at a word's end or more than ``LABEL_MAX_WORDS`` (12)
words. Shorter cells without a full stop (a key, a unit, a type, a default, a number) are
labels, not sentences, and are left out, so they neither pass a long cell nor pull the mean
down.

How a sentence is found: a paragraph's lines are joined; each list item and each table cell
is its own block; a block is split after ``.``, ``!`` or ``?`` (and any closing quote,
bracket or emphasis marker) followed by a space, except after common abbreviations (e.g.,
i.e., vs., etc.). So a bold lead-in such as ``**Record before changing.**`` is a sentence. An inline
code span counts as one word and a link counts as its text.

Thresholds:

* mean words per sentence ≤ ``MEAN_MAX_WORDS`` (25) per file;
* no prose sentence over ``PROSE_MAX_WORDS`` (60) words, and none over ``FIRST_READ_MAX_WORDS`` (35)
  on the pages a newcomer reads first (``FIRST_READ_PAGES``: README.md, getting started, concepts,
  raw loops and the prose of metrics.md; issue 26, an outside tester's reading);
* no table-cell sentence over ``CELL_MAX_WORDS`` (60) words. A cell is read next to its key
  and unit, so the limit is the same as for prose; it is a separate constant so that a
  field table's cell can be given more room without loosening the prose.

Before issue 26 point 5, main measured (mean / longest, in words): docs/cli.md 19.9 / 112,
docs/metrics.md 18.9 / 85, docs/batch_size.md 34.9 / 105, docs/comparison.md 33.6 / 124;
docs/power_limit.md before its own rewrite (b3a48cc^) 34.9 / 149.

Run ``python tests/test_docs_plain.py`` (``-v`` for the text) to print every file's numbers
and its longest sentence.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MEAN_MAX_WORDS = 25
PROSE_MAX_WORDS = 60
FIRST_READ_MAX_WORDS = 35
FIRST_READ_PAGES = ("README.md", "getting-started.md", "concepts.md", "raw_loops.md", "metrics.md")
CELL_MAX_WORDS = 60
LABEL_MAX_WORDS = 12

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s+")
_ABBREVIATIONS = ("e.g.", "i.e.", "vs.", "etc.", "cf.", "approx.", "no.", "fig.")
_STOP = re.compile(r"[.!?](\s|$)")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]*_]*\s+")


@dataclass(frozen=True)
class Sentence:
    """One sentence: its words (inline code is one word) and whether it sits in a table."""

    text: str
    words: int
    in_table: bool


def _words(text: str) -> int:
    return len(text.split())


def _flatten(text: str) -> str:
    """Code spans become one token each; links become their text."""
    text = _CODE_SPAN.sub("CODE", text)
    return _LINK.sub(r"\1", text)


def _split(block: str) -> list[str]:
    """Split one block of prose into sentences."""
    parts = _SENTENCE_END.split(block.strip())
    sentences: list[str] = []
    for part in parts:
        if sentences and sentences[-1].lower().endswith(_ABBREVIATIONS):
            sentences[-1] = f"{sentences[-1]} {part}"
        elif part.strip():
            sentences.append(part.strip())
    return sentences


def _blocks(markdown: str) -> list[tuple[str, bool]]:
    """Return the prose blocks of a page as ``(text, in_table)`` pairs."""
    blocks: list[tuple[str, bool]] = []
    paragraph: list[str] = []
    in_fence = in_comment = False

    def flush() -> None:
        if paragraph:
            blocks.append((" ".join(paragraph), False))
            paragraph.clear()

    for raw in markdown.splitlines():
        line = raw.strip()
        if _FENCE.match(raw):
            flush()
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        if in_comment or line.startswith("<!--"):
            in_comment = "-->" not in line
            continue
        if not line or line.startswith("#") or re.match(r"^\[[^\]]+\]:", line):
            flush()
            continue
        if line.startswith("|"):
            flush()
            if re.fullmatch(r"[|:\-\s]+", line):
                continue
            cells = re.split(r"(?<!\\)\|", _CODE_SPAN.sub("CODE", line))
            blocks.extend((cell, True) for cell in cells if _STOP.search(cell) or _words(cell) > LABEL_MAX_WORDS)
            continue
        if _LIST_ITEM.match(raw) or line.startswith((">", "!!!")):
            flush()
            line = _LIST_ITEM.sub("", line).lstrip(">").strip()
        paragraph.append(line)
    flush()
    return blocks


def sentences(markdown: str) -> list[Sentence]:
    """Return every prose sentence of a markdown page (see the module docstring)."""
    found = []
    for block, in_table in _blocks(markdown):
        for text in _split(_flatten(block)):
            n = _words(text)
            if n:
                found.append(Sentence(text, n, in_table))
    return found


def pages() -> list[Path]:
    """README.md and docs/*.md; docs/results/ (measurement logs) is not included."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def report(path: Path) -> tuple[float, Sentence, list[Sentence]]:
    """Return a page's mean words per sentence, its longest sentence and its sentences."""
    found = sentences(path.read_text(encoding="utf-8"))
    mean = sum(s.words for s in found) / len(found)
    return mean, max(found, key=lambda s: s.words), found


@pytest.mark.parametrize("path", pages(), ids=lambda p: p.name)
def test_sentences_are_short(path: Path) -> None:
    mean, _, found = report(path)
    prose_max = FIRST_READ_MAX_WORDS if path.name in FIRST_READ_PAGES else PROSE_MAX_WORDS
    too_long = [f"{s.words} words: {s.text}" for s in found if s.words > (CELL_MAX_WORDS if s.in_table else prose_max)]
    assert mean <= MEAN_MAX_WORDS, f"{path.name}: {mean:.1f} words per sentence"
    assert not too_long, f"{path.name}:\n" + "\n".join(too_long)


def test_splitter_counts_code_as_one_word_and_skips_code_blocks() -> None:
    text = "# Title\n\nRun `a b c` now. See [the docs](x.md), e.g. here.\n\n```\nnot. prose. here.\n```\n"
    assert [s.words for s in sentences(text)] == [3, 5]


def test_long_table_cells_count_and_short_labels_do_not() -> None:
    words = " ".join(["word"] * (LABEL_MAX_WORDS + 1))
    text = f"| key | unit | meaning |\n|---|---|---|\n| `a` | J | Energy. Per step. |\n| `b` | s | {words} |\n"
    found = sentences(text)
    assert [s.words for s in found] == [1, 2, LABEL_MAX_WORDS + 1]
    assert all(s.in_table for s in found)


if __name__ == "__main__":
    for page in pages():
        mean, longest, found = report(page)
        over = sum(s.words > PROSE_MAX_WORDS for s in found)
        print(f"{page.name:22} mean {mean:5.1f}  max {longest.words:4d}  n {len(found):4d}  over60 {over}")
        if "-v" in sys.argv:
            print("    ", longest.text[:300])
