"""gprof collector on a real ``-pg`` PostgreSQL backend (the ``gprof`` build preset).

The central check: gprof's exact call counts of InstrStartNode, InstrStopNode and
ExecProcNodeInstr for one execution of Query-2 (EXPLAIN ANALYZE, TIMING off) equal what
the plan's rows and loops predict. The prediction is derived here from the EXPLAIN
(FORMAT JSON) output of the same query, independently of profkit.analyze.predict (which
must agree), by these rules (PostgreSQL 18 executor):

- ExecProcNodeInstr wraps every ExecProcNode call of an instrumented node; a node pulled
  through ExecProcNode is called once per row it returns plus once per loop for the call
  that returns NULL and ends the loop: ``calls = Actual Rows × Actual Loops + Actual
  Loops``. Each such call runs one InstrStartNode and one InstrStopNode.
- Hash is not pulled through ExecProcNode: its parent calls MultiExecProcNode and
  MultiExecHash brackets the whole build with one InstrStartNode/InstrStopNode pair per
  loop: ``0`` ExecProcNodeInstr calls, ``loops`` Instr pairs.
- When the run ends, ExecutePlan calls ExecShutdownNode, which brackets every node whose
  instrumentation is still "running" (executed in its current loop) with one more
  InstrStartNode/InstrStopNode pair: ``+1`` per executed node.
- Nothing else in the backend calls them: the query is the only statement the profiled
  backend runs (its pid comes from libpq, not from a query), pg_stat_statements with
  track = top does not instrument the statement nested inside EXPLAIN, and the
  EXPLAIN's own timers are plain INSTR_TIME_SET_CURRENT, not InstrStartNode.

No node here can stop a loop early (no Limit, semi/anti join, merge join or sub-plan), so
InstrStartNode and InstrStopNode match exactly. ExecProcNodeInstr's gprof count is the
prediction + 8 (one per plan node), a gprof artifact explained in the test: gprof counts
the calls of ``ExecShutdownNode_walker.part.0``, a symbol it drops, as the function
placed before it, ExecProcNodeInstr.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from profkit.collect import gprof
from profkit.experiments import profile as prof_exp
from profkit.rundir import load_run, new_run, open_run
from profkit.errors import ToolNotFound
from profkit.pg.workloads import get_workload

pytestmark = pytest.mark.pg

SMALL_PG_PROGRAM = r"""
#include <stdio.h>
__attribute__((noinline)) long leaf(long n)
{
    long s = 0;
    for (volatile long i = 0; i < n; i++)
        s += i;
    return s;
}
__attribute__((noinline)) long mid(long n) { return leaf(n) + leaf(n / 2); }
int main(void)
{
    long s = 0;
    for (int i = 0; i < 50; i++)
        s += mid(100000);
    printf("%ld\n", s);
    return 0;
}
"""


@pytest.fixture(scope="module")
def gprof_cluster():
    """A cluster on the -pg build with nested_loop loaded at the suite's scale."""
    from conftest import NESTED_LOOP_SCALE

    from profkit.pg.build import get_build
    from profkit.pg.cluster import Cluster

    b = get_build("gprof", progress=print)
    with Cluster(b, name="test-gprof") as cl:
        with cl.connect() as conn:
            get_workload("nested_loop").load(conn, NESTED_LOOP_SCALE)
        yield cl


def predict_from_plan(plan: dict) -> dict[str, int]:
    """The rules of the module docstring, applied to one EXPLAIN (FORMAT JSON) plan."""
    exec_calls = instr_pairs = 0

    def walk(node: dict) -> None:
        nonlocal exec_calls, instr_pairs
        loops = int(node["Actual Loops"])
        rows = round(node["Actual Rows"] * loops)  # Actual Rows is per loop
        if node["Node Type"] == "Hash":        # MultiExecProcNode: one pair per loop
            instr_pairs += loops
        else:                                  # ExecProcNode: rows + one NULL per loop
            exec_calls += rows + loops
            instr_pairs += rows + loops
        instr_pairs += 1 if loops > 0 else 0   # ExecShutdownNode's bracket
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    return {"ExecProcNodeInstr": exec_calls, "InstrStartNode": instr_pairs,
            "InstrStopNode": instr_pairs}


def gprof_binary(result: gprof.GprofResult) -> str:
    return str(result.run.get("gprof_binary"))


@pytest.fixture(scope="module")
def query2(gprof_cluster, tmp_path_factory):
    wl = get_workload("nested_loop")
    base = tmp_path_factory.mktemp("profiles")
    with open_run("gprof", build=gprof_cluster.build, workload="nested_loop",
                  mode="analyze_notiming", base=base, tools=("gprof", "gcc")) as rd:
        grun, res = gprof.collect_gprof(gprof_cluster, wl.query("analyze_notiming"), run=rd,
                                        query_name="Query-2")
    result = gprof.parse_run(grun.run_dir)
    with gprof_cluster.connect() as conn:   # another backend: not counted
        explain = conn.execute(wl.query("analyze_notiming", fmt="json")).fetchone()[0]
        pred = prof_exp.explain_prediction(conn, wl.query("analyze_notiming", fmt="json"),
                                        "analyze_notiming")
    return grun, res, result, explain, pred


