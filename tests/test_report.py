"""The benchmark report: markdown, console table and chart."""
from __future__ import annotations

import hashlib
import io

import numpy as np
import pandas as pd
import pytest
from matplotlib import image as mpimg
from rich.console import Console

from profkit.analyze import stats
from profkit.render import bench_report


def make_timings(overheads: dict[str, dict[str, float]], reps: int = 8,
                 seed: int = 3) -> pd.DataFrame:
    """Interleaved synthetic timings: plain ≈ 100 ms, mode ≈ 100 × (1 + overhead/100)."""
    rng = np.random.default_rng(seed)
    rows, order = [], 0
    for rep in range(reps):
        for build, modes in overheads.items():
            for mode, ov in {"plain": 0.0, **modes}.items():
                ms = 100.0 * (1 + ov / 100) + rng.normal(0, 1.0)
                rows.append({"run_id": "r1", "build": build, "workload": "nested_loop",
                             "query": mode, "mode": mode, "rep": rep, "order": order,
                             "client_ms": ms, "server_ms": ms})
                order += 1
    return pd.DataFrame(rows)


def instr_table(counts: dict[tuple[str, str], int]) -> pd.DataFrame:
    return pd.DataFrame([
        {"run_id": "r1", "build": b, "workload": "nested_loop", "query": m, "mode": m,
         "instructions": n, "tool": "callgrind", "scope": "exec_simple_query"}
        for (b, m), n in counts.items()
    ])

PROV = {
    "run_id": "20261130-0240-nested_loop",
    "date": "2026-11-30T02:40:00+0000",
    "command_line": ["profkit", "reproduce", "--reps", "10"],
    "workload": "nested_loop", "scale": 0.3, "reps": 10, "metric": "server_ms",
    "instruction_counter": "callgrind",
    "machine": {"cpu_model": "Intel Xeon Processor", "kernel": "6.18.0", "clock_source": "tsc",
                "virtualization": "kvm"},
    "builds": {
        "vanilla": {"pg_config": {"VERSION": "PostgreSQL 18.6"}, "patches": []},
        "step1": {"pg_config": {"VERSION": "PostgreSQL 18.6"},
                  "patches": [{"name": "step1-inline-instr.patch",
                               "sha256": "0123456789abcdef0123"}]},
    },
    "extra_note": "anything else is listed too",
}


@pytest.fixture(scope="module")
def timings() -> pd.DataFrame:
    return make_timings({
        "vanilla": {"analyze_notiming": 30.0, "analyze_timing": 300.0},
        "step1": {"analyze_notiming": 20.0, "analyze_timing": 280.0},
        "step2": {"analyze_notiming": 10.0, "analyze_timing": 270.0},
        "step3": {"analyze_notiming": 4.0, "analyze_timing": 260.0},
    }, reps=8)


@pytest.fixture(scope="module")
def summary(timings: pd.DataFrame) -> pd.DataFrame:
    s = stats.summarize(timings, n_resamples=1999)
    counts = {}
    for b, ov in (("vanilla", 0.263), ("step1", 0.20), ("step2", 0.10), ("step3", 0.03)):
        counts[(b, "plain")] = 355_000_000
        counts[(b, "analyze_notiming")] = round(355_000_000 * (1 + ov))
        counts[(b, "analyze_timing")] = round(355_000_000 * (1 + ov + 0.2))
    return stats.attach_instructions(s, instr_table(counts))


def test_seed_table_rows(summary: pd.DataFrame):
    st = bench_report.seed_table(summary)
    assert list(st.build) == ["vanilla", "step1", "step2", "step3"]
    v = st.iloc[0]
    assert v.seed_q2_overhead_pct == 29.36 and v.seed_name == "Original"
    assert v.q2_overhead_pct == pytest.approx(30, abs=1.5)
    assert v.q2_instr_overhead_pct == pytest.approx(26.3, abs=0.01)
    assert v.q3_overhead_pct == pytest.approx(300, abs=6)
    assert pd.isna(v.seed_q3_overhead_pct)  # the seed text gives no Query-3 figure


