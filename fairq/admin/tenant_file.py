"""The tenant TOML file : parse and validate the whole file before anything is written."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from fairq import validation as v
from fairq.errors import InvalidInput
from fairq.models import GroupConfig, TenantConfig, TenantDefaults

UNLIMITED = "unlimited"  # a tenant's `rate` that lifts a rate limit of the [defaults]
_KEYS = {"weight", "max_running", "rate", "burst"}
_TENANT_KEYS = _KEYS | {"group"}


def load_tenant_file(
    source: str | Path | dict[str, Any], current_defaults: TenantDefaults = (1.0, 10, None, None),
) -> tuple[TenantDefaults | None, list[TenantConfig]]:
    defaults, tenants, _ = load_tenant_file_with_groups(source, current_defaults)
    return defaults, tenants


def load_tenant_file_with_groups(
    source: str | Path | dict[str, Any], current_defaults: TenantDefaults = (1.0, 10, None, None),
) -> tuple[TenantDefaults | None, list[TenantConfig], list[GroupConfig]]:
    """Return (defaults, tenants, groups) from a TOML path or an already-parsed dict.

    ``defaults`` is None when the file has no ``[defaults]`` table: applying it leaves the
    defaults as they are (an operator who paused unknown tenants with ``max_running = 0`` does
    not unpause them by applying a file that lists one tenant). A field ``[defaults]`` leaves
    out keeps its ``current_defaults`` value. Tenants named in the file get exactly the file's
    values, with the resulting defaults for fields they leave out. A tenant that sets ``rate``
    without ``burst`` gets the defaults' burst if the defaults have a rate, else one second's
    worth.
    """
    if isinstance(source, dict):
        data = source
    else:
        path = Path(source)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InvalidInput(f"tenant file not found: {path}") from None
        except IsADirectoryError:
            raise InvalidInput(f"tenant file {path} is a directory") from None
        except OSError as exc:  # unreadable: permissions, a device...
            raise InvalidInput(f"cannot read tenant file {path}: {exc.strerror or exc}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"{path}: not valid TOML: {exc}") from None
    unknown = set(data) - {"defaults", "tenants", "groups"}
    if unknown:
        raise InvalidInput(f"unknown top-level key(s) in tenant file: {', '.join(sorted(unknown))}")
    raw_defaults = data.get("defaults", {})
    if not isinstance(raw_defaults, dict):
        raise InvalidInput("[defaults] must be a table")
    _check_keys("[defaults]", raw_defaults)
    try:
        if "rate" in raw_defaults:
            d_rate, d_burst = v.rate_limit(raw_defaults["rate"], raw_defaults.get("burst"))
        else:
            d_rate, d_burst = v.rate_limit(current_defaults[2],
                                           raw_defaults.get("burst", current_defaults[3]))
        defaults: TenantDefaults = (
            v.weight(raw_defaults.get("weight", current_defaults[0])),
            v.max_running(raw_defaults.get("max_running", current_defaults[1])),
            d_rate, d_burst,
        )
    except InvalidInput as exc:
        raise InvalidInput(f"[defaults]: {exc}") from None
    raw_groups = data.get("groups", {})
    if not isinstance(raw_groups, dict):
        raise InvalidInput("[groups] must be a table of tables")
    groups: list[GroupConfig] = []
    for gname, gentry in raw_groups.items():
        v.name("group", gname)
        if not isinstance(gentry, dict) or set(gentry) - {"weight"}:
            raise InvalidInput(f"[groups.{gname!r}] must be a table with a weight")
        try:
            groups.append(GroupConfig(gname, v.weight(gentry.get("weight", 1.0))))
        except InvalidInput as exc:
            raise InvalidInput(f"[groups.{gname!r}]: {exc}") from None
    known_groups = {g.name for g in groups} | {"default"}
    raw_tenants = data.get("tenants", {})
    if not isinstance(raw_tenants, dict):
        raise InvalidInput("[tenants] must be a table of tables")
    tenants: list[TenantConfig] = []
    for name, entry in raw_tenants.items():
        v.name("tenant", name)
        if not isinstance(entry, dict):
            raise InvalidInput(f"[tenants.{name!r}] must be a table")
        _check_keys(f"[tenants.{name!r}]", entry, _TENANT_KEYS)
        group = entry.get("group")
        if group is not None and (not isinstance(group, str) or group not in known_groups):
            raise InvalidInput(f"[tenants.{name!r}]: group {group!r} is not in [groups]")
        try:
            if entry.get("rate") == UNLIMITED:
                rate, burst = v.rate_limit(None, entry.get("burst"))
            elif "rate" in entry:
                rate, burst = v.rate_limit(entry["rate"], entry.get("burst", d_burst))
            else:
                rate, burst = v.rate_limit(d_rate, entry.get("burst", d_burst))
            tenants.append(TenantConfig(
                name,
                v.weight(entry.get("weight", defaults[0])),
                v.max_running(entry.get("max_running", defaults[1])),
                rate=rate, burst=burst, group=group,
            ))
        except InvalidInput as exc:
            raise InvalidInput(f"[tenants.{name!r}]: {exc}") from None
    return (defaults if "defaults" in data else None), tenants, groups


def _check_keys(where: str, table: dict[str, Any], keys: set[str] = _KEYS) -> None:
    unknown = set(table) - keys
    if unknown:
        raise InvalidInput(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
                           f"use {', '.join(sorted(keys))}")
