"""Writes fairq-overview.json and fairq-tenant.json (Grafana dashboards) next to this file.

    python dashboards/generate.py          # regenerate
    python dashboards/generate.py --check  # exit 1 if the committed JSON is stale

Metric names and labels: docs/metrics.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"
Q = 'queue=~"$queue"'
QT = 'queue=~"$queue", tenant="$tenant"'
Json = dict[str, Any]


def vec(metric: str, sel: str) -> str:
    return f"{metric}{{{sel}}}" if sel else metric


def rate(metric: str, sel: str, by: str) -> str:
    agg = f"sum by ({by})" if by else "sum"
    return f"{agg} (rate({vec(metric, sel)}[{RI}]))"


def quantiles(
    metric: str, sel: str, by: str, qs: tuple[float, ...] = (0.5, 0.95, 0.99)
) -> list[tuple[str, str]]:
    legend = " ".join(f"{{{{{label.strip()}}}}}" for label in by.split(","))
    return [
        (
            f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{{{sel}}}[{RI}])))",
            f"p{round(q * 100)} {legend}",
        )
        for q in qs
    ]


def mean(metric: str, sel: str, by: str) -> str:
    return f"{rate(metric + '_sum', sel, by)}\n/\n{rate(metric + '_count', sel, by)}"


def enqueue_rate(sel: str) -> str:
    """Jobs enqueued per second by queue: the producers' own counter where they serve metrics,
    else what the database shows, the backlog's growth plus the jobs claimed from it (most web
    apps that enqueue serve no metrics, and the exporter's per-tenant gauges come from the
    database)."""
    from_db = (f"sum by (queue) (deriv({vec('fairq_tenant_queued_jobs', sel)}[{RI}]))\n+ "
               f"{rate('fairq_jobs_claimed_total', sel, 'queue')}")
    return f"{rate('fairq_jobs_enqueued_total', sel, 'queue')}\nor\n({from_db})"


def claim_share(sel: str, tenant: str = "") -> str:
    """Share of claims per tenant (or of one tenant) over the selected queues."""
    one = f'{sel}, tenant="{tenant}"' if tenant else sel
    return (
        f"{rate('fairq_jobs_claimed_total', one, 'tenant')}\n"
        f"/ ignoring (tenant) group_left\n{rate('fairq_jobs_claimed_total', sel, '')}"
    )


def time_share(sel: str) -> str:
    """Share of worker time per tenant over the selected queues: its handlers' run time
    (fairq_job_run_seconds, counted when each job ends) over everyone's."""
    return (
        f"{rate('fairq_job_run_seconds_sum', sel, 'tenant')}\n"
        f"/ ignoring (tenant) group_left\n{rate('fairq_job_run_seconds_sum', sel, '')}"
    )


def due(sel: str) -> str:
    """Queued jobs that are due (delayed ones, run_at in the future, kept apart as in `fairq
    stats`)."""
    return f"(fairq_tenant_queued_jobs{{{sel}}} - fairq_tenant_delayed_jobs{{{sel}}})"


def weight_share(sel: str, tenant: str = "") -> str:
    """Share of weight per tenant among tenants with due or running jobs (the fair target): a
    tenant with only delayed jobs competes for nothing, as in `fairq stats`."""

    def active(weight: str) -> str:
        return (
            f"max by (tenant) ({weight} and on (tenant) ("
            f"sum by (tenant) {due(sel)} > 0 or "
            f"sum by (tenant) (fairq_tenant_running_jobs{{{sel}}}) > 0))"
        )

    one = f'fairq_tenant_weight{{tenant="{tenant}"}}' if tenant else "fairq_tenant_weight"
    return f"{active(one)}\n/ ignoring (tenant) group_left\nsum({active('fairq_tenant_weight')})"


