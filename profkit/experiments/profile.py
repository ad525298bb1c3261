"""The single-build profile experiments: build → throwaway cluster → load → one backend
runs the query under perf (:func:`perf_profile`), in a -pg build (:func:`gprof_profile`,
with the Instr* calls the plan predicts) or under callgrind (:func:`callgrind_profile`,
exact calls and instructions of one execution, the same prediction); flamegraphs with
the run's provenance; and ``make demo``'s Query-2 flamegraphs (vanilla, step3, and the
differential).

The tools themselves are driven by :mod:`profkit.collect.perf`,
:mod:`profkit.collect.gprof` and :mod:`profkit.collect.callgrind`, which write the raw
artifacts into the run directory.
"""
from __future__ import annotations

import dataclasses
import html
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from profkit.analyze.predict import context_from_conn, predict
from profkit.analyze.stacks import EXECUTOR_WRAPPERS, drop_frames
from profkit.collect import pyspy
from profkit.collect.callgrind import collect_callgrind_cluster
from profkit.collect.gprof import (
    GprofResult,
    check_collectable,
    collect_gprof,
    gprof_path,
    merged_into,
    parse_run,
    profiling_build_name,
)
from profkit.collect.perf import (
    MIN_SAMPLES,
    PerfProfile,
    fold_run,
    max_sample_rate,
    perf_path,
    record_query,
    run_query,
    sample_shortfall,
)
from profkit.errors import ProfkitError
from profkit.experiments import flamediff
from profkit.parse.callgrind import instr_counts_from_session, parse_callgrind_file
from profkit.parse.folded import functions_table, instrumentation_share
from profkit.paths import flamegraphs_dir
from profkit.pg.build import Build, get_build
from profkit.pg.cluster import Cluster
from profkit.pg.workloads import SEED_QUERY_NAMES, check_args, workload_label
from profkit.progress import say as _say
from profkit.render.flamegraph import demo_views, render, write_svg
from profkit.rundir import RunDir, open_run
from profkit.tables import validate


def flamegraph_dir(out: str | Path | None = None) -> Path:
    """*out*, or flamegraphs/ (created)."""
    p = Path(out) if out else flamegraphs_dir()
    p.mkdir(parents=True, exist_ok=True)
    return p


def flamegraph_for(counts: dict[str, float], run: Any, path: Path, *, title: str,
                   diff_against: dict[str, float] | None = None,
                   extra: dict[str, str] | None = None,
                   copy_name: str | None = "flamegraph.svg") -> Path:
    """Render *counts* with the run's provenance in the subtitle; a copy goes into the
    run directory as *copy_name* (None: no copy)."""
    facts = run.subtitle_facts() if run is not None else {}
    total = int(sum(counts.values()))
    facts["samples"] = f"{total:,}" + (f" (too few: shares need >= {MIN_SAMPLES})"
                                       if total < MIN_SAMPLES else "")
    facts.update(extra or {})
    svg = render(counts, title=title, provenance=facts, diff_against=diff_against)
    out = write_svg(svg, path)
    if run is not None and copy_name:
        write_svg(svg, run.file(copy_name))
        run.add_artifact(copy_name, f"flamegraph (copy of {out})")
    return out


#: Recordings per build of `make demo`'s differential.  With 3, the interval of a frame
#: that one build has in every recording and the other in none sits on Student's t at 2
#: degrees of freedom: of the 7 stack paths ending in an instrumentation function that
#: step3 removes whole, 2-3 were coloured per run (7 of 22 in 3 runs); with 5, 21 of 21.
#: A/A (vanilla against vanilla), the stack paths coloured: 0 of 126 with 3, 3 of 139
#: with 5 (2.2 %); 12-13 s and 20-22 s per differential (benchmarks/demo_diff_recordings.py,
#: benchmarks/results/demo_diff_recordings-20261206.txt).
DEMO_RECORDINGS = 5


