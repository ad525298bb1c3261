"""node_marker: the running plan node published by the backend, sampled with bcc.

Static: the patch applies to both majors' sources and says what it changes and costs.
Live (the node_marker build of PostgreSQL 18; pg19/node_marker is only applied, not yet
built here; bcc on a software clock): the ids the
samples carry are exactly the plan's node ids in EXPLAIN's order (InitPlan, SubPlan,
Append and parallel workers included), the exclusive shares sum to 1, a synthetic query's
dominant node gets the share it must, queries started inside a node and errors leave the
numbering and the marker as they should, and the answers (EXPLAIN's rows and loops, and
the rows the queries return) are vanilla's with the setting on.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from profkit import patches
from profkit.collect import node_marker as nm
from profkit.errors import ProbeError, ProfkitError
from profkit.experiments import nodetime_marker as exp

ROOT = Path(__file__).resolve().parent.parent
SCAN_SQL = "SELECT count(*) FROM nm_t WHERE md5(b::text) LIKE '%ab%'"


# ---------------------------------------------------------------------------
# static


@pytest.mark.parametrize("major", ["18", "19"])
def test_patch_header_says_what_and_cost(major):
    header = patches.patch_header("node_marker", major)
    assert header.splitlines()[0].startswith("profkit patch node_marker for PostgreSQL " + major)
    for word in ("track_executor_node", "pg_node_marker", "ExecProcNodeMarked",
                 "MultiExecProcNode", "parallel", "Measured cost", "Files:"):
        assert word in header, word
    assert "MEASURED_COST" not in header
    # the cost paragraph is the one benchmarks/nodetime_cost.py prints from its committed
    # results; without results the header says it is not measured (no number invented)
    assert "benchmarks/nodetime_cost.py" in header
    cost = ROOT / "benchmarks" / "results" / "nodetime_cost.csv"
    if cost.exists() and (pd.read_csv(cost, dtype={"pg_major": str})["pg_major"] == major).any():
        import importlib.util

        spec = importlib.util.spec_from_file_location("nodetime_cost",
                                                      ROOT / "benchmarks" / "nodetime_cost.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        para = mod.header_lines(pd.read_csv(cost, dtype={"pg_major": str}), major)
        assert " ".join(para.split()) in " ".join(header.split())
        assert re.search(r"[+-]\d+\.\d+ %", header)
    else:
        assert "Measured cost: not measured yet" in header
        assert not re.search(r"[+-]\d+\.\d+ %", header)
    assert patches.PRESETS["node_marker"] == ["node_marker"]
    assert patches.PATCH_GUCS["node_marker"] == {"track_executor_node": "off"}


@pytest.mark.source
def test_patch_applies_to_pg18_source():
    from profkit.pg.build import resolve_source

    src = resolve_source("node_marker")
    assert src.major == "18"
    patches.check_applies(src.path, ["node_marker"])


@pytest.mark.source
def test_patch_applies_to_pg19_source():
    from profkit.pg.build import resolve_source

    src = resolve_source("pg19/node_marker")
    assert src.major == "19"
    patches.check_applies(src.path, patches.preset_patches("node_marker", "19"))


def test_node_table_numbering_and_sums():
    plan = [{"Plan": {"Node Type": "Aggregate", "Actual Loops": 1, "Actual Rows": 1,
                      "Plans": [{"Node Type": "Sort", "Actual Loops": 1, "Actual Rows": 5,
                                 "Plans": [{"Node Type": "Seq Scan", "Actual Loops": 1,
                                            "Actual Rows": 5, "Relation Name": "t"}]}]}}]
    df = exp.node_table(plan, {0: 10, 1: 30, 2: 60}, outside=25)
    assert df["node_type"].tolist() == ["Aggregate", "Sort", "Seq Scan"]
    assert df["exclusive_share"].tolist() == pytest.approx([0.1, 0.3, 0.6])
    assert df["inclusive_share"].tolist() == pytest.approx([1.0, 0.9, 0.6])
    assert df.attrs["outside_executor_share"] == pytest.approx(0.2)
    with pytest.raises(ProfkitError, match="names node 3, but the plan has nodes 0..2"):
        exp.node_table(plan, {3: 1}, outside=0)


def test_marker_symbol_missing_is_a_clear_error(tmp_path):
    import shutil

    true = shutil.which("true")
    with pytest.raises(ProbeError, match="not a node_marker build"):
        nm.marker_symbol(true)


# ---------------------------------------------------------------------------
# live


def _load(conn) -> None:
    conn.execute("DROP TABLE IF EXISTS nm_t, nm_u, nm_v")
    conn.execute("CREATE TABLE nm_t AS SELECT g AS a, g % 1000 AS b FROM "
                 "generate_series(1, 60000) g")
    conn.execute("CREATE TABLE nm_u AS SELECT g AS a FROM generate_series(1, 40000) g")
    conn.execute("CREATE TABLE nm_v AS SELECT g AS k, g * 2 AS w FROM generate_series(1, 300) g")
    conn.execute("CREATE OR REPLACE FUNCTION nm_inner(x int) RETURNS bigint LANGUAGE sql "
                 "VOLATILE AS 'SELECT count(*) FROM nm_v WHERE k <= $1 % 50'")
    conn.execute("VACUUM ANALYZE nm_t, nm_u, nm_v")


@pytest.fixture(scope="module", params=[
    pytest.param("node_marker", marks=pytest.mark.builds("node_marker")),
])
def marker_conn(request):
    from profkit.pg.build import get_build
    from profkit.pg.cluster import Cluster

    b = get_build(request.param, progress=print)
    with Cluster(b, name=f"test-nm-{request.param.replace('/', '-')}") as cl, \
            cl.connect() as conn:
        # no server-side prepared statements: a statement psycopg prepared in one test would
        # keep its plan (serial) when a later test changes the parallel settings
        conn.prepare_threshold = None
        _load(conn)
        yield request.param, cl, conn


def _explain_types(plan) -> list[str]:
    return [n.node_type for n in exp.plan_shape(plan)]


@pytest.mark.pg
def test_ids_are_the_plans_and_shares_sum_to_one(marker_conn):
    _name, _cl, conn = marker_conn
    r = exp.run_marker(conn, SCAN_SQL, min_seconds=1.5, min_cpu_seconds=1.5, max_seconds=60,
                       frequency=1999)
    shape = exp.plan_shape(r.plan)
    assert [n.node_type for n in shape] == ["Aggregate", "Seq Scan"]
    assert set(r.samples.node_samples) == {0, 1}
    assert r.nodes["exclusive_share"].sum() == pytest.approx(1.0)
    assert r.nodes["inclusive_share"].iloc[0] == pytest.approx(1.0)
    # the Seq Scan evaluates md5() on every row: by construction almost all of the time
    scan = float(r.nodes.loc[r.nodes["node_type"] == "Seq Scan", "exclusive_share"].iloc[0])
    assert scan >= 0.85, r.nodes
    # each execution is one marked executor start (EXPLAIN's own run came before)
    seqs = {s for (_p, n, s, _r) in r.samples.raw if n >= 0}
    assert seqs and min(seqs) > r.samples.seq_before
    assert max(seqs) <= r.samples.seq_before + r.executions
    assert r.samples.read_errors == 0 and r.samples.bad_magic == 0
    assert r.samples.backend_samples >= 100  # 1.5 s at 1999 Hz, even on a loaded VM


@pytest.mark.pg
def test_initplan_subplan_append_are_numbered_like_explain(marker_conn):
    """InitPlan first, then outer/inner, Append members, then SubPlans: the expensive
    nodes' ids carry their types."""
    _name, _cl, conn = marker_conn
    sql = ("SELECT (SELECT sum(length(md5(g::text))) FROM generate_series(1, 20000) g) "
           "AS init, count(*) FROM (SELECT a FROM nm_t UNION ALL SELECT a FROM nm_u) s "
           "WHERE s.a <= 3000 AND (SELECT max(w) FROM nm_v WHERE nm_v.k = s.a % 300 + 1) > 10")
    # the backend's CPU time, not wall time: beside the other tests the backend ran for a
    # fraction of 2 s wall and the Append, 0.2 % of the samples, once drew none.  2 s of
    # CPU gave it 8 of 4,103 samples with both cores busy; 3 s expects 12, 0 with
    # probability ~e^-12
    r = exp.run_marker(conn, sql, min_seconds=2.0, min_cpu_seconds=3.0, max_seconds=60,
                       frequency=1999)
    types = _explain_types(r.plan)
    rels = [n.relation for n in exp.plan_shape(r.plan)]
    assert types[0] == "Aggregate"
    assert "Append" in types and types.count("Seq Scan") >= 3
    seen = set(r.samples.node_samples)
    assert seen <= set(range(len(types)))
    # every node that runs per row shows up
    for i, t in enumerate(types):
        if t in ("Append", "Seq Scan") or (t == "Function Scan"):
            assert i in seen, (i, t, r.nodes)
    # the InitPlan's Function Scan and the SubPlan's Seq Scan on nm_v
    init_fs = types.index("Function Scan")
    sub_scan = rels.index("nm_v")
    assert init_fs < types.index("Append") < sub_scan
    assert r.samples.node_samples.get(sub_scan, 0) > 0


