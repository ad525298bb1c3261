"""Predictions from recorded PG18 plans, checked against recorded bcc counts; correction math.

Fixtures in tests/fixtures/plans/ were recorded on this machine with the vanilla
build: ``<name>.json`` is ``EXPLAIN (ANALYZE, TIMING TRUE, FORMAT JSON)`` of
``<name>.sql`` and ``<name>.measured.csv`` the per-node counts profkit's bcc probe
measured during that same EXPLAIN (plan_node_id and tag read from the backend).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from profkit import tables
from profkit.analyze import correction as C
from profkit.analyze import predict as P
from profkit.errors import ParseError
from profkit.parse.ltrace import parse_ltrace_summary

FIX = Path(__file__).parent / "fixtures"
PLANS = FIX / "plans"
PGSS = P.PredictContext(mode="analyze_timing", pgss_loaded=True)  # profkit's clusters


def plan(name: str) -> list:
    return json.loads((PLANS / f"{name}.json").read_text())


# ---------------------------------------------------------------------------
# join_sum: 2N + 4M + K


def test_join_sum_terms_and_k():
    n, m = 20_000, 20  # join_sum at scale 0.02
    pr = P.predict(plan("join_sum_0.02"), PGSS)
    nodes = pr.nodes.set_index("node_id")
    assert list(nodes["node_type"]) == ["Aggregate", "Hash Join", "Seq Scan", "Hash", "Seq Scan"]
    assert list(nodes["parent_id"].astype("float").fillna(-1)) == [-1, 0, 1, 1, 3]
    assert list(nodes["exec_calls_predicted"]) == [2, m + 1, n + 1, 0, m + 1]
    assert list(nodes["multiexec_calls_predicted"]) == [0, 0, 0, 1, 0]
    # 2 per call + 2 for ExecShutdownNode's bracket
    assert list(nodes["clock_calls_predicted"]) == [6, 2 * m + 4, 2 * n + 4, 4, 2 * m + 4]
    assert nodes["exact"].all() and nodes["id_reliable"].all()
    t = pr.totals
    # observer-effect.txt's K = 28 is what ltrace sees; a libc uprobe also sees
    # pg_stat_statements' 2 reads around the EXPLAIN utility statement
    assert t["clock_reads_ltrace"] == 2 * n + 4 * m + 28
    assert t["clock_reads"] == 2 * n + 4 * m + 30
    assert t["exec_proc_node_instr"] == 20_045
    assert t["instr_start_node"] == t["instr_stop_node"] == 20_051
    assert t["instr_end_loop_min"] == 5
    consts = {c.name: c for c in pr.constants}
    assert sum(c.clock_reads for c in consts.values()) == 8
    assert not consts["pgss_utility"].ltrace_visible
    summary = pr.summary()
    assert summary["clock_reads"].sum() == t["clock_reads"]


def test_join_sum_other_modes_and_no_pgss():
    p = plan("join_sum_0.02")
    off = P.predict(p, P.PredictContext(mode="analyze_notiming", pgss_loaded=True)).totals
    assert (off["clock_reads"], off["clock_reads_ltrace"]) == (8, 6)
    assert off["instr_start_node"] == 20_051  # row counting still calls Instr*
    plain = P.predict(p, P.PredictContext(mode="plain", pgss_loaded=True)).totals
    assert plain["clock_reads"] == 4 and plain["exec_proc_node_instr"] == 0
    bare = P.predict(p, P.PredictContext(mode="analyze_timing")).totals
    assert bare["clock_reads"] == bare["clock_reads_ltrace"] == 40_108
    assert P.predict(p, P.PredictContext(mode="plain")).totals["clock_reads"] == 0


# ---------------------------------------------------------------------------
# Other plan shapes: predicted vs what bcc measured


@pytest.mark.parametrize("name", ["nestloop_index", "nestloop_material", "bitmap", "subplans",
                                  "nestloop_limit", "semi_join", "join_sum_0.02"])
def test_recorded_plans_against_measured(name):
    pr = P.predict(plan(name), PGSS)
    assert (PLANS / f"{name}.measured.csv").exists(), f"no measurement recorded for {name}"
    meas = pd.read_csv(PLANS / f"{name}.measured.csv")
    # node ids derived from EXPLAIN's order = plan_node_id read from the backend
    chk = P.check_node_ids(pr.nodes, meas)
    assert chk["match"].all(), chk
    both = pr.nodes.merge(meas, on="node_id")
    exact = both[both["exact"]]
    assert (exact["exec_calls"] == exact["exec_calls_predicted"]).all()
    assert (exact["multiexec_calls"] == exact["multiexec_calls_predicted"]).all()
    assert (exact["clock_reads"] == exact["clock_calls_predicted"]).all()
    inexact = both[~both["exact"]]
    # an upper bound, off by at most the one NULL-returning call per loop
    assert (inexact["exec_calls"] <= inexact["exec_calls_predicted"]).all()
    assert (inexact["exec_calls_predicted"] - inexact["exec_calls"] <= inexact["loops"]).all()


def test_exactness_flags():
    lim = P.predict(plan("nestloop_limit"), PGSS).nodes.set_index("node_id")
    assert lim.loc[0, "exact"] and not lim.loc[1, "exact"]
    assert lim.loc[1, "exact_reason"] == "child of Limit"
    assert lim.loc[4, "exact_reason"].startswith("below ")
    semi = P.predict(plan("semi_join"), PGSS).nodes.set_index("node_id")
    assert "Semi nested loop" in semi.loc[3, "exact_reason"]
    sub = P.predict(plan("subplans"), PGSS).nodes.set_index("node_id")
    assert list(sub["plan_tree"]) == ["main", "main", "subplan", "subplan", "subplan", "subplan"]
    assert list(sub["subplan_name"].fillna("")) == ["", "", "InitPlan 1", "", "SubPlan 3",
                                                    "SubPlan 4"]
    mat = P.predict(plan("nestloop_material"), PGSS).nodes.set_index("node_id")
    assert (mat.loc[3, "loops"], mat.loc[3, "rows"]) == (500, 10_000)
    assert mat.loc[3, "exec_calls_predicted"] == 10_500 and mat.loc[3, "exact"]


def test_flatten_errors():
    with pytest.raises(ParseError, match="FORMAT JSON"):
        P.flatten_plan("Seq Scan on t")
    with pytest.raises(ParseError, match="expected"):
        P.flatten_plan([{"Nope": 1}])
    with pytest.raises(ParseError, match="empty"):
        P.flatten_plan([])
    no_analyze = [{"Plan": {"Node Type": "Seq Scan", "Plan Rows": 10}}]
    with pytest.raises(ParseError, match="ANALYZE"):
        P.predict(no_analyze)
    with pytest.raises(ParseError, match="unknown mode"):
        P.PredictContext(mode="fast")
    # a psycopg row tuple and a JSON string are accepted
    p = plan("bitmap")
    assert len(P.flatten_plan((p,))) == len(P.flatten_plan(json.dumps(p))) == 5


def test_plan_nodes_table_with_measured():
    pr = P.predict(plan("join_sum_0.02"), PGSS)
    meas = pd.read_csv(PLANS / "join_sum_0.02.measured.csv") \
        if (PLANS / "join_sum_0.02.measured.csv").exists() else None
    if meas is None:
        meas = pd.DataFrame({"node_id": [0, 1, 2, 3, 4], "exec_calls": [2, 21, 20001, 0, 21],
                             "clock_reads": [6, 44, 40004, 4, 44]})
    df = P.plan_nodes_table(pr, run_id="r1", build="vanilla", query="join_sum", measured=meas)
    tables.validate(df, "plan_nodes")
    assert (df["clock_calls_measured"] == df["clock_calls_predicted"]).all()
    assert (df["exec_calls_measured"] == df["exec_calls_predicted"]).all()
    assert set(df["run_id"]) == {"r1"}


# ---------------------------------------------------------------------------
# ltrace -c parser on recorded output


@pytest.mark.parametrize("name", ["join_sum_timing.txt", "join_sum_notiming_instr.txt",
                                  "no_calls.txt", "truncated.txt"])
def test_ltrace_parser_fixtures(name):
    expected = json.loads((FIX / "ltrace" / "expected.json").read_text())[name]
    df = parse_ltrace_summary((FIX / "ltrace" / name).read_text(), run_id="r", build="b")
    tables.validate(df, "functions")
    assert df.attrs["complete"] == expected["complete"]
    got = df[["function", "calls", "self", "self_share", "usecs_per_call"]].to_dict("records")
    assert [{k: (int(v) if k in ("calls", "usecs_per_call") else v) for k, v in r.items()}
            for r in got] == expected["rows"]
    assert set(df["tool"]) <= {"ltrace"}


def test_ltrace_parser_values_and_errors():
    df = parse_ltrace_summary((FIX / "ltrace" / "join_sum_timing.txt").read_text())
    assert df.loc[0, "function"] == "clock_gettime" and df.loc[0, "calls"] == 40_108
    empty = parse_ltrace_summary("")
    assert len(empty) == 0 and not empty.attrs["complete"]
    with pytest.raises(ParseError, match="unexpected line"):
        parse_ltrace_summary("% time     seconds  usecs/call     calls      function\n"
                             "------ ----------- ----------- --------- --------------------\n"
                             "garbage here\n")
    bad_total = ((FIX / "ltrace" / "join_sum_timing.txt").read_text()
                 .replace("40108 total", "40109 total"))
    with pytest.raises(ParseError, match="total line says 40109"):
        parse_ltrace_summary(bad_total)


# ---------------------------------------------------------------------------
# correction


def test_corrected_node_times_join_sum():
    p = plan("join_sum_0.02")
    times = C.node_times(p)
    pr = P.predict(p, PGSS)
    df = times.merge(pr.nodes[["node_id", "clock_calls_predicted", "instr_start_predicted"]],
                     on="node_id")
    out = C.corrected_node_times(df, ns_per_read=25.0, row_cost_ns=0.0)
    r = out.set_index("node_id")
    # i1's seq scan: its own reads are half inside its window
    assert r.loc[2, "reads_in_window"] == pytest.approx(40_004 / 2)
    # the hash join's window holds its own half and all reads below it
    assert r.loc[1, "reads_in_window"] == pytest.approx(44 / 2 + 40_004 + 4 + 44)
    assert r.loc[2, "overhead_ms"] == pytest.approx(20_002 * 25 / 1e6)
    assert (out["corrected_total_ms"] <= out["total_ms"]).all()
    assert (out["corrected_total_ms"] >= 0).all()
    # self times add up to the root's inclusive time, before and after correction
    assert out["self_ms"].sum() == pytest.approx(r.loc[0, "total_ms"])
    assert out["corrected_self_ms"].sum() == pytest.approx(r.loc[0, "corrected_total_ms"])
    with pytest.raises(C.CorrectionError, match="needs column"):
        C.corrected_node_times(times, 25.0)


def test_paired_differences_survive_a_speed_switch():
    """The VM slows down for reps 1-2 (every mode of them), and switches speed inside
    rep 3 (TIMING off slow, on fast).  The modes' medians then put TIMING on 0.5 ms below
    off; each repetition's own difference keeps it 1.0 ms above (the median of 1.5, 1.5,
    −0.5, 1.0, 1.0)."""
    slow = 1.5
    rows = []
    for rep in range(1, 6):
        s_all = slow if rep <= 2 else 1.0
        rows += [("plain", rep, 2.0 * s_all),
                 ("analyze_notiming", rep, 3.0 * (slow if rep <= 3 else 1.0)),
                 ("analyze_timing", rep, 4.0 * s_all)]
    t = pd.DataFrame(rows, columns=["mode", "rep", "server_ms"]).assign(run_id="r1")
    med = t.groupby("mode")["server_ms"].median()
    assert med["analyze_timing"] - med["analyze_notiming"] == pytest.approx(-0.5)
    d = C.paired_differences(t, "server_ms", "analyze_timing", "analyze_notiming")
    assert list(d.index) == [("r1", r) for r in range(1, 6)]
    assert list(d) == pytest.approx([1.5, 1.5, -0.5, 1.0, 1.0])
    assert C.paired_gap(t, "server_ms", "analyze_timing", "analyze_notiming") == 1.0
    # correction_table reads its costs from the pairs: 1.0 ms over 1,000 reads
    tab = C.correction_table(t, clock_reads=1_000, instr_calls=500, ns_per_read=25.0)
    assert tab.attrs["in_situ_ns_per_read"] == pytest.approx(1000.0)
    # TIMING off − plain per rep: 1.5, 1.5, 2.5, 1.0, 1.0 -> 1.5 ms over 500 calls
    assert tab.attrs["row_cost_ns"] == pytest.approx(3000.0)
    # repetitions that never hold both modes: no gap, and no row cost (not 0)
    extra = pd.DataFrame({"mode": ["plain"], "rep": [9], "server_ms": [2.0], "run_id": ["r1"]})
    lone = pd.concat([t[t["mode"] != "plain"], extra])
    assert C.paired_differences(lone, "server_ms", "analyze_notiming", "plain").empty
    assert math.isnan(C.paired_gap(lone, "server_ms", "analyze_notiming", "plain"))
    assert math.isnan(C.correction_table(lone, clock_reads=1_000, instr_calls=500,
                                         ns_per_read=25.0).attrs["row_cost_ns"])


def test_correction_table_and_row_cost():
    cost = C.row_counting_cost_ns(notiming_ms=3.0, plain_ms=2.0, instr_calls=20_000)
    assert cost == pytest.approx(50.0)
    assert C.row_counting_cost_ns(1.0, 2.0, 10) == 0.0
    with pytest.raises(C.CorrectionError):
        C.row_counting_cost_ns(1.0, 2.0, 0)
    timings = pd.DataFrame({"mode": ["plain", "plain", "analyze_notiming", "analyze_notiming",
                                     "analyze_timing", "analyze_timing"],
                            "rep": [1, 2, 1, 2, 1, 2],
                            "server_ms": [2.0, 2.2, 3.0, 3.2, 4.0, 4.2]})
    t = C.correction_table(timings, clock_reads=40_110, instr_calls=20_051, ns_per_read=25.0)
    by = t.set_index("what")["ms"]
    assert by["plain"] == pytest.approx(2.1)
    assert by["analyze_timing − clock"] == pytest.approx(4.1 - 40_110 * 25 / 1e6)
    row_cost = (3.1 - 2.1) * 1e6 / 20_051
    assert by["analyze_timing − clock − row counting"] == pytest.approx(
        4.1 - (40_110 * 25 + 20_051 * row_cost) / 1e6)
    assert t.attrs["row_cost_ns"] == pytest.approx(row_cost)
    # TIMING ON − OFF = 1.0 ms over 40,110 reads
    assert t.attrs["in_situ_ns_per_read"] == pytest.approx(1.0e6 / 40_110)
    with pytest.raises(C.CorrectionError, match="more often"):
        C.in_situ_ns_per_read(4.0, 3.0, 8, notiming_clock_reads=8)
    with pytest.raises(C.CorrectionError, match="need column 'rep'"):
        C.correction_table(timings.drop(columns="rep"), clock_reads=8, instr_calls=4,
                           ns_per_read=25.0)
    with pytest.raises(C.CorrectionError, match="lack modes"):
        C.correction_table({"plain": 1.0}, clock_reads=1, instr_calls=1, ns_per_read=1)
    with pytest.raises(C.CorrectionError, match="no node times"):
        no_timing = plan("join_sum_0.02")
        no_timing[0]["Plan"].pop("Actual Total Time")
        C.node_times(no_timing)
