"""``profkit nodetime``: time per plan node from on-CPU samples, by call stack, with no
clock read in the backend (EXPLAIN ANALYZE's per-node times cost a clock read per row).

The walk (:func:`nodetime_on_conn`):

1. the plan: plain ``EXPLAIN (FORMAT JSON)`` of the query on the backend's own session
   (nothing runs); with ``analyze=True`` one more, separate execution under ``EXPLAIN
   (ANALYZE, TIMING OFF, FORMAT JSON)`` gives rows and loops to show beside the shares;
2. one warm-up execution (caches); then the query runs again and again while recorded
   until the backend has been on a CPU long enough for ``min_samples`` samples at
   *freq* (its CPU time, from /proc/PID/schedstat), at most *max_seconds*;
3. ``perf record -F freq -g`` (frame pointers: profkit builds PostgreSQL with
   ``-fno-omit-frame-pointer -mno-omit-leaf-frame-pointer``; this VM has no PMU, so
   perf samples the software ``cpu-clock`` event) on the backend while it runs the
   query; with a Gather in the plan ``perf record -a`` instead, the query's parallel
   workers found by polling /proc for ``parallel worker for PID <backend>``
   (:class:`profkit.collect.procfs.WorkerWatch`) and only those pids kept;
4. ``perf script`` with symbol offsets → stacks (:mod:`profkit.parse.perf_callchains`);
   the return addresses in join functions resolved to their outer/inner call
   (:mod:`profkit.collect.callsites`);
5. the attribution (:mod:`profkit.analyze.nodetime`) → ``nodetime.csv``, the node-rooted
   folded stacks ``nodetime.folded``, ``plan.json``, in the run folder with perf.data.

:func:`nodetime_pid` samples a backend running a query profkit did not start: its text
from pg_stat_activity, its plan from a plain EXPLAIN of that text in another session.

``method="marker"`` (:func:`nodetime_marker_on_conn`) is the exact method: on a
``node_marker`` build the backend publishes the running node's number, and a bcc
program samples that number (:mod:`profkit.experiments.nodetime_marker`); no stack is
walked, so no sample is ambiguous, and there is no node-rooted flamegraph. With
``stacks=True`` perf records the marker's own executions too and ``result.stacks`` is the
stack method's table of them: the one comparison of the two methods that no difference
between server processes enters.
"""
from __future__ import annotations

import contextlib
import html
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from profkit.analyze.nodetime import (
    GATHER_TYPES,
    NODE_FUNCTIONS,
    Attribution,
    PlanNode,
    Sample,
    attribute,
    node_types_table,
    plan_nodes,
    repair_lost_callers,
    samples_from_script,
)
from profkit.collect.callsites import CallSites
from profkit.collect.perf import (
    MIN_SAMPLES,
    SampleShortfall,
    QueryResult,
    perf_path,
    record_pid,
    run_query,
    script,
)
from profkit.collect.procfs import WorkerWatch, schedstat
from profkit.errors import ProbeError, ProfkitError
from profkit.experiments.nodetime_marker import run_marker
from profkit.pg.build import Build, get_build
from profkit.pg.cluster import DB_USER, Cluster, connect_detached, connect_dsn, redact_dsn
from profkit.pg.workloads import check_args, get_workload, workload_spec
from profkit.render.flamegraph import render, write_svg
from profkit.render.nodetime import console_text, plan_tree_html
from profkit.rundir import RunDir, open_run

Say = Callable[[str], None]

#: perf script fields the attribution reads (pid for workers, symbol offsets for call sites)
SCRIPT_FIELDS: tuple[str, ...] = ("-F", "comm,pid,tid,time,event,ip,sym,symoff,dso",
                                  "--no-inline")
NODETIME_CSV = "nodetime.csv"
#: how samples find their plan node: the call stack (any build), or the node marker a
#: node_marker build publishes (exact)
METHODS = ("stacks", "marker")
NODETIME_FOLDED = "nodetime.folded"
PLAN_JSON = "plan.json"
JOIN_FUNCTIONS = frozenset({"ExecNestLoop", "ExecHashJoin", "ExecParallelHashJoin",
                            "ExecMergeJoin", "ExecHashJoinOuterGetTuple",
                            "ExecParallelHashJoinOuterGetTuple"})


class NodeTimeError(ProbeError):
    """nodetime could not run; the message says why and what to do."""


