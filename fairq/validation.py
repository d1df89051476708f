"""Checks on user input, done before anything is written: each failure is ``InvalidInput``
with a one-line reason (the CLI turns it into exit code 2)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from fairq.errors import InvalidInput
from fairq.models import PATCH_FIELDS, TenantConfig, TenantPatch

MAX_NAME = 200  # tenant, queue and task names (characters)
# Payload limits, checked at enqueue (docs/reliability.md), the same in the SQL enqueue
# (fairq/sql/engine/enqueue.sql). The depth is the nesting of arrays and objects (a scalar is
# depth 0, ``[]`` and ``{}`` depth 1): far below the ~1,000 levels at which Python's json module
# raises RecursionError, so every accepted payload decodes in the worker. The size is of the JSON
# text as UTF-8.
MAX_PAYLOAD_DEPTH = 100
MAX_PAYLOAD_BYTES = 1_048_576
PRIORITY_RANGE = (-32768, 32767)
# The longest lease (per task, per enqueue, per extension): a crashed worker's job comes back
# at most this long after its last heartbeat. A handler that runs longer extends its lease
# (the worker's heartbeats do it for it while it runs).
MAX_LEASE_SECONDS = 24 * 3600
# Tenant weights, inclusive. Virtual time advances by cost/weight per job (docs/algorithm.md):
# a tiny weight makes that increment overflow float8 or dwarf everyone else's, a huge one makes
# it too small to move vtime at all (absorbed by rounding).
MIN_WEIGHT = 0.001
MAX_WEIGHT = 1000.0


def name(kind: str, value: Any) -> str:
    """A tenant, queue or task name: any Unicode text of 1..200 characters, stored verbatim."""
    if not isinstance(value, str):
        raise InvalidInput(f"{kind} must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidInput(f"{kind} must not be empty")
    if len(value) > MAX_NAME:
        raise InvalidInput(f"{kind} is {len(value)} characters long; the limit is {MAX_NAME}")
    if "\x00" in value:
        raise InvalidInput(f"{kind} must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{kind} is not valid Unicode text (lone surrogate)") from None
    return value


# What json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":")) uses,
# made once: json.dumps builds a new encoder on every call that passes options. Keys sorted:
# jsonb keeps no key order anyway, and sorting is what finds, at no cost, the only objects whose
# keys may collide as JSON text: those mixing str keys with others (1 and "1"), which do not sort.
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"),
                            sort_keys=True)
_UNSORTED = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def _key_text(key: Any) -> str:
    """A dict key as the json module writes it (a str, int, float, bool or None)."""
    if isinstance(key, str):
        return key
    if key is True or key is False or key is None:
        return {True: "true", False: "false", None: "null"}[key]
    return float.__repr__(key) if isinstance(key, float) else int.__repr__(key)


def duplicate_key(value: Any) -> str | None:
    """The first key that two keys of one object of ``value`` both become as JSON text (1 and
    "1"), or None: the json module would write both and jsonb keep only the last."""
    if isinstance(value, dict):
        if not all(type(k) is str for k in value):
            seen: set[str] = set()
            for k in value:
                text = _key_text(k)
                if text in seen:
                    return text
                seen.add(text)
        values: Any = value.values()
    elif isinstance(value, list | tuple):
        values = value
    else:
        return None
    for item in values:
        if isinstance(item, dict | list | tuple):
            found = duplicate_key(item)
            if found is not None:
                return found
    return None


def has_nul(value: Any) -> bool:
    """Whether a string of ``value`` (a key or a value, at any depth) holds a NUL character,
    which jsonb cannot store; the same rule as the SQL enqueue's, on the decoded strings (the
    text ``\\u0000``, a backslash then "u0000", is no NUL)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any((isinstance(k, str) and "\x00" in k) or has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(has_nul(v) for v in value)
    return False


def encode_json(value: Any) -> tuple[str, bool]:
    """JSON text of ``value`` as fairq stores it, and whether an object of it mixes str keys
    with others (then ``duplicate_key`` has to look). Raises what the json module raises:
    TypeError, ValueError, RecursionError."""
    try:
        return _ENCODER.encode(value), False
    except TypeError:  # not JSON, or keys that do not sort: the unsorted encoder tells which
        return _UNSORTED.encode(value), True


# A JSON string, or a float Python wrote with a positive exponent and no fraction ("1e+20").
_STRING_OR_EXP_FLOAT = re.compile(r'"(?:[^"\\]|\\.)*"|(-?\d+(?:\.\d+)?e\+\d+)')
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _keep_float(match: re.Match[str]) -> str:
    """A float such as ``1e+20`` written as ``100000000000000000000.0``: jsonb keeps numbers as
    numeric, which prints ``1e+20`` as an integer, and the handler would get an int back."""
    number = match.group(1)
    if number is None:
        return match.group(0)
    return f"{int(float(number))}.0"  # >= 1e16 in magnitude: an integer value, exact


def payload_depth(text: str) -> int:
    """The nesting depth of arrays and objects in JSON ``text`` (0 for a scalar)."""
    depth = deepest = 0
    for c in _NOT_BRACKET.sub("", _STRING.sub("", text)):
        depth += 1 if c in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def payload(value: Any) -> str:
    """Encode a payload as JSON text; refuse what jsonb cannot store, what is nested deeper than
    MAX_PAYLOAD_DEPTH or what is bigger than MAX_PAYLOAD_BYTES."""
    try:
        text, mixed_keys = encode_json(value)
    except RecursionError:
        raise InvalidInput(f"payload is nested too deeply; the limit is {MAX_PAYLOAD_DEPTH} "
                           "levels of arrays and objects") from None
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"payload is not JSON-serialisable: {exc}") from None
    if "e+" in text:
        text = _STRING_OR_EXP_FLOAT.sub(_keep_float, text)
    # Fewer opening brackets than the limit (strings included) cannot nest deeper than it.
    if text.count("[") + text.count("{") > MAX_PAYLOAD_DEPTH:
        depth = payload_depth(text)
        if depth > MAX_PAYLOAD_DEPTH:
            raise InvalidInput(f"payload is nested {depth} levels deep; the limit is "
                               f"{MAX_PAYLOAD_DEPTH} levels of arrays and objects")
    # A NUL is written \u0000; the text also holds that for a backslash followed by "u0000".
    if "\\u0000" in text and has_nul(value):
        raise InvalidInput("payload must not contain NUL characters (jsonb cannot store them)")
    if mixed_keys:
        duplicate = duplicate_key(value)
        if duplicate is not None:
            raise InvalidInput(f"payload has two keys that are both {duplicate!r} as JSON text "
                               "(such as 1 and '1'): one would be lost")
    if text.isascii():  # the common case: one byte a character, no surrogate
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidInput("payload contains invalid Unicode (lone surrogate)") from None
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidInput(f"payload is {size} bytes as JSON; the limit is {MAX_PAYLOAD_BYTES}")
    return text


