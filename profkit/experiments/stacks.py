"""Stacks read from files for a drawing: folded stacks, a differential folded file or
``perf script`` text (sniffed), from a path or standard input, in profkit's reading of
perf script (one per sample, vDSO frames named). What ``profkit flamegraph`` reads; the
parsers are :mod:`profkit.parse`'s.
"""
from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from profkit.parse import detect_stack_format, load_stacks
from profkit.parse.folded import InvalidLines, read_folded_or_diff
from profkit.parse.perf_script import VdsoSymbols, fold_perf_script

__all__ = ["InvalidLines", "perf_reading", "read_stacks", "read_stacks_or_diff"]


def perf_reading(vdso: str | None = None) -> dict[str, Any]:
    """How perf script text is folded for a drawing: in samples, vDSO frames named; *vdso*
    an image file, or ``self`` for the running kernel's (read once for every input)."""
    kw: dict[str, Any] = {"weight": "samples", "vdso_names": True}
    if vdso:
        kw["vdso"] = (VdsoSymbols.from_running_kernel() if vdso == "self"
                      else VdsoSymbols.from_image(vdso))
    return kw


def read_stacks(path: str, reading: dict[str, Any],
                invalid: InvalidLines | None = None) -> dict[str, float]:
    """Folded stacks or perf script text (sniffed) from *path*, or stdin for ``-`` (spooled
    to a temporary file first, so it is sniffed like a file). *invalid*: takes a folded
    file's lines without a valid count, as flamegraph.pl leaves them out (else
    they are refused)."""
    with _spooled(path) as name:
        return load_stacks(name, invalid=invalid, **reading)


def read_stacks_or_diff(path: str, reading: dict[str, Any],
                        invalid: InvalidLines | None = None
                        ) -> tuple[dict[str, float], dict[str, float] | None]:
    """As :func:`read_stacks`, and a differential folded file too (difffolded.pl's
    ``stack BEFORE AFTER``, which flamegraph.pl draws as a differential): ``(stacks, None)``
    for one profile, ``(after, before)`` for a differential file."""
    with _spooled(path) as name:
        if detect_stack_format(name) == "folded":
            return read_folded_or_diff(name, invalid=invalid)
        # sniffed once: load_stacks would read the head again
        return fold_perf_script(name, **reading).counts, None


@contextlib.contextmanager
def _spooled(path: str) -> Iterator[str]:
    """*path*, or for ``-`` a temporary file holding standard input (removed after)."""
    if path != "-":
        yield path
        return
    with tempfile.NamedTemporaryFile(prefix="profkit-stdin-", suffix=".txt") as tmp:
        shutil.copyfileobj(sys.stdin.buffer, tmp, 1 << 20)
        tmp.flush()
        yield tmp.name
