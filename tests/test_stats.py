"""Statistics of the benchmark on synthetic timings whose answer is known."""
from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profkit.render import seed_figures
from profkit.analyze import stats
from profkit.render import bench_report
from profkit.errors import ComparisonError

ROOT = Path(__file__).resolve().parent.parent


def make_timings(
    overheads: dict[str, dict[str, float]],
    reps: int = 12,
    noise: float = 1.0,
    drift: float = 0.0,
    seed: int = 7,
    base_ms: float = 100.0,
) -> pd.DataFrame:
    """Interleaved timings: per rep, each build runs plain then each mode.

    ``overheads = {"vanilla": {"analyze_notiming": 30.0}}`` gives mode ≈ plain × 1.30.
    *drift* multiplies a whole repetition (all builds and modes) by a shared factor,
    like a noisy machine does.
    """
    rng = np.random.default_rng(seed)
    rows = []
    order = 0
    for rep in range(reps):
        f = 1.0 + rng.normal(0, drift) if drift else 1.0
        for build, modes in overheads.items():
            for mode, ov in {"plain": 0.0, **modes}.items():
                ms = base_ms * (1 + ov / 100) * f + rng.normal(0, noise)
                rows.append({"run_id": "r1", "build": build, "workload": "nested_loop",
                             "query": mode, "mode": mode, "rep": rep, "order": order,
                             "client_ms": ms + 0.5, "server_ms": ms})
                order += 1
    return pd.DataFrame(rows)


def test_overhead_and_ci_known_answer():
    t = make_timings({"vanilla": {"analyze_notiming": 30.0, "analyze_timing": 150.0}})
    s = stats.summarize(t)
    assert list(s.columns) == list(stats.SUMMARY_COLUMNS)
    row = s[(s.build == "vanilla") & (s["mode"] == "analyze_notiming")].iloc[0]
    assert row.n == 12
    assert row.paired  # same (run_id, rep) keys on both sides
    assert row.ci_method == "BCa"
    assert 29.0 < row.overhead_pct < 31.0
    assert row.ci_low_pct < 30.0 < row.ci_high_pct
    assert row.ci_low_pct <= row.overhead_pct <= row.ci_high_pct
    assert row.ci_high_pct - row.ci_low_pct < 4.0  # noise is 1 % of 100 ms
    timing = s[s["mode"] == "analyze_timing"].iloc[0]
    assert timing.ci_low_pct < 150.0 < timing.ci_high_pct
    plain = s[s["mode"] == "plain"].iloc[0]
    assert plain.overhead_pct == 0.0 and math.isnan(plain.ci_low_pct)


def test_mean_median_variance_match_numpy():
    t = make_timings({"vanilla": {"analyze_notiming": 20.0}}, reps=9, noise=3.0)
    s = stats.summarize(t, metric="client_ms")
    for mode in ("plain", "analyze_notiming"):
        vals = t.loc[t["mode"] == mode, "client_ms"].to_numpy()
        r = s[s["mode"] == mode].iloc[0]
        assert r.median_ms == pytest.approx(np.median(vals))
        assert r.mean_ms == pytest.approx(np.mean(vals))
        assert r.variance == pytest.approx(np.var(vals, ddof=1))  # sample variance, as the seed
        assert r.metric == "client_ms"
    r = s[s["mode"] == "analyze_notiming"].iloc[0]
    pv = t.loc[t["mode"] == "plain", "client_ms"]
    mv = t.loc[t["mode"] == "analyze_notiming", "client_ms"]
    assert r.overhead_mean_pct == pytest.approx((mv.mean() - pv.mean()) / pv.mean() * 100)
    assert r.overhead_median_pct == pytest.approx(
        (mv.median() - pv.median()) / pv.median() * 100)


def test_center_mean_uses_means():
    t = make_timings({"vanilla": {"analyze_notiming": 30.0}})
    s = stats.summarize(t, center="mean")
    r = s[s["mode"] == "analyze_notiming"].iloc[0]
    p = t[t["mode"] == "plain"].sort_values("rep")["server_ms"].to_numpy()
    m = t[t["mode"] == "analyze_notiming"].sort_values("rep")["server_ms"].to_numpy()
    assert r.overhead_pct == pytest.approx(np.mean((m - p) / p) * 100)  # paired: mean of ratios
    assert r.overhead_pct == pytest.approx(r.overhead_mean_pct, abs=0.2)
    assert r.ci_low_pct < r.overhead_pct < r.ci_high_pct


def test_paired_estimate_is_median_of_per_rep_overheads():
    t = make_timings({"vanilla": {"analyze_notiming": 30.0}}, reps=9, noise=2.0)
    r = stats.summarize(t).iloc[1]
    p = t[t["mode"] == "plain"].sort_values("rep")["server_ms"].to_numpy()
    m = t[t["mode"] == "analyze_notiming"].sort_values("rep")["server_ms"].to_numpy()
    assert r.paired
    assert r.overhead_pct == pytest.approx(np.median((m - p) / p) * 100)
    assert r.overhead_median_pct == pytest.approx(
        (np.median(m) - np.median(p)) / np.median(p) * 100)


