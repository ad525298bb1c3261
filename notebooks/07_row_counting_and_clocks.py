# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 — Row counting against plain vanilla, and PostgreSQL 19's clocks
#
# Two questions about going beyond the seed, answered from **one** interleaved
# `profkit bench` run:
#
# 1. **Row counting at ≤ 1 %.** What Query-2 (`EXPLAIN (ANALYZE, TIMING FALSE)`) costs
#    against **vanilla's** plain Query-1 — not the build's own, which a patch that slows the
#    plain query flatters — and how much the patch slows the plain query itself (target
#    ≤ 0.3 %). In instructions (callgrind: deterministic) and in backend CPU time with
#    bootstrap CIs (the executions a slow vCPU disturbed are left out: `cpu_kept_ms`).
# 2. **Clocks.** Query-3 (`TIMING TRUE`) on PostgreSQL 19 with
#    `timing_clock_source=system` and `=tsc` (upstream's TSC clock), against PG18's
#    `tsc_clock` backport — arms of one build with different settings
#    (`LABEL=PRESET:GUC=VALUE`).
#
# Every figure below comes from the run's own `summary.csv` (columns `vs_ref_*`: against
# the vanilla build of the same PostgreSQL major, `ref_build`).

# %% tags=["parameters"]
SCALE = 0.07
REPS = 25
INSTR_SCALE = 0.01
WORKLOAD = "nested_loop"
# the row-counting variants, measured against vanilla of their own PostgreSQL major
ROW_BUILDS = ["vanilla", "step3", "step4", "step5", "pg19/step5"]
# the clock comparison: arms LABEL=PRESET:GUC=VALUE (PG19's vanilla with each clock source)
CLOCK_ARMS = [
    "pg19sys=pg19/vanilla:timing_clock_source=system",
    "pg19tsc=pg19/vanilla:timing_clock_source=tsc",
    "tsc_clock",
]
# the best timing variant (pg19/fast_timing: lean per-node wrappers, RDTSC read directly); it
# joins the run and the Query-3 table below. Its floor (4 clock reads per Nested Loop row)
# is measured in benchmarks/bench_query3_timing.py.
BEST_TIMING: list[str] = ["fast=pg19/fast_timing"]
RUN_DIR = None          # an earlier run of these arms to read instead of measuring

# %%
import pandas as pd
from IPython.display import Markdown, display

from profkit.analyze import stats
from profkit.experiments import bench
from profkit.lab import notebook as nb
from profkit.render import bench_report

arms = bench.parse_builds([*ROW_BUILDS, *CLOCK_ARMS, *BEST_TIMING])
choice = nb.available_builds(list(dict.fromkeys(a.preset for a in arms)))
use = [a for a in arms if a.preset in choice.builds]
labels = [a.label for a in use]
print(f"using builds: {', '.join(labels)}")
for name, why in choice.skipped.items():
    print(f"SKIPPED build {name}: {why}")
display(pd.DataFrame([{"label": a.label, "preset": a.preset,
                       "settings": ", ".join(f"{k}={v}" for k, v in a.settings)} for a in use]))

# %% [markdown]
# ## The run (or an earlier one of the same arms, scale and workload)

# %%
run = nb.resolve_run(RUN_DIR, need=("timings",), builds=labels, workload=WORKLOAD,
                     scale=SCALE, kind="bench")
if run is None:
    progress = nb.Progress(description=f"benchmark {', '.join(labels)}")
    with progress:
        res = bench.run_bench(use, WORKLOAD, SCALE, REPS, progress=progress.say,
                              instructions="auto", instr_scale=INSTR_SCALE)
    run_dir = res.out_dir
    print("collected a fresh run:", run_dir)
else:
    run_dir = run.path
    print("read an earlier run from disk:", run_dir)
files = bench.write_report(run_dir)
summary = files.summary
timings = bench.load_timings(run_dir)
metric = str(summary["metric"].iloc[0])
print(f"time measure: {metric}; report: {files.report_md}")

# %% [markdown]
# ## How steady was the vCPU?
# A fixed ~3 ms calibration work ran on the backends' CPU just before and after every
# execution; an execution is left out of `cpu_kept_ms` when either calibration ran slow
# (threshold from this run's own calibrations).