def test_query2_instr_calls_equal_plan_prediction(query2) -> None:
    _grun, res, result, explain, pred = query2
    expected = predict_from_plan(explain[0])
    # the plan is the seed's: a nested loop over a Material of a hash join
    types = []

    def collect(n: dict) -> None:
        types.append(n["Node Type"])
        for c in n.get("Plans", []):
            collect(c)

    collect(explain[0]["Plan"])
    assert {"Aggregate", "Nested Loop", "Materialize"} <= set(types)
    # At the suite's scale (0.02) the inner join is a Hash Join: every loop of every node
    # ends with its NULL-returning call, so the prediction is exact (slack 0). At larger
    # scales the planner picks a Merge Join, which stops reading one side when the other
    # ends: that side misses its NULL call (predict marks it inexact), up to 1 per loop.
    inexact = pred.nodes[~pred.nodes["exact"]]
    slack = int(inexact["loops"].sum())
    if types == ["Aggregate", "Nested Loop", "Seq Scan", "Materialize", "Hash Join",
                 "Seq Scan", "Hash", "Seq Scan"]:
        assert slack == 0
    binary = gprof_binary(result)
    for fn, want in expected.items():
        # profkit.analyze.predict agrees with the derivation above
        assert prof_exp.predicted_calls(pred, fn) == want
        got = result.calls(fn)
        merged = gprof.merged_into(binary, fn)
        if fn == "ExecProcNodeInstr" and merged:
            # The explained constant. gprof drops symbols named like gcc's partial-
            # inlining parts (binutils core_sym_class keeps only "name", "name.NNN",
            # ".clone.N" and ".constprop.N") and counts their addresses — so their
            # mcount calls — as the symbol before them. gcc places
            # ExecShutdownNode_walker.part.0 right after ExecProcNodeInstr, and
            # ExecShutdownNode enters it once per plan node: +8 at the suite's scale.
            assert merged == ["ExecShutdownNode_walker.part.0"]
            assert prof_exp.gprof_artifact(pred, fn, merged) == len(types)
            assert want - slack <= got - len(types) <= want, (
                f"{fn}: gprof {got}, predicted {want} + {len(types)} (slack {slack})")
            # the walker's callees show up under ExecProcNodeInstr, one per node
            e = result.call_edges
            walk = e[(e["caller"] == fn) & (e["callee"] == "planstate_tree_walker_impl")]
            assert int(walk["calls"].iloc[0]) == len(types)
        else:
            assert not merged
            assert want - slack <= got <= want, f"{fn}: gprof {got}, predicted {want}"
    # the counts are large (rows of the nested loop) and the query really ran
    assert expected["ExecProcNodeInstr"] > 1000
    assert any("Nested Loop" in str(r[0]) for r in res.rows)


def test_query2_tables_and_artifacts(query2) -> None:
    grun, _res, result, _explain, _pred = query2
    d = Path(grun.run_dir)
    for name in ("gmon.out", "gprof.txt", "functions.parquet", "call_edges.parquet",
                 "query-output.txt", "provenance.json"):
        assert (d / name).exists(), name
    p = load_run(d).provenance
    assert p["tool"] == "gprof" and p["status"] == "complete" and p["backend_pid"] == grun.pid
    assert "--enable-profiling" in p["build"]["configure_opts"]
    assert p["tools"]["gprof"].startswith("GNU gprof")
    # call graph: ExecProcNodeInstr calls InstrStartNode and InstrStopNode once per call
    e = result.call_edges
    edge = e[(e["caller"] == "ExecProcNodeInstr") & (e["callee"] == "InstrStartNode")]
    assert len(edge) == 1
    assert int(edge["calls"].iloc[0]) == result.calls("ExecProcNodeInstr")
    hash_edge = e[(e["caller"] == "MultiExecHash") & (e["callee"] == "InstrStartNode")]
    assert int(hash_edge["calls"].iloc[0]) == 1
    top = result.top(10)
    assert list(top.columns) == ["function", "calls", "self_seconds", "cumulative_seconds",
                                 "percent_time"]


@pytest.fixture(scope="module")
def foreign_gmon(tmp_path_factory) -> tuple[Path, Path]:
    """gmon.out of a small -pg C program (and the program)."""
    d = tmp_path_factory.mktemp("small-pg")
    (d / "small.c").write_text(SMALL_PG_PROGRAM)
    subprocess.run(["gcc", "-O1", "-pg", "-o", "small", "small.c"], cwd=d, check=True)
    subprocess.run(["./small"], cwd=d, check=True, capture_output=True)
    return d / "gmon.out", d / "small"


