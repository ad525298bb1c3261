"""A query corpus covering the executor's node types, for "same answers" checks.

Every patch variant must report exactly vanilla's actual rows and loops for
every plan node under ``EXPLAIN (ANALYZE, FORMAT JSON)`` in each instrumentation
mode of :data:`MODES` (rows only: the variants' fast path; BUFFERS on or TIMING
on: the instrumentation wrapper, where the seed's step3 reported rows=0), vanilla's
buffer counts of every node where BUFFERS is on (:data:`BUFFER_COLUMNS`), the
calls of every trigger (several per relation, statement and row level), and a
non-negative time for every node under TIMING TRUE.  :func:`plan_rows` runs
the corpus on one cluster; :func:`auto_explain_rows` runs it as plain statements under
auto_explain (``log_analyze``, rows only, or with ``log_buffers``); :func:`compare` diffs
two results.

The corpus covers, besides the plan node types: Hash and Bitmap Index Scan
(MultiExecProcNode nodes, counted outside ExecProcNode), an async Foreign Scan
through postgres_fdw on a loopback server (:func:`load` creates the extension,
the server and two foreign partitions), parallel workers (Gather, Gather
Merge, Parallel Hash; without and with the leader participating), and
data-modifying statements with triggers, run in a transaction that is rolled back so
every run sees the same data.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd
import psycopg
from psycopg import sql as pgsql

from profkit.parse.explain import explain_order, flatten_plan, node_total_times

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
    "DROP TABLE IF EXISTS cbm",
    "CREATE TABLE cbm (id int, a int, b int)",
    # 25,000 rows: ANALYZE reads them all (30,000-row sample), so estimates, and the order
    # of the BitmapAnd children, are the same in every run
    "INSERT INTO cbm SELECT i, (i * 37) % 100, (i * 53) % 97 FROM generate_series(1, 25000) i",
    "CREATE INDEX cbm_a ON cbm (a)",
    "CREATE INDEX cbm_b ON cbm (b)",
    "VACUUM ANALYZE ca, cb, csmall, cbig, cpart, cbm",
    # several triggers per relation, row and statement level, one with a WHEN clause
    "DROP TABLE IF EXISTS ctrig",
    "CREATE TABLE ctrig (id int, v int)",
    "INSERT INTO ctrig SELECT i, i % 10 FROM generate_series(1, 300) i",
    "CREATE OR REPLACE FUNCTION ctrig_bump() RETURNS trigger LANGUAGE plpgsql AS "
    "$$BEGIN NEW.v := NEW.v + 1; RETURN NEW; END$$",
    "CREATE OR REPLACE FUNCTION ctrig_noop() RETURNS trigger LANGUAGE plpgsql AS "
    "$$BEGIN RETURN NULL; END$$",
    "CREATE TRIGGER t1_before_row BEFORE INSERT OR UPDATE ON ctrig FOR EACH ROW "
    "EXECUTE FUNCTION ctrig_bump()",
    "CREATE TRIGGER t2_after_row AFTER INSERT OR UPDATE ON ctrig FOR EACH ROW "
    "EXECUTE FUNCTION ctrig_noop()",
    "CREATE TRIGGER t3_after_row_when AFTER UPDATE ON ctrig FOR EACH ROW "
    "WHEN (NEW.v % 3 = 0) EXECUTE FUNCTION ctrig_noop()",
    "CREATE TRIGGER t4_after_stmt AFTER INSERT OR UPDATE ON ctrig FOR EACH STATEMENT "
    "EXECUTE FUNCTION ctrig_noop()",
    "ANALYZE ctrig",
    # a temporary table: its blocks are local buffers (BUFFERS' "local" counts)
    "DROP TABLE IF EXISTS ctemp",
    "CREATE TEMP TABLE ctemp AS SELECT i AS id, i % 13 AS g FROM generate_series(1, 5000) i",
    "ANALYZE ctemp",
]

# postgres_fdw on a loopback server: two local tables served as foreign partitions, so
# the planner makes an Append of async Foreign Scans.  {host} and {port} are the
# cluster's own (see load()).
FDW_SETUP = [
    "CREATE EXTENSION IF NOT EXISTS postgres_fdw",
    "DROP SERVER IF EXISTS loopback CASCADE",
    "CREATE SERVER loopback FOREIGN DATA WRAPPER postgres_fdw OPTIONS "
    "(host {host}, port {port}, dbname {db}, async_capable 'true')",
    "CREATE USER MAPPING FOR CURRENT_USER SERVER loopback",
    "DROP TABLE IF EXISTS fsrc1, fsrc2, fpart",
    "CREATE TABLE fsrc1 (id int, k int)",
    "CREATE TABLE fsrc2 (id int, k int)",
    "INSERT INTO fsrc1 SELECT i, i % 50 FROM generate_series(1, 3000) i",
    "INSERT INTO fsrc2 SELECT i, 50 + i % 50 FROM generate_series(1, 2000) i",
    "CREATE TABLE fpart (id int, k int) PARTITION BY RANGE (k)",
    "CREATE FOREIGN TABLE fpart1 PARTITION OF fpart FOR VALUES FROM (0) TO (50) "
    "SERVER loopback OPTIONS (table_name 'fsrc1')",
    "CREATE FOREIGN TABLE fpart2 PARTITION OF fpart FOR VALUES FROM (50) TO (100) "
    "SERVER loopback OPTIONS (table_name 'fsrc2')",
    "ANALYZE fsrc1, fsrc2, fpart",
]

# Instrumentation modes: name -> (TIMING, BUFFERS).  "rows" is the row-counting fast
# path of the step variants; the others go through the instrumentation wrapper.
MODES: dict[str, tuple[bool, bool]] = {
    "rows": (False, False),
    "buffers": (False, True),
    "timing": (True, False),
    "timing_buffers": (True, True),
}

# EXPLAIN's per-node buffer counts (JSON key -> column), compared where BUFFERS is on
BUFFER_COLUMNS: dict[str, str] = {
    "Shared Hit Blocks": "shared_hit", "Shared Read Blocks": "shared_read",
    "Shared Dirtied Blocks": "shared_dirtied", "Shared Written Blocks": "shared_written",
    "Local Hit Blocks": "local_hit", "Local Read Blocks": "local_read",
    "Local Dirtied Blocks": "local_dirtied", "Local Written Blocks": "local_written",
    "Temp Read Blocks": "temp_read", "Temp Written Blocks": "temp_written",
}

_OFF = "off"


@dataclass(frozen=True)
class CorpusQuery:
    name: str
    sql: str
    expect: tuple[str, ...]  # node types that must appear in the plan
    settings: dict[str, str] = field(default_factory=dict)
    modifies: bool = False  # run in a transaction that is rolled back
    triggers: tuple[str, ...] = ()  # trigger names that must be reported (with calls)


PARALLEL = {"max_parallel_workers_per_gather": "2", "parallel_setup_cost": "0",
            "parallel_tuple_cost": "0", "min_parallel_table_scan_size": "0",
            "parallel_leader_participation": "off"}

# The same parallel plans with the leader running the plan too: its rows land in the
# leader's own instrumentation and are summed with the workers' at the end.
PARALLEL_LEADER = {**PARALLEL, "parallel_leader_participation": "on"}

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
    CorpusQuery("parallel_hash",
                "SELECT count(*) FROM cbig x JOIN cbig y ON x.id = y.id WHERE x.v < 10",
                ("Gather", "Hash Join", "Hash"),
                {**PARALLEL, "enable_parallel_hash": "on", "enable_mergejoin": _OFF,
                 "enable_nestloop": _OFF}),
    CorpusQuery("gather_leader", "SELECT count(*) FROM cbig WHERE v < 50",
                ("Gather", "Seq Scan"), PARALLEL_LEADER),
    CorpusQuery("parallel_hash_leader",
                "SELECT count(*) FROM cbig x JOIN cbig y ON x.id = y.id WHERE x.v < 10",
                ("Gather", "Hash Join", "Hash"),
                {**PARALLEL_LEADER, "enable_parallel_hash": "on", "enable_mergejoin": _OFF,
                 "enable_nestloop": _OFF}),
    CorpusQuery("bitmap_and",
                "SELECT count(*) FROM cbm WHERE a = 3 AND b = 5",
                ("Bitmap Heap Scan", "Bitmap Index Scan", "BitmapAnd"),
                {"enable_indexscan": _OFF, "enable_seqscan": _OFF}),
    CorpusQuery("async_foreign",
                "SELECT id, k FROM fpart WHERE id % 4 <> 1",
                ("Append", "Foreign Scan"), {"enable_async_append": "on"}),
    CorpusQuery("foreign_join_local",
                "SELECT count(*) FROM fpart f JOIN csmall s ON f.id = s.x",
                ("Foreign Scan", "Hash")),
    # BUFFERS' temp and local counts: a sort that spills to temporary files, and a scan of
    # a temporary table
    CorpusQuery("sort_external", "SELECT id, v FROM cbig WHERE v < 20 ORDER BY v, id",
                ("Sort",), {"work_mem": "64kB", "max_parallel_workers_per_gather": "0"}),
    CorpusQuery("temp_table", "SELECT g, count(*) FROM ctemp GROUP BY g", ("Seq Scan",)),
    CorpusQuery("trigger_insert",
                "INSERT INTO ctrig SELECT i, i % 7 FROM generate_series(1, 250) i",
                ("ModifyTable",), modifies=True,
                triggers=("t1_before_row", "t2_after_row", "t4_after_stmt")),
    CorpusQuery("trigger_update",
                "UPDATE ctrig SET v = v + 1 WHERE id % 2 = 0",
                ("ModifyTable", "Seq Scan"), modifies=True,
                triggers=("t1_before_row", "t2_after_row", "t3_after_row_when",
                          "t4_after_stmt")),
)


#: The tables SETUP's VACUUM must leave all-visible (cpart's rows live in its partitions).
VACUUMED = ("ca", "cb", "csmall", "cbig", "cpart1", "cpart2", "cbm")


def load(conn: psycopg.Connection) -> None:
    # Commits wait for their WAL here. profkit's clusters commit asynchronously
    # (synchronous_commit off), and a tuple whose inserting commit is not yet flushed gets
    # no hint bit, so VACUUM cannot mark its page all-visible: when the WAL writer ran
    # late (a loaded machine), index-only scans fetched the heap and every buffer count of
    # the corpus changed (seen in `make test`: 16,850 shared hits against 74;
    # tests/test_same_answers.py stops the WAL writer to check it).
    conn.execute("SET synchronous_commit = on")
    try:
        for stmt in SETUP:
            conn.execute(stmt)
    finally:
        conn.execute("RESET synchronous_commit")
    short = conn.execute(
        "SELECT relname, relallvisible, relpages FROM pg_class WHERE relname = ANY(%s) "
        "AND relallvisible < relpages ORDER BY relname", [list(VACUUMED)]).fetchall()
    if short:
        raise RuntimeError("the corpus's VACUUM left pages not all-visible ("
                           + ", ".join(f"{r} {v} of {p}" for r, v, p in short)
                           + "): an open transaction in this cluster? Index-only scans "
                           "would read the heap and the buffer counts would not compare")
    host, port, db = conn.execute(
        "SELECT split_part(current_setting('unix_socket_directories'), ',', 1), "
        "current_setting('port'), current_database()").fetchone()
    for stmt in FDW_SETUP:
        conn.execute(pgsql.SQL(stmt).format(host=pgsql.Literal(host), port=pgsql.Literal(port),
                                            db=pgsql.Literal(db)))


def _explain(conn: psycopg.Connection, q: CorpusQuery, timing: bool,
             buffers: bool = False) -> object:
    for k, v in q.settings.items():
        conn.execute(f"SET {k} = '{v}'")
    try:
        sql = (f"EXPLAIN (ANALYZE TRUE, TIMING {'TRUE' if timing else 'FALSE'}, "
               f"BUFFERS {'TRUE' if buffers else 'FALSE'}, FORMAT JSON) {q.sql}")
        if q.modifies:
            with conn.transaction(force_rollback=True):
                return conn.execute(sql).fetchone()[0]
        return conn.execute(sql).fetchone()[0]
    finally:
        conn.execute("RESET ALL")


def _trigger_rows(explain: object, query: str) -> pd.DataFrame:
    """One row per reported trigger: node_type 'Trigger <name>', rows = its calls."""
    trig = explain[0].get("Triggers", []) or []  # type: ignore[index]
    return pd.DataFrame([{"query": query, "node_id": 10_000 + i,
                          "node_type": f"Trigger {t['Trigger Name']} on {t.get('Relation')}",
                          "rows": float(t["Calls"]), "loops": 1.0, "parent_id": None}
                         for i, t in enumerate(sorted(trig, key=lambda t: t["Trigger Name"]))])


def plan_rows(conn: psycopg.Connection, queries: Iterable[CorpusQuery] = CORPUS,
              timing: bool = False, modes: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per (mode, query, node): node type, total rows, loops (and total time when
    timing); triggers appear as nodes ``Trigger <name> on <relation>`` whose rows are their
    calls.  *modes* (names of :data:`MODES`) default to ``["rows"]``, or ``["timing"]``
    when *timing*."""
    modes = list(modes) if modes is not None else (["timing"] if timing else ["rows"])
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown corpus modes {unknown}; known: {', '.join(MODES)}")
    frames = []
    for mode in modes:
        t, b = MODES[mode]
        for q in queries:
            explain = _explain(conn, q, t, b)
            nodes = flatten_plan(explain)
            nodes.insert(0, "query", q.name)
            flags = [n.get("Async Capable") for n in explain_order(explain[0]["Plan"])]
            # flatten_plan's "order" is EXPLAIN's print order: the JSON's pre-order
            nodes["async_capable"] = [flags[o] if 0 <= o < len(flags) else None
                                      for o in nodes["order"]]
            if b:
                nodes = _with_buffers(nodes, explain)
            if t:
                plan = node_total_times(explain)
                nodes["total_time_ms"] = (plan[: len(nodes)] if len(plan) >= len(nodes)
                                          else plan + [float("nan")] * (len(nodes) - len(plan)))
            if q.triggers:
                nodes = pd.concat([nodes, _trigger_rows(explain, q.name)], ignore_index=True)
            nodes.insert(0, "mode", mode)
            frames.append(nodes)
    return pd.concat(frames, ignore_index=True)


