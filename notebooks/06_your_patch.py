# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 — Your patch, your queries: the seed-style answer for them
#
# From a patch file (a unified diff of PostgreSQL, `git diff > my.patch`) and a workload
# file (TOML: setup SQL with `{scale}`/sizes, an optional check, named queries) to:
#
# 1. **the seed's table** for your patch against vanilla: the plain query (Query-1) and
#    `EXPLAIN ANALYZE` with `TIMING FALSE` / `TRUE` (Query-2 / Query-3), repeated and
#    interleaved across the two builds, overheads with 95 % bootstrap CIs, and
#    instruction counts beside them (callgrind here: this VM has no hardware counters);
# 2. **a differential flamegraph** of Query-3 (or Query-2): perf samples of the patched
#    backend, red where it spends more than vanilla, blue where less;
# 3. **per-function call counts**: exact calls of the Instr* functions and of
#    `clock_gettime`, per build and mode, from the callgrind files the benchmark kept.
#
# The patch becomes a named build (`profkit build NAME --patch FILE` does the same from a
# shell): cached by content next to the presets, sharing their ccache, so a one-file patch
# builds in a minute or two. The default patch, written for profkit's tests, reads the
# clock a second time in `InstrStopNode` — a deliberate slow-down with a known answer:
# with TIMING on, one more `clock_gettime` per `InstrStopNode` call, nothing else.
#
# **Real scale**: `SCALE = 1.0` with `WORKLOAD` = `nested_loop.toml` is the seed's size
# (~2e9 rows through the nested loop, minutes per query); `SCALE = 0.1`, `REPS = 15`,
# `INSTR_BUDGET_S = 120` gives stable figures in ~15 min on 2 cores. The values below are
# the small ones `make test` uses.

# %% tags=["parameters"]
PATCH = "../tests/fixtures/patches/instrstop-double-clock.patch"  # your unified diff (-p1)
WORKLOAD = "../profkit/workloads/join_sum.toml"                   # your workload file
QUERY = None             # one of the file's [queries] (None: its first)
BUILD_NAME = "pk15-double-clock"  # the named build made from PATCH (on top of vanilla)
BASELINE = "vanilla"
SCALE = 0.1              # join_sum: i1 100,000 rows, i2 100
REPS = 5                 # interleaved repetitions per build and mode
INSTR_BUDGET_S = 15.0    # callgrind seconds per build (the scale is lowered to fit)
DIFF_MODE = "analyze_timing"   # Query-3; "analyze_notiming" for Query-2
PERF_REPS = 30           # query repetitions under perf, per build
RUN_DIR = None           # a bench run directory (or id under profiles/) to read instead

# %%
from pathlib import Path

import pandas as pd
from IPython.display import Image, Markdown, display

from profkit.experiments import bench
from profkit.lab import notebook as nb
from profkit.pg.build import define_build, get_build
from profkit.pg.workloads import SEED_QUERY_NAMES, get_workload, workload_spec
from profkit.render import bench_report

patch = Path(PATCH).expanduser().resolve()
wl_spec = workload_spec(str(Path(WORKLOAD).expanduser().resolve()), QUERY)
wl = get_workload(wl_spec)
print(f"workload {wl.name} from {wl.path}: {' '.join(wl.select_sql.split())}")
# the named build: the same patch text is the same cache key, so this is instant when built
define_build(BUILD_NAME, [patch], base=BASELINE)
progress = nb.Progress(description=f"builds {BASELINE}, {BUILD_NAME}")
with progress:
    builds = {name: get_build(name, progress=progress.say) for name in (BASELINE, BUILD_NAME)}
display(builds[BUILD_NAME])
print(f"using builds: {', '.join(builds)}")
applied = builds[BUILD_NAME].patches[-1]
assert applied["name"] == patch.stem and applied["text"] == patch.read_text(), applied["name"]

# %% [markdown]
# ## 1. The seed's table for your patch
#
# One run of `profkit bench` (the same harness as the CLI): clusters of both builds
# loaded with the workload, the three modes interleaved in a random order per repetition.

# %%
run = nb.resolve_run(RUN_DIR, need=("timings", "instructions"), builds=list(builds),
                     workload=wl_spec, scale=SCALE, kind="bench")
