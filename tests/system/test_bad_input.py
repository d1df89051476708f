"""Bad input on every entry point: the Python API, CLI arguments, the tenant TOML file
and environment variables. Every invalid value is ``fairq.InvalidInput`` (Python) or exit code 2
with one line (CLI), and nothing is written. Names are data: any Unicode up to 200 characters
is stored and shown verbatim, and injection-shaped names are inert. Passwords never leak.

Hypothesis drives each entry point against one migrated database per test; "nothing written"
is checked by a fingerprint of every fairq table after each example.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import fairq
from fairq.admin.tenant_file import load_tenant_file
from fairq.cli import main
from fairq.config import redact
from fairq.names import validate_schema_name
from fairq.validation import MAX_NAME, MAX_PAYLOAD_BYTES, MAX_WEIGHT, MIN_WEIGHT

SECRET = "pw-Zq8x-never-shown"
DB_SETTINGS = settings(max_examples=25, deadline=None,
                       suppress_health_check=[HealthCheck.function_scoped_fixture,
                                               HealthCheck.too_slow])


# -- helpers --------------------------------------------------------------------------------------
def fingerprint(dsn: str) -> tuple[Any, ...]:
    """Everything fairq stores, in a comparable form: any write changes it."""
    with psycopg.connect(dsn) as c:
        return tuple(
            c.execute(f"SELECT coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') "
                      f"FROM fairq.{table} t").fetchone()
            for table in ("jobs", "tenants", "tenant_schedule", "settings"))


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {err!r}"
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema="fairq")  # no task registered: any task name is accepted
    yield a
    a.close()


# -- strategies -----------------------------------------------------------------------------------
# Text PostgreSQL can store: no NUL, no lone surrogates (category Cs).
storable = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
good_names = st.text(storable, min_size=1, max_size=MAX_NAME)
INJECTIONS = [
    "'; DROP TABLE fairq.jobs; --", '"; DROP SCHEMA fairq CASCADE; --', "Robert'); --",
    "%(tenant)s", "%s", "{schema}", "$$ LANGUAGE sql $$", "\\x00", "\\'", "' OR '1'='1",
    "fairq.jobs", "default", "__other__", 'tenant="x"} 1\n# HELP', "\u202eevil", "\U0001f600" * 200,
    " ", "\t\n", "a" * MAX_NAME,
]
bad_names = st.one_of(
    st.just(""),
    st.text(storable, min_size=MAX_NAME + 1, max_size=MAX_NAME + 50),
    st.builds(lambda a, b: a + "\x00" + b, st.text(storable, max_size=5), st.text(storable, max_size=5)),
    st.builds(lambda a: a + "\ud800", st.text(storable, max_size=5)),
    st.none(), st.integers(), st.floats(), st.binary(min_size=1, max_size=5),
    st.lists(st.text(max_size=3), max_size=2),
)
# Weights outside 0.001..1000 (inclusive); the edges the range is there for (vtime grows by
# cost/weight: 5e-324 overflows it, 1e6 barely moves it) are named.
OUT_OF_RANGE_WEIGHTS = [0.0009, 5e-324, 1e-300, 1000.5, 1e6, 0, 0.0, -0.0, -1, 1001, 10**400]
IN_RANGE_WEIGHTS = [0.001, 1000, 1000.0, 1, 0.5]
WEIGHT_RANGE = "weight must be between 0.001 and 1000"
bad_weights = st.one_of(
    st.floats(max_value=MIN_WEIGHT, exclude_max=True), st.just(math.inf), st.just(-math.inf),
    st.just(math.nan), st.floats(min_value=MAX_WEIGHT, exclude_min=True, allow_infinity=False),
    st.sampled_from(OUT_OF_RANGE_WEIGHTS), st.booleans(), st.text(max_size=4),
    st.none().map(lambda _: [1.0]),
)
bad_caps = st.one_of(st.integers(max_value=-1), st.integers(min_value=1_000_001),
                     st.floats(allow_nan=True), st.booleans(), st.text(max_size=4))
bad_ids = st.one_of(st.integers(max_value=0), st.integers(min_value=2**63), st.booleans(),
                    st.floats(), st.text(max_size=6), st.none())


class NotJSON:
    pass


bad_payloads = st.one_of(
    st.just(math.nan), st.just({"x": math.inf}), st.just({"x": NotJSON()}), st.just({1j: 1}),
    st.just({"s": {1, 2}}), st.just(b"bytes"), st.just("a\x00b"), st.just({"k\x00": 1}),
    st.just({"x": "\ud800"}),
)


# -- Python API -----------------------------------------------------------------------------------
@DB_SETTINGS
@given(tenant=bad_names)
def test_enqueue_bad_tenant_writes_nothing(app: fairq.App, dsn: str, tenant: Any) -> None:
    before = fingerprint(dsn)
    with pytest.raises(fairq.InvalidInput):
        app.enqueue("t", tenant=tenant)
    with pytest.raises(fairq.InvalidInput):
        app.enqueue_many("t", [("ok", {}), (tenant, {})])  # one bad item: none written
    assert fingerprint(dsn) == before


@DB_SETTINGS
@given(field=st.sampled_from(["task", "queue"]), value=bad_names)
def test_enqueue_bad_task_or_queue_writes_nothing(app: fairq.App, dsn: str, field: str,
                                                  value: Any) -> None:
    assume(value is not None)  # queue=None means the default queue
    before = fingerprint(dsn)
    with pytest.raises(fairq.InvalidInput):
        if field == "task":
            app.enqueue(value, tenant="a")
        else:
            app.enqueue("t", tenant="a", queue=value)
    assert fingerprint(dsn) == before


@DB_SETTINGS
@given(payload=bad_payloads)
def test_enqueue_bad_payload_writes_nothing(app: fairq.App, dsn: str, payload: Any) -> None:
    before = fingerprint(dsn)
    with pytest.raises(fairq.InvalidInput):
        app.enqueue("t", tenant="a", payload=payload)
    assert fingerprint(dsn) == before


@DB_SETTINGS
@given(
    option=st.sampled_from(["priority", "cost", "delay", "run_at", "max_attempts", "lease"]),
    value=st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.floats(),
                    st.text(max_size=3), st.booleans(), st.just(datetime(2030, 1, 1)),
                    st.just(timedelta(seconds=-1)), st.just([1])),
)
def test_enqueue_bad_options(app: fairq.App, dsn: str, option: str, value: Any) -> None:
    """Each option either is valid (and the job is written) or is refused with nothing written."""
    before = fingerprint(dsn)
    try:
        job_id = app.enqueue("t", tenant="a", **{option: value})
    except fairq.InvalidInput:
        assert fingerprint(dsn) == before
        return
    info = app.job(job_id)  # accepted: it must be a value the contract allows
    assert info is not None
    if option == "priority":
        assert isinstance(value, int) and not isinstance(value, bool) and -32768 <= value <= 32767
    elif option == "cost":
        assert not isinstance(value, bool) and 0 < value <= 1e9
    elif option == "delay":
        seconds = value.total_seconds() if isinstance(value, timedelta) else value
        assert not isinstance(value, bool) and 0 <= seconds <= 10 * 365 * 86400
    elif option in ("max_attempts", "lease"):
        assert isinstance(value, int) and not isinstance(value, bool) and value >= 1
    else:
        pytest.fail(f"run_at={value!r} was accepted")


def test_run_at_and_delay_together_are_refused(app: fairq.App, dsn: str) -> None:
    before = fingerprint(dsn)
    with pytest.raises(fairq.InvalidInput):
        app.enqueue("t", tenant="a", run_at=datetime.now(UTC), delay=1)
    assert fingerprint(dsn) == before


def test_payload_size_limit_is_exact(app: fairq.App, dsn: str) -> None:
    """MAX_PAYLOAD_BYTES (1 MiB) of JSON are accepted, one more byte is refused (UTF-8 bytes,
    not chars)."""
    overhead = len(json.dumps({"x": ""}, separators=(",", ":")))
    at_limit = {"x": "a" * (MAX_PAYLOAD_BYTES - overhead)}
    job_id = app.enqueue("t", tenant="a", payload=at_limit)
    info = app.job(job_id)
    assert info is not None and info.payload == at_limit
    before = fingerprint(dsn)
    with pytest.raises(fairq.InvalidInput, match="limit"):
        app.enqueue("t", tenant="a", payload={"x": "a" * (MAX_PAYLOAD_BYTES - overhead + 1)})
    # multi-byte characters count as their UTF-8 bytes
    with pytest.raises(fairq.InvalidInput, match="limit"):
        app.enqueue("t", tenant="a", payload={"x": "\u00e9" * (MAX_PAYLOAD_BYTES // 2)})
    assert fingerprint(dsn) == before


def test_unknown_task_refused_when_the_app_registers_tasks(dsn: str) -> None:
    with fairq.App(dsn) as a:
        @a.task(name="known")
        def known(job: fairq.Job) -> None:
            pass

        before = fingerprint(dsn)
        with pytest.raises(fairq.InvalidInput, match="unknown task"):
            a.enqueue("unknown", tenant="a")
        assert fingerprint(dsn) == before


@DB_SETTINGS
@given(tenant=st.one_of(good_names, bad_names), weight=st.one_of(st.none(), bad_weights),
       cap=st.one_of(st.none(), bad_caps))
def test_tenants_set_bad_values_change_nothing(app: fairq.App, dsn: str, tenant: Any,
                                               weight: Any, cap: Any) -> None:
    assume(weight is not None or cap is not None or not isinstance(tenant, str)
           or not tenant or len(tenant) > MAX_NAME)
    app.tenants.set("existing", weight=2.0, max_running=3)
    before = fingerprint(dsn)
    with pytest.raises(fairq.InvalidInput):
        app.tenants.set(tenant, weight=weight if weight is not None else math.nan,
                        max_running=cap)
    assert fingerprint(dsn) == before


def test_weight_range_constants() -> None:
    assert (MIN_WEIGHT, MAX_WEIGHT) == (0.001, 1000)


@pytest.mark.parametrize("weight", [*OUT_OF_RANGE_WEIGHTS, math.nan, math.inf, -math.inf])
def test_tenants_set_weight_out_of_range_is_refused(app: fairq.App, dsn: str,
                                                    weight: float) -> None:
    app.tenants.set("existing", weight=2.0, max_running=3)
    before = fingerprint(dsn)
    for tenant in ("existing", "new"):
        with pytest.raises(fairq.InvalidInput, match=WEIGHT_RANGE) as exc:
            app.tenants.set(tenant, weight=weight)
        assert str(exc.value) == f"{WEIGHT_RANGE}, not {weight!r}"
    assert fingerprint(dsn) == before
    assert app.tenants.get("existing").weight == 2.0


def test_weight_message_names_the_range() -> None:
    from fairq import validation

    with pytest.raises(fairq.InvalidInput) as exc:
        validation.weight(5e-324)
    assert str(exc.value) == "weight must be between 0.001 and 1000, not 5e-324"


@pytest.mark.parametrize("weight", IN_RANGE_WEIGHTS)
def test_tenants_set_weight_in_range_is_stored_exactly(app: fairq.App, weight: float) -> None:
    got = app.tenants.set("a", weight=weight)
    assert got.weight == weight
    assert app.tenants.get("a").weight == weight


@DB_SETTINGS
@given(job_id=bad_ids)
def test_job_and_cancel_bad_ids(app: fairq.App, dsn: str, job_id: Any) -> None:
    app.enqueue("t", tenant="a")
    before = fingerprint(dsn)
    with pytest.raises(fairq.InvalidInput):
        app.job(job_id)
    with pytest.raises(fairq.InvalidInput):
        app.cancel(job_id)
    assert fingerprint(dsn) == before


# -- names are data -------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(tenant=st.one_of(good_names, st.sampled_from(INJECTIONS)),
       queue=st.one_of(good_names, st.sampled_from(INJECTIONS)),
       task=st.one_of(good_names, st.sampled_from(INJECTIONS)))
def test_any_unicode_name_is_stored_and_read_back_verbatim(app: fairq.App, tenant: str,
                                                           queue: str, task: str) -> None:
    job_id = app.enqueue(task, tenant=tenant, queue=queue, payload={tenant: [queue, task]})
    info = app.job(job_id)
    assert info is not None
    assert (info.tenant, info.queue, info.task) == (tenant, queue, task)
    assert info.payload == {tenant: [queue, task]}
    app.tenants.set(tenant, weight=2.5, max_running=7)
    got = app.tenants.get(tenant)
    assert (got.tenant, got.weight, got.max_running) == (tenant, 2.5, 7)
    assert tenant in {t.tenant for t in app.tenants.list()}


def test_injection_shaped_names_are_inert_end_to_end(app: fairq.App, dsn: str) -> None:
    """Every injection-shaped name goes through enqueue, claim, finish, stats and the CLI."""
    ids = {name: app.enqueue(name, tenant=name, queue=name, payload={"n": name})
           for name in INJECTIONS}
    for name in INJECTIONS:
        app.tenants.set(name, weight=1.5, max_running=2)
    with fairq.App(dsn) as w_app:
        ran: list[tuple[str, str, str]] = []
        for name in INJECTIONS:
            def handler(job: fairq.Job) -> None:
                ran.append((job.tenant, job.queue, job.task))
            w_app.task(handler, name=name, queue=name)
        w_app.worker(concurrency=4, poll_interval=0.2, listen=False).run(until_empty=True)
    assert sorted(ran) == sorted((n, n, n) for n in INJECTIONS)
    for name, job_id in ids.items():
        info = app.job(job_id)
        assert info is not None and info.status == "done" and info.tenant == name
    code, out, err = cli("--dsn", dsn, "stats", "--json")
    assert code == 0, err
    shown = {(r["queue"], r["tenant"]) for r in json.loads(out)["tenants"]}
    assert {(n, n) for n in INJECTIONS} <= shown
    code, out, err = cli("--dsn", dsn, "tenants", "list", "--json")
    assert code == 0, err
    listed = {t["tenant"]: (t["weight"], t["max_running"]) for t in json.loads(out)}
    assert all(listed[n] == (1.5, 2) for n in INJECTIONS)
    with psycopg.connect(dsn) as c:  # the tables are all still there, nothing else was touched
        tables = {r[0] for r in c.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'fairq'").fetchall()}
    assert {"jobs", "tenants", "tenant_schedule", "settings"} <= tables


def test_cli_shows_unicode_names_verbatim(dsn: str) -> None:
    name = "t\u00e9nant-\u4e2d\u6587-\U0001f680 'q' \"d\""
    code, out, err = cli("--dsn", dsn, "enqueue", "task-\u00fc", "--no-app", "--tenant", name,
                         "--queue", name, "--payload", json.dumps({"k": name}))
    assert code == 0, err
    job_id = int(out)
    code, out, err = cli("--dsn", dsn, "job", str(job_id))
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["tenant"], shown["queue"], shown["task"]) == (name, name, "task-\u00fc")
    assert shown["payload"] == {"k": name}
    code, out, _ = cli("--dsn", dsn, "tenants", "set", name, "--weight", "2")
    assert code == 0 and name in out
    code, out, _ = cli("--dsn", dsn, "tenants", "list")
    assert code == 0 and name in out


# -- schema names ---------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.text(max_size=70))
def test_schema_name_is_an_identifier_or_refused(name: str) -> None:
    try:
        validate_schema_name(name)
    except fairq.InvalidInput:
        return
    assert name and len(name) <= 63 and name[0] in "abcdefghijklmnopqrstuvwxyz_"
    assert set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789_")


@pytest.mark.parametrize("schema", ["Fairq", "fairq; drop", 'a"b', "1abc", "", "a" * 64,
                                    "fa\u00efrq", "fairq\x00", "public.jobs"])
def test_bad_schema_refused_before_connecting(schema: str) -> None:
    with pytest.raises(fairq.InvalidInput):
        fairq.App("postgresql://nobody@127.0.0.1:1/none", schema=schema)


def test_reserved_word_schema_is_quoted_everywhere(empty_dsn: str) -> None:
    """A schema called ``order`` only works if every statement quotes it."""
    with fairq.App(empty_dsn, schema="order") as a:
        a.migrate()

        @a.task(name="t")
        def t(job: fairq.Job) -> None:
            pass

        ids = a.enqueue_many("t", [("x", {}), ("y", {})])
        a.tenants.set("x", weight=2.0)
        a.worker(concurrency=2, poll_interval=0.2).run(until_empty=True)
        assert all((info := a.job(i)) is not None and info.status == "done" for i in ids)
    code, _, err = cli("--dsn", empty_dsn, "--schema", "order", "stats", "--json")
    assert code == 0, err


# -- CLI arguments --------------------------------------------------------------------------------


def _not_a_number(text: str) -> bool:
    try:
        return not math.isfinite(float(text))
    except ValueError:
        return True


bad_numbers = st.one_of(st.sampled_from(["nan", "inf", "-inf", "", " ", "1e999", "0x10", "abc",
                                         "1,5", "--1"]),
                        st.text(max_size=6).filter(_not_a_number))
cli_cases = st.one_of(
    st.tuples(st.just("tenants"), st.just("set"), st.just("a"), st.just("--weight"), bad_numbers),
    st.tuples(st.just("tenants"), st.just("set"), st.just("a"), st.just("--max-running"),
              st.one_of(bad_numbers, st.integers(max_value=-1).map(str),
                        st.integers(min_value=1_000_001).map(str))),
    st.tuples(st.just("tenants"), st.just("set"), st.just("a"), st.just("--weight"),
              st.sampled_from(["0", "-1", "1e7", "0.0009", "5e-324", "1e-300", "1000.5", "1e6",
                               "1000.0000001", "0.000999999"])),
    st.tuples(st.just("tenants"), st.just("set"),
              st.sampled_from(["", "x" * (MAX_NAME + 1), "a\x00b"]), st.just("--weight"),
              st.just("1")),
    st.tuples(st.just("job"), st.one_of(bad_numbers, st.sampled_from(["0", "-5", str(2**63)]))),
    st.tuples(st.just("cancel"), st.one_of(bad_numbers, st.sampled_from(["0", "-5", str(2**63)]))),
    st.tuples(st.just("enqueue"), st.just("t"), st.just("--tenant"), st.just("a"),
              st.just("--payload"), st.sampled_from(["{", "NaN", "Infinity", "[1,", "'x'",
                                                     '"\\u0000"', "{\"a\": -Infinity}"])),
    st.tuples(st.just("enqueue"), st.just("t"), st.just("--tenant"), st.just("a"),
              st.sampled_from(["--delay", "--priority", "--cost"]), bad_numbers),
    st.tuples(st.just("enqueue"), st.just("t"), st.just("--tenant"), st.just("a"),
              st.just("--delay"), st.sampled_from(["-1", "-0.001", "1e12"])),
    st.tuples(st.just("enqueue"), st.just("t"), st.just("--tenant"), st.just("a"),
              st.just("--priority"), st.sampled_from(["99999", "-40000", "1.5"])),
    st.tuples(st.just("enqueue"), st.just("t"), st.just("--tenant"), st.just("a"),
              st.just("--cost"), st.sampled_from(["0", "-0.5", "1e12"])),
    st.tuples(st.just("enqueue"), st.just("t"), st.just("--tenant"),
              st.sampled_from(["", "x" * (MAX_NAME + 1)])),
    st.tuples(st.just("enqueue"), st.just("t")),  # --tenant missing
    st.tuples(st.just("--schema"), st.sampled_from(["X", "a-b", "1a", "a" * 64]), st.just("stats")),
    st.tuples(st.just("tenants"), st.just("bogus")),
    st.tuples(st.just("nosuchcommand")),
)


@DB_SETTINGS
@given(argv=cli_cases)
def test_cli_bad_arguments_exit_2_one_line_nothing_written(dsn: str, argv: tuple[str, ...]) -> None:
    before = fingerprint(dsn)
    code, out, err = cli("--dsn", dsn, *argv)
    assert code == 2, (argv, code, out, err)
    assert out == ""
    one_line(err)
    assert fingerprint(dsn) == before


@pytest.mark.parametrize("flag,text", [
    ("--weight", "5_0"), ("--weight", "nan"), ("--weight", "inf"), ("--weight", "\u0661\u0662"),
    ("--weight", "0x10"), ("--weight", "2,5"), ("--max-running", "1_0"),
    ("--max-running", "\u0661\u0662"), ("--max-running", "1.0"), ("--burst", "\uff13"),
    ("--rate", "1_000"),
])
def test_cli_numbers_are_parsed_strictly_exit_2(dsn: str, flag: str, text: str) -> None:
    """The same strict number language on every surface (fairq.validation.parse_number): no
    underscores, no other scripts' digits, no nan or inf; one line, nothing written."""
    cli("--dsn", dsn, "tenants", "set", "existing", "--weight", "2", "--rate", "5")
    before = fingerprint(dsn)
    code, out, err = cli("--dsn", dsn, "tenants", "set", "existing", flag, text)
    assert code == 2 and out == "", err
    assert f"not {text!r}" in one_line(err)
    assert fingerprint(dsn) == before


