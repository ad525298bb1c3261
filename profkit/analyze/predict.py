"""Predict instrumentation calls and clock reads per plan node from an EXPLAIN plan.

Input: the result of ``EXPLAIN (ANALYZE, FORMAT JSON) <query>`` as psycopg
returns it (a list holding one dict with a ``"Plan"`` key).  Output: one row
per plan node with the calls PostgreSQL 18's executor makes on that node's
behalf, and the per-query constants, so that ``2N + 4M + K`` from
observer-effect.txt can be checked term by term against ltrace and eBPF.

Where the calls come from (PostgreSQL 18 source)
-------------------------------------------------

``ExecProcNodeInstr`` (execProcnode.c) wraps every ``ExecProcNode`` call on an
instrumented node: ``InstrStartNode`` (reads the clock when TIMING is on,
``INSTR_TIME_SET_CURRENT_LAZY``), the node's real function, ``InstrStopNode``
(reads the clock again when TIMING is on).  A node pulled through
``ExecProcNode`` is called once per row it returns plus once per loop for the
call that returns NULL and ends the loop:

    exec_calls = rows_total + loops        (rows_total = Actual Rows × Actual Loops)

The first call of each node goes through ``ExecProcNodeFirst``, which swaps in
``ExecProcNodeInstr`` and calls it, so ``ExecProcNodeInstr`` sees every call.

Nodes run through ``MultiExecProcNode`` — Hash, Bitmap Index Scan, BitmapAnd,
BitmapOr — never go through ``ExecProcNodeInstr``; their own MultiExec function
brackets the whole build with one InstrStartNode/InstrStopNode pair per loop:

    multiexec_calls = loops                (and exec_calls = 0)

``ExecShutdownNode`` (called by ``ExecutePlan`` when the run ends) walks the
whole PlanState tree, sub-plans included, and brackets each node that has
``instrument->running`` set — every node that was executed in its current
loop — with one more InstrStartNode/InstrStopNode pair:

    shutdown_calls = 1 if loops > 0 else 0

So per node: ``InstrStartNode = InstrStopNode = exec_calls + multiexec_calls +
shutdown_calls`` and, with TIMING on, ``clock_reads = 2 × InstrStartNode``;
with TIMING off the same Instr* calls happen (row counting) but read no clock.
``InstrEndLoop`` never reads the clock: ExplainNode calls it once per node
printed and ``ExecReScan`` once per rescan of an instrumented node (it returns
at once when the node is not running), so we predict
``instr_endloop = 1 + max(loops - 1, 0)``, a lower bound (a nested loop rescans
its inner side once per outer row, including the first).

Per-query constants (not tied to a node), clock reads:

- EXPLAIN ANALYZE: 6 — ``ExplainOneQuery`` brackets planning (2:
  ``planstart``, ``planduration``), ``ExplainOnePlan`` brackets
  ExecutorStart..ExecutorFinish (2: ``starttime``, ``elapsed_time``) and
  ExecutorEnd (2).  They are read whatever TIMING says.
- pg_stat_statements, when loaded with ``track_utility`` on and ``track`` not
  ``none``: ``pgss_ProcessUtility`` brackets the EXPLAIN utility statement (2).
  These calls are made from ``pg_stat_statements.so``'s own PLT, so
  ``ltrace -e clock_gettime`` (which hooks the main binary's PLT) does not see
  them while a libc uprobe does: the explained constant between ltrace and bcc.
- pg_stat_statements on a plain (top-level) query: ``queryDesc->totaltime`` is
  allocated with INSTRUMENT_ALL, so ``standard_ExecutorRun`` and
  ``standard_ExecutorFinish`` call InstrStartNode/InstrStopNode on it (4 reads,
  from the main binary); ``track_planning`` adds 2 more from the .so.  The
  query inside an EXPLAIN runs at nesting level 1 and is not tracked with
  ``track = top``.

K for join_sum (observer-effect.txt's hash join)
------------------------------------------------

``SELECT sum(i1.i * i2.i) FROM i1 INNER JOIN i2 USING (i)``, i1 = N rows,
i2 = M rows (M ≤ N, every i2 row matches once), PG18 plan without parallelism::

    Aggregate                      rows 1, loops 1    exec 1+1 = 2     -> 4 reads
      Hash Join                    rows M, loops 1    exec M+1         -> 2M + 2
        Seq Scan on i1 (outer)     rows N, loops 1    exec N+1         -> 2N + 2
        Hash (inner, MultiExec)    loops 1            multiexec 1      -> 2
          Seq Scan on i2           rows M, loops 1    exec M+1         -> 2M + 2
    ExecShutdownNode: 5 executed nodes × 2                             -> 10
    EXPLAIN ANALYZE brackets                                           -> 6

    total = 2N + 4M + (4 + 2 + 2 + 2 + 2) + 10 + 6 = 2N + 4M + 28

K = 28 is exactly the article's figure; 16 for its summing query
(``Aggregate`` over one scan: 4 + 2 + shutdown 4 + 6).  MACHINE.md's 200,016
for ``sum(i) FROM generate_series(1,100000)`` is the same formula (2·100,000 +
16).  A libc uprobe on clock_gettime sees 2 more (pg_stat_statements'
utility bracket) when pg_stat_statements is loaded, as in profkit's clusters:
2N + 4M + 30.  Verified in tests/test_ltrace_bpf.py (N = 20,000, M = 20:
ltrace 40,108, bcc 40,110).

Node ids: EXPLAIN's JSON does not print ``plan_node_id``
---------------------------------------------------------

``set_plan_refs`` (setrefs.c) assigns ``plan_node_id =
glob->lastPlanNodeId++`` to a node *before* recursing — into the node-type
specific children (Append/MergeAppend members, BitmapAnd/Or members, a
SubqueryScan's subquery, CustomScan children) and then lefttree, righttree —
i.e. pre-order.  ``standard_planner`` numbers the main tree first and then each
entry of ``glob->subplans`` (InitPlans and SubPlans, in plan_id order: "SubPlan
2" is entry 2) with the same counter.  EXPLAIN prints InitPlans first, then
outer, inner, members, subquery, then SubPlans; node-type children and
outer/inner never coexist on one node, so we number: the main tree in EXPLAIN's
order skipping InitPlan/SubPlan children, then each sub-plan tree ordered by the
number in its name (CTEs, named "CTE x", before the numbered ones since the
planner plans them first).  Ids the executor never shows leave gaps we cannot
see: a trivial SubqueryScan or single-child Append removed by setrefs after
getting its id, Append children pruned at executor start-up ("Subplans
Removed").  (The unused arm of an AlternativeSubPlan leaves no gap: setrefs
sets its glob->subplans entry to NULL before the sub-plans are numbered; the
recorded ``subplans`` fixture — "SubPlan 3" and "SubPlan 4" after an unused
"SubPlan 2" — shows ids 4 and 5 as predicted.)  ``id_reliable`` is False
when the plan contains such a construct; the eBPF collector reads the real
``plan_node_id`` and node tag, and :func:`check_node_ids` compares them.

Where ``rows + loops`` is only an upper bound
---------------------------------------------

A loop that ends without the NULL-returning call: the child of a Limit that
reached its count (Limit stops pulling once it has ``count`` rows), the inner
side of a semi/anti or inner-unique Nested Loop (stops at the first match), the
inner side of a Merge Join and either side when the other runs out first, the
outer side of a Hash Join whose hash table is empty, sub-plans (EXISTS/ANY stop
at the first deciding row), and anything below those.  Such nodes get
``exact = False``; their prediction is an upper bound, by at most one call per
loop.  Parallel plans (Gather) are not modelled: workers run their own copies
of the nodes; profkit's clusters set max_parallel_workers_per_gather = 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from profkit import tables
from profkit.errors import ParseError
from profkit.parse.explain import GAP_TYPES, explain_order, flatten_plan, load_explain

__all__ = ["GAP_TYPES", "explain_order", "flatten_plan", "load_explain"]  # re-exported

MULTIEXEC_TYPES = frozenset({"Hash", "Bitmap Index Scan", "BitmapAnd", "BitmapOr"})
MODES = ("plain", "analyze_notiming", "analyze_timing")

# Plan node tag (T_<name>, read by the eBPF probe from plan->type) -> EXPLAIN's "Node Type".
TAG_TO_NODE_TYPE: dict[str, str] = {
    "T_Result": "Result", "T_ProjectSet": "ProjectSet", "T_ModifyTable": "ModifyTable",
    "T_Append": "Append", "T_MergeAppend": "Merge Append",
    "T_RecursiveUnion": "Recursive Union", "T_BitmapAnd": "BitmapAnd",
    "T_BitmapOr": "BitmapOr", "T_NestLoop": "Nested Loop", "T_MergeJoin": "Merge Join",
    "T_HashJoin": "Hash Join", "T_SeqScan": "Seq Scan", "T_SampleScan": "Sample Scan",
    "T_Gather": "Gather", "T_GatherMerge": "Gather Merge", "T_IndexScan": "Index Scan",
    "T_IndexOnlyScan": "Index Only Scan", "T_BitmapIndexScan": "Bitmap Index Scan",
    "T_BitmapHeapScan": "Bitmap Heap Scan", "T_TidScan": "Tid Scan",
    "T_TidRangeScan": "Tid Range Scan", "T_SubqueryScan": "Subquery Scan",
    "T_FunctionScan": "Function Scan", "T_TableFuncScan": "Table Function Scan",
    "T_ValuesScan": "Values Scan", "T_CteScan": "CTE Scan",
    "T_NamedTuplestoreScan": "Named Tuplestore Scan", "T_WorkTableScan": "WorkTable Scan",
    "T_ForeignScan": "Foreign Scan", "T_CustomScan": "Custom Scan", "T_Material": "Materialize",
    "T_Memoize": "Memoize", "T_Sort": "Sort", "T_IncrementalSort": "Incremental Sort",
    "T_Group": "Group", "T_Agg": "Aggregate", "T_WindowAgg": "WindowAgg", "T_Unique": "Unique",
    "T_SetOp": "SetOp", "T_LockRows": "LockRows", "T_Limit": "Limit", "T_Hash": "Hash",
}


@dataclass(frozen=True)
class PredictContext:
    """What besides the plan decides the count: EXPLAIN options and pg_stat_statements."""

    mode: str = "analyze_timing"          # plain | analyze_notiming | analyze_timing
    pgss_loaded: bool = False             # pg_stat_statements in shared_preload_libraries
    pgss_track: str = "top"               # pg_stat_statements.track: top | all | none
    pgss_track_utility: bool = True
    pgss_track_planning: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ParseError(f"unknown mode {self.mode!r}; known: {', '.join(MODES)}")

    @property
    def analyze(self) -> bool:
        return self.mode != "plain"

    @property
    def timing(self) -> bool:
        return self.mode == "analyze_timing"

    @property
    def pgss_top(self) -> bool:
        return self.pgss_loaded and self.pgss_track in ("top", "all")


def context_from_conn(conn: Any, mode: str) -> PredictContext:
    """Read pg_stat_statements' settings from a live connection."""
    def show(name: str) -> str | None:
        try:
            row = conn.execute(
                "SELECT setting FROM pg_settings WHERE name = %s", (name,)).fetchone()
        except Exception:  # noqa: BLE001 - a failed SHOW must not kill the probe
            return None
        return None if row is None else str(row[0])

    spl = show("shared_preload_libraries") or ""
    loaded = "pg_stat_statements" in [s.strip() for s in spl.split(",")]
    return PredictContext(
        mode=mode, pgss_loaded=loaded,
        pgss_track=show("pg_stat_statements.track") or "top",
        pgss_track_utility=(show("pg_stat_statements.track_utility") or "on") == "on",
        pgss_track_planning=(show("pg_stat_statements.track_planning") or "off") == "on",
    )


