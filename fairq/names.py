"""The schema name: its default and the rule it must follow.

Apart from ``fairq.schema`` (where the engine SQL is) so that the statement loader, the
configuration and ``import fairq`` stay free of SQLAlchemy.
"""

from __future__ import annotations

import re

from fairq.errors import InvalidInput

DEFAULT_SCHEMA = "fairq"

# A schema name is an identifier we quote, but we still refuse anything exotic: it appears in
# NOTIFY channel names, advisory-lock keys and operators' dashboards.
_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def validate_schema_name(name: str) -> str:
    """Return ``name`` if it is a safe lower-case identifier, else raise ``InvalidInput``.

    The whole string must match (``fullmatch``): ``$`` would also match before a trailing newline,
    and a name read from the environment may end in one.
    """
    if not isinstance(name, str) or not _SCHEMA_RE.fullmatch(name):
        raise InvalidInput(
            f"invalid schema name {name!r}: use 1-63 characters of a-z, 0-9 and _, "
            "not starting with a digit"
        )
    return name