def test_pairing_narrows_ci_under_shared_drift():
    # 5 % drift shared by a repetition, 0.5 % independent noise: pairing by rep
    # removes the drift, so the paired CI must be much narrower and still cover 30.
    t = make_timings({"vanilla": {"analyze_notiming": 30.0}}, reps=15, noise=0.5, drift=0.05)
    paired = stats.summarize(t).iloc[1]
    unpaired = stats.summarize(t, pair="never").iloc[1]
    assert paired.paired and not unpaired.paired
    # unpaired: ratio of medians; paired: median of per-rep overheads (module doc)
    assert unpaired.overhead_pct == pytest.approx(unpaired.overhead_median_pct)
    assert paired.overhead_pct == pytest.approx(30.0, abs=1.0)
    assert paired.ci_low_pct < 30.0 < paired.ci_high_pct
    assert unpaired.ci_low_pct < 30.0 < unpaired.ci_high_pct
    width_p = paired.ci_high_pct - paired.ci_low_pct
    width_u = unpaired.ci_high_pct - unpaired.ci_low_pct
    assert width_p < width_u / 2


def test_lost_repetition_falls_back_to_unpaired():
    t = make_timings({"vanilla": {"analyze_notiming": 30.0}})
    t = t[~((t["mode"] == "analyze_notiming") & (t["rep"] == 3))]  # crash at rep 3
    r = stats.summarize(t).iloc[1]
    assert r.n == 11 and not r.paired
    assert r.ci_low_pct < 30.0 < r.ci_high_pct


def test_nan_rows_are_ignored():
    t = make_timings({"vanilla": {"analyze_notiming": 30.0}}, reps=6)
    t.loc[t.index[0], "server_ms"] = np.nan
    s = stats.summarize(t)
    assert s.iloc[0].n == 5


def test_reproducible_and_independent_of_other_builds():
    one = make_timings({"vanilla": {"analyze_notiming": 30.0}})
    two = make_timings({"vanilla": {"analyze_notiming": 30.0},
                        "step1": {"analyze_notiming": 20.0}})
    # identical input, identical output (seeded bootstrap)
    a, b = stats.summarize(one), stats.summarize(one)
    pd.testing.assert_frame_equal(a, b)
    # and a build's CI does not depend on which other builds were summarized
    v_two = two[two.build == "vanilla"]
    s_all = stats.summarize(two)
    s_v = stats.summarize(v_two)
    r_all = s_all[(s_all.build == "vanilla") & (s_all["mode"] == "analyze_notiming")].iloc[0]
    r_v = s_v[s_v["mode"] == "analyze_notiming"].iloc[0]
    assert (r_all.ci_low_pct, r_all.ci_high_pct) == (r_v.ci_low_pct, r_v.ci_high_pct)


def test_build_order_follows_seed():
    t = make_timings({"step2": {"analyze_notiming": 10.0}, "vanilla": {"analyze_notiming": 30.0},
                      "zzz": {"analyze_notiming": 1.0}, "step1": {"analyze_notiming": 20.0}},
                     reps=4)
    s = stats.summarize(t, n_resamples=999)
    assert list(dict.fromkeys(s.build)) == ["vanilla", "step1", "step2", "zzz"]
    assert list(s[s.build == "vanilla"]["mode"]) == ["plain", "analyze_notiming"]


def test_empty_input_gives_empty_table_with_columns():
    s = stats.summarize(make_timings({"v": {}}).iloc[:0])
    assert s.empty
    assert list(s.columns) == list(stats.SUMMARY_COLUMNS)
    text = bench_report.summary_csv(s)
    assert text == ",".join(stats.SUMMARY_CSV_COLUMNS) + "\n"


def test_build_without_plain_raises():
    t = make_timings({"vanilla": {"analyze_notiming": 30.0}, "step1": {"analyze_notiming": 20.0}})
    t = t[~((t.build == "step1") & (t["mode"] == "plain"))]
    with pytest.raises(ComparisonError, match="step1.*plain"):
        stats.summarize(t)


def test_mixed_workloads_and_bad_arguments_raise():
    t = make_timings({"vanilla": {"analyze_notiming": 30.0}}, reps=3)
    t2 = t.copy()
    t2["workload"] = "join_sum"
    with pytest.raises(ComparisonError, match="mix workloads"):
        stats.summarize(pd.concat([t, t2]))
    with pytest.raises(ComparisonError, match="metric"):
        stats.summarize(t, metric="wall")  # type: ignore[arg-type]
    with pytest.raises(ComparisonError, match="center"):
        stats.summarize(t, center="mode")  # type: ignore[arg-type]
    with pytest.raises(ComparisonError, match="DataFrame"):
        stats.summarize([1, 2, 3])  # type: ignore[arg-type]


def test_single_repetition_has_no_ci():
    t = make_timings({"vanilla": {"analyze_notiming": 30.0}}, reps=1)
    r = stats.summarize(t).iloc[1]
    assert r.n == 1 and math.isnan(r.variance)
    assert math.isnan(r.ci_low_pct) and r.ci_method.startswith("none")
    assert stats.too_few_count(r.ci_method) == 1  # shown as "too few (n = 1)"
    assert 25 < r.overhead_pct < 35


def test_constant_samples_do_not_crash():
    t = make_timings({"vanilla": {"analyze_notiming": 25.0}}, reps=5, noise=0.0)
    r = stats.summarize(t).iloc[1]
    assert r.overhead_pct == pytest.approx(25.0)
    assert r.ci_low_pct == pytest.approx(25.0) and r.ci_high_pct == pytest.approx(25.0)


