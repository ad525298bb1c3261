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


def sub(name: str) -> Path:
    p = cache_dir() / name
    p.mkdir(parents=True, exist_ok=True)
    return p


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
