"""The operator console (``fairq web``): pages and their JSON twins over the store's console
reads and the operator API, served by Starlette (the ``web`` extra).

``console(app, authorize=...)`` and ``Access`` (fairq.web.mount) put it inside your own ASGI
app; they are imported on first use, so that ``fairq web`` without the extra can still say
which package is missing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fairq.web.mount import Access, Authorize, console

__all__ = ["Access", "Authorize", "console"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from fairq.web import mount

        return getattr(mount, name)
    raise AttributeError(f"module 'fairq.web' has no attribute {name!r}")
