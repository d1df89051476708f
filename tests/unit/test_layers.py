"""The layers hold: the import contracts of .importlinter, every module placed in a layer, the
diagram of docs/architecture.md drawn from the contract, and a light `import fairq` (no DB)."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

ROOT = REPO
CONTRACTS = ROOT / ".importlinter"
# The longest a module of fairq/ may be.
MAX_LINES = 450


def _contracts() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(CONTRACTS)
    return config


def _layers() -> list[list[str]]:
    """The layers contract's layers, top to bottom, each a list of module names (an optional
    module, in parentheses in the contract, without them)."""
    contract = _contracts()["importlinter:contract:layers"]
    assert contract["type"] == "layers"
    layers = []
    for line in contract["layers"].strip().splitlines():
        names = [n.strip().strip("()") for n in re.split(r"[|:]", line)]
        layers.append([n for n in names if n])
    return layers


def test_import_contracts_are_kept() -> None:
    """`lint-imports` (import-linter, a dev dependency) checks every contract in .importlinter."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "lint-imports is not installed: pip install -e '.[dev]'"
    out = subprocess.run([exe, "--config", str(CONTRACTS)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_every_module_is_in_a_layer() -> None:
    """A new module cannot sit outside the layers (where no contract would see it import
    upward): each module and package under fairq/ is in exactly one layer, or inside a package
    that is. Only the package's own __init__ (the re-exported API) and __main__ stand apart."""
    placed = [name for layer in _layers() for name in layer]
    assert len(placed) == len(set(placed)), placed
    package = ROOT / "fairq"
    outside = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        if name in ("fairq", "fairq.__main__"):
            continue
        owners = [p for p in placed if name == p or name.startswith(p + ".")]
        if len(owners) != 1:
            outside.append(f"{name}: {owners or 'in no layer'}")
    assert not outside, "place these in one layer of .importlinter's layers contract: " + \
        ", ".join(outside)


def test_the_architecture_diagram_is_the_layers_contract() -> None:
    """docs/architecture.md's diagram lists the contract's layers in its order, each line naming
    the layer's modules: the page cannot drift from what lint-imports checks."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    diagram = text.split("<!-- layers: begin -->", 1)[1].split("<!-- layers: end -->", 1)[0]
    rows = [line for line in diagram.splitlines() if line.strip().startswith("fairq.")]
    layers = _layers()
    assert len(rows) == len(layers), (rows, layers)
    for row, layer in zip(rows, layers, strict=True):
        shown = re.findall(r"fairq(?:\.\w+)+", row.split("  ", 1)[0])
        assert shown == layer, (row, layer)
    assert "lint-imports" in text and "tests/unit/test_layers.py" in text


def test_no_module_is_over_450_lines() -> None:
    """One job per module: a module past 450 lines does several and is split."""
    long = []
    for path in sorted((ROOT / "fairq").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            long.append(f"{name} ({lines} lines)")
    assert not long, long


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
    contract = _contracts()["importlinter:contract:only-the-store-talks-to-postgresql"]
    assert contract["type"] == "protected"
    assert set(contract["protected_modules"].split()) == {"psycopg", "psycopg_pool"}
    allowed = {line.strip() for line in contract["allowed_importers"].splitlines()
               if line.strip() and not line.strip().startswith("#")}
    assert {"fairq.store", "fairq.sql"} <= allowed
    for module in ("fairq.metrics", "fairq.runtime", "fairq.admin", "fairq.app", "fairq.job",
                   "fairq.cli"):
        assert module not in allowed, module


def test_the_package_does_not_import_its_tests() -> None:
    """The reference model of the policies is a test oracle (tests/support/policy_model.py):
    the wheel neither ships nor imports it."""
    contract = _contracts()["importlinter:contract:package-stands-alone"]
    assert contract["type"] == "forbidden"
    assert set(contract["forbidden_modules"].split()) >= {"support", "tests", "benchmarks"}
    assert not (ROOT / "fairq" / "policies" / "model.py").exists()
