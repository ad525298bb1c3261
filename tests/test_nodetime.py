"""profkit nodetime: the plan walk, the attribution of sampled stacks to plan nodes
(pure, on hand-made and on recorded real stacks), and the real thing on a vanilla cluster."""
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from profkit.analyze.nodetime import (
    Frame,
    Sample,
    attribute,
    node_tokens,
    plan_nodes,
    repair_lost_callers,
    samples_from_script,
    shares_from_node_samples,
)
from profkit.errors import ParseError

pytestmark = pytest.mark.alone  # asserts times measured here: make test runs it alone

# EXPLAIN (FORMAT JSON) of a 3-way join (shape of nested_loop's Query-1), ANALYZE figures
PLAN = [{"Plan": {
    "Node Type": "Aggregate", "Actual Rows": 1, "Actual Loops": 1, "Plans": [
        {"Node Type": "Nested Loop", "Parent Relationship": "Outer", "Actual Rows": 100,
         "Actual Loops": 1, "Plans": [
             {"Node Type": "Hash Join", "Parent Relationship": "Outer", "Actual Rows": 10,
              "Actual Loops": 1, "Plans": [
                  {"Node Type": "Seq Scan", "Parent Relationship": "Outer",
                   "Relation Name": "test1", "Alias": "a", "Actual Rows": 20,
                   "Actual Loops": 1},
                  {"Node Type": "Hash", "Parent Relationship": "Inner", "Actual Rows": 10,
                   "Actual Loops": 1, "Plans": [
                       {"Node Type": "Seq Scan", "Parent Relationship": "Outer",
                        "Relation Name": "test3", "Alias": "c", "Actual Rows": 10,
                        "Actual Loops": 1}]}]},
             {"Node Type": "Materialize", "Parent Relationship": "Inner", "Actual Rows": 10,
              "Actual Loops": 10, "Plans": [
                  {"Node Type": "Seq Scan", "Parent Relationship": "Outer",
                   "Relation Name": "test2", "Alias": "b", "Actual Rows": 10,
                   "Actual Loops": 1}]}]}]}}]

TOP = ["__libc_start_main", "main", "PostgresMain", "exec_simple_query", "PortalRun",
       "PortalRunSelect", "standard_ExecutorRun", "ExecutePlan"]


def _s(*names: str, pid: int = 1, top: list[str] = TOP) -> Sample:
    return Sample(pid, pid, tuple(Frame(n) for n in (*top, *names)))


def test_plan_walk_is_explains_pre_order() -> None:
    nodes = plan_nodes(PLAN)
    assert [(n.node_id, n.node_type, n.parent_id, n.depth) for n in nodes] == [
        (0, "Aggregate", None, 0), (1, "Nested Loop", 0, 1), (2, "Hash Join", 1, 2),
        (3, "Seq Scan", 2, 3), (4, "Hash", 2, 3), (5, "Seq Scan", 4, 4),
        (6, "Materialize", 1, 2), (7, "Seq Scan", 6, 3)]
    assert nodes[1].children == (2, 6)
    assert nodes[6].relationship == "Inner"
    assert (nodes[7].relation, nodes[7].alias, nodes[6].rows, nodes[6].loops) == \
        ("test2", "b", 10.0, 10.0)
    assert nodes[7].label == "7 Seq Scan on test2 b"
    # plain EXPLAIN: no rows/loops
    plain = plan_nodes([{"Plan": {"Node Type": "Result"}}])
    assert plain[0].rows is None and plain[0].loops is None


def test_attribution_by_tree_path() -> None:
    nodes = plan_nodes(PLAN)
    samples = [
        _s("ExecAgg", "ExecNestLoop", "ExecMaterial", "tuplestore_gettupleslot"),
        _s("ExecAgg", "ExecNestLoop", "ExecMaterial", "ExecSeqScan", "heap_getnextslot"),
        _s("ExecAgg", "ExecNestLoop", "ExecHashJoin", "ExecSeqScan"),
        _s("ExecAgg", "ExecNestLoop", "ExecHashJoin", "MultiExecProcNode", "MultiExecHash",
           "MultiExecPrivateHash", "ExecSeqScan"),
        _s("ExecAgg", "ExecNestLoop"),
        _s("ExecAgg", "ExecInterpExpr"),
        _s("printtup"),
        Sample(1, 1, tuple(Frame(n) for n in ["main", "PostgresMain", "pg_plan_queries"])),
    ]
    att = attribute(nodes, samples)
    assert att.node_samples == {6: 1, 7: 1, 3: 1, 5: 1, 1: 1, 0: 1}
    assert att.ambiguous == {}
    assert att.outside == {"executor, no plan node (sending rows, ExecutePlan)": 1,
                           "planning": 1}
    df = att.table()
    assert math.isclose(df["exclusive_share"].sum(), 1.0, abs_tol=1e-12)
    assert df.loc[0, "inclusive_share"] == 1.0
    assert df.loc[6, "inclusive_share"] == pytest.approx(2 / 6)
    assert df.attrs["outside_executor_share"] == pytest.approx(2 / 8)
    assert df.attrs["total_samples"] == 8
    assert att.folded[
        "0 Aggregate;1 Nested Loop;6 Materialize;tuplestore_gettupleslot"] == 1
    assert att.folded["0 Aggregate;1 Nested Loop;6 Materialize;7 Seq Scan on test2 b;"
                      "heap_getnextslot"] == 1


