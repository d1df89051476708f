"""The bench's outputs: a Markdown table per scenario, the peers' table, and PNG plots."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

COLUMNS: list[tuple[str, str, str]] = [
    ("policy", "policy", "{}"),
    ("jobs/s", "throughput_jobs_s", "{:.0f}"),
    ("done", "completed_jobs", "{}"),
    ("wait p50/p95/p99 s", "", ""),
    ("tenant p95 median/max s", "", ""),
    ("claim p95/p99 ms", "", ""),
    ("plan/exec ms", "", ""),
    ("lock-wait %", "lock_wait_share", "{:.0%}"),
    ("empty %", "empty_claim_ratio", "{:.0%}"),
    ("Jain", "jain_index", "{:.3f}"),
    ("max share err", "max_share_error", "{:.3f}"),
]


def machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "loadavg_1m": os.getloadavg()[0]}


def _f(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    try:
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


def _triple(r: dict[str, Any], keys: tuple[str, ...], fmt: str) -> str:
    return "/".join(_f(r.get(k), fmt) for k in keys)


def row(r: dict[str, Any]) -> list[str]:
    if "error" in r:
        return [r["policy"], "error: " + r["error"][:80]] + [""] * (len(COLUMNS) - 2)
    done = f"{r['completed_jobs']}/{r['expected_jobs']}" + (" (deadline)" if r["timed_out"] else "")
    cells = [r["policy"], _f(r["throughput_jobs_s"], "{:.0f}"), done,
             _triple(r, ("wait_p50_s", "wait_p95_s", "wait_p99_s"), "{:.2f}"),
             _triple(r, ("tenant_p95_median_s", "tenant_p95_max_s"), "{:.2f}"),
             _triple(r, ("claim_p95_ms", "claim_p99_ms"), "{:.1f}"),
             _triple(r, ("plan_ms", "exec_ms"), "{:.2f}")]
    cells += [_f(r.get(key), fmt) for _, key, fmt in COLUMNS[7:]]
    if r.get("cap_violations"):
        cells[0] += f" ({r['cap_violations']} caps exceeded)"
    return cells


def table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def markdown(doc: dict[str, Any]) -> str:
    out = [f"# fairq bench ({doc['mode']}), {doc['started']}, {doc['seconds']} s, "
           f"load {doc['machine']['loadavg_1m']:.1f} on {doc['machine']['cpus']} CPUs", ""]
    for name, sc in doc["scenarios"].items():
        out.append(f"## {name}: {sc['about']}")
        out.append("")
        rows = [row(r) for r in doc["results"] if r["scenario"] == name]
        out.append(table([c[0] for c in COLUMNS], rows))
        notes = sorted({n for r in doc["results"] if r["scenario"] == name
                        for n in r.get("notes", []) if r.get("policy") == "rr_article"})
        groups = [r for r in doc["results"] if r["scenario"] == name and r.get("group_wait")]
        if groups and len(groups[0]["group_wait"]) > 1:
            out.append("")
            out.append("p95 wait by group (s): " + "; ".join(
                f"{r['policy']} " + ", ".join(f"{g} {_f(v['p95_s'], '{:.2f}')}"
                                              for g, v in r["group_wait"].items())
                for r in groups))
        if notes:
            out.append("")
            out.append("rr_article: " + "; ".join(notes))
        out.append("")
    peers = doc.get("peers") or {}
    if "skipped" in peers:
        out.append(f"Peers: skipped ({peers['skipped']})")
    elif peers:
        out.append("## Peers (same server, same run)")
        out.append("")
        prow = []
        for peer, runs in peers.items():
            d, n = runs.get("drain", {}), runs.get("noisy", {})
            small = n.get("small_tenants_wait", {}) if isinstance(n, dict) else {}
            prow.append([peer, _f(d.get("jobs_per_s"), "{:.0f}"), str(d.get("jobs", "-")),
                         d.get("error", "") or f"{d.get('processes')} proc",
                         _f(small.get("p95_s"), "{:.2f}"),
                         _f(n.get("small_tenants_last_claim_index"), "{}"),
                         n.get("error", "") or n.get("tenant_model", "")])
        out.append(table(["peer", "drain jobs/s", "jobs", "drain setup", "noisy: small p95 s",
                          "noisy: last small claim #", "tenant model"], prow))
        out.append("")
    return "\n".join(out)


def plots(doc: dict[str, Any], folder: Path) -> list[Path]:
    """Per scenario: each tenant's p95 wait per policy; share of service over time by group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, sc in doc["scenarios"].items():
        runs = [r for r in doc["results"] if r["scenario"] == name and "error" not in r]
        if not runs:
            continue
        fig, ax = plt.subplots(figsize=(8, 4.5))
        data = [r["tenant_p95_dist_s"] or [0.0] for r in runs]
        ax.boxplot(data, tick_labels=[r["policy"] for r in runs], showfliers=True)
        ax.set_ylabel("p95 wait per tenant (s)")
        ax.set_title(f"{name}: per-tenant wait ({sc['about']})", fontsize=9)
        path = folder / f"{name}_tenant_wait.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
        groups = sorted({g for r in runs for g in r["share_over_time"]["groups"]})
        if len(groups) < 2:
            continue
        fig, axes = plt.subplots(1, len(runs), figsize=(3.2 * len(runs), 3.6), sharey=True,
                                 squeeze=False)
        target = _weight_share(sc, groups)
        for ax, r in zip(axes[0], runs, strict=True):
            sot = r["share_over_time"]
            for g in groups:
                line = ax.plot(sot["t"], sot["groups"].get(g, [0.0] * len(sot["t"])), label=g)
                if g in target:
                    ax.axhline(target[g], color=line[0].get_color(), linestyle=":", linewidth=1)
            ax.set_title(r["policy"], fontsize=9)
            ax.set_xlabel("s since start")
        axes[0][0].set_ylabel("share of jobs started")
        axes[0][-1].legend(fontsize=7)
        fig.suptitle(f"{name}: share of service over time (dotted: weight share)", fontsize=9)
        fig.tight_layout()
        path = folder / f"{name}_share.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def _weight_share(sc: dict[str, Any], groups: list[str]) -> dict[str, float]:
    """Each group's share of the total weight (tiers: gold 2x4, silver 2x2, free 4x1)."""
    weights: dict[str, float] = sc.get("weights") or {}
    if not weights:
        return {}
    by_group: dict[str, float] = {}
    for g in groups:
        by_group[g] = 0.0
    tiers = {4.0: "gold", 2.0: "silver", 1.0: "free"}
    for w in weights.values():
        tier = tiers.get(w)
        if tier is not None and tier in by_group:
            by_group[tier] += w
    total = sum(by_group.values())
    return {g: v / total for g, v in by_group.items()} if total else {}
