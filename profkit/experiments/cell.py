"""One SQL statement on a kept cluster under a collector: what a ``%%profkit`` cell runs.

The notebook's cell magic (:mod:`profkit.lab.magics`) parses its options into a
:class:`CellRequest` and shows the :class:`CellResult` this module returns; the work is
here, on the experiments of :mod:`profkit.experiments.profile` (perf, gprof, callgrind)
and :mod:`profkit.experiments.probe` (ltrace, eBPF).

One cluster per build is started on first use and kept in a :class:`ClusterRegistry`
(``REGISTRY`` in the magic) so successive cells reuse loaded tables; every cluster is
stopped by pid by :meth:`ClusterRegistry.stop`. Every collector's cell is one run under
``profiles/`` through :func:`profkit.rundir.open_run`, finished complete, failed (with the
error) or interrupted.
"""
from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from profkit import rundir
from profkit.collect.perf import max_sample_rate, sample_shortfall
from profkit.errors import ProfkitError
from profkit.experiments import probe, profile
from profkit.pg.build import Build, get_build, resolve_spec
from profkit.pg.cluster import Cluster
from profkit.pg.workloads import EXPLAIN_PREFIX, MODES, check_args, check_scale, get_workload
from profkit.render.flamegraph import FlameGraph

__all__ = ["COLLECTORS", "MODES", "CellRequest", "CellResult", "CellUsageError",
           "ClusterRegistry", "ClusterSession", "check", "run_cell", "statement"]

COLLECTORS = ("none", "perf", "gprof", "ltrace", "bpf", "callgrind")

Say = Callable[[str], None]


class CellUsageError(ProfkitError):
    """A cell that cannot run as written (no SQL, EXPLAIN twice, gprof without -pg)."""


# --------------------------------------------------------------------------- clusters


@dataclass
class ClusterSession:
    build: Build
    cluster: Cluster
    loaded: dict[str, float] = field(default_factory=dict)  # workload -> scale

    def alive(self) -> bool:
        proc = getattr(self.cluster, "proc", None)
        return proc is not None and proc.alive()


class ClusterRegistry:
    """One running cluster per build name, started on demand, stopped by pid."""

    def __init__(self) -> None:
        self._sessions: dict[str, ClusterSession] = {}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        return list(self._sessions)

    def __contains__(self, name: str) -> bool:
        return name in self._sessions

    def get(self, build_name: str, progress: Say | None = None) -> ClusterSession:
        with self._lock:
            s = self._sessions.get(build_name)
            if s is not None and s.alive():
                return s
            if s is not None:  # died (OOM, killed): start a fresh one
                self._stop_one(build_name)
            build = get_build(build_name, progress=progress)
            cl = Cluster(build, name=f"magic-{build_name}")
            cl.start()
            s = ClusterSession(build, cl)
            self._sessions[build_name] = s
            return s

    def ensure_workload(self, s: ClusterSession, workload: str, scale: float) -> bool:
        """Load *workload* at *scale* unless it is loaded already; True if it loaded."""
        wl = get_workload(workload)
        check_scale(scale)
        if s.loaded.get(workload) == scale:
            return False
        with s.cluster.connect() as conn:
            wl.load(conn, scale)
        s.loaded[workload] = scale
        return True

    def _stop_one(self, name: str) -> None:
        s = self._sessions.pop(name, None)
        if s is not None:
            s.cluster.stop()

    def stop(self, names: list[str] | None = None) -> list[str]:
        """Stop the named clusters (all when None); return the names stopped."""
        with self._lock:
            todo = list(self._sessions) if not names else names
            unknown = [n for n in todo if n not in self._sessions]
            if unknown:
                raise ProfkitError(f"no %%profkit cluster for {', '.join(unknown)}; running: "
                                   f"{', '.join(self._sessions) or 'none'}")
            for n in todo:
                self._stop_one(n)
            return todo

    def _repr_html_(self) -> str:
        if not self._sessions:
            return "<i>no %%profkit clusters running</i>"
        rows = "".join(
            f"<tr><td>{html.escape(n)}</td><td>{s.cluster.pid if s.alive() else '-'}</td>"
            f"<td>{'running' if s.alive() else 'stopped'}</td>"
            f"<td>{html.escape(', '.join(f'{w}@{sc:g}' for w, sc in s.loaded.items()) or '-')}"
            f"</td></tr>" for n, s in self._sessions.items())
        return ("<table><tr><th>build</th><th>postmaster pid</th><th>state</th>"
                f"<th>workloads</th></tr>{rows}</table>")

    def __repr__(self) -> str:
        return f"<ClusterRegistry {', '.join(self._sessions) or 'empty'}>"


# --------------------------------------------------------------------------- the cell


@dataclass
class CellRequest:
    build: str = "vanilla"
    collector: str = "none"
    mode: str = "plain"
    workload: str | None = None  # a name or FILE.toml, with "#query" for a named query
    scale: float = 0.02
    reps: int = 1
    top: int = 15
    freq: int = 999