def test_a_dispatch_frame_is_its_childs_time() -> None:
    """A sample in ExecProcNodeInstr/ExecProcNodeMarked/MultiExecProcNode (or below it,
    before the child's own function) belongs to the child it dispatches to: the only
    child, the one a call site names, or the children shared; the root's wrapper under
    ExecutePlan is the root's."""
    nodes = plan_nodes(PLAN)  # 0 Agg; 1 NL; 2 HJ(outer); 3 SeqScan a; 4 Hash; 5 SeqScan c;
    #                           6 Materialize(inner); 7 Seq Scan b

    def side(f: Frame) -> str | None:
        return {0x10: "outer", 0x20: "inner"}.get(f.offset or -1)

    def at(*frames: Frame) -> Sample:
        return Sample(1, 1, tuple(Frame(n) for n in TOP) + frames)
    agg, fit = Frame("ExecAgg", 0x5), Frame("fetch_input_tuple", 0x7)
    nl_in, nl_out = Frame("ExecNestLoop", 0x20), Frame("ExecNestLoop", 0x10)
    samples = [
        at(agg, fit, Frame("ExecProcNodeMarked", 0x3)),                   # → 1 NL
        at(agg, fit, Frame("ExecProcNodeInstr", 0x9), Frame("InstrStartNode", 1)),  # → 1
        at(agg, nl_in, Frame("ExecProcNodeMarkedInstr.isra.0", 0x4)),     # → 6 Materialize
        at(agg, nl_out, Frame("ExecProcNodeInstr", 0x4), Frame("InstrStopNode", 2)),  # → 2
        at(Frame("ExecProcNodeInstr", 0x2), Frame("InstrStopNode", 2)),   # → 0, the root
        at(agg, fit, Frame("ExecProcNodeMarked", 0x3), Frame("ExecNestLoop", 0x33)),  # → 1
        at(agg, nl_in, Frame("ExecMaterial", 1), Frame("ExecProcNodeInstr", 3)),  # → 7
    ]
    att = attribute(nodes, samples, call_side=side)
    assert att.node_samples == {1: 3, 6: 1, 2: 1, 0: 1, 7: 1}
    assert att.ambiguous == {}
    assert att.folded["0 Aggregate;1 Nested Loop;ExecProcNodeMarked"] == 1
    assert att.folded["0 Aggregate;1 Nested Loop;ExecProcNodeInstr;InstrStartNode"] == 1
    assert att.folded["0 Aggregate;ExecProcNodeInstr;InstrStopNode"] == 1
    assert att.folded["0 Aggregate;1 Nested Loop;2 Hash Join;ExecProcNodeInstr;"
                      "InstrStopNode"] == 1
    # no call site: the two children of the join share it, as ambiguous
    att = attribute(nodes, [at(agg, Frame("ExecNestLoop", 0x99), Frame("ExecProcNodeInstr"))
                            for _ in range(2)] + [at(agg, nl_in, Frame("ExecMaterial")),
                                                  at(agg, nl_out, Frame("ExecHashJoin"))],
                    call_side=side)
    assert att.ambiguous == pytest.approx({2: 1.0, 6: 1.0})
    assert att.node_samples == pytest.approx({2: 2.0, 6: 2.0})
    # a Hash Join's MultiExecProcNode(hashNode) with the inner call site: the Hash
    att = attribute(nodes, [at(agg, nl_out, Frame("ExecHashJoin", 0x20),
                               Frame("MultiExecProcNode", 0x8))], call_side=side)
    assert att.node_samples == {4: 1}
    # without a plan (node types only) a dispatch frame names no type: its parent's
    tokens, _w, _e = node_tokens(at(agg, fit, Frame("ExecProcNodeMarked")).frames,
                                 dispatch=False)
    assert [set(t.types) for t in tokens] == [{"Aggregate"}]


def test_same_type_children_are_ambiguous_and_shared_proportionally() -> None:
    plan = [{"Plan": {"Node Type": "Nested Loop", "Plans": [
        {"Node Type": "Seq Scan", "Parent Relationship": "Outer", "Relation Name": "a"},
        {"Node Type": "Seq Scan", "Parent Relationship": "Inner", "Relation Name": "b"}]}}]
    nodes = plan_nodes(plan)
    stack = ("ExecNestLoop", "ExecSeqScan")
    samples = [_s(*stack) for _ in range(4)]
    att = attribute(nodes, samples)
    # nothing unambiguous: shared equally, and said so per node
    assert att.node_samples == {1: 2.0, 2: 2.0}
    assert att.ambiguous == {1: 2.0, 2: 2.0}

    # a call site names the side: the outer/inner call of ExecNestLoop
    def side(f: Frame) -> str | None:
        return {0x10: "outer", 0x20: "inner"}.get(f.offset or -1)

    def sided(off: int) -> Sample:
        return Sample(1, 1, tuple(Frame(n) for n in TOP)
                      + (Frame("ExecNestLoop", off), Frame("ExecSeqScan", 5)))
    att = attribute(nodes, [sided(0x10), sided(0x20), sided(0x20), sided(0x99)],
                    call_side=side)
    # 1 outer, 2 inner; the unresolved one shared 1:2
    assert att.node_samples == pytest.approx({1: 1 + 1 / 3, 2: 2 + 2 / 3})
    assert att.ambiguous == pytest.approx({1: 1 / 3, 2: 2 / 3})
    assert att.call_sites_used == 3