def test_seed_table_n_shows_each_querys_executions():
    """The seed table's n was plain's executions alone: a cold make demo printed vanilla's
    n = 9 beside Query-3's interval from 6 executions.  Where the three differ it shows
    them all."""
    t = make_timings({"vanilla": {"analyze_notiming": 30.0, "analyze_timing": 300.0},
                      "step3": {"analyze_notiming": 3.0, "analyze_timing": 290.0}})
    t = t.drop(index=t.index[(t.build == "vanilla") & (t["mode"] == "analyze_notiming")
                             & (t.rep == 1)])
    t = t.drop(index=t.index[(t.build == "vanilla") & (t["mode"] == "analyze_timing")
                             & t.rep.isin([2, 3])])
    s = stats.summarize(t, pair="common", n_resamples=999)
    st = bench_report.seed_table(s).set_index("build")
    assert (st.loc["vanilla", "n"], st.loc["vanilla", "n_q2"], st.loc["vanilla", "n_q3"]) == (
        8, 7, 6)
    assert bench_report.n_text(st.loc["vanilla"].rename(None)) == "8 / 7 / 6"
    row = next(r for r in bench_report.seed_table(s).itertuples() if r.build == "step3")
    assert bench_report.n_text(row) == "8"
    md = bench_report.render_markdown(s, PROV)
    assert "| vanilla (Original) | 8 / 7 / 6 |" in md and "| step3 (Step 3) | 8 |" in md
    assert "n: the executions kept (plain / Query-2 / Query-3 where they differ" in md


