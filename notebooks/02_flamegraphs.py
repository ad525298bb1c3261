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
# # 02 — Flamegraphs: where EXPLAIN ANALYZE's time goes
#
# `perf record -g` on the backend while it runs the workload's query in each mode,
# folded into stacks, drawn here as interactive flamegraphs (click to zoom, Search
# to highlight a function; instrumentation frames are teal). Each graph is an
# `<iframe srcdoc>`, so several in one notebook do not interfere.
#
# Differential graphs (FlameGraph's difffolded idea): widths from the "after"
# profile, red where it spends more samples than the "before" profile, blue where
# it spends fewer.
#
# Recordings are read from `profiles/` when a folded perf run of the same build,
# workload, scale and mode exists (or from `RUN_DIR`); otherwise recorded now.

# %% tags=["parameters"]
SCALE = 0.03
BUILDS = ["vanilla", "step3"]   # the first is the baseline of the build-to-build diff
MODES = ["plain", "analyze_notiming", "analyze_timing"]
WORKLOAD = "nested_loop"
REPS = {"plain": 3, "analyze_notiming": 2, "analyze_timing": 1}  # similar sample counts
FREQ = 999
RUN_DIR = None   # a directory holding earlier perf run directories (default: profiles/)

# %%
from pathlib import Path

from IPython.display import Markdown, display

from profkit.lab import notebook as nb
from profkit.collect import perf
from profkit.rundir import load_run
from profkit.parse.folded import instrumentation_functions
from profkit.pg.cluster import Cluster
from profkit.pg.workloads import SEED_QUERY_NAMES, get_workload
from profkit.render.flamegraph import FlameGraph

choice = nb.available_builds(BUILDS)
print(choice.report())
assert choice.names and choice.names[0] == BUILDS[0], "the baseline build is needed"
wl = get_workload(WORKLOAD)

# %% [markdown]
# ## Recordings: earlier ones from disk, missing ones now

# %%
def earlier_profile(build: str, mode: str):
    for run in reversed(nb.list_runs(RUN_DIR)):
        p = run.provenance
        if (p.get("tool") == "perf" and p.get("build_name") == build and p.get("mode") == mode
                and p.get("workload") == WORKLOAD and p.get("scale") == SCALE
                and (run.path / perf.FUNCTIONS_PARQUET).exists()):
            return perf.load_profile(run.path)
    return None


profiles: dict[tuple[str, str], perf.PerfProfile] = {}
for name, build in choice.builds.items():
    todo = []
    for mode in MODES:
        prof = earlier_profile(name, mode)
        if prof is None:
            todo.append(mode)
        else:
            profiles[(name, mode)] = prof
            print(f"{name} {mode}: read {prof.run.run_id} from disk")
    if not todo:
        continue
    progress = nb.Progress(len(todo), f"perf on {name}")
    with progress, Cluster(build, name=f"nb02-{name}") as cl, cl.connect() as conn:
        progress.say(f"loading {WORKLOAD} at scale {SCALE}")
        wl.load(conn, SCALE)
        for mode in todo:
            sql = wl.query(mode)
            perf.run_query(conn, sql, 1)  # warm-up, not recorded
            with nb.open_run("perf", build=build, workload=WORKLOAD, mode=mode,
                             root=RUN_DIR, tools=("gcc",)) as rd:
                rec, _ = perf.record_query(cl, conn, sql, run=rd, reps=REPS[mode],
                                           scale=SCALE, freq=FREQ,
                                           query_name=SEED_QUERY_NAMES.get(mode, mode))
            profiles[(name, mode)] = perf.fold_run(load_run(rec.run_dir), binary=build.postgres)
            progress.advance(message=f"{mode}: {rec.samples} samples")
            print(f"{name} {mode}: recorded {rec.run_id}")

# %% [markdown]
# ## How much of each profile is instrumentation

# %%
import pandas as pd

rows = []
for (name, mode), prof in profiles.items():
    inst = instrumentation_functions(prof.functions)
    rows.append({"build": name, "mode": mode, "samples": int(prof.folding.samples),
                 "instrumentation_share": prof.instrumentation_share,
                 "top_instrumentation": ", ".join(inst["function"].head(3))})
shares = pd.DataFrame(rows)
display(shares.style.format({"instrumentation_share": "{:.1%}"}))

