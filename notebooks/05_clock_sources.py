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
# # 05 — Clock sources: what one read costs here, and what that does to TIMING TRUE
#
# EXPLAIN ANALYZE with TIMING on reads the clock twice per row per node. What a read
# costs depends on the clock: `CLOCK_MONOTONIC` through the vDSO (PostgreSQL 18's
# choice), `CLOCK_MONOTONIC_COARSE` (jiffy resolution, nearly free), or the TSC read
# directly (`rdtsc`, `rdtscp`, with fences). The first part measures each on this
# machine; the second runs the seed benchmark on the builds that switch the clock
# source (`coarse_clock`, `tsc_clock`) next to `vanilla`, when they are built.

# %% tags=["parameters"]
SCALE = 0.02
BUILDS = ["vanilla", "coarse_clock", "tsc_clock"]
WORKLOAD = "nested_loop"
REPS = 5
CLOCK_LOOPS = 5_000_000
CLOCK_REPEATS = 3
RUN_DIR = None          # an earlier benchmark run of these builds to read instead

# %%
import pandas as pd
from IPython.display import display

from profkit.experiments import bench
from profkit.lab import notebook as nb
from profkit.analyze import predict as P
from profkit.analyze import correction as C
from profkit.analyze import stats
from profkit.collect import clock

info = clock.clock_info()
display(pd.Series(info.as_dict(), name="value").to_frame())

# %% [markdown]
# ## Cost per call of each clock (`clock_bench`, compiled here)

# %%
earlier = nb.resolve_run(RUN_DIR, need=("clock_cost",), kind="clock_cost") if RUN_DIR else None
if earlier is not None:
    cost = earlier.table("clock_cost")
    print(f"read {earlier.run_id}")
else:
    cost = clock.measure_clocks(loops=CLOCK_LOOPS, repeats=CLOCK_REPEATS)
    if cost.attrs.get("skipped"):
        print("not available on this CPU:", ", ".join(cost.attrs["skipped"]))
    nb.save_run("clock_cost", {"clock_cost": cost.drop(columns=["histogram"])},
                clock_info=info.as_dict())
display(cost.drop(columns=["histogram"], errors="ignore").round(2))

# %%
c = cost.set_index("source")["ns_per_call"]
assert "clock_monotonic" in c.index, c
assert 1 <= c["clock_monotonic"] <= 10_000, c
assert (c > 0).all()
if "clock_monotonic_coarse" in c.index:
    # the coarse clock only copies the last tick: cheaper than a full monotonic read
    assert c["clock_monotonic_coarse"] < c["clock_monotonic"], c
if "rdtsc" in c.index and "lfence_rdtsc_lfence" in c.index:
    assert c["rdtsc"] <= c["lfence_rdtsc_lfence"] * 1.5, c

# %% [markdown]
# ## Resolution: how far apart two successive reads land
# (share of successive reads per power-of-two bucket; 0 = the clock did not advance)

# %%
if "histogram" in cost.columns:
    hist = clock.histogram_long(cost)
    piv = hist.pivot_table(index="bucket_ns", columns="source", values="share", fill_value=0)
    display(piv.style.format("{:.1%}"))
    # the coarse clock mostly does not move between two reads
    if "clock_monotonic_coarse" in piv.columns:
        assert 0 in piv.index and piv.loc[0, "clock_monotonic_coarse"] > 0.9, piv

# %% [markdown]
# ## What the clock source does to TIMING TRUE

# %%
choice = nb.available_builds(BUILDS)
print(choice.report())
run = nb.resolve_run(RUN_DIR, need=("timings",), builds=choice.names, workload=WORKLOAD,
                     scale=SCALE, kind="bench")
if run is None:
    progress = nb.Progress(description=f"benchmark {', '.join(choice.names)}")
    with progress:
        res = bench.run_bench(choice.names, WORKLOAD, SCALE, REPS, progress=progress.say,
                              instructions="none")
    run = nb.Run.load(res.out_dir)
display(run)
timings = run.timings()
# the bench's own metric (backend CPU, the executions the vCPU calibration caught in a
# slow spell left out, when the run has the calibration) and its pairing
metric = stats.default_metric(timings)
summary = stats.summarize_metric(timings, metric)
kept, col = stats.metric_frame(timings, metric)
print(f"metric: {metric}")
s = summary.set_index(["build", "mode"])
display(summary[["build", "mode", "n", "median_ms", "overhead_pct", "ci_low_pct",
                 "ci_high_pct"]].round(2))

# %% [markdown]
# ## Predicted clock cost vs the measured TIMING overhead
# reads (from the plan) × ns per read of the build's clock, against the time TIMING on adds
# over TIMING off: the median of each repetition's own difference (the modes of one
# repetition run back to back), not the difference of two medians a switch of this VM's
# speed can invert.

# %%
from profkit.pg.cluster import Cluster
from profkit.pg.workloads import get_workload

wl = get_workload(WORKLOAD)
with Cluster(choice.builds["vanilla"], name="nb05") as cl, cl.connect() as conn:
    wl.load(conn, SCALE)
    explain = conn.execute(wl.query("analyze_timing", fmt="json")).fetchone()[0]
    reads = P.predict(explain, P.context_from_conn(conn, "analyze_timing")).totals["clock_reads"]

SOURCE_OF = {"vanilla": "clock_monotonic", "coarse_clock": "clock_monotonic_coarse",
             "tsc_clock": "rdtsc"}
rows = []
for b in choice.names:
    added = C.paired_gap(kept[kept["build"] == b], col, "analyze_timing", "analyze_notiming")
    src = SOURCE_OF.get(b)
    ns = float(c[src]) if src in c.index else float("nan")
    rows.append({"build": b, "clock": src, "ns_per_read": ns, "reads": reads,
                 "predicted_ms": reads * ns / 1e6, "measured_timing_minus_notiming_ms": added,
                 "timing_overhead_pct": s.loc[(b, "analyze_timing"), "overhead_pct"]})
clock_effect = pd.DataFrame(rows)
display(clock_effect.round(3))

# %%
v = clock_effect.set_index("build").loc["vanilla"]
assert reads > 0 and v["measured_timing_minus_notiming_ms"] > 0, v
# reading CLOCK_MONOTONIC twice per row is most of what TIMING TRUE adds
ratio = v["predicted_ms"] / v["measured_timing_minus_notiming_ms"]
assert 0.1 < ratio < 10, ratio
for b in choice.names:
    if b != "vanilla":
        # a cheaper clock gives a smaller TIMING overhead than vanilla's
        assert (s.loc[(b, "analyze_timing"), "overhead_pct"]
                < s.loc[("vanilla", "analyze_timing"), "overhead_pct"]), b
skipped = [b for b in BUILDS if b not in choice.builds]
if skipped:
    print("SKIPPED (not built):", ", ".join(skipped), "— `profkit build "
          + " ".join(skipped) + "` and re-run for the comparison")
