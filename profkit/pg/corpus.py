"""A query corpus covering the executor's node types, for "same answers" checks.

Every patch variant must report exactly vanilla's actual rows and loops for
every plan node under ``EXPLAIN (ANALYZE, TIMING FALSE, FORMAT JSON)``, and a
non-negative time for every node under TIMING TRUE.  :func:`plan_rows` runs
the corpus on one cluster; :func:`compare` diffs two of its results.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd
import psycopg

from profkit.parse.explain import flatten_plan, node_total_times
from profkit.pg.workloads import explain_prefix

SETUP = [
    "DROP TABLE IF EXISTS ca, cb, csmall, cbig, cpart",
    "CREATE TABLE ca (id int PRIMARY KEY, g int, v int, t text)",
    "INSERT INTO ca SELECT i, i % 50, (i * 7919) % 1000, 'x' || i FROM generate_series(1, 10000) i",
    "CREATE INDEX ca_g ON ca (g)",
    "CREATE TABLE cb (id int, a_id int, w int)",
    "INSERT INTO cb SELECT i, (i * 31) % 12000, i % 13 FROM generate_series(1, 20000) i",
    "CREATE INDEX cb_a ON cb (a_id)",
    "CREATE TABLE csmall (x int)",
    "INSERT INTO csmall SELECT i * 100 FROM generate_series(1, 8) i",
    "CREATE TABLE cbig (id int, v int)",
    "INSERT INTO cbig SELECT i, i % 97 FROM generate_series(1, 200000) i",
    "CREATE TABLE cpart (id int, k int) PARTITION BY RANGE (k)",
    "CREATE TABLE cpart1 PARTITION OF cpart FOR VALUES FROM (0) TO (50)",
    "CREATE TABLE cpart2 PARTITION OF cpart FOR VALUES FROM (50) TO (100)",
    "INSERT INTO cpart SELECT i, i % 100 FROM generate_series(1, 5000) i",
    "CREATE INDEX cpart_id ON cpart (id)",
    "VACUUM ANALYZE ca, cb, csmall, cbig, cpart",
]

_OFF = "off"


@dataclass(frozen=True)
class CorpusQuery:
    name: str
    sql: str
    expect: tuple[str, ...]  # node types that must appear in the plan
    settings: dict[str, str] = field(default_factory=dict)


PARALLEL = {"max_parallel_workers_per_gather": "2", "parallel_setup_cost": "0",
            "parallel_tuple_cost": "0", "min_parallel_table_scan_size": "0",
            "parallel_leader_participation": "off"}

CORPUS: tuple[CorpusQuery, ...] = (
    CorpusQuery("seqscan", "SELECT count(*) FROM ca WHERE v % 7 = 0", ("Seq Scan", "Aggregate")),
    CorpusQuery("indexscan", "SELECT * FROM ca WHERE id BETWEEN 100 AND 300",
                ("Index Scan",), {"enable_bitmapscan": _OFF, "enable_seqscan": _OFF}),
    CorpusQuery("indexonlyscan", "SELECT id FROM ca WHERE id < 600", ("Index Only Scan",),
                {"enable_bitmapscan": _OFF, "enable_seqscan": _OFF}),
    CorpusQuery("bitmap", "SELECT count(*) FROM ca WHERE g IN (1, 2, 3) OR id < 50",
                ("Bitmap Heap Scan", "Bitmap Index Scan", "BitmapOr"),
                {"enable_indexscan": _OFF, "enable_seqscan": _OFF}),
    CorpusQuery("nestloop_material",
                "SELECT count(*) FROM ca a, csmall s WHERE a.v < s.x",
                ("Nested Loop", "Materialize"),
                {"enable_hashjoin": _OFF, "enable_mergejoin": _OFF}),
    CorpusQuery("nestloop_index",
                "SELECT count(*) FROM csmall s JOIN cb b ON b.a_id = s.x",
                ("Nested Loop", "Index Scan"),
                {"enable_hashjoin": _OFF, "enable_mergejoin": _OFF, "enable_memoize": _OFF,
                 "enable_bitmapscan": _OFF, "enable_indexonlyscan": _OFF}),
    CorpusQuery("memoize",
                "SELECT count(*) FROM cb b JOIN ca a ON a.id = b.w",
                ("Nested Loop", "Memoize"),
                {"enable_hashjoin": _OFF, "enable_mergejoin": _OFF, "enable_memoize": "on"}),
    CorpusQuery("hashjoin", "SELECT count(*) FROM ca a JOIN cb b ON a.id = b.a_id",
                ("Hash Join", "Hash")),
    CorpusQuery("mergejoin", "SELECT count(*) FROM ca a JOIN cb b ON a.id = b.a_id",
                ("Merge Join",), {"enable_hashjoin": _OFF, "enable_nestloop": _OFF}),
    CorpusQuery("semijoin",
                "SELECT count(*) FROM ca a WHERE EXISTS (SELECT 1 FROM cb b WHERE b.a_id = a.id)",
                ("Hash",)),
    CorpusQuery("sort", "SELECT id, v FROM ca ORDER BY v, id", ("Sort",)),
    CorpusQuery("incremental_sort", "SELECT id, v FROM ca ORDER BY id, v LIMIT 500",
                ("Incremental Sort", "Limit"), {"enable_seqscan": _OFF}),
    CorpusQuery("hashagg", "SELECT g, count(*) FROM ca GROUP BY g", ("Aggregate",),
                {"enable_sort": _OFF}),
    CorpusQuery("groupagg", "SELECT g, sum(v) FROM ca GROUP BY g", ("Aggregate",),
                {"enable_hashagg": _OFF}),
    CorpusQuery("window",
                "SELECT id, row_number() OVER (PARTITION BY g ORDER BY v) FROM ca",
                ("WindowAgg",)),
    CorpusQuery("limit", "SELECT * FROM ca ORDER BY id LIMIT 10", ("Limit",)),
    CorpusQuery("subqueryscan",
                "SELECT * FROM (SELECT g, count(*) c FROM ca GROUP BY g OFFSET 0) s WHERE c > 5",
                ("Subquery Scan",)),
    CorpusQuery("ctescan",
                "WITH c AS MATERIALIZED (SELECT * FROM ca WHERE g < 5) "
                "SELECT count(*) FROM c x JOIN c y USING (id)", ("CTE Scan",)),
    CorpusQuery("append", "SELECT count(*) FROM (SELECT id FROM ca UNION ALL "
                "SELECT a_id FROM cb) u", ("Append",)),
    CorpusQuery("merge_append", "SELECT id FROM cpart ORDER BY id LIMIT 300",
                ("Merge Append",), {"enable_seqscan": _OFF, "enable_bitmapscan": _OFF}),
    CorpusQuery("unique", "SELECT DISTINCT g FROM ca ORDER BY g", ("Unique",),
                {"enable_hashagg": _OFF}),
    CorpusQuery("setop_intersect",
                "SELECT g FROM ca INTERSECT SELECT a_id % 50 FROM cb", ("SetOp",),
                {"enable_hashagg": _OFF}),
    CorpusQuery("setop_except", "SELECT g FROM ca EXCEPT SELECT w FROM cb", ("SetOp",)),
    CorpusQuery("recursive",
                "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 500) "
                "SELECT count(*) FROM r", ("Recursive Union", "WorkTable Scan")),
    CorpusQuery("values_function",
                "SELECT count(*) FROM (VALUES (1), (2), (3)) v(x), generate_series(1, 100) g",
                ("Values Scan", "Function Scan")),
    CorpusQuery("projectset", "SELECT generate_series(1, id % 5) FROM ca WHERE id < 200",
                ("ProjectSet",)),
    CorpusQuery("subplan",
                "SELECT id, (SELECT max(w) FROM cb WHERE cb.a_id = ca.id) FROM ca WHERE id < 300",
                ("Aggregate",)),
    CorpusQuery("gather", "SELECT count(*) FROM cbig WHERE v < 50",
                ("Gather", "Seq Scan"), PARALLEL),
    CorpusQuery("gather_merge", "SELECT id FROM cbig WHERE v = 3 ORDER BY id",
                ("Gather Merge",), PARALLEL),
)


def load(conn: psycopg.Connection) -> None:
    for stmt in SETUP:
        conn.execute(stmt)


def _explain(conn: psycopg.Connection, q: CorpusQuery, timing: bool) -> object:
    for k, v in q.settings.items():
        conn.execute(f"SET {k} = '{v}'")
    try:
        sql = explain_prefix("analyze_timing" if timing else "analyze_notiming", "json") + q.sql
        return conn.execute(sql).fetchone()[0]
    finally:
        conn.execute("RESET ALL")


def plan_rows(conn: psycopg.Connection, queries: Iterable[CorpusQuery] = CORPUS,
              timing: bool = False) -> pd.DataFrame:
    """One row per (query, node): node type, total rows, loops (and total time when timing)."""
    frames = []
    for q in queries:
        nodes = flatten_plan(_explain(conn, q, timing))
        nodes.insert(0, "query", q.name)
        if timing:
            plan = node_total_times(_explain(conn, q, True))
            nodes["total_time_ms"] = plan[: len(nodes)] if len(plan) >= len(nodes) else plan + [
                float("nan")] * (len(nodes) - len(plan))
        frames.append(nodes)
    return pd.concat(frames, ignore_index=True)


def all_times(conn: psycopg.Connection, queries: Iterable[CorpusQuery] = CORPUS) -> pd.DataFrame:
    """(query, node position, node type, start/total time) under TIMING TRUE."""
    rows = []
    for q in queries:
        explain = _explain(conn, q, True)

        def walk(n: dict, q=q) -> None:
            rows.append({"query": q.name, "node_type": n["Node Type"],
                         "startup_ms": n.get("Actual Startup Time"),
                         "total_ms": n.get("Actual Total Time"),
                         "loops": n.get("Actual Loops")})
            for c in n.get("Plans", []) or []:
                walk(c)

        walk(explain[0]["Plan"])  # type: ignore[index]
    return pd.DataFrame(rows)


def missing_node_types(rows: pd.DataFrame) -> list[str]:
    """Expected node types the plans did not contain (the corpus must cover them)."""
    out = []
    for q in CORPUS:
        have = set(rows.loc[rows["query"] == q.name, "node_type"])
        out += [f"{q.name}: {t}" for t in q.expect if t not in have]
    return out


def compare(reference: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """Rows where *other* differs from *reference* in node type, rows or loops.

    Nodes under a Gather run in workers whose per-loop rows are printed rounded
    to two decimals, so their totals may differ by rounding: a tolerance of 1
    row applies there, everything else must be exact.
    """
    key = ["query", "node_id"]
    cols = ["node_type", "rows", "loops", "parent_id"]
    m = reference[key + cols].merge(other[key + cols], on=key, how="outer",
                                    suffixes=("_ref", "_got"), indicator=True)
    bad = m["_merge"] != "both"
    bad |= m["node_type_ref"] != m["node_type_got"]
    bad |= m["loops_ref"] != m["loops_got"]
    under_gather = m["query"].isin([q.name for q in CORPUS if "Gather" in " ".join(q.expect)])
    diff = (m["rows_ref"] - m["rows_got"]).abs()
    bad |= (diff > 0) & ~under_gather
    bad |= (diff > 1) & under_gather
    return m[bad].reset_index(drop=True)
