"""The default ``JobSink``: validated jobs written by the app's stores (``fairq.app.ports``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fairq.app.ports import Stores
from fairq.models import NewJobColumns, TraceContext


class StoreSink:
    """Jobs go to the database: in the caller's transaction with ``connection``, else in one
    of their own (all chunks or none)."""

    def __init__(self, stores: Stores) -> None:
        self._stores = stores

    def put(self, chunks: Iterator[NewJobColumns], *, connection: Any,
            trace: TraceContext | None) -> list[int]:
        return self._stores.store.enqueue_chunks(chunks, connection, trace=trace)

    async def put_async(self, jobs: NewJobColumns, *, connection: Any,
                        trace: TraceContext | None) -> list[int]:
        return await self._stores.astore.enqueue(jobs, connection=connection, trace=trace)