def test_exec_scan_tail_call_and_callbacks() -> None:
    # ExecIndexScan tail-calls ExecScan: its frame is gone; IndexNext names the scan
    plan = [{"Plan": {"Node Type": "Nested Loop", "Plans": [
        {"Node Type": "Seq Scan", "Parent Relationship": "Outer"},
        {"Node Type": "Index Scan", "Parent Relationship": "Inner"}]}}]
    nodes = plan_nodes(plan)
    att = attribute(nodes, [_s("ExecNestLoop", "ExecScan", "IndexNext", "index_getnext_slot"),
                            _s("ExecNestLoop", "ExecIndexScan", "ExecScan", "ExecInterpExpr"),
                            _s("ExecNestLoop", "ExecSeqScanWithQual", "heap_getnextslot")])
    assert att.node_samples == {2: 2, 1: 1}
    # a bare ExecScan under the join: either scan: ambiguous, shared 1:2
    att = attribute(nodes, [_s("ExecNestLoop", "ExecScan", "IndexNext"),
                            _s("ExecNestLoop", "ExecScan", "IndexNext"),
                            _s("ExecNestLoop", "ExecSeqScan"),
                            _s("ExecNestLoop", "ExecScan", "ExecQual")])
    assert att.ambiguous == pytest.approx({1: 1 / 3, 2: 2 / 3})


def test_nested_executor_and_workers() -> None:
    plan = [{"Plan": {"Node Type": "Aggregate", "Plans": [
        {"Node Type": "Gather", "Parent Relationship": "Outer", "Plans": [
            {"Node Type": "Aggregate", "Parent Relationship": "Outer", "Plans": [
                {"Node Type": "Seq Scan", "Parent Relationship": "Outer",
                 "Parallel Aware": True}]}]}]}}]
    nodes = plan_nodes(plan)
    worker_top = ["main", "BackgroundWorkerMain", "ParallelWorkerMain", "ParallelQueryMain",
                  "standard_ExecutorRun", "ExecutePlan"]
    att = attribute(nodes, [
        _s("ExecAgg", "ExecSeqScan", top=worker_top),
        _s("ExecAgg", "ExecGather", "gather_getnext", "ExecAgg", "ExecSeqScan"),
        # a SQL function inside the scan's qual: a nested executor, still node 3
        _s("ExecAgg", "ExecGather", "ExecAgg", "ExecSeqScan", "fmgr_sql",
           "standard_ExecutorRun", "ExecutePlan", "ExecResult"),
    ])
    assert att.node_samples == {3: 3}
    assert att.worker_samples == 1
    tokens, worker, entered = node_tokens(_s("ExecAgg", "ExecSeqScan", top=worker_top).frames)
    assert worker and entered and [sorted(t.types) for t in tokens] == [["Aggregate"],
                                                                         ["Seq Scan"]]


def test_initplan_run_from_a_node_below_its_parent() -> None:
    # the InitPlan hangs under the Aggregate; its parameter is evaluated in the scan's qual
    plan = [{"Plan": {"Node Type": "Aggregate", "Plans": [
        {"Node Type": "Aggregate", "Parent Relationship": "InitPlan",
         "Subplan Name": "InitPlan 1", "Plans": [
             {"Node Type": "Seq Scan", "Parent Relationship": "Outer", "Relation Name": "x"}]},
        {"Node Type": "Seq Scan", "Parent Relationship": "Outer", "Relation Name": "y"}]}}]
    nodes = plan_nodes(plan)
    assert [(n.node_id, n.node_type, n.relationship) for n in nodes] == [
        (0, "Aggregate", None), (1, "Aggregate", "InitPlan"), (2, "Seq Scan", "Outer"),
        (3, "Seq Scan", "Outer")]
    att = attribute(nodes, [
        _s("ExecAgg", "ExecSeqScanWithQual", "ExecInterpExpr", "ExecEvalParamExec",
           "ExecSetParamPlan", "ExecAgg", "ExecSeqScan", "heap_getnextslot"),
        _s("ExecAgg", "ExecSeqScanWithQual", "ExecInterpExpr"),
    ])
    assert att.node_samples == {2: 1, 3: 1} and att.ambiguous == {}
    assert att.outside == {}


