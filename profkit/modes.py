"""The modes a query runs in, their EXPLAIN prefixes and the seed's query names.

One home for the vocabulary every layer speaks (a base module: it imports nothing of
profkit). ``plain`` is the query itself; the others wrap it in EXPLAIN:

- ``analyze_notiming`` — Query-2, ``EXPLAIN (ANALYZE TRUE, TIMING FALSE, BUFFERS FALSE)``:
  rows only;
- ``analyze_timing`` — Query-3, the same with ``TIMING TRUE``;
- ``analyze_buffers`` / ``analyze_timing_buffers`` — PostgreSQL 18's default
  ``EXPLAIN ANALYZE`` (BUFFERS on), without and with TIMING.

:data:`PLAN_PREFIX` (``EXPLAIN (COSTS OFF)``) is what an experiment records of each arm's
plan to check that the arms it compares chose the same one.
"""
from __future__ import annotations

#: The seed's triple, in the order reports present them.
MODES: tuple[str, ...] = ("plain", "analyze_notiming", "analyze_timing")

EXPLAIN_PREFIX: dict[str, str] = {
    "plain": "",
    "analyze_notiming": "EXPLAIN (ANALYZE TRUE, TIMING FALSE, BUFFERS FALSE) ",
    "analyze_timing": "EXPLAIN (ANALYZE TRUE, TIMING TRUE, BUFFERS FALSE) ",
    "analyze_buffers": "EXPLAIN (ANALYZE TRUE, TIMING FALSE, BUFFERS TRUE) ",
    "analyze_timing_buffers": "EXPLAIN (ANALYZE TRUE, TIMING TRUE, BUFFERS TRUE) ",
}

#: Every mode a query can run in (plain first).
ALL_MODES: tuple[str, ...] = tuple(EXPLAIN_PREFIX)

#: The seed's names for the triple (explain-analyze-87pct-overhead-cut.txt).
QUERY_NAMES: dict[str, str] = {"plain": "Query-1", "analyze_notiming": "Query-2",
                               "analyze_timing": "Query-3"}

#: The plan an arm chose, without costs (they differ between builds for no reason).
PLAN_PREFIX = "EXPLAIN (COSTS OFF) "


class ModeError(ValueError):
    """An unknown mode name."""


def check_mode(mode: str) -> str:
    if mode not in EXPLAIN_PREFIX:
        raise ModeError(f"unknown mode {mode!r}; known: {', '.join(EXPLAIN_PREFIX)}")
    return mode


def explain_prefix(mode: str, fmt: str | None = None) -> str:
    """The statement prefix of *mode* ('' for plain), with ``FORMAT fmt`` when given."""
    prefix = EXPLAIN_PREFIX[check_mode(mode)]
    if fmt and prefix:
        prefix = prefix.replace(")", f", FORMAT {fmt.upper()})")
    return prefix


def query_name(mode: str) -> str:
    """``Query-2`` for analyze_notiming; other modes are named by themselves."""
    return QUERY_NAMES.get(mode, mode)
