"""A handler's return value as its job's result: JSON text of at most ``MAX_RESULT_BYTES``.

The work is done when the handler returns, so a value that cannot be stored never fails or
re-runs the job: the job is done with no result, and ``last_error`` says why (``note``).
"""

from __future__ import annotations

from typing import Any

from fairq.validation import duplicate_key, encode_json, has_nul

MAX_RESULT_BYTES = 64 * 1024  # the JSON text, UTF-8 encoded
NOTE_PREFIX = "result not stored: "


def encode_result(value: Any) -> tuple[str | None, str | None]:
    """``(json_text, None)`` to store, ``(None, None)`` for no result (the handler returned
    None), or ``(None, note)`` when the value cannot be stored."""
    if value is None:
        return None, None
    try:
        text, mixed_keys = encode_json(value)
    except Exception as exc:  # TypeError, ValueError (NaN, a cycle), or a broken __str__/default
        return None, f"{NOTE_PREFIX}the return value is not JSON-serialisable " \
                     f"({type(exc).__name__}: {_short(exc)})"
    try:
        if "\\u0000" in text and has_nul(value):  # the text also holds \u0000 for "\\u0000"
            return None, f"{NOTE_PREFIX}it contains NUL characters, which jsonb cannot store"
        duplicate = duplicate_key(value) if mixed_keys else None
    except RecursionError:  # encoded, yet too deep for a Python walk: not worth storing
        return None, f"{NOTE_PREFIX}it is nested too deeply"
    if duplicate is not None:
        return None, (f"{NOTE_PREFIX}two of its keys are both {duplicate!r} as JSON text "
                      "(such as 1 and '1'): one would be lost")
    try:
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None, f"{NOTE_PREFIX}it contains invalid Unicode (a lone surrogate)"
    if size > MAX_RESULT_BYTES:
        return None, f"{NOTE_PREFIX}it is {size} bytes as JSON; the limit is {MAX_RESULT_BYTES}"
    return text, None


def _short(exc: BaseException) -> str:
    try:
        text = " ".join(str(exc).split())
    except Exception:
        text = "?"
    return text if len(text) <= 200 else text[:197] + "..."