@dataclass
class NodeTimeResult:
    """Per plan node: exclusive and inclusive shares of the on-CPU samples."""

    df: pd.DataFrame
    outside_executor_share: float
    total_samples: float
    outside: dict[str, float]
    run: RunDir
    sql: str
    nodes: list[PlanNode] = field(default_factory=list)
    folded: dict[str, float] = field(default_factory=dict)
    method: str = "stacks"
    has_plan: bool = True                 # False: node TYPES only (no plan could be had)
    facts: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    flamegraph: Path | None = None
    #: the marker method with ``stacks=True``: the same executions by call stack
    stacks: NodeTimeResult | None = None

    @property
    def executor_samples(self) -> float:
        return float(self.df.attrs.get("executor_samples", 0.0))

    def doc(self) -> dict[str, Any]:
        """The ``--json`` document."""
        cols = [c for c in ("node_id", "node_type", "parent_id", "depth", "relation", "alias",
                            "exclusive_share", "inclusive_share", "samples",
                            "ambiguous_samples", "inclusive_samples", "rows", "loops")
                if c in self.df.columns]
        key = "nodes" if self.has_plan else "node_types"
        return {key: self.df[cols], "outside_executor_share": self.outside_executor_share,
                "total_samples": self.total_samples,
                "executor_samples": self.executor_samples,
                "outside": self.outside, "method": self.method, "has_plan": self.has_plan,
                "run_dir": str(self.run.path), "sql": self.sql, **self.facts,
                "notes": self.notes, "warnings": self.warnings,
                "flamegraph": str(self.flamegraph) if self.flamegraph else None,
                **({"stacks": self.stacks.doc()} if self.stacks is not None else {})}

    def console(self) -> str:
        text = console_text(self.df, outside_share=self.outside_executor_share,
                            total=self.total_samples, outside=self.outside,
                            has_plan=self.has_plan, head=self._head(), notes=self.notes,
                            run_dir=str(self.run.path),
                            flamegraph=str(self.flamegraph) if self.flamegraph else None)
        if self.stacks is not None:
            text += ("\n\nThe same executions by call stack (perf record -g beside the "
                     "marker):\n" + self.stacks.console())
        return text

    def _head(self) -> list[str]:
        f = self.facts
        if self.method == "marker":
            return [f"run {self.run.run_id}: {self.total_samples:.0f} samples of backend "
                    f"{f.get('pid')} ({f.get('freq')} Hz, node marker read by bcc, "
                    f"{f.get('reps')} executions"
                    + (f", {len(f.get('worker_pids') or [])} parallel workers"
                       if f.get("worker_pids") else "") + ")"]
        out = [f"run {self.run.run_id}: {self.total_samples:.0f} samples of backend "
               f"{f.get('pid')} ({f.get('freq')} Hz, {f.get('call_graph')} call graphs"
               + (f", {f.get('reps')} executions" if f.get("reps") else "")
               + (f", {len(f.get('worker_pids') or [])} parallel workers"
                  if f.get("parallel") else "") + ")"]
        return out

    def _repr_html_(self) -> str:
        parts = [f"<p><b>{html.escape(w)}</b></p>" for w in self.warnings]
        parts += [f"<p>{html.escape(h)}</p>" for h in self._head()]
        parts.append(plan_tree_html(self.df, outside_share=self.outside_executor_share,
                                    total=self.total_samples, has_plan=self.has_plan))
        parts += [f"<p>{html.escape(n)}</p>" for n in self.notes]
        return "\n".join(parts)


# --------------------------------------------------------------------------- pieces

def explain_plan(conn: Any, sql: str, *, analyze: bool = False) -> Any:
    """EXPLAIN (FORMAT JSON) of *sql* (plain: nothing runs); with *analyze*, one
    execution under EXPLAIN (ANALYZE, TIMING OFF) for rows and loops."""
    opts = "ANALYZE, TIMING OFF, FORMAT JSON" if analyze else "FORMAT JSON"
    row = conn.execute(f"EXPLAIN ({opts}) {sql}").fetchone()
    if row is None:
        raise NodeTimeError("EXPLAIN returned no rows")
    return row[0]


def _same_shape(a: Sequence[PlanNode], b: Sequence[PlanNode]) -> bool:
    return [(n.node_type, n.parent_id) for n in a] == [(n.node_type, n.parent_id) for n in b]


def _plan_of(conn: Any, sql: str) -> Any:
    """Plain EXPLAIN of *sql*; an SQL error becomes a NodeTimeError saying so."""
    try:
        return explain_plan(conn, sql)
    except Exception as e:
        if getattr(e, "sqlstate", None) is None:
            raise
        raise NodeTimeError(f"EXPLAIN of the query failed: {e}".splitlines()[0]) from None


def _has_gather(nodes: Sequence[PlanNode] | None) -> bool:
    """Parallel workers run part of the plan: perf must record every CPU."""
    return nodes is not None and any(n.node_type in GATHER_TYPES for n in nodes)


