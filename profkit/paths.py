"""Where profkit keeps things.

The cache (sources, build trees, installs, ccache, helper tools) lives outside
the clone so a fresh clone on the same machine (CI's) reuses it:
``$PROFKIT_CACHE``, else ``/var/cache/profkit`` for root (postgres runs as an
unprivileged user that cannot enter /root), else ``$XDG_CACHE_HOME/profkit`` or
``~/.cache/profkit``.
"""
from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


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


def profiles_dir() -> Path:
    p = Path(os.environ.get("PROFKIT_PROFILES", PROJECT_ROOT / "profiles"))
    p.mkdir(parents=True, exist_ok=True)
    return p


def flamegraphs_dir() -> Path:
    p = Path(os.environ.get("PROFKIT_FLAMEGRAPHS", PROJECT_ROOT / "flamegraphs"))
    p.mkdir(parents=True, exist_ok=True)
    return p
