"""Where profkit keeps things.

The cache (sources, build trees, installs, ccache, helper tools) lives outside
the clone so a fresh clone on the same machine (CI's) reuses it:
``$PROFKIT_CACHE``, else ``/var/cache/profkit`` for root (postgres runs as an
unprivileged user that cannot enter /root), else ``$XDG_CACHE_HOME/profkit`` or
``~/.cache/profkit``.

Outputs (``profiles/``, ``flamegraphs/``) go where the user is, never into the installed
package: ``$PROFKIT_PROFILES`` / ``$PROFKIT_FLAMEGRAPHS`` when set, else under
:func:`home`: ``$PROFKIT_HOME``, else the clone's root when the current directory is
inside the clone profkit runs from (``make demo``, the notebooks in ``notebooks/``),
else the current directory. A command's ``--out`` overrides all of these.
"""
from __future__ import annotations

import os
from pathlib import Path

from profkit.errors import ProfkitError

# The package's parent: the clone's root when profkit runs from a source tree, the
# site-packages folder in an installed profkit (never a place for outputs).
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def clone_root() -> Path | None:
    """The source tree profkit runs from (editable install or ``python -m`` in the
    clone), or None for an installed copy."""
    root = PROJECT_ROOT
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return None
    return root if 'name = "profkit"' in text else None


def home() -> Path:
    """The folder that holds ``profiles/`` and ``flamegraphs/`` (see module docstring)."""
    env = os.environ.get("PROFKIT_HOME")
    if env:
        return Path(env).expanduser()
    cwd = Path.cwd()
    root = clone_root()
    if root is not None and (cwd == root or root in cwd.resolve().parents):
        return root
    return cwd


def cache_dir() -> Path:
    env = os.environ.get("PROFKIT_CACHE")
    if env:
        p = Path(env)
    elif os.geteuid() == 0:
        # As root, postgres runs as an unprivileged user that must be able to
        # reach the installs; /root is mode 0700, so the cache lives in /var/cache.
        p = Path("/var/cache/profkit")
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        p = Path(base) / "profkit"
    p.mkdir(parents=True, exist_ok=True)
    return p


# The cache's folders whose subfolders come and go by the hundred (a throwaway cluster's
# ~1,000 files, a cold build's empty cache, a build's tree): each new subfolder is placed
# on a block group of its own (see spread_subfolders).
SPREAD = frozenset({"clusters", "tmp", "builds"})
_spread_done: set[Path] = set()


def sub(name: str) -> Path:
    p = cache_dir() / name
    p.mkdir(parents=True, exist_ok=True)
    if name in SPREAD and p not in _spread_done:
        _spread_done.add(p)
        spread_subfolders(p)
    return p


# linux/fs.h: FS_IOC_GETFLAGS / FS_IOC_SETFLAGS (the kernel reads and writes an int) and
# FS_TOPDIR_FL, which ext2/3/4 keep as an inode flag (chattr +T)
_FS_IOC_GETFLAGS = 0x80086601
_FS_IOC_SETFLAGS = 0x40086602
FS_TOPDIR_FL = 0x00020000


def _topdir(p: Path, add: bool) -> bool | None:
    """*p*'s "top directory" flag, first set when *add*; None where its filesystem keeps no
    such flag, where this user may not set it, or off Linux."""
    import array
    import fcntl

    if os.uname().sysname != "Linux":
        return None
    try:
        fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        buf = array.array("i", [0])
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, buf, True)
        if add and not buf[0] & FS_TOPDIR_FL:
            buf[0] |= FS_TOPDIR_FL
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, buf)
        return bool(buf[0] & FS_TOPDIR_FL)
    except OSError:  # no such flag on this filesystem (ENOTTY, EOPNOTSUPP), or not ours
        return None
    finally:
        os.close(fd)


def topdir_flag(p: Path) -> bool | None:
    """Whether *p* carries the "top directory" flag (None: see :func:`_topdir`)."""
    return _topdir(p, add=False)


def spread_subfolders(p: Path) -> bool:
    """Ask the filesystem to place each new subfolder of *p* on a block group of its own
    (ext2/3/4's "top directory" flag, ``chattr +T``); True when *p* has the flag.

    Why: on an ext4 without a journal (this VM's root filesystem) each new file skips, one
    look-up each, every inode of its block group freed in the last minute (six minutes
    while that part of the inode table is not yet written back), so the ~1,000 files of a
    cluster's copy scan past every file of the clusters stopped just before in the same
    folder.  With the flag, ext4's Orlov allocator places each new subfolder, and so the
    files in it, on another block group.  A cluster's start, connect and stop took 0.94 s
    in a plain folder (its processes' system time 0.82 s) against 0.21 s in a folder with
    the flag (0.08 s; medians, benchmarks/results/cluster_start.txt).  Only where the
    subfolders land changes; a filesystem without the flag, or a folder this user may not
    change, is left as it is."""
    return bool(_topdir(p, add=True))


def reachable_by_all(folder: Path) -> bool:
    """Whether every user may pass through *folder* and each folder above it (o+x)."""
    import stat

    try:
        return all(os.stat(p).st_mode & stat.S_IXOTH
                   for p in (folder.resolve(), *folder.resolve().parents))
    except OSError:
        return False


def scratch_for_another_user(prefix: str) -> Path:
    """A new private folder (the caller removes it, and gives it to the user) where a
    process run as another user (the clusters' user) can reach it: in the temp folder
    when that is open to all, as /tmp is; else in the cache's ``tmp/`` (a TMPDIR of the
    caller's own, pam_tmpdir's /tmp/user/0 at 0700, is closed to that user)."""
    import tempfile

    temp = Path(tempfile.gettempdir())
    where = temp if reachable_by_all(temp) else sub("tmp")
    return Path(tempfile.mkdtemp(prefix=prefix, dir=where))


def empty_cache(prefix: str) -> Path:
    """A new, empty build cache beside this one (for a cold build): readable by the
    cluster's unprivileged user, sharing only this cache's source downloads and apt lists
    (symlinked), so a cold build downloads nothing again.  The caller removes it."""
    import tempfile

    warm = cache_dir()
    cold = Path(tempfile.mkdtemp(prefix=prefix, dir=sub("tmp")))
    os.chmod(cold, 0o755)
    for reused in ("apt", "downloads"):
        (warm / reused).mkdir(exist_ok=True)
        (cold / reused).symlink_to(warm / reused)
    return cold


def _output_dir(env: str, name: str) -> Path:
    p = Path(os.environ.get(env) or home() / name)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:

        raise ProfkitError(f"cannot create {p} ({e.strerror or e}): run profkit from a folder "
                           f"you can write to, or set PROFKIT_HOME (or {env}), or pass "
                           f"--out") from None
    return p


def profiles_dir() -> Path:
    """Where runs go: ``$PROFKIT_PROFILES``, else ``profiles/`` under :func:`home`."""
    return _output_dir("PROFKIT_PROFILES", "profiles")


def flamegraphs_dir() -> Path:
    """Where flamegraphs go: ``$PROFKIT_FLAMEGRAPHS``, else ``flamegraphs/`` under
    :func:`home`."""
    return _output_dir("PROFKIT_FLAMEGRAPHS", "flamegraphs")


#: The capture script for servers without profkit (plain sh; ``profkit record-script``
#: writes a copy of it, ``profkit import`` reads what it records). Package data.
RECORD_SCRIPT = Path(__file__).resolve().parent / "scripts" / "pk-record.sh"
