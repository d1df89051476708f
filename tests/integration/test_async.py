"""The asyncio API: enqueue and reads from async code, joining the caller's transaction (a
psycopg AsyncConnection, a SQLAlchemy AsyncConnection or AsyncSession), as an async web
handler does: its rollback leaves no job, its commit exactly one."""

from __future__ import annotations

import asyncio
import warnings

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

import fairq
from fairq.config import sqlalchemy_url
from tests.support.fairtools import sql_rows


def counts(dsn: str) -> tuple[int, int]:
    """(reports, jobs) committed."""
    [(reports, jobs)] = sql_rows(dsn, "SELECT (SELECT count(*) FROM reports), "
                                      "(SELECT count(*) FROM fairq.jobs)")
    return int(reports), int(jobs)


@pytest.fixture
def web_dsn(dsn: str) -> str:
    sql_rows(dsn, "CREATE TABLE reports (id serial PRIMARY KEY, tenant text, status text)")
    return dsn


async def handler(app: fairq.App, session: AsyncSession, *, fail: bool) -> int:
    """A web endpoint: record the report and enqueue its job in one transaction."""
    async with session.begin():
        row = await session.execute(sa.text(
            "INSERT INTO reports (tenant, status) VALUES ('acme', 'pending') RETURNING id"))
        report = row.scalar_one()
        job_id = await app.enqueue_async("send_report", tenant="acme",
                                         payload={"report": report}, connection=session)
        if fail:
            raise RuntimeError("the handler failed after enqueueing")
    return job_id


@pytest.mark.parametrize("fail", [True, False])
def test_async_session_web_handler_commits_or_rolls_back_the_job(web_dsn: str, fail: bool) -> None:
    async def main() -> int | None:
        engine = create_async_engine(sqlalchemy_url(web_dsn))
        try:
            async with fairq.App(web_dsn) as app, AsyncSession(engine) as session:
                try:
                    return await handler(app, session, fail=fail)
                except RuntimeError:
                    return None
        finally:
            await engine.dispose()

    job_id = asyncio.run(main())
    if fail:
        assert job_id is None and counts(web_dsn) == (0, 0)
    else:
        assert counts(web_dsn) == (1, 1)
        assert sql_rows(web_dsn, "SELECT j.id, j.payload->>'report' = r.id::text FROM fairq.jobs j, "
                                 "reports r") == [(job_id, True)]


@pytest.mark.parametrize("commit", [True, False])
def test_psycopg_async_connection_joins_the_transaction(web_dsn: str, commit: bool) -> None:
    async def main() -> None:
        async with fairq.App(web_dsn) as app, \
                await psycopg.AsyncConnection.connect(web_dsn) as conn:
            await conn.execute("INSERT INTO reports (tenant) VALUES ('acme')")
            await app.enqueue_async("send_report", tenant="acme", connection=conn)
            ids = await app.enqueue_many_async("send_report", [("a", {}), ("b", {}, "k")],
                                               connection=conn)
            assert len(ids) == 2
            assert counts(web_dsn) == (0, 0)  # nothing visible before the caller commits
            await (conn.commit() if commit else conn.rollback())

    asyncio.run(main())
    assert counts(web_dsn) == ((1, 3) if commit else (0, 0))


@pytest.mark.parametrize("commit", [True, False])
def test_sqlalchemy_async_connection_joins_the_transaction(web_dsn: str, commit: bool) -> None:
    async def main() -> None:
        engine = create_async_engine(sqlalchemy_url(web_dsn))
        try:
            async with fairq.App(web_dsn) as app, engine.connect() as conn:
                await app.enqueue_many_async("t", [("a", {}), ("b", {})], connection=conn)
                await (conn.commit() if commit else conn.rollback())
        finally:
            await engine.dispose()

    asyncio.run(main())
    assert counts(web_dsn) == ((0, 2) if commit else (0, 0))


def test_async_without_a_connection_enqueues_reads_and_cancels(dsn: str) -> None:
    async def main(app: fairq.App) -> None:
        @app.task(queue="reports", max_attempts=2)
        def send_report(job: fairq.Job) -> None:
            pass

        first = await send_report.enqueue_async(tenant="acme", payload={"report": 7},
                                                key="r-7")
        assert await send_report.enqueue_async(tenant="acme", key="r-7") == first
        many = await app.enqueue_many_async(send_report.name, [("a", {}), ("b", None)])
        info = await app.job_async(first)
        assert info is not None and (info.queue, info.max_attempts, info.payload) == \
            ("reports", 2, {"report": 7})
        assert await app.cancel_async(many[0]) is True
        assert await app.cancel_async(many[0]) is False
        assert (await app.job_async(many[0])).status == "cancelled"  # type: ignore[union-attr]
        assert await app.job_async(10**12) is None
        app.tenants.set("acme", weight=3.0)
        assert (await app.tenants.get_async("acme")).weight == 3.0
        assert (await app.tenants.get_async("nobody")).configured is False
        listed = await app.tenants.list_async()
        assert listed == app.tenants.list() and {t.tenant for t in listed} == {"a", "acme", "b"}
        with pytest.raises(fairq.InvalidInput, match="tenant must not be empty"):
            await app.enqueue_async(send_report.name, tenant="")
        with pytest.raises(fairq.InvalidInput, match="cost must be"):
            await app.enqueue_many_async(send_report.name, [("a", {})], cost=-1)

    app = fairq.App(dsn)

    async def first_loop() -> None:
        await main(app)

    asyncio.run(first_loop())
    # A second event loop gets its own pool (asyncio.run makes a new loop each time).
    async def again() -> None:
        assert await app.job_async(1) is not None
        await app.aclose()

    asyncio.run(again())
    assert sql_rows(dsn, "SELECT count(*) FROM fairq.jobs") == [(3,)]


def test_sync_and_async_connections_are_not_mixed_up(dsn: str) -> None:
    async def main() -> None:
        engine = create_async_engine(sqlalchemy_url(dsn))
        try:
            async with fairq.App(dsn) as app, AsyncSession(engine) as session:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")  # no "coroutine was never awaited"
                    with pytest.raises(fairq.InvalidInput, match="await the async methods"):
                        app.enqueue("t", tenant="a", connection=session)
                with psycopg.connect(dsn) as sync_conn, \
                        pytest.raises(fairq.InvalidInput, match="takes a psycopg AsyncConnection"):
                    await app.enqueue_async("t", tenant="a", connection=sync_conn)
                with pytest.raises(fairq.InvalidInput, match="not str"):
                    await app.enqueue_async("t", tenant="a", connection="postgresql://x")
        finally:
            await engine.dispose()

    asyncio.run(main())
    assert sql_rows(dsn, "SELECT count(*) FROM fairq.jobs") == [(0,)]



def test_async_behind_a_pooler_sets_its_timeouts_per_transaction(dsn: str) -> None:
    async def main() -> None:
        async with fairq.App(dsn, pooler=True) as app:
            job_id = await app.enqueue_async("t", tenant="a")
            assert (await app.job_async(job_id)) is not None
            async with app.astore._conn(None) as conn:
                cur = await conn.execute("SELECT current_setting('lock_timeout')")
                assert await cur.fetchone() == ("5s",)  # SET LOCAL, not the server's 0

    asyncio.run(main())
