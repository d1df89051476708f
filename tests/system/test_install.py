"""The built wheel works outside the checkout: ``pip install fairq && fairq migrate``.

Builds a wheel from this tree, installs it (with the ``embedded`` extra, not ``bench``) into a
fresh venv in a temporary folder, and from there runs ``fairq migrate`` against a throwaway
database on the test PostgreSQL and against the embedded default (a private ``FAIRQ_HOME``,
stopped afterwards), and ``fairq bench``: its help, the one line a run that needs the ``bench``
extra prints, and a tiny run. Takes about a minute (pip's cache makes the install fast; the
bench's tests add a few seconds); ``FAIRQ_SKIP_INSTALL=1`` skips it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.paths import REPO

ROOT = REPO
IGNORE = shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "__pycache__",
                                ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis", "out")

# One pytest process runs the whole module, so the wheel and its venv (``installed``) are built
# once, not once per process (./scripts/test runs pytest with --dist loadgroup). The
# group is the bench runs' (tests/system/test_bench.py): one process runs both bench runs.
pytestmark = [
    pytest.mark.skipif(os.environ.get("FAIRQ_SKIP_INSTALL") == "1", reason="FAIRQ_SKIP_INSTALL=1"),
    pytest.mark.xdist_group("bench"),
]


def sh(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None,
       timeout: float = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="session")
def installed() -> Iterator[Path]:
    """A fresh venv outside the checkout with the wheel built from this tree; yields its bin/.
    Session-wide: the group's process may run test_bench.py's tests between this module's."""
    base = Path(tempfile.mkdtemp(prefix="fairq-install-"))
    base.chmod(0o755)  # as root, the embedded server's user must reach FAIRQ_HOME inside it
    try:
        src = base / "src"
        shutil.copytree(ROOT, src, ignore=IGNORE)
        sh(sys.executable, "-m", "build", "--wheel", "--outdir", base / "dist", src, cwd=base)
        wheels = list((base / "dist").glob("fairq-*.whl"))
        assert len(wheels) == 1, wheels
        shutil.rmtree(src)  # nothing of the checkout is left to import from
        sh(sys.executable, "-m", "venv", base / "venv", cwd=base)
        bin_dir = base / "venv" / "bin"
        sh(bin_dir / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
           f"{wheels[0]}[embedded,django,otel]", cwd=base)
        yield bin_dir
    finally:
        shutil.rmtree(base, ignore_errors=True)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FAIRQ_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(extra)
    return env


def test_wheel_carries_the_migrations_and_sql(installed: Path) -> None:
    code = ("import fairq, fairq.migrate as m, fairq.sql as s; "
            "print(fairq.__file__); print(m.migrations_dir()); print(len(s.names()))")
    out = sh(installed / "python", "-c", code, cwd=installed.parent).stdout.splitlines()
    venv = str(installed.parent)
    assert out[0].startswith(venv) and out[1].startswith(venv), out
    assert int(out[2]) > 0


def test_wheel_carries_every_package(installed: Path) -> None:
    """pyproject.toml lists the packages one by one: a package missing from the list would be
    left out of the wheel, and only an installed fairq would fail to import it."""
    packages = sorted(".".join(p.parent.relative_to(ROOT).parts)
                      for p in (ROOT / "fairq").rglob("__init__.py"))
    assert "fairq.metrics" in packages
    code = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]"
    sh(installed / "python", "-c", code, *packages, cwd=installed.parent)


def test_the_integrations_extras_install_from_the_wheel(installed: Path) -> None:
    """``pip install 'fairq[django,otel]'`` brings what the Django backend and tracing need,
    and pytest finds fairq's plugin through its entry point."""
    code = ("import importlib.metadata as md, django, opentelemetry.trace, fairq.otel, "
            "fairq.testing; from fairq.contrib.django import FairqBackend; "
            "print([e.value for e in md.entry_points(group='pytest11') if e.name == 'fairq'])")
    out = sh(installed / "python", "-c", code, cwd=installed.parent).stdout.strip()
    assert out == "['fairq.testing.plugin']", out


def test_installed_fairq_migrates_the_system_postgresql(
    installed: Path, empty_dsn: str
) -> None:
    env = clean_env(FAIRQ_DATABASE_URL=empty_dsn)
    sh(installed / "fairq", "migrate", cwd=installed.parent, env=env)
    sh(installed / "fairq", "migrate", cwd=installed.parent, env=env)  # idempotent
    out = sh(installed / "python", "-m", "fairq", "migrate", "--sql", "--from", "base",
             cwd=installed.parent,
             env=env).stdout
    assert "CREATE TABLE" in out
    with psycopg.connect(empty_dsn) as conn:
        n = conn.execute("SELECT count(*) FROM information_schema.tables "
                         "WHERE table_schema = 'fairq'").fetchone()
    assert n is not None and n[0] >= 5


@pytest.mark.skipif(os.environ.get("FAIRQ_SKIP_EMBEDDED") == "1", reason="FAIRQ_SKIP_EMBEDDED=1")
def test_installed_fairq_migrates_the_embedded_default(installed: Path) -> None:
    home = installed.parent.parent / "home"
    env = clean_env(FAIRQ_HOME=str(home))
    try:
        proc = sh(installed / "fairq", "migrate", cwd=installed.parent, env=env, timeout=300)
        assert "embedded" in proc.stderr.lower()
        proc = sh(installed / "fairq", "tenants", "list", cwd=installed.parent, env=env)
        assert "no tenants" in proc.stdout
    finally:
        sh(installed / "python", "-c", "from fairq.embedded import stop_server; stop_server()",
           cwd=installed.parent, env=env, timeout=120)
    assert not (home / "embedded" / "pgdata" / "postmaster.pid").exists()


def test_installed_fairq_bench_runs_without_a_checkout(installed: Path, admin_dsn: str) -> None:
    """The suite ships in the wheel: its help, its data files (the lab's statements, the
    sampler's queries) and a tiny run of every policy; the bench extra is not installed."""
    cwd = installed.parent
    env = clean_env()
    out = sh(installed / "fairq", "bench", "--help", cwd=cwd, env=env).stdout
    assert "--quick" in out and "fairq[bench]" in out, out
    proc = subprocess.run([installed / "fairq", "bench", "--no-progress", "--dsn", admin_dsn],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc
    assert proc.stderr.splitlines() == [
        "fairq bench: pgqueuer, asyncpg, procrastinate not installed: pip install 'fairq[bench]'"
    ], proc.stderr
    report = cwd / "bench.json"
    # tqdm is not installed either: the run goes on without its progress bar
    sh(installed / "fairq", "bench", "--tiny", "--dsn", admin_dsn,
       "--json", report, cwd=cwd, env=env, timeout=240)
    results = json.loads(report.read_text())["results"]
    assert sorted(r["policy"] for r in results) == sorted(
        ["fifo", "rr_article", "round_robin", "weighted", "drr"]), results
    assert all(r["completed_jobs"] == 75 and not r["timed_out"] for r in results), results
