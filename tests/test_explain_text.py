"""EXPLAIN's text format read as its JSON format, checked against PostgreSQL itself.

Each query runs on a real vanilla cluster under EXPLAIN (ANALYZE, FORMAT JSON) and under
EXPLAIN (ANALYZE) in the text format, through psycopg and through psql (its frame, its
"(N rows)"), and with COSTS/TIMING off: the text read by profkit.parse.explain_text must
give the tree the JSON gives (node types, the keys the text names, relationships,
sub-plan names) and the same plan table (flatten_plan: node ids, parents, rows, loops).
The queries cover what the text writes in its own words: Hash Left/Semi/Anti Join,
HashAggregate and GroupAggregate, InitPlan/SubPlan/CTE, Append, Subquery Scan, Bitmap,
Index (Only) Scan (Backward), Values/Function Scan, Memoize, "never executed", Insert.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from profkit.analyze.predict import predict
from profkit.errors import ParseError
from profkit.parse.explain import flatten_plan, load_explain
from profkit.parse.explain_text import looks_like_text_explain, parse_text_explain

pytestmark = [pytest.mark.pg, pytest.mark.builds("vanilla")]

SETUP = """
DROP TABLE IF EXISTS xt_a, xt_b;
CREATE TABLE xt_a (id int PRIMARY KEY, g int, v text);
CREATE TABLE xt_b (id int, a_id int);
INSERT INTO xt_a SELECT i, i % 10, 'v' || i FROM generate_series(1, 2000) i;
INSERT INTO xt_b SELECT i, (i * 7) % 2500 FROM generate_series(1, 3000) i;
CREATE INDEX xt_b_a ON xt_b (a_id);
CREATE INDEX xt_a_g ON xt_a (g);
ANALYZE xt_a; ANALYZE xt_b;
"""

QUERIES = {
    "hash_left_join": "SELECT count(*) FROM xt_a a LEFT JOIN xt_b b ON b.a_id = a.id",
    "semi_anti": "SELECT count(*) FROM xt_a a WHERE EXISTS (SELECT 1 FROM xt_b b WHERE "
                 "b.a_id = a.id) AND NOT EXISTS (SELECT 1 FROM xt_b c WHERE c.id = a.id + 5000)",
    "hashagg_groupagg": "SELECT g, count(*) FROM xt_a GROUP BY g UNION ALL "
                        "SELECT g, sum(id) FROM (SELECT * FROM xt_a ORDER BY g) s GROUP BY g",
    "initplan_subplan": "SELECT id, (SELECT max(id) FROM xt_b), (SELECT count(*) FROM xt_b b "
                        "WHERE b.a_id = a.id) FROM xt_a a WHERE id < 20",
    "cte": "WITH m AS MATERIALIZED (SELECT g, max(id) AS mx FROM xt_a GROUP BY g) "
           "SELECT * FROM m JOIN xt_a a ON a.id = m.mx",
    "bitmap_backward": "SELECT * FROM xt_a WHERE g = 3 OR g = 4 UNION ALL "
                       "(SELECT * FROM xt_a ORDER BY id DESC LIMIT 5)",
    "index_only": "SELECT a_id FROM xt_b WHERE a_id BETWEEN 10 AND 20",
    "values_function": "SELECT * FROM (VALUES (1), (2), (3)) v(x) JOIN generate_series(1, 3) "
                       "f(y) ON v.x = f.y",
    "never_executed": "SELECT * FROM xt_a a WHERE a.id = -1 AND EXISTS "
                      "(SELECT 1 FROM xt_b b WHERE b.a_id = a.id)",
    "memoize_nested_loop": "SELECT count(*) FROM xt_b b JOIN xt_a a ON a.id = b.a_id % 100 + 1",
    "subquery_scan": "SELECT * FROM (SELECT g, count(*) c FROM xt_a GROUP BY g OFFSET 0) s "
                     "WHERE c > 1",
    "nested_left": "SELECT count(*) FROM xt_a a LEFT JOIN xt_b b ON b.a_id = a.id "
                   "WHERE a.id < 50",
    # a parenthesis inside a literal is not one the line leaves open: the Filter line
    # must not swallow the lines after it (its Rows Removed, the SubPlan under it)
    "literal_parens": "SELECT id, (SELECT count(*) FROM xt_b b WHERE b.a_id = a.id) "
                      "FROM xt_a a WHERE a.v <> 'x(' AND a.v <> 'it''s (' AND a.id < 20",
}
NO_HASH_OR_MERGE = ["SET enable_hashjoin = off", "SET enable_mergejoin = off"]
SETTINGS = {"memoize_nested_loop": NO_HASH_OR_MERGE, "nested_left": NO_HASH_OR_MERGE,
            "index_only": ["SET enable_bitmapscan = off"]}
#: keys the text names (what the JSON has beside them is not in the text)
TEXT_KEYS = ("Node Type", "Relation Name", "Alias", "Index Name", "Join Type", "Strategy",
             "Parent Relationship", "Subplan Name", "Scan Direction", "CTE Name",
             "Function Name", "Operation", "Startup Cost", "Total Cost", "Plan Rows",
             "Plan Width", "Actual Rows", "Actual Loops", "Workers Planned", "Workers Launched")
PLAN_COLUMNS = ["node_id", "node_type", "parent_id", "relationship", "subplan_name", "depth",
                "rows_per_loop", "loops", "rows", "analyzed", "relation", "join_type", "order"]


@pytest.fixture(scope="module")
def explained(pg_cluster):
    """query -> {"json": ..., "text": ..., "psql": ..., "text_off": ..., "json_off": ...}."""
    out = {}
    env = {**os.environ, "PGHOST": str(pg_cluster.socket_dir), "PGPORT": str(pg_cluster.port),
           "PGUSER": "profkit", "PGDATABASE": "postgres", "PSQLRC": os.devnull}
    with pg_cluster.connect() as conn:
        conn.autocommit = True
        conn.execute(SETUP)
        for name, q in QUERIES.items():
            sets = SETTINGS.get(name, [])
            for s in sets:
                conn.execute(s)
            got = {"json": conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {q}").fetchone()[0],
                   "text": "\n".join(r[0] for r in conn.execute(f"EXPLAIN ANALYZE {q}")),
                   "json_off": conn.execute(f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, "
                                            f"FORMAT JSON) {q}").fetchone()[0],
                   "text_off": "\n".join(r[0] for r in conn.execute(
                       f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {q}"))}
            conn.execute("RESET ALL")
            got["psql"] = subprocess.run(
                [str(pg_cluster.build.bindir / "psql"), "-X", "-c", "; ".join(sets + [
                    f"EXPLAIN (ANALYZE, BUFFERS) {q}"])],
                env=env, capture_output=True, text=True, timeout=120, check=True).stdout
            out[name] = got
        # an Insert, rolled back
        conn.autocommit = False
        q = "INSERT INTO xt_b SELECT id, id FROM xt_a WHERE id <= 10"
        out["insert"] = {
            "json": conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {q}").fetchone()[0],
            "text": "\n".join(r[0] for r in conn.execute(f"EXPLAIN ANALYZE {q}"))}
        conn.rollback()
    return out


def _same_tree(mine: dict, theirs: dict, where: str, keys: tuple[str, ...]) -> list[str]:
    off = [f"{where}: {k} {mine.get(k)!r}, JSON {theirs[k]!r}" for k in keys
           if k in theirs and mine.get(k) != theirs[k]]
    a, b = mine.get("Plans", []), theirs.get("Plans", [])
    if len(a) != len(b):
        return [*off, f"{where}: {len(a)} children, JSON {len(b)}"]
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        off += _same_tree(x, y, f"{where} > {y.get('Node Type')}[{i}]", keys)
    return off


@pytest.mark.parametrize("name", [*QUERIES, "insert"])
def test_text_reads_as_postgresqls_json(explained, name):
    got = explained[name]
    theirs = got["json"][0]
    for form in ("text", "psql"):
        if form not in got:
            continue
        mine = parse_text_explain(got[form])
        # actual rows of one execution against another's: the queries are deterministic
        assert _same_tree(mine["Plan"], theirs["Plan"], "Plan", TEXT_KEYS) == [], (form, got[form])
        assert set(mine) - {"Plan"} == {"Planning Time", "Execution Time"}, mine.keys()
        a = flatten_plan([mine])[PLAN_COLUMNS]
        b = flatten_plan(got["json"])[PLAN_COLUMNS]
        assert a.equals(b), (form, a.compare(b) if a.shape == b.shape else a)
        # and so the calls and clock reads profkit predicts per node (profkit parse explain);
        # the text does not print Inner Unique (VERBOSE aside), so where the JSON says a
        # nested loop's inner side stops at its first match the text cannot: such a node
        # is flagged inexact from the text, never the other way round
        cols = ["node_id", "exec_calls_predicted", "instr_start_predicted",
                "clock_calls_predicted"]
        pt, pj = predict(got[form]).nodes, predict(got["json"]).nodes
        assert pt[cols].equals(pj[cols]), (form, pt[cols], pj[cols])
        assert not (pt["exact"] & ~pj["exact"]).any(), (pt["exact"], pj["exact"])
    if "text_off" in got:
        mine = parse_text_explain(got["text_off"])
        assert _same_tree(mine["Plan"], got["json_off"][0]["Plan"], "Plan", TEXT_KEYS) == []
        assert "Startup Cost" not in mine["Plan"] and "Actual Total Time" not in mine["Plan"]


def test_the_queries_print_what_the_reader_must_know(explained):
    """The text of the queries above holds the words the reader turns into JSON keys (so
    the test above checks them): a change of PostgreSQL's wording would show here."""
    text = "\n".join(g["text"] for g in explained.values())
    for words in ("Hash Right Join", "Hash Right Semi Join", "Hash Anti Join",
                  "Nested Loop Left Join", "HashAggregate",
                  "GroupAggregate", "InitPlan", "SubPlan", "CTE m", "CTE Scan on m",
                  "Append", "Bitmap Heap Scan on xt_a", "Bitmap Index Scan on xt_a_g",
                  "Index Scan Backward using xt_a_pkey", "Index Only Scan using xt_b_a",
                  "Values Scan on \"*VALUES*\"", "Function Scan on generate_series f",
                  "(never executed)", "Memoize", "Subquery Scan on s", "Insert on xt_b"):
        assert words in text, words


