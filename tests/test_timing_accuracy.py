"""Timing accuracy of the clock-source variants (issue 3).

Pure functions are tested on synthetic plans and tables whose answers are known by
construction; the collector runs for real (``pg``) on vanilla and whichever of
coarse_clock / tsc_clock / sampled_timing is cached (tsc_clock is built if none is).
"""
from __future__ import annotations

import json
import math
import os
import re
import time

import numpy as np
import pandas as pd
import pytest

from profkit.analyze import timing_accuracy as ta
from profkit.collect.vcpu import default_pin_cpu
from profkit.render import timing_accuracy as render_timing_accuracy
from profkit.experiments.timing_accuracy import (
    CLOCK_MONOTONIC_COARSE,
    Arm,
    TimingAccuracyError,
    analyze_run,
    apply_vcpu_rule,
    check_arms,
    parse_arm,
)

pytestmark = pytest.mark.alone  # asserts times measured here: make test runs it alone

# ---------------------------------------------------------------------------
# synthetic plans


def _node(ntype, total, loops=1, rows=1, startup=0.0, plans=(), **extra):
    n = {"Node Type": ntype, "Actual Startup Time": startup, "Actual Total Time": total,
         "Actual Rows": rows, "Actual Loops": loops, **extra}
    if plans:
        n["Plans"] = list(plans)
    return n


def _plan(agg=10.0, join=9.0, scan=5.0, hash_=1.5, inner=1.0, rows=100, timing=True):
    """Aggregate -> Hash Join -> (Seq Scan, Hash -> Seq Scan), like join_sum."""
    def t(x):
        return x if timing else None

    def nd(ntype, total, **kw):
        n = _node(ntype, t(total), **kw)
        if not timing:
            n.pop("Actual Total Time")
            n.pop("Actual Startup Time")
        return n

    plan = nd("Aggregate", agg, plans=[
        nd("Hash Join", join, rows=rows, plans=[
            nd("Seq Scan", scan, rows=1000, **{"Parent Relationship": "Outer"}),
            nd("Hash", hash_, rows=rows, **{"Parent Relationship": "Inner"}, plans=[
                nd("Seq Scan", inner, rows=rows, **{"Parent Relationship": "Outer"})]),
        ], **{"Parent Relationship": "Outer"})])
    return [{"Plan": plan, "Planning Time": 0.1, "Execution Time": agg + 0.05}]


def test_node_times_inclusive_exclusive():
    df = ta.node_times(_plan())
    assert list(df["node_type"]) == ["Aggregate", "Hash Join", "Seq Scan", "Hash", "Seq Scan"]
    assert list(df["parent_id"].astype("float").fillna(-1)) == [-1, 0, 1, 1, 3]
    assert df["inclusive_ms"].tolist() == [10.0, 9.0, 5.0, 1.5, 1.0]
    # exclusive = inclusive - children: 10-9, 9-(5+1.5), 5, 1.5-1, 1
    assert df["exclusive_ms"].round(6).tolist() == [1.0, 2.5, 5.0, 0.5, 1.0]
    assert df["timed"].all()
    assert df.attrs["execution_ms"] == pytest.approx(10.05)
    assert df.attrs["planning_ms"] == pytest.approx(0.1)


def test_node_times_loops_subplan_and_text_input():
    # per-loop times: inclusive = total x loops; a SubPlan child counts in its parent
    plan = [{"Plan": _node("Nested Loop", 20.0, plans=[
        _node("Seq Scan", 2.0, rows=10, **{"Parent Relationship": "Outer"}),
        _node("Materialize", 0.05, loops=10, rows=100, **{"Parent Relationship": "Inner"}),
        _node("Result", 0.1, loops=10, **{"Parent Relationship": "SubPlan",
                                          "Subplan Name": "SubPlan 1"}),
    ])}]
    df = ta.node_times(json.dumps(plan))
    inc = dict(zip(df["node_type"], df["inclusive_ms"], strict=True))
    assert inc["Materialize"] == pytest.approx(0.5)
    assert inc["Result"] == pytest.approx(1.0)
    root = df[df["parent_id"].isna()].iloc[0]
    assert root["exclusive_ms"] == pytest.approx(20.0 - 2.0 - 0.5 - 1.0)


def test_node_times_timing_false_and_never_executed():
    df = ta.node_times(_plan(timing=False))
    assert not df["timed"].any()
    assert df["inclusive_ms"].isna().all() and df["exclusive_ms"].isna().all()
    plan = [{"Plan": _node("Limit", 1.0, plans=[
        _node("Seq Scan", 0.0, loops=0, rows=0, **{"Parent Relationship": "Outer"})])}]
    df = ta.node_times(plan)
    assert df.loc[1, "inclusive_ms"] == 0.0 and df.loc[0, "exclusive_ms"] == 1.0


@pytest.mark.parametrize("bad", ["not json", [], [{"nope": 1}], [{"Plan": {}}, {"Plan": {}}],
                                 42])
def test_node_times_bad_input(bad):
    with pytest.raises(ta.TimingAccuracyError):
        ta.node_times(bad)


# ---------------------------------------------------------------------------
# synthetic collected tables


def _nodes_table(arms: dict[str, callable], reps: int = 7, workload: str = "join_sum",
                 modes=("analyze_timing",)) -> pd.DataFrame:
    """arm -> f(rep) returning plan kwargs; one node_times() per arm, mode and rep."""
    frames = []
    order = 0
    for rep in range(1, reps + 1):
        for arm, f in arms.items():
            for mode in modes:
                kw = f(rep) if mode == "analyze_timing" else {"timing": False}
                df = ta.node_times(_plan(**kw))
                df["workload"], df["arm"], df["preset"] = workload, arm, arm
                df["mode"], df["rep"], df["order"], df["run_id"] = mode, rep, order, "r"
                order += 1
                frames.append(df)
    return ta.validate_nodes(pd.concat(frames, ignore_index=True))


def _jitter(rep: int, scale: float = 1.0) -> dict:
    e = 1.0 + 0.01 * ((rep % 3) - 1)  # ±1 % run-to-run noise
    return {k: v * scale * e for k, v in
            {"agg": 10.0, "join": 9.0, "scan": 5.0, "hash_": 1.5, "inner": 1.0}.items()}


