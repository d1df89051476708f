"""Tenant and group settings from Python (``app.tenants``, ``app.groups``): weights, caps, rate
limits and groups, effective from the next claim."""

from __future__ import annotations

import builtins
import enum
from dataclasses import fields
from typing import TYPE_CHECKING, Any, overload

from fairq import validation as v
from fairq.errors import InvalidInput
from fairq.models import (
    GroupConfig,
    TenantConfig,
    TenantDefaults,
    TenantExplanation,
    TenantPatch,
)

if TYPE_CHECKING:
    from fairq.app.ports import Stores


class _Keep(enum.Enum):
    """The default of a setting ``tenants.set`` leaves as it is (None means "no limit" there)."""

    KEEP = "keep"


KEEP = _Keep.KEEP

# ``explain``'s read runs under this statement timeout (it reads the queues' schedule rows).
EXPLAIN_TIMEOUT_MS = 10_000
_EXPLANATION_FIELDS = {f.name for f in fields(TenantExplanation)}


def _explanation(row: dict[str, Any]) -> TenantExplanation:
    values = {k: v for k, v in row.items() if k in _EXPLANATION_FIELDS}
    values["policies"] = tuple(values.get("policies") or ())
    return TenantExplanation(**values)


class Tenants:
    """Operators' side: weights and caps, effective from the next claim (no restart)."""

    def __init__(self, app: Stores) -> None:
        self._app = app

    def set(self, tenant: str, *, weight: float | None = None,
            max_running: int | None = None, rate: float | _Keep | None = KEEP,
            burst: int | _Keep | None = KEEP, group: str | _Keep | None = KEEP,
            expected_version: int | None = None) -> TenantConfig:
        """Change the named settings of a tenant; the others keep whatever they hold when the
        change is applied (one statement in the database: two operators changing different
        fields never undo each other). Returns the tenant's settings as they now are.

        ``rate`` is jobs started per second in each queue (``rate=None`` removes the limit) and
        ``burst`` how many may start at once after idling (default: one second's worth).
        ``group`` is a group made with ``app.groups.set`` (None: the group 'default').
        ``expected_version``: the settings' version the change was made from (a form that
        showed ``TenantConfig.version``; 0: no settings of its own): refused with
        ``InvalidInput`` ("changed meanwhile by another operator: reload") when it is not the
        version in force.
        """
        values: dict[str, Any] = {}
        if weight is not None:
            values["weight"] = weight
        if max_running is not None:
            values["max_running"] = max_running
        for key, value in (("rate", rate), ("burst", burst), ("group", group)):
            if value is not KEEP:
                values[key] = value
        return self.patch(v.tenant_patch(tenant, values), expected_version=expected_version)

    def patch(self, patch: TenantPatch, *, expected_version: int | None = None) -> TenantConfig:
        """Apply a patch built by ``fairq.validation.tenant_patch`` (what the CLI, the console
        and the tenants file use); see ``set``."""
        from fairq.store.settings import patch_tenant

        if expected_version is not None:
            v.integer("expected_version", expected_version, 0, 2**63 - 1)
        return patch_tenant(self._app.store, patch, expected_version=expected_version)

    def get(self, tenant: str) -> TenantConfig:
        return self._app.store.get_tenant(v.name("tenant", tenant))

    @overload
    def explain(self, tenant: str, queue: str) -> TenantExplanation: ...

    @overload
    def explain(self, tenant: str, queue: None = None) -> builtins.list[TenantExplanation]: ...

    def explain(self, tenant: str, queue: str | None = None
                ) -> TenantExplanation | builtins.list[TenantExplanation]:
        """Why the tenant's next job has not started, read from the database now (docs/
        explain.md). With ``queue``: the answer for that queue (``no_jobs`` when the tenant has
        no job there, or the queue does not exist). Without: one answer per queue where the
        tenant has queued or running jobs, by queue name, or a single ``no_jobs`` with
        ``queue=None`` when it has none anywhere."""
        from fairq.store.monitor import tenant_waits

        v.name("tenant", tenant)
        if queue is not None:
            v.name("queue", queue)
        rows = tenant_waits(self._app.store, queue=queue, tenant=tenant,
                            timeout_ms=EXPLAIN_TIMEOUT_MS)
        found = [_explanation(r) for r in rows]
        if queue is not None:
            return found[0] if found else TenantExplanation(tenant, queue, "no_jobs")
        with_jobs = [e for e in found if e.reason != "no_jobs"]
        return with_jobs or [TenantExplanation(tenant, None, "no_jobs")]

    def set_defaults(self, *, weight: float | None = None, max_running: int | None = None,
                     rate: float | _Keep | None = KEEP,
                     burst: int | _Keep | None = KEEP) -> TenantDefaults:
        """Set what tenants without settings of their own get (a tenants file's ``[defaults]``);
        unset fields keep their current value. Effective from the next claim. Returns the new
        (weight, max_running, rate, burst)."""
        from fairq.store.settings import apply_settings

        new_weight = v.weight(weight) if weight is not None else None
        new_cap = v.max_running(max_running) if max_running is not None else None
        if rate is not KEEP and rate is not None:
            v.rate(rate)
        if burst is not KEEP and burst is not None:
            v.burst(burst)
        if rate is None and burst is not KEEP and burst is not None:
            raise InvalidInput("burst needs a rate (jobs per second)")
        result: list[TenantDefaults] = []

        def merge(current: TenantDefaults) -> TenantDefaults:
            """The change on the defaults in force, read under their lock."""
            cur_weight, cur_cap, cur_rate, cur_burst = current
            new_rate = cur_rate if rate is KEEP else rate
            new_burst = (cur_burst if new_rate is not None and cur_rate is not None else None) \
                if burst is KEEP else burst
            new_rate, new_burst = v.rate_limit(new_rate, new_burst)
            merged: TenantDefaults = (
                new_weight if new_weight is not None else cur_weight,
                new_cap if new_cap is not None else cur_cap, new_rate, new_burst)
            result.append(merged)
            return merged

        apply_settings(self._app.store, [], merge)
        return result[-1]

    def get_defaults(self) -> TenantDefaults:
        """(weight, max_running, rate, burst) of tenants without settings of their own."""
        return self._app.store.get_tenant_defaults()

    def list(self) -> list[TenantConfig]:
        return self._app.store.list_tenants()

    def reset(self, tenant: str) -> bool:
        """Drop the tenant's own weight and cap (the defaults apply from the next claim), as
        removing it from a tenants file does not. Returns whether it had settings of its own."""
        from fairq.admin import ops

        return ops.reset_tenant(self._app.store, tenant)

    def delete(self, tenant: str) -> bool:
        """Forget the tenant (settings and schedule); ``InvalidInput`` while it has queued or
        running jobs. Returns whether fairq knew it."""
        from fairq.admin import ops

        return ops.delete_tenant(self._app.store, tenant)

    async def get_async(self, tenant: str, *, connection: Any = None) -> TenantConfig:
        return await self._app.astore.get_tenant(v.name("tenant", tenant), connection=connection)

    async def list_async(self, *, connection: Any = None) -> builtins.list[TenantConfig]:
        return await self._app.astore.list_tenants(connection=connection)

    def apply(self, source: str | Any) -> builtins.list[TenantConfig]:
        """Apply a TOML file (path or parsed dict): validated whole first, then all-or-nothing.
        Without a ``[defaults]`` table the defaults stay as they are."""
        from fairq.admin.tenant_file import load_tenant_file_with_groups

        load_tenant_file_with_groups(source)  # a bad file: refused before any query
        defaults, tenants, groups = load_tenant_file_with_groups(
            source, self._app.store.get_tenant_defaults())
        self._app.store.set_tenants(tenants, defaults=defaults, groups=groups)
        return tenants


class Groups:
    """Tenant groups: a group's share follows its weight among the groups with runnable work,
    and its tenants share it by their own weights (docs/algorithm.md, "Tenant groups")."""

    def __init__(self, app: Stores) -> None:
        self._app = app

    def set(self, group: str, *, weight: float) -> GroupConfig:
        """Create a group or change its weight; every queue's next claim uses it."""
        new = GroupConfig(v.name("group", group), v.weight(weight))
        self._app.store.set_group(new)
        return new

    def get(self, group: str) -> GroupConfig:
        v.name("group", group)
        for g in self._app.store.list_groups():
            if g.name == group:
                return g
        raise InvalidInput(f"unknown group {group!r}")

    def list(self) -> list[GroupConfig]:
        return self._app.store.list_groups()