def demo_flamegraphs(out_dir: str | Path | None = None, *, scale: float = 0.05,
                     builds: Sequence[str] = ("vanilla", "step3"),
                     mode: str = "analyze_notiming", workload: str = "nested_loop",
                     reps: int = 1, recordings: int = DEMO_RECORDINGS,
                     profiles: str | Path | None = None,
                     progress: Callable[[str], None] | None = None) -> list[Path]:
    """`make demo`'s flamegraphs of *mode* on *builds[0]* (A) and *builds[1]* (B), from
    *recordings* interleaved perf recordings per build (*reps* executions each, each
    recording on its own cluster and backend:
    :func:`profkit.experiments.flamediff.record_diff`; :data:`DEMO_RECORDINGS` says why 5);
    the differential's run goes under *profiles* (default: the profiles folder).

    Returns the SVG paths: ``query2-vanilla.svg`` and ``query2-step3.svg`` (each build's
    recordings pooled), ``query2-vanilla-vs-step3.svg`` (the differential per execution:
    a frame is red or blue only where the bootstrap interval of its change excludes 0),
    ``query2-vanilla-icicle.svg``, ``query2-merged.svg`` (both builds, each normalised),
    then ``query2-vanilla-vs-step3-share-based.svg`` (the share-based differential of the
    pooled samples, labelled so) for the defaults.
    """
    say = progress or _say
    if len(builds) != 2:
        raise ProfkitError(f"demo_flamegraphs needs two builds (before, after), got {builds}")
    out = flamegraph_dir(out_dir)
    qname = query_name(workload, mode)
    slug = qname.lower().replace("-", "")
    a_name, b_name = builds
    req = flamediff.check_request(a_name, b_name, workload=workload, scale=scale, mode=mode,
                                  recordings=recordings, executions=reps)
    res = flamediff.record_diff(req, base=profiles, progress=say,
                      title=f"{a_name} → {b_name}: {workload} {qname} (differential, perf, "
                            f"{recordings} recordings each)")
    paths = []
    shares: list[float] = []
    pooled = []
    for side, name in (("a", a_name), ("b", b_name)):
        counts = res.pooled(side)
        pooled.append(counts)
        share = instrumentation_share(functions_table(counts))
        shares.append(share)
        total = sum(counts.values())
        shown = "withheld" if total < MIN_SAMPLES else f"{share:.1%}"
        first = res.perf_runs[req.arms[0 if side == "a" else 1].label][0]
        paths.append(flamegraph_for(
            counts, first, out / f"{slug}-{name}.svg",
            title=f"{name}: {workload} {qname} (perf, {recordings} recordings pooled)",
            extra={"instrumentation": shown, "run": res.run.run_id,
                   "recordings": f"{recordings} of {reps} execution(s) each"},
            copy_name=None))
        say(f"{name}: {int(total)} samples in {recordings} recordings, "
            f"instrumentation {shown}")
    diff_path = out / f"{slug}-{a_name}-vs-{b_name}.svg"
    assert res.svg is not None
    paths.append(write_svg(res.svg.read_text(), diff_path))
    hits, n = res.diff.flag_rate("path", "self")
    say(f"differential: {hits} of {n} frames flagged (self, by stack path)")
    paths += demo_views(list(zip(builds, pooled, strict=True)), out, slug=slug,
                        what=f"{workload} {qname} (perf)")
    # the old reading, kept for comparison and labelled: shares of each pooled total
    paths.append(flamegraph_for(
        drop_frames(pooled[1]), None, out / f"{slug}-{a_name}-vs-{b_name}-share-based.svg",
        title=f"{a_name} → {b_name}: {workload} {qname} (share-based differential, perf)",
        diff_against=drop_frames(pooled[0]),
        extra={"run": res.run.run_id,
               "aligned": "wrapper frames " + "/".join(sorted(EXECUTOR_WRAPPERS))
                          + " removed inside stacks",
               "instrumentation A→B": f"{shares[0]:.1%} → {shares[1]:.1%}"}))
    return paths


INSTR_FUNCTIONS = ("ExecProcNodeInstr", "InstrStartNode", "InstrStopNode", "InstrEndLoop",
                   "ExecProcNodeInstrLite", "PostExecProcNodeInstr", "InstrUpdateTupleCount")


def instrumentation_calls(res: Any, pred: Any, reps: int) -> tuple[Any, list[str]]:
    """gprof's call counts of the instrumentation functions beside the plan's prediction.

    *res* is a gprof profile (``calls(fn)``, ``run``), *pred* a prediction or None.
    Returns (one row per function: calls, predicted, gprof_artifact, unexplained; notes).
    """
    binary = str(res.run.get("gprof_binary") or res.run.get("build.postgres"))
    rows, notes = [], []
    for fn in INSTR_FUNCTIONS:
        c = res.calls(fn)
        if c is None:
            continue
        p = predicted_calls(pred, fn, reps) if pred is not None else None
        merged = merged_into(binary, fn)
        extra = gprof_artifact(pred, fn, merged, reps) if pred is not None else 0
        if merged:
            notes.append(f"gprof counts {', '.join(merged)} (symbols it drops) as {fn}"
                         + (f": +{extra}, one per plan node at ExecShutdownNode" if extra
                            else ""))
        rows.append({"function": fn, "calls": c,
                     "predicted": p if p is not None else "",
                     "gprof_artifact": extra if p is not None else "",
                     "unexplained": (c - p - extra) if p is not None else ""})
    if pred is not None and not pred.totals.get("exact", True):
        inexact = pred.nodes[~pred.nodes["exact"]]
        why = "; ".join(f"node {r.node_id} {r.node_type}: {r.exact_reason}"
                        for r in inexact.itertuples())
        notes.append("the prediction is an upper bound, by at most one call per loop of "
                     f"these nodes (a loop may end without its NULL-returning call): {why}")
    return pd.DataFrame(rows), notes


# --------------------------------------------------------------------------- what a profile shows

def _table_text(df: pd.DataFrame) -> str:
    return df.to_string(index=False) if len(df) else "(no rows)"


def top_functions(prof: Any, n: int) -> pd.DataFrame:
    """A sampled profile's top *n* functions by self samples, shares as percentages."""
    top = prof.top(n)[["function", "self", "self_share", "total_share"]]
    return top.assign(self_share=top["self_share"].map("{:.1%}".format),
                      total_share=top["total_share"].map("{:.1%}".format))


