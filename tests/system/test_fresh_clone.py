"""The README's two commands on a fresh checkout: as root in a private folder, and as an
ordinary user.

Each test copies this tree (without .venv and caches) into a new folder, lets ``scripts/_venv.sh``
make the checkout's own .venv, then runs ``./scripts/fairq demo --quick`` on the embedded
PostgreSQL and, as root, ``./scripts/test`` on one small test file with the embedded server.
Slow (a new .venv each: minutes on a busy machine), hence the ``slow`` marker:

    FAIRQ_SLOW=1 ./scripts/test -m slow tests/system/test_fresh_clone.py

The fast check of the same path decisions is in test_embedded.py.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fairq.embedded import sysuser
from tests.support.paths import REPO

pytestmark = pytest.mark.slow

IGNORE = shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "__pycache__",
                                ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis",
                                "out", "node_modules")
VENV_TIMEOUT_S = 1800  # pip install into a new .venv, on a busy shared machine
RUN_TIMEOUT_S = 300
USER = "fairq_clone_test"


def _env(home: Path, **extra: str) -> dict[str, str]:
    """A user's plain environment: no database configured, no FAIRQ_HOME, no test settings."""
    keep = ("PATH", "LANG", "PIP_FIND_LINKS", "PIP_CERT", "PIP_DEFAULT_TIMEOUT",
            "PIP_DISABLE_PIP_VERSION_CHECK", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(HOME=str(home), **extra)
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float,
         user: pwd.struct_passwd | None = None) -> subprocess.CompletedProcess[str]:
    ids: dict[str, object] = {}
    if user is not None:
        ids = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False, **ids)  # type: ignore[call-overload]
    out = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{out}"
    return done  # type: ignore[no-any-return]


def _stop_embedded(clone: Path, env: dict[str, str], user: pwd.struct_passwd | None) -> None:
    code = ("from fairq.embedded import default_home, stop_server; import shutil; "
            "h = default_home(); stop_server(h); print(h)")
    python = clone / ".venv" / "bin" / "python"
    if python.exists():
        home = _run([str(python), "-c", code], clone, env, 120, user).stdout.strip()
        if home and not home.startswith(str(clone)):
            shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def root_clone() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("the private-folder case is root's: run as root")
    private = Path(tempfile.mkdtemp(prefix="fairq-clone-"))  # mode 0700, like /root
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    clone = private / "c"
    shutil.copytree(REPO, clone, ignore=IGNORE)
    try:
        yield clone
    finally:
        _stop_embedded(clone, _env(Path("/root")), None)
        shutil.rmtree(private, ignore_errors=True)


def test_root_in_a_private_folder_runs_the_demo_and_the_tests(root_clone: Path) -> None:
    env = _env(Path("/root"))
    _run(["bash", "-c", "source scripts/_venv.sh && ensure_venv dev,embedded"],
         root_clone, env, VENV_TIMEOUT_S)

    demo = _run(["./scripts/fairq", "demo", "--quick"], root_clone, env, RUN_TIMEOUT_S)
    assert "Under FIFO the 10 small tenants queued behind tenant-1" in demo.stdout
    assert "embedded PostgreSQL" in demo.stderr

    tests = _run(["./scripts/test", "-p", "no:cacheprovider",
                  "tests/integration/test_positional_claims.py"],
                 root_clone, dict(env, FAIRQ_TEST_EMBEDDED="1", FAIRQ_TEST_WORKERS="0"),
                 RUN_TIMEOUT_S)
    assert " passed" in tests.stdout and " error" not in tests.stdout, tests.stdout


@pytest.fixture
def user_clone() -> Iterator[tuple[Path, pwd.struct_passwd]]:
    if os.geteuid() != 0:
        pytest.skip("making an ordinary user needs root (useradd); as one, run the README's "
                    "commands yourself")
    if shutil.which("useradd") is None:
        pytest.skip("useradd is missing")
    # Under fairq's users lock, taken by whatever creates or removes fairq_postgres: another
    # useradd holding /etc/passwd meanwhile would fail this one ("cannot lock /etc/passwd").
    with sysuser.users_lock(exclusive=True):
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", USER],
                       capture_output=True, check=False)
        user = pwd.getpwnam(USER)
    base = Path(tempfile.mkdtemp(prefix="fairq-clone-user-"))
    os.chown(base, user.pw_uid, user.pw_gid)
    clone = base / "c"
    shutil.copytree(REPO, clone, ignore=IGNORE)
    subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(clone)], check=True)
    try:
        yield clone, user
    finally:
        _stop_embedded(clone, _env(Path(user.pw_dir)), user)
        shutil.rmtree(base, ignore_errors=True)
        with sysuser.users_lock(exclusive=True):
            subprocess.run(["userdel", "--remove", USER], capture_output=True, check=False)


def test_an_ordinary_user_runs_the_demo(user_clone: tuple[Path, pwd.struct_passwd]) -> None:
    clone, user = user_clone
    env = _env(Path(user.pw_dir))
    _run(["bash", "-c", "source scripts/_venv.sh && ensure_venv embedded"],
         clone, env, VENV_TIMEOUT_S, user)

    demo = _run(["./scripts/fairq", "demo", "--quick"], clone, env, RUN_TIMEOUT_S, user)

    assert "Under FIFO the 10 small tenants queued behind tenant-1" in demo.stdout
    assert f"{user.pw_dir}/.cache/fairq/" in demo.stderr  # the user's own home, no root tree