def test_compare_rows_detects_differences():
    nodes = _nodes_table({"vanilla": _jitter, "x": _jitter}, reps=2,
                         modes=("analyze_notiming", "analyze_timing"))
    assert ta.compare_rows(nodes, "vanilla").empty
    bad = nodes.copy()
    i = bad[(bad["arm"] == "x") & (bad["node_id"] == 2) & (bad["rep"] == 2)].index
    bad.loc[i, "rows"] = 999.0
    m = ta.compare_rows(bad, "vanilla")
    assert len(m) == len(i) and set(m["field"]) == {"rows"}
    assert set(m["got"]) == {999.0} and set(m["expected"]) == {1000.0}
    shape = nodes[~((nodes["arm"] == "x") & (nodes["node_id"] == 4) & (nodes["rep"] == 1))]
    m = ta.compare_rows(shape, "vanilla")
    assert "plan shape" in set(m["field"])
    with pytest.raises(ta.TimingAccuracyError, match="baseline"):
        ta.compare_rows(nodes, "nope")


def _other_version_plan(rep: int) -> list:
    """join_sum's plan with the Hash side replaced: Aggregate -> Hash Join -> (Seq Scan,
    Index Only Scan), 4 nodes, as another PostgreSQL version's planner might choose."""
    j = _jitter(rep, 0.5)
    plan = _node("Aggregate", j["agg"], plans=[
        _node("Hash Join", j["join"], rows=100, plans=[
            _node("Seq Scan", j["scan"], rows=1000, **{"Parent Relationship": "Outer"}),
            _node("Index Only Scan", 0.3, rows=100, **{"Parent Relationship": "Inner"})],
            **{"Parent Relationship": "Outer"})])
    return [{"Plan": plan, "Planning Time": 0.1, "Execution Time": j["agg"]}]


def _with_other_version(nodes: pd.DataFrame, arm: str, reps: int = 7) -> pd.DataFrame:
    frames = [nodes]
    for rep in range(1, reps + 1):
        for mode in ("analyze_notiming", "analyze_timing"):
            df = ta.node_times(_other_version_plan(rep))
            df["workload"], df["arm"], df["preset"] = "join_sum", arm, arm
            df["mode"], df["rep"], df["order"], df["run_id"] = mode, rep, 1000 + rep, "r"
            frames.append(df)
    return ta.validate_nodes(pd.concat(frames, ignore_index=True))


def test_node_paths_place_in_plan():
    nodes = _nodes_table({"vanilla": _jitter}, reps=1, modes=("analyze_timing",))
    paths = ta.node_paths(nodes).tolist()
    assert paths == ["0:Aggregate", "0:Aggregate/0:Hash Join",
                     "0:Aggregate/0:Hash Join/0:Seq Scan", "0:Aggregate/0:Hash Join/1:Hash",
                     "0:Aggregate/0:Hash Join/1:Hash/0:Seq Scan"]
    assert ta.node_paths(nodes.iloc[:0]).empty


def test_other_version_compared_on_the_common_part_of_the_plan():
    nodes = _nodes_table({"vanilla": _jitter, "x": _jitter}, reps=7,
                         modes=("analyze_notiming", "analyze_timing"))
    both = _with_other_version(nodes, "v19")
    # against the baseline, the other planner's plan is a shape mismatch ...
    m = ta.compare_rows(both, "vanilla")
    assert set(m["arm"]) == {"v19"} and set(m["field"]) == {"plan shape"}
    # ... against a reference of its own version it is not, and x still is checked
    assert ta.compare_rows(both, "vanilla", {"v19": "v19", "x": "vanilla"}).empty
    acc = ta.node_accuracy(both, "vanilla")
    inc = acc[(acc["arm"] == "v19") & (acc["metric"] == ta.INCLUSIVE)].set_index("node_id")
    # Aggregate, Hash Join, the outer Seq Scan match; the Index Only Scan has no
    # counterpart (the baseline has a Hash there) and is left out
    assert inc.index.tolist() == [0, 1, 2]
    assert inc["ratio"].tolist() == pytest.approx([0.5] * 3)
    assert len(acc[acc["arm"] == "x"]) == 2 * 5


def test_cost_against_another_arms_plain():
    # "slow" slows its own plain query by 25 %: against its own plain, TIMING TRUE
    # costs 20 %; against vanilla's plain 50 %
    t = _timings({"vanilla": (8.0, 10.0, 16.0), "slow": (10.0, 11.0, 12.0)})
    c = ta.cost_vs_plain_of(t, {"vanilla": "vanilla", "slow": "vanilla"},
                            n_resamples=199).set_index("arm")
    assert c.loc["slow", "plain_of"] == "vanilla"
    assert c.loc["slow", "plain_of_ms"] == pytest.approx(8.0)
    assert c.loc["slow", "timing_vs_plain_of_pct"] == pytest.approx(50.0)
    assert c.loc["slow", "notiming_vs_plain_of_pct"] == pytest.approx(37.5)
    assert c.loc["slow", "timing_vs_plain_of_ci_low"] <= 50.0 <= \
        c.loc["slow", "timing_vs_plain_of_ci_high"]
    assert c.loc["vanilla", "timing_vs_plain_of_pct"] == pytest.approx(100.0)
    own = ta.cost_table(t, "vanilla", n_resamples=199).set_index("arm")
    assert own.loc["slow", "overhead_timing_pct"] == pytest.approx(20.0)
    assert ta.cost_vs_plain_of(t, {"slow": "nope"}).empty