@pytest.mark.parametrize("text", ["0.0009", "5e-324", "1e-300", "1000.5", "1e6", "0", "-1",
                                  "1e999"])
def test_cli_weight_out_of_range_exit_2(dsn: str, text: str) -> None:
    """The CLI names the range and the value as typed; refused before connecting."""
    cli("--dsn", dsn, "tenants", "set", "existing", "--weight", "2")
    before = fingerprint(dsn)
    for tenant in ("existing", "new"):
        code, out, err = cli("--dsn", dsn, "tenants", "set", tenant, "--weight", text)
        assert code == 2 and out == "", err
        assert f"{WEIGHT_RANGE}, not {text}" in one_line(err)
    # refused before connecting: a dead database gives the same answer
    code, out, err = cli("--dsn", "postgresql://nobody@127.0.0.1:1/none", "tenants", "set", "a",
                         "--weight", text)
    assert code == 2 and out == "" and WEIGHT_RANGE in one_line(err)
    assert fingerprint(dsn) == before


@pytest.mark.parametrize("text", ["0.001", "1e-3", "1000", "1000.0", "1e3"])
def test_cli_weight_in_range_is_accepted(app: fairq.App, dsn: str, text: str) -> None:
    code, _, err = cli("--dsn", dsn, "tenants", "set", "a", "--weight", text)
    assert code == 0, err
    assert app.tenants.get("a").weight == float(text)