def test_load_explain_takes_either_format(explained):
    """load_explain, and so flatten_plan, predict and the per-node analyses, take the text
    as they take the JSON; text that is neither is one error naming both formats."""
    got = explained["hash_left_join"]
    assert load_explain(got["text"])["Plan"]["Node Type"] == got["json"][0]["Plan"]["Node Type"]
    assert flatten_plan(got["psql"])["node_type"].tolist() == \
        flatten_plan(got["json"])["node_type"].tolist()
    assert load_explain(json.dumps(got["json"]))["Plan"] == got["json"][0]["Plan"]
    with pytest.raises(ParseError, match="not JSON .* EXPLAIN's text format"):
        load_explain("hello, world")


def test_what_people_paste():
    """Text copied out of pgAdmin (quoted lines), out of psql with its frame and a
    terminal that wrapped long lines, with a prompt and a comment before the plan."""
    plain = ("Nested Loop  (cost=0.29..20.31 rows=10 width=8) "
             "(actual time=0.02..0.10 rows=10 loops=1)\n"
             "  ->  Seq Scan on t  (cost=0.00..1.10 rows=10 width=4) "
             "(actual time=0.01..0.01 rows=10 loops=1)\n"
             "  ->  Index Only Scan using u_pkey on u x  (cost=0.29..1.91 rows=1 width=4) "
             "(never executed)\n"
             "        Index Cond: (id = t.id)\n"
             "Planning Time: 0.100 ms\n"
             "Execution Time: 0.200 ms\n")
    want = parse_text_explain(plain)
    assert want["Plan"]["Plans"][1] == {
        "Node Type": "Index Only Scan", "Index Name": "u_pkey", "Relation Name": "u",
        "Alias": "x", "Scan Direction": "Forward", "Startup Cost": 0.29, "Total Cost": 1.91,
        "Plan Rows": 1, "Plan Width": 4, "Actual Rows": 0, "Actual Loops": 0,
        "Parent Relationship": "Inner"}
    assert (want["Planning Time"], want["Execution Time"]) == (0.1, 0.2)
    quoted = "\n".join(f'"{ln}"' for ln in plain.splitlines())
    wrapped = ["db=# EXPLAIN ANALYZE SELECT ...;", "-- a comment", " " * 30 + "QUERY PLAN",
               "-" * 60, "-" * 20]
    for ln in plain.splitlines():  # a 60-column terminal
        ln = " " + ln
        wrapped += [ln[i:i + 60] for i in range(0, len(ln), 60)]
    wrapped.append("(6 rows)")
    for text in (quoted, "\n".join(wrapped), plain.replace("\n", "\r\n")):
        assert parse_text_explain(text) == want, text
    # a parenthesis after an apostrophe in a comment is not left open: the plan after it
    # is not taken for that line's continuation
    remark = "\n".join(["-- don't count the Sort (it is not here", *wrapped[2:]])
    assert parse_text_explain(remark) == want


def test_not_a_plan():
    assert not looks_like_text_explain("Seq Scan on t\nFilter: x")
    for text in ("", "QUERY PLAN\n----------\n(0 rows)\n", "-- nothing here"):
        with pytest.raises(ParseError, match="no plan node found"):
            parse_text_explain(text)