def test_compare_builds_detects_a_real_difference():
    t = make_timings({"vanilla": {"analyze_notiming": 30.0}, "step2": {"analyze_notiming": 10.0}},
                     reps=10, noise=1.0, drift=0.03)
    c = stats.compare_builds(t, "vanilla", "step2", "analyze_notiming")
    assert c.paired
    assert c.overhead_a_pct == pytest.approx(30, abs=1.5)
    assert c.overhead_b_pct == pytest.approx(10, abs=1.5)
    assert c.overhead_diff_pct == pytest.approx(-20, abs=2)
    assert c.diff_ci_low_pct < -20 < c.diff_ci_high_pct
    assert c.diff_ci_high_pct < 0 and c.overhead_differs
    assert c.overhead_p_value < 0.01
    assert c.time_ratio < 1.0
    d = c.as_dict()
    assert d["overhead_differs"] is True and d["a"] == "vanilla"


def test_compare_builds_same_overhead_not_significant():
    t = make_timings({"a": {"analyze_notiming": 20.0}, "b": {"analyze_notiming": 20.0}},
                     reps=12, noise=1.0)
    c = stats.compare_builds(t, "a", "b")
    assert c.diff_ci_low_pct < 0 < c.diff_ci_high_pct
    assert not c.overhead_differs
    assert c.overhead_p_value > 0.05


def test_compare_builds_plain_mode_compares_times_only():
    t = make_timings({"a": {"analyze_notiming": 20.0}, "b": {"analyze_notiming": 20.0}},
                     reps=8, base_ms=100.0)
    t.loc[t.build == "b", "server_ms"] *= 1.10
    c = stats.compare_builds(t, "a", "b", "plain")
    assert math.isnan(c.overhead_diff_pct)
    assert c.time_ratio == pytest.approx(1.10, abs=0.02)
    assert c.time_p_value < 0.01


def test_compare_builds_errors():
    t = make_timings({"a": {"analyze_notiming": 20.0}, "b": {}}, reps=3)
    with pytest.raises(ComparisonError, match="no timings for build 'c'"):
        stats.compare_builds(t, "a", "c")
    with pytest.raises(ComparisonError, match="itself"):
        stats.compare_builds(t, "a", "a")
    with pytest.raises(ComparisonError, match="'b' has no 'analyze_notiming'"):
        stats.compare_builds(t, "a", "b")


def test_no_verdict_from_too_few_repetitions():
    """A 20-point difference with 1 % noise: its interval excludes 0 from 3 repetitions,
    but below MIN_VERDICT_REPS no verdict is drawn (the interval alone called two
    identical builds different in 25-28 % of simulated runs with 3 repetitions:
    small_n_intervals.py)."""
    t = make_timings({"vanilla": {"analyze_notiming": 30.0}, "step2": {"analyze_notiming": 10.0}},
                     reps=3, noise=1.0)
    c = stats.compare_builds(t, "vanilla", "step2", n_resamples=999)
    assert c.diff_ci_high_pct < 0  # the interval alone would say "lower"
    assert c.ci_method.endswith("(3 repetitions: too few, interval too narrow)"), c.ci_method
    assert not c.overhead_differs
    # unpaired (one execution left out, as the vCPU rule does): the smallest sample counts
    t2 = make_timings({"vanilla": {"analyze_notiming": 30.0}, "step2": {"analyze_notiming": 10.0}},
                      reps=6, noise=1.0)
    t2 = t2.drop(index=t2.index[(t2.build == "step2") & (t2["mode"] == "plain")][:3])
    c2 = stats.compare_builds(t2, "vanilla", "step2", n_resamples=999)
    assert not c2.paired and "(3 repetitions: too few" in c2.ci_method and not c2.overhead_differs
    # enough repetitions: the verdict stands
    t3 = make_timings({"vanilla": {"analyze_notiming": 30.0}, "step2": {"analyze_notiming": 10.0}},
                      reps=stats.MIN_VERDICT_REPS, noise=1.0)
    c3 = stats.compare_builds(t3, "vanilla", "step2", n_resamples=999)
    assert "too few" not in c3.ci_method and c3.overhead_differs


def test_verdict_needs_the_rank_test_too():
    """An interval that excludes 0 while the rank test of the per-repetition overheads
    does not (p >= 0.05) is no verdict: the table's p column never contradicts it."""
    base = dict(a="a", b="b", mode="analyze_notiming", metric="server_ms", n_a=8, n_b=8,
                median_a_ms=1.0, median_b_ms=1.0, time_ratio=1.0, time_u=0.0,
                time_p_value=0.5, overhead_a_pct=30.0, overhead_b_pct=25.0,
                overhead_diff_pct=-5.0, diff_ci_low_pct=-9.0, diff_ci_high_pct=-0.5,
                paired=True, ci_method="BCa")
    assert stats.BuildComparison(**base, overhead_p_value=0.01).overhead_differs
    assert not stats.BuildComparison(**base, overhead_p_value=0.2).overhead_differs
    assert not stats.BuildComparison(**base, overhead_p_value=0.05).overhead_differs
    # at 90 % the bar is 0.10
    assert stats.BuildComparison(**base, overhead_p_value=0.07, confidence=0.9).overhead_differs
    # no rank test (the samples do not pair): the interval decides
    assert stats.BuildComparison(**base, overhead_p_value=math.nan).overhead_differs