def test_gmon_from_another_program(foreign_gmon, gprof_cluster, tmp_path) -> None:
    gmon, small = foreign_gmon
    postgres = gprof_cluster.build.postgres
    # its own binary: fine
    h = gprof.check_gmon(gmon, small)
    assert h.arcs >= 2 and h.calls == 50 + 100
    with pytest.raises(gprof.GprofError, match="does not match") as ei:
        gprof.check_gmon(gmon, postgres)
    assert "another program or another build" in str(ei.value)
    # through a run directory: the check runs before gprof is trusted ...
    run = new_run("gprof", base=tmp_path, gprof_binary=str(postgres))
    shutil.copy(gmon, run.file("gmon.out"))
    with pytest.raises(gprof.GprofError, match="does not match"):
        gprof.parse_run(run)
    assert run.file("gmon.out").exists()  # nothing collected is lost
    # ... and if the range check is skipped, gprof's empty report is caught too
    gprof.report(run, check=False)
    assert run.file("gprof.txt").exists()
    with pytest.raises(gprof.GprofError, match="attributed none of the 150 calls"):
        gprof.parse_run(run)


def test_truncated_and_garbled_gmon(foreign_gmon, tmp_path) -> None:
    gmon, _small = foreign_gmon
    data = gmon.read_bytes()
    cut = tmp_path / "cut.out"
    cut.write_bytes(data[:60])
    with pytest.raises(gprof.GprofError, match="truncated"):
        gprof.read_gmon(cut)
    bad = tmp_path / "bad.out"
    bad.write_bytes(b"not a gmon file at all")
    with pytest.raises(gprof.GprofError, match="not a gmon.out file"):
        gprof.read_gmon(bad)


def _calls_mcount(path: Path) -> bool:
    """True if *path* (a program or shared library) calls mcount: compiled with -pg."""
    out = subprocess.run(["nm", "-D", "-u", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return any(line.split()[-1].split("@")[0] in ("mcount", "_mcount")
               for line in out.splitlines() if line.strip())


def test_only_the_server_is_compiled_with_pg(gprof_cluster, vanilla_build) -> None:
    """-pg goes to the server's code only (build.make_flags): the postgres
    executable calls mcount, the programs and libraries around it do not (they are
    vanilla's objects, ccache hits, and write no gmon.out of their own)."""
    b = gprof_cluster.build
    assert b.timings["server_copt"] == "-pg -DPROFILE_PID_DIR"
    # configured as vanilla: the pg_config.h every file includes is vanilla's
    # (--enable-profiling would define PROFILE_PID_DIR there; ipc.c got it from COPT)
    h = [x.dir / "build" / "src" / "include" / "pg_config.h" for x in (b, vanilla_build)]
    assert h[0].read_bytes() == h[1].read_bytes()
    assert _calls_mcount(b.postgres)
    plain = [b.bindir / p for p in ("psql", "initdb", "pg_ctl", "pg_config")]
    plain += [b.libdir / "libpq.so", b.libdir / "pg_stat_statements.so",
              b.libdir / "plpgsql.so"]
    assert [p.name for p in plain if _calls_mcount(p)] == []


def test_build_without_pg(pg_cluster, tmp_path) -> None:
    with pytest.raises(gprof.GprofError, match=r"get_build\('gprof'\)"):
        prof_exp.gprof_on_cluster(pg_cluster, "SELECT 1", base=tmp_path)
    assert not any(tmp_path.iterdir())  # refused before creating a run


def test_gprof_missing() -> None:
    with pytest.raises(ToolNotFound, match="apt-get install binutils"):
        gprof.gprof_path("/nonexistent/gprof")


def test_profiling_build_names() -> None:
    assert gprof.profiling_build_name("vanilla") == "gprof"
    assert gprof.profiling_build_name("gprof") == "gprof"
    assert gprof.profiling_build_name("step3") == "step3+gprof"
    assert gprof.profiling_build_name("step3+gprof") == "step3+gprof"


def test_cli_gprof(monkeypatch, tmp_path, gprof_cluster) -> None:
    """`profkit gprof vanilla` maps to the gprof preset, prints counts vs prediction."""
    from click.testing import CliRunner

    from profkit.cli import main

    monkeypatch.setenv("PROFKIT_PROFILES", str(tmp_path / "profiles"))
    r = CliRunner().invoke(main, ["gprof", "vanilla", "--scale", "0.01"])
    assert r.exit_code == 0, r.output
    table = r.output.split("instrumentation calls")[1]
    lines = {ln.split()[0]: ln.split() for ln in table.splitlines() if ln.strip()}
    for fn in ("InstrStartNode", "InstrStopNode", "ExecProcNodeInstr"):
        calls, predicted, artifact, unexplained = (int(x) for x in lines[fn][1:5])
        assert calls == predicted + artifact and unexplained == 0, r.output
        assert artifact == (8 if fn == "ExecProcNodeInstr" else 0), r.output
    assert "note: gprof counts ExecShutdownNode_walker.part.0" in r.output