def run_until(conn: Any, sql: str, pid: int, *, reps: int | None, freq: int,
              min_samples: int, max_seconds: float) -> Any:
    """Run *sql* *reps* times, or (reps None) until backend *pid* has been on a CPU long
    enough for *min_samples* samples at *freq* (15 % margin; its CPU time from
    /proc/PID/schedstat, so a loaded machine gets more executions, not fewer samples),
    at most *max_seconds* of wall time (at least one execution)."""
    if reps is not None:
        return run_query(conn, sql, reps)
    start = schedstat(pid)
    t_end = time.monotonic() + max_seconds
    rows: list[Any] = []
    times: list[float] = []
    while True:
        r = run_query(conn, sql, 1)
        rows, times = r.rows, [*times, *r.seconds]
        now = schedstat(pid)
        cpu = (now[0] - start[0]) / 1e9 if now and start else sum(times)
        if cpu * freq >= 1.15 * min_samples or time.monotonic() >= t_end:
            return QueryResult(rows, tuple(times))


def _binary(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe").replace(" (deleted)", "")
    except OSError as e:
        raise NodeTimeError(f"cannot read /proc/{pid}/exe ({e.strerror}): is {pid} a "
                            "backend of this machine? (run as root)") from None


def _call_sides(samples: Sequence[Sample], cs: CallSites
                ) -> tuple[Callable[[Any], str | None], dict[str, str]]:
    want = {(f.name, f.offset) for s in samples for f in s.frames
            if f.offset is not None and f.name in JOIN_FUNCTIONS
            and (f.module or "").endswith("postgres")}
    try:
        cs.resolve(sorted(want))  # type: ignore[arg-type]
    except ProfkitError:
        return (lambda _f: None), {}

    def side(f: Any) -> str | None:
        if f.offset is None or f.name not in JOIN_FUNCTIONS:
            return None
        return cs.side(f.name, f.offset)
    lines = {f"{k[0]}+{k[1]:#x}": v for k, v in cs.source_lines.items()}
    return side, lines


def attribute_run(rd: RunDir, nodes: list[PlanNode] | None, pids: Sequence[int],
                  binary: str) -> tuple[Attribution | None, pd.DataFrame, dict[str, Any]]:
    """perf script of *rd* (the samples of *pids*) → the attribution and its table
    (``nodes`` None: node types only); writes nodetime.csv and nodetime.folded."""
    txt = script(rd, args=SCRIPT_FIELDS, pids=list(pids))
    samples = samples_from_script(txt, pids)
    extra: dict[str, Any] = {"pids_sampled": sorted({s.pid for s in samples})}
    cs = CallSites(binary)
    try:
        samples, rep = repair_lost_callers(
            samples, lambda f: cs.lost_caller(f.name, f.offset, f.module))
        extra.update(lost_caller_samples=rep.lost, repaired_samples=rep.repaired,
                     repaired_shared_samples=rep.shared, foreign_leaf_samples=rep.foreign_leaf)
    except ProfkitError as e:  # objdump/nm missing or failing: stacks kept as recorded
        extra.update(repair_error=str(e))
    if nodes is None:
        df = node_types_table(samples)
        df.to_csv(rd.file(NODETIME_CSV), index=False)
        rd.add_artifact(NODETIME_CSV, "samples per innermost plan node type (no plan)")
        return None, df, extra
    side, lines = _call_sides(samples, cs)
    att = attribute(nodes, samples, call_side=side)
    df = att.table()
    df.to_csv(rd.file(NODETIME_CSV), index=False)
    rd.add_artifact(NODETIME_CSV, "per plan node: exclusive/inclusive shares of the samples")
    with open(rd.file(NODETIME_FOLDED), "w") as f:
        for stack, w in sorted(att.folded.items()):
            f.write(f"{stack} {w:.6g}\n")
    rd.add_artifact(NODETIME_FOLDED, "folded stacks re-rooted under their plan node path")
    extra.update(call_site_lines=lines, worker_samples=att.worker_samples,
                 skipped_frame_samples=att.skipped_frames_samples,
                 call_site_samples=att.call_sites_used)
    return att, df, extra


def _notes(att: Attribution | None, df: pd.DataFrame, extra: dict[str, Any],
           parallel: bool, workers: Sequence[int]) -> list[str]:
    notes = []
    if att is None:
        return notes
    amb = float(df["ambiguous_samples"].sum())
    if amb > 0:
        which = ", ".join(f"{r.node_id} {r.node_type} {r.ambiguous_samples:.1f}"
                          for r in df[df["ambiguous_samples"] > 0].itertuples())
        notes.append(f"{amb:.0f} samples had no single node (same-type children no call site "
                     f"told apart, a bare ExecScan, or a lost frame with several possible "
                     f"callers): shared in proportion to the unambiguous samples ({which})")
    if extra.get("lost_caller_samples"):
        notes.append(f"{extra['lost_caller_samples']:.0f} samples caught a function before it "
                     "set up its frame or after it tore it down (the walk loses its caller): "
                     f"{extra.get('repaired_samples', 0):.0f} given the callers seen in complete "
                     f"stacks through the same frames ({extra.get('repaired_shared_samples', 0):.0f}"
                     " of them shared among several, counted ambiguous), the rest kept as "
                     "recorded")
    if extra.get("foreign_leaf_samples"):
        notes.append(f"{extra['foreign_leaf_samples']:.0f} samples in a system library (no "
                     "frame pointers: the function that called it is not in the stack) stay "
                     "with the node above it")
    if extra.get("skipped_frame_samples"):
        notes.append(f"{extra['skipped_frame_samples']:.0f} samples matched a path only by "
                     "skipping a node without a frame (a tail call)")
    if extra.get("call_site_samples"):
        notes.append(f"{extra['call_site_samples']:.0f} samples: a join's call site (outer/"
                     "inner, from the return address and the source line) chose the path")
    if parallel:
        notes.append(f"parallel: {len(workers)} worker processes seen, "
                     f"{extra.get('worker_samples', 0):.0f} of their samples attributed to "
                     "the nodes under the Gather (perf record -a, kept by pid)")
    return notes


# --------------------------------------------------------------------------- on a connection

def nodetime_on_conn(conn: Any, sql: str, *, analyze: bool = False, freq: int = 999,
                     min_samples: int = MIN_SAMPLES, max_seconds: float = 60.0,
                     reps: int | None = None, base: str | os.PathLike[str] | None = None,
                     out: str | os.PathLike[str] | None = None, build: Build | None = None,
                     workload: str | None = None, flamegraph: str | os.PathLike[str] | None
                     = None, title: str | None = None, progress: Say | None = None,
                     facts: dict[str, Any] | None = None, method: str = "stacks",
                     stacks: bool = False) -> NodeTimeResult:
    """Time per plan node of *sql* run on *conn*'s backend (see the module docstring).
    *stacks* (marker method only): the same executions by call stack too, in
    ``result.stacks`` (:func:`nodetime_marker_on_conn`)."""
    if method not in METHODS:
        raise NodeTimeError(f"unknown method {method!r}: choose {' or '.join(METHODS)}")
    if stacks and method != "marker":
        raise NodeTimeError("stacks=True records call stacks beside the node marker: it "
                            "needs method='marker' (the stack method has them already)")
    if method == "marker":
        if flamegraph is not None:
            raise NodeTimeError("the marker method walks no stacks, so it draws no "
                                "node-rooted flamegraph: use the stack method for one")
        return nodetime_marker_on_conn(conn, sql, freq=freq, min_samples=min_samples,
                                       max_seconds=max_seconds, reps=reps, base=base,
                                       out=out, build=build, workload=workload,
                                       progress=progress, facts=facts, stacks=stacks)
    say = progress or (lambda _m: None)
    perf_path()
    sql = sql.strip().rstrip(";")
    pid = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
    binary = _binary(pid)
    plan = _plan_of(conn, sql)
    nodes = plan_nodes(plan)
    analyzed_plan = None
    notes: list[str] = []
    if analyze:
        say("EXPLAIN (ANALYZE, TIMING OFF) once, for rows and loops")
        analyzed_plan = explain_plan(conn, sql, analyze=True)
        an = plan_nodes(analyzed_plan)
        if _same_shape(nodes, an):
            nodes = an
        else:
            notes.append("EXPLAIN ANALYZE planned another tree than EXPLAIN: its rows and "
                         "loops are not shown")
    parallel = _has_gather(nodes)
    t0 = time.perf_counter()
    run_query(conn, sql, 1)  # warm-up: caches, and the time of one execution
    one = time.perf_counter() - t0
    say(f"one execution took {one * 1000:.1f} ms: recording "
        + (f"{reps} executions" if reps is not None else
           f"until about {min_samples} samples of CPU time (at most {max_seconds:g} s)")
        + f" at {freq} Hz ({'perf -a, parallel workers by pid' if parallel else f'perf -p {pid}'})")
    words = (build.name if build else None, workload)
    with open_run("nodetime", words=[w for w in words if w] or ["query"], build=build,
                  workload=workload, base=base, path=out, tools=("perf",), query=sql,
                  backend_pid=pid, **(facts or {})) as rd:
        rd.file(PLAN_JSON).write_text(json.dumps(plan, indent=1))
        rd.add_artifact(PLAN_JSON, "EXPLAIN (FORMAT JSON) of the query")
        if analyzed_plan is not None:
            rd.file("plan-analyze.json").write_text(json.dumps(analyzed_plan, indent=1))
            rd.add_artifact("plan-analyze.json", "EXPLAIN (ANALYZE, TIMING OFF), separate run")
        with WorkerWatch(pid) as watch:
            rec, res = record_pid(pid, lambda: run_until(conn, sql, pid, reps=reps, freq=freq,
                                                          min_samples=min_samples,
                                                          max_seconds=max_seconds),
                                  run=rd, freq=freq, call_graph="fp", stat=False,
                                  binary=binary, system_wide=parallel)
        n = len(res.seconds)
        workers = sorted(watch.pids)
        rd.update(reps=n, query_seconds=[round(x, 6) for x in res.seconds],
                  worker_pids=workers, parallel=parallel)
        say(f"perf kept {rec.samples} samples; attributing")
        att, df, extra = attribute_run(rd, nodes, [pid, *workers], binary)
        result = _result(rd, sql, nodes, att, df, extra, notes, parallel, workers,
                         {"pid": pid, "freq": freq, "call_graph": "fp", "reps": n,
                          "seconds": round(sum(res.seconds), 6), "binary": binary,
                          "parallel": parallel, "worker_pids": workers,
                          "one_execution_ms": round(one * 1000, 3)},
                         SampleShortfall(samples=int(df.attrs["executor_samples"]), freq=freq,
                                         seconds=sum(res.seconds), reps=n),
                         min_samples)
        if flamegraph is not None:
            result.flamegraph = node_flamegraph(result, flamegraph, title=title)
    return result


def nodetime_marker_on_conn(conn: Any, sql: str, *, freq: int = 999,
                            min_samples: int = MIN_SAMPLES, max_seconds: float = 60.0,
                            reps: int | None = None,
                            base: str | os.PathLike[str] | None = None,
                            out: str | os.PathLike[str] | None = None,
                            build: Build | None = None, workload: str | None = None,
                            progress: Say | None = None,
                            facts: dict[str, Any] | None = None,
                            stacks: bool = False) -> NodeTimeResult:
    """Time per plan node of *sql* by the node marker (a ``node_marker`` server): the
    query repeats for *reps* executions, or until the backend's CPU time holds
    *min_samples* samples at *freq* (at most *max_seconds* of wall time); the same table
    as the stack method's.

    *stacks*: ``perf record -g`` on the backend during the same sampled executions, and
    the stack method's attribution of them in ``result.stacks`` (its run folder
    ``stacks/`` inside this one). Two runs, even of one build, are two server processes
    and differ by more than their sampling error (docs/nodetime.md); on the same
    executions the two tables differ only by how a sample finds its node."""
    say = progress or (lambda _m: None)
    sql = sql.strip().rstrip(";")
    pid = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
    binary = ""
    parallel = False
    if stacks:
        perf_path()
        binary = _binary(pid)
        parallel = _has_gather(plan_nodes(_plan_of(conn, sql)))
    # CPU time for min_samples at freq, 15 % margin (as the stack method's run_until)
    cpu_seconds = 1.15 * min_samples / freq if reps is None else 0.0
    say("recording " + (f"{reps} executions" if reps is not None else
                        f"until about {min_samples} samples of CPU time (at most "
                        f"{max_seconds:g} s)")
        + f" at {freq} Hz, reading the node marker of backend {pid} with bcc")
    words = (build.name if build else None, workload)
    with open_run("nodetime", words=[w for w in words if w] or ["query"], build=build,
                  workload=workload, base=base, path=out, tools=("bcc",), query=sql,
                  backend_pid=pid, method="marker", **(facts or {})) as rd, \
            contextlib.ExitStack() as later:
        srd: RunDir | None = None
        recorded: dict[str, Any] = {}
        around = None
        if stacks:
            srd = later.enter_context(open_run(
                "nodetime", path=rd.file("stacks"), build=build, workload=workload,
                tools=("perf",), query=sql, backend_pid=pid, method="stacks",
                same_executions_as=rd.run_id))

            def around(loop: Callable[[], None]) -> None:
                with WorkerWatch(pid) as watch:
                    recorded["rec"], _ = record_pid(
                        pid, loop, run=srd, freq=freq, call_graph="fp", stat=False,
                        binary=binary, system_wide=parallel)
                recorded["workers"] = sorted(watch.pids)
        try:
            mr = run_marker(conn, sql, frequency=freq, min_cpu_seconds=cpu_seconds,
                            max_seconds=max_seconds if reps is None else math.inf,
                            min_executions=reps or 1, max_executions=reps or 100_000,
                            around=around)
        except ProbeError as e:
            raise NodeTimeError(str(e)) from None
        rd.file(PLAN_JSON).write_text(json.dumps(mr.plan, indent=1))
        rd.add_artifact(PLAN_JSON, "EXPLAIN (ANALYZE, TIMING FALSE, BUFFERS FALSE, "
                                   "FORMAT JSON), before the sampled executions")
        ns = mr.samples
        df = mr.nodes
        workers = list(ns.worker_pids)
        rd.update(reps=mr.executions, worker_pids=workers, parallel=bool(workers))
        notes = []
        if ns.read_errors or ns.bad_magic:
            notes.append(f"{ns.read_errors} samples had an unreadable marker and "
                         f"{ns.bad_magic} a wrong magic number: left out")
        short = SampleShortfall(samples=int(df.attrs["executor_samples"]), freq=freq,
                                seconds=mr.seconds, reps=mr.executions)
        result = _result(rd, sql, plan_nodes(mr.plan), None, df, {}, notes, bool(workers),
                         workers, {"pid": pid, "freq": freq, "reps": mr.executions,
                                   "seconds": round(mr.seconds, 6),
                                   "binary": str(ns.binary), "parallel": bool(workers),
                                   "worker_pids": workers,
                                   "backend_samples": ns.backend_samples,
                                   "read_errors": ns.read_errors,
                                   "bad_magic": ns.bad_magic}, short, min_samples)
        result.method = "marker"
        df.to_csv(rd.file(NODETIME_CSV), index=False)
        rd.add_artifact(NODETIME_CSV, "per plan node: samples and shares (node marker)")
        if srd is not None:
            say(f"perf kept {recorded['rec'].samples} samples of the same executions; "
                "attributing them by call stack")
            result.stacks = _stacks_of(srd, sql, plan_nodes(mr.plan), pid,
                                       recorded.get("workers", []), binary, parallel, freq,
                                       mr, min_samples)
            rd.add_artifact("stacks", "the same executions by call stack (perf record -g): "
                                      "a nodetime run folder")
    return result


def _stacks_of(srd: RunDir, sql: str, nodes: list[PlanNode], pid: int, workers: list[int],
               binary: str, parallel: bool, freq: int, mr: Any, min_samples: int
               ) -> NodeTimeResult:
    """The stack method's result for a perf recording made during a marker run."""
    srd.update(reps=mr.executions, worker_pids=workers, parallel=parallel)
    att, df, extra = attribute_run(srd, nodes, [pid, *workers], binary)
    return _result(srd, sql, nodes, att, df, extra, [], parallel, workers,
                   {"pid": pid, "freq": freq, "call_graph": "fp", "reps": mr.executions,
                    "seconds": round(mr.seconds, 6), "binary": binary, "parallel": parallel,
                    "worker_pids": workers},
                   SampleShortfall(samples=int(df.attrs["executor_samples"]), freq=freq,
                                   seconds=mr.seconds, reps=mr.executions), min_samples)


def _result(rd: RunDir, sql: str, nodes: list[PlanNode] | None, att: Attribution | None,
            df: pd.DataFrame, extra: dict[str, Any], notes: list[str], parallel: bool,
            workers: Sequence[int], facts: dict[str, Any], short: SampleShortfall,
            min_samples: int, repeat_flag: str | None = "--reps") -> NodeTimeResult:
    notes = notes + _notes(att, df, extra, parallel, workers)
    warnings = []
    if short.samples < min_samples:
        warnings.append("warning: " + SampleShortfall(
            samples=short.samples, freq=short.freq, seconds=short.seconds, reps=short.reps,
            query=short.query, minimum=min_samples).message(freq_flag="--freq",
                                                             repeat_flag=repeat_flag))
    outside = dict(att.outside) if att is not None else {
        "outside the plan's nodes": float(df.attrs["outside_samples"])}
    res = NodeTimeResult(df=df, outside_executor_share=float(df.attrs["outside_executor_share"]),
                         total_samples=float(df.attrs["total_samples"]), outside=outside,
                         run=rd, sql=sql, nodes=list(nodes or []),
                         folded=dict(att.folded) if att is not None else {},
                         has_plan=nodes is not None,
                         facts={**facts, **{k: v for k, v in extra.items()
                                            if k != "call_site_lines"}},
                         notes=notes, warnings=warnings)
    rd.update(nodetime={"total_samples": res.total_samples,
                        "executor_samples": res.executor_samples,
                        "outside_executor_share": res.outside_executor_share,
                        "outside": outside, "has_plan": res.has_plan, "notes": notes,
                        "call_site_lines": extra.get("call_site_lines", {})})
    return res


def node_flamegraph(result: NodeTimeResult, path: str | os.PathLike[str], *,
                    title: str | None = None, against: NodeTimeResult | None = None) -> Path:
    """The node-rooted flamegraph of *result* (differential against *against*: red, the
    node/function got dearer in *result*); a copy goes into the run folder."""
    if not result.folded:
        raise NodeTimeError("no node-rooted stacks to draw (no plan: node types only)")
    facts = result.run.subtitle_facts()
    facts["samples"] = f"{result.total_samples:,.0f}"
    facts["outside executor"] = f"{result.outside_executor_share:.1%}"
    if against is not None:
        facts["before (A)"] = f"run {against.run.run_id}"
        facts["after (B)"] = f"run {result.run.run_id}"
    svg = render(result.folded, title=title or "time per plan node (perf, by call stack)",
                 provenance=facts,
                 diff_against=against.folded if against is not None else None)
    out = write_svg(svg, path)
    name = "nodetime-diff.svg" if against is not None else "nodetime.svg"
    write_svg(svg, result.run.file(name))
    result.run.add_artifact(name, f"node-rooted flamegraph (copy of {out})")
    return out


# --------------------------------------------------------------------------- front doors

def workload_name(workload: str, query: str | None) -> str:
    """The one string naming a workload and one of its queries (checked now)."""
    return workload_spec(workload, query)


def nodetime_build(build: str | Build, workload: str | None = None, *, sql: str | None = None,
                   scale: float = 0.05, progress: Say | None = None,
                   settings: dict[str, str] | None = None, **kw: Any) -> NodeTimeResult:
    """Build (cached) → throwaway cluster → load *workload* → :func:`nodetime_on_conn`
    on *sql* or the workload's query. *settings*: SET before the query (session)."""
    say = progress or (lambda _m: None)
    wl = check_args(workload, scale=scale) if workload else None
    if (wl is None) == (sql is None):
        raise NodeTimeError("give a workload (nested_loop, join_sum, count_star, FILE.toml) "
                            "or --sql")
    b = build if isinstance(build, Build) else get_build(build, progress=say)
    with Cluster(b, name="nodetime-" + b.name.replace("/", "_")) as cl, cl.connect() as conn:
        if wl is not None:
            say(f"loading {wl.name} at scale {scale}")
            wl.load(conn, scale)
        for k, v in (settings or {}).items():
            conn.execute(f"SET {k} = '{v}'")
        query = sql if sql is not None else wl.select_sql  # type: ignore[union-attr]
        return nodetime_on_conn(conn, query, build=b, workload=wl.name if wl else None,
                                progress=say, facts={"settings_set": settings or {}}, **kw)


def nodetime_target(*, cluster: str | None = None, dsn: str | None = None,
                    workload: str | None = None, query: str | None = None,
                    sql: str | None = None, progress: Say | None = None,
                    **kw: Any) -> NodeTimeResult:
    """:func:`nodetime_on_conn` on a cluster started with ``profkit cluster start``
    (workload loaded) or any server (*dsn*; nothing on it is changed)."""
    if (cluster is None) == (dsn is None):
        raise NodeTimeError("give a cluster name or a DSN")
    if bool(workload) == bool(sql):
        raise NodeTimeError("give a workload (nested_loop, join_sum, count_star, FILE.toml) "
                            "or --sql")
    text = sql if sql else get_workload(workload, query).select_sql  # type: ignore[arg-type]
    conn = connect_detached(cluster) if cluster else connect_dsn(dsn)  # type: ignore[arg-type]
    with conn:
        return nodetime_on_conn(conn, text, workload=workload, progress=progress,
                                facts={"target": {"cluster": cluster,
                                                  "dsn": redact_dsn(dsn) if dsn else None}},
                                **kw)


def _postmaster_socket(pid: int) -> tuple[str, int]:
    """(socket directory, port) of the server backend *pid* belongs to, from its
    postmaster's postmaster.pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        datadir = os.readlink(f"/proc/{ppid}/cwd")
        lines = Path(datadir, "postmaster.pid").read_text().splitlines()
        return lines[4].strip() or "/tmp", int(lines[3])
    except (OSError, IndexError, ValueError) as e:
        raise NodeTimeError(f"cannot find the server of pid {pid} ({e}); give --dsn DSN or "
                            "--cluster NAME for the side session") from None


def nodetime_pid(pid: int, *, seconds: float = 10.0, cluster: str | None = None,
                 dsn: str | None = None, freq: int = 999, min_samples: int = MIN_SAMPLES,
                 base: str | os.PathLike[str] | None = None,
                 out: str | os.PathLike[str] | None = None,
                 flamegraph: str | os.PathLike[str] | None = None,
                 progress: Say | None = None) -> NodeTimeResult:
    """A backend running a query profkit did not start: its text from pg_stat_activity,
    its plan from a plain EXPLAIN of that text in another session (node TYPES only where
    no plan can be had), *seconds* of samples of that pid (and its parallel workers)."""
    import psycopg

    say = progress or (lambda _m: None)
    perf_path()
    binary = _binary(pid)
    if cluster:
        side = connect_detached(cluster)
    elif dsn:
        side = connect_dsn(dsn)
    else:
        sock, port = _postmaster_socket(pid)
        try:
            side = psycopg.connect(host=sock, port=port, user=DB_USER, dbname="postgres",
                                   autocommit=True, connect_timeout=10)
        except psycopg.Error as e:
            raise NodeTimeError(f"cannot connect to the server of pid {pid} as {DB_USER} "
                                f"({str(e).strip().splitlines()[-1]}); give --dsn DSN") from None
    notes: list[str] = []
    with side:
        row = side.execute("SELECT datname, query, state, backend_type FROM pg_stat_activity "
                           "WHERE pid = %s", (pid,)).fetchone()
        if row is None:
            raise NodeTimeError(f"pid {pid} is not a backend of this server (not in "
                                "pg_stat_activity)")
        datname, text, state, btype = row
        text = (text or "").strip().rstrip(";")
        if state != "active":
            notes.append(f"pid {pid} was {state!r} when sampling began, its last query: "
                         "shares are of what it runs while sampled")
        nodes: list[PlanNode] | None = None
        plan = None
        why = ""
        db_conn = side
        try:
            if datname and side.info.dbname != datname:
                db_conn = psycopg.connect(side.info.dsn, dbname=datname, autocommit=True)
            plan = explain_plan(db_conn, text)
            nodes = plan_nodes(plan)
        except psycopg.Error as e:
            why = (getattr(getattr(e, "diag", None), "message_primary", None)
                   or str(e).strip().splitlines()[0])
        finally:
            if db_conn is not side:
                db_conn.close()
    if nodes is None:
        notes.append(f"no plan for its query (EXPLAIN said: {why}; e.g. parameters or a "
                     "utility statement): samples are reported per node TYPE, not per node")
    else:
        notes.append("the plan is a plain EXPLAIN of pg_stat_activity's text in another "
                     "session: the running plan may differ if statistics or settings do")
    parallel = _has_gather(nodes)
    say(f"sampling backend {pid} for {seconds:g} s at {freq} Hz")
    with open_run("nodetime", words=[f"pid{pid}"], base=base, path=out, tools=("perf",),
                  query=text, backend_pid=pid, target={"pid": pid, "backend_type": btype,
                                                       "state": state}) as rd:
        if plan is not None:
            rd.file(PLAN_JSON).write_text(json.dumps(plan, indent=1))
            rd.add_artifact(PLAN_JSON, "EXPLAIN (FORMAT JSON) of the query, another session")
        with WorkerWatch(pid) as watch:
            rec, _ = record_pid(pid, lambda: _sleep_while(pid, seconds), run=rd, freq=freq,
                                call_graph="fp", stat=False, binary=binary,
                                system_wide=parallel)
        workers = sorted(watch.pids)
        att, df, extra = attribute_run(rd, nodes, [pid, *workers], binary)
        result = _result(rd, text, nodes, att, df, extra, notes, parallel, workers,
                         {"pid": pid, "freq": freq, "call_graph": "fp", "seconds": seconds,
                          "binary": binary, "parallel": parallel, "worker_pids": workers},
                         SampleShortfall(samples=int(df.attrs["executor_samples"]), freq=freq,
                                         seconds=seconds, query=False),
                         min_samples, repeat_flag=None)
        if flamegraph is not None and result.folded:
            result.flamegraph = node_flamegraph(result, flamegraph,
                                                title=f"backend {pid}: time per plan node")
    return result


def _sleep_while(pid: int, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and Path(f"/proc/{pid}").exists():
        time.sleep(min(0.1, max(0.0, end - time.monotonic())))


def nodetime_diff(before: NodeTimeResult, after: NodeTimeResult,
                  path: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """The differential node-rooted flamegraph *before* → *after* (red: dearer in
    *after*), and the per-node table of both beside it (nodetime-diff.csv)."""
    out = node_flamegraph(after, path, against=before,
                          title=title or "time per plan node: differential")
    both = before.df[["node_id", "node_type", "exclusive_share"]].merge(
        after.df[["node_id", "node_type", "exclusive_share"]], on=["node_id", "node_type"],
        how="outer", suffixes=("_before", "_after"))
    both.to_csv(after.run.file("nodetime-diff.csv"), index=False)
    after.run.add_artifact("nodetime-diff.csv", f"exclusive shares beside run "
                                                f"{before.run.run_id}'s")
    return out


__all__ = ["NODE_FUNCTIONS", "NodeTimeError", "NodeTimeResult", "node_flamegraph",
           "nodetime_build", "nodetime_diff", "nodetime_on_conn", "nodetime_pid",
           "nodetime_target"]