def test_shares_from_node_samples_api() -> None:
    nodes = plan_nodes(PLAN)
    df = shares_from_node_samples(nodes, {1: 30, 6: 50, 7: 20}, outside=25,
                                  ambiguous={7: 5})
    assert list(df.columns[:10]) == ["node_id", "node_type", "parent_id", "depth", "relation",
                                     "alias", "exclusive_share", "inclusive_share", "samples",
                                     "ambiguous_samples"]
    assert df["exclusive_share"].tolist() == pytest.approx([0, .3, 0, 0, 0, 0, .5, .2])
    assert df["inclusive_share"].tolist() == pytest.approx([1, 1, 0, 0, 0, 0, .7, .2])
    assert df.loc[7, "ambiguous_samples"] == 5
    assert df.attrs["outside_executor_share"] == pytest.approx(0.2)
    with pytest.raises(ParseError, match="nodes 0..7"):
        shares_from_node_samples(nodes, {8: 1}, outside=0)


FIXTURES = Path(__file__).parent / "fixtures" / "nodetime"


def _fixture_lost(frameless: dict) -> Callable[[Frame], bool | None]:
    binary = frameless["binary"]
    offsets = {k: set(v) for k, v in frameless["frameless_offsets"].items()}

    def lost(f: Frame) -> bool | None:
        if f.module == binary:
            return f.offset in offsets.get(f.name, set())
        return None if f.module and not f.module.startswith("[") else False
    return lost


def test_recorded_query1_stacks() -> None:
    """A real recording (scripts/record_nodetime_fixture.py): vanilla, nested_loop's
    Query-1 at scale 0.02, 201 samples of the backend, frame pointers, symbol offsets."""
    nodes = plan_nodes(json.loads((FIXTURES / "query1.plan.json").read_text()))
    assert [n.label for n in nodes] == [
        "0 Aggregate", "1 Nested Loop", "2 Seq Scan on test2 b", "3 Materialize",
        "4 Hash Join", "5 Seq Scan on test1 a", "6 Hash", "7 Seq Scan on test3 c"]
    samples = samples_from_script(FIXTURES / "query1.perf-script.txt.gz")
    assert len(samples) == 201 and len({s.pid for s in samples}) == 1
    assert samples[0].frames[0].name == "__libc_start_call_main"
    # as recorded: the walk lost 9 samples' node frames, they look outside the nodes
    raw = attribute(nodes, samples)
    assert raw.node_samples == {0: 61, 1: 74, 2: 1, 3: 51, 5: 2}
    assert raw.outside == {"executor, no plan node (sending rows, ExecutePlan)": 9,
                           "planning": 2, "parse and rewrite": 1}
    assert raw.skipped_frames_samples == 4
    # 39 leaves were caught in a prologue or epilogue (offsets from the binary's code):
    # 32 get their caller back from the complete stacks through the same frames
    frameless = json.loads((FIXTURES / "query1.frameless.json").read_text())
    fixed, rep = repair_lost_callers(samples, _fixture_lost(frameless))
    assert (rep.lost, rep.repaired, rep.shared, rep.foreign_leaf) == (39, 32, 0, 0)
    att = attribute(nodes, fixed)
    assert att.node_samples == {0: 59, 1: 83, 2: 1, 3: 53, 5: 2}
    assert att.outside == {"planning": 2, "parse and rewrite": 1}
    assert att.ambiguous == {} and att.skipped_frames_samples == 0
    df = att.table()
    assert abs(df["exclusive_share"].sum() - 1) < 1e-12
    assert df.attrs["total_samples"] == 201
    assert df.loc[1, "exclusive_share"] == pytest.approx(83 / 198)
    assert df.loc[3, "inclusive_share"] == pytest.approx(55 / 198)
    assert df.attrs["outside_executor_share"] == pytest.approx(3 / 201)
    assert sum(att.folded.values()) == pytest.approx(201)
    assert att.folded["0 Aggregate;1 Nested Loop;3 Materialize;tuplestore_gettupleslot;"
                      "tuplestore_gettuple"] > 0


def test_repair_lost_callers_rule() -> None:
    a, b, leaf = Frame("ExecNestLoop", 9), Frame("ExecMaterial", 5), Frame("memcmp", 0)
    complete = [Sample(1, 1, (Frame("ExecAgg", 3), a, b, Frame("memcmp", 7)), weight=3),
                Sample(1, 1, (Frame("ExecAgg", 3), a, Frame("ExecSeqScan", 1),
                              Frame("memcmp", 7)), weight=1)]
    lost = Sample(1, 1, (Frame("ExecAgg", 3), a, leaf))
    fixed, rep = repair_lost_callers([*complete, lost], lambda f: f.offset == 0)
    assert rep.lost == 1 and rep.repaired == 1 and rep.shared == 1
    copies = fixed[2:]
    assert [(c.frames[2].name, c.weight, c.shared) for c in copies] == [
        ("ExecMaterial", 0.75, True), ("ExecSeqScan", 0.25, True)]
    # no stack through the same frames: kept as recorded
    other = Sample(1, 1, (Frame("ExecSort", 3), leaf))
    fixed, rep = repair_lost_callers([*complete, other], lambda f: f.offset == 0)
    assert fixed[-1] is other and rep.lost == 1 and rep.repaired == 0