if run is None:
    progress = nb.Progress(description=f"benchmark {wl.name} @ {SCALE:g}")
    with progress:
        result = bench.run_bench(list(builds), wl_spec, SCALE, REPS, progress=progress.say,
                                 instructions="callgrind", callgrind_budget_s=INSTR_BUDGET_S)
    run = nb.Run.load(result.out_dir)
    print(f"collected a fresh run: {run.run_id}")
else:
    print(f"read an earlier run from disk: {run.run_id} (set RUN_DIR to pick another)")
files = bench.write_report(run.path)
summary = files.summary
timings = run.timings()
seed = bench_report.seed_table(summary)
display(seed.drop(columns=["seed_name", "seed_q2_overhead_pct", "seed_q3_overhead_pct"])
        .round(2))

# %%
for mode in ("analyze_notiming", "analyze_timing"):
    display(nb.Comparison.chain(timings, builds=list(builds), mode=mode))
display(Image(filename=str(files.chart_png)))

# %%
s = summary.set_index(["build", "mode"])
assert set(timings["build"]) == set(builds), set(timings["build"])
assert (timings.groupby(["build", "mode"]).size() >= min(REPS, 3)).all()
for (b, m), r in s.iterrows():
    assert r["median_ms"] > 0, (b, m)
    if m != "plain":
        assert r["ci_low_pct"] <= r["overhead_pct"] <= r["ci_high_pct"], (b, m, r)
instr = bench.load_instructions(run.path)
assert instr is not None and len(instr) == 3 * len(builds), instr
# instruction counts do not drift with the machine: TIMING on costs more than TIMING off
for b in builds:
    assert s.loc[(b, "analyze_timing"), "instr"] > s.loc[(b, "analyze_notiming"), "instr"] > 0
q3_instr = {b: s.loc[(b, "analyze_timing"), "instr_overhead_pct"] for b in builds}
print("Query-3 instruction overhead over plain: "
      + ", ".join(f"{b} {v:+.1f} %" for b, v in q3_instr.items()))

# %% [markdown]
# ## 2. Differential flamegraph: the patch vs vanilla
#
# perf (`-g`, frame pointers) on each build's backend while it runs the chosen query
# `PERF_REPS` times. Widths are the patched build's samples; red frames gain samples
# against vanilla (normalised to the same total), blue frames lose them.

# %%
from profkit import paths
from profkit.collect import perf
from profkit.pg.cluster import Cluster
from profkit.render.flamegraph import FlameGraph
from profkit.rundir import load_run

profiles: dict[str, perf.PerfProfile] = {}
progress = nb.Progress(len(builds), f"perf {SEED_QUERY_NAMES[DIFF_MODE]} ({DIFF_MODE})")
with progress:
    for name, build in builds.items():
        with Cluster(build, name=f"nb06-{name}") as cl, cl.connect() as conn:
            wl.load(conn, SCALE)
            sql = wl.query(DIFF_MODE)
            perf.run_query(conn, sql, 1)  # warm-up, not recorded
            with nb.open_run("perf", build=build, workload=wl_spec, mode=DIFF_MODE,
                             tools=("gcc",)) as rd:
                rec, _ = perf.record_query(cl, conn, sql, run=rd, reps=PERF_REPS, scale=SCALE,
                                           query_name=SEED_QUERY_NAMES[DIFF_MODE])
        profiles[name] = perf.fold_run(load_run(rec.run_dir), binary=build.postgres)
        progress.advance(message=f"{name}: {profiles[name].folding.samples} samples")


def clock_share(p: perf.PerfProfile) -> float:
    f = p.functions
    return float(f.loc[f["function"].str.contains("clock_gettime"), "self_share"].sum())


shares = pd.DataFrame([{"build": n, "samples": int(p.folding.samples),
                        "instrumentation_share": p.instrumentation_share,
                        "clock_gettime_share": clock_share(p)} for n, p in profiles.items()])
display(shares.style.format({"instrumentation_share": "{:.1%}",
                             "clock_gettime_share": "{:.1%}"}))
diff = FlameGraph(profiles[BUILD_NAME].counts, diff_against=profiles[BASELINE].counts,
                  title=f"{wl.name} {SEED_QUERY_NAMES[DIFF_MODE]}: {BUILD_NAME} vs {BASELINE} "
                        "(red: more samples)",
                  provenance=profiles[BUILD_NAME].run.subtitle_facts())