def test_markdown_has_table_seed_figures_and_provenance(summary, timings):
    md = bench_report.render_markdown(summary, PROV, comparisons=stats.compare_chain(
        timings, n_resamples=999), chart="overhead.png")
    # provenance header
    assert "20261130-0240-nested_loop" in md
    assert "`profkit reproduce --reps 10`" in md
    assert "nested_loop at scale 0.3, 10 repetitions" in md
    assert "step1-inline-instr.patch (sha256 0123456789ab)" in md
    assert "virtualization: kvm" in md and "callgrind" in md
    assert "extra_note" in md
    # the seed-style table: one row per build with measured CI and the seed's figure
    row = next(ln for ln in md.splitlines() if ln.startswith("| vanilla (Original)"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "8"
    q2 = summary[(summary.build == "vanilla") & (summary["mode"] == "analyze_notiming")].iloc[0]
    assert cells[3] == f"{q2.overhead_pct:.2f} [{q2.ci_low_pct:.2f}, {q2.ci_high_pct:.2f}]"
    assert cells[4] == "29.36"
    assert cells[6] == "26.30"
    assert "| step3 (Step 3)" in md and "| 3.77 |" in md
    assert "![overhead chart](overhead.png)" in md
    assert "vanilla → step1" in md
    assert "no Query-3 figure" in md


def test_markdown_empty_summary_says_no_data():
    md = bench_report.render_markdown(stats.summarize(make_timings({"v": {}}).iloc[:0]), PROV)
    assert "No data" in md and "20261130-0240-nested_loop" in md
    assert "| vanilla" not in md


def test_bad_summary_raises_clear_error():
    with pytest.raises(bench_report.ReportError, match="summarize"):
        bench_report.render_markdown(pd.DataFrame({"build": ["x"]}), {})
    with pytest.raises(bench_report.ReportError, match="DataFrame"):
        bench_report.render_console([1, 2])  # type: ignore[arg-type]


def test_console_table(summary):
    t = bench_report.render_console(summary)
    assert t.row_count == 4
    con = Console(record=True, width=200)
    con.print(t)
    text = con.export_text()
    assert "vanilla" in text and "29.36" in text and "26.30" in text
    empty = bench_report.render_console(summary.iloc[:0])
    assert empty.row_count == 1


def _sha(p) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_plot_writes_png_and_svg_deterministically(summary, tmp_path):
    png, svg = tmp_path / "a.png", tmp_path / "a.svg"
    fig = bench_report.plot_overheads(summary, png, svg, provenance=PROV)
    img = mpimg.imread(png)
    assert img.shape[0] > 500 and img.shape[1] > 800
    text = svg.read_text()
    assert text.startswith("<?xml") and "Query-2" in text and "29.36" in text
    # 2 modes + instruction panel
    assert len(fig.axes) == 3
    png2, svg2 = tmp_path / "b.png", tmp_path / "b.svg"
    bench_report.plot_overheads(summary, png2, svg2, provenance=PROV)
    assert _sha(png) == _sha(png2)
    assert _sha(svg) == _sha(svg2)


def test_plot_without_instruction_counts(summary, tmp_path):
    s = summary.drop(columns=["instr", "instr_overhead_pct"])
    bench_report.plot_overheads(s, tmp_path / "n.png", None)
    assert (tmp_path / "n.png").stat().st_size > 10_000


def test_plot_empty_summary_is_a_placeholder(tmp_path):
    empty = stats.summarize(make_timings({"v": {}}).iloc[:0])
    fig = bench_report.plot_overheads(empty, tmp_path / "e.png", tmp_path / "e.svg")
    assert (tmp_path / "e.png").exists() and "no data" in (tmp_path / "e.svg").read_text()
    assert len(fig.axes) == 1
    # only plain rows measured: still a placeholder
    only_plain = stats.summarize(make_timings({"v": {}}, reps=3))
    bench_report.plot_overheads(only_plain, tmp_path / "p.png", None)
    assert (tmp_path / "p.png").exists()


def test_plain_slower_than_its_explain_is_flagged():
    """A build whose Query-2 ran faster than its plain Query-1 beyond noise gets a note
    naming it (EXPLAIN does the plain query's work and more); sane runs none, nor a
    build whose Query-2 costs nothing and whose medians fall either way."""
    sane = make_timings({"vanilla": {"analyze_notiming": 30.0, "analyze_timing": 200.0},
                         "step5": {"analyze_notiming": -0.2, "analyze_timing": 150.0}})
    notes = bench_report.engine_notes(stats.summarize_metric(sane, "server_ms"), {})
    assert not any("faster than the plain query" in ln for ln in notes), notes
    bad = make_timings({"vanilla": {"analyze_notiming": 30.0, "analyze_timing": 200.0},
                        "step3": {"analyze_notiming": -20.0, "analyze_timing": 150.0}})
    notes = bench_report.engine_notes(stats.summarize_metric(bad, "server_ms"), {})
    odd = [ln for ln in notes if "faster than the plain query" in ln]
    assert len(odd) == 1 and odd[0].startswith("step3: analyze_notiming ran 2"), notes


def test_too_few_repetitions_are_said_not_judged():
    """Three repetitions: the step table says "too few (n = 3)" where the interval alone
    would call the 20-point change real, the ordering line says it cannot tell, and the
    notes name the cells."""
    t = make_timings({"vanilla": {"analyze_notiming": 30.0}, "step1": {"analyze_notiming": 10.0}},
                     reps=3)
    comps = stats.compare_chain(t, n_resamples=999)
    assert comps.diff_ci_high_pct.iloc[0] < 0 and not comps.overhead_differs.iloc[0]
    s = stats.summarize(t, n_resamples=999)
    md = bench_report.render_markdown(s, PROV, comparisons=comps)
    row = next(ln for ln in md.splitlines() if ln.startswith("| vanilla → step1"))
    assert "| too few (n = 3) |" in row, row
    assert f"fewer than {stats.MIN_VERDICT_REPS} repetitions behind the interval" in md
    assert bench_report.differs_text(comps.iloc[0]) == "too few (n = 3)"
    note = bench_report.few_reps_note(s)
    assert note.startswith(f"fewer than {stats.MIN_VERDICT_REPS} repetitions behind every "
                           "(build, mode) (3 each): their intervals"), note
    assert note in bench_report.engine_notes(s, {})
    # some cells short: they are named
    s2 = s.copy()
    s2.loc[s2.build == "vanilla", "n"] = 8
    s2.loc[(s2.build == "vanilla") & (s2["mode"] != "plain"), "ci_method"] = "BCa"
    assert bench_report.few_reps_note(s2).startswith(
        f"fewer than {stats.MIN_VERDICT_REPS} repetitions behind step1 plain (3), step1 "
        "analyze_notiming (3): ")
    # 5 executions each, but the overhead's interval came from 3 plain/mode pairs (the
    # vCPU rule left the others' partners out): named by its pairs
    t5 = make_timings({"vanilla": {"analyze_notiming": 30.0}}, reps=5)
    t5 = t5.drop(index=t5.index[(t5["mode"] == "plain") & (t5.rep == 0)])
    t5 = t5.drop(index=t5.index[(t5["mode"] == "analyze_notiming") & (t5.rep == 1)])
    s5 = stats.summarize(t5, pair="common", n_resamples=999)
    assert list(s5.n) == [4, 4]
    assert bench_report.few_reps_note(s5).startswith(
        f"fewer than {stats.MIN_VERDICT_REPS} repetitions behind vanilla analyze_notiming (3): ")
    lines = bench_report.ordering_check(s, comps, builds=["vanilla", "step1"])
    assert any("vanilla→step1 too few repetitions to tell" in ln for ln in lines), lines
    # enough repetitions: no note, and a verdict
    t8 = make_timings({"vanilla": {"analyze_notiming": 30.0},
                       "step1": {"analyze_notiming": 10.0}}, reps=8)
    s8 = stats.summarize(t8, n_resamples=999)
    assert bench_report.few_reps_note(s8) == ""
    assert bench_report.differs_text(stats.compare_chain(t8, n_resamples=999).iloc[0]) == "yes"


def test_differs_says_why_no_when_the_interval_excludes_zero():
    """A cold make demo printed step2 → step3 -3.80 [-7.43, -0.46] beside "no": the
    interval excludes 0, the rank test on the per-repetition overheads (p = 0.053) does
    not agree, and a bare "no" read as a contradiction.  The cell names the test."""
    base = dict(a="step2", b="step3", mode="analyze_notiming", metric="cpu_kept_ms", n_a=9,
                n_b=8, median_a_ms=160.0, median_b_ms=152.0, time_ratio=0.95, time_u=50.0,
                time_p_value=0.1, overhead_a_pct=6.6, overhead_b_pct=2.8,
                overhead_diff_pct=-3.8, diff_ci_low_pct=-7.43, diff_ci_high_pct=-0.46,
                overhead_p_value=0.053, paired=True, ci_method="hierarchical")
    row = pd.Series(stats.BuildComparison(**base).as_dict())
    assert not row["overhead_differs"]
    assert bench_report.differs_text(row) == "no (rank test p = 0.053)"
    # the test agrees: yes; the interval holds 0: a bare no, whatever the test says
    agree = pd.Series(stats.BuildComparison(**{**base, "overhead_p_value": 0.01}).as_dict())
    assert bench_report.differs_text(agree) == "yes"
    wide = pd.Series(stats.BuildComparison(**{**base, "diff_ci_high_pct": 1.2}).as_dict())
    assert bench_report.differs_text(wide) == "no"
    # too few repetitions still wins over both
    few = pd.Series(stats.BuildComparison(**{
        **base, "ci_method": stats.too_few_reps("hierarchical", 3)}).as_dict())
    assert bench_report.differs_text(few) == "too few (n = 3)"
    md = bench_report.render_markdown(stats.summarize(make_timings(
        {"step2": {"analyze_notiming": 30.0}}, reps=8), n_resamples=199), PROV,
        comparisons=pd.DataFrame([row]))
    line = next(ln for ln in md.splitlines() if ln.startswith("| step2 → step3"))
    assert "| no (rank test p = 0.053) |" in line, line
    assert "where the interval alone would say yes and the test does not" in md


def test_a_mode_faster_than_plain_beyond_noise_is_called_out():
    """A warm make test read vanilla's plain query at twice its usual CPU time in every
    repetition of one run (TIMING FALSE -44.8 % [-46.1, -43.4] against it): the tables
    printed negative costs as measured.  The notes now say the plain executions are
    suspect, for such a build only."""
    t = make_timings({"vanilla": {"analyze_notiming": -45.0, "analyze_timing": -7.0},
                      "step3": {"analyze_notiming": 3.0, "analyze_timing": 60.0}})
    s = stats.summarize(t, n_resamples=999)
    notes = bench_report.engine_notes(s, {})
    odd = [ln for ln in notes if "faster than the plain query" in ln]
    assert len(odd) == 2 and all(ln.startswith("vanilla: analyze_") for ln in odd), notes
    assert odd[0].startswith("vanilla: analyze_notiming ran 45.") and "measure it again" in odd[0]
    # the interval decides, not the point: a small or uncertain negative is noise
    assert stats.plain_suspect("b", "analyze_notiming", -6.0, -9.0, -4.9) is None
    assert stats.plain_suspect("b", "analyze_notiming", -3.0, -12.0, 4.0) is None
    assert stats.plain_suspect("b", "plain", -50.0, -60.0, -40.0) is None
    assert stats.plain_suspect("b", "analyze_timing", -6.5, float("nan"), -2.0) is None
    assert stats.plain_suspect("b", "analyze_timing", -8.0, -10.0, -5.1) == (
        "b: analyze_timing ran 8.0 % faster than the plain query [95 % interval -10.0, "
        "-5.1 %]. EXPLAIN ANALYZE runs the same plan and more, and saves only sending the "
        "result rows: unless the query returns many rows, b's plain executions did work "
        "that was not the query's (another process on its CPU, a probe on that binary, "
        "another plan), and its overheads rest on them; measure it again")


def test_a_negative_time_cost_beside_more_instructions_is_explained():
    """A warm make demo printed step4's Query-2 at -5.31 % [-11.10, -2.10] against its
    plain query beside +2.27 % in instructions, without a word.  The notes now say the
    time alone reads a saving the instructions do not show; not where the instructions
    fall too, not where the interval reaches 0, and the suspect rule keeps its own text."""
    assert stats.time_below_instructions("step4", "analyze_notiming", -5.31, -11.10, -2.10,
                                         2.27) == (
        "step4: analyze_notiming reads -5.31 % [-11.10, -2.10] against the plain query by "
        "time while it runs +2.27 % more instructions: a saving the instructions do not "
        "show; the binary's code layout (its plain and EXPLAIN paths run different code) or "
        "its backends can read so (--layouts K resamples layouts)")
    assert stats.time_below_instructions("s", "analyze_notiming", -3.0, -6.0, 0.5, 2.0) is None
    assert stats.time_below_instructions("s", "analyze_notiming", -3.0, -6.0, -1.0, -0.2) is None
    assert stats.time_below_instructions("s", "analyze_notiming", -3.0, -6.0, -1.0,
                                         float("nan")) is None
    assert stats.time_below_instructions("s", "plain", -3.0, -6.0, -1.0, 0.0) is None
    t = make_timings({"vanilla": {"analyze_notiming": 30.0, "analyze_timing": 300.0},
                      "step4": {"analyze_notiming": -4.0, "analyze_timing": 250.0},
                      "step9": {"analyze_notiming": -40.0, "analyze_timing": 250.0}})
    s = stats.summarize(t, n_resamples=999)
    instr = {("vanilla", "analyze_notiming"): 26.17, ("step4", "analyze_notiming"): 2.27,
             ("step9", "analyze_notiming"): 2.27}
    s["instr_overhead_pct"] = [instr.get((b, m), 40.0) for b, m in zip(s["build"], s["mode"],
                                                                        strict=True)]
    notes = bench_report.engine_notes(s, {})
    odd = [ln for ln in notes if "more instructions" in ln]
    assert len(odd) == 1 and odd[0].startswith(
        "step4: analyze_notiming reads -3.48 % [-4.15, -2.09] against the plain query"), notes
    # step9 is far below: the suspect rule's sentence, not this one
    assert any(ln.startswith("step9: analyze_notiming ran 39.3 % faster") for ln in notes), notes


def test_intervals_from_too_few_repetitions_are_not_printed():
    """Three repetitions: an interval of the seed table, the against-vanilla table, the
    every-build table, the step table and the chart would cover far less than 95 % (see
    test_too_few_repetitions_are_said_not_judged): the tables print the value and
    "too few (n = 3)" instead of brackets, the chart draws no whisker and labels the bar,
    and summary.csv (which has no ci_method) says so in each row's note.  With 8
    repetitions the brackets, the whiskers and an empty note are back."""
    from matplotlib.container import ErrorbarContainer

    builds = {b: {"preset": b, "version": "18.1"} for b in ("vanilla", "step1")}

    def report(reps: int):
        t = make_timings({"vanilla": {"analyze_notiming": 30.0},
                          "step1": {"analyze_notiming": 10.0}}, reps=reps)
        s = stats.attach_reference(stats.summarize(t, n_resamples=999), t, builds, None,
                                   "server_ms", n_resamples=999)
        comps = stats.compare_chain(t, n_resamples=999)
        return s, bench_report.render_markdown(s, PROV, comparisons=comps), comps

    s, md, comps = report(3)
    q2 = s[(s.build == "step1") & (s["mode"] == "analyze_notiming")].iloc[0]
    assert stats.too_few_count(q2.ci_method) == 3 and stats.too_few_count(q2.vs_ref_ci_method) == 3
    lines = md.splitlines()
    seed_row = next(ln for ln in lines if ln.startswith("| step1 (Step 1)"))
    assert f"| {q2.overhead_pct:.2f}, too few (n = 3) |" in seed_row, seed_row
    assert "[" not in seed_row, seed_row
    ref_row = next(ln for ln in lines if ln.startswith("| step1 | 18.1 | vanilla"))
    assert f"| {q2.vs_ref_pct:.2f}, too few (n = 3) |" in ref_row and "[" not in ref_row, ref_row
    every = next(ln for ln in lines if ln.startswith("| step1 | analyze_notiming | 3 "))
    assert "| too few (n = 3) |" in every and "[" not in every, every
    step = next(ln for ln in lines if ln.startswith("| vanilla → step1"))
    assert ", too few (n = 3) | too few (n = 3) |" in step, step
    console = bench_report.comparisons_table(comps)
    assert "too few (n = 3)" in list(console.columns[2].cells)[0]
    fig = bench_report.plot_overheads(s, None)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.texts]
    assert f"{q2.overhead_pct:.1f}\nn = 3: no CI" in labels, labels
    bars = next(c for c in ax.containers if isinstance(c, ErrorbarContainer))
    segs = bars.lines[2][0].get_segments()
    assert not any(seg.size and np.isfinite(seg).all() for seg in segs), segs  # no whisker
    caps = [c.get_ydata() for c in bars.lines[1]]
    assert not any(np.isfinite(y.astype(float)).any() for y in caps), caps  # nor its cap
    notes = pd.read_csv(io.StringIO(bench_report.summary_csv(s)), keep_default_na=False)["note"]
    q2_note = notes[(s.build == "step1").to_numpy() & (s["mode"] == "analyze_notiming").to_numpy()]
    assert q2_note.iloc[0] == (
        f"overhead interval from 3 repetitions (fewer than {stats.MIN_VERDICT_REPS}: covers "
        f"well under its level); vs_ref interval from 3 repetitions (fewer than "
        f"{stats.MIN_VERDICT_REPS}: covers well under its level)"), q2_note.iloc[0]

    s8, md8, _ = report(8)
    q2 = s8[(s8.build == "step1") & (s8["mode"] == "analyze_notiming")].iloc[0]
    seed_row = next(ln for ln in md8.splitlines() if ln.startswith("| step1 (Step 1)"))
    assert (f"| {q2.overhead_pct:.2f} [{q2.ci_low_pct:.2f}, {q2.ci_high_pct:.2f}] |"
            in seed_row), seed_row
    assert "too few (n =" not in md8
    ax = bench_report.plot_overheads(s8, None).axes[0]
    bars = next(c for c in ax.containers if isinstance(c, ErrorbarContainer))
    assert any(abs(seg[1][1] - seg[0][1]) > 0.1 for seg in bars.lines[2][0].get_segments())
    notes8 = pd.read_csv(io.StringIO(bench_report.summary_csv(s8)), keep_default_na=False)["note"]
    assert (notes8 == "").all(), notes8


def test_one_repetition_per_backend_is_said_so_not_a_share():
    """With one repetition per backend (the default from 8 repetitions on) every
    interval's variance is between backends by construction: the notes say what the
    units are instead of printing a 100 % share as if it were measured."""
    t = make_timings({"vanilla": {"analyze_notiming": 30.0}}, reps=10)
    t["backend"] = t["rep"] + 1  # backend k ran repetition k
    s = stats.summarize(t, n_resamples=999)
    assert set(s["backends"]) == {10}
    assert (s.loc[s["mode"] != "plain", "between_share_pct"] == 100).all()
    notes = bench_report.engine_notes(s, {"backends": 10, "reps": 10})
    assert ("10 backends per build (fresh clusters), one repetition each: every interval "
            "resamples backends, so process-to-process variance is all in it") in notes
    assert not [n for n in notes if "between-backend variance is" in n], notes
    # two repetitions per backend: the share is measured and printed
    t["backend"] = t["rep"] // 2 + 1
    s = stats.summarize(t, n_resamples=999)
    notes = bench_report.engine_notes(s, {"backends": 5, "reps": 10})
    assert [n for n in notes if n.startswith("5 backends per build (fresh clusters): "
                                             "between-backend variance is")], notes


def test_an_estimate_from_too_few_pairs_for_an_interval_says_too_few():
    """A make demo run (one repetition per backend) kept 6 of step1's TIMING TRUE
    executions and 5 of its plain ones, only 2 of them in the same repetitions: the seed
    table printed 240.40 with no interval and no word.  It now says too few (n = 2)."""
    t = make_timings({"vanilla": {"analyze_notiming": 30.0, "analyze_timing": 200.0}},
                     reps=10)
    t["backend"] = t["rep"] + 1
    t.loc[(t["mode"] == "analyze_timing") & (t["rep"] >= 2), "server_ms"] = float("nan")
    s = stats.summarize(t, n_resamples=999, pair="common").set_index("mode")
    timing = s.loc["analyze_timing"]
    assert timing["overhead_pct"] == pytest.approx(200.0, abs=5)
    assert np.isnan(timing["ci_low_pct"]) and np.isnan(timing["ci_high_pct"])
    assert stats.too_few_count(timing["ci_method"]) == 2, timing["ci_method"]
    assert stats.few_reps_text(timing["ci_method"]) == "too few (n = 2)"
    # the rows with enough pairs keep their interval, unmarked
    assert stats.too_few_count(s.loc["analyze_notiming", "ci_method"]) is None
    assert s.loc["plain", "ci_method"] == "none"
    md = bench_report.render_markdown(s.reset_index(), {})
    line = next(ln for ln in md.splitlines() if ln.startswith("| vanilla (Original) |"))
    assert f"| {timing['overhead_pct']:.2f}, too few (n = 2) |" in line, line