@dataclass
class ProfileRun:
    """A profile and its flamegraph as ``profkit perf|gprof|py-spy|import`` show them:
    lines, titled tables, notes, then where the artifacts and the flamegraph are."""

    profile: Any  # PerfProfile, GprofResult or PySpyProfile (its .run is the run directory)
    flamegraph: Path | None
    head: list[str] = field(default_factory=list)
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)
    #: what the reader must know before the tables (too few samples, and the fix): a
    #: command prints these on stderr, a notebook first
    warnings: list[str] = field(default_factory=list)

    def console(self) -> str:
        out = list(self.head)
        for title, table in self.tables:
            out += [title, _table_text(table)] if title else [_table_text(table)]
        out += self.tail
        out.append(f"artifacts: {self.profile.run.path}")
        if self.flamegraph is not None:
            out.append(f"flamegraph: {self.flamegraph}")
        return "\n".join(out)

    def _repr_html_(self) -> str:
        parts = [f"<p><b>{html.escape(line)}</b></p>" for line in self.warnings]
        parts += [f"<p>{html.escape(line)}</p>" for line in self.head]
        for title, table in self.tables:
            parts += [f"<b>{html.escape(title)}</b>" if title else "", table.to_html(index=False)]
        parts += [f"<p>{html.escape(line)}</p>" for line in self.tail]
        if self.flamegraph is not None:
            parts.append(f'<p>flamegraph: <a href="{html.escape(str(self.flamegraph))}">'
                         f"{html.escape(str(self.flamegraph))}</a></p>")
        return "\n".join(parts)


def perf_run(build: str, workload: str, *, scale: float, mode: str, reps: int = 1,
             freq: int = 999, call_graph: str = "fp", stat: bool = True, top: int = 10,
             out: str | Path | None = None,
             progress: Callable[[str], None] | None = None) -> ProfileRun:
    """``profkit perf BUILD``: :func:`perf_profile`, its flamegraph in *out* (or
    flamegraphs/), the top functions, the instrumentation share and perf stat's counts."""
    label = workload_label(workload)
    prof = perf_profile(build, workload, scale=scale, mode=mode, reps=reps, freq=freq,
                        call_graph=call_graph, stat=stat, progress=progress, fix_flags=None)
    qname = prof.run.provenance.get("query_name") or mode
    svg = flamegraph_for(prof.counts, prof.run,
                         flamegraph_dir(out) / f"perf-{build}-{label}-{mode}.svg",
                         title=f"{build}: {label} {qname} (perf)")
    tail = [_share_line(prof)]
    if prof.stat is not None and len(prof.stat):
        st = prof.stat[prof.stat["supported"]][["event", "value", "unit"]]
        tail.append("perf stat: " + ", ".join(f"{r.event}={r.value:g}{r.unit and ' ' + r.unit}"
                                              for r in st.itertuples()))
    return ProfileRun(prof, svg, [f"run {prof.run.run_id}: {prof.folding.samples} samples "
                                  f"({', '.join(prof.folding.events)})"],
                      [(f"top {top} functions by self samples:", top_functions(prof, top))],
                      tail, warnings=shortfall_lines(prof, "--freq", "--reps"))


def perf_diff_run(a: str, b: str, workload: str, *, scale: float, mode: str,
                  recordings: int | None = None, executions: int = 1, freq: int = 999,
                  align: bool = True, order_seed: int | None = None,
                  out: str | Path | None = None,
                  progress: Callable[[str], None] | None = None) -> flamediff.DiffRun:
    """``profkit perf A B``: repeated interleaved recordings of both builds
    (:func:`profkit.experiments.flamediff.record_diff`), the differential in *out* (or
    flamegraphs/) as ``perf-A-vs-B-<workload>-<mode>.svg``."""
    req = flamediff.check_request(
        a, b, workload=workload, scale=scale, mode=mode,
        recordings=flamediff.DEFAULT_RECORDINGS if recordings is None else recordings,
        executions=executions, freq=freq, align=align, order_seed=order_seed)
    la, lb = (arm.label for arm in req.arms)
    svg = flamegraph_dir(out) / f"perf-{la}-vs-{lb}-{workload_label(req.workload)}-{mode}.svg"
    return flamediff.record_diff(req, progress=progress, flamegraph=svg)


def shortfall_lines(prof: Any, freq_flag: str, repeat_flag: str | None,
                    here: bool = True) -> list[str]:
    """A warning line when *prof* has too few samples for its shares to mean something
    (:data:`profkit.collect.perf.MIN_SAMPLES`), with how long the query ran, the samples
    that gave at the frequency used and the flags that get more; else nothing. *here*:
    recorded on this machine (its perf_event_max_sample_rate bounds the -F suggested)."""
    short = sample_shortfall(prof)
    if short is None:
        return []
    return ["warning: " + short.message(freq_flag=freq_flag, repeat_flag=repeat_flag,
                                        max_freq=max_sample_rate() if here else None)]