@pytest.mark.pg
def test_parallel_workers_use_the_leaders_numbers(marker_conn):
    _name, _cl, conn = marker_conn
    for k, v in {"max_parallel_workers_per_gather": "2", "parallel_setup_cost": "0",
                 "parallel_tuple_cost": "0", "min_parallel_table_scan_size": "0",
                 # the workers do all the scanning: a loaded VM may let a participating
                 # leader finish a short scan before a worker gets the CPU
                 "parallel_leader_participation": "off"}.items():
        conn.execute(f"SET {k} = {v}")
    try:
        r = exp.run_marker(conn, SCAN_SQL, min_seconds=2.0, frequency=1999)
    finally:
        conn.execute("RESET ALL")
    types = _explain_types(r.plan)
    assert "Gather" in types or "Gather Merge" in types, types
    scan = types.index("Seq Scan")
    workers = r.samples.worker_node_samples
    assert r.samples.worker_pids, "no sample from a parallel worker"
    assert set(workers) <= set(range(types.index("Gather") + 1, len(types)))
    assert workers.get(scan, 0) > 0
    assert r.nodes["exclusive_share"].sum() == pytest.approx(1.0)


@pytest.mark.pg
def test_nested_queries_and_errors(marker_conn):
    _name, _cl, conn = marker_conn
    pid = int(conn.info.backend_pid)
    conn.execute("SET track_executor_node = on")
    before = nm.read_marker(pid)
    assert before.node_id == -1 and before.magic == nm.MAGIC
    # a function's query, run 300 times from inside the Seq Scan, is not numbered
    conn.execute("SELECT sum(nm_inner(a)) FROM nm_t WHERE a <= 300").fetchall()
    after = nm.read_marker(pid)
    assert after.query_seq == before.query_seq + 1
    assert after.node_id == -1
    # an error thrown inside a node: the marker is reset by the abort
    with pytest.raises(Exception, match="division by zero"):
        conn.execute("SELECT count(*) FROM nm_t WHERE 1 / (a - 777) > 0").fetchall()
    assert nm.read_marker(pid).node_id == -1
    # caught by an exception block inside a marked node: that node stays marked until
    # it returns, then -1 again
    conn.execute("""CREATE OR REPLACE FUNCTION nm_catch(x int) RETURNS int LANGUAGE plpgsql
                    AS $$ BEGIN RETURN 1 / (x - 5); EXCEPTION WHEN division_by_zero THEN
                    RETURN 0; END $$""")
    assert conn.execute("SELECT sum(nm_catch(a)) FROM nm_t WHERE a <= 10").fetchone()[0] == 0
    assert nm.read_marker(pid).node_id == -1
    # off: nothing is numbered
    conn.execute("SET track_executor_node = off")
    seq = nm.read_marker(pid).query_seq
    conn.execute(SCAN_SQL).fetchall()
    assert nm.read_marker(pid).query_seq == seq


