"""What the CLI prints is safe for an operator's terminal: tenant, task and group names are a
producer's data, and a name holding ESC sequences, a carriage return or a newline must not
recolour, rewrite or forge lines there.

- ``shown(value)``: a data value for a table cell or a line: every control character, the
  newline and tab included, and the bidirectional overrides escaped (``\\x1b``, ``\\n``,
  ``\\u202e``). Other text, any script or emoji, is printed as it is.
- ``SafeStream``: the CLI's stdout and stderr while a command runs; the controls left in what
  is written (a name inside a log line or an error) are escaped, the line structure kept.
- ``json_safe(text)``: JSON output with the C1 controls and overrides as ``\\uXXXX`` (JSON
  itself escapes the C0 ones), so it stays valid JSON and inert in a terminal.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

_OVERRIDES = "\u200e\u200f\u202a-\u202e\u2066-\u2069"
_IN_DATA = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f{_OVERRIDES}]")
_IN_STREAM = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{_OVERRIDES}]")  # keeps \t and \n
_IN_JSON = re.compile(f"[\\x7f-\\x9f{_OVERRIDES}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(value: object) -> str:
    """``value`` as text with its control characters escaped (see the module's docstring)."""
    text = str(value)
    return _IN_DATA.sub(_escape, text) if _IN_DATA.search(text) else text


def json_safe(text: str) -> str:
    return _IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class SafeStream:
    """A text stream that escapes the control characters written to it, but tab and newline."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        self._inner.write(_IN_STREAM.sub(_escape, text) if _IN_STREAM.search(text) else text)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, buffer...
        return getattr(self._inner, name)


@contextmanager
def safe_output() -> Iterator[None]:
    """sys.stdout and sys.stderr as ``SafeStream``s for the block."""
    import sys

    out, err = sys.stdout, sys.stderr
    sys.stdout = SafeStream(out)
    sys.stderr = SafeStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
