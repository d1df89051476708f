"""Tenant settings written: one patch per tenant in one statement, under the tenant's settings
lock, with its schedule rows in the same transaction (decision 020).

The lock orders every settings change against every enqueue that creates a schedule row (the
engine's ``lock_settings``): a change waits for such an enqueue to commit and then finds its
rows, and an enqueue that comes after the change reads the new settings. Two changes of one
tenant run one after the other, and each changes only the fields it names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg

from fairq.errors import InvalidInput
from fairq.models import GroupConfig, TenantConfig, TenantDefaults, TenantPatch
from fairq.store.sessions import StoreSessions as Store

T = TypeVar("T")
# A change that lost a deadlock (a producer's transaction that created the rows of several new
# tenants in several statements can hold their locks out of order) is tried again: PostgreSQL
# rolled it back whole.
DEADLOCK_TRIES = 3
STALE = "changed meanwhile by another operator"


def retrying(action: Callable[[], T]) -> T:
    """``action()``, again (up to DEADLOCK_TRIES) when PostgreSQL rolled it back for a deadlock."""
    for attempt in range(DEADLOCK_TRIES):
        try:
            return action()
        except psycopg.errors.DeadlockDetected:
            if attempt == DEADLOCK_TRIES - 1:
                raise
    raise AssertionError("unreachable")


def _lock(store: Store, cur: psycopg.Cursor[Any], tenants: Sequence[str] | None) -> None:
    try:
        cur.execute(store.statement("lock_settings"),
                    {"tenants": None if tenants is None else list(tenants)})
    except psycopg.errors.LockNotAvailable:
        raise InvalidInput(
            "the settings are busy: a transaction that enqueued a new tenant's first job is "
            f"still open after {store.lock_timeout_ms / 1000:g}s; try again") from None


def _patch(store: Store, cur: psycopg.Cursor[Any], patch: TenantPatch,
           expected: int | None, *, known_group: bool = True) -> TenantConfig:
    """Apply ``patch`` (its tenant's lock held) and copy the result onto its schedule rows.
    ``known_group``: refuse a group no ``groups.set`` made (a tenants file checks its groups
    against its own [groups] instead)."""
    f = patch.fields
    if known_group and patch.sets("group") and patch.group is not None:
        cur.execute(store.statement("group_exists"), {"group": patch.group})
        row = cur.fetchone()
        if not (row and row["found"]):
            raise InvalidInput(f"unknown group {patch.group!r}: create it with groups.set first")
    cur.execute(store.statement("patch_tenant"), {
        "tenant": patch.tenant, "fields": sorted(f), "weight": patch.weight,
        "max_running": patch.max_running, "rate": patch.rate, "burst": patch.burst,
        "group": patch.group, "expected": expected})
    row = cur.fetchone()
    if row is None:
        cur.execute(store.statement("tenant_version"), {"tenant": patch.tenant})
        now = cur.fetchone()
        raise InvalidInput(f"tenant {patch.tenant!r}: settings {STALE} (now version "
                           f"{now['version'] if now else 0}, this edit was made on version "
                           f"{expected}): reload")
    if row["rate"] is None and row["burst"] is not None:
        raise InvalidInput(f"tenant {patch.tenant!r} has no rate limit: burst needs a rate "
                           "(jobs per second)")
    config = TenantConfig(**row)
    cur.execute(store.statement("sync_tenant_schedule"), {
        "tenant": config.tenant, "weight": config.weight, "max_running": config.max_running,
        "rate": config.rate, "burst": config.burst, "group": config.group})
    return config


def patch_tenant(store: Store, patch: TenantPatch, *,
                 expected_version: int | None = None) -> TenantConfig:
    """Apply one tenant's patch and return its settings as they now are. With
    ``expected_version`` (what a person's form showed; 0: the tenant had no settings of its
    own) a change made meanwhile is not overwritten: ``InvalidInput`` ("... reload")."""
    def run() -> TenantConfig:
        with store.cursor(atomic=True) as cur:
            _lock(store, cur, [patch.tenant])
            return _patch(store, cur, patch, expected_version)
    return retrying(run)


def apply_settings(store: Store, patches: Sequence[TenantPatch],
                   defaults: TenantDefaults | Callable[[TenantDefaults], TenantDefaults] | None
                   = None, groups: Sequence[GroupConfig] = ()) -> list[TenantConfig]:
    """Groups, defaults and tenants' patches in one transaction, all or nothing. ``defaults``
    may be a function of the defaults in force, called under their lock (a change of some of
    their fields leaves the others as another operator just set them)."""
    def run() -> list[TenantConfig]:
        out = []
        with store.cursor(atomic=True) as cur:
            if defaults is not None:
                _lock(store, cur, None)
            if patches:
                _lock(store, cur, sorted({p.tenant for p in patches}))
            for g in groups:
                cur.execute(store.statement("upsert_group"), {"group": g.name, "weight": g.weight})
            if groups:
                cur.execute(store.statement("expire_group_factors"))
            if defaults is not None:
                if callable(defaults):
                    cur.execute(store.statement("get_defaults"))
                    d = cur.fetchone()
                    current: TenantDefaults = (
                        (d["weight"], d["max_running"], d["rate"], d["burst"]) if d
                        else (1.0, 10, None, None))
                    new = defaults(current)
                else:
                    new = defaults
                row = {"weight": new[0], "max_running": new[1], "rate": new[2], "burst": new[3]}
                cur.execute(store.statement("set_defaults"), row)
            for p in sorted(patches, key=lambda p: p.tenant):
                out.append(_patch(store, cur, p, None, known_group=False))
            if defaults is not None:
                cur.execute(store.statement("sync_default_tenants"), row)
        return out
    return retrying(run)