def _share_line(prof: Any) -> str:
    # one percentage is what gets quoted: not off a handful of samples
    if sample_shortfall(prof) is not None:
        return f"instrumentation share (self): withheld ({prof.folding.samples} samples)"
    return f"instrumentation share (self): {prof.instrumentation_share:.1%}"


# --------------------------------------------------------------------------- perf

def perf_profile(build: Any, workload: str = "nested_loop", *, scale: float = 0.05,
                     mode: str = "analyze_timing", reps: int = 1, freq: int = 999,
                     call_graph: str = "fp", stat: bool = True, perf: str = "perf",
                     warmup: bool = True, base: str | Path | None = None,
                     progress: Callable[[str], None] | None = None,
                     fix_flags: tuple[str, str] | None = ("freq=", "reps=")) -> Any:
    """Build (cached) → throwaway cluster → load *workload* → record *mode* → fold.

    *build*: a preset name or a :class:`~profkit.pg.build.Build`. A warm-up run of the
    query (not recorded) fills the caches first, so the profile shows the steady state.
    A recording with fewer samples than :data:`profkit.collect.perf.MIN_SAMPLES` is said
    through *progress*, with the fix in terms of *fix_flags* (the frequency's and the
    repetitions' names; None: the caller says it).
    """
    wl = check_args(workload, scale=scale, reps=reps, mode=mode)
    say = progress or (lambda _m: None)
    perf_path(perf)
    b = build if isinstance(build, Build) else get_build(build, progress=say)
    sql = wl.query(mode)
    qname = query_name(workload, mode)
    with Cluster(b, name=f"perf-{b.name}") as cl, cl.connect() as conn:
        say(f"loading {workload} at scale {scale}")
        wl.load(conn, scale)
        say(f"recording {qname} on {b.name} (perf, {freq} Hz, {call_graph})")
        return perf_on_cluster(cl, conn, sql, binary=b.postgres, warmup=warmup, reps=reps,
                               workload=workload, mode=mode, scale=scale, query_name=qname,
                               perf=perf, freq=freq, call_graph=call_graph, stat=stat,
                               base=base, progress=say, fix_flags=fix_flags)


def perf_on_cluster(cluster: Cluster, conn: Any, sql: str, *, binary: str | Path,
                    warmup: bool = True, perf: str = "perf",
                    progress: Callable[[str], None] | None = None,
                    fix_flags: tuple[str, str] | None = None, run: RunDir | None = None,
                    **record: Any) -> PerfProfile:
    """Record *sql* on *conn*'s backend of *cluster* with perf, then fold it: the step
    :func:`perf_profile` and a notebook's perf cell share. A warm-up run of the query
    (not recorded) fills the caches first, so the profile shows the steady state.
    *run*: the run it writes into (opened by the caller through
    :func:`profkit.rundir.open_run`); without one it opens its own ``perf`` run.
    *record*: :func:`profkit.collect.perf.record_query`'s options (reps, mode, freq...)."""
    say = progress or (lambda _m: None)
    # the run's name and folder (used only when it is opened here)
    workload, mode = record.pop("workload", None), record.pop("mode", None)
    base, run_id = record.pop("base", None), record.pop("run_id", None)
    if run is None:
        perf_path(perf)  # a missing perf fails before a run is created
        with open_run("perf", build=cluster.build, workload=workload, mode=mode, base=base,
                      run_id=run_id, tools=("gcc",)) as rd:
            return perf_on_cluster(cluster, conn, sql, binary=binary, warmup=warmup,
                                   perf=perf, progress=progress, fix_flags=fix_flags,
                                   run=rd, **record)
    if warmup:
        run_query(conn, sql, 1)
    rec, _res = record_query(cluster, conn, sql, perf=perf, run=run, **record)
    say(f"folding {rec.samples} samples")
    prof = fold_run(run, perf=perf, binary=binary)
    short = sample_shortfall(prof)
    if short is not None and fix_flags is not None:
        say(short.message(freq_flag=fix_flags[0], repeat_flag=fix_flags[1],
                          max_freq=max_sample_rate()))
    return prof


def query_name(workload: str | None, mode: str) -> str:
    """The seed's name of *mode*'s query (Query-1/2/3) for nested_loop, else the mode."""
    return SEED_QUERY_NAMES.get(mode, mode) if workload == "nested_loop" else mode


# --------------------------------------------------------------------------- gprof

# gprof function name -> Prediction.totals key (profkit.analyze.predict)
_PREDICTED = {"InstrStartNode": "instr_start_node", "InstrStopNode": "instr_stop_node",
              "ExecProcNodeInstr": "exec_proc_node_instr"}


def explain_prediction(conn: Any, explain_json_sql: str, mode: str) -> Any:
    """Run ``EXPLAIN (ANALYZE, FORMAT JSON) ...`` on *conn* (another backend than the one
    profiled) and predict the Instr* calls of *mode* from its rows and loops
    (:func:`profkit.analyze.predict.predict`)."""
    row = conn.execute(explain_json_sql).fetchone()
    if row is None:
        raise ProfkitError("EXPLAIN returned no rows")
    return predict(row[0], context_from_conn(conn, mode))


