"""The type loaders fairq registers on its connections: jsonb that may not decode in Python, and
timestamptz that may be infinite or outside Python's years (and is parsed faster than psycopg's
own text loader)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.abc import Buffer
from psycopg.types.datetime import TimestamptzLoader
from psycopg.types.json import set_json_loads

from fairq.models import UndecodablePayload


def load_json(data: bytes | str) -> Any:
    """psycopg's json/jsonb loader for fairq's connections: a payload Python cannot decode
    (nested past its recursion limit, written by hand in SQL) becomes an ``UndecodablePayload``
    instead of an error that would take the whole fetched batch of jobs with it."""
    try:
        return json.loads(data)
    except (RecursionError, ValueError, MemoryError) as exc:
        return UndecodablePayload(f"{type(exc).__name__}: {str(exc)[:200]}")


class OutOfRangeTime(datetime):
    """Stands for a stored timestamptz that Python's datetime cannot hold (before year 1 or
    after 9999 in the session's time zone, written in SQL past the checks): datetime's min or
    max in UTC, with the database's own text. A claimed job holding one fails alone (the
    worker's slots), and ``fairq job`` still shows it, with that text (``str()``)."""

    text: str

    @classmethod
    def of(cls, text: str, *, early: bool) -> OutOfRangeTime:
        bound = datetime.min if early else datetime.max
        value = cls.combine(bound.date(), bound.time(), UTC)
        value.text = text
        return value

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"OutOfRangeTime({self.text!r})"


class _TimestamptzLoader(TimestamptzLoader):
    """``infinity`` and ``-infinity`` (valid in PostgreSQL, not in Python) as datetime's max
    and min, so that a job whose run_at was set to infinity in SQL can still be read; a time
    beyond datetime's years as an ``OutOfRangeTime`` instead of an error that would take the
    whole fetched batch of jobs with it.

    Subclassing psycopg's loader gives its pure-Python parser even where psycopg's C one is
    installed (a claimed job carries three timestamps: 2.3 us each here, about 11% of a no-op
    worker's GIL time in a py-spy profile). ISO text (PostgreSQL's default DateStyle) is parsed
    by ``datetime.fromisoformat`` (C) in the connection's time zone, as psycopg returns it;
    anything else (another DateStyle, BC dates) goes to psycopg's parser as before.
    """

    def load(self, data: Buffer) -> datetime:
        if data == b"infinity":
            return datetime.max.replace(tzinfo=UTC)
        if data == b"-infinity":
            return datetime.min.replace(tzinfo=UTC)
        try:
            parsed = datetime.fromisoformat(bytes(data).decode("ascii"))
            if parsed.tzinfo is not None:  # else not a timestamptz in ISO style: psycopg decides
                return parsed.astimezone(self._timezone)
        except (ValueError, OverflowError):  # not ISO, or past datetime's range: psycopg decides
            pass
        try:
            return super().load(data)
        except psycopg.DataError as exc:  # "timestamp too small/large"
            text = bytes(data).decode("utf-8", "replace")
            return OutOfRangeTime.of(text, early=text.endswith(" BC") or "small" in str(exc))


def adapt_connection(conn: psycopg.Connection[Any]) -> None:
    """Register fairq's loaders (above) on ``conn``."""
    set_json_loads(load_json, conn)
    conn.adapters.register_loader("timestamptz", _TimestamptzLoader)
