"""examples/testing_project: a small project whose own tests use only fairq's documented test
API (fairq.testing and the pytest plugin's fixtures, found through the installed entry point),
run as a user runs them: pytest in the project's folder against $FAIRQ_DATABASE_URL."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.paths import REPO

PROJECT = REPO / "examples" / "testing_project"


def test_the_sample_projects_tests_pass(admin_dsn: str) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "FAIRQ_")) and k != "PYTHONPATH"}
    env["FAIRQ_DATABASE_URL"] = admin_dsn
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", "-p", "no:xdist"], cwd=PROJECT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 passed" in proc.stdout, proc.stdout
