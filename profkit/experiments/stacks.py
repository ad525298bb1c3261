"""Stacks read from files for a drawing: folded stacks or ``perf script`` text (sniffed),
from a path or standard input, in profkit's reading of perf script (one per sample, vDSO
frames named). What ``profkit flamegraph`` reads; the parsers are :mod:`profkit.parse`'s.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from typing import Any

from profkit.parse import load_stacks
from profkit.parse.perf_script import VdsoSymbols


def perf_reading(vdso: str | None = None) -> dict[str, Any]:
    """How perf script text is folded for a drawing: in samples, vDSO frames named; *vdso*
    an image file, or ``self`` for the running kernel's (read once for every input)."""
    kw: dict[str, Any] = {"weight": "samples", "vdso_names": True}
    if vdso:
        kw["vdso"] = (VdsoSymbols.from_running_kernel() if vdso == "self"
                      else VdsoSymbols.from_image(vdso))
    return kw


def read_stacks(path: str, reading: dict[str, Any]) -> dict[str, float]:
    """Folded stacks or perf script text (sniffed) from *path*, or stdin for ``-`` (spooled
    to a temporary file first, so it is sniffed like a file)."""
    if path != "-":
        return load_stacks(path, **reading)
    with tempfile.NamedTemporaryFile(prefix="profkit-stdin-", suffix=".txt") as tmp:
        shutil.copyfileobj(sys.stdin.buffer, tmp, 1 << 20)
        tmp.flush()
        return load_stacks(tmp.name, **reading)