# %%
base = BUILDS[0]
sh = shares.set_index(["build", "mode"])["instrumentation_share"]
assert (shares["samples"] > 20).all(), shares
# No EXPLAIN, (almost) no instrumentation; TIMING on adds the clock reads on top of row counting.
assert sh[(base, "plain")] < 0.02, sh
assert sh[(base, "analyze_timing")] > sh[(base, "analyze_notiming")] > sh[(base, "plain")], sh
assert sh[(base, "analyze_timing")] > 0.10, sh
timing_funcs = set(profiles[(base, "analyze_timing")].functions["function"])
assert "ExecProcNodeInstr" in timing_funcs
assert any("clock_gettime" in f for f in timing_funcs), "no clock_gettime frame with TIMING on"

# %% [markdown]
# ## Flamegraphs (plain and EXPLAIN ANALYZE TIMING on)

# %%
def facts(prof: perf.PerfProfile) -> dict[str, str]:
    return prof.run.subtitle_facts()


graphs = {}
for mode in ("plain", "analyze_timing"):
    prof = profiles[(base, mode)]
    graphs[mode] = FlameGraph(prof.counts, title=f"{base}: {SEED_QUERY_NAMES.get(mode, mode)} "
                              f"({mode})", provenance=facts(prof))
    display(graphs[mode])

# %% [markdown]
# ## Differential: TIMING on vs the plain query, same build
# Red frames are where EXPLAIN ANALYZE adds samples (the instrumentation, the clock).

# %%
diff_mode = FlameGraph(profiles[(base, "analyze_timing")].counts,
                       diff_against=profiles[(base, "plain")].counts,
                       title=f"{base}: analyze_timing vs plain (red: more)",
                       provenance=facts(profiles[(base, "analyze_timing")]))
display(diff_mode)
html = diff_mode._repr_html_()
assert html.startswith("<iframe srcdoc=") and "ExecProcNodeInstr" in html

# %% [markdown]
# ## Icicle and merged views
# The icicle puts the root at the top (callers above callees), which reads well when the
# interesting frames are the deepest ones, as the clock reads are. The merged graph puts
# Query-2 and Query-3 side by side under their own root frames, each run normalised to the
# same total (`--merge A B --by-run`): the instrumentation towers compare at a glance.

# %%
from profkit.render.flamegraph import merge_profiles

icicle = FlameGraph(profiles[(base, "analyze_timing")].counts, inverted=True,
                    title=f"{base}: {SEED_QUERY_NAMES.get('analyze_timing')} (icicle)",
                    provenance=facts(profiles[(base, "analyze_timing")]))
display(icicle)
run_names = ["Query-2", "Query-3"]
merged_counts = merge_profiles([profiles[(base, "analyze_notiming")].counts,
                                profiles[(base, "analyze_timing")].counts],
                               names=run_names, by_run=True)
merged = FlameGraph(merged_counts, title=f"{base}: Query-2 and Query-3, each normalised")
display(merged)
# both runs weigh the same after normalisation, each under its own root frame
per_run = {n: sum(v for k, v in merged_counts.items() if k.split(";", 1)[0] == n)
           for n in run_names}
assert abs(per_run["Query-2"] - per_run["Query-3"]) < 1e-6 * max(per_run.values()), per_run
assert icicle.total == graphs["analyze_timing"].total
assert "ExecProcNodeInstr" in icicle._repr_html_() and "Query-3" in merged._repr_html_()

# %% [markdown]
# ## Differential: build vs build (TIMING off)

# %%
others = [b for b in choice.names if b != base]
if others:
    for other in others:
        g = FlameGraph(profiles[(other, "analyze_notiming")].counts,
                       diff_against=profiles[(base, "analyze_notiming")].counts,
                       title=f"analyze_notiming: {other} vs {base} (blue: fewer samples)",
                       provenance=facts(profiles[(other, "analyze_notiming")]))
        display(g)
        # the patched build spends a smaller share in the instrumentation functions
        assert sh[(other, "analyze_notiming")] < sh[(base, "analyze_notiming")], sh
else:
    print(f"SKIPPED the build-to-build diff: only {base} is built "
          f"({', '.join(choice.skipped) or 'nothing'} skipped)")

# %% [markdown]
# ## Saved SVGs

# %%
from profkit import paths

out = paths.flamegraphs_dir()
saved = [graphs["analyze_timing"].save(out / f"{base}-{WORKLOAD}-analyze_timing.svg"),
         diff_mode.save(out / f"{base}-{WORKLOAD}-timing-vs-plain.svg"),
         icicle.save(out / f"{base}-{WORKLOAD}-analyze_timing-icicle.svg"),
         merged.save(out / f"{base}-{WORKLOAD}-query2-query3-merged.svg")]
for p in saved:
    assert Path(p).stat().st_size > 1000
display(Markdown("\n".join(f"- `{p}`" for p in saved)))