def test_cli_weight_help_names_the_range() -> None:
    code, out, _ = cli("tenants", "set", "--help")
    assert code == 0 and "0.001 to 1000" in " ".join(out.split())


def test_cli_bad_payload_size_exit_2(dsn: str) -> None:
    before = fingerprint(dsn)
    big = json.dumps({"x": "a" * MAX_PAYLOAD_BYTES})
    code, out, err = cli("--dsn", dsn, "enqueue", "t", "--tenant", "a", "--payload", big)
    assert code == 2 and out == "" and "limit" in one_line(err)
    assert fingerprint(dsn) == before


# -- tenant TOML ----------------------------------------------------------------------------------
toml_keys = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters='\x00"\\\n'),
                    min_size=1, max_size=20)


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    return str(v)


@st.composite
def bad_tenant_files(draw: st.DrawFn) -> str:
    """A TOML file with good tenants and exactly one flaw somewhere."""
    names = draw(st.lists(toml_keys, min_size=1, max_size=5, unique=True))
    lines = [f'[tenants."{n}"]\nweight = 2.0\nmax_running = 4\n' for n in names]
    flaw = draw(st.sampled_from(["weight", "cap", "key", "name", "defaults", "syntax", "top",
                                 "type"]))
    if flaw == "weight":
        w = draw(bad_weights.filter(lambda w: not isinstance(w, list)))
        lines.append(f"[tenants.bad]\nweight = {toml_value(w)}\n")
    elif flaw == "cap":
        cap = draw(st.one_of(st.integers(max_value=-1),
                             st.integers(min_value=1_000_001, max_value=2**62), st.floats(),
                             st.booleans(), st.text(max_size=3)))
        lines.append(f"[tenants.bad]\nmax_running = {toml_value(cap)}\n")
    elif flaw == "key":
        key = draw(toml_keys.filter(lambda k: k not in ("weight", "max_running")))
        lines.append(f'[tenants.bad]\n"{key}" = 1\n')
    elif flaw == "name":
        lines.append(f'[tenants."{"x" * (MAX_NAME + 1)}"]\nweight = 1\n')
    elif flaw == "defaults":
        lines.insert(0, "[defaults]\nmax_running = -3\n")
    elif flaw == "syntax":
        pos = draw(st.integers(0, len(lines)))
        lines.insert(pos, draw(st.sampled_from(["[tenants.", "weight = = 1", "[[x]", "a = \"\n"])))
    elif flaw == "top":
        lines.insert(0, "speed = 3\n")
    else:
        lines.append('[tenants.bad]\nweight = "2"\n')
    return "\n".join(lines)