@dataclass(frozen=True)
class Constant:
    """A per-query clock-read term that belongs to no plan node."""

    name: str
    clock_reads: int
    instr_calls: int          # InstrStartNode (= InstrStopNode) calls it adds
    ltrace_visible: bool      # made through the main binary's PLT
    where: str


def query_constants(ctx: PredictContext) -> list[Constant]:
    out: list[Constant] = []
    if ctx.analyze:
        out += [
            Constant("explain_planning", 2, 0, True,
                     "ExplainOneQuery: INSTR_TIME_SET_CURRENT(planstart/planduration)"),
            Constant("explain_execution", 2, 0, True,
                     "ExplainOnePlan: starttime .. elapsed_time() around ExecutorRun/Finish"),
            Constant("explain_executor_end", 2, 0, True,
                     "ExplainOnePlan: starttime .. elapsed_time() around ExecutorEnd"),
        ]
        if ctx.pgss_loaded and ctx.pgss_track_utility and ctx.pgss_track != "none":
            out.append(Constant("pgss_utility", 2, 0, False,
                                "pg_stat_statements.so pgss_ProcessUtility around EXPLAIN"))
    else:
        if ctx.pgss_top:
            out.append(Constant("pgss_totaltime", 4, 2, True,
                                "standard_ExecutorRun/Finish: InstrStart/StopNode(totaltime)"))
            if ctx.pgss_track_planning:
                out.append(Constant("pgss_planning", 2, 0, False,
                                    "pg_stat_statements.so pgss_planner"))
    return out