def test_arm_versions_and_references():
    from profkit.experiments.timing_accuracy import (
        arm_versions,
        vanilla_plain_of,
        version_references,
    )

    prov = {"source": {"version": "18.6"},
            "build_versions": {"vanilla": "18.6", "tsc_clock": "18.6",
                               "pg19/vanilla": "19beta1", "pg19/fast_timing": "19beta1"},
            "arms": [{"label": "vanilla", "preset": "vanilla", "settings": {}},
                     {"label": "tsc_clock", "preset": "tsc_clock", "settings": {}},
                     {"label": "pg19sys", "preset": "pg19/vanilla",
                      "settings": {"timing_clock_source": "system"}},
                     {"label": "pg19tsc", "preset": "pg19/vanilla",
                      "settings": {"timing_clock_source": "tsc"}},
                     {"label": "fast", "preset": "pg19/fast_timing", "settings": {}}]}
    v = arm_versions(prov)
    assert v == {"vanilla": "18.6", "tsc_clock": "18.6", "pg19sys": "19beta1",
                 "pg19tsc": "19beta1", "fast": "19beta1"}
    refs = version_references(prov, "pg19tsc")
    assert refs == {"vanilla": "vanilla", "tsc_clock": "vanilla", "pg19sys": "pg19tsc",
                    "pg19tsc": "pg19tsc", "fast": "pg19tsc"}
    assert version_references(prov, "vanilla")["fast"] == "pg19sys"
    assert vanilla_plain_of(prov) == {"vanilla": "vanilla", "tsc_clock": "vanilla",
                                      "pg19sys": "pg19sys", "pg19tsc": "pg19sys",
                                      "fast": "pg19sys"}
    # an old run without build_versions: every arm has the run's one source
    old = {"source": {"version": "18.6"}, "arms": prov["arms"][:2]}
    assert arm_versions(old) == {"vanilla": "18.6", "tsc_clock": "18.6"}


def test_node_accuracy_values():
    nodes = _nodes_table({"vanilla": _jitter, "half": lambda r: _jitter(r, 0.5)})
    acc = ta.node_accuracy(nodes, "vanilla")
    assert set(acc["arm"]) == {"half"}
    inc = acc[acc["metric"] == ta.INCLUSIVE].set_index("node_id")
    assert inc["ratio"].tolist() == pytest.approx([0.5] * 5)
    assert inc.loc[2, "base_median_ms"] == pytest.approx(5.0)
    assert inc.loc[2, "abs_diff_ms"] == pytest.approx(-2.5)
    assert inc["rel_err_pct"].tolist() == pytest.approx([-50.0] * 5)
    assert (inc["n"] == 7).all()
    # per-repetition ratios are paired: every one is exactly 0.5
    assert inc["ratio_q25"].tolist() == pytest.approx([0.5] * 5)


def _timings(arms: dict[str, tuple[float, float, float]], reps: int = 7,
             workload: str = "join_sum", gap: float = 0.2,
             explain: dict[str, float] | None = None) -> pd.DataFrame:
    """arm -> (plain, notiming, timing) ms; server_ms = EXPLAIN's time + gap."""
    rows, order = [], 0
    for rep in range(1, reps + 1):
        e = 1.0 + 0.01 * ((rep % 3) - 1)
        for arm, (p, n, t) in arms.items():
            for mode, v in (("plain", p), ("analyze_notiming", n), ("analyze_timing", t)):
                ex = (explain or {}).get(arm, v) if mode == "analyze_timing" else v
                rows.append({"run_id": "r", "build": arm, "workload": workload, "query": mode,
                             "mode": mode, "rep": rep, "order": order,
                             "client_ms": v * e + 1, "server_ms": (v + gap) * e,
                             "cpu_ms": v * e, "wait_ms": 0.0,
                             "explain_ms": math.nan if mode == "plain" else ex * e})
                order += 1
    return pd.DataFrame(rows)


def _calibrated(t: pd.DataFrame, slow: dict[tuple[str, str, int], float]) -> pd.DataFrame:
    """*t* with vCPU calibrations: 3.0 ms (±1 %), and *slow* (arm, mode, rep) -> ms."""
    before = [slow.get((r.build, r.mode, r.rep), 3.0 * (1 + 0.01 * ((r.order % 3) - 1)))
              for r in t.itertuples()]
    return t.assign(calib_before_ms=before, calib_after_ms=3.0)


def test_the_vcpu_rule_leaves_out_slow_executions_and_their_plans():
    t = _calibrated(_timings({"vanilla": (8.0, 10.0, 16.0), "fast": (8.0, 10.0, 9.0)}),
                    {("fast", "analyze_timing", 3): 4.5, ("vanilla", "plain", 5): 3.6})
    nodes = _nodes_table({"vanilla": _jitter, "fast": _jitter},
                         modes=("analyze_notiming", "analyze_timing"))
    marked, kept, kept_nodes, note, metric = apply_vcpu_rule(t, nodes)
    assert metric == "cpu_kept_ms" and len(marked) == len(t) == 42 and len(kept) == 40
    out = marked[marked["calib_slow"]][["build", "mode", "rep"]].values.tolist()
    assert out == [["fast", "analyze_timing", 3], ["vanilla", "plain", 5]]
    assert marked["cpu_kept_ms"].isna().sum() == 2 and "calib_slow" not in kept
    # fast's TIMING TRUE plan of repetition 3 goes with its execution; the others stay
    gone = nodes[(nodes["arm"] == "fast") & (nodes["mode"] == "analyze_timing")
                 & (nodes["rep"] == 3)]
    assert len(gone) == 5 and len(kept_nodes) == len(nodes) - 5
    assert note.startswith("vCPU calibration: median 3.000 ms") and \
        "2 of 42 executions rejected; the rejected executions are left out" in note
    # the cost tables pair on the repetitions both modes kept
    cost = ta.cost_table(kept, "vanilla", metric=metric, n_resamples=199,
                         pair="common").set_index("arm")
    assert cost.loc["fast", "timing_n"] == 6 and cost.loc["vanilla", "plain_n"] == 6
    assert cost.loc["fast", "overhead_timing_pct"] == pytest.approx(12.5)
    # a rule that would leave a cell without an execution is not applied, and says so
    t2 = _calibrated(_timings({"vanilla": (8.0, 10.0, 16.0)}, reps=3),
                     {("vanilla", "plain", r): 4.5 for r in (1, 2, 3)})
    marked, kept, kept_nodes, note, metric = apply_vcpu_rule(t2, nodes)
    assert metric == "cpu_ms" and len(kept) == len(marked) == 9 and kept_nodes is nodes
    assert "NOT applied: it would leave join_sum vanilla plain without an execution" in note
    # timings without calibrations: nothing to apply
    plain = _timings({"vanilla": (8.0, 10.0, 16.0)})
    assert apply_vcpu_rule(plain, nodes)[3:] == ("", "cpu_ms")