def test_compare_builds_pairs_on_the_kept_repetitions_like_summarize():
    """Executions rejected on purpose (cpu_kept_ms): with pair="common" each build's
    overhead in the step table is the summary's, per-repetition and paired; without it
    one missing plain execution turned the step table to ratios of medians, and the
    same build showed two overheads in one report."""
    t = make_timings({"vanilla": {"analyze_notiming": 30.0}, "step1": {"analyze_notiming": 20.0}},
                     reps=10, noise=1.0)
    t = t.drop(index=t.index[(t.build == "vanilla") & (t["mode"] == "plain") & (t.rep == 3)])
    t = t.drop(index=t.index[(t.build == "step1") & (t["mode"] == "analyze_notiming")
                             & (t.rep == 6)])
    s = stats.summarize(t, pair="common", n_resamples=999).set_index(["build", "mode"])
    c = stats.compare_builds(t, "vanilla", "step1", pair="common", n_resamples=999)
    assert c.paired and c.overhead_a_pct == pytest.approx(
        s.loc[("vanilla", "analyze_notiming"), "overhead_pct"])
    assert c.overhead_b_pct == pytest.approx(s.loc[("step1", "analyze_notiming"), "overhead_pct"])
    assert c.overhead_differs and math.isfinite(c.overhead_p_value)
    auto = stats.compare_builds(t, "vanilla", "step1", n_resamples=999)
    assert not auto.paired and math.isnan(auto.overhead_p_value)
    chain = stats.compare_chain(t, ["vanilla", "step1"], pair="common", n_resamples=999)
    assert bool(chain.paired.iloc[0])
    with pytest.raises(ComparisonError, match="pair must be"):
        stats.compare_builds(t, "vanilla", "step1", pair="never")


def test_compare_chain_metric_reads_like_the_summary():
    """On a calibrated run the step table's default is cpu_kept_ms, paired on the kept
    repetitions: one build, the overhead summarize_metric gives it."""
    t = make_timings({"vanilla": {"analyze_notiming": 30.0}, "step1": {"analyze_notiming": 20.0}},
                     reps=8, noise=1.0)
    t["cpu_ms"] = t["server_ms"]
    t["calib_before_ms"] = 3.0
    t["calib_after_ms"] = 3.0
    slow = t.index[(t.build == "vanilla") & (t["mode"] == "plain") & (t.rep == 2)]
    t.loc[slow, "calib_after_ms"] = 5.0  # the vCPU rule leaves this execution out
    ch = stats.compare_chain_metric(t, n_resamples=999)
    assert list(ch.metric) == ["cpu_kept_ms"] and bool(ch.paired.iloc[0])
    s = stats.summarize_metric(t, n_resamples=999).set_index(["build", "mode"])
    assert ch.overhead_a_pct.iloc[0] == pytest.approx(
        s.loc[("vanilla", "analyze_notiming"), "overhead_pct"])
    assert list(stats.compare_chain_metric(t, metric="cpu_ms", n_resamples=999).metric) == \
        ["cpu_ms"]


def test_compare_chain_rows():
    t = make_timings({"vanilla": {"analyze_notiming": 30.0}, "step1": {"analyze_notiming": 20.0},
                      "step2": {"analyze_notiming": 10.0}}, reps=8)
    ch = stats.compare_chain(t, n_resamples=1999)
    assert list(zip(ch.a, ch.b, strict=True)) == [("vanilla", "step1"), ("step1", "step2")]
    assert ch.overhead_differs.all()


def instr_table(counts: dict[tuple[str, str], int]) -> pd.DataFrame:
    return pd.DataFrame([
        {"run_id": "r1", "build": b, "workload": "nested_loop", "query": m, "mode": m,
         "instructions": n, "tool": "callgrind", "scope": "exec_simple_query"}
        for (b, m), n in counts.items()
    ])


def test_summary_csv_columns_and_instruction_overhead(tmp_path):
    t = make_timings({"vanilla": {"analyze_notiming": 30.0, "analyze_timing": 80.0},
                      "step1": {"analyze_notiming": 20.0}}, reps=5)
    s = stats.summarize(t, n_resamples=999)
    ic = instr_table({("vanilla", "plain"): 355_051_091, ("vanilla", "analyze_notiming"): 448_476_655,
                      ("vanilla", "analyze_timing"): 517_580_547})
    path = tmp_path / "summary.csv"
    text = bench_report.summary_csv(s, ic, path=path)
    assert path.read_text() == text
    lines = text.splitlines()
    assert lines[0] == ("build,mode,n,median_ms,mean_ms,variance,overhead_pct,ci_low_pct,"
                        "ci_high_pct,instr,instr_overhead_pct,pg_version,preset,metric,q25_ms,"
                        "plain_instr,plain_median_ms,plain_q25_ms,ref_build,vs_ref_pct,"
                        "vs_ref_ci_low_pct,vs_ref_ci_high_pct,vs_ref_instr_pct,backends,"
                        "between_share_pct,vs_ref_between_share_pct,note")
    back = pd.read_csv(io.StringIO(text))
    v = back[(back.build == "vanilla") & (back["mode"] == "analyze_notiming")].iloc[0]
    assert v.instr == 448_476_655
    assert v.instr_overhead_pct == pytest.approx((448_476_655 / 355_051_091 - 1) * 100, abs=1e-3)
    # not measured -> empty cells
    st1 = back[(back.build == "step1") & (back["mode"] == "analyze_notiming")].iloc[0]
    assert math.isnan(st1.instr) and math.isnan(st1.instr_overhead_pct)
    assert "step1,analyze_notiming,5," in text
    # plain rows have no CI: empty cells, not "nan"
    assert "nan" not in text.lower()