# %%
adj, speed = stats.vcpu_adjust(timings)
print(speed.describe())
display(adj.groupby(["build", "mode"])[["cpu_ms", "speed_factor", "invol_cs", "migrations",
                                        "steal_cpu_ms"]].median().round(3))
assert speed.n == len(timings) and speed.reference_ms > 0
assert speed.rejected < len(timings) / 2, speed  # most executions are kept

# %% [markdown]
# ## 1. Row counting against vanilla's plain Query-1

# %%
rt = bench_report.reference_table(summary).set_index("build")
rows = [a.label for a in bench.parse_builds(ROW_BUILDS) if a.label in labels]
rc = rt.loc[rows, ["pg_version", "ref_build",
                   "plain_vs_ref_instr_pct", "q2_vs_ref_instr_pct",
                   "plain_vs_ref_pct", "plain_vs_ref_ci_low", "plain_vs_ref_ci_high",
                   "q2_vs_ref_pct", "q2_vs_ref_ci_low", "q2_vs_ref_ci_high",
                   "plain_vs_ref_ci_method", "q2_vs_ref_ci_method"]]
own = summary[summary["mode"] == "analyze_notiming"].set_index("build")
rc["q2_own_plain_pct"] = own["overhead_pct"].reindex(rc.index)
rc["q2_own_instr_pct"] = own["instr_overhead_pct"].reindex(rc.index)
methods = ["plain_vs_ref_ci_method", "q2_vs_ref_ci_method"]
display(rc.drop(columns=methods)
        .astype({c: float for c in rc.columns if c not in ("pg_version", "ref_build", *methods)})
        .round(3))


def interval(v: float, lo: float, hi: float, method: str) -> str:
    """The value and its interval; an interval from fewer than 4 repetitions is not
    shown (it covers far less than 95 %): "too few (n = N)" instead."""
    few = stats.few_reps_text(method)
    return f"{v:+.2f} % " + (f"({few})" if few else f"[{lo:+.2f}, {hi:+.2f}]")


def verdict(r: pd.Series) -> str:
    ok_q2 = r.q2_vs_ref_instr_pct <= 1.0
    ok_plain = r.plain_vs_ref_instr_pct <= 0.3
    return (f"Query-2 {r.q2_vs_ref_instr_pct:+.2f} % ({'≤' if ok_q2 else '>'} 1.0), plain "
            f"{r.plain_vs_ref_instr_pct:+.2f} % ({'≤' if ok_plain else '>'} 0.3) in "
            f"instructions; by {metric}: Query-2 "
            + interval(r.q2_vs_ref_pct, r.q2_vs_ref_ci_low, r.q2_vs_ref_ci_high,
                       r.q2_vs_ref_ci_method)
            + ", plain " + interval(r.plain_vs_ref_pct, r.plain_vs_ref_ci_low,
                                    r.plain_vs_ref_ci_high, r.plain_vs_ref_ci_method) + " — "
            + ("meets both targets in instructions" if ok_q2 and ok_plain
               else "does NOT meet the targets in instructions"))


display(Markdown("\n".join(f"- **{b}** (against {r.ref_build}): {verdict(r)}"
                           for b, r in rc.iterrows() if b != r.ref_build)))

# %%
# every row is measured against vanilla of its own major; vanilla against itself is 0
assert rc.loc["vanilla", "ref_build"] == "vanilla"
assert rc.loc["vanilla", "plain_vs_ref_pct"] == 0.0
assert rc.loc["vanilla", "plain_vs_ref_instr_pct"] == 0.0
for b, r in rc.iterrows():
    assert str(r.pg_version)[:2] == ("19" if b.startswith("pg19") else "18"), (b, r.pg_version)
    assert r.ref_build != "vanilla" if b.startswith("pg19") else r.ref_build == "vanilla", b
    if b != r.ref_build:
        assert r.q2_vs_ref_ci_low <= r.q2_vs_ref_pct <= r.q2_vs_ref_ci_high, b
# vanilla's row counting costs far more than the patched builds'
for b in ("step3", "step4", "step5"):
    if b in rc.index:
        assert rc.loc[b, "q2_vs_ref_instr_pct"] < rc.loc["vanilla", "q2_own_instr_pct"] / 2, b
