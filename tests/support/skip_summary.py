"""A pytest plugin (loaded by conftest.py): the run ends with what it skipped, grouped by
reason, and the one command that installs what those tests need."""

from __future__ import annotations

from collections import Counter
from typing import Any

INSTALL = "scripts/install-test-tools"


def reason_of(report: Any) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return " ".join(str(text).removeprefix("Skipped: ").split())


def summary(reasons: list[str]) -> list[str]:
    """The lines the run ends with (none when nothing was skipped)."""
    if not reasons:
        return []
    counts = Counter(reasons)
    lines = [f"fairq tests: skipped {len(reasons)} test(s):"]
    lines += [f"  {n} x {reason}" for reason, n in counts.most_common()]
    lines.append(f"install what they need with: {INSTALL}  (Debian/Ubuntu; sudo unless root)")
    return lines


def pytest_terminal_summary(terminalreporter: Any) -> None:
    reports = terminalreporter.stats.get("skipped", [])
    for line in summary([reason_of(r) for r in reports]):
        terminalreporter.write_line(line)