@DB_SETTINGS
@given(text=bad_tenant_files())
def test_tenant_file_with_any_flaw_changes_no_tenant(app: fairq.App, dsn: str, tmp_path: Path,
                                                     text: str) -> None:
    app.tenants.set("existing", weight=2.0, max_running=3)
    before = fingerprint(dsn)
    path = tmp_path / "tenants.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(fairq.InvalidInput):
        app.tenants.apply(str(path))
    code, out, err = cli("--dsn", dsn, "tenants", "apply", str(path))
    assert code == 2 and out == "", err
    one_line(err)
    assert fingerprint(dsn) == before


@pytest.mark.parametrize("where", ["tenant", "defaults"])
@pytest.mark.parametrize("weight", ["0.0009", "5e-324", "1e-300", "1000.5", "1e6", "0", "1001"])
def test_tenant_file_weight_out_of_range(app: fairq.App, dsn: str, tmp_path: Path, where: str,
                                         weight: str) -> None:
    app.tenants.set("existing", weight=2.0, max_running=3)
    before = fingerprint(dsn)
    path = tmp_path / "tenants.toml"
    if where == "defaults":
        path.write_text(f"[defaults]\nweight = {weight}\n\n[tenants.acme]\nweight = 3\n")
    else:
        path.write_text(f"[tenants.acme]\nweight = 3\n\n[tenants.bad]\nweight = {weight}\n")
    shown = repr(tomllib.loads(f"w = {weight}")["w"])
    prefix = "[defaults]" if where == "defaults" else "[tenants.'bad']"
    with pytest.raises(fairq.InvalidInput) as exc:
        load_tenant_file(str(path))
    assert str(exc.value) == f"{prefix}: {WEIGHT_RANGE}, not {shown}"
    with pytest.raises(fairq.InvalidInput, match=WEIGHT_RANGE):
        app.tenants.apply(str(path))
    code, out, err = cli("--dsn", dsn, "tenants", "apply", str(path))
    assert code == 2 and out == "", err
    assert WEIGHT_RANGE in one_line(err)
    assert fingerprint(dsn) == before