# step5 counts rows for fewer instructions than step3, against the same plain vanilla
if {"step3", "step5"} <= set(rc.index):
    assert rc.loc["step5", "q2_vs_ref_instr_pct"] < rc.loc["step3", "q2_vs_ref_instr_pct"], rc

# %% [markdown]
# ### Can the times judge 1 %?
# The half-width of each Query-2 CI against vanilla's plain query, in percentage points.
# Where it is above 1, the times of this run cannot tell 1 % from 0 and the claim rests on
# the instruction counts above. An interval from fewer than 4 repetitions has no
# half-width here: it would look narrower than the times can support.

# %%
few = rc["q2_vs_ref_ci_method"].map(stats.too_few_count)
hw = ((rc["q2_vs_ref_ci_high"] - rc["q2_vs_ref_ci_low"]) / 2).astype(float).where(few.isna())
display(hw.rename("Q2 vs ref CI half-width (pp)").round(2).to_frame())
wide = hw[hw > 1.0]
short = [f"{b} (n = {int(n)})" for b, n in few.dropna().items()]
print("every Query-2 CI within ±1 pp" if wide.empty and not short else
      "; ".join(([f"CI wider than ±1 pp for {', '.join(wide.index)}"] if len(wide) else [])
                + ([f"too few repetitions for {', '.join(short)}"] if short else []))
      + ": rely on the instruction counts there")
judged = [b for b in rc.index if pd.isna(few[b])]
assert hw[judged].notna().all() and (hw[judged] > 0).all(), hw

# %% [markdown]
# ## 2. Query-3 (TIMING TRUE): PostgreSQL 19's clock sources and PG18's `tsc_clock`
# Overhead over each arm's own plain query, and against vanilla's plain query of the same
# major (`pg19sys`, PG19 vanilla reading the system clock, is PG19's reference here, as
# no PG19 arm without settings is in the run).

# %%
q3 = summary[summary["mode"] == "analyze_timing"].set_index("build")
clock_labels = ["vanilla", *(a.label for a in bench.parse_builds([*CLOCK_ARMS, *BEST_TIMING])
                             if a.label in labels)]
clocks = q3.loc[[b for b in clock_labels if b in q3.index],
                ["pg_version", "overhead_pct", "ci_low_pct", "ci_high_pct", "instr_overhead_pct",
                 "ref_build", "vs_ref_pct", "vs_ref_ci_low_pct", "vs_ref_ci_high_pct"]]
display(clocks.astype({c: float for c in clocks.columns if c not in ("pg_version", "ref_build")})
        .round(2))
display(Markdown("\n".join(
    f"- **{b}**: Query-3 {r.overhead_pct:+.1f} % [{r.ci_low_pct:+.1f}, {r.ci_high_pct:+.1f}] "
    f"over its own plain query" for b, r in clocks.iterrows())))

# %%
# upstream's TSC clock costs less per row than the system clock on the same build
assert (clocks.loc["pg19tsc", "overhead_pct"] < clocks.loc["pg19sys", "overhead_pct"]), clocks
# and so does PG18's backport against PG18 vanilla
assert clocks.loc["tsc_clock", "overhead_pct"] < clocks.loc["vanilla", "overhead_pct"], clocks
for b, r in clocks.iterrows():
    assert r.ci_low_pct <= r.overhead_pct <= r.ci_high_pct, b
    # timing every row is never free: the instruction counts say so exactly; the times of
    # 5 repetitions on this VM may not resolve it (a fresh-clone make test once measured
    # pg19tsc at <= 0 % here; its rerun passed), but their interval must not say it
    # costs less than nothing
    assert r.instr_overhead_pct > 0, (b, r.instr_overhead_pct)
    assert r.ci_high_pct > 0, (b, r.ci_low_pct, r.ci_high_pct)

# %% [markdown]
# How far these clocks' per-node times are from vanilla's, and from vanilla's and the TSC
# arm's minus their own clock reads (its bias table), is what `profkit timing-accuracy`
# measures, with the same arm syntax, e.g.
# `profkit timing-accuracy --arm vanilla --arm pg19sys=pg19/vanilla:timing_clock_source=system
# --arm pg19tsc=pg19/vanilla:timing_clock_source=tsc --arm tsc_clock`.