def test_summary_against_vanilla_of_the_same_major():
    """Issue 13: every mode against vanilla's plain Query-1 of the same PostgreSQL major,
    in time (paired CI) and instructions; PG19 rows against pg19/vanilla."""
    t = make_timings({"vanilla": {"analyze_notiming": 30.0},
                      "step5": {"analyze_notiming": 0.5},
                      "pg19-vanilla": {"analyze_notiming": 25.0},
                      "pg19tsc": {"analyze_notiming": 25.0},
                      "pg19-step5": {"analyze_notiming": 0.4}}, reps=12, noise=0.1)
    # step5's plain query is 1 % slower than vanilla's; pg19-step5's 2 % slower than pg19's
    for b, f in (("step5", 1.01), ("pg19-step5", 1.02)):
        t.loc[t.build == b, "server_ms"] *= f
    builds = {"vanilla": {"preset": "vanilla", "version": "18.6"},
              "step5": {"preset": "step5", "version": "18.6"},
              "pg19tsc": {"preset": "pg19/vanilla", "version": "19beta1",
                          "arm_settings": {"timing_clock_source": "tsc"}},
              "pg19-vanilla": {"preset": "pg19/vanilla", "version": "19beta1"},
              "pg19-step5": {"preset": "pg19/step5", "version": "19beta1"}}
    assert stats.vanilla_references(builds) == {
        "vanilla": "vanilla", "step5": "vanilla", "pg19-vanilla": "pg19-vanilla",
        "pg19tsc": "pg19-vanilla", "pg19-step5": "pg19-vanilla"}
    ic = instr_table({("vanilla", "plain"): 1_000_000, ("vanilla", "analyze_notiming"): 1_300_000,
                      ("step5", "plain"): 1_002_000, ("step5", "analyze_notiming"): 1_008_000,
                      ("pg19-vanilla", "plain"): 2_000_000,
                      ("pg19-step5", "analyze_notiming"): 2_010_000})
    s = stats.attach_instructions(stats.summarize(t, n_resamples=999), ic)
    out = stats.attach_reference(s, t, builds, ic, "server_ms", n_resamples=999)
    r = out.set_index(["build", "mode"])
    q2 = r.loc[("step5", "analyze_notiming")]
    assert q2.ref_build == "vanilla" and q2.pg_version == "18.6" and q2.preset == "step5"
    # 1.01 x 1.005 - 1 against vanilla's plain; 0.5 % against its own
    assert q2.vs_ref_pct == pytest.approx(1.505, abs=0.1)
    assert q2.vs_ref_ci_low_pct < 1.505 < q2.vs_ref_ci_high_pct
    assert q2.overhead_pct == pytest.approx(0.5, abs=0.1)
    assert q2.vs_ref_instr_pct == pytest.approx(0.8)
    assert q2.instr_overhead_pct == pytest.approx(100 * (1_008_000 / 1_002_000 - 1))
    assert q2.plain_instr == 1_002_000
    assert q2.plain_median_ms == r.loc[("step5", "plain"), "median_ms"]
    p5 = r.loc[("step5", "plain")]
    assert p5.vs_ref_pct == pytest.approx(1.0, abs=0.1) and p5.vs_ref_instr_pct == pytest.approx(0.2)
    assert r.loc[("vanilla", "plain"), "vs_ref_pct"] == 0.0
    g = r.loc[("pg19-step5", "analyze_notiming")]
    assert g.ref_build == "pg19-vanilla" and g.pg_version == "19beta1"
    assert g.vs_ref_pct == pytest.approx(2.408, abs=0.1)
    assert g.vs_ref_instr_pct == pytest.approx(0.5)
    assert math.isnan(g.plain_instr)  # pg19-step5's plain was not counted
    assert r.loc[("pg19tsc", "analyze_notiming"), "vs_ref_pct"] == pytest.approx(25.0, abs=0.2)
    text = bench_report.summary_csv(out)
    back = pd.read_csv(io.StringIO(text))
    assert list(back.columns) == list(stats.SUMMARY_CSV_COLUMNS)
    assert "nan" not in text.lower() and "<NA>" not in text


def _demo(name: str) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    t = pd.read_csv(ROOT / "benchmarks" / "results" / name / "timings.csv")
    ic = pd.read_csv(ROOT / "benchmarks" / "results" / name / "instructions.csv")
    builds = {b: {"preset": b, "version": "18.6"} for b in t["build"].unique()}
    return t, ic, builds