class Layout:
    def __init__(self) -> None:
        self.panels: list[Json] = []
        self.x = self.y = self.row_h = 0
        self.next_id = 1

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(self._base("row", title, 24, 1) | {"collapsed": False, "panels": []})
        self._newline()

    def add(
        self,
        title: str,
        targets: list[tuple[str, str]],
        *,
        unit: str = "short",
        kind: str = "timeseries",
        w: int = 12,
        h: int = 8,
        description: str = "",
        stack: bool = False,
        minmax: tuple[float, float] | None = None,
        thresholds: list[tuple[float | None, str]] | None = None,
        overrides: list[dict[str, Any]] | None = None,
        mappings: list[dict[str, Any]] | None = None,
    ) -> None:
        if self.x + w > 24:
            self._newline()
        defaults: dict[str, Any] = {"unit": unit}
        if mappings:
            defaults["mappings"] = mappings
        if minmax:
            defaults["min"], defaults["max"] = minmax
        if thresholds:
            defaults["thresholds"] = {
                "mode": "absolute",
                "steps": [{"value": v, "color": c} for v, c in thresholds],
            }
        if kind == "timeseries":
            defaults["custom"] = {
                "drawStyle": "line",
                "lineWidth": 1,
                "fillOpacity": 20 if stack else 0,
                "stacking": {"mode": "normal" if stack else "none", "group": "A"},
                "showPoints": "never",
            }
            if thresholds:
                defaults["custom"]["thresholdsStyle"] = {"mode": "dashed"}
        options: dict[str, Any] = (
            {
                "legend": {
                    "displayMode": "table",
                    "placement": "right",
                    "showLegend": True,
                    "calcs": ["lastNotNull", "max"],
                },
                "tooltip": {"mode": "multi", "sort": "desc"},
            }
            if kind == "timeseries"
            else {
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "colorMode": "value",
                "graphMode": "area",
                "textMode": "auto",
            }
        )
        panel = self._base(kind, title, w, h) | {
            "datasource": DS,
            "description": description,
            "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
            "options": options,
            "targets": [
                {
                    "refId": chr(ord("A") + i),
                    "datasource": DS,
                    "expr": expr,
                    "legendFormat": legend,
                    "range": True,
                    "instant": False,
                }
                for i, (expr, legend) in enumerate(targets)
            ],
        }
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)

    def _base(self, kind: str, title: str, w: int, h: int) -> Json:
        panel = {
            "id": self.next_id,
            "type": kind,
            "title": title,
            "gridPos": {"x": self.x, "y": self.y, "w": w, "h": h},
        }
        self.next_id += 1
        return panel

    def _newline(self) -> None:
        self.y += self.row_h
        self.x = self.row_h = 0
        if self.panels and self.panels[-1]["type"] == "row":
            self.y += 1


def dashed(regex: str) -> dict[str, Any]:
    return {
        "matcher": {"id": "byRegexp", "options": regex},
        "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}],
    }


def variable(name: str, query: str, *, multi: bool) -> dict[str, Any]:
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "regex": "",
        "multi": multi,
        "includeAll": multi,
        **({"allValue": ".*"} if multi else {}),
        "current": {},
        "options": [],
        "hide": 0,
    }