def predicted_calls(prediction: Any, function: str, reps: int = 1) -> int | None:
    """Predicted calls of *function* for *reps* executions (None: not predicted)."""
    key = _PREDICTED.get(function)
    if key is None:
        return None
    return int(prediction.totals[key]) * reps


def gprof_artifact(prediction: Any, function: str, merged: list[str], reps: int = 1) -> int:
    """Calls gprof adds to *function* because it counts dropped symbols as it
    (:func:`merged_into`): ``ExecShutdownNode_walker.part.0`` runs once per plan node
    when the executor shuts the plan down (ExecShutdownNode walks the whole PlanState
    tree, sub-plans included)."""
    if any(m.startswith("ExecShutdownNode_walker.") for m in merged):
        return len(prediction.nodes) * reps
    return 0


def gprof_profile(build: Any = "gprof", workload: str = "nested_loop", *,
                     scale: float = 0.05, mode: str = "analyze_notiming", reps: int = 1,
                     base: str | Path | None = None,
                     progress: Callable[[str], None] | None = None) -> Any:
    """-pg build (cached) → throwaway cluster → load → one backend runs *mode* → gprof."""
    return gprof_profile_with_prediction(build, workload, scale=scale, mode=mode, reps=reps,
                                            base=base, progress=progress, predict=False)[0]


def gprof_profile_with_prediction(
        build: Any = "gprof", workload: str = "nested_loop", *, scale: float = 0.05,
        mode: str = "analyze_notiming", reps: int = 1,
        base: str | Path | None = None,
        progress: Callable[[str], None] | None = None,
        predict: bool = True) -> tuple[Any, Any]:
    """:func:`gprof_profile`, plus the Instr* calls predicted from the plan's rows and
    loops (EXPLAIN ANALYZE modes; None for the plain query or with ``predict=False``)."""
    wl = check_args(workload, scale=scale, reps=reps, mode=mode)
    say = progress or (lambda _m: None)
    gprof_path()
    b = build if isinstance(build, Build) else get_build(profiling_build_name(build),
                                                         progress=say)
    sql = wl.query(mode)
    qname = query_name(workload, mode)
    pred = None
    with Cluster(b, name=f"gprof-{b.name}") as cl:
        with cl.connect() as conn:
            say(f"loading {workload} at scale {scale}")
            wl.load(conn, scale)
        say(f"running {qname} in a fresh backend of {b.name}")
        res = gprof_on_cluster(cl, sql, reps=reps, workload=workload, mode=mode, scale=scale,
                               query_name=qname, base=base)
        if predict and mode.startswith("analyze"):
            with cl.connect() as conn:
                pred = explain_prediction(conn, wl.query(mode, fmt="json"), mode)
    return res, pred


def gprof_on_cluster(cluster: Cluster, sql: str, *, run: RunDir | None = None,
                     **collect: Any) -> GprofResult:
    """Run *sql* in a fresh backend of *cluster* (a -pg build) and read its gmon.out: the
    step :func:`gprof_profile` and a notebook's gprof cell share. *run*: the run it
    writes into (else it opens its own ``gprof`` run). *collect*:
    :func:`profkit.collect.gprof.collect_gprof`'s options (reps, workload, mode...)."""
    # the run's name and folder (used only when it is opened here)
    workload, mode = collect.pop("workload", None), collect.pop("mode", None)
    base, run_id = collect.pop("base", None), collect.pop("run_id", None)
    if run is None:
        check_collectable(cluster.build)  # refused before a run is created
        with open_run("gprof", build=cluster.build, workload=workload, mode=mode, base=base,
                      run_id=run_id, tools=("gprof", "gcc")) as rd:
            return gprof_on_cluster(cluster, sql, run=rd, **collect)
    collect_gprof(cluster, sql, run=run, **collect)
    return parse_run(run)


def gprof_run(build: str, workload: str, *, scale: float, mode: str, reps: int = 1,
              top: int = 15, progress: Callable[[str], None] | None = None) -> ProfileRun:
    """``profkit gprof BUILD``: :func:`gprof_profile_with_prediction`, the flat profile's
    top and the instrumentation calls beside what the plan predicts."""
    res, pred = gprof_profile_with_prediction(build, workload, scale=scale, mode=mode,
                                              reps=reps, progress=progress)
    table, notes = instrumentation_calls(res, pred, reps)
    return ProfileRun(res, None, [f"run {res.run.run_id}: gprof of backend "
                                  f"{res.run.get('backend_pid')}"],
                      [(f"flat profile, top {top}:", res.top(top)),
                       ("instrumentation calls (predicted from the plan's rows and loops):",
                        table)],
                      [f"note: {n}" for n in notes])


# --------------------------------------------------------------------------- callgrind

def callgrind_on_cluster(cluster: Cluster, queries: dict[str, str], out_dir: str | Path, *,
                         build: str, workload: str = "") -> tuple[pd.DataFrame, Any]:
    """Count the instructions of each of *queries* (mode -> SQL) in a single-user backend
    of *cluster* (stopped, then started again). Returns the instruction counts (one row
    per query) and the first query's callgrind profile (functions, calls)."""
    session = collect_callgrind_cluster(cluster, queries, out_dir)
    counts = instr_counts_from_session(session, build=build, workload=workload)
    return counts, parse_callgrind_file(session.queries[0].out_file, build=build)