def test_cost_and_truth_tables():
    t = _timings({"vanilla": (8.0, 10.0, 16.0), "fast": (8.0, 10.0, 9.0)})
    cost = ta.cost_table(t, "vanilla", n_resamples=199).set_index("arm")
    assert cost.loc["vanilla", "overhead_timing_pct"] == pytest.approx(100.0)
    assert cost.loc["fast", "overhead_timing_pct"] == pytest.approx(12.5)
    assert cost.loc["fast", "overhead_notiming_pct"] == pytest.approx(25.0)
    assert cost.loc["fast", "timing_saved_pp"] == pytest.approx(87.5)
    wall = ta.cost_table(t, "vanilla", metric="server_ms", n_resamples=199).set_index("arm")
    assert wall.loc["vanilla", "overhead_timing_pct"] == pytest.approx(16.2 / 8.2 * 100 - 100)

    nodes = _nodes_table({"vanilla": lambda r: {"agg": 16.0}, "fast": lambda r: {"agg": 9.0}})
    tr = ta.truth_table(t, nodes, "vanilla").set_index("arm")
    # truth = plain wall (8.2, median) - non-exec (0.2) = 8.0
    assert tr.loc["vanilla", "truth_ms"] == pytest.approx(8.0)
    assert tr.loc["vanilla", "root_vs_truth_pct"] == pytest.approx(100.0)
    assert tr.loc["fast", "root_vs_truth_pct"] == pytest.approx(12.5)
    assert tr.loc["fast", "clock_err_pct"] == pytest.approx(0.0, abs=1e-9)


def test_truth_table_flags_a_wrong_clock():
    # the arm's EXPLAIN says 20 ms where the wall clock saw 16.2: +25 %
    t = _timings({"vanilla": (8.0, 10.0, 16.0), "bad": (8.0, 10.0, 16.0)},
                 explain={"bad": 20.0})
    nodes = _nodes_table({"vanilla": lambda r: {"agg": 16.0}, "bad": lambda r: {"agg": 20.0}})
    tr = ta.truth_table(t, nodes, "vanilla").set_index("arm")
    assert tr.loc["bad", "clock_gap_ms"] == pytest.approx(-4.0, abs=0.05)
    assert tr.loc["bad", "clock_err_pct"] == pytest.approx(20.0, abs=0.5)


def test_tick_grid():
    nodes = pd.DataFrame({"inclusive_ms": [0.0, 4.0, 8.000001, 12.3, 65.0, 66.0],
                          "loops": [1, 1, 1, 1, 2500, 1]})
    g = ta.tick_grid(nodes, 4.0)
    assert g["ticks"].tolist() == [0, 1, 2, 3, 16, 16]
    # 65.0 over 2500 loops: per-loop rounding (0.5 us x 2500 = 1.25 ms) covers it
    assert g["on_grid"].tolist() == [True, True, True, False, True, False]
    with pytest.raises(ta.TimingAccuracyError):
        ta.tick_grid(nodes, 0)


def _verdict(arms, t_arms, reps=7, **kw):
    nodes = _nodes_table(arms, reps=reps)
    acc = ta.node_accuracy(nodes, "vanilla")
    timings = _timings(t_arms, reps=reps, explain=kw.pop("explain", None))
    truth = ta.truth_table(timings, nodes, "vanilla")
    cost = ta.cost_table(timings, "vanilla", n_resamples=199)
    return ta.verdicts(acc, truth, cost, "vanilla", **kw).set_index("arm")


def test_verdict_agrees_for_an_identical_arm():
    v = _verdict({"vanilla": _jitter, "same": _jitter},
                 {"vanilla": (8, 10, 16), "same": (8, 10, 16)})
    assert v.loc["same", "verdict"] == "agrees"
    assert v.loc["same", "max_err_pct"] == pytest.approx(0.0, abs=1e-9)
    assert v.loc["same", "text"].startswith("agrees within 0.0% with vanilla")


def test_verdict_lower_when_a_cheaper_clock_removes_overhead():
    # every node 30 % lower, the total closer to the plain query, the clock agrees
    v = _verdict({"vanilla": _jitter, "cheap": lambda r: _jitter(r, 0.7)},
                 {"vanilla": (5.0, 6.0, 10.0), "cheap": (5.0, 6.0, 7.0)})
    # only "lower": the verdict has no yardstick without clock reads to say "closer"
    assert v.loc["cheap", "verdict"] == "lower"
    assert v.loc["cheap", "max_err_pct"] == pytest.approx(30.0)


def test_verdict_wrong_for_a_quantised_clock():
    # a 4 ms tick: long nodes alternate between 4 and 12 (median right, runs wrong),
    # short ones read 0
    def coarse(rep):
        hi = rep % 2 == 0
        return {"agg": 12.0 if hi else 8.0, "join": 12.0 if hi else 8.0,
                "scan": 8.0 if hi else 4.0, "hash_": 0.0, "inner": 0.0}

    v = _verdict({"vanilla": _jitter, "coarse": coarse},
                 {"vanilla": (8, 10, 16), "coarse": (8, 10, 11)}, tick_ms={"coarse": 4.0})
    r = v.loc["coarse"]
    assert r["verdict"] == "wrong"
    assert r["short_read_zero"] == 2
    assert "clock tick 4 ms" in r["text"]
    assert r["nodes_scatter"] + r["nodes_outside"] >= 1


def test_verdict_names_the_spread_in_ms_where_every_median_reads_0():
    # a clock whose tick is longer than the query: 6 of 7 runs read 0 on every node,
    # one reads a tick's worth.  Every long node is "outside" (its quartiles are 0) and
    # scatters beyond the band, but its spread has no percentage (a median of 0): the
    # verdict names the widest by ms (a fresh-clone make test crashed here on idxmax)
    def ticked(rep):
        return _jitter(rep) if rep == 7 else {k: 0.0 for k in
                                              ("agg", "join", "scan", "hash_", "inner")}

    v = _verdict({"vanilla": _jitter, "ticked": ticked},
                 {"vanilla": (8, 10, 16), "ticked": (8, 10, 11)})
    r = v.loc["ticked"]
    # 5 inclusive times and 4 own times of >= 1 ms in vanilla, each read 0 in most runs
    assert r["verdict"] == "wrong" and r["nodes_scatter"] == 0 and r["nodes_outside"] == 9
    # Aggregate: |run - 0| over [0 x 6, 10.0] -> p90 = 0.4 x 10 ms
    assert ("single runs scatter by ±4.000 ms (p90) around their median on 9 long node "
            "time(s) (node 0 Aggregate)") in r["text"]


