"""claim_bench.py labels pg_stat_statements rows and prepared statements by a mark in their text."""

from __future__ import annotations

from benchmarks import claim_bench as cb
from fairq import sql


def test_each_mark_is_found_in_its_own_statement_alone() -> None:
    # The claim_fair mark was "claim_settle", which claim_fifo calls too: fifo's executions and
    # plans were counted as claim_fair's.
    texts = {name: sql.statement(name, "fairq") for name in ("claim_fair", "claim_fifo",
                                                             "finish_done")}
    for name, mark in cb.PGSS_MARKS.items():
        assert [n for n, text in texts.items() if mark in text] == [name], (name, mark)
