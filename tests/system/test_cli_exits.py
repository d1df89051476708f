"""User errors on the command line are one line and exit 2: a ``fairq stats`` window too long
for PostgreSQL's timestamps (it exited 1 with DatetimeFieldOverflow)."""

from __future__ import annotations

import pytest

from fairq.cli import main


def test_stats_window_too_long_is_one_line_exit_2(dsn: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dsn", dsn, "enqueue", "t", "--no-app", "--tenant", "a"]) == 0
    capsys.readouterr()
    assert main(["--dsn", dsn, "stats", "--window", "1000000000000"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip().splitlines() == [
        "fairq stats: argument --window: window must be <= 3.1536e+09, not 1000000000000 "
        "(see fairq stats --help)"]


def test_stats_longest_window_reads(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dsn", dsn, "stats", "--window", "3153600000"]) == 0  # 100 years
    assert capsys.readouterr().out.strip() == "no jobs yet"
