"""The embedded server's system user under concurrency (issue: a first run as root failed once
with "initdb: could not look up effective user ID 999", an id read for a user that was then
removed and re-created).

Root only: it creates and removes a system user of its own (never ``fairq_postgres``, which other
tests and servers on this machine use), through the same code as the real one.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fairq.embedded import server, sysuser
from tests.support.paths import REPO, SUPPORT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creates and removes system users: root only")

CHILD = SUPPORT / "sysuser_child.py"
NAME = "fairq_sysuser_test"
USERS = 5  # processes that create/read the user and run a command as it
MIN_ROUNDS = 5  # each, and on until the churner is done
CHURNS = 3  # remove-and-re-create rounds of the one churning process


def _remove() -> None:
    with sysuser.users_lock(exclusive=True):
        sysuser.remove(NAME)


@pytest.fixture
def no_user() -> Iterator[None]:
    """A machine without the test's user (removed before and after)."""
    _remove()
    assert sysuser.lookup(NAME) is None
    try:
        yield
    finally:
        _remove()


def test_processes_creating_using_and_removing_the_user_at_once_agree(
    no_user: None, tmp_path: Path,
) -> None:
    done = tmp_path / "churned"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))

    def child(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(CHILD), *args, str(done)], env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )

    users = [child("use", NAME, str(MIN_ROUNDS)) for _ in range(USERS)]
    churner = child("churn", NAME, str(CHURNS))
    procs = [*users, churner]
    try:
        for p in procs:  # all start at once
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    assert [p.returncode for p in procs] == [0] * len(procs), [err for _, err in outs]
    churned = json.loads(outs[-1][0])
    assert len(churned) == CHURNS and all(c["gone"] for c in churned)  # really removed, and back
    for out, _ in outs[:-1]:
        rounds = json.loads(out)
        assert len(rounds) >= MIN_ROUNDS
        for r in rounds:
            # the ids the process read were the user's when the command ran as them
            assert r["rc"] == 0, r
            assert r["id"] == [str(r["uid"]), str(r["gid"]), NAME], r
    final = sysuser.lookup(NAME)
    assert final is not None
    lines = subprocess.run(["getent", "passwd"], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert [ln for ln in lines if ln.startswith(f"{NAME}:")] == [
        f"{NAME}:x:{final.pw_uid}:{final.pw_gid}::/nonexistent:/usr/sbin/nologin"
    ]


def test_data_of_a_uid_no_user_has_now_is_given_to_the_re_created_user() -> None:
    """The user removed by a tool that ignores fairq's lock and re-created with another uid:
    the data its former uid owned becomes the new user's; another user's data is left alone."""
    used = {p.pw_uid for p in pwd.getpwall()}
    old, new = [uid for uid in range(60000, 65000) if uid not in used][:2]
    base = Path(tempfile.mkdtemp(prefix="fairq-adopt-", dir="/var/tmp"))
    try:
        paths = server._Paths.of(base / "home")
        (paths.pgdata / "base").mkdir(parents=True)
        (paths.pgdata / "PG_VERSION").write_text("18\n")
        paths.log.write_text("")
        for p in (paths.root, paths.pgdata, paths.pgdata / "base", paths.pgdata / "PG_VERSION",
                  paths.log):
            os.chown(p, old, old)
        user = pwd.struct_passwd((NAME, "x", new, new, "", "/nonexistent", "/usr/sbin/nologin"))

        server._adopt(paths, user)

        for p in (paths.pgdata, paths.pgdata / "base", paths.pgdata / "PG_VERSION", paths.log):
            assert (p.stat().st_uid, p.stat().st_gid) == (new, new), p
        os.chown(paths.pgdata, 0, 0)  # root: a uid that names someone
        server._adopt(paths, pwd.struct_passwd((NAME, "x", old, old, "", "/", "/bin/false")))
        assert paths.pgdata.stat().st_uid == 0
        assert (paths.pgdata / "PG_VERSION").stat().st_uid == new
    finally:
        shutil.rmtree(base, ignore_errors=True)