@dataclass
class CallgrindResult:
    """``profkit callgrind BUILD``'s profile: one execution's instruction counts, the
    functions and call arcs callgrind counted, and the plan's prediction (None for the
    plain query)."""

    run: RunDir
    profile: Any  # profkit.parse.callgrind.CallgrindProfile
    counts: pd.DataFrame  # the instr_counts row of the query
    prediction: Any

    def calls(self, function: str) -> int | None:
        """callgrind's exact call count of *function*, every call site summed (None when
        the build has no such function: inlined, or not in this build)."""
        f = self.profile.functions
        rows = f.loc[f["function"] == function, "calls"].dropna()
        return int(rows.sum()) if len(rows) else None

    def instrumentation_calls(self) -> tuple[pd.DataFrame, list[str]]:
        """The Instr* functions' calls beside the plan's prediction: callgrind counts every
        call (no gprof artifact), so ``unexplained`` is what the prediction misses."""
        rows, absent = [], []
        for fn in INSTR_FUNCTIONS:
            c = self.calls(fn)
            if c is None:
                absent.append(fn)
                continue
            p = (predicted_calls(self.prediction, fn) if self.prediction is not None
                 else None)
            rows.append({"function": fn, "calls": c, "predicted": "" if p is None else p,
                         "unexplained": "" if p is None else c - p})
        notes = []
        if absent:
            notes.append(f"not called as functions in this build (inlined or absent): "
                         f"{', '.join(absent)}")
        if self.prediction is not None and not self.prediction.totals.get("exact", True):
            notes.append("the prediction is an upper bound (a loop may end without its "
                         "NULL-returning call)")
        return pd.DataFrame(rows), notes


def callgrind_profile(build: Any, workload: str = "nested_loop", *, scale: float = 0.01,
                      mode: str = "analyze_notiming", base: str | Path | None = None,
                      progress: Callable[[str], None] | None = None) -> CallgrindResult:
    """Build (cached) → throwaway cluster → load → EXPLAIN's prediction (EXPLAIN ANALYZE
    modes) → the query once in a single-user backend under callgrind, after an
    uninstrumented warm-up run of it (:func:`callgrind_on_cluster`). The run directory
    holds the raw profile, ``functions.parquet`` and ``call_edges.parquet``."""
    wl = check_args(workload, scale=scale, reps=1, mode=mode)
    say = progress or (lambda _m: None)
    b = build if isinstance(build, Build) else get_build(build, progress=say)
    qname = query_name(workload, mode)
    with open_run("callgrind", build=b, workload=workload, mode=mode, base=base,
                  tools=("valgrind",), scale=scale) as rd:
        pred = None
        with Cluster(b, name=f"callgrind-{b.name}") as cl:
            with cl.connect() as conn:
                say(f"loading {workload} at scale {scale}")
                wl.load(conn, scale)
                if mode.startswith("analyze"):
                    pred = explain_prediction(conn, wl.query(mode, fmt="json"), mode)
            say(f"running {qname} of {b.name} under callgrind (single-user backend: the "
                "cluster restarts afterwards)")
            counts, prof = callgrind_on_cluster(cl, {mode: wl.query(mode)}, rd.path,
                                                build=b.name, workload=workload)
        prof = store_callgrind(rd, counts, prof)
        return CallgrindResult(rd, prof, counts, pred)


def store_callgrind(rd: RunDir, counts: pd.DataFrame, prof: Any) -> Any:
    """Keep a callgrind run's tables in its run directory *rd*: ``functions.parquet`` and
    ``call_edges.parquet`` (tagged with the run id), the raw profile named as an artifact,
    and the instructions and their scope in provenance.json. Returns *prof* with the
    tagged tables (``profkit callgrind`` and the ``%%profkit`` cell both keep these)."""
    prof = dataclasses.replace(
        prof, functions=validate(prof.functions.assign(run_id=rd.run_id), "functions"),
        call_edges=validate(prof.call_edges.assign(run_id=rd.run_id), "call_edges"))
    rd.add_artifact(Path(str(counts["out_file"].iloc[0])).name,
                    "callgrind's profile of the query (callgrind_annotate, kcachegrind, "
                    "profkit parse callgrind)")
    prof.functions.to_parquet(rd.file("functions.parquet"), index=False)
    rd.add_artifact("functions.parquet", "functions table (callgrind: self, inclusive, "
                    "calls per function)")
    prof.call_edges.to_parquet(rd.file("call_edges.parquet"), index=False)
    rd.add_artifact("call_edges.parquet", "call_edges table (caller -> callee calls)")
    rd.update(instructions=int(counts["instructions"].iloc[0]),
              scope=str(counts["scope"].iloc[0]))
    return prof