def test_a_repaired_sample_is_ambiguous_only_across_nodes() -> None:
    """The copies of one repaired sample whose callers differ by call site only (the same
    node) are that node's, not ambiguous; copies in two nodes are shared as ambiguous."""
    nodes = plan_nodes(PLAN)
    agg, nl, mat = Frame("ExecAgg", 3), Frame("ExecNestLoop", 9), Frame("ExecMaterial", 5)

    def at(*frames: Frame, w: float = 1.0) -> Sample:
        return Sample(1, 1, tuple(Frame(n) for n in TOP) + frames, weight=w)
    # memcmp called from two places in ExecMaterial (6 Materialize)
    complete = [at(agg, nl, mat, Frame("tuplestore_gettuple", 4), Frame("memcmp", 7), w=3),
                at(agg, nl, mat, Frame("tuplestore_gettuple", 8), Frame("memcmp", 7))]
    lost = at(agg, nl, mat, Frame("memcmp", 0))
    fixed, rep = repair_lost_callers([*complete, lost], lambda f: f.offset == 0)
    assert rep.shared == 1 and [c.origin for c in fixed[2:]] == [2, 2]
    att = attribute(nodes, fixed)
    assert att.node_samples == {6: 5} and att.ambiguous == {}
    # its callers in two nodes (6 Materialize, 2 Hash Join): shared, ambiguous
    complete = [at(agg, nl, mat, Frame("memcmp", 7), w=3),
                at(agg, nl, Frame("ExecHashJoin", 4), Frame("memcmp", 7))]
    fixed, rep = repair_lost_callers([*complete, at(agg, nl, Frame("memcmp", 0))],
                                     lambda f: f.offset == 0)
    att = attribute(nodes, fixed)
    assert att.node_samples == pytest.approx({6: 3.75, 2: 1.25})
    assert att.ambiguous == pytest.approx({6: 0.75, 2: 0.25})


def test_console_table_and_plan_tree_html() -> None:
    from profkit.render.nodetime import console_text, plan_tree_html

    df = shares_from_node_samples(plan_nodes(PLAN), {1: 30, 6: 50, 7: 20}, outside=25,
                                  ambiguous={7: 5})
    text = console_text(df, outside_share=0.2, total=125, outside={"planning": 25},
                        head=["run x"], notes=["a note"], run_dir="/r")
    lines = text.splitlines()
    assert lines[0] == "run x"
    assert any(line.startswith("    6 Materialize ") and "50.0%" in line and "70.0%" in line
               for line in lines), text
    assert "outside the executor's plan nodes: 20.0% of 125 samples: planning 25" in text
    assert "note: a note" in text and "artifacts: /r" in text
    html = plan_tree_html(df, outside_share=0.2, total=125)
    assert html.count("<tr>") == 9 and "7 Seq Scan on test2 b" in html
    assert "width:50.0%" in html