def _number(kind: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{kind} must be a number, not {type(value).__name__}")
    f = float(value)
    if not math.isfinite(f):
        raise InvalidInput(f"{kind} must be finite, not {value!r}")
    return f


def weight(value: Any, *, shown: str | None = None) -> float:
    """A tenant weight: a number from MIN_WEIGHT to MAX_WEIGHT inclusive.

    ``shown`` is how the value appears in the message (the CLI passes the text as typed).
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"weight must be a number, not {type(value).__name__}")
    if not MIN_WEIGHT <= value <= MAX_WEIGHT:  # also refuses nan, +-inf and ints beyond float
        raise InvalidInput(f"weight must be between {MIN_WEIGHT:g} and {MAX_WEIGHT:g}, "
                           f"not {repr(value) if shown is None else shown}")
    return float(value)


def cost(value: Any) -> float:
    f = _number("cost", value)
    if f <= 0 or f > 1e9:
        raise InvalidInput(f"cost must be > 0 and <= 1e9, not {value!r}")
    return f


def integer(kind: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{kind} must be an integer, not {value!r}")
    if not lo <= value <= hi:
        raise InvalidInput(f"{kind} must be between {lo} and {hi}, not {value}")
    return value


MIN_RATE, MAX_RATE = 0.001, 1_000_000.0
MAX_BURST = 1_000_000


def rate(value: Any, *, shown: str | None = None) -> float:
    """A rate limit in jobs per second, from MIN_RATE to MAX_RATE inclusive."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"rate must be a number of jobs per second, not {type(value).__name__}")
    if not MIN_RATE <= value <= MAX_RATE:  # also refuses nan and +-inf
        raise InvalidInput(f"rate must be between {MIN_RATE:g} and {MAX_RATE:g} jobs per second, "
                           f"not {repr(value) if shown is None else shown}")
    return float(value)


def burst(value: Any) -> int:
    return integer("burst", value, 1, MAX_BURST)


def rate_limit(rate_: float | None, burst_: int | None) -> tuple[float | None, int | None]:
    """A validated (rate, burst): no rate means no limit (and no burst); a rate without a
    burst gets one second's worth of jobs, at least one."""
    if rate_ is None:
        if burst_ is not None:
            raise InvalidInput("burst needs a rate (jobs per second)")
        return None, None
    r = rate(rate_)
    return r, burst(burst_) if burst_ is not None else max(1, math.ceil(r))


def max_running(value: Any) -> int:
    return integer("max_running", value, 0, 1_000_000)


def priority(value: Any) -> int:
    return integer("priority", value, *PRIORITY_RANGE)


def max_attempts(value: Any) -> int:
    return integer("max_attempts", value, 1, 1000)


def lease(value: Any) -> int:
    """A task's or job's lease in whole seconds, 1 to MAX_LEASE_SECONDS."""
    return integer("lease", value, 1, MAX_LEASE_SECONDS)


def lease_extension(value: Any) -> float:
    """``Job.extend_lease(seconds)``: a number of seconds > 0, at most MAX_LEASE_SECONDS."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"lease extension must be a number of seconds, not {value!r}")
    if not 0 < value <= MAX_LEASE_SECONDS:  # also refuses nan and inf
        raise InvalidInput(f"lease extension must be > 0 and at most {MAX_LEASE_SECONDS} "
                           f"seconds, not {value!r}")
    return float(value)


# The times a job's run_at may hold, [MIN_RUN_AT, MAX_RUN_AT): every value in it reads back as a
# Python datetime in any session time zone (one day from either end of datetime's range), and
# the SQL enqueue and a CHECK on jobs.run_at refuse the same.
MIN_RUN_AT = datetime(1970, 1, 1, tzinfo=UTC)
MAX_RUN_AT = datetime(9999, 1, 1, tzinfo=UTC)
RUN_AT_RANGE_MESSAGE = "run_at must be between 1970-01-01 and 9999-01-01 UTC"


def run_at(run_at_value: Any, delay: Any) -> datetime | None:
    """The job's run_at: an aware datetime, or ``now + delay`` left to the database clock.

    A delay is turned into an absolute time here only when given; ``None`` means "now" on the
    database clock, so a worker or producer with a wrong clock does not shift jobs.
    """
    if run_at_value is not None and delay is not None:
        raise InvalidInput("give run_at or delay, not both")
    if run_at_value is not None:
        if not isinstance(run_at_value, datetime):
            raise InvalidInput(f"run_at must be a datetime, not {type(run_at_value).__name__}")
        if run_at_value.tzinfo is None or run_at_value.utcoffset() is None:
            raise InvalidInput("run_at must be timezone-aware (e.g. datetime.now(timezone.utc))")
        if not MIN_RUN_AT <= run_at_value < MAX_RUN_AT:  # compared in UTC, whatever its zone
            raise InvalidInput(RUN_AT_RANGE_MESSAGE)
        return run_at_value
    return None


def delay_seconds(delay: Any) -> float | None:
    if delay is None:
        return None
    if isinstance(delay, timedelta):
        delay = delay.total_seconds()
    f = _number("delay", delay)
    if f < 0 or f > 10 * 365 * 86400:
        raise InvalidInput(f"delay must be between 0 and 10 years in seconds, not {delay!r}")
    return f


# -- numbers typed as text, and tenant patches ----------------------------------------------
# Text a person typed (the CLI, the console's form, a JSON string): ASCII digits only, with an
# optional sign, point and exponent. Python's float() and int() also take "5_0" (50), other
# scripts' digits ("١٢" is 12) and "nan"/"inf": each surface would accept a different language.
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_TEXT_SHOWN = 40  # characters of a refused text a message shows


def _shown(text: str) -> str:
    return repr(text if len(text) <= _TEXT_SHOWN else text[:_TEXT_SHOWN] + "...")


def parse_number(kind: str, text: str) -> float:
    """A decimal number from text, strictly (see _DECIMAL); surrounding spaces allowed."""
    t = text.strip(" \t")
    if len(t) > 100 or not _DECIMAL.fullmatch(t):
        raise InvalidInput(f"{kind} must be a number, not {_shown(text)}")
    return float(t)


def parse_integer(kind: str, text: str) -> int:
    """An integer from text, strictly (ASCII digits, an optional sign)."""
    t = text.strip(" \t")
    if len(t) > 20 or not _INTEGER.fullmatch(t):
        raise InvalidInput(f"{kind} must be an integer, not {_shown(text)}")
    return int(t)


def _typed(kind: str, value: Any, *, integer_: bool, text: bool) -> Any:
    if text and isinstance(value, str):
        return parse_integer(kind, value) if integer_ else parse_number(kind, value)
    return value


NO_RATE = "unlimited"  # the text that removes a rate limit (CLI, console, tenants file)
DEFAULT_GROUP = "default"  # the group of tenants without one


def tenant_patch(tenant: Any, values: Mapping[str, Any], *, text: bool = False) -> TenantPatch:
    """The one check of a change to a tenant's settings, from every surface: ``values`` names
    the fields to change (PATCH_FIELDS; any other key is refused) with their new values.
    ``rate`` None or 'unlimited' removes the limit; ``group`` None or 'default' puts the
    tenant back in the group 'default'; ``burst`` needs a rate (the patch's or the tenant's,
    checked where it is applied). ``text``: numbers may come as text (a form, the CLI) and are
    parsed strictly."""
    t = name("tenant", tenant)
    unknown = sorted(str(k) for k in values if k not in PATCH_FIELDS)
    if unknown:
        raise InvalidInput(f"unknown tenant setting(s) {', '.join(map(repr, unknown))}: "
                           f"the settings are {', '.join(PATCH_FIELDS)}")
    if not values:
        raise InvalidInput(f"give at least one of {', '.join(PATCH_FIELDS)}")
    out: dict[str, Any] = {}
    if "weight" in values:
        out["weight"] = weight(_typed("weight", values["weight"], integer_=False, text=text))
    if "max_running" in values:
        out["max_running"] = max_running(
            _typed("max_running", values["max_running"], integer_=True, text=text))
    if "rate" in values:
        r = values["rate"]
        if r is None or (isinstance(r, str) and r.strip().lower() == NO_RATE):
            out["rate"] = None
        else:
            out["rate"] = rate(_typed("rate", r, integer_=False, text=text))
    if "burst" in values:
        b = values["burst"]
        if b is None or (text and isinstance(b, str) and not b.strip()):
            if out.get("rate", 0) is not None:
                raise InvalidInput("burst must be a whole number from 1 to "
                                   f"{MAX_BURST} (no burst: only without a rate)")
            out["burst"] = None
        else:
            out["burst"] = burst(_typed("burst", b, integer_=True, text=text))
            if "rate" in out and out["rate"] is None:
                raise InvalidInput("burst needs a rate (jobs per second), not rate unlimited")
    if "group" in values:
        g = values["group"]
        out["group"] = None if g is None or g == DEFAULT_GROUP else name("group", g)
    return TenantPatch(t, frozenset(out), **out)


def patch_of(config: TenantConfig) -> TenantPatch:
    """A patch that sets every field to ``config``'s (a tenants file names a tenant's whole
    settings)."""
    return TenantPatch(config.tenant, frozenset(PATCH_FIELDS), weight=config.weight,
                       max_running=config.max_running, rate=config.rate, burst=config.burst,
                       group=config.group)