def _with_buffers(nodes: pd.DataFrame, explain: object) -> pd.DataFrame:
    """*nodes* (flatten_plan's, with its print ``order``) with a column per
    :data:`BUFFER_COLUMNS` (0 where EXPLAIN printed nothing, as the text format does)."""
    dicts = explain_order(explain[0]["Plan"])  # type: ignore[index]
    nodes = nodes.copy()
    for key, col in BUFFER_COLUMNS.items():
        nodes[col] = [float(dicts[o].get(key, 0)) if 0 <= o < len(dicts) else float("nan")
                      for o in nodes["order"]]
    return nodes


def auto_explain_rows(conn: psycopg.Connection,
                      queries: Iterable[CorpusQuery] = CORPUS,
                      buffers: bool = False) -> pd.DataFrame:
    """The corpus run as plain statements under auto_explain with ``log_analyze`` on and
    ``log_timing`` off (rows only: the variants' fast path, the way a server that logs slow
    plans runs it), every plan sent to this session as a NOTICE.  Same columns as
    :func:`plan_rows`, mode ``auto_explain``; triggers appear as there.  With *buffers*,
    ``log_buffers`` is on too (auto_explain's default EXPLAIN with TIMING off): mode
    ``auto_explain_buffers``, with the buffer columns."""
    notices: list[str] = []

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        if diag.message_primary and "plan:" in diag.message_primary:
            notices.append(diag.message_primary)

    conn.add_notice_handler(on_notice)
    frames = []
    try:
        conn.execute("LOAD 'auto_explain'")
        for q in queries:
            for k, v in q.settings.items():
                conn.execute(f"SET {k} = '{v}'")
            for k, v in (("log_min_duration", "0"), ("log_analyze", "on"),
                         ("log_timing", "off"), ("log_buffers", "on" if buffers else "off"),
                         ("log_triggers", "on"), ("log_format", "json"),
                         ("log_level", "notice")):
                conn.execute(f"SET auto_explain.{k} = '{v}'")
            notices.clear()
            try:
                if q.modifies:
                    with conn.transaction(force_rollback=True):
                        conn.execute(q.sql)
                else:
                    conn.execute(q.sql).fetchall()
            finally:
                conn.execute("RESET ALL")
            if len(notices) != 1:
                raise RuntimeError(f"auto_explain logged {len(notices)} plans for {q.name}, "
                                   "expected 1")
            explain = [json.loads(notices[0].split("plan:", 1)[1])]
            nodes = flatten_plan(explain)
            nodes.insert(0, "query", q.name)
            if buffers:
                nodes = _with_buffers(nodes, explain)
            if q.triggers:
                nodes = pd.concat([nodes, _trigger_rows(explain, q.name)], ignore_index=True)
            nodes.insert(0, "mode", "auto_explain_buffers" if buffers else "auto_explain")
            frames.append(nodes)
    finally:
        conn.remove_notice_handler(on_notice)
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
    """Expected node types and triggers the plans did not contain (the corpus must cover
    them): per mode when *rows* has several."""
    out = []
    for mode in (rows["mode"].unique() if "mode" in rows else [None]):
        sub = rows if mode is None else rows[rows["mode"] == mode]
        tag = "" if mode is None else f"[{mode}] "
        for q in CORPUS:
            have = set(sub.loc[sub["query"] == q.name, "node_type"])
            out += [f"{tag}{q.name}: {t}" for t in q.expect if t not in have]
            trig = {t.split()[1] for t in have if t.startswith("Trigger ")}
            out += [f"{tag}{q.name}: trigger {t}" for t in q.triggers if t not in trig]
    return out


