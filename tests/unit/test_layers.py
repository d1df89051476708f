"""The layers hold: the import contracts of .importlinter, and a light `import fairq` (no DB)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

ROOT = REPO


def test_import_contracts_are_kept() -> None:
    """`lint-imports` (import-linter, a dev dependency) checks every contract in .importlinter."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "lint-imports is not installed: pip install -e '.[dev]'"
    out = subprocess.run([exe, "--config", str(ROOT / ".importlinter")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_import_fairq_loads_no_sqlalchemy_or_alembic() -> None:
    """The API (App, enqueue) needs neither: a producer process should not pay for them."""
    code = ("import sys, fairq; fairq.App; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'alembic')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_only_the_store_may_import_the_driver() -> None:
    """The protected contract stays in place (the check above passes without it too): psycopg
    outside the store, the SQL loader and the documented exceptions breaks `lint-imports`."""
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    contract = config["importlinter:contract:only-the-store-talks-to-postgresql"]
    assert contract["type"] == "protected"
    assert set(contract["protected_modules"].split()) == {"psycopg", "psycopg_pool"}
    allowed = set(contract["allowed_importers"].split())
    assert {"fairq.store", "fairq.sql"} <= allowed
    for module in ("fairq.exporter", "fairq.probe", "fairq.stats", "fairq.metrics",
                   "fairq.listener", "fairq.maintenance", "fairq.demo", "fairq.cli"):
        assert module not in allowed, module