display(diff)
svg = diff.save(paths.flamegraphs_dir() / f"{BUILD_NAME}-vs-{BASELINE}-{wl.name}-{DIFF_MODE}.svg")
print(f"saved {svg}")

# %%
assert (shares["samples"] > 50).all(), shares
assert Path(svg).stat().st_size > 1000 and "<svg" in Path(svg).read_text()[:2000]
assert diff.total == profiles[BUILD_NAME].folding.samples
for p in profiles.values():
    assert "ExecProcNodeInstr" in set(p.functions["function"])

# %% [markdown]
# ## 3. Per-function call counts (callgrind, exact)
#
# The benchmark kept one callgrind file per build and mode (one execution each, at the
# scale in `instructions.csv`). Calls into each function, summed over its clones.

# %%
from profkit.parse.callgrind import parse_callgrind_file

FUNCS = ["ExecProcNodeInstr", "InstrStartNode", "InstrStopNode", "InstrEndLoop",
         "InstrAggNode", "clock_gettime"]


def calls_in(df: pd.DataFrame, fn: str) -> int:
    base = df["function"].str.replace(r"(@.*|\.(part|isra|constprop)\.\d+)$", "", regex=True)
    return int(pd.to_numeric(df.loc[base == fn, "calls"], errors="coerce").fillna(0).sum())


rows = []
for _, r in instr.iterrows():
    prof = parse_callgrind_file(run.path / r["out_file"], build=r["build"])
    for fn in FUNCS:
        rows.append({"build": r["build"], "mode": r["mode"], "function": fn,
                     "calls": calls_in(prof.functions, fn)})
calls = pd.DataFrame(rows).pivot_table(index=["mode", "function"], columns="build",
                                       values="calls").astype("int64")
calls = calls[list(builds)]
calls["difference"] = calls[BUILD_NAME] - calls[BASELINE]
display(calls)
print(f"callgrind scale: {instr['scale'].iloc[0]:g}")

# %%
c = calls
# the instrumentation is there and the two builds run the same plan: same Instr* calls
for mode in ("analyze_notiming", "analyze_timing"):
    for fn in ("ExecProcNodeInstr", "InstrStartNode", "InstrStopNode"):
        assert c.loc[(mode, fn), BASELINE] > 0, (mode, fn)
        assert c.loc[(mode, fn), "difference"] == 0, (mode, fn, c.loc[(mode, fn)])
# the plain query: only extensions' brackets (pg_stat_statements times each statement)
assert c.loc[("plain", "InstrStopNode"), BASELINE] < c.loc[("analyze_notiming",
                                                           "InstrStopNode"), BASELINE] / 10
assert c.loc[("analyze_timing", "clock_gettime"), BASELINE] > c.loc[("analyze_timing",
                                                                    "InstrStopNode"), BASELINE]
if patch.name == "instrstop-double-clock.patch":
    # the patch's known answer: with TIMING on, exactly one more clock read per
    # timed InstrStopNode call; with TIMING off (no clock reads in the nodes'
    # InstrStopNode), no change
    stops = c.loc[("analyze_timing", "InstrStopNode"), BUILD_NAME]
    assert c.loc[("analyze_timing", "clock_gettime"), "difference"] == stops, c
    assert c.loc[("analyze_notiming", "clock_gettime"), "difference"] == 0, c
    # the plain query's only InstrStopNode calls are pg_stat_statements' bracket around
    # the statement, which is timed: one more read for each of them too
    assert (c.loc[("plain", "clock_gettime"), "difference"]
            == c.loc[("plain", "InstrStopNode"), BUILD_NAME]), c
    # ... which costs instructions, measured without noise
    assert (s.loc[(BUILD_NAME, "analyze_timing"), "instr"]
            > s.loc[(BASELINE, "analyze_timing"), "instr"])
    print(f"double clock: +{stops:,} clock_gettime calls = InstrStopNode calls "
          f"({stops:,}); Query-3 instructions "
          f"{s.loc[(BASELINE, 'analyze_timing'), 'instr']:,.0f} → "
          f"{s.loc[(BUILD_NAME, 'analyze_timing'), 'instr']:,.0f}")

# %%
display(Markdown(f"Report: `{files.report_md}`; flamegraph: `{svg}`; "
                 f"bench run: `{run.path}`."))
