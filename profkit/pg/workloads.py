"""The seed workloads, each with a scale factor and its query triple.

- ``nested_loop`` — explain-analyze-87pct-overhead-cut.txt: test1/test2/test3
  and Query-1/2/3.  Scale 1.0 is the seed's row counts (test1 150,000 + 5,000,
  test2 50,000, test3 35,000; Query-1 counts 2,000,000,000 rows).  The plan is
  a nested loop of (test1 ⋈ test3) against a Material over test2, so the work
  grows with scale².
- ``join_sum`` — observer-effect.txt: i1 (1,000,000 rows at 1.0) joined to i2
  (1,000 rows at 1.0), ``sum(i1.i * i2.i)``.
- ``count_star`` — clock-monotonic-coarse-patch.txt: ``count(*)`` over t1
  (10,000,000 rows at 1.0).

Loading is server-side (``INSERT ... SELECT generate_series``) followed by
ANALYZE; random data is seeded so every build sees the same tables.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psycopg

from profkit.errors import ProfkitError


class WorkloadError(ProfkitError):
    pass


MODES = ("plain", "analyze_notiming", "analyze_timing")
EXPLAIN_PREFIX = {
    "plain": "",
    "analyze_notiming": "EXPLAIN (ANALYZE TRUE, TIMING FALSE, BUFFERS FALSE) ",
    "analyze_timing": "EXPLAIN (ANALYZE TRUE, TIMING TRUE, BUFFERS FALSE) ",
    "analyze_buffers": "EXPLAIN (ANALYZE TRUE, TIMING FALSE, BUFFERS TRUE) ",
    "analyze_timing_buffers": "EXPLAIN (ANALYZE TRUE, TIMING TRUE, BUFFERS TRUE) ",
}


def explain_prefix(mode: str, fmt: str | None = None) -> str:
    """The statement prefix of *mode* ('' for plain), with ``FORMAT fmt`` when given."""
    if mode not in EXPLAIN_PREFIX:
        raise WorkloadError(f"unknown mode {mode!r}; known: {', '.join(EXPLAIN_PREFIX)}")
    prefix = EXPLAIN_PREFIX[mode]
    if fmt and prefix:
        prefix = prefix.replace(")", f", FORMAT {fmt.upper()})")
    return prefix


# the seed's names for the triple
SEED_QUERY_NAMES = {"plain": "Query-1", "analyze_notiming": "Query-2", "analyze_timing": "Query-3"}


def _n(base: int, scale: float) -> int:
    return max(1, round(base * scale))


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    select_sql: str
    setup: Callable[[float], list[str]]
    tables: tuple[str, ...]
    expected: Callable[[float], int] | None = None
    source: str = ""

    @property
    def queries(self) -> dict[str, str]:
        return {m: self.query(m) for m in MODES}

    def query(self, mode: str, fmt: str | None = None) -> str:
        return explain_prefix(mode, fmt) + self.select_sql

    def expected_rows(self, scale: float) -> int | None:
        """The value Query-1 must return at this scale (None if not defined)."""
        return None if self.expected is None else self.expected(scale)

    def load(self, conn: psycopg.Connection, scale: float = 1.0) -> None:
        check_scale(scale)
        for stmt in self.setup(scale):
            conn.execute(stmt)
        conn.execute("ANALYZE " + ", ".join(self.tables))
        conn.execute("CHECKPOINT")

    def sizes(self, scale: float) -> dict[str, int]:
        return SIZES[self.name](scale)

    def _repr_html_(self) -> str:
        return (
            f"<b>{html.escape(self.name)}</b>: {html.escape(self.description)}"
            f"<pre>{html.escape(self.select_sql)}</pre>"
        )


def check_scale(scale: float) -> None:
    """A scale is a finite number > 0 (NaN and infinity are refused too)."""
    try:
        ok = math.isfinite(float(scale)) and float(scale) > 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise WorkloadError(f"scale must be a number > 0 and finite, got {scale!r}")


def check_count(value: int, name: str = "reps", minimum: int = 1) -> None:
    """A repetition count (or any count option) is an integer >= *minimum*."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise WorkloadError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_args(workload: str | None = None, *, scale: float | None = None,
               reps: int | None = None, mode: str | None = None,
               modes: Sequence[str] = ()) -> Workload | None:
    """Validate a run's arguments before anything expensive (a build, a download).

    Every front door (CLI, magics, library entry points) calls this first, so a bad
    workload, scale, repetition count or mode fails in milliseconds, not after a
    PostgreSQL build.  Returns the workload when one is named.
    """
    wl = get_workload(workload) if workload is not None else None
    if scale is not None:
        check_scale(scale)
    if reps is not None:
        check_count(reps)
    for m in ([mode] if mode is not None else []) + list(modes):
        if m not in EXPLAIN_PREFIX:
            raise WorkloadError(f"unknown mode {m!r}; known: {', '.join(EXPLAIN_PREFIX)}")
    return wl