# ---------------------------------------------------------------------------
# Prediction


def _unknown(v: Any) -> bool:
    """Whether a plan value is missing (None or NaN), not given as True or False."""
    return v is None or (isinstance(v, float) and math.isnan(v))


def _exactness(df: pd.DataFrame) -> list[tuple[bool, str]]:
    """(exact, reason) per node: False where a loop may end without the NULL call."""
    by_id = df.set_index("node_id")
    res: dict[int, tuple[bool, str]] = {}
    for nid in df["node_id"]:
        r = by_id.loc[nid]
        pid = r["parent_id"]
        if pd.isna(pid):
            res[nid] = (r["plan_tree"] == "main", "" if r["plan_tree"] == "main" else "sub-plan")
            continue
        if r["relationship"] in ("InitPlan", "SubPlan"):
            res[nid] = (False, "sub-plan (EXISTS/ANY may stop early)")
            continue
        p = by_id.loc[int(pid)]
        if not res[int(pid)][0]:
            res[nid] = (False, f"below {p['node_type']} {int(pid)}")
            continue
        pt, rel = p["node_type"], r["relationship"]
        if pt == "Limit":
            res[nid] = (False, "child of Limit")
        elif pt == "Nested Loop" and rel == "Inner" and (
                p["join_type"] in ("Semi", "Anti") or p["inner_unique"] is True):
            res[nid] = (False, f"inner of {p['join_type']} nested loop (stops at first match)")
        elif pt == "Nested Loop" and rel == "Inner" and _unknown(p["inner_unique"]):
            # EXPLAIN's text prints Inner Unique under VERBOSE only: it may stop early
            res[nid] = (False, "inner of nested loop (the plan does not say whether it is "
                               "unique: EXPLAIN VERBOSE or FORMAT JSON does)")
        elif pt == "Merge Join":
            res[nid] = (False, "merge join side (stops when the other side ends)")
        elif pt == "Hash Join" and rel == "Outer":
            hash_rows = df.loc[(df["parent_id"] == int(pid)) & (df["relationship"] == "Inner"),
                               "rows"]
            empty = len(hash_rows) and float(hash_rows.iloc[0]) == 0.0
            res[nid] = (not empty, "outer of hash join over empty hash" if empty else "")
        else:
            res[nid] = (True, "")
    return [res[n] for n in df["node_id"]]