@pytest.mark.pg
def test_stacks_of_the_same_executions(marker_conn, tmp_path):
    """method="marker", stacks=True: perf records the marker's own executions; the stack
    method's table of them (a run folder inside the marker's) has the plan's nodes, about
    as many samples, and each node's share within a few points of the marker's; a sample
    in a node's ExecProcNodeMarked wrapper is that node's (its folded stack says so)."""
    from profkit.experiments.nodetime import NodeTimeError, nodetime_on_conn

    _name, _cl, conn = marker_conn
    sql = "SELECT count(*) FROM nm_t JOIN nm_u USING (a)"
    res = nodetime_on_conn(conn, sql, method="marker", stacks=True, freq=999,
                           min_samples=1500, out=tmp_path / "run")
    same = res.stacks
    assert same is not None and same.method == "stacks"
    assert same.run.path == tmp_path / "run" / "stacks"
    assert (same.run.path / "perf.data").exists() and (same.run.path / "nodetime.csv").exists()
    assert same.facts["reps"] == res.facts["reps"] >= 1
    assert abs(same.executor_samples / res.executor_samples - 1) < 0.1, (
        same.executor_samples, res.executor_samples)
    types = ["Aggregate", "Hash Join", "Seq Scan", "Hash", "Seq Scan"]
    assert res.df["node_type"].tolist() == same.df["node_type"].tolist() == types
    assert same.df["rows"].tolist() == res.df["rows"].tolist()
    diff = (same.df["exclusive_share"] - res.df["exclusive_share"]).abs() * 100
    # nodetime_spread.md: at most 6.1 points apart in 60 runs of the seed workloads
    assert diff.max() < 8.0, pd.DataFrame({"marker": res.df["exclusive_share"],
                                           "stacks": same.df["exclusive_share"]})
    # the marker's wrappers sit under the node they run (the scans below the join)
    wrapped = {k.split(";ExecProcNodeMarked")[0].rsplit(";", 1)[-1]
               for k in same.folded if ";ExecProcNodeMarked" in k}
    assert wrapped & {"2 Seq Scan on nm_t", "3 Hash", "4 Seq Scan on nm_u"}, sorted(wrapped)
    prov = json.loads((same.run.path / "provenance.json").read_text())
    assert prov["status"] == "complete" and prov["same_executions_as"] == res.run.run_id
    doc = res.doc()
    assert doc["stacks"]["method"] == "stacks" and len(doc["stacks"]["nodes"]) == 5
    assert "The same executions by call stack" in res.console()
    with pytest.raises(NodeTimeError, match="needs method='marker'"):
        nodetime_on_conn(conn, sql, stacks=True)