def test_verdict_wrong_when_children_outgrow_their_parent():
    # a sampled estimate whose leaf is inflated (its timed calls carry the clock reads)
    # while the parent's single timed call is exact: the join's own time goes negative
    def sampled(rep):
        return {"agg": 6.0, "join": 5.9, "scan": 7.0, "hash_": 0.5, "inner": 0.4}

    v = _verdict({"vanilla": _jitter, "sampled": sampled, "cheap": lambda r: _jitter(r, 0.6)},
                 {"vanilla": (5.0, 6.0, 10.0), "sampled": (5.0, 6.0, 6.0),
                  "cheap": (5.0, 6.0, 6.0)})
    r = v.loc["sampled"]
    assert r["verdict"] == "wrong" and r["negative_own"] == 1
    assert "negative own time" in r["text"] and "node 1 Hash Join" in r["text"]
    # against a second yardstick the text says how far each arm is from it
    nodes = _nodes_table({"vanilla": _jitter, "sampled": sampled,
                          "cheap": lambda r: _jitter(r, 0.6)})
    acc = ta.node_accuracy(nodes, "vanilla")
    timings = _timings({"vanilla": (5.0, 6.0, 10.0), "sampled": (5.0, 6.0, 6.0),
                        "cheap": (5.0, 6.0, 6.0)})
    ref = ("cheap", ta.node_accuracy(nodes, "cheap"))
    v2 = ta.verdicts(acc, ta.truth_table(timings, nodes, "vanilla"),
                     ta.cost_table(timings, "vanilla", n_resamples=199), "vanilla",
                     reference=ref).set_index("arm")
    # sampled scan 7.0 vs cheap 3.0: +133 %
    assert v2.loc["sampled", "ref_worst_err_pct"] == pytest.approx(7.0 / 3.0 * 100 - 100)
    assert math.isnan(v2.loc["cheap", "ref_median_err_pct"])
    assert "against cheap" in v2.loc["sampled", "text"]


def test_verdict_inconclusive_with_too_few_repetitions():
    v = _verdict({"vanilla": _jitter, "x": lambda r: _jitter(r, 1.5)},
                 {"vanilla": (8, 10, 16), "x": (8, 10, 16)}, reps=3)
    assert v.loc["x", "verdict"] == "inconclusive (noise)"


def test_verdicts_and_report_on_empty_input():
    empty = ta.node_accuracy(_nodes_table({"vanilla": _jitter}, reps=1).iloc[0:0], "vanilla")
    assert empty.empty
    assert ta.verdicts(empty, pd.DataFrame(), pd.DataFrame(), "vanilla").empty
    md = render_timing_accuracy.timing_accuracy_report(title="t", facts={"a": 1}, verdict_df=pd.DataFrame(
        columns=["workload", "arm", "verdict", "text", "short_max_abs_ms"]),
        cost=pd.DataFrame(), truth=pd.DataFrame(), accuracy=empty,
        mismatches=pd.DataFrame(), grid={}, baseline="vanilla")
    assert md.startswith("# t") and "_(no rows)_" in md


# ---------------------------------------------------------------------------
# arms


def test_parse_arm_forms_and_errors():
    assert parse_arm("tsc_clock") == Arm("tsc_clock", "tsc_clock")
    assert parse_arm("t=tsc_clock") == Arm("t", "tsc_clock")
    assert parse_arm("s1=sampled_timing:explain_timing_sample_rate=1,work_mem=8MB") == Arm(
        "s1", "sampled_timing", (("explain_timing_sample_rate", "1"), ("work_mem", "8MB")))
    for bad in ("", "=x", "a b=vanilla", "x=vanilla:nosetting", "x=vanilla:a='1'"):
        with pytest.raises(TimingAccuracyError):
            parse_arm(bad)
    with pytest.raises(TimingAccuracyError, match="baseline"):
        check_arms(["tsc_clock", "coarse_clock"], "vanilla")
    with pytest.raises(TimingAccuracyError, match="twice"):
        check_arms(["vanilla", "x=vanilla", "x=tsc_clock"], "vanilla")
    with pytest.raises(TimingAccuracyError, match="unknown build preset"):
        check_arms(["vanilla", "nosuchpreset"], "vanilla")
    with pytest.raises(TimingAccuracyError, match="add a variant"):
        check_arms(["vanilla"], "vanilla")
    # labels the run's CSV files would read back as missing values
    for word in ("null", "NA", "nan", "None"):
        with pytest.raises(TimingAccuracyError, match="missing value"):
            parse_arm(f"{word}=vanilla")
    # PostgreSQL 19 presets, with a session setting
    assert parse_arm("p=pg19/vanilla:timing_clock_source=tsc") == Arm(
        "p", "pg19/vanilla", (("timing_clock_source", "tsc"),))
    assert [(a.label, a.preset) for a in check_arms(["vanilla", "pg19/fast_timing"],
                                                    "vanilla")] == [
        ("vanilla", "vanilla"), ("pg19-fast_timing", "pg19/fast_timing")]
    # a bare pg19/ preset as the baseline is its label
    assert len(check_arms(["pg19/vanilla", "pg19/fast_timing"], "pg19/vanilla")) == 2


