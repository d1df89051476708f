"""The console's view models: what each page (and its JSON twin under /api/) shows, read through
the store's console reads and the API the CLI uses, every input checked as the CLI checks it
(``fairq.validation``: ``InvalidInput``, one line)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fairq import validation as v
from fairq.errors import InvalidInput
from fairq.models import PATCH_FIELDS, TenantConfig, TenantPatch
from fairq.store import console
from fairq.store.settings import STALE

if TYPE_CHECKING:
    from fairq.app import App

WINDOW_S = 300.0          # share of recent claims: the jobs started in the last 5 minutes
TIMEOUT_MS = 5_000        # every read is bounded
RATE_MINUTES = 10         # the overview's claims/s and done/s
PAGE_SIZES = (25, 50, 100, 200)
DEFAULT_PAGE = 50
HISTORY_BUCKET_S = 20     # the tenant chart: 20 s buckets over the last 30 minutes,
HISTORY_BUCKETS = 90      # from the first bucket with claims in its queues
HISTORY_MIN_BUCKETS = 15
JOB_LIMIT = 100
STATUSES = ("queued", "running", "done", "failed", "cancelled")
MAX_PAGE = 1_000_000


def jsonable(value: Any) -> Any:
    """Dataclasses, datetimes and containers as plain JSON values (non-finite floats: None)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): jsonable(x) for k, x in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(x) for x in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _opt_name(kind: str, value: str | None) -> str | None:
    return None if value in (None, "") else v.name(kind, value)


def _int(kind: str, text: str | None, default: int, lo: int, hi: int) -> int:
    if text in (None, ""):
        return default
    return v.integer(kind, v.parse_integer(kind, str(text)), lo, hi)


# -- overview ------------------------------------------------------------------------------
def overview(app: App) -> dict[str, Any]:
    """Queues (due, delayed, running, failed), claims/s and done/s per minute, workers."""
    o = console.overview(app.store, minutes=RATE_MINUTES, timeout_ms=TIMEOUT_MS)
    rates = [{"minute": r["minute"], "claims_per_s": r["claims"] / 60.0,
              "done_per_s": r["done"] / 60.0} for r in o["rates"]]
    last = o["last_minute"][0]
    alive = [w for w in o["workers"] if w["alive"]]
    return {"queues": o["queues"], "claims_per_s": last["claims"] / 60.0,
            "done_per_s": last["done"] / 60.0, "rates": rates, "workers": o["workers"],
            "workers_alive": len(alive)}


# -- tenants -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class TenantQuery:
    """The tenant list's search, order and page, checked."""

    search: str | None = None
    queue: str | None = None
    sort: str = "tenant"
    desc: bool = False
    page: int = 1
    per_page: int = DEFAULT_PAGE

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> TenantQuery:
        sort = params.get("sort") or "tenant"
        if sort not in console.SORTS:
            raise InvalidInput(f"sort must be one of {', '.join(console.SORTS)}, not {sort!r} "
                               "(reason, queued, share and wait are computed for the page only: "
                               "sort them within the page)")
        order = params.get("order") or "asc"
        if order not in ("asc", "desc"):
            raise InvalidInput(f"order must be asc or desc, not {order!r}")
        per_page = _int("per_page", params.get("per_page"), DEFAULT_PAGE, 1, max(PAGE_SIZES))
        search = params.get("q") or None
        if search is not None:
            v.name("search", search)
        return cls(search, _opt_name("queue", params.get("queue")), sort, order == "desc",
                   _int("page", params.get("page"), 1, 1, MAX_PAGE), per_page)


def tenant_row(r: Mapping[str, Any]) -> dict[str, Any]:
    """One (queue, tenant) of the list: the contract's names first (tenant, reason, weight,
    cap, queued, running, share, wait), then the details."""
    return {
        "tenant": r["tenant"], "reason": r.get("reason", "no_jobs"), "queue": r["queue"],
        "weight": float(r["weight"]), "cap": int(r["max_running"]),
        "queued": int(r.get("queued") or 0), "due": int(r.get("due") or 0),
        "running": int(r.get("running") or 0),
        "share": r.get("claim_share"), "weight_share": r.get("weight_share"),
        "recent_claims": int(r.get("recent_claims") or 0),
        "wait": r.get("oldest_wait_seconds"),
        "group": r["tenant_group"], "rate": r["rate"], "burst": r["burst"],
        "tokens": r.get("tokens"),
    }