def _nested_loop_sizes(s: float) -> dict[str, int]:
    return {
        "test1_a": _n(150_000, s),
        "test1_b": _n(5_000, s),
        "test2": _n(50_000, s),
        "test3": _n(35_000, s),
    }


def _nested_loop_setup(s: float) -> list[str]:
    z = _nested_loop_sizes(s)
    return [
        "DROP TABLE IF EXISTS test1, test2, test3",
        "CREATE TABLE test1 (id int, data int)",
        "CREATE INDEX test1_id_idx ON test1 (id)",
        "CREATE TABLE test2 (id int PRIMARY KEY, data int)",
        "CREATE TABLE test3 (id int PRIMARY KEY, data int)",
        f"INSERT INTO test1 (id, data) SELECT i, i % 51 FROM generate_series(1, {z['test1_a']}) AS i",
        f"INSERT INTO test1 (id, data) SELECT i, i % 51 FROM generate_series(1, {z['test1_b']}) AS i",
        "SELECT setseed(0.5)",
        f"INSERT INTO test2 (id, data) SELECT i, floor(random() * 50 + 1)::int "
        f"FROM generate_series(1, {z['test2']}) AS i",
        f"INSERT INTO test3 (id, data) SELECT i, i FROM generate_series(1, {z['test3']}) AS i",
    ]


def _nested_loop_expected(s: float) -> int:
    z = _nested_loop_sizes(s)
    matched = min(z["test1_a"], z["test3"]) + min(z["test1_b"], z["test3"])
    return matched * z["test2"]


def _join_sum_sizes(s: float) -> dict[str, int]:
    return {"i1": _n(1_000_000, s), "i2": _n(1_000, s)}


def _join_sum_setup(s: float) -> list[str]:
    z = _join_sum_sizes(s)
    return [
        "DROP TABLE IF EXISTS i1, i2",
        f"CREATE TABLE i1 AS SELECT i FROM generate_series(1, {z['i1']}) AS i",
        f"CREATE TABLE i2 AS SELECT i FROM generate_series(1, {z['i2']}) AS i",
    ]


def _join_sum_expected(s: float) -> int:
    z = _join_sum_sizes(s)
    m = min(z["i1"], z["i2"])
    return sum(i * i for i in range(1, m + 1))


def _count_star_sizes(s: float) -> dict[str, int]:
    return {"t1": _n(10_000_000, s)}


def _count_star_setup(s: float) -> list[str]:
    z = _count_star_sizes(s)
    return [
        "DROP TABLE IF EXISTS t1",
        "CREATE TABLE t1 (a int)",
        f"INSERT INTO t1 SELECT * FROM generate_series(1, {z['t1']})",
    ]


SIZES = {
    "nested_loop": _nested_loop_sizes,
    "join_sum": _join_sum_sizes,
    "count_star": _count_star_sizes,
}

WORKLOADS: dict[str, Workload] = {
    "nested_loop": Workload(
        "nested_loop",
        "Query-1/2/3 of explain-analyze-87pct-overhead-cut.txt: 3-way join, nested loop over a "
        "Material; ~2e9 rows through the nested loop at scale 1.0 (grows with scale²)",
        "SELECT count(*) FROM test1 AS a, test2 AS b, test3 AS c WHERE a.id = c.id",
        _nested_loop_setup,
        ("test1", "test2", "test3"),
        _nested_loop_expected,
        "explain-analyze-87pct-overhead-cut.txt",
    ),
    "join_sum": Workload(
        "join_sum",
        "observer-effect.txt: sum(i1.i * i2.i) over i1 (1e6 rows) join i2 (1e3 rows)",
        "SELECT sum(i1.i * i2.i) FROM i1 INNER JOIN i2 USING (i)",
        _join_sum_setup,
        ("i1", "i2"),
        _join_sum_expected,
        "observer-effect.txt",
    ),
    "count_star": Workload(
        "count_star",
        "clock-monotonic-coarse-patch.txt: count(*) over t1 (1e7 rows at scale 1.0)",
        "SELECT count(*) FROM t1",
        _count_star_setup,
        ("t1",),
        lambda s: _count_star_sizes(s)["t1"],
        "clock-monotonic-coarse-patch.txt",
    ),
}


def get_workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise WorkloadError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}") from None
