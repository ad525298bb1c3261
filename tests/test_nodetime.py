"""profkit nodetime: the plan walk, the attribution of sampled stacks to plan nodes
(pure, on hand-made and on recorded real stacks), and the real thing on a vanilla cluster."""
from __future__ import annotations

import math

import pytest

from profkit.analyze.nodetime import (
    Frame,
    Sample,
    attribute,
    node_tokens,
    plan_nodes,
    shares_from_node_samples,
)
from profkit.errors import ParseError

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
