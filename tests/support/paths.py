"""Where things are: the repository and the child programs the tests start."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parents[1]
