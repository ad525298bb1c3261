"""Parsers: raw profiler output (text files) → tidy tables. Pure: no processes, no I/O
beyond reading the given file.

- :mod:`profkit.parse.perf_script` — ``perf script`` text → folded stacks (streaming)
- :mod:`profkit.parse.folded` — folded stacks read/write/diff, ``stacks``/``functions``
  tables, the instrumentation family and its share
- :mod:`profkit.parse.gprof` — ``gprof BINARY gmon.out`` text → ``functions`` and
  ``call_edges``

:func:`load_stacks` opens either stack format by sniffing its first lines.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from profkit.errors import ParseError
from profkit.parse._io import open_text
from profkit.parse.folded import (
    INSTRUMENTATION_FUNCTIONS,
    InvalidLines,
    _is_count,
    diff_folded,
    functions_table,
    instrumentation_share,
    is_instrumentation,
    read_diff_folded,
    read_folded,
    read_folded_or_diff,
    stacks_table,
    write_folded,
)

__all__ = [
    "INSTRUMENTATION_FUNCTIONS",
    "InvalidLines",
    "detect_stack_format",
    "diff_folded",
    "functions_table",
    "instrumentation_share",
    "is_instrumentation",
    "load_stacks",
    "read_diff_folded",
    "read_folded",
    "read_folded_or_diff",
    "stacks_table",
    "write_folded",
]


def _looks_folded(line: bytes) -> bool:
    """``frame;frame COUNT``: a non-blank start, then a plain count after the last blank
    (linear: no regular expression backtracking over a long line)."""
    body = line.rstrip()
    if not body or body[:1].isspace():
        return False
    i = max(body.rfind(b" "), body.rfind(b"\t"))
    return i > 0 and _is_count(body[i + 1:])


def detect_stack_format(path: str | os.PathLike[str]) -> Literal["folded", "perf-script"]:
    """``"perf-script"`` or ``"folded"``, from the first lines of *path* that are neither
    blank nor ``#`` comments."""
    p = Path(path)
    head: list[bytes] = []
    # through the shared reader: a directory, a broken .gz or an endless line (/dev/zero)
    # is one ParseError, not an OSError, EOFError or unbounded memory
    lines = open_text(p)
    try:
        # ten lines that are neither blank nor comments: `perf script --header` starts
        # with some 30 comment lines (more with many CPUs or build ids)
        for lineno, line in lines:
            if line.strip() and not line.startswith("#"):
                head.append(line.encode("utf-8", "replace"))
            if len(head) >= 10 or lineno >= 2000:
                break
    finally:
        lines.close()
    if not head:
        return "folded"  # empty: either parser gives an empty profile
    if head[0].startswith(b"PERFILE"):
        raise ParseError(f"{p} is a perf.data file: run `perf script -i {p} > {p}.txt` and "
                         "pass the text")
    if any(ln[:1] == b"\t" for ln in head):
        return "perf-script"
    # folded when most lines are: a stray line in a folded file (inferno's bad-lines.txt)
    # is one flamegraph.pl leaves out, not a sign of perf script, whose sample lines end
    # with the event's colon or a frame's (dso), never with a plain count
    if 2 * sum(_looks_folded(ln) for ln in head) >= len(head):
        return "folded"
    return "perf-script"  # e.g. samples printed without callchains


def load_stacks(path: str | os.PathLike[str], *,
                invalid: InvalidLines | None = None,
                **perf_kwargs: Any) -> dict[str, float]:
    """Folded stacks from a folded file or a ``perf script`` text (``.gz`` allowed).

    *invalid*: as :func:`read_folded`'s (a folded file's lines without a valid count are
    collected there instead of refused). *perf_kwargs* go to
    :func:`profkit.parse.perf_script.fold_perf_script` (``vdso=``...).
    """
    if detect_stack_format(path) == "folded":
        return read_folded(path, invalid=invalid)
    from profkit.parse.perf_script import fold_perf_script

    return fold_perf_script(path, **perf_kwargs).counts