def compare(reference: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """Rows where *other* differs from *reference* in node type, rows, loops or (where
    the reference has them: BUFFERS on) any buffer count of :data:`BUFFER_COLUMNS`.

    Nodes under a Gather run in workers whose per-loop rows are printed rounded
    to two decimals, so their totals may differ by rounding: a tolerance of 1
    row applies there, everything else must be exact.  Their loops count the
    participants that ran the node, which varies from run to run in vanilla too
    (a worker that starts after a Parallel Hash Join's build and probe phases
    are over never runs the nodes below it): loops are not compared there, the
    total rows are.  Buffer counts must be exact everywhere: a parallel scan reads each
    block once, whichever participant reads it.
    """
    key = ["mode", "query", "node_id"] if "mode" in reference and "mode" in other else [
        "query", "node_id"]
    bufs = [c for c in BUFFER_COLUMNS.values() if c in reference and c in other]
    cols = ["node_type", "rows", "loops", "parent_id", *bufs]
    m = reference[key + cols].merge(other[key + cols], on=key, how="outer",
                                    suffixes=("_ref", "_got"), indicator=True)
    bad = m["_merge"] != "both"
    bad |= m["node_type_ref"] != m["node_type_got"]
    under_gather = m["query"].isin([q.name for q in CORPUS if "Gather" in " ".join(q.expect)])
    bad |= (m["loops_ref"] != m["loops_got"]) & ~under_gather
    bad |= (m["loops_got"].fillna(0) < 1) & (m["loops_ref"].fillna(0) >= 1)
    diff = (m["rows_ref"] - m["rows_got"]).abs()
    bad |= (diff > 0) & ~under_gather
    bad |= (diff > 1) & under_gather
    for c in bufs:
        # where the reference printed buffers (BUFFERS on there), the other must print the
        # same; a reference without them (BUFFERS off) has nothing to compare
        a, b = m[f"{c}_ref"], m[f"{c}_got"]
        bad |= a.notna() & (a != b)
    return m[bad].reset_index(drop=True)
