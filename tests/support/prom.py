"""Test helpers: a real, throwaway Prometheus, and PromQL extraction from Grafana dashboards.

    with running_prometheus(["127.0.0.1:9100"], tmp_path, rule_files=[alerts]) as prom:
        prom.wait_for("up == 1")
        prom.query("rate(fairq_jobs_claimed_total[1m])")

`start_prometheus` / `Prometheus.stop` are there for pytest fixtures (`request.addfinalizer`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class PromQLError(RuntimeError):
    """The HTTP API answered with status=error (bad expression, timeout, ...)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


class Prometheus:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, workdir: Path) -> None:
        self.proc, self.url, self.workdir = proc, url, workdir

    @property
    def log(self) -> str:
        return (self.workdir / "prometheus.log").read_text(errors="replace")

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as e:  # 400/422/503 carry a JSON error body
            try:
                body = json.load(e)
            except ValueError:
                raise PromQLError(f"{url}: HTTP {e.code}") from e
        if body.get("status") != "success":
            raise PromQLError(f"{params.get('query', path)}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; returns the result list (vector/matrix) or [scalar/string]."""
        data = self.api("/api/v1/query", query=expr)
        res = data["result"]
        return res if data["resultType"] in ("vector", "matrix") else [{"value": res}]

    def wait_for(self, expr: str, timeout: float = 30.0, interval: float = 0.2) -> list[Any]:
        """Poll `expr` until it returns a non-empty result."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result:
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expr!r} still empty after {timeout}s")
            time.sleep(interval)

    def targets(self) -> list[dict[str, Any]]:
        targets: list[dict[str, Any]] = self.api("/api/v1/targets")["activeTargets"]
        return targets

    def wait_scraped(self, samples: int = 3, timeout: float = 60.0) -> None:
        """Wait until every target is up and has `samples` scrapes stored (rate() needs 2).

        Prometheus hands new targets to its scrapers about 5s after start, so this takes
        5s + samples * scrape_interval at least.
        """
        deadline = time.monotonic() + timeout
        while not (ts := self.targets()) or any(t["health"] != "up" for t in ts):
            if time.monotonic() > deadline:
                raise TimeoutError(f"targets not up after {timeout}s: {ts}")
            time.sleep(0.2)
        self.wait_for(
            f"min(count_over_time(up[5m])) >= {samples}",
            timeout=max(deadline - time.monotonic(), 1.0),
        )

    def rules(self) -> list[dict[str, Any]]:
        """Loaded rules (alerting and recording), each with its `query` as Prometheus parsed it."""
        groups = self.api("/api/v1/rules")["groups"]
        return [r for g in groups for r in g["rules"]]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def write_config(
    workdir: Path,
    targets: Sequence[str],
    rule_files: Sequence[Path] = (),
    scrape_interval: str = "1s",
    metrics_path: str = "/metrics",
    extra_scrape_configs: Sequence[Mapping[str, Any]] = (),
    config: Mapping[str, Any] | None = None,
) -> Path:
    """The configuration Prometheus runs with: ``config`` as given, or one scrape job "fairq"."""
    cfg: Mapping[str, Any] = config if config is not None else {  # JSON is valid YAML
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "evaluation_interval": scrape_interval,
        },
        "rule_files": [str(Path(p).resolve()) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": "fairq",
                "metrics_path": metrics_path,
                "static_configs": [{"targets": list(targets)}],
            },
            *extra_scrape_configs,
        ],
    }
    path = workdir / "prometheus.yml"
    path.write_text(json.dumps(cfg, indent=2))
    return path


def start_prometheus(
    targets: Sequence[str],
    workdir: Path,
    *,
    rule_files: Sequence[Path] = (),
    scrape_interval: str = "1s",
    metrics_path: str = "/metrics",
    extra_scrape_configs: Sequence[Mapping[str, Any]] = (),
    ready_timeout: float = 30.0,
    binary: str | None = None,
    config: Mapping[str, Any] | None = None,
) -> Prometheus:
    """Start Prometheus on a free loopback port, storing everything under `workdir`.

    `targets` ("host:port") form the scrape job "fairq"; `extra_scrape_configs` are appended
    verbatim (Prometheus scrape_config objects). Returns once `/-/ready` answers 200; the
    caller must call `.stop()` (or use `running_prometheus`).
    """
    binary = binary or prometheus_binary()
    if not binary:
        raise FileNotFoundError("prometheus not on PATH (run .ci/install-prometheus.sh)")
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = write_config(
        workdir, targets, rule_files, scrape_interval, metrics_path, extra_scrape_configs, config
    )
    for _attempt in range(3):  # the free port may be taken between probe and bind
        port = free_port()
        with (workdir / "prometheus.log").open("wb") as log:
            proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        prom = Prometheus(proc, f"http://127.0.0.1:{port}", workdir)
        if _wait_ready(prom, ready_timeout):
            return prom
        prom.stop()
        if "address already in use" not in prom.log:
            break
    raise RuntimeError(f"prometheus did not become ready:\n{prom.log[-4000:]}")


def _wait_ready(prom: Prometheus, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and prom.proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=1) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.05)
    return False


@contextmanager
def running_prometheus(
    targets: Sequence[str], workdir: Path, **kwargs: Any
) -> Iterator[Prometheus]:
    prom = start_prometheus(targets, workdir, **kwargs)
    try:
        yield prom
    finally:
        prom.stop()


# --- PromQL helpers ---------------------------------------------------------------------------

_COMPARISON = re.compile(r"(==|!=|>=|<=|>|<)(\s*bool\b)?")


def without_thresholds(expr: str) -> str:
    """Turn every filtering comparison into a `bool` one (`a > 0.5` -> `a > bool 0.5`).

    The result keeps every series the comparison would have dropped (valued 0/1), so a
    threshold expression can be checked to return data on healthy samples. Label matchers and
    strings are left alone. Comparisons between two scalars already need `bool`; `unless`
    clauses invert under this rewrite, so expressions meant for it should use `and` instead.
    """
    out: list[str] = []
    i, depth, quote = 0, 0, ""
    while i < len(expr):
        c = expr[i]
        if quote:
            if c == "\\":
                out.append(expr[i : i + 2])
                i += 2
                continue
            quote = "" if c == quote else quote
        elif c in "\"'`":
            quote = c
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif depth == 0 and (m := _COMPARISON.match(expr, i)):
            out.append(m.group(0) if m.group(2) else f"{m.group(1)} bool")
            i = m.end()
            continue
        out.append(c)
        i += 1
    return "".join(out)


_VAR = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)\]\]")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*\w+\s*\)\s*$", re.S)
_QUERY_RESULT = re.compile(r"^\s*query_result\((.*)\)\s*$", re.S)


def substitute(expr: str, substitutions: Mapping[str, str]) -> str:
    """Replace Grafana variables ($x, ${x}, ${x:fmt}, [[x]]); unknown ones raise KeyError."""

    def repl(m: re.Match[str]) -> str:
        name = next(g for g in m.groups() if g)
        if name not in substitutions:
            raise KeyError(f"no substitution for ${name} in {expr!r}")
        return substitutions[name]

    return _VAR.sub(repl, expr)


def _variable_promql(query: Any) -> str | None:
    """The PromQL inside a Prometheus template-variable query, if it has one."""
    if isinstance(query, dict):
        query = query.get("query")
    if not isinstance(query, str) or not query.strip():
        return None
    for pattern in (_LABEL_VALUES, _QUERY_RESULT):
        if m := pattern.match(query):
            return m.group(1)
    if re.match(r"^\s*(label_values|label_names|metrics)\(", query):
        return None  # label_values(label) etc.: no series expression
    return query


def dashboard_exprs(path: str | Path, substitutions: Mapping[str, str]) -> list[str]:
    """Every PromQL expression of a Grafana dashboard JSON, variables substituted.

    Covers panel targets (also those nested in rows, collapsed or not; library panels are
    references and are not resolved)
    and the queries of `query` template variables. `substitutions` maps variable names without
    `$` (e.g. "datasource", "__rate_interval") to their text.
    """
    dash = json.loads(Path(path).read_text())
    exprs: list[str] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                if isinstance(target.get("expr"), str) and target["expr"].strip():
                    exprs.append(target["expr"])
            walk(panel.get("panels", []))

    walk(dash.get("panels", []))
    walk(dash.get("rows", []))  # pre-5.0 layout
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") == "query" and (q := _variable_promql(var.get("query"))):
            exprs.append(q)
    return [substitute(e, substitutions) for e in exprs]
