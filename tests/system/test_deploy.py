"""The deployment artefacts under deploy/ (see docs/deployment.md) stay true to fairq: every
command they run parses with fairq's own CLI, the grace periods of their supervisors cover the
worker's drain, and the probes ask the paths the worker serves."""

from __future__ import annotations

import configparser
import importlib.util
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import fairq
from fairq.cli import build_parser
from fairq.metrics.health import DEFAULT_METRICS_PORT, LIVE_PATH, READY_PATH
from tests.support.paths import REPO

ROOT = REPO
DEPLOY = ROOT / "deploy"
DOC = (ROOT / "docs" / "deployment.md").read_text()
DOCKER_INSTRUCTIONS = {"FROM", "ARG", "ENV", "RUN", "COPY", "ADD", "WORKDIR", "USER", "EXPOSE",
                       "STOPSIGNAL", "HEALTHCHECK", "ENTRYPOINT", "CMD", "LABEL", "VOLUME",
                       "SHELL", "ONBUILD"}
MARGIN = 10  # seconds a supervisor waits beyond the worker's grace period, at least


def parse_fairq(argv: list[str]) -> Any:
    """``fairq ARGV`` parsed by the real CLI; fails the test on any unknown command or flag."""
    if argv and Path(argv[0]).name == "fairq":
        argv = argv[1:]
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"`fairq {' '.join(argv)}` does not parse (exit {exc.code})")


def flag(argv: list[str], name: str) -> str:
    assert name in argv, f"{name} missing from {argv}"
    return argv[argv.index(name) + 1]


def test_the_guide_names_every_artefact() -> None:
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file()):
        rel = path.relative_to(ROOT).as_posix()
        if "__init__" in rel:
            continue
        assert rel in DOC or rel.rsplit("/", 1)[0] + "/" in DOC, f"{rel} not in docs/deployment.md"


# -- systemd -----------------------------------------------------------------------------------
UNIT = DEPLOY / "systemd" / "fairq-worker.service"


def read_unit() -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(UNIT.read_text())
    return cp


def test_systemd_unit_runs_a_real_command_with_a_long_enough_stop_timeout() -> None:
    unit = read_unit()
    assert {"Unit", "Service", "Install"} <= set(unit.sections())
    svc = unit["Service"]
    argv = shlex.split(svc["ExecStart"])
    args = parse_fairq(argv)
    assert args.command == "worker" and args.target == "myapp.tasks:app"
    assert args.metrics_port == DEFAULT_METRICS_PORT
    assert svc["KillSignal"] == "SIGTERM" and svc["KillMode"] == "mixed"
    assert int(svc["TimeoutStopSec"]) >= args.grace_period + MARGIN
    assert svc["Restart"] in ("on-failure", "always")


SYSUSERS = DEPLOY / "systemd" / "fairq.sysusers.conf"


