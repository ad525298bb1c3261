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
# # 03 — The instrumentation functions: calls and time shares, three tools side by side
#
# For `EXPLAIN (ANALYZE, TIMING FALSE)` — the seed's Query-2, whose overhead the
# patches attack — on each build:
#
# - **perf**: share of CPU samples in each instrumentation function (self time);
# - **gprof** (a `-pg` build: `gprof`, or `<preset>+gprof`): exact call counts from
#   one backend's `gmon.out` — used when that build is cached;
# - **callgrind**: exact call counts and instructions per function, for one
#   execution in a single-user backend (no hardware counters on this VM).
#
# The call counts are checked against the count predicted from the plan itself
# (`profkit.analyze.predict`: rows + loops per node, plus the shutdown bracket).

# %% tags=["parameters"]
SCALE = 0.2                    # join_sum: i1 200,000 rows, i2 200 (~20 ms per query)
BUILDS = ["vanilla", "step1", "step2", "step3"]
WORKLOAD = "join_sum"          # a hash join: every node's calls are exactly predictable
MODE = "analyze_notiming"
PERF_REPS = 20                 # repetitions under perf (enough samples at small scales)
GPROF = True                   # use <build>+gprof builds when cached
GPROF_BUILDS = None            # the builds whose -pg twin is used (None: all of BUILDS)
RUN_DIR = None                 # unused here: every figure is collected (seconds at this scale)

# %%
import pandas as pd
from IPython.display import display

from profkit.lab import notebook as nb
from profkit.analyze import predict as P
from profkit.collect import perf
from profkit.rundir import load_run
from profkit.collect.callgrind import collect_callgrind_cluster
from profkit.parse.callgrind import parse_callgrind_file
from profkit.parse.folded import is_instrumentation
from profkit.pg.cluster import Cluster
from profkit.pg.workloads import get_workload

FUNCS = ["ExecProcNodeInstr", "InstrStartNode", "InstrStopNode", "InstrEndLoop",
         "InstrAggNode", "InstrUpdateTupleCount", "ExecProcNodeInstrLite"]
wl = get_workload(WORKLOAD)
choice = nb.available_builds(BUILDS)
print(choice.report())
assert "vanilla" in choice.builds

# %% [markdown]
# ## Collect: plan + prediction, perf, callgrind (one cluster per build)

# %%
perf_tables, cg_tables, predictions = {}, {}, {}
progress = nb.Progress(len(choice.builds) * 3, f"{WORKLOAD} @ {SCALE:g}, {MODE}")
with progress:
    for name, build in choice.builds.items():
        with Cluster(build, name=f"nb03-{name}") as cl:
            with cl.connect() as conn:
                wl.load(conn, SCALE)
                plan = conn.execute(wl.query(MODE, fmt="json")).fetchone()[0]
                predictions[name] = P.predict(plan, P.context_from_conn(conn, MODE))
                progress.advance(message=f"{name}: plan predicted")
                perf.run_query(conn, wl.query(MODE), 1)
                with nb.open_run("perf", build=build, workload=WORKLOAD, mode=MODE,
                                 tools=("gcc",)) as rd:
                    rec, _ = perf.record_query(cl, conn, wl.query(MODE), run=rd,
                                               reps=PERF_REPS, scale=SCALE)
            prof = perf.fold_run(load_run(rec.run_dir), binary=build.postgres)
            perf_tables[name] = prof.functions
            assert prof.folding.samples >= 100, f"too few perf samples ({prof.folding.samples})"
            progress.advance(message=f"{name}: perf {prof.folding.samples} samples")
            with nb.open_run(f"callgrind-{name}", workload=WORKLOAD, mode=MODE) as rd:
                session = collect_callgrind_cluster(cl, {MODE: wl.query(MODE)}, rd.path)
            cg_tables[name] = parse_callgrind_file(session.queries[0].out_file,
                                                   build=name).functions
            progress.advance(message=f"{name}: callgrind done")

# %% [markdown]
# ## gprof (exact call counts from a `-pg` build), where one is cached

# %%
gprof_tables = {}
if GPROF:
    from profkit.collect import gprof
    from profkit.experiments.profile import gprof_profile

    wanted = {name: gprof.profiling_build_name(name) for name in choice.builds
              if GPROF_BUILDS is None or name in GPROF_BUILDS}
    gchoice = nb.available_builds(list(wanted.values()), build_missing=())
    print(gchoice.report())
    for name, gname in wanted.items():
        if gname in gchoice.builds:
            res = gprof_profile(gchoice.builds[gname], WORKLOAD, scale=SCALE, mode=MODE)
            gprof_tables[name] = res.functions