def dashboard(uid: str, title: str, panels: list[Json], variables: list[dict[str, Any]]) -> Json:
    ds_var = {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "regex": "",
        "current": {},
        "options": [],
        "hide": 0,
        "refresh": 1,
    }
    return {
        "uid": uid,
        "title": title,
        "tags": ["fairq"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "timezone": "",
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "annotations": {"list": []},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "links": [
            {
                "type": "dashboards",
                "tags": ["fairq"],
                "asDropdown": False,
                "title": "fairq",
                "includeVars": True,
                "keepTime": True,
            }
        ],
        "templating": {"list": [ds_var, *variables]},
        "panels": panels,
    }


def overview() -> Json:
    L = Layout()
    L.row("Throughput")
    L.add(
        "Jobs per second",
        [
            # From the database (every producer), not from worker processes' own enqueues.
            (f"sum (rate(fairq_jobs_inserted_total[{RI}]))", "enqueued (all queues)"),
            (rate("fairq_jobs_claimed_total", Q, "queue"), "claimed {{queue}}"),
            (rate("fairq_jobs_finished_total", Q, "queue, outcome"), "{{outcome}} {{queue}}"),
        ],
        unit="ops",
    )
    L.add(
        "Claims per tenant",
        [(rate("fairq_jobs_claimed_total", Q, "tenant"), "{{tenant}}")],
        unit="ops",
        stack=True,
    )
    L.row("Waiting")
    L.add(
        "Wait p50 / p95 / p99 per tenant (eligible to claimed)",
        quantiles("fairq_job_wait_seconds", Q, "tenant"),
        unit="s",
        w=24,
        h=10,
        description="From the job's run_at to its claim, on the database clock.",
    )
    L.add(
        "Backlog (due jobs; delayed apart)",
        [
            (f"sum by (tenant) {due(Q)}", "{{tenant}}"),
            (f"sum (fairq_tenant_delayed_jobs{{{Q}}})", "delayed (all tenants)"),
        ],
        stack=True,
        overrides=[{
            "matcher": {"id": "byRegexp", "options": "delayed .*"},
            "properties": [
                {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                {"id": "custom.stacking", "value": {"mode": "none", "group": "A"}},
            ],
        }],
        description="Due: queued with run_at reached. Delayed (dashed, not stacked): queued "
        "with run_at in the future (delays and retries' backoff).",
    )
    L.add(
        "Oldest runnable job age",
        [(f"max by (tenant) (fairq_oldest_runnable_job_age_seconds{{{Q}}})", "{{tenant}}")],
        unit="s",
    )
    L.add(
        "Running vs caps",
        [
            (f"sum by (tenant) (fairq_tenant_running_jobs{{{Q}}})", "running {{tenant}}"),
            ("max by (tenant) (fairq_tenant_max_running)", "cap {{tenant}}"),
        ],
        overrides=[dashed("cap .*")],
        description="Dashed: max_running; 0 means paused.",
    )
    L.add(
        "Why tenants wait (tenants by reason)",
        [(f'sum by (reason) (fairq_tenants_waiting{{{Q}, reason!="running"}})', "{{reason}}")],
        stack=True,
        w=24,
        description="Tenants with a queued job, by why their next job has not started (the "
        "reason of `fairq tenants explain`, docs/explain.md): no_worker, at_cap, rate_limited, "
        "no_due_jobs, group_at_share, waiting_turn. Tenants whose jobs all run are left out.",
    )
    L.row("Fairness")
    L.add(
        "Jain's fairness index",
        [(f"fairq_fairness_jain_index{{{Q}}}", "{{queue}}")],
        minmax=(0, 1),
        thresholds=[(None, "red"), (0.8, "green")],
        w=8,
        description="Over backlogged tenants, claims per unit of weight, recent window. 1 = fair.",
    )
    L.add(
        "Max share error",
        [(f"fairq_fairness_max_share_error{{{Q}}}", "{{queue}}")],
        unit="percentunit",
        w=8,
        description="max over tenants of |share of claims - share of weight|",
    )
    L.add(
        "Tenants folded into __other__",
        [("fairq_metrics_tenants_folded", "folded")],
        kind="stat",
        w=8,
    )
    L.add(
        "Tenant groups: share of claims vs share of weight",
        [
            (f"fairq_group_claim_share{{{Q}}}", "claims {{group}}"),
            (f"fairq_group_weight_share{{{Q}}}", "weight {{group}}"),
        ],
        unit="percentunit",
        w=24,
        description="Per tenant group, over the groups with backlogged tenants, recent window.",
    )
    L.add(
        "Share of claims vs share of weight",
        [
            (claim_share(Q), "claims {{tenant}}"),
            (weight_share(Q), "weight {{tenant}}"),
        ],
        unit="percentunit",
        w=12,
        h=10,
        overrides=[dashed("weight .*")],
        description="Solid: share of claims. Dashed: share of weight among active tenants.",
    )
    L.add(
        "Share of worker time vs share of weight",
        [
            (time_share(Q), "worker time {{tenant}}"),
            (weight_share(Q), "weight {{tenant}}"),
        ],
        unit="percentunit",
        w=12,
        h=10,
        overrides=[dashed("weight .*")],
        description="Solid: share of the handlers' run time (fairq_job_run_seconds, counted as "
        "each job ends, so a long job shows when it finishes). Dashed: share of weight among "
        "active tenants. A tenant with longer jobs uses more worker time than its share of "
        "claims.",
    )
    L.row("Claims")
    L.add(
        "Claim latency p95 / p99 (client round trip)",
        quantiles("fairq_claim_seconds", Q, "policy, result", (0.95, 0.99)),
        unit="s",
    )
    L.add(
        "Claim server time: planning vs execution (mean)",
        [
            (mean("fairq_claim_planning_seconds", "", "policy"), "planning {{policy}}"),
            (mean("fairq_claim_execution_seconds", "", "policy"), "execution {{policy}}"),
        ],
        unit="s",
        stack=True,
    )
    L.add(
        "Empty-claim ratio",
        [
            (
                rate("fairq_claim_seconds_count", Q + ', result="empty"', "queue")
                + "\n/\n"
                + rate("fairq_claim_seconds_count", Q, "queue"),
                "{{queue}}",
            )
        ],
        unit="percentunit",
        minmax=(0, 1),
    )
    L.add(
        "Claim statement replan ratio (plans / calls)",
        [("fairq_claim_replan_ratio", "{{policy}}")],
        unit="percentunit",
    )
    L.row("Health")
    L.add(
        "Expired leases",
        [
            (rate("fairq_leases_expired_total", Q, "queue"), "expired {{queue}}"),
            (
                rate("fairq_jobs_finished_total", Q + ', outcome="lease_lost"', "queue"),
                "lease_lost {{queue}}",
            ),
        ],
        unit="ops",
        w=8,
    )
    L.add("Dead tuples (jobs table)", [("fairq_jobs_dead_tuples", "dead tuples")], w=8)
    L.add(
        "Since last (auto)vacuum",
        # -1 (shown as "never vacuumed") when the table was never vacuumed: the timestamp is 0
        # then, and time() - 0 would read as ~56 years.
        [(
            "(time() - (fairq_jobs_last_autovacuum_timestamp_seconds > 0))\n"
            "or (fairq_jobs_last_autovacuum_timestamp_seconds * 0 - 1)",
            "since (auto)vacuum",
        )],
        kind="stat",
        unit="s",
        w=8,
        mappings=[{"type": "value", "options": {"-1": {"text": "never vacuumed", "index": 0}}}],
    )
    return dashboard(
        "fairq-overview",
        "fairq / overview",
        L.panels,
        [variable("queue", "label_values(fairq_tenant_queued_jobs, queue)", multi=True)],
    )


def tenant() -> Json:
    L = Layout()
    L.row("Tenant $tenant")
    L.add("Weight", [('fairq_tenant_weight{tenant="$tenant"}', "weight")], kind="stat", w=6, h=4)
    L.add(
        "Cap (max_running)",
        [('fairq_tenant_max_running{tenant="$tenant"}', "cap")],
        kind="stat",
        w=6,
        h=4,
    )
    L.add("Due jobs", [(f"sum {due(QT)}", "due")], kind="stat", w=6, h=4,
          description="Queued with run_at reached; delayed ones are on the backlog panel.")
    L.add(
        "Oldest runnable job",
        [(f"max(fairq_oldest_runnable_job_age_seconds{{{QT}}})", "age")],
        kind="stat",
        unit="s",
        w=6,
        h=4,
    )
    L.add(
        "Jobs per second",
        [
            (enqueue_rate(QT), "enqueued {{queue}}"),
            (rate("fairq_jobs_claimed_total", QT, "queue, policy"), "claimed {{queue}} {{policy}}"),
            (rate("fairq_jobs_finished_total", QT, "queue, outcome"), "{{outcome}} {{queue}}"),
        ],
        unit="ops",
    )
    L.add("Wait p50 / p95 / p99", quantiles("fairq_job_wait_seconds", QT, "queue"), unit="s")
    L.add(
        "Run time p50 / p95 / p99 per task",
        quantiles("fairq_job_run_seconds", QT, "task"),
        unit="s",
    )
    L.add(
        "Running vs cap",
        [
            (f"sum by (queue) (fairq_tenant_running_jobs{{{QT}}})", "running {{queue}}"),
            ('fairq_tenant_max_running{tenant="$tenant"}', "cap"),
        ],
        overrides=[dashed("cap")],
    )
    L.add(
        "Backlog (due jobs; delayed apart)",
        [
            (f"sum by (queue) {due(QT)}", "{{queue}}"),
            (f"sum by (queue) (fairq_tenant_delayed_jobs{{{QT}}})", "delayed {{queue}}"),
        ],
        stack=True,
        overrides=[{
            "matcher": {"id": "byRegexp", "options": "delayed .*"},
            "properties": [
                {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                {"id": "custom.stacking", "value": {"mode": "none", "group": "A"}},
            ],
        }],
        description="Due: queued with run_at reached. Delayed (dashed): run_at in the future.",
    )
    L.add(
        "Oldest runnable job age",
        [(f"max by (queue) (fairq_oldest_runnable_job_age_seconds{{{QT}}})", "{{queue}}")],
        unit="s",
    )
    L.add(
        "Share of claims vs share of weight",
        [
            (claim_share(Q, "$tenant"), "claims"),
            (weight_share(Q, "$tenant"), "weight"),
        ],
        unit="percentunit",
        overrides=[dashed("weight")],
        description="Across the selected queues; weight share among active tenants.",
    )
    L.add(
        "Failure ratio",
        [
            (
                rate("fairq_jobs_finished_total", QT + ', outcome!="done"', "outcome")
                + "\n/ ignoring (outcome) group_left\n"
                + rate("fairq_jobs_finished_total", QT, ""),
                "{{outcome}}",
            )
        ],
        unit="percentunit",
    )
    L.add(
        "Queue fairness (Jain's index)",
        [(f"fairq_fairness_jain_index{{{Q}}}", "{{queue}}")],
        minmax=(0, 1),
        thresholds=[(None, "red"), (0.8, "green")],
        w=24,
        h=6,
    )
    L.add(
        "Rate limit and tokens",
        [
            (f"fairq_tenant_rate_limit{{{QT}}}", "limit/s {{queue}}"),
            (f"fairq_tenant_rate_tokens{{{QT}}}", "tokens {{queue}}"),
        ],
        w=12,
        description="Jobs started per second at most, and the bucket (jobs it may start now).",
    )
    L.add(
        "Throttled (waiting for a token)",
        [
            (f"sum by (queue) (rate(fairq_tenant_throttled_seconds_total{{{QT}}}[{RI}]))",
             "share of time {{queue}}"),
            (f"avg_over_time(fairq_tenant_throttled{{{QT}}}[$__range])", "asleep, range {{queue}}"),
        ],
        unit="percentunit",
        w=12,
        description="Share of the time the tenant had a due job but no token (its throttled "
        "seconds per second), and the share of scrapes that found it asleep until its next token.",
    )
    return dashboard(
        "fairq-tenant",
        "fairq / tenant",
        L.panels,
        [
            variable("queue", "label_values(fairq_tenant_queued_jobs, queue)", multi=True),
            variable(
                "tenant",
                'label_values(fairq_tenant_queued_jobs{queue=~"$queue"}, tenant)',
                multi=False,
            ),
        ],
    )


def main() -> int:
    stale = []
    for name, dash in (("fairq-overview.json", overview()), ("fairq-tenant.json", tenant())):
        text = json.dumps(dash, indent=2) + "\n"
        path = HERE / name
        if "--check" in sys.argv:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run python dashboards/generate.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