def test_cli_usage_errors() -> None:
    import subprocess
    import sys

    for args, words in ((["--workload", "nested_loop"], "give one of BUILD"),
                        (["--pid", "1", "--sql", "SELECT 1"], "--pid samples what"),
                        (["vanilla"], "give the query"),
                        (["vanilla", "--workload", "nested_loop", "--against", "step3"],
                         "--flamegraph")):
        cp = subprocess.run([sys.executable, "-m", "profkit", "nodetime", *args],
                            capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
        assert cp.returncode == 2, (args, cp.stderr)
        assert words in cp.stderr and "Traceback" not in cp.stderr, cp.stderr
        assert len(cp.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- real backends

NL_QUERY1 = "SELECT count(*) FROM test1 AS a, test2 AS b, test3 AS c WHERE a.id = c.id"

#: How far the sampled exclusive share of a node may be from the yardstick: EXPLAIN
#: ANALYZE's (TIMING on) exclusive time share minus its own clock reads. Generous, because
#: the yardstick is biased here: it still holds the row counting (InstrStartNode/
#: InstrStopNode), and the price of a read is one figure for all nodes. Measured on
#: 2026-12-04 (vanilla, scale 0.02): in the 15 runs that printed their shares the
#: Materialize's sampled share sat 0.085-0.157 below the yardstick's, the Nested Loop's
#: within 0.05 of it but once (0.172, in a run whose price came out 33 ns a read against
#: 18-24 in the others, from 3 executions per setting); a bound of 0.15 failed 2 of 17 runs.
#: The yardstick is the one that is off: against node_marker's exact attribution the
#: stack method is within 1.1 pp on this query's three big nodes, and yardstick (a) is
#: 3.3 pp above it on the Materialize even with tsc_clock's cheaper reads
#: (benchmarks/results/nodetime_accuracy.md). A node's time handed to its parent or child
#: (0.2-0.4 of the executor here) still fails.
YARDSTICK_BOUND = 0.2

#: EXPLAIN ANALYZE executions per TIMING setting for the yardstick (medians): at 3 the
#: price of a read once came out 33 ns against 18-24; at 5 it stayed within 19.8-23.6
#: (8 runs)
YARDSTICK_REPS = 5


def explain_exclusive_shares(conn) -> tuple[list[float], list[float], float]:
    """Exclusive time share per node (EXPLAIN's pre-order) from EXPLAIN (ANALYZE, TIMING
    ON): raw, and minus the node's own clock reads
    (:func:`profkit.analyze.timing_accuracy.corrected_times`, the price of a read taken in
    situ: (TIMING ON − TIMING OFF execution time) / reads, medians of
    :data:`YARDSTICK_REPS`), with benchmarks/nodetime_accuracy.py's helpers. Returns (raw,
    corrected, ns per read).

    The raw shares hand a node the reads of every node below it: Query-1's Nested Loop
    holds the Materialize's 2 reads per row (~0.08 of the executor's time here)."""
    from conftest import benchmark_module

    acc = benchmark_module("nodetime_accuracy")

    def run(timing: str) -> list:
        return conn.execute(f"EXPLAIN (ANALYZE, TIMING {timing}, FORMAT JSON) " + NL_QUERY1
                            ).fetchone()[0]

    on, off = [], []
    for _ in range(YARDSTICK_REPS):
        on.append(run("ON"))
        off.append(run("OFF"))
    frames = [acc.explain_frame(p) for p in on]
    gap_ms = (statistics.median(float(p[0]["Execution Time"]) for p in on)
              - statistics.median(float(p[0]["Execution Time"]) for p in off))
    ns_per_read = max(0.0, gap_ms * 1e6 / acc.reads_of(frames[0]))
    ids = frames[0]["node_id"].tolist()

    def in_order(shares: dict[int, float]) -> list[float]:
        return [shares.get(int(i), 0.0) for i in ids]

    return (in_order(acc.shares_of(frames)),
            in_order(acc.shares_of(acc.corrected(frames, ns_per_read))), ns_per_read)


@pytest.mark.pg
@pytest.mark.builds("vanilla")
def test_nested_loop_query1_per_node_vs_explain_analyze(nested_loop_conn, tmp_path) -> None:
    from profkit.experiments.nodetime import nodetime_on_conn

    res = nodetime_on_conn(nested_loop_conn, NL_QUERY1, analyze=True, min_samples=400,
                           max_seconds=20, out=tmp_path / "run",
                           flamegraph=tmp_path / "nl.svg")
    df = res.df
    assert abs(df["exclusive_share"].sum() - 1.0) < 1e-9
    types = df["node_type"].tolist()
    assert types[:2] == ["Aggregate", "Nested Loop"] and "Materialize" in types
    assert res.executor_samples >= 300, res.facts
    assert 0 <= res.outside_executor_share < 0.25
    assert df.loc[0, "inclusive_share"] == pytest.approx(1.0)
    # rows and loops: EXPLAIN ANALYZE's, a separate run
    mat = int(df.index[df["node_type"] == "Materialize"][0])
    nl = 1
    assert df.loc[mat, "loops"] >= 1 and df.loc[nl, "loops"] == 1
    raw, yard, ns_per_read = explain_exclusive_shares(nested_loop_conn)
    got = df["exclusive_share"].tolist()
    print(f"node, sampled exclusive share, EXPLAIN ANALYZE TIMING exclusive share minus its "
          f"clock reads ({ns_per_read:.1f} ns each), raw")
    for r, y, w in zip(df.itertuples(), yard, raw, strict=True):
        print(f"{r.node_id} {r.node_type}: {r.exclusive_share:.3f} vs {y:.3f} ({w:.3f})")
    assert 0 < ns_per_read < 5000
    # the reads inflate the Nested Loop (it holds the Materialize's): the correction
    # moves its share down, the Aggregate's up
    assert yard[nl] < raw[nl] and yard[0] > raw[0]
    for i in (nl, mat):
        assert abs(got[i] - yard[i]) <= YARDSTICK_BOUND, (i, got, yard)
    # the two nodes hold most of the executor's time in the corrected view, and a large
    # part in the sampled one: node_marker's exact attribution gives them 0.61 on this VM,
    # the stack samples 0.53-0.58 in seven runs (2026-12-05) and 0.457 in one fresh-clone
    # run, when the Aggregate took 0.526 (a bound of 0.5 failed that run)
    assert got[nl] + got[mat] > 0.4 and yard[nl] + yard[mat] > 0.5
    assert (res.run.path / "nodetime.csv").is_file() and (res.run.path / "perf.data").is_file()
    folded = (res.run.path / "nodetime.folded").read_text().splitlines()
    assert any(line.startswith("0 Aggregate;1 Nested Loop;") for line in folded)
    assert any(f"{mat} Materialize;" in line for line in folded)
    svg = (tmp_path / "nl.svg").read_text()
    assert "1 Nested Loop" in svg and "Materialize" in svg
    assert "nodetime.svg" in {p.name for p in res.run.path.iterdir()}
    html = res._repr_html_()
    assert "1 Nested Loop" in html and "<table" in html


@pytest.mark.pg
@pytest.mark.builds("vanilla")
def test_cli_json(pg_cluster, _nested_loop_loaded, tmp_path) -> None:
    import sys

    cp = subprocess.run([sys.executable, "-m", "profkit", "nodetime", "--dsn", pg_cluster.dsn,
                         "--workload", "nested_loop", "--min-samples", "200", "--json",
                         "--out", str(tmp_path / "run")], capture_output=True, text=True,
                        timeout=300, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["method"] == "stacks" and doc["has_plan"] is True
    assert doc["total_samples"] >= 150
    nodes = doc["nodes"]
    assert [n["node_id"] for n in nodes] == list(range(len(nodes)))
    assert {"node_id", "node_type", "exclusive_share", "inclusive_share", "samples",
            "ambiguous_samples", "rows", "loops"} <= set(nodes[0])
    assert nodes[0]["node_type"] == "Aggregate" and nodes[0]["inclusive_share"] == 1.0
    assert sum(n["exclusive_share"] for n in nodes) == pytest.approx(1.0, abs=1e-9)
    assert 0 <= doc["outside_executor_share"] < 0.3
    assert (tmp_path / "run" / "nodetime.csv").is_file()


@contextlib.contextmanager
def _query_started_elsewhere(psql_bin, cluster, args: list[str], marker: str):
    """A psql (its own session, stopped by pid in the end) running a query profkit did not
    start; yields (connection, backend pid) once pg_stat_activity shows it active."""
    psql = subprocess.Popen([str(psql_bin), "-X", "-q", "-d", cluster.dsn, *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True,
                            env={**os.environ, "PGOPTIONS": "-c statement_timeout=60s"})
    try:
        with cluster.connect() as conn:
            pid = None
            for _ in range(100):
                row = conn.execute("SELECT pid FROM pg_stat_activity WHERE state = 'active' "
                                   "AND query LIKE %s AND pid <> pg_backend_pid()",
                                   (f"%{marker}%",)).fetchone()
                if row:
                    pid = int(row[0])
                    break
                time.sleep(0.1)
            assert pid is not None, "the psql query did not start"
            yield conn, pid
            conn.execute("SELECT pg_cancel_backend(%s)", (pid,))
    finally:
        os.killpg(psql.pid, signal.SIGTERM)
        psql.wait(timeout=30)


@pytest.mark.pg
@pytest.mark.builds("vanilla")
def test_pid_of_a_query_started_elsewhere(pg_cluster, vanilla_build, _nested_loop_loaded,
                                          tmp_path) -> None:
    from profkit.experiments.nodetime import nodetime_pid

    # far longer than the recording (the statement is cancelled after it): with one
    # table fewer it ran ~3.2 s here and once ended inside a 3 s recording
    long_sql = ("SELECT count(*) FROM test1 a, test2 b, test2 c, test2 d "
                "WHERE a.data = b.data")
    with _query_started_elsewhere(vanilla_build.bindir / "psql", pg_cluster,
                                  ["-c", long_sql], "test2 d WHERE") as (_conn, pid):
        res = nodetime_pid(pid, seconds=3, out=tmp_path / "run")
    assert res.has_plan
    df = res.df
    assert abs(df["exclusive_share"].sum() - 1.0) < 1e-9
    assert res.executor_samples >= 100
    assert res.outside_executor_share < 0.1  # busy in its plan all the time
    assert df.loc[0, "node_type"] == "Aggregate"
    assert "test2 d WHERE" in res.sql
    assert (res.run.path / "plan.json").is_file()


@pytest.mark.pg
@pytest.mark.builds("vanilla")
def test_pid_without_a_plan_gives_node_types(pg_cluster, vanilla_build, _nested_loop_loaded,
                                             tmp_path) -> None:
    """A query with a parameter ($1, extended protocol): EXPLAIN of its text cannot plan
    it, so the samples are given per node TYPE, and the result says so."""
    from profkit.experiments.nodetime import nodetime_pid
    from profkit.parse.explain import flatten_plan

    # Nested loops only, so the query is in its steady state from its first row: with a
    # hash join the planner's choice, a recording that began after the hash was built saw
    # only Hash Join and Aggregate, and one that began before it mostly the build
    pin = "SET enable_hashjoin = off; SET enable_mergejoin = off;"
    sql = ("SELECT count(*) FROM test1 a, test2 b, test2 c, test2 d "
           "WHERE a.data = b.data AND c.id > $1")
    script = tmp_path / "bind.sql"
    script.write_text(f"{pin}\n{sql} \\bind 0 \\g\n")
    with _query_started_elsewhere(vanilla_build.bindir / "psql", pg_cluster,
                                  ["-f", str(script)], "c.id > $1") as (conn, pid):
        res = nodetime_pid(pid, seconds=2, out=tmp_path / "run")
        conn.execute(pin)
        plan = conn.execute("EXPLAIN (GENERIC_PLAN, FORMAT JSON) " + sql).fetchone()[0]
    planned = set(flatten_plan(plan)["node_type"])
    assert planned == {"Aggregate", "Nested Loop", "Materialize", "Seq Scan"}, planned
    assert not res.has_plan
    assert any("no plan for its query" in n and "$1" in n for n in res.notes), res.notes
    df = res.df
    assert list(df.columns) == ["node_type", "samples", "exclusive_share"]
    assert abs(df["exclusive_share"].sum() - 1.0) < 1e-9
    assert {"Nested Loop", "Aggregate"} <= set(df["node_type"]) <= planned, df
    assert res.doc()["node_types"] is not None and res.doc()["has_plan"] is False


@pytest.mark.pg
@pytest.mark.builds("vanilla")
def test_hash_join(join_sum_conn, tmp_path) -> None:
    from profkit.experiments.nodetime import nodetime_on_conn

    res = nodetime_on_conn(join_sum_conn, "SELECT sum(i1.i * i2.i) FROM i1 INNER JOIN i2 "
                           "USING (i)", min_samples=200, max_seconds=15, out=tmp_path / "r")
    df = res.df
    types = df["node_type"].tolist()
    assert "Hash Join" in types and "Hash" in types
    assert abs(df["exclusive_share"].sum() - 1.0) < 1e-9
    hj = types.index("Hash Join")
    outer_scan = hj + 1
    assert df.loc[outer_scan, "node_type"] == "Seq Scan"
    assert df.loc[outer_scan, "relation"] == "i1"
    # probing 20,000 rows of i1 against 20 of i2: the join and i1's scan hold the time,
    # the Hash over i2 (20 rows) next to nothing
    hash_ = types.index("Hash")
    assert df.loc[hj, "exclusive_share"] + df.loc[outer_scan, "exclusive_share"] > 0.5
    assert df.loc[hash_, "inclusive_share"] < 0.1
    # the join's two children are told apart by call site; a sample taken in a prologue
    # (before the frame pointer is set up) can still lose a frame and be shared: rare
    assert df["ambiguous_samples"].sum() <= 0.02 * res.executor_samples


@pytest.mark.pg
@pytest.mark.builds("vanilla")
def test_sort_aggregate_and_same_type_children(nested_loop_conn, tmp_path) -> None:
    from profkit.experiments.nodetime import nodetime_on_conn

    conn = nested_loop_conn
    conn.execute("SET enable_hashagg = off")
    res = nodetime_on_conn(conn, "SELECT a.data, count(*), sum(a.id) FROM test1 a, test1 b "
                           "WHERE b.id < 40 GROUP BY a.data ORDER BY a.data",
                           min_samples=200, max_seconds=15, out=tmp_path / "sort")
    types = res.df["node_type"].tolist()
    assert "Sort" in types and "Aggregate" in types
    assert abs(res.df["exclusive_share"].sum() - 1.0) < 1e-9
    sort = types.index("Sort")
    assert res.df.loc[sort, "exclusive_share"] > 0.05
    # a nested loop over two Seq Scans (no Materialize): the call site tells them apart
    for s in ("enable_material", "enable_hashjoin", "enable_mergejoin"):
        conn.execute(f"SET {s} = off")
    res = nodetime_on_conn(conn, "SELECT count(*) FROM test2 a, test2 b WHERE a.data + "
                           "b.data = 50", min_samples=200, max_seconds=15,
                           out=tmp_path / "nl2")
    df = res.df
    assert df["node_type"].tolist() == ["Aggregate", "Nested Loop", "Seq Scan", "Seq Scan"]
    assert res.facts["call_site_samples"] > 0
    assert df["ambiguous_samples"].sum() <= 0.05 * res.executor_samples
    # the inner scan runs once per outer row: it holds far more than the outer
    assert df.loc[3, "exclusive_share"] > 3 * df.loc[2, "exclusive_share"]


@pytest.mark.pg
@pytest.mark.builds("vanilla")
def test_parallel_query(nested_loop_conn, tmp_path) -> None:
    from profkit.experiments.nodetime import nodetime_on_conn

    conn = nested_loop_conn
    for k, v in (("parallel_setup_cost", "0"), ("parallel_tuple_cost", "0"),
                 ("min_parallel_table_scan_size", "0"), ("max_parallel_workers_per_gather", "2"),
                 ("enable_material", "off"), ("parallel_leader_participation", "off")):
        conn.execute(f"SET {k} = {v}")
    res = nodetime_on_conn(conn, "SELECT count(*) FROM test1 a, test2 b WHERE a.data = b.data",
                           min_samples=300, max_seconds=20, out=tmp_path / "par")
    df = res.df
    types = df["node_type"].tolist()
    assert "Gather" in types or "Gather Merge" in types, types
    assert res.facts["parallel"] and res.facts["worker_pids"], res.facts
    # the leader only gathers (parallel_leader_participation off): the workers scan and
    # join, so most executor samples are theirs (80-87 % in 12 runs here). With the leader
    # participating, a worker spent most of its life starting at this scale and 2-14 of
    # ~320 samples were the workers': once, none (a make test run failed on > 0).
    assert res.facts["worker_samples"] > 0.5 * res.executor_samples, res.facts
    g = types.index("Gather") if "Gather" in types else types.index("Gather Merge")
    print(f"parallel: workers {res.facts['worker_pids']}, worker samples "
          f"{res.facts['worker_samples']:.0f} of {res.executor_samples:.0f}; "
          + ", ".join(f"{r.node_id} {r.node_type} {r.exclusive_share:.3f}"
                      for r in df.itertuples()))
    assert abs(df["exclusive_share"].sum() - 1.0) < 1e-9
    # the workers' nodes under the Gather hold most of the time; the leader's own CPU is
    # the Gather's (its exclusive share 0.13-0.20 in those runs, so the node under it
    # held 0.80-0.87 inclusive)
    assert df.loc[g + 1, "inclusive_share"] > 0.7
    # a worker's start-up is outside the plan, and named
    assert res.outside.get("parallel worker start-up (connecting, caches)", 0) > 0, \
        res.outside