def tenants(app: App, q: TenantQuery) -> dict[str, Any]:
    """One page of tenants, in the order asked; the costly columns for this page only."""
    total, rows = console.tenant_page(
        app.store, search=q.search, queue=q.queue, sort=q.sort, desc=q.desc, limit=q.per_page,
        offset=(q.page - 1) * q.per_page, window_s=WINDOW_S, timeout_ms=TIMEOUT_MS)
    pages = max(1, -(-total // q.per_page))
    return {"total": total, "page": q.page, "pages": pages, "per_page": q.per_page,
            "window_seconds": WINDOW_S, "tenants": [tenant_row(r) for r in rows]}


def tenant(app: App, name: str) -> dict[str, Any]:
    """One tenant: settings, per queue the explain answer and the list's facts, its recent
    jobs, and its wait and share over the last half hour (from the jobs table)."""
    name = v.name("tenant", name)
    settings = app.tenants.get(name)
    explain = app.tenants.explain(name)
    rows = [tenant_row(r) for r in console.tenant_rows(app.store, name, window_s=WINDOW_S,
                                                      timeout_ms=TIMEOUT_MS)]
    history = console.tenant_history(app.store, name, bucket_s=HISTORY_BUCKET_S,
                                     buckets=HISTORY_BUCKETS, timeout_ms=TIMEOUT_MS)
    jobs = app.jobs(tenant=name, limit=20)
    first = next((i for i, h in enumerate(history) if h["all_claims"]), len(history))
    history = history[min(first, max(0, len(history) - HISTORY_MIN_BUCKETS)):]
    return {
        "tenant": name, "settings": settings, "explain": explain, "queues": rows,
        "history": [{"at": h["at"], "wait_seconds": h["wait_seconds"], "claims": h["claims"],
                     "share": h["claims"] / h["all_claims"] if h["all_claims"] else None}
                    for h in history],
        "bucket_seconds": HISTORY_BUCKET_S, "jobs": jobs,
    }


# -- jobs ----------------------------------------------------------------------------------
def job_filters(params: Mapping[str, str]) -> dict[str, Any]:
    status = params.get("status") or None
    if status is not None and status not in STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(STATUSES)}, not {status!r}")
    return {"status": status, "tenant": _opt_name("tenant", params.get("tenant")),
            "task": _opt_name("task", params.get("task")),
            "queue": _opt_name("queue", params.get("queue")),
            "limit": _int("limit", params.get("limit"), JOB_LIMIT, 1, 1000)}


def jobs(app: App, filters: Mapping[str, Any]) -> dict[str, Any]:
    return {"filters": dict(filters), "jobs": app.jobs(**filters)}


def job_id(text: str) -> int:
    return _int("job id", text, 0, 1, 2**63 - 1)


# -- actions -------------------------------------------------------------------------------
class FieldError(InvalidInput):
    """A refused settings change, and the form field it concerns (None: the whole form);
    ``stale``: refused because another operator changed the settings meanwhile."""

    def __init__(self, message: str, field: str | None, *, stale: bool = False) -> None:
        super().__init__(message)
        self.field, self.stale = field, stale


# The fields of the tenant form besides the patch's own: its CSRF token, and the version of the
# settings the page showed (JSON: expected_version). Every other key goes to tenant_patch, which
# refuses any that is not a setting.
FORM_EXTRA = ("csrf", "version")
JSON_EXTRA = ("expected_version",)


def _field_of(message: str) -> str | None:
    """The patch field a refusal from tenant_patch or the store is about (None: the form as a
    whole, as an unknown setting, no setting given or a change made meanwhile)."""
    for f in PATCH_FIELDS:
        if message.startswith((f + " ", f"unknown {f} ")):
            return f
    if "burst needs a rate" in message:  # the store's: the tenant has no rate to burst on
        return "burst"
    return None


def _version(kind: str, value: Any) -> int | None:
    """The version an edit was made on (blank or null: none given, nothing checked)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        value = v.parse_integer(kind, value)
    return v.integer(kind, value, 0, 2**63 - 1)


def patch_from(name: str, fields: Mapping[str, Any], *, form: bool
               ) -> tuple[TenantPatch, int | None]:
    """The tenant patch and the expected version that a form (a blank field: keep) or a JSON
    object asks for. The values are checked once, by ``fairq.validation.tenant_patch`` (numbers
    as text strictly, an unknown key refused); FieldError names the field a refusal is about."""
    extra = FORM_EXTRA if form else JSON_EXTRA
    values = {k: x for k, x in fields.items() if k not in extra
              and not (form and isinstance(x, str) and not x.strip())}
    try:
        expected = _version(extra[-1], fields.get(extra[-1]))
        return v.tenant_patch(name, values, text=True), expected
    except InvalidInput as exc:
        raise FieldError(str(exc), _field_of(str(exc))) from None


def set_tenant(app: App, name: str, fields: Mapping[str, Any], *, form: bool = True
               ) -> TenantConfig:
    """Apply the form's or JSON's change; a refusal (FieldError) says which field."""
    patch, expected = patch_from(v.name("tenant", name), fields, form=form)
    try:
        return app.tenants.patch(patch, expected_version=expected)
    except InvalidInput as exc:
        stale = expected is not None and STALE in str(exc)
        raise FieldError(str(exc), None if stale else _field_of(str(exc)), stale=stale) from None


def group_names(app: App) -> list[str]:
    """The groups a tenant can be put in (the form's choices)."""
    return sorted({g.name for g in app.groups.list()} | {v.DEFAULT_GROUP})


def retry_job(app: App, jid: int) -> dict[str, Any]:
    done = app.retry(jid)
    if done.not_retried:
        raise InvalidInput(f"job {jid} not retried: {done.not_retried[jid]}")
    return {"retried": list(done)}


def retry_tenant(app: App, name: str) -> dict[str, Any]:
    done = app.retry(failed=True, tenant=v.name("tenant", name))
    return {"retried": list(done), "not_retried": done.not_retried}


def cancel_job(app: App, jid: int) -> dict[str, Any]:
    if not app.cancel(jid):
        raise InvalidInput(f"job {jid} not cancelled: only a queued job can be cancelled")
    return {"cancelled": [jid]}


def cancel_tenant(app: App, name: str) -> dict[str, Any]:
    return {"cancelled": app.cancel_tenant(v.name("tenant", name))}