def test_analyze_run_from_files(tmp_path):
    """The analysis reads only the run directory (no PostgreSQL)."""
    from profkit.experiments.timing_accuracy import PLANS_JSONL, TIMINGS_COLUMNS, TIMINGS_CSV

    t = _timings({"vanilla": (8.0, 10.0, 16.0), "fast": (8.0, 10.0, 9.0)})
    for c in TIMINGS_COLUMNS:
        if c not in t:
            t[c] = "" if c in ("preset", "settings") else 0
    t[list(TIMINGS_COLUMNS)].to_csv(tmp_path / TIMINGS_CSV, index=False)
    with open(tmp_path / PLANS_JSONL, "w") as f:
        for r in t[t["mode"] != "plain"].itertuples():
            scale = 1.0 if r.build == "vanilla" else 9.0 / 16.0
            kw = _jitter(r.rep, scale) if r.mode == "analyze_timing" else {"timing": False}
            f.write(json.dumps({"workload": r.workload, "arm": r.build, "preset": r.build,
                                "mode": r.mode, "rep": r.rep, "order": r.order,
                                "plan": _plan(**kw)}) + "\n")
        f.write('{"truncated": \n')  # a run killed mid-write: skipped
    (tmp_path / "provenance.json").write_text(json.dumps(
        {"run_id": "synthetic", "baseline": "vanilla", "status": "complete",
         "tick_arms": {"fast": 4.0}}))
    res = analyze_run(tmp_path)
    for f in ("report.md", "nodes.parquet", "accuracy.csv", "cost.csv", "truth.csv",
              "verdicts.csv", "summary.csv", "mismatches.csv", "cost_vs_vanilla.csv"):
        assert (tmp_path / f).exists(), f
    assert res.mismatches.empty
    assert len(res.nodes) == 2 * 2 * 7 * 5
    assert set(res.verdicts["arm"]) == {"fast"}
    assert "fast" in res.grid
    text = res.report_md.read_text()
    assert "| join_sum | fast |" in text and "Same answers" in text
    assert "<table" in res._repr_html_()


def test_analyze_run_refuses_a_foreign_directory(tmp_path):
    from profkit.errors import ProfkitError

    with pytest.raises(ProfkitError):
        analyze_run(tmp_path)


# ---------------------------------------------------------------------------
# bias table (sampled_timing's yardsticks)


# InstrStartNode calls of _plan(): Aggregate 1 row + 1 loop + 1 shutdown, Hash Join
# 100 + 2, outer Seq Scan 1000 + 2, Hash (MultiExec) 1 loop + 1 shutdown, inner Seq Scan
# 100 + 2
_CALLS = [3.0, 102.0, 1002.0, 2.0, 102.0]


def test_instr_calls_and_corrected_times():
    df = ta.node_times(_plan())
    assert ta.instr_calls_per_node(df).tolist() == _CALLS
    # 1 us per read: own calls x 1 read + descendants' calls x 2 reads
    c = ta.corrected_times(df, 1000.0)
    assert c["reads_in_window"].tolist() == [3 + 2 * 1208, 102 + 2 * 1106, 1002, 2 + 2 * 102, 102]
    assert c["inclusive_ms"].tolist() == pytest.approx([10 - 2.419, 9 - 2.314, 5 - 1.002,
                                                        1.5 - 0.206, 1 - 0.102])
    # exclusive recomputed from the corrected inclusive times
    assert c.loc[1, "exclusive_ms"] == pytest.approx((9 - 2.314) - (5 - 1.002) - (1.5 - 0.206))
    # a cost larger than a node's time floors it at 0, never negative
    assert (ta.corrected_times(df, 1e6)["inclusive_ms"] == 0).all()
    with pytest.raises(ta.TimingAccuracyError, match="ns_per_read"):
        ta.corrected_times(df, -1.0)


def test_in_situ_read_ns():
    t = _timings({"vanilla": (8.0, 10.0, 16.0)})
    nodes = _nodes_table({"vanilla": _jitter}, modes=("analyze_timing", "analyze_notiming"))
    got = ta.in_situ_read_ns(t, nodes, "vanilla")
    # (16 - 10) ms over 2 reads per InstrStartNode call of the plan
    assert got == {"join_sum": pytest.approx(6e6 / (2 * sum(_CALLS)))}


def test_bias_table_signed_mean_error():
    def low(rep):  # 10 % under vanilla on every node, same jitter
        return {k: v * 0.9 for k, v in _jitter(rep).items()}

    def rare(rep):  # an estimator right on average, wrong in most runs: 0 or 7x
        kw = _jitter(rep)
        return {**kw, "scan": 0.0 if rep != 7 else kw["scan"] * 7}

    nodes = _nodes_table({"vanilla": _jitter, "low": low, "rare": rare})
    b = ta.bias_table(nodes, ["low", "rare"], ["vanilla"])
    inc = b[(b["metric"] == ta.INCLUSIVE) & (b["arm"] == "low")]
    assert len(inc) == 5 and inc["bias_pct"].round(9).eq(-10.0).all()
    assert b[(b["metric"] == ta.EXCLUSIVE) & (b["arm"] == "low")]["bias_pct"].round(9).eq(-10.0).all()
    # the mean, not the median: 6 runs at 0 and one at 7x the scan's 5 ms average to it
    r = b[(b["arm"] == "rare") & (b["node_type"] == "Seq Scan") & (b["node_id"] == 2)
          & (b["metric"] == ta.INCLUSIVE)].iloc[0]
    assert r["arm_mean_ms"] == pytest.approx(5.0 * 1.0)  # rep 7's jitter is 1.0
    assert abs(r["bias_pct"]) < 1.0 and r["se_pct"] > 50 and r["sd_run_pct"] > 200
    md = ta.bias_markdown(b)
    assert "| join_sum | 2 Seq Scan |" in md and "low vs vanilla" in md and "-10.0%" in md


def test_bias_table_against_vanilla_minus_its_reads():
    ns = 500.0
    van = ta.node_times(_plan())
    corr = ta.corrected_times(van, ns)
    exact = dict(zip(["agg", "join", "scan", "hash_", "inner"], corr["inclusive_ms"], strict=True))
    nodes = _nodes_table({"vanilla": lambda rep: {}, "est": lambda rep: exact}, reps=3)
    b = ta.bias_table(nodes, ["est"], ["vanilla", ta.CORRECTED],
                      ns_per_read={"join_sum": ns})
    c = b[b["yardstick"] == ta.CORRECTED]
    assert len(c) == 10 and c["bias_pct"].abs().max() < 1e-6
    v = b[(b["yardstick"] == "vanilla") & (b["metric"] == ta.INCLUSIVE)].set_index("node_id")
    assert v.loc[0, "bias_pct"] == pytest.approx((10 - 2.419 * 0.5) / 10 * 100 - 100)
    # without a cost for the workload the corrected yardstick is left out, not guessed
    assert set(ta.bias_table(nodes, ["est"], ["vanilla", ta.CORRECTED])["yardstick"]) == {"vanilla"}
    # a further corrected yardstick from another arm (a same-cluster twin), its own cost
    b2 = ta.bias_table(nodes, ["est"], ["corrected:vanilla2"],
                       more_corrected={"corrected:vanilla2": ("vanilla", {"join_sum": ns / 2})})
    inc = b2[b2["metric"] == ta.INCLUSIVE].set_index("node_id")
    assert set(b2["yardstick"]) == {"corrected:vanilla2"}
    assert inc.loc[0, "yard_mean_ms"] == pytest.approx(10 - 2.419 / 4)


