"""The results page, its tables and the decision records stay a reader's documents: short, dated,
with links that resolve, and without references a reader cannot follow (temporary paths, commit
hashes, engine versions)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
TABLES = sorted((ROOT / "benchmarks" / "results").glob("*.md"))
DECISIONS = ROOT / "docs" / "decisions"
RECORDS = sorted(DECISIONS.glob("[0-9][0-9][0-9]-*.md"))
ALGORITHM = ROOT / "docs" / "algorithm.md"
READER_DOCS = [RESULTS, *TABLES, DECISIONS / "README.md", *RECORDS, ALGORITHM]

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# A commit hash: 7-40 hex characters with at least one digit and one letter.
HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


def test_the_results_page_is_at_most_300_lines() -> None:
    assert len(RESULTS.read_text().splitlines()) <= 300


def test_the_results_page_answers_fifo_and_pgqueuer_first() -> None:
    first_screen = "\n".join(RESULTS.read_text().splitlines()[:30])
    assert "fifo" in first_screen and "PgQueuer" in first_screen


def test_there_are_decision_records() -> None:
    assert len(RECORDS) >= 5


@pytest.mark.parametrize("doc", READER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(doc: Path) -> None:
    for target in LINK.findall(doc.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        assert (doc.parent / target).exists(), f"{doc.name}: broken link {target}"


@pytest.mark.parametrize("doc", READER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_reference_a_reader_cannot_follow(doc: Path) -> None:
    text = doc.read_text()
    assert "/tmp/" not in text
    assert not re.search(r"\bstop \d+\b", text, re.IGNORECASE)
    assert HASH.findall(text) == []


def test_the_algorithm_describes_todays_engine_without_versions() -> None:
    text = ALGORITHM.read_text()
    assert not re.search(r"engine_v\d|\bengine v\d|\bv\d+\.sql|migrations? \d{4}", text)


def test_the_index_lists_every_record_and_each_has_its_parts() -> None:
    index = (DECISIONS / "README.md").read_text()
    for record in RECORDS:
        assert f"({record.name})" in index, record.name
        text = record.read_text()
        for part in ("## Context", "## Decision", "## Alternatives", "## Consequences"):
            assert part in text, f"{record.name}: no {part}"
