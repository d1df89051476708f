"""The Prometheus alert rules are valid and behave as their promtool unit tests say."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support.paths import REPO

DASHBOARDS = REPO / "dashboards"
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (run .ci/install-prometheus.sh)"
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL
    return subprocess.run(
        [PROMTOOL, *args], cwd=DASHBOARDS, capture_output=True, text=True, timeout=120
    )


def test_check_rules() -> None:
    res = promtool("check", "rules", "alerts.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 5 rules found" in res.stdout


def test_rule_unit_tests() -> None:
    res = promtool("test", "rules", "alerts_test.yml")
    assert res.returncode == 0, res.stdout + res.stderr