def test_tenant_file_weight_range_is_inclusive(app: fairq.App, dsn: str, tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text("[defaults]\nweight = 0.001\n\n[tenants.lo]\nweight = 0.001\n\n"
                    "[tenants.hi]\nweight = 1000\n\n[tenants.mid]\nmax_running = 2\n")
    code, _, err = cli("--dsn", dsn, "tenants", "apply", str(path))
    assert code == 0, err
    assert {t: app.tenants.get(t).weight for t in ("lo", "hi", "mid", "unlisted")} == {
        "lo": 0.001, "hi": 1000.0, "mid": 0.001, "unlisted": 0.001}
    path.write_text("[defaults]\nweight = 1000.0\n")
    app.tenants.apply(str(path))
    assert app.tenants.get("unlisted").weight == 1000.0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_tenant_file_from_arbitrary_bytes_is_parsed_or_refused(tmp_path_factory: pytest.TempPathFactory,
                                                               data: bytes) -> None:
    """No other exception than InvalidInput, whatever the bytes (not UTF-8, NULs, huge ints)."""
    path = tmp_path_factory.mktemp("toml") / "t.toml"
    path.write_bytes(data)
    with contextlib.suppress(fairq.InvalidInput):
        load_tenant_file(str(path))


def test_tenant_file_missing_or_a_directory(app: fairq.App, dsn: str, tmp_path: Path) -> None:
    before = fingerprint(dsn)
    for target in (tmp_path / "nope.toml", tmp_path):
        code, out, err = cli("--dsn", dsn, "tenants", "apply", str(target))
        assert code == 2 and out == "", err
        one_line(err)
    assert fingerprint(dsn) == before


# -- environment variables ------------------------------------------------------------------------
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=st.one_of(st.sampled_from(["FAIRQ", "a b", "x;y", "1x", "a" * 64, "\u00e9"]),
                        st.text(min_size=1, max_size=10).filter(
                            lambda s: s.strip() != s or not s.islower() or not s.isascii())))