def predict_nodes(nodes: pd.DataFrame, ctx: PredictContext) -> pd.DataFrame:
    """Add predicted call counts to :func:`flatten_plan`'s table for *ctx.mode*."""
    df = nodes.copy()
    loops = df["loops"].fillna(0).round().astype("int64")
    rows = df["rows"].fillna(0).round().astype("int64")
    multi = df["node_type"].isin(MULTIEXEC_TYPES)
    instrumented = ctx.analyze
    df["exec_kind"] = ["multiexec" if m else "procnode" for m in multi]
    exec_calls = (rows + loops).where(~multi, 0)
    multi_calls = loops.where(multi, 0)
    shutdown = (loops > 0).astype("int64")
    if not instrumented:
        # plain: no Instrumentation, ExecProcNode goes straight to the node
        df["exec_calls_predicted"] = 0
        df["procnode_calls_predicted"] = exec_calls  # still what the executor does
        df["multiexec_calls_predicted"] = multi_calls
        df["instr_start_predicted"] = 0
        df["instr_endloop_predicted"] = 0
        df["shutdown_calls_predicted"] = 0
        df["clock_calls_predicted"] = 0
    else:
        df["exec_calls_predicted"] = exec_calls
        df["procnode_calls_predicted"] = exec_calls
        df["multiexec_calls_predicted"] = multi_calls
        df["shutdown_calls_predicted"] = shutdown
        df["instr_start_predicted"] = exec_calls + multi_calls + shutdown
        df["instr_endloop_predicted"] = 1 + (loops - 1).clip(lower=0)
        df["clock_calls_predicted"] = (2 * df["instr_start_predicted"]) if ctx.timing else 0
    ex = _exactness(df)
    df["exact"] = [e for e, _ in ex]
    df["exact_reason"] = [r for _, r in ex]
    for c in ("exec_calls_predicted", "procnode_calls_predicted", "multiexec_calls_predicted",
              "shutdown_calls_predicted", "instr_start_predicted", "instr_endloop_predicted",
              "clock_calls_predicted"):
        df[c] = df[c].astype("int64")
    return df