def test_vanilla_against_its_own_plain_is_its_overhead_row():
    """A build that is its own reference prints one interval for its overhead, not two
    bootstraps of the same comparison: a warm demo (the committed run below: 4 backends,
    2-3 kept repetitions each) printed vanilla's Query-2 as 23.44 [-23.51, 70.70] in one
    table and 23.44 [-23.51, 56.53] in the next, the resampled median landing on other
    data points under another random stream."""
    t, _ic, builds = _demo("demo-20261202")
    s = stats.summarize_metric(t, "cpu_kept_ms", n_resamples=4000)
    for simultaneous in (False, True):
        out = stats.attach_reference(s, t, builds, None, "cpu_kept_ms", n_resamples=4000,
                                     simultaneous=simultaneous)
        r = out.set_index(["build", "mode"])
        for mode in ("analyze_notiming", "analyze_timing"):
            v = r.loc[("vanilla", mode)]
            assert v.backends == 4 and v.ci_method == "hierarchical"
            assert v.vs_ref_pct == v.overhead_pct
            if simultaneous:  # the same resamples, read at a higher level: wider
                assert v.vs_ref_ci_low_pct <= v.ci_low_pct and v.vs_ref_ci_high_pct >= v.ci_high_pct
            else:
                assert (v.vs_ref_ci_low_pct, v.vs_ref_ci_high_pct) == (v.ci_low_pct, v.ci_high_pct)
    # 70.70 before the small-sample widening of few-backend intervals (small_sample_factor)
    assert r.loc[("vanilla", "analyze_notiming"), "ci_high_pct"] == pytest.approx(84.02, abs=0.01)


@pytest.mark.parametrize("name", ["demo-20261202", "demo-cold-20261202"])
def test_committed_demos_have_no_false_cost(name):
    """Two make demo runs of this VM (warm and cold, committed with their notes): where a
    build runs vanilla's plain instructions (within 0.2 %), no interval of the
    against-vanilla table may exclude 0. The cold run's step5 Query-2 (-0.157 % in
    instructions) read +6.51 % [1.24, 74.04] at 95 % per interval; its 17 intervals now hold
    together (each at 1 - 0.05/17)."""
    t, ic, builds = _demo(name)
    s = stats.attach_instructions(stats.summarize_metric(t, "cpu_kept_ms"), ic)
    per95 = stats.attach_reference(s, t, builds, ic, "cpu_kept_ms", simultaneous=False)
    out = stats.attach_reference(s, t, builds, ic, "cpu_kept_ms")
    assert out.attrs["vs_ref_family"] == 17
    assert out.attrs["vs_ref_level"] == pytest.approx(1 - 0.05 / 17)
    equal = out[(out["vs_ref_instr_pct"].abs() < 0.2)
                & ~((out["build"] == "vanilla") & (out["mode"] == "plain"))]
    assert len(equal) == 5  # four plain queries (not step3's: +1.12 %) and step5's Query-2
    for _, r in equal.iterrows():
        assert r.vs_ref_ci_low_pct <= 0 <= r.vs_ref_ci_high_pct, (r.build, r["mode"])
    if name == "demo-cold-20261202":
        # the run printed [1.24, 74.04]; the small-sample widening of 4-backend intervals
        # (stats.small_sample_factor) alone, at 95 % per interval, now takes 0 in
        p = per95.set_index(["build", "mode"]).loc[("step5", "analyze_notiming")]
        assert p.vs_ref_ci_low_pct == pytest.approx(-3.15, abs=0.05)
        assert p.vs_ref_ci_high_pct == pytest.approx(129.39, abs=0.05)
    # TIMING on still reads as the large cost it is (+186 to +249 %), at the simultaneous
    # level and from 2-3 kept repetitions per backend: its intervals start above +70 %
    # (above +100 % before the small-sample widening)
    for _, r in out[out["mode"] == "analyze_timing"].iterrows():
        assert r.vs_ref_ci_low_pct > 70, r.build


def test_simultaneous_level():
    assert stats.simultaneous_level(0.95, 1) == pytest.approx(0.95)
    assert stats.simultaneous_level(0.95, 17) == pytest.approx(0.99705882)
    assert stats.simultaneous_level(0.95, 0) == pytest.approx(0.95)


def test_attach_instructions_medians_repeated_counts():
    s = stats.summarize(make_timings({"v": {"analyze_notiming": 10.0}}, reps=3),
                        n_resamples=999)
    ic = instr_table({("v", "plain"): 100, ("v", "analyze_notiming"): 130})
    ic = pd.concat([ic, instr_table({("v", "analyze_notiming"): 132}),
                    instr_table({("v", "analyze_notiming"): 131})])
    out = stats.attach_instructions(s, ic)
    r = out[out["mode"] == "analyze_notiming"].iloc[0]
    assert r.instr == 131 and r.instr_overhead_pct == pytest.approx(31.0)


def test_seed_figures_are_consistent_with_the_text():
    q2 = seed_figures.Q2_OVERHEAD_PCT
    assert q2 == {"vanilla": 29.36, "step1": 20.59, "step2": 10.77, "step3": 3.77}
    assert seed_figures.seed_overhead_pct("step3", "analyze_notiming") == 3.77
    assert seed_figures.seed_overhead_pct("step3", "analyze_timing") is None
    (q1,) = seed_figures.figures("mean_time_s", "step3")[:1]
    q1_s = [f.value for f in seed_figures.FIGURES if f.key == "mean_time_s" and f.query == "Query-1"]
    q2_s = [f.value for f in seed_figures.FIGURES if f.key == "mean_time_s" and f.query == "Query-2"]
    assert q1_s == [45.9527] and q2_s == [47.6872]
    # the text's own arithmetic holds: gap, overhead and the 87 % reduction
    assert q2_s[0] - q1_s[0] == pytest.approx(1.7345, abs=1e-4)
    assert (q2_s[0] / q1_s[0] - 1) * 100 == pytest.approx(3.77, abs=0.01)
    assert (q2["vanilla"] - q2["step3"]) / q2["vanilla"] * 100 == pytest.approx(87, abs=0.5)
    assert 3.9681 / (2 * 4e9) * 1e9 == pytest.approx(0.496, abs=1e-3)
    assert all(f.quote and f.source.endswith(".txt") for f in seed_figures.FIGURES)
    assert q1.unit == "s"