@dataclass
class CellResult:
    """What a cell shows: *shown* (a table or a flamegraph), the tables shown before it
    (*also*), one sentence on what was measured (*note*) and the run directory."""

    shown: pd.DataFrame | FlameGraph
    note: str
    also: list[pd.DataFrame] = field(default_factory=list)
    run_dir: Path | None = None

    def _repr_html_(self) -> str:
        parts = [f"<p>{html.escape(self.note)}</p>"]
        parts += [t.to_html(index=False) for t in self.also]
        parts.append(self.shown._repr_html_() if isinstance(self.shown, FlameGraph)
                     else self.shown.to_html(index=False))
        return "\n".join(parts)

    def console(self) -> str:
        """The result as text for a terminal."""
        tables = [*self.also, self.shown]
        text = [t.to_string(index=False) if isinstance(t, pd.DataFrame)
                else f"flamegraph: {t.total:,.0f} samples" for t in tables]
        return "\n\n".join([self.note, *text])


def check(req: CellRequest) -> None:
    """Everything that can be checked before a build or a cluster start."""
    check_args(req.workload, scale=req.scale, reps=req.reps, mode=req.mode)
    spec = resolve_spec(req.build)
    if req.collector == "gprof" and "--enable-profiling" not in spec.configure_opts:
        alt = "gprof" if req.build == "vanilla" else f"{req.build}+gprof"
        raise CellUsageError("--collector gprof needs a build configured with "
                             f"--enable-profiling; use --build {alt}")


def statement(cell: str, req: CellRequest) -> str:
    """The SQL to run: the cell (one statement) or the workload's query, with EXPLAIN."""
    sql = cell.strip().rstrip(";").strip()
    # IPython refuses a cell magic with an empty body, so a body of comments only
    # ("-- the workload's query") stands for "run the --workload's query".
    if all(not ln.strip() or ln.strip().startswith("--") for ln in sql.splitlines()):
        if req.workload is None:
            raise CellUsageError("the cell has no SQL: write a statement, or give "
                                 "--workload W to run that workload's query")
        sql = get_workload(req.workload).select_sql
    if req.mode != "plain":
        if sql.lower().startswith("explain"):
            raise CellUsageError(f"--mode {req.mode} adds EXPLAIN itself: write the bare "
                                 "query in the cell, or use --mode plain")
        sql = EXPLAIN_PREFIX[req.mode] + sql
    return sql


def run_cell(req: CellRequest, cell: str, registry: ClusterRegistry,
             say: Say | None = None) -> CellResult:
    """Check *req*, start (or reuse) the build's cluster, load the workload, run the
    statement under the collector.

    A collector's cell is one run (``magic-<collector>``) through
    :func:`profkit.rundir.open_run`: it ends complete, or failed with the error (a
    statement that fails, a tool that does not attach), or interrupted."""
    note = say or (lambda _m: None)
    check(req)
    sql = statement(cell, req)
    s = registry.get(req.build, progress=note)
    if req.workload is not None and registry.ensure_workload(s, req.workload, req.scale):
        note(f"loaded {req.workload} at scale {req.scale:g} into {req.build}")
    if req.collector == "none":
        return _run_none(s, sql, req)
    with rundir.open_run(f"magic-{req.collector}", build=s.build, workload=req.workload,
                         mode=req.mode, tools=COLLECTOR_TOOLS[req.collector],
                         tool=req.collector, scale=req.scale,
                         query=None if req.workload else "cell") as rd:
        return COLLECTORS_RUN[req.collector](s, sql, req, note, rd)


def _rows_frame(cur: Any) -> pd.DataFrame:
    if cur.description is None:
        return pd.DataFrame({"status": [cur.statusmessage]})
    return pd.DataFrame(cur.fetchall(), columns=[d.name for d in cur.description])


def _run_none(s: ClusterSession, sql: str, req: CellRequest) -> CellResult:
    times: list[float] = []
    df = pd.DataFrame()
    with s.cluster.connect() as conn:
        for _ in range(req.reps):
            t0 = time.perf_counter()
            df = _rows_frame(conn.execute(sql))
            times.append((time.perf_counter() - t0) * 1000)
    df.attrs.update(build=req.build, mode=req.mode, client_ms=times)
    return CellResult(df, f"{req.build}: {len(df)} row(s) in {min(times):.2f} ms"
                      + (f" (min of {req.reps})" if req.reps > 1 else ""))