def test_plain_suspects_from_the_cost_table():
    """The cost row of a warm make test's run (vanilla's plain query read at 10.2 ms of
    CPU in every repetition, its TIMING FALSE at 5.6 and TRUE at 9.3): both modes
    faster than plain, TIMING FALSE beyond noise; the other arms' rows say nothing."""
    cost = pd.DataFrame([
        {"workload": "join_sum", "arm": "vanilla", "overhead_notiming_pct": -44.76,
         "overhead_notiming_ci_low": -46.07, "overhead_notiming_ci_high": -43.43,
         "overhead_timing_pct": -6.49, "overhead_timing_ci_low": -10.02,
         "overhead_timing_ci_high": -2.08},
        {"workload": "join_sum", "arm": "tsc_clock", "overhead_notiming_pct": -0.61,
         "overhead_notiming_ci_low": -4.78, "overhead_notiming_ci_high": 17.21,
         "overhead_timing_pct": 38.1, "overhead_timing_ci_low": 28.0,
         "overhead_timing_ci_high": 48.2}])
    odd = ta.plain_suspects(cost)
    assert len(odd) == 1 and odd[0].startswith(
        "join_sum / vanilla: analyze_notiming ran 44.8 % faster than the plain query "
        "[95 % interval -46.1, -43.4 %]"), odd
    assert ta.plain_suspects(cost.iloc[1:]) == []


# ---------------------------------------------------------------------------
# real builds


VARIANTS = ("coarse_clock", "tsc_clock", "sampled_timing")


@pytest.fixture(scope="module")
def variant_run(vanilla_build, tmp_path_factory):
    from profkit.experiments.timing_accuracy import run_timing_accuracy

    # every variant runs: conftest builds them before the session (builds marker)
    cached = list(VARIANTS)
    arms = ["vanilla", *cached, "sampled_timing_n1=sampled_timing:explain_timing_sample_rate=1"]
    out = tmp_path_factory.mktemp("timing_accuracy") / "run"
    # 5 repetitions, not 3: with 3, one alone-phase run read tsc_clock's Seq Scan at 1.65x
    # vanilla's median (8 runs of this test on the idle machine after it: all in range)
    res = run_timing_accuracy(arms, {"join_sum": 0.1}, reps=5, warmup=1, out_dir=out,
                              seed=1, clock_cost=False)
    return cached, res


@pytest.mark.pg
@pytest.mark.builds(*VARIANTS)
def test_real_run_same_rows_and_files(variant_run):
    cached, res = variant_run
    assert res.mismatches.empty, res.mismatches.head()
    n = res.nodes
    ref = n[(n["arm"] == "vanilla") & (n["rep"] == 1) & (n["mode"] == "analyze_notiming")]
    ref = ref.set_index("node_id")[["node_type", "rows", "loops"]]
    assert list(ref["node_type"]) == ["Aggregate", "Hash Join", "Seq Scan", "Hash", "Seq Scan"]
    assert ref.loc[2, "rows"] == 100_000 and ref.loc[4, "rows"] == 100
    for (arm, mode, rep), g in n.groupby(["arm", "mode", "rep"]):
        got = g.set_index("node_id")[["node_type", "rows", "loops"]]
        pd.testing.assert_frame_equal(got, ref, check_names=False, obj=f"{arm} {mode} {rep}")
    timed = n[n["mode"] == "analyze_timing"]
    assert (timed["inclusive_ms"] >= 0).all() and (timed["startup_ms"] >= 0).all()
    assert n[n["mode"] == "analyze_notiming"]["inclusive_ms"].isna().all()
    t = res.timings
    assert (t["cpu_ms"] > 0).all() and (t["server_ms"] > 0).all()
    assert set(t["build"]) >= {"vanilla", *cached}
    # what disturbed each execution's backend, as bench records it: counts, never negative
    for c in ("minflt", "majflt", "vol_cs", "invol_cs", "migrations"):
        assert t[c].notna().all() and (t[c] >= 0).all(), (c, t[c].describe())
    for f in ("report.md", "nodes.parquet", "timings.csv", "plans.jsonl", "provenance.json"):
        assert (res.run_dir / f).exists()
    prov = json.loads((res.run_dir / "provenance.json").read_text())
    assert prov["status"] == "complete" and prov["executions"] == len(t)
    assert {a["label"] for a in prov["arms"]} == set(t["build"])
    # the measured backends ran at nice -20 (as root) so the numbers are not scheduling noise
    assert prov["backend_nice"] == (-20 if os.geteuid() == 0 else None)
    # ... and pinned: every execution's counters were read from a backend on that CPU
    if prov.get("pin_cpu") is not None:
        assert (t["last_cpu"] == prov["pin_cpu"]).all(), t["last_cpu"].value_counts()
    # TIMING TRUE costs more than the plain query on vanilla (CPU time)
    c = res.cost.set_index("arm")
    # no arm's plain executions read slower than its EXPLAIN ANALYZE beyond noise (one
    # warm make test's did: vanilla's plain at twice its CPU time, cause not found); the
    # run says so itself, in the report's facts and on the console
    assert not res.suspects, res.suspects
    assert c.loc["vanilla", "overhead_timing_pct"] > 10
    # pinned and calibrated as profkit bench is: the executions the slow-vCPU rule
    # rejects are marked and left out of the tables; a cell left with fewer than 3 of
    # its 5 got extra repetitions of every cell (at most 5)
    assert prov["pin_cpu"] == default_pin_cpu() and prov["vcpu_calibration"]["loops"] > 0
    extra = prov["extra_repetitions"]
    assert extra["min_kept"] == 3 and 0 <= extra["extra_reps"] <= 5, extra
    assert set(t["rep"]) == set(range(1, 6 + extra["extra_reps"]))
    if "NOT applied" in res.vcpu_note:  # the rule would have emptied a cell
        assert extra["extra_reps"] == 5 and (c["metric"] == "cpu_ms").all(), res.vcpu_note
    else:
        assert (t["cpu_kept_ms"].isna() == t["calib_slow"]).all()
        assert (c["metric"] == "cpu_kept_ms").all()
        kept = t[~t["calib_slow"]].groupby(["build", "mode"]).size()
        for arm in c.index:
            assert c.loc[arm, "plain_n"] == kept[(arm, "plain")], (arm, kept)
            assert c.loc[arm, "timing_n"] == kept[(arm, "analyze_timing")], (arm, kept)
        if not extra["short_after_extra"]:
            assert kept.min() >= 3, kept
    assert re.match(rf"vCPU calibration: median [\d.]+ ms .* of {len(t)} executions rejected",
                    res.vcpu_note), res.vcpu_note