def _two_level(rng, k: int, n: int, between: float, within: float = 2.0,
               true: float = 10.0) -> list[np.ndarray]:
    effects = rng.normal(0, between, k)
    return [true + effects[i] + rng.normal(0, within, n) for i in range(k)]


def test_hierarchical_interval_coverage():
    """The interval labelled 95 % covers ~95 % on a two-level model with a between-backend
    component; the repetition bootstrap of the same data (and of one backend) does not."""
    import warnings

    from scipy import stats as sps

    rng = np.random.default_rng(1)
    n_exp, hit_h, hit_r, hit_1 = 300, 0, 0, 0
    shares = []
    for _ in range(n_exp):
        data = _two_level(rng, 6, 4, between=2.0)
        ci, share = stats.hierarchical_bootstrap(data, np.median, rng=rng, n_resamples=1000)
        assert ci.method == "hierarchical"
        hit_h += ci.low <= 10.0 <= ci.high
        shares.append(share)
        flat = np.concatenate(data)
        one = _two_level(rng, 1, 24, between=2.0)[0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = sps.bootstrap((flat,), np.median, n_resamples=999, method="BCa", rng=rng)
            r1 = sps.bootstrap((one,), np.median, n_resamples=999, method="BCa", rng=rng)
        hit_r += r.confidence_interval.low <= 10.0 <= r.confidence_interval.high
        hit_1 += r1.confidence_interval.low <= 10.0 <= r1.confidence_interval.high
    cov_h, cov_r, cov_1 = hit_h / n_exp, hit_r / n_exp, hit_1 / n_exp
    print(f"coverage: hierarchical {cov_h:.3f}, repetitions only {cov_r:.3f}, "
          f"one backend {cov_1:.3f}; median between share {np.median(shares):.0f} %")
    assert 0.90 <= cov_h <= 0.98, cov_h
    assert cov_r <= 0.88 and cov_1 <= 0.5, (cov_r, cov_1)
    # half the variance is between backends here: the share says most of the interval
    assert 50 <= np.median(shares) <= 95


def test_hierarchical_share_and_few_backends():
    rng = np.random.default_rng(3)
    same = [np.array([10.0, 10.5, 9.5, 10.2]) for _ in range(5)]  # no backend effect
    ci, share = stats.hierarchical_bootstrap(same, np.median, rng=rng, n_resamples=2000)
    assert share == pytest.approx(0.0, abs=15) and ci.low < 10.1 < ci.high
    ci2, _ = stats.hierarchical_bootstrap(_two_level(rng, 2, 6, 2.0), np.median, rng=rng)
    assert "too few" in ci2.method
    ci1, share1 = stats.hierarchical_bootstrap([np.arange(5.0)], np.median, rng=rng)
    assert ci1.method == "none" and math.isnan(share1)


def test_summarize_uses_backends_when_the_run_has_them():
    t = make_timings({"vanilla": {"analyze_notiming": 30.0}}, reps=20, noise=1.0)
    one = stats.summarize(t, n_resamples=999)
    t["backend"] = t["rep"] // 5 + 1  # 4 backends of 5 repetitions
    four = stats.summarize(t, n_resamples=999)
    r1 = one[one["mode"] == "analyze_notiming"].iloc[0]
    r4 = four[four["mode"] == "analyze_notiming"].iloc[0]
    assert r1.backends == 1 and math.isnan(r1.between_share_pct) and r1.ci_method == "BCa"
    assert r4.backends == 4 and r4.ci_method == "hierarchical"
    assert 0 <= r4.between_share_pct <= 100
    assert r4.overhead_pct == pytest.approx(r1.overhead_pct)  # the estimate is the same
    assert r4.ci_low_pct < 30 < r4.ci_high_pct


def test_wilson_interval_known_values():
    # 1 of 20: 0.05 [0.0089, 0.2361] (Wilson score, 95 %)
    lo, hi = stats.wilson_interval(1, 20)
    assert lo == pytest.approx(0.00889, abs=1e-4) and hi == pytest.approx(0.2361, abs=1e-4)
    lo0, hi0 = stats.wilson_interval(0, 20)
    assert lo0 == 0.0 and hi0 == pytest.approx(0.1611, abs=1e-4)
    assert all(math.isnan(x) for x in stats.wilson_interval(0, 0))


def test_compare_builds_resamples_backends_when_the_run_has_them():
    t = make_timings({"vanilla": {"analyze_notiming": 30.0}, "step1": {"analyze_notiming": 20.0}},
                     reps=20, noise=1.0)
    rep_only = stats.compare_builds(t, "vanilla", "step1", n_resamples=999)
    t["backend"] = t["rep"] // 5 + 1
    four = stats.compare_builds(t, "vanilla", "step1", n_resamples=999)
    assert rep_only.ci_method == "BCa" and four.ci_method == "hierarchical"
    assert four.overhead_diff_pct == pytest.approx(rep_only.overhead_diff_pct)
    assert four.diff_ci_low_pct < -10 < four.diff_ci_high_pct and four.overhead_differs
    t["backend"] = t["rep"] // 10 + 1  # two backends: flagged, never called different
    two = stats.compare_builds(t, "vanilla", "step1", n_resamples=999)
    assert "too few" in two.ci_method and not two.overhead_differs


def test_plain_across_builds_tests_backends_not_executions():
    """Two builds of the same code: step4's executions all read 8 % above vanilla's
    because three of vanilla's four backends ran fast and step4's did not.  On the 12 + 12
    executions a rank test calls that a difference at 5 %; on the 4 + 4 backends (the
    units that are independent) it does not.  The report says which it used."""
    rows, order = [], 0
    for build, per_backend in (("vanilla", (99.5, 100.0, 100.5, 118.0)),
                               ("step4", (107.5, 108.0, 108.5, 109.0))):
        for k, ms in enumerate(per_backend, 1):
            for j in range(3):
                v = ms + 0.1 * j
                rows.append({"run_id": "r1", "build": build, "workload": "nested_loop",
                             "query": "plain", "mode": "plain", "rep": (k - 1) * 3 + j,
                             "order": order, "client_ms": v + 0.5, "server_ms": v,
                             "backend": k})
                order += 1
    t = pd.DataFrame(rows)
    x = stats.bench_extras(t, None, "server_ms")
    assert x.plain_base == "vanilla"
    r = x.plain_vs_base.set_index("build").loc["step4"]
    per_execution = stats.compare_builds(t, "vanilla", "step4", "plain", "server_ms")
    assert per_execution.time_p_value < 0.05
    # 4 vs 4 medians, vanilla's 118.1 above step4's four, its other three below: U = 4,
    # exact two-sided p = 2 x 12/70
    assert r["p_unit"] == "4/4 backends"
    assert r["p_value"] == pytest.approx(24 / 70)
    md = bench_report.extra_sections(x)
    assert "| step4 | 108.35 | +7.97 | 0.343 | 4/4 backends | – |" in md
    # one backend per build: the executions are the units, as before
    one = t.assign(backend=1)
    r1 = stats.bench_extras(one, None, "server_ms").plain_vs_base.set_index("build").loc["step4"]
    assert r1["p_unit"] == "12/12 executions"
    assert r1["p_value"] == pytest.approx(per_execution.time_p_value)


def test_small_sample_factor_values():
    """sqrt(s·k/(k−1) + 1 − s) · t(df) / z, df by Satterthwaite from the between share s."""
    from scipy import stats as sps

    z = sps.norm.ppf(0.975)
    # all the variance between 4 backends: the bootstrap's 3/4 made up, Student's t at 3
    assert stats.small_sample_factor(4, 12, 100.0) == pytest.approx(
        math.sqrt(4 / 3) * sps.t.ppf(0.975, 3) / z)
    assert stats.small_sample_factor(4, 12, 100.0) == pytest.approx(1.875, abs=1e-3)
    # none between: Student's t at n − k = 8, no variance correction
    assert stats.small_sample_factor(4, 12, 0.0) == pytest.approx(sps.t.ppf(0.975, 8) / z)
    # half: df = 1 / (0.25/3 + 0.25/8)
    assert stats.small_sample_factor(4, 12, 50.0) == pytest.approx(
        math.sqrt(0.5 * 4 / 3 + 0.5) * sps.t.ppf(0.975, 1 / (0.25 / 3 + 0.25 / 8)) / z)
    # no share known: the wider reading; fewer than 2 backends: nothing to widen
    assert stats.small_sample_factor(4, 12, float("nan")) == stats.small_sample_factor(4, 12, 100)
    assert stats.small_sample_factor(1, 12, 80.0) == 1.0
    # more backends, less widening
    assert stats.small_sample_factor(8, 24, 80.0) < stats.small_sample_factor(4, 24, 80.0)


def test_few_backends_interval_holds_its_level_where_the_bare_one_did_not():
    """4 backends of 3 repetitions, a between-backend spread equal to the within (most of
    a median's variance then lies between backends, as on this VM): the bare percentile
    interval covered 0.892 of 400 (the A/A runs here: 11 of 110 excluded 0), the report's
    widened one 0.963 (benchmarks/hier_small_k.py for more cases)."""
    rng = np.random.default_rng(5)
    n_exp, bare, wide = 400, 0, 0
    for _ in range(n_exp):
        data = _two_level(rng, 4, 3, between=2.0)
        seed = int(rng.integers(2**32))
        b, _ = stats.hierarchical_bootstrap(data, np.median, rng=np.random.default_rng(seed),
                                            n_resamples=1000, widen=False)
        w, _ = stats.hierarchical_bootstrap(data, np.median, rng=np.random.default_rng(seed),
                                            n_resamples=1000)
        assert w.low <= b.low and w.high >= b.high  # the same resamples, widened
        bare += b.low <= 10.0 <= b.high
        wide += w.low <= 10.0 <= w.high
    print(f"coverage with 4 backends: bare {bare / n_exp:.3f}, widened {wide / n_exp:.3f}")
    assert bare / n_exp <= 0.91 and 0.93 <= wide / n_exp <= 0.99, (bare, wide)