@pytest.mark.pg
@pytest.mark.builds("node_marker")
def test_same_answers_with_the_setting_on(vanilla_build):
    """EXPLAIN's rows and loops and the rows the corpus queries return, with
    track_executor_node on, are vanilla's."""
    from profkit.pg import corpus
    from profkit.pg.build import get_build
    from profkit.pg.cluster import Cluster

    def run(build, on: bool) -> tuple[pd.DataFrame, dict[str, list]]:
        with Cluster(build, name=f"test-nm-corpus-{build.name}") as cl, cl.connect() as conn:
            corpus.load(conn)
            if on:
                conn.execute("ALTER DATABASE postgres SET track_executor_node = on")
                conn.execute("SET track_executor_node = on")
            rows = corpus.plan_rows(conn, modes=["rows", "timing"])
            answers = {}
            for q in corpus.CORPUS:
                if q.modifies:
                    continue
                for k, v in q.settings.items():
                    conn.execute(f"SET {k} = '{v}'")
                answers[q.name] = sorted(map(repr, conn.execute(q.sql).fetchall()))
                conn.execute("RESET ALL")
                if on:
                    conn.execute("SET track_executor_node = on")
        return rows, answers

    ref_rows, ref_answers = run(vanilla_build, False)
    rows, answers = run(get_build("node_marker", progress=print), True)
    diff = corpus.compare(ref_rows, rows)
    assert diff.empty, diff.to_string()
    assert answers == ref_answers
    assert len(answers) >= 20