def instrumentation_arcs(call_edges: pd.DataFrame) -> pd.DataFrame:
    """The call arcs into the Instr* functions (caller, callee, calls), callee by callee
    in :data:`INSTR_FUNCTIONS` order and the busiest caller first: which code paths call
    the instrumentation, and how often (ExecProcNodeInstr's per-row brackets beside the
    Hash node's MultiExec bracket and the shutdown brackets)."""
    e = call_edges[call_edges["callee"].isin(INSTR_FUNCTIONS)]
    order = {fn: i for i, fn in enumerate(INSTR_FUNCTIONS)}
    e = (e.groupby(["callee", "caller"], as_index=False)["calls"].sum()
         .assign(_o=lambda d: d["callee"].map(order))
         .sort_values(["_o", "calls", "caller"], ascending=[True, False, True]))
    return e[["caller", "callee", "calls"]].reset_index(drop=True)


def callgrind_run(build: str, workload: str, *, scale: float, mode: str, top: int = 15,
                  progress: Callable[[str], None] | None = None) -> ProfileRun:
    """``profkit callgrind BUILD``: :func:`callgrind_profile`, the instructions of one
    execution, the top functions by self instructions and the Instr* calls beside what
    the plan predicts."""
    res = callgrind_profile(build, workload, scale=scale, mode=mode, progress=progress)
    c = res.counts.iloc[0]
    head = [f"run {res.run.run_id}: callgrind of one execution of {query_name(workload, mode)}"
            f" on {build}: {int(c['instructions']):,} instructions in {c['scope']}"
            + (f", {int(c['executor_instructions']):,} of them in the executor "
               "(standard_ExecutorRun)" if pd.notna(c["executor_instructions"]) else "")]
    top_fn = res.profile.functions.head(top)
    top_fn = pd.DataFrame({"function": top_fn["function"], "calls": top_fn["calls"],
                           "self": top_fn["self"].astype("int64"),
                           "inclusive": top_fn["total"].astype("int64"),
                           "self_share": top_fn["self_share"].map("{:.1%}".format)})
    table, notes = res.instrumentation_calls()
    tables = [(f"functions, top {top} by self instructions:", top_fn)]
    if len(table):
        tables.append(("instrumentation calls (predicted from the plan's rows and loops):"
                       if res.prediction is not None else "instrumentation calls:", table))
        tables.append(("their callers:", instrumentation_arcs(res.profile.call_edges)))
    return ProfileRun(res, None, head, tables, [f"note: {n}" for n in notes])


# --------------------------------------------------------------------------- py-spy

def pyspy_run(*, pid: int | None = None, command: Sequence[str] = (),
              duration: float = 10.0, rate: int = 100, native: bool = False,
              idle: bool = False, label: str | None = None, top: int = 10,
              out: str | Path | None = None, base: str | Path | None = None,
              run_id: str | None = None) -> ProfileRun:
    """py-spy on a Python process: *pid* for *duration* seconds, or *command* run to its
    end, in a ``py-spy`` run (:func:`profkit.rundir.open_run` under *base*, default
    profiles/); its flamegraph (under *out*) and top functions."""
    if (pid is None) == (not command):
        raise ProfkitError("give either a pid or a command to sample")
    pyspy.pyspy_path()  # a missing py-spy or a dead pid fails before a run is created
    if pid is not None:
        pyspy.check_pid(pid)
    with open_run(pyspy.TOOL, workload=label, base=base, run_id=run_id) as rd:
        if pid is not None:
            rec, _ = pyspy.record_pid(pid, duration=duration, rate=rate, native=native,
                                      idle=idle, run=rd)
        else:
            rec = pyspy.record_command(list(command), rate=rate, native=native, idle=idle,
                                       run=rd)
        prof = pyspy.fold_run(rd)
    name = label or (f"pid{pid}" if pid is not None else Path(command[-1]).stem)
    svg = flamegraph_for(prof.counts, prof.run, flamegraph_dir(out) / f"py-spy-{name}.svg",
                         title=f"py-spy: {name}")
    return ProfileRun(prof, svg, [f"run {prof.run.run_id}: {rec.samples} samples"],
                      [("", prof.top(top))])


# --------------------------------------------------------------------------- import

#: what pk-record.sh (profkit/scripts/) puts in its tarball (perf.data and the script text
#: are needed)
CAPTURE_FILES = {
    "perf.data": "perf record's data (recorded by pk-record.sh)",
    "perf.script.txt": "perf script text (input of the folding), made where it was recorded",
    "perf-record.log": "perf record's messages",
    "buildid-list.txt": "perf buildid-list where it was recorded",
    "vdso.so": "the recording kernel's vDSO image, to name [vdso] frames",
    "capture.txt": "pk-record.sh's provenance (uname, perf, PostgreSQL, clocksource)",
    "query.sql": "the query recorded (pk-record.sh --query-file)",
    "query-output.txt": "the query's output as psql printed it (pk-record.sh --query-file)",
}