@dataclass(frozen=True)
class Prediction:
    """Per-node predictions plus per-query constants and totals for one mode."""

    context: PredictContext
    nodes: pd.DataFrame
    constants: tuple[Constant, ...]
    totals: dict[str, int] = field(default_factory=dict)

    def summary(self) -> pd.DataFrame:
        """Terms of the clock-read total, one row each (the 2N + 4M + K derivation)."""
        rows = [{"term": f"node {r.node_id} {r.node_type}", "clock_reads": r.clock_calls_predicted,
                 "ltrace_visible": True, "exact": r.exact}
                for r in self.nodes.itertuples(index=False)]
        rows += [{"term": c.name, "clock_reads": c.clock_reads,
                  "ltrace_visible": c.ltrace_visible, "exact": True} for c in self.constants]
        return pd.DataFrame(rows)


def predict(explain: Any, ctx: PredictContext | None = None) -> Prediction:
    """Predict per-node and total calls for the query whose plan is *explain*.

    The plan must come from EXPLAIN ANALYZE (rows and loops are needed); *ctx*
    says which mode is being predicted (a plain run of the same query has the
    same rows and loops as its EXPLAIN ANALYZE).
    """
    ctx = ctx or PredictContext()
    nodes = flatten_plan(explain)
    if not nodes["analyzed"].any():
        raise ParseError("the plan has no Actual Rows/Loops: run EXPLAIN ANALYZE (text or FORMAT JSON)")
    nodes = predict_nodes(nodes, ctx)
    consts = tuple(query_constants(ctx))
    node_reads = int(nodes["clock_calls_predicted"].sum())
    totals = {
        "clock_reads": node_reads + sum(c.clock_reads for c in consts),
        "clock_reads_ltrace": node_reads + sum(c.clock_reads for c in consts if c.ltrace_visible),
        "clock_reads_nodes": node_reads,
        "exec_proc_node_instr": int(nodes["exec_calls_predicted"].sum()),
        "instr_start_node": int(nodes["instr_start_predicted"].sum())
        + sum(c.instr_calls for c in consts),
        "instr_end_loop_min": int(nodes["instr_endloop_predicted"].sum()),
        "exact": bool(nodes["exact"].all()),
    }
    totals["instr_stop_node"] = totals["instr_start_node"]
    # The part of the clock reads proportional to rows (2 per row returned through
    # ExecProcNode) and the rest: per-loop NULL calls, MultiExec brackets,
    # shutdown brackets and the per-query constants.  The article's K also counts
    # the Aggregate's single output row (2 reads), so K_article = k + 2 for join_sum.
    rows_term = 2 * int(nodes["rows"].fillna(0).round().where(
        ~nodes["node_type"].isin(MULTIEXEC_TYPES), 0).sum()) if ctx.timing else 0
    totals["rows_term"] = rows_term
    totals["k"] = totals["clock_reads"] - rows_term
    totals["k_ltrace"] = totals["clock_reads_ltrace"] - rows_term
    return Prediction(ctx, nodes, consts, totals)


def plan_nodes_table(pred: Prediction, *, run_id: str = "", build: str = "", query: str = "",
                     measured: pd.DataFrame | None = None) -> pd.DataFrame:
    """The ``plan_nodes`` table: prediction, and measurement when given.

    *measured* is :func:`profkit.collect.bpf` 's per-node frame (node_id,
    exec_calls, clock_reads, ...); its columns land beside the predictions with
    a ``_measured`` suffix, ``clock_calls_measured`` filled from clock_reads.
    ``rows`` is the node's total row count (Actual Rows × Actual Loops).
    """
    df = pred.nodes.copy()
    df.insert(0, "run_id", run_id)
    df.insert(1, "build", build)
    df.insert(2, "query", query)
    df["instr_ns"] = float("nan")
    df["clock_calls_measured"] = pd.NA
    if measured is not None and len(measured):
        m = measured.set_index("node_id")
        for col in m.columns:
            name = "clock_calls_measured" if col == "clock_reads" else f"{col}_measured"
            df[name] = df["node_id"].map(m[col])
    return tables.validate(df, "plan_nodes")


def check_node_ids(pred_nodes: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    """Compare predicted node ids with the ones the probe saw (plan tag per plan_node_id).

    *measured* needs node_id and node_tag (e.g. ``T_SeqScan``).  Returns one row
    per id in either, with ``match`` True when the node types agree.
    """
    p = pred_nodes[["node_id", "node_type"]].set_index("node_id")
    m = measured[["node_id", "node_tag"]].set_index("node_id")
    out = p.join(m, how="outer")
    out["node_type_measured"] = out["node_tag"].map(
        lambda t: TAG_TO_NODE_TYPE.get(t, t) if isinstance(t, str) else None)
    out["match"] = out["node_type"] == out["node_type_measured"]
    return out.reset_index()