def test_fairq_schema_garbage_exit_2(dsn: str, monkeypatch: pytest.MonkeyPatch, schema: str) -> None:
    assume("\x00" not in schema)
    try:
        validate_schema_name(schema)
        assume(False)
    except fairq.InvalidInput:
        pass
    monkeypatch.setenv("FAIRQ_SCHEMA", schema)
    before = fingerprint(dsn)
    code, out, err = cli("--dsn", dsn, "tenants", "set", "a", "--weight", "2")
    assert code == 2 and out == "", err
    assert "schema" in one_line(err)
    with pytest.raises(fairq.InvalidInput):
        fairq.App(dsn)
    assert fingerprint(dsn) == before


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(url=st.one_of(
    st.sampled_from([
        "not a url", "postgresql://", "postgresql://u:{pw}@127.0.0.1:notaport/x",
        "postgresql://u:{pw}@127.0.0.1:1/x?sslmode=bogus", "host=127.0.0.1 port=1 password={pw}",
        "password='{pw}' port=1 host=127.0.0.1 dbname=", "postgresql://u:{pw}@[::1/x",
        "mysql://u:{pw}@127.0.0.1/x", "postgresql://u:{pw}@127.0.0.1:1/x?connect_timeout=abc",
        "=", "'", "host='unterminated password={pw}", ":// password={pw}",
    ]),
    st.text(min_size=1, max_size=30).map(lambda s: s + " password={pw}"),
))
def test_database_url_garbage_fails_cleanly_without_the_password(
    monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    assume("\x00" not in url)
    # replace, not str.format: generated text may hold braces of its own
    monkeypatch.setenv("FAIRQ_DATABASE_URL", url.replace("{pw}", SECRET))
    code, out, err = cli("tenants", "list")
    assert code in (1, 2), (url, code, err)
    line = one_line(err)
    assert SECRET not in out + err
    assert line.startswith("fairq")


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "1e3", "99999999999", "x1"])
def test_metrics_max_tenants_garbage_is_refused(value: str, dsn: str) -> None:
    """A typo in FAIRQ_METRICS_MAX_TENANTS is a usage error, not a silent default of 50."""
    import os

    env = dict(os.environ, FAIRQ_METRICS_MAX_TENANTS=value)
    proc = subprocess.run([sys.executable, "-m", "fairq", "--dsn", dsn, "exporter", "--port", "0"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "FAIRQ_METRICS_MAX_TENANTS" in one_line(proc.stderr)


def test_metrics_max_tenants_valid_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from fairq.metrics import max_tenants_from_env

    for raw, want in (("", 50), (" 7 ", 7), ("0", 0)):
        monkeypatch.setenv("FAIRQ_METRICS_MAX_TENANTS", raw)
        assert max_tenants_from_env() == want


# -- secrets --------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(pw=st.text(st.characters(whitelist_categories=("Lu", "Ll", "Nd"), max_codepoint=0x7F),
                  min_size=8, max_size=30),
       form=st.sampled_from(["url", "kv", "kvq", "query"]))