def _run_perf(s: ClusterSession, sql: str, req: CellRequest, say: Say,
              rd: rundir.RunDir) -> CellResult:
    with s.cluster.connect() as conn:
        prof = profile.perf_on_cluster(s.cluster, conn, sql, binary=s.build.postgres,
                                       reps=req.reps, mode=req.mode, workload=req.workload,
                                       scale=req.scale, freq=req.freq, run=rd)
    facts = prof.run.subtitle_facts()
    short = sample_shortfall(prof)
    if short is not None:
        # no share off a handful of samples: say why, and how to get enough
        fix = short.message(freq_flag="--freq", repeat_flag="--reps",
                            max_freq=max_sample_rate())
        note = f"{req.build}: {fix} Run directory {rd.path}"
        facts["samples"] = f"{prof.folding.samples} (too few: shares need >= {short.minimum})"
    else:
        note = (f"{req.build}: {prof.folding.samples} samples, instrumentation "
                f"{prof.instrumentation_share:.1%} of them; run directory {rd.path}")
    fg = FlameGraph(prof.counts, title=f"{req.build}: {req.mode}", provenance=facts)
    return CellResult(fg, note, run_dir=rd.path)


def _run_ltrace(s: ClusterSession, sql: str, req: CellRequest, say: Say,
                rd: rundir.RunDir) -> CellResult:
    with s.cluster.connect() as conn:
        conn.execute(sql)  # warm-up: catalog lookups are not part of the count
        df, r = probe.ltrace_counts(conn, sql, out_dir=rd.path, build=req.build,
                                    functions=("clock_gettime",))
    rd.update(query_ms=r.query_ms)
    return CellResult(df, f"{req.build}: ltrace attached in {r.attach_s:.2f} s; the query "
                          f"took {r.query_ms:.0f} ms under ltrace; summary in {rd.path}",
                      run_dir=rd.path)


def _run_bpf(s: ClusterSession, sql: str, req: CellRequest, say: Say,
             rd: rundir.RunDir) -> CellResult:
    with s.cluster.connect() as conn:
        conn.execute(sql)
        res = probe.probe_statement(conn, sql, out_dir=rd.path)
    rd.update(tool=res.tool, query_ms=res.query_ms)
    note = (f"{req.build}: {res.tool} probes on {', '.join(res.attached)}"
            + (f" ({res.fallback_reason})" if res.fallback_reason else "")
            + f"; clock reads outside plan nodes: {res.outside_clock_reads}")
    if not res.nodes.empty:
        return CellResult(res.nodes, note, also=[res.functions.copy()], run_dir=rd.path)
    return CellResult(res.functions.copy(), note, run_dir=rd.path)


def _run_callgrind(s: ClusterSession, sql: str, req: CellRequest, say: Say,
                   rd: rundir.RunDir) -> CellResult:
    say(f"{req.build}: running the statement under callgrind (single-user mode; the "
        "cluster restarts afterwards)")
    counts, prof = profile.callgrind_on_cluster(s.cluster, {req.mode: sql}, rd.path,
                                                build=req.build, workload=req.workload or "")
    prof = profile.store_callgrind(rd, counts, prof)
    fn = prof.functions.sort_values("self", ascending=False).head(req.top)
    also = [counts[["build", "mode", "instructions", "scope", "executor_instructions"]]]
    arcs = profile.instrumentation_arcs(prof.call_edges)
    if len(arcs):  # who calls the instrumentation (none on a plain statement)
        also.append(arcs)
    return CellResult(fn.drop(columns="run_id").reset_index(drop=True),
                      f"{req.build}: {int(counts['instructions'].iloc[0]):,} instructions in "
                      f"{counts['scope'].iloc[0]}; profile, functions.parquet and "
                      f"call_edges.parquet in {rd.path}",
                      also=also, run_dir=rd.path)


def _run_gprof(s: ClusterSession, sql: str, req: CellRequest, say: Say,
               rd: rundir.RunDir) -> CellResult:
    # a fresh backend runs the statement and exits: gmon.out is written at exit
    res = profile.gprof_on_cluster(s.cluster, sql, run=rd, reps=req.reps,
                                   workload=req.workload, mode=req.mode, scale=req.scale)
    fn = res.functions.sort_values("calls", ascending=False, na_position="last")
    cols = [c for c in ("function", "calls", "self", "total", "self_share") if c in fn.columns]
    return CellResult(fn[cols].head(req.top).reset_index(drop=True),
                      f"{req.build}: gprof call counts of backend {rd.get('backend_pid')}; "
                      f"run directory {rd.path}", run_dir=rd.path)


#: the programs whose versions a collector's run records
COLLECTOR_TOOLS: dict[str, tuple[str, ...]] = {
    "perf": ("perf", "gcc"), "gprof": ("gprof", "gcc"), "ltrace": ("ltrace",),
    "bpf": ("bpftrace",), "callgrind": ("valgrind",),
}

COLLECTORS_RUN: dict[str, Callable[[ClusterSession, str, CellRequest, Say, rundir.RunDir],
                                   CellResult]] = {
    "perf": _run_perf, "ltrace": _run_ltrace, "bpf": _run_bpf, "callgrind": _run_callgrind,
    "gprof": _run_gprof,
}
