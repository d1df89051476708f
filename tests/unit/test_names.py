"""The schema-name rule (pure, no database)."""

from __future__ import annotations

import pytest

from fairq.errors import InvalidInput
from fairq.names import validate_schema_name


@pytest.mark.parametrize("name", ["fairq", "_q", "a" * 63, "jobs_2"])
def test_accepted(name: str) -> None:
    assert validate_schema_name(name) == name


@pytest.mark.parametrize("name", ["fairq\n", "\nfairq", "Fairq", "2q", "a" * 64, "", "q-1", "q q"])
def test_refused_whole_string(name: str) -> None:
    """A trailing newline (FAIRQ_SCHEMA from a file) once passed: `$` matches before it."""
    with pytest.raises(InvalidInput, match="invalid schema name"):
        validate_schema_name(name)