if not gprof_tables:
    print("SKIPPED gprof: no -pg build cached (`profkit build gprof` makes one, ~6 min)")

# %% [markdown]
# ## Side by side

# %%
def perf_share(name: str, fn: str) -> float:
    df = perf_tables[name]
    return float(df.loc[df["function"] == fn, "self_share"].sum())


def cg(name: str, fn: str, col: str):
    df = cg_tables[name]
    r = df.loc[df["function"] == fn, col]
    return None if r.empty or pd.isna(r.iloc[0]) else float(r.sum())


def gp_calls(name: str, fn: str):
    df = gprof_tables.get(name)
    if df is None:
        return None
    r = df.loc[df["function"] == fn, "calls"].dropna()
    return None if r.empty else int(r.iloc[0])


rows = []
for name in choice.builds:
    for fn in FUNCS:
        rows.append({"build": name, "function": fn,
                     "perf_self_share": perf_share(name, fn),
                     "gprof_calls": gp_calls(name, fn),
                     "callgrind_calls": cg(name, fn, "calls"),
                     "callgrind_self_instr": cg(name, fn, "self")})
side = pd.DataFrame(rows)
present = side[(side[["perf_self_share"]].fillna(0).sum(axis=1) > 0)
               | side["callgrind_calls"].notna() | side["gprof_calls"].notna()]
display(present.style.format({"perf_self_share": "{:.2%}", "callgrind_self_instr": "{:,.0f}",
                              "callgrind_calls": "{:,.0f}"}, na_rep="–"))

# %%
totals = pd.DataFrame([{
    "build": name,
    "perf_instrumentation_share": float(perf_tables[name].loc[
        perf_tables[name]["function"].map(is_instrumentation), "self_share"].sum()),
    "callgrind_instrumentation_instr": float(cg_tables[name].loc[
        cg_tables[name]["function"].map(is_instrumentation), "self"].sum()),
    "callgrind_total_instr": float(cg_tables[name]["self"].sum()),
    "predicted_InstrStartNode": predictions[name].totals["instr_start_node"],
} for name in choice.builds])
totals["callgrind_instrumentation_share"] = (totals["callgrind_instrumentation_instr"]
                                             / totals["callgrind_total_instr"])
display(totals)

# %% [markdown]
# ## Checks: the tools agree with each other and with the plan

# %%
pv = predictions["vanilla"]
v = side[side["build"] == "vanilla"].set_index("function")
# callgrind counts calls exactly: one InstrStartNode/InstrStopNode pair per ExecProcNode call
# of every node, plus the shutdown bracket - exactly the prediction from rows and loops.
assert v.loc["InstrStartNode", "callgrind_calls"] == pv.totals["instr_start_node"], (
    v.loc["InstrStartNode"], pv.totals)
assert v.loc["InstrStopNode", "callgrind_calls"] == pv.totals["instr_stop_node"]
assert v.loc["ExecProcNodeInstr", "callgrind_calls"] == pv.totals["exec_proc_node_instr"]
assert v.loc["InstrStartNode", "callgrind_self_instr"] > 0
# perf sees the wrapper and the Instr* functions burn a visible share of the query
share_v = totals.set_index("build").loc["vanilla", "perf_instrumentation_share"]
assert 0.01 < share_v < 0.9, share_v
assert totals["callgrind_instrumentation_share"].between(0, 1).all()
if "vanilla" in gprof_tables:
    # gprof's counts are exact too, and agree with callgrind and the prediction
    assert v.loc["InstrStartNode", "gprof_calls"] == pv.totals["instr_start_node"]
    # gprof skips local symbols with a dot in their name, such as gcc's partial-inlining
    # clone ExecShutdownNode_walker.part.0 that follows ExecProcNodeInstr in the binary:
    # the clone's calls (one per executed node at shutdown) land on ExecProcNodeInstr.
    clone = cg("vanilla", "ExecShutdownNode_walker.part.0", "calls") or 0
    assert v.loc["ExecProcNodeInstr", "gprof_calls"] == (
        pv.totals["exec_proc_node_instr"] + clone), (v.loc["ExecProcNodeInstr"], clone)
for name in choice.builds:
    if name != "vanilla":
        # the patched builds inline InstrStartNode/StopNode: no out-of-line calls remain
        s = side[side["build"] == name].set_index("function")
        calls = s.loc["InstrStartNode", "callgrind_calls"]
        assert pd.isna(calls) or calls == 0, s.loc["InstrStartNode"]
        # ... and spend fewer instructions in instrumentation functions than vanilla
        t = totals.set_index("build")
        assert (t.loc[name, "callgrind_instrumentation_instr"]
                < t.loc["vanilla", "callgrind_instrumentation_instr"])
print("checks passed for:", ", ".join(choice.builds))
