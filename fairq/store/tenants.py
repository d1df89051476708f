"""Tenant settings read and written as whole rows (the store's part ``Store`` inherits): the
defaults, a tenant's settings, groups. Changes go through ``fairq.store.settings``."""

from __future__ import annotations

from collections.abc import Sequence

from fairq.models import GroupConfig, TenantConfig, TenantDefaults
from fairq.store.sessions import StoreSessions
from fairq.store.settings import apply_settings
from fairq.validation import patch_of


class TenantSettings(StoreSessions):
    """Tenants' settings, the defaults and the groups."""

    def get_defaults(self) -> tuple[float, int]:
        weight, max_running, _, _ = self.get_tenant_defaults()
        return (weight, max_running)

    def get_tenant_defaults(self) -> TenantDefaults:
        """(weight, max_running, rate, burst) of tenants without their own configuration."""
        with self.cursor() as cur:
            cur.execute(self.statement("get_defaults"))
            row = cur.fetchone()
        if row is None:
            return (1.0, 10, None, None)
        return (float(row["weight"]), int(row["max_running"]), row["rate"], row["burst"])

    def set_tenants(
        self,
        tenants: Sequence[TenantConfig],
        defaults: tuple[float, int] | TenantDefaults | None = None,
        groups: Sequence[GroupConfig] = (),
    ) -> None:
        """Write tenants' whole settings (and optionally new defaults, and groups) in one
        transaction, under their settings locks (``fairq.store.settings.apply_settings``).
        ``defaults`` is (weight, max_running) or (weight, max_running, rate, burst); the short
        form means no rate limit."""
        full: TenantDefaults | None = None
        if defaults is not None:
            full = defaults if len(defaults) == 4 else (defaults[0], defaults[1], None, None)
        apply_settings(self, [patch_of(t) for t in tenants], full, groups)

    def set_group(self, group: GroupConfig) -> None:
        """Create or reweigh a tenant group; every queue's next claim recomputes the factors."""
        with self.cursor(atomic=True) as cur:
            cur.execute(self.statement("upsert_group"), {"group": group.name, "weight": group.weight})
            cur.execute(self.statement("expire_group_factors"))

    def list_groups(self) -> list[GroupConfig]:
        with self.cursor() as cur:
            cur.execute(self.statement("list_groups"))
            return [GroupConfig(**r) for r in cur.fetchall()]

    def get_tenant(self, tenant: str) -> TenantConfig:
        with self.cursor() as cur:
            cur.execute(self.statement("get_tenant"), {"tenant": tenant})
            row = cur.fetchone()
        if row is not None:
            return TenantConfig(**row)
        weight, max_running, rate, burst = self.get_tenant_defaults()
        return TenantConfig(tenant, weight, max_running, configured=False, rate=rate, burst=burst)

    def list_tenants(self) -> list[TenantConfig]:
        with self.cursor() as cur:
            cur.execute(self.statement("list_tenants"))
            return [TenantConfig(**r) for r in cur.fetchall()]