def _capture_facts(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep and k.strip():
            out[k.strip()] = v.strip()
    return out


def import_capture(tarball: str | Path, *, base: str | Path | None = None,
                   flamegraphs: str | Path | None = None,
                   progress: Callable[[str], None] | None = None) -> tuple[Any, Path]:
    """Turn a ``pk-record.sh`` tarball into a perf run under profiles/ (tables,
    folded stacks, flamegraph, provenance) like one profkit recorded; returns
    (PerfProfile, flamegraph path)."""
    say = progress or (lambda _m: None)
    src = Path(tarball)
    if not src.is_file():
        raise ProfkitError(f"{src}: no such file: give the tarball pk-record.sh wrote "
                           "(profkit record-script)")
    with tempfile.TemporaryDirectory(prefix="pk-import-") as tmp:
        try:
            with tarfile.open(src, "r:*") as tf:
                tf.extractall(tmp, filter="data")
        except (tarfile.TarError, OSError, EOFError) as e:
            why = str(e).splitlines()[0].rstrip(":") if str(e) else type(e).__name__
            raise ProfkitError(f"{src}: not a readable tarball ({why}): give the .tar.gz "
                               "pk-record.sh wrote (profkit record-script)") from None
        found = [p.parent for p in Path(tmp).rglob("capture.txt")]
        if len(found) != 1:
            raise ProfkitError(f"{src}: no capture.txt inside: not a pk-record.sh capture")
        cap = found[0]
        for need in ("perf.script.txt", "capture.txt"):
            if not (cap / need).is_file():
                raise ProfkitError(f"{src}: {need} missing from the capture: record again "
                                   "with pk-record.sh (profkit record-script)")
        facts = _capture_facts((cap / "capture.txt").read_text(errors="replace"))
        if not facts.get("format", "").startswith("pk-record"):
            raise ProfkitError(f"{src}: capture.txt is not pk-record.sh's (no format line)")
        host = facts.get("hostname", "remote")
        one_query = facts.get("what") == "query"
        span = "one query" if one_query else f"{facts.get('seconds', '?')} s"
        query = ((cap / "query.sql").read_text(errors="replace").strip()
                 if one_query and (cap / "query.sql").is_file() else None)
        with open_run("perf", base=base, tools=(), latest=True,
                      imported_from=str(src.resolve()), capture=facts,
                      tool_summary=f"perf record -F {facts.get('freq', '?')} -g -p "
                                   f"{facts.get('pid', '?')} ({span}, pk-record.sh)",
                      query_name=(f"query on pid {facts.get('pid', '?')} on {host}"
                                  if one_query else f"pid {facts.get('pid', '?')} on {host}"),
                      **({"query": query} if query is not None else {})) as rd:
            # the machine is the one recorded on, not this one
            rd.update(machine={"kernel": facts.get("kernel"), "uname": facts.get("uname"),
                               "clocksource": facts.get("clocksource"),
                               "hostname": host, "arch": facts.get("machine")},
                      tools={"perf": facts.get("perf_version")},
                      postgres_version=facts.get("postgres_version"),
                      started_at=facts.get("started_at") or rd.provenance.get("started_at"))
            for name, what in CAPTURE_FILES.items():
                if (cap / name).is_file():
                    shutil.copyfile(cap / name, rd.file(name))
                    rd.add_artifact(name, what)
            say(f"imported {src.name} into {rd.path}")
            prof = fold_run(rd, check=False)
            label = f"{host}-pid{facts.get('pid', '?')}"
            svg = flamegraph_for(
                prof.counts, prof.run,
                flamegraph_dir(flamegraphs) / f"import-{label}-{rd.run_id}.svg",
                title=f"{facts.get('postgres_version') or 'PostgreSQL'}: backend "
                      f"{facts.get('pid', '?')} on {host} (perf, imported)")
            rd.update(samples=prof.folding.samples)
    return prof, svg


def import_run(tarball: str | Path, *, base: str | Path | None = None,
               flamegraphs: str | Path | None = None, top: int = 10,
               progress: Callable[[str], None] | None = None) -> ProfileRun:
    """``profkit import``: :func:`import_capture`, with the capture's facts and the top
    functions."""
    prof, svg = import_capture(tarball, base=base, flamegraphs=flamegraphs, progress=progress)
    cap = prof.run.provenance.get("capture", {})
    head = [f"run {prof.run.run_id}: {prof.folding.samples} samples of "
            f"pid {cap.get('pid')} on {cap.get('hostname')} "
            f"({cap.get('postgres_version')}, clocksource {cap.get('clocksource')})"]
    one_query = cap.get("what") == "query"
    if one_query:
        n = int(cap.get("repeat") or 1)
        ms = [float(t) for t in str(cap.get("query_ms") or "").split()]
        took = f" in {sum(ms):.1f} ms (psql's timing)" if ms else ""
        head.append(f"query: ran {n} time{'s' if n != 1 else ''} in one session{took}, "
                    f"recorded at {cap.get('freq')} Hz")
    # recorded on another machine: its perf_event_max_sample_rate is not this one's
    warn = shortfall_lines(prof, "-F", "pk-record.sh --repeat" if one_query
                           else "pk-record.sh --query-file FILE --repeat N", here=False)
    return ProfileRun(prof, svg, head,
                      [(f"top {top} functions by self samples:", top_functions(prof, top))],
                      warnings=warn)
