"""fairq's timestamptz loader (fairq/store/loaders.py) reads every value as psycopg's own loader does,
in every session time zone and DateStyle, and reads ``infinity`` and the times beyond Python's
years (an ``OutOfRangeTime``) where psycopg raises.

The loader parses ISO text with ``datetime.fromisoformat`` and hands anything else to psycopg:
the reference here is a plain psycopg connection (its C loader where installed), so a value the
fast path parses differently (an offset in seconds, a year below 1000, a DST edge) fails here.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from fairq.store.loaders import OutOfRangeTime, adapt_connection

ZONES = ["Etc/UTC", "Europe/Amsterdam", "America/St_Johns", "Asia/Kolkata", "Pacific/Chatham"]
STYLES = ["ISO, MDY", "SQL, DMY", "Postgres, MDY", "German, DMY"]
VALUES = [
    "2026-12-02 05:11:23.123456+00",
    "2026-12-02 05:11:23+00",
    "2026-06-01 12:00:00.5+02",
    "2026-03-29 00:59:59.999999+00",  # the last microsecond before Amsterdam's DST starts
    "2026-10-25 01:00:00+00",  # Amsterdam's clocks go back
    "1900-01-01 00:00:00 Europe/Amsterdam",  # local mean time: an offset with seconds
    "0099-01-01 00:00:00+00",  # a year below 1000
    "0001-01-01 00:00:00+00",  # datetime.min in UTC; west of it, year 0: out of range
    "9999-12-31 23:59:59.999999+00",  # east of UTC it is year 10000: out of range
    "0044-03-15 12:00:00+00 BC",
]


def _read(conn: psycopg.Connection[Any], value: str) -> tuple[str, Any]:
    try:
        got = conn.execute("SELECT %s::timestamptz", (value,)).fetchone()
    # out of Python's range (DataError), or text psycopg cannot parse for a timestamptz (a
    # DateStyle other than ISO: NotImplementedError, as before this loader)
    except (psycopg.DataError, NotImplementedError) as exc:
        return "error", type(exc)
    assert got is not None
    return "value", got[0]


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("zone", ZONES)
def test_reads_every_timestamptz_as_psycopg_does(admin_dsn: str, zone: str, style: str) -> None:
    options = f"-c timezone={zone} -c datestyle={style.replace(' ', '')}"
    with psycopg.connect(admin_dsn, autocommit=True, options=options) as ours, \
            psycopg.connect(admin_dsn, autocommit=True, options=options) as ref:
        adapt_connection(ours)
        for value in VALUES:
            a, b = _read(ours, value), _read(ref, value)
            if b == ("error", psycopg.DataError):  # beyond Python's years: a stand-in, no error
                assert a[0] == "value" and isinstance(a[1], OutOfRangeTime), (value, a, b)
                # before year 1 (BC) at datetime's min, after 9999 at its max
                early = str(a[1]).endswith(" BC")
                assert a[1] == (datetime.min if early else datetime.max).replace(tzinfo=UTC), a
                continue
            assert a[0] == b[0], (value, a, b)
            if a[0] == "value":
                mine, theirs = a[1], b[1]
                assert mine == theirs, (value, mine, theirs)
                assert mine.utcoffset() == theirs.utcoffset(), (value, mine, theirs)
                assert str(mine.tzinfo) == str(theirs.tzinfo), (value, mine.tzinfo, theirs.tzinfo)
            else:
                assert a[1] is b[1], (value, a, b)
        # infinity: psycopg refuses it; fairq reads it as datetime's max and min
        assert _read(ref, "infinity")[0] == "error"
        assert _read(ours, "infinity") == ("value", datetime.max.replace(tzinfo=UTC))
        assert _read(ours, "-infinity") == ("value", datetime.min.replace(tzinfo=UTC))


def test_a_spread_of_instants_reads_alike(admin_dsn: str) -> None:
    """10,001 instants about 2.5 years either side of a fixed one, microseconds varied, in the
    server's own settings (both sessions run the same text: not now(), which differs by session)."""
    query = ("SELECT '2026-12-02 05:11:23.123456+00'::timestamptz "
             "+ make_interval(secs => s * 7777.123457) FROM generate_series(-5000, 5000) s")
    with psycopg.connect(admin_dsn, autocommit=True) as ours, \
            psycopg.connect(admin_dsn, autocommit=True) as ref:
        adapt_connection(ours)
        mine = [r[0] for r in ours.execute(query).fetchall()]
        theirs = [r[0] for r in ref.execute(query).fetchall()]
    assert mine == theirs
    assert [str(m.tzinfo) for m in mine] == [str(t.tzinfo) for t in theirs]
