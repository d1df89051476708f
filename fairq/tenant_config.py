"""The tenant TOML file (CONTRACT): parse and validate the whole file before anything is written."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from fairq import validation as v
from fairq.errors import InvalidInput
from fairq.models import TenantConfig

_KEYS = {"weight", "max_running"}


def load_tenant_file(
    source: str | Path | dict[str, Any], current_defaults: tuple[float, int] = (1.0, 10),
) -> tuple[tuple[float, int] | None, list[TenantConfig]]:
    """Return (defaults, tenants) from a TOML path or an already-parsed dict.

    ``defaults`` is None when the file has no ``[defaults]`` table: applying it leaves the
    defaults as they are (an operator who paused unknown tenants with ``max_running = 0`` does
    not unpause them by applying a file that lists one tenant). A field ``[defaults]`` leaves
    out keeps its ``current_defaults`` value. Tenants named in the file get exactly the file's
    values, with the resulting defaults for fields they leave out.
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
    unknown = set(data) - {"defaults", "tenants"}
    if unknown:
        raise InvalidInput(f"unknown top-level key(s) in tenant file: {', '.join(sorted(unknown))}")
    raw_defaults = data.get("defaults", {})
    if not isinstance(raw_defaults, dict):
        raise InvalidInput("[defaults] must be a table")
    _check_keys("[defaults]", raw_defaults)
    try:
        defaults = (
            v.weight(raw_defaults.get("weight", current_defaults[0])),
            v.max_running(raw_defaults.get("max_running", current_defaults[1])),
        )
    except InvalidInput as exc:
        raise InvalidInput(f"[defaults]: {exc}") from None
    raw_tenants = data.get("tenants", {})
    if not isinstance(raw_tenants, dict):
        raise InvalidInput("[tenants] must be a table of tables")
    tenants: list[TenantConfig] = []
    for name, entry in raw_tenants.items():
        v.name("tenant", name)
        if not isinstance(entry, dict):
            raise InvalidInput(f"[tenants.{name!r}] must be a table")
        _check_keys(f"[tenants.{name!r}]", entry)
        try:
            tenants.append(TenantConfig(
                name,
                v.weight(entry.get("weight", defaults[0])),
                v.max_running(entry.get("max_running", defaults[1])),
            ))
        except InvalidInput as exc:
            raise InvalidInput(f"[tenants.{name!r}]: {exc}") from None
    return (defaults if "defaults" in data else None), tenants


def _check_keys(where: str, table: dict[str, Any]) -> None:
    unknown = set(table) - _KEYS
    if unknown:
        raise InvalidInput(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
                           "use weight and max_running")
