"""``fairq bench``: every scenario under every policy, plus the peer queues, in one run.

All runs happen in one scratch database (random name, dropped at the end) on the server of
``--dsn`` / ``$FAIRQ_DATABASE_URL`` / the embedded PostgreSQL, one after the other, so their
ratios are comparable; absolute times depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import secrets
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from fairq.bench import metrics, report, runners, scenarios
from fairq.bench.options import POLICIES, add_arguments, report_missing, runs_peers

__all__ = ["POLICIES", "add_arguments", "main", "run", "scratch_database"]


@contextmanager
def scratch_database(admin_dsn: str, prefix: str = "fairq_bench") -> Iterator[str]:
    name = f"{prefix}_{secrets.token_hex(5)}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    params = conninfo_to_dict(admin_dsn)
    params["dbname"] = name
    try:
        yield make_conninfo(**params)  # type: ignore[arg-type]
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                pgsql.Identifier(name)))


class Bar:
    """A tqdm progress bar on stderr, or nothing (``--no-progress``, or tqdm not installed: a bar
    is a convenience, not a reason to refuse a run)."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self._bar: Any = None
        if enabled and importlib.util.find_spec("tqdm") is not None:
            from tqdm import tqdm

            self._bar = tqdm(total=total, file=sys.stderr, unit="run", dynamic_ncols=True)

    def step(self, label: str) -> Callable[[int], None]:
        if self._bar is not None:
            self._bar.set_description(label)

        def jobs(done: int) -> None:
            if self._bar is not None:
                self._bar.set_postfix_str(f"{done} jobs", refresh=True)
        return jobs

    def done(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def run_peers(admin_dsn: str, quick: bool, bar: Bar) -> dict[str, Any]:
    """PgQueuer and Procrastinate on the same server: drain throughput and the noisy neighbour."""
    from fairq.bench.peers import pgqueuer_bench as pgq
    from fairq.bench.peers import procrastinate_bench as pro

    n_pgq, n_pro = (1_000, 500) if quick else (20_000, 4_000)
    out: dict[str, Any] = {}
    steps: list[tuple[str, str, Callable[[str], dict[str, Any]]]] = [
        ("pgqueuer", "drain", lambda d: pgq.drain(d, n_pgq)),
        ("procrastinate", "drain", lambda d: pro.drain(d, n_pro)),
        ("pgqueuer", "noisy", lambda d: pgq.noisy_neighbour(d)),
        ("procrastinate", "noisy", lambda d: pro.noisy_neighbour(d, lock_per_tenant=True)),
    ]
    with scratch_database(admin_dsn, "fairq_bench_peers") as dsn:
        for peer, what, fn in steps:
            bar.step(f"{peer} {what}")
            try:
                if peer not in out:
                    (pgq if peer == "pgqueuer" else pro).install(dsn)
                    out[peer] = {}
                out[peer][what] = fn(dsn)
            except Exception as exc:
                out.setdefault(peer, {})[what] = {"error": f"{type(exc).__name__}: {exc}"}
            bar.done()
    return out


def main(argv: Sequence[str] | None = None, *, dsn: str | None = None) -> int:
    p = argparse.ArgumentParser(prog="fairq bench", description=__doc__)
    add_arguments(p)
    args = p.parse_args(argv)
    return run(args, dsn)


def run(args: argparse.Namespace, dsn: str | None) -> int:
    """Every scenario under every policy (then the peers), print the report; exit code 2 for bad
    options or a missing optional package, 1 if a run failed."""
    from fairq.config import resolve_dsn

    if report_missing(args):
        return 2
    admin = resolve_dsn(dsn)
    table = scenarios.TINY if args.tiny else scenarios.QUICK if args.quick else scenarios.FULL
    names = args.scenario or list(table)
    unknown = [n for n in names if n not in table]
    policies = args.policy or list(POLICIES)
    bad = [x for x in policies if x not in POLICIES]
    if unknown or bad:
        print(f"fairq bench: unknown scenario/policy {', '.join(unknown + bad)}", file=sys.stderr)
        return 2
    deadline = args.deadline or (6.0 if args.quick or args.tiny else 90.0)
    peers = runs_peers(args)
    bar = Bar(len(names) * len(policies) + (4 if peers else 0), enabled=not args.no_progress)
    if threading.current_thread() is threading.main_thread():  # SIGTERM still drops the database
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = datetime.now(UTC)
    t0 = time.monotonic()
    results: list[dict[str, Any]] = []
    about: dict[str, dict[str, Any]] = {}
    try:
        with scratch_database(admin) as bench_dsn:
            for name in names:
                sc = table[name]()
                about[name] = {"about": sc.about, "jobs": sc.total_jobs(), "workers": sc.workers,
                               "slots": sc.slots, "job_seconds": sc.job_seconds,
                               "weights": sc.weights, "caps": sc.caps}
                for policy in policies:
                    progress = bar.step(f"{name} / {policy}")
                    try:
                        data = runners.run(bench_dsn, sc, policy, deadline, progress)
                        results.append(metrics.summarise(data, sc))
                    except Exception as exc:
                        traceback.print_exc(file=sys.stderr)
                        results.append({"scenario": name, "policy": policy,
                                        "error": f"{type(exc).__name__}: {exc}"})
                    bar.done()
        peer_results = run_peers(admin, args.quick, bar) if peers else {"skipped": "not run"}
    finally:
        bar.close()
    doc = {
        "started": started.isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - t0, 1),
        "command": "fairq bench " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else []),
        "mode": "tiny" if args.tiny else "quick" if args.quick else "full",
        "deadline_s": deadline,
        "machine": report.machine(),
        "policies": policies,
        "scenarios": about,
        "results": results,
        "peers": peer_results,
    }
    print(report.markdown(doc))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))
    if args.plots:
        written = report.plots(doc, Path(args.plots))
        print(f"\nplots: {', '.join(str(w) for w in written)}")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