@pytest.mark.pg
@pytest.mark.builds("node_marker", "vanilla")
def test_nodetime_method_marker_command(tmp_path: Path) -> None:
    """`profkit nodetime node_marker --method marker`: the same table as the stack
    method's, every node numbered as EXPLAIN numbers it, no ambiguous sample; a build
    without the marker and the options the marker cannot honour are refused clearly."""
    from test_cli_commands import message, profkit

    env = {"PROFKIT_PROFILES": str(tmp_path / "profiles")}
    cp = profkit("nodetime", "node_marker", "--method", "marker", "--workload",
                 "nested_loop", "--scale", "0.01", "--freq", "1999", "--min-samples", "2000",
                 "--with-stacks", "--json", "--out", str(tmp_path / "run"), env=env)
    doc = json.loads(cp.stdout)
    nodes = doc["nodes"]
    assert doc["method"] == "marker" and doc["flamegraph"] is None
    # --with-stacks: the stack method's table of the same executions, beside it
    same = doc["stacks"]
    assert same["method"] == "stacks" and same["reps"] == doc["reps"]
    assert [n["node_type"] for n in same["nodes"]] == [n["node_type"] for n in nodes]
    assert same["run_dir"] == str(tmp_path / "run" / "stacks")
    assert (tmp_path / "run" / "stacks" / "perf.data").exists()
    assert [n["node_type"] for n in nodes][:2] == ["Aggregate", "Nested Loop"]
    assert [n["node_id"] for n in nodes] == list(range(len(nodes)))
    assert sum(n["exclusive_share"] for n in nodes) == pytest.approx(1.0, abs=1e-9)
    assert all(n["ambiguous_samples"] == 0 for n in nodes)
    # the marker's table has EXPLAIN ANALYZE's rows and loops beside the shares
    assert all(n["loops"] >= 1 for n in nodes) and nodes[0]["rows"] == 1
    # the query repeats until the backend's CPU time holds 2000 samples at 1999 Hz (15 %
    # margin); most samples of a CPU-bound query land in a node
    assert doc["executor_samples"] >= 1600 and doc["reps"] >= 1
    assert 0 <= doc["outside_executor_share"] < 0.5
    csv = pd.read_csv(tmp_path / "run" / "nodetime.csv")
    assert csv["samples"].sum() == pytest.approx(doc["executor_samples"])
    prov = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert prov["status"] == "complete" and prov["method"] == "marker"

    m = message(profkit("nodetime", "vanilla", "--method", "marker", "--workload",
                        "nested_loop", "--scale", "0.01", "--reps", "1", env=env, code=1))
    assert "node_marker build" in m
    m = message(profkit("nodetime", "node_marker", "--method", "marker", "--workload",
                        "nested_loop", "--flamegraph", str(tmp_path / "x.svg"), code=2))
    assert "draws no flamegraph" in m
    m = message(profkit("nodetime", "node_marker", "--with-stacks", "--workload",
                        "nested_loop", code=2))
    assert "add --method marker" in m
