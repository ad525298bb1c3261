"""The small C helpers profkit compiles for itself (clock_bench.c, vcpu_calib.c).

Each is compiled once per source hash into ``<cache>/tools/<stem>-<hash>``, with ``-O2``
as PostgreSQL is built and no ``-march=native`` (the loop is what a distribution binary
would run); a new source is a new binary, an unchanged one is reused.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from profkit import paths
from profkit.errors import ToolNotFound
from profkit.processes import run, which


def helper_path(src: Path) -> Path:
    """Where the compiled helper for the current text of *src* lives."""
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
    return paths.sub("tools") / f"{src.stem}-{digest}"


def build_helper(src: Path, needed_by: str) -> Path:
    """Compile *src* once per source hash; return the binary's path. *needed_by* names
    what needs it, for the error when there is no C compiler."""
    out = helper_path(src)
    if out.exists():
        return out
    try:
        cc = which("gcc")
    except ToolNotFound as e:
        raise ToolNotFound(f"{needed_by} needs a C compiler to build its helper: {e}") from None
    # a per-process temporary name: concurrent first uses do not clobber each other
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    run([cc, "-O2", "-Wall", "-o", tmp, src], timeout=120, what=f"gcc ({src.stem})")
    tmp.replace(out)
    return out