@pytest.mark.pg
@pytest.mark.builds(*VARIANTS)
def test_real_tsc_clock_agrees_with_vanilla(variant_run):
    cached, res = variant_run
    assert "tsc_clock" in cached
    shown = res.provenance["arm_settings_shown"]["tsc_clock"]["instr_clock_source"]
    assert shown.startswith("auto")  # "auto (rdtsc)" on an invariant TSC
    acc = res.accuracy
    long_ = acc[(acc["arm"] == "tsc_clock") & (acc["metric"] == ta.INCLUSIVE)
                & (acc["base_median_ms"] > 1.0)]
    assert len(long_) >= 3
    # the TSC removes clock overhead but must not invent or lose time
    assert long_["ratio"].between(0.4, 1.5).all(), long_[["node_type", "ratio"]]
    tr = res.truth.set_index("arm")
    # its Execution Time agrees with the backend's wall clock (calibration is right)
    assert abs(tr.loc["tsc_clock", "clock_err_pct"]) < 10


@pytest.mark.pg
@pytest.mark.builds(*VARIANTS)
def test_real_coarse_clock_is_tick_quantised(variant_run):
    cached, res = variant_run
    assert "coarse_clock" in cached
    tick_ms = time.clock_getres(CLOCK_MONOTONIC_COARSE) * 1000.0
    assert res.provenance["tick_arms"]["coarse_clock"] == pytest.approx(tick_ms)
    n = res.nodes
    c = n[(n["arm"] == "coarse_clock") & (n["mode"] == "analyze_timing")]
    # EXPLAIN prints e.g. "actual time=0.000..8.000": every startup and total time
    # (loops = 1 here) and the execution time is a whole number of ticks, to the printed
    # 1 us, but for a rare shift of the grid itself: once in an alone phase (kernel 6.18)
    # one execution read 7.033 ms for its Execution Time and its three timed nodes, the
    # next ones whole ticks again. So within an execution every time is a whole number of
    # ticks or off it by one common amount (two readings, one on each side of a shift),
    # and most executions are on the grid.
    t = res.timings[(res.timings["build"] == "coarse_clock") & (res.timings["mode"] != "plain")]
    ex = t[t["mode"] == "analyze_timing"].set_index("rep")["explain_ms"]

    def off_grid(ms):  # signed distance to the nearest whole tick
        return ms - np.round(ms / tick_ms) * tick_ms

    on_grid_executions = 0
    for rep, g in c.groupby("rep"):
        offs = [*off_grid(g["total_ms"]), *off_grid(g["startup_ms"]), off_grid(ex[rep])]
        shifted = [o for o in offs if abs(o) > 0.0015]
        assert not shifted or max(shifted) - min(shifted) <= 0.003, (rep, offs)
        on_grid_executions += not shifted
    # 5 repetitions and the extra ones the vCPU rule asked for
    reps = 5 + res.provenance["extra_repetitions"]["extra_reps"]
    assert on_grid_executions >= len(ex) - 2 and len(ex) == reps, (on_grid_executions, ex)
    # TIMING FALSE's Execution Time too: most of its executions on the grid
    nt = t.loc[t["mode"] == "analyze_notiming", "explain_ms"]
    assert len(nt) == reps and (np.abs(off_grid(nt)) <= 0.0015).sum() >= len(nt) - 2, nt
    g = res.grid["coarse_clock"]
    assert g["on_grid"].sum() >= len(g) - 2 * 5  # res.grid counts the same (5 nodes each)
    # the Hash over 100 rows takes microseconds: below the tick it reads 0 (or a tick)
    h = c[c["node_type"] == "Hash"]["inclusive_ms"]
    assert set(np.round(h / tick_ms)).issubset({0.0, 1.0})


@pytest.mark.pg
@pytest.mark.builds(*VARIANTS)
def test_real_sampled_timing_at_rate_1_is_vanilla(variant_run):
    """At rate 1 sampled_timing times every call as vanilla does: each node's inclusive
    time against vanilla's within 0.6-1.5, as the median of the ratios of the same
    repetition (the arms of one repetition run in a shuffled order, back to back).
    Not the ratio of the two medians: the host slows this VM for seconds at a time, and
    in a whole-suite run that ratio read 0.46-0.52 (vanilla's own scatter 36-40 %), where
    the same run on the idle machine right after read 0.98-1.00."""
    cached, res = variant_run
    assert "sampled_timing" in cached
    shown = res.provenance["arm_settings_shown"]
    assert shown["sampled_timing"]["explain_timing_sample_rate"] == "100"
    assert shown["sampled_timing_n1"]["explain_timing_sample_rate"] == "1"
    acc = res.accuracy
    n1 = acc[(acc["arm"] == "sampled_timing_n1") & (acc["metric"] == ta.INCLUSIVE)
             & (acc["base_median_ms"] > 1.0)]
    assert len(n1) >= 3
    n = res.nodes
    t = n[n["mode"] == "analyze_timing"].pivot_table(
        index=["node_id", "rep"], columns="arm", values="inclusive_ms")
    paired = (t["sampled_timing_n1"] / t["vanilla"]).groupby(level="node_id").median()
    long_ = paired.loc[sorted(int(i) for i in n1["node_id"])]
    assert len(long_) == len(n1) and long_.between(0.6, 1.5).all(), (
        long_.round(3).to_dict(), n1[["node_type", "ratio"]].round(3).to_dict("records"))