def test_redact_hides_any_password(pw: str, form: str) -> None:
    pw = "X9" + pw  # cannot occur in the rest of the DSN by chance (nor be a key, like "password")
    dsn = {
        "url": f"postgresql://user:{pw}@db.example:5432/app",
        "kv": f"host=db.example user=u password={pw} dbname=app",
        "kvq": f"host=db.example password='{pw}' dbname=app",
        "query": f"postgresql://user@db.example/app?password={pw}&sslmode=require",
    }[form]
    assert pw not in redact(dsn)


def test_worker_logs_and_metrics_never_show_the_password(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker and an exporter pointed at a dead database with a password: logs, errors and
    metrics name the problem but never the password."""
    from prometheus_client import generate_latest

    import fairq.runtime.settings
    from fairq.metrics import PrometheusObserver
    from fairq.metrics.exporter import build_registry

    # The worker's pools wait 5 s for a connection, and the dead database makes every wait run
    # out (registration, claims, removal: ~30 s in all); the same errors, logged the same way,
    # come after 0.2 s each.
    store = fairq.runtime.settings.Store
    monkeypatch.setattr(fairq.runtime.settings, "Store",
                        lambda *a, **kw: store(*a, **{**kw, "timeout": 0.2}))
    dsn = f"postgresql://fq:{SECRET}@127.0.0.1:1/fq?connect_timeout=1"
    caplog.set_level(logging.DEBUG)
    observer = PrometheusObserver()
    a = fairq.App(dsn)

    @a.task(name="t")
    def t(job: fairq.Job) -> None:
        pass

    w = a.worker(poll_interval=0.1, observer=observer, max_backoff=0.2)
    th = threading.Thread(target=w.run, daemon=True)
    th.start()
    deadline = time.monotonic() + 20
    while w.stats.db_errors < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    w.stop()
    th.join(20)
    assert w.stats.db_errors >= 2, "the worker never tried the dead database"
    registry = build_registry(dsn, "fairq", interval=0)
    metrics = generate_latest(registry).decode() + generate_latest(observer.registry).decode()
    a.close()
    text = caplog.text + metrics + repr(w.store.describe() if w.connections.opened() else "")
    assert caplog.records, "expected the worker to log the outage"
    # What it says: the outage's one line, naming the refused connection.
    assert "database connection lost" in caplog.text and "Connection refused" in caplog.text
    assert SECRET not in text
    assert SECRET not in str([r.exc_info for r in caplog.records if r.exc_info])


# -- the edges that escaped as tracebacks or exit 1 -------------------------------------------
def test_fairq_schema_with_a_trailing_newline_exit_2(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A regex ``$`` matches before a final newline: the whole name must match."""
    for name in ("fairq\n", "fairq\r\n", "\nfairq"):
        with pytest.raises(fairq.InvalidInput):
            validate_schema_name(name)
        monkeypatch.setenv("FAIRQ_SCHEMA", name)
        before = fingerprint(dsn)
        code, out, err = cli("--dsn", dsn, "migrate")
        assert code == 2 and out == "", err
        assert "schema" in one_line(err)
        assert fingerprint(dsn) == before


def test_role_name_with_a_trailing_newline_is_refused() -> None:
    from fairq.admin.roles import validate_role_name

    with pytest.raises(fairq.InvalidInput):
        validate_role_name("fairq_worker\n")


@pytest.mark.parametrize("argv", [
    ("worker", "x:app", "--metrics-port", "70000"),
    ("worker", "x:app", "--metrics-port", "65536"),
    ("worker", "x:app", "--concurrency", "100000"),
    ("worker", "x:app", "--poll-interval", "1e308"),
    ("exporter", "--port", "70000"),
    ("prune", "--older-than", "1e308"),
])
def test_cli_out_of_range_numbers_exit_2(dsn: str, argv: tuple[str, ...]) -> None:
    """Refused while parsing, before the app is imported or the database touched."""
    before = fingerprint(dsn)
    started = time.monotonic()
    code, out, err = cli("--dsn", dsn, *argv)
    assert code == 2 and out == "", (argv, err)
    assert "must be <=" in one_line(err)
    assert time.monotonic() - started < 5
    assert fingerprint(dsn) == before


def test_cli_worker_empty_queue_exit_2(dsn: str, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "badq_tasks.py").write_text("import fairq\napp = fairq.App()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = cli("--dsn", dsn, "worker", "badq_tasks:app", "--queue", "", "--until-empty")
    assert code == 2 and out == "", err
    assert "queue must not be empty" in one_line(err)


@pytest.mark.parametrize(("options", "message"), [
    ({"poll_interval": math.inf}, "poll_interval"),
    ({"poll_interval": math.nan}, "poll_interval"),
    ({"reap_interval": 1e300}, "reap_interval"),
    ({"grace_period": math.inf}, "grace_period"),
    ({"heartbeat_interval": math.inf}, "heartbeat_interval"),
    ({"prune_after": math.inf}, "prune_after"),
    ({"max_backoff": -1}, "max_backoff"),
    ({"max_backoff": 0}, "max_backoff"),
    ({"queues": "abc"}, "not the string"),
    ({"queues": [""]}, "queue must not be empty"),
    ({"queues": ["ok", None]}, "queue must be a string"),
    ({"concurrency": 100_000}, "concurrency"),
    ({"concurrency": True}, "concurrency"),
])
def test_worker_bad_options_are_invalid_input(dsn: str, options: dict[str, Any],
                                              message: str) -> None:
    """Refused when the worker is made, not some time into ``run()``."""
    with fairq.App(dsn) as app, pytest.raises(fairq.InvalidInput, match=message):
        app.worker(**options)


@pytest.mark.parametrize("size", [0, -1, 1.5, True, None])
def test_app_pool_size_must_be_a_positive_integer(size: Any) -> None:
    with pytest.raises(fairq.InvalidInput, match="pool_size"):
        fairq.App("postgresql://unused", pool_size=size)