def test_the_units_user_is_created_by_the_sysusers_file(tmp_path: Path) -> None:
    svc = read_unit()["Service"]
    lines = [ln.split() for ln in SYSUSERS.read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert [ln[:2] for ln in lines] == [["u", svc["User"]]]
    assert svc["Group"] == svc["User"]  # `u` makes the group of the same name
    assert "sysusers" in UNIT.read_text() and SYSUSERS.name in DOC
    if shutil.which("systemd-sysusers") is None:
        pytest.skip("systemd-sysusers not installed")
    (tmp_path / "etc").mkdir()
    proc = subprocess.run(["systemd-sysusers", f"--root={tmp_path}", str(SYSUSERS)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    passwd = (tmp_path / "etc" / "passwd").read_text().splitlines()
    group = (tmp_path / "etc" / "group").read_text().splitlines()
    assert any(ln.startswith(f"{svc['User']}:") for ln in passwd)
    assert any(ln.startswith(f"{svc['Group']}:") for ln in group)


def test_the_guide_says_what_a_worker_does_when_the_database_is_down_at_start() -> None:
    section = DOC.split("## Starting with the database down", 1)[1].split("\n## ", 1)[0]
    assert "exits" in section and "cannot connect" in section
    assert "Restart=on-failure" in section and "back-off" in section
    done = subprocess.run(
        [sys.executable, "-m", "fairq", "worker", "myapp.tasks:app",
         "--dsn", "postgresql://postgres@127.0.0.1:1/nowhere"],
        cwd=DEPLOY / "docker" / "app", capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "cannot connect" in done.stderr, done.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    """The unit as installed, with this machine's paths for the binary, user and folders."""
    fairq_bin = shutil.which("fairq") or str(Path(fairq.__file__).parents[1] / ".venv/bin/fairq")
    if not Path(fairq_bin).exists():
        pytest.skip("no fairq executable to point the unit at")
    text = UNIT.read_text()
    text = text.replace("/opt/fairq/venv/bin/fairq", fairq_bin)
    lines = []
    for line in text.splitlines():
        key = line.split("=", 1)[0]
        if key in ("User", "Group"):
            line = f"{key}=root"
        elif key == "WorkingDirectory":
            line = f"WorkingDirectory={tmp_path}"
        elif key == "EnvironmentFile":
            line = "EnvironmentFile=-/nonexistent/worker.env"
        lines.append(line)
    copy = tmp_path / UNIT.name
    copy.write_text("\n".join(lines) + "\n")
    proc = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True,
                          text=True, timeout=60)
    ours = [line for line in (proc.stdout + proc.stderr).splitlines() if UNIT.name in line]
    assert proc.returncode == 0 and not ours, proc.stdout + proc.stderr


# -- container ----------------------------------------------------------------------------------
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"


def docker_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends inside a continuation"
    return out


def test_dockerfile_parses_and_runs_the_worker() -> None:
    ins = docker_instructions()
    assert all(word in DOCKER_INSTRUCTIONS for word, _ in ins), ins
    assert ins[0][0] == "FROM"
    last_from = max(i for i, (w, _) in enumerate(ins) if w == "FROM")
    final = dict(ins[last_from:])  # the image's own stage
    entry = json.loads(final["ENTRYPOINT"])  # exec form: SIGTERM reaches fairq, not a shell
    cmd = json.loads(final["CMD"])
    argv = entry + cmd
    args = parse_fairq(argv)
    assert args.command == "worker"
    assert flag(argv, "--metrics-host") == "0.0.0.0"  # reachable from outside the container
    port = int(flag(argv, "--metrics-port"))
    assert final["EXPOSE"] == str(port) == str(DEFAULT_METRICS_PORT)
    assert final["STOPSIGNAL"] == "SIGTERM"
    assert f"127.0.0.1:{port}{LIVE_PATH}" in final["HEALTHCHECK"]
    assert final["USER"] not in ("root", "0")
    health_cmd = json.loads(final["HEALTHCHECK"].split(" CMD ", 1)[1])
    assert health_cmd[0] == "python"
    compile(health_cmd[2], "<healthcheck>", "exec")  # the probe is valid Python


def test_dockerfile_copies_what_exists_and_the_example_app_loads() -> None:
    ins = docker_instructions()
    args = {k: v for w, rest in ins if w == "ARG" for k, _, v in [rest.partition("=")]}
    for word, rest in ins:
        if word != "COPY" or rest.startswith("--from"):
            continue
        *sources, _dest = rest.split()
        for src in sources:
            src = args.get(src.strip("${}"), src) if src.startswith("$") else src
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
    spec = importlib.util.spec_from_file_location(
        "deploy_example_tasks", ROOT / args["APP_DIR"] / "myapp" / "tasks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert isinstance(module.app, fairq.App) and module.app.tasks


# -- Kubernetes ---------------------------------------------------------------------------------
K8S = DEPLOY / "kubernetes"


def manifests() -> dict[tuple[str, str], dict[str, Any]]:
    docs: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["apiVersion"] and doc["metadata"]["name"]
            docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


def containers(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = pod_spec["containers"]
    for c in found:
        parse_fairq(c["command"])
        env = {e["name"]: e for e in c.get("env", [])}
        assert "FAIRQ_DATABASE_URL" in env, c["name"]
    return found


def test_kustomization_lists_every_manifest() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files


def test_workers_drain_within_their_grace_and_probe_the_right_paths() -> None:
    m = manifests()
    dep = m[("Deployment", "fairq-worker")]
    pod = dep["spec"]["template"]["spec"]
    (c,) = containers(pod)
    argv = c["command"]
    assert parse_fairq(argv).command == "worker"
    grace = float(flag(argv, "--grace-period"))
    assert pod["terminationGracePeriodSeconds"] >= grace + MARGIN
    port = int(flag(argv, "--metrics-port"))
    assert flag(argv, "--metrics-host") == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe, path in (("livenessProbe", LIVE_PATH), ("readinessProbe", READY_PATH)):
        get = c[probe]["httpGet"]
        assert get["path"] == path
        assert ports.get(get["port"], get["port"]) == port
    assert dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(port)


def test_one_exporter_and_a_drain_cronjob() -> None:
    m = manifests()
    exp = m[("Deployment", "fairq-exporter")]
    assert exp["spec"]["replicas"] == 1 and exp["spec"]["strategy"]["type"] == "Recreate"
    (c,) = containers(exp["spec"]["template"]["spec"])
    assert parse_fairq(c["command"]).command == "exporter"
    svc = m[("Service", "fairq-exporter")]
    assert svc["spec"]["selector"] == exp["spec"]["selector"]["matchLabels"]
    cron = m[("CronJob", "fairq-drain")]
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (d,) = containers(pod)
    args = parse_fairq(d["command"])
    assert args.command == "worker" and args.until_empty
    assert pod["terminationGracePeriodSeconds"] >= args.grace_period + MARGIN


def test_applying_the_kustomization_again_works() -> None:
    """`kubectl apply -k` each release: no Job (its pod template is immutable once created, and
    generateName is refused by apply); the migration runs as each worker pod's initContainer,
    with the worker's image and database URL."""
    m = manifests()
    assert not [name for kind, name in m if kind == "Job"]
    for doc in m.values():
        assert "generateName" not in doc["metadata"]
    pod = m[("Deployment", "fairq-worker")]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert parse_fairq(init["command"]).command == "migrate"
    (worker,) = containers(pod)
    assert init["image"] == worker["image"]
    assert init["env"] == [e for e in worker["env"] if e["name"] == "FAIRQ_DATABASE_URL"]


# -- ./scripts/test ------------------------------------------------------------------------------
def test_the_skip_summary_names_reasons_and_the_install_command() -> None:
    from tests.support.skip_summary import INSTALL, summary

    assert summary([]) == []
    lines = summary(["prometheus not installed", "pgbouncer not installed",
                     "prometheus not installed"])
    assert lines[0] == "fairq tests: skipped 3 test(s):"
    assert lines[1] == "  2 x prometheus not installed"
    assert lines[-1].startswith(f"install what they need with: {INSTALL}")
    assert (ROOT / INSTALL).stat().st_mode & 0o111


def test_scripts_test_falls_back_to_the_embedded_server() -> None:
    text = (ROOT / "scripts" / "test").read_text()
    assert "FAIRQ_TEST_EMBEDDED=1" in text and "running the suite on the embedded" in text
    proc = subprocess.run(["bash", "-n", str(ROOT / "scripts" / "test")], capture_output=True)
    assert proc.returncode == 0, proc.stderr
