"""IPython integration: ``%load_ext profkit``.

Registers

- the cell magic ``%%profkit [options]`` — runs the SQL in the cell on a build's
  cluster under a collector and shows the result (see :data:`USAGE`);
- the line magic ``%profkit_stop [BUILD ...]`` — stops the clusters the magic
  started (all of them without arguments);
- the line magic ``%profkit_clusters`` — lists them.

One cluster per build is started on first use and kept for the kernel's
session in :data:`REGISTRY`, so successive cells reuse loaded tables; all of
them are stopped by pid at kernel exit (atexit) or with ``%profkit_stop``.

Bad options, ``--help`` and library errors never kill the cell or the kernel:
argparse runs over ``shlex.split(line)`` with its exits turned into
exceptions, and a :class:`~profkit.errors.ProfkitError` is shown as a short
message (no traceback).
"""
from __future__ import annotations

import argparse
import atexit
import html
import shlex
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd

from profkit.errors import ProfkitError

COLLECTORS = ("none", "perf", "gprof", "ltrace", "bpf", "callgrind")
MODES = ("plain", "analyze_notiming", "analyze_timing")


class MagicUsageError(ProfkitError):
    """Bad %%profkit options; the message holds the usage line."""


class _HelpShown(Exception):
    """--help was given: the help text has been printed, nothing to run."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of calling sys.exit (a cell must survive)."""

    def error(self, message: str) -> NoReturn:
        raise MagicUsageError(f"{self.format_usage().strip()}\n%%profkit: error: {message} "
                              "(see %%profkit --help)")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if status:
            raise MagicUsageError((message or "").strip() or f"%%profkit: exit status {status}")
        raise _HelpShown()


_EPILOG = """\
The cell holds one SQL statement; a cell of SQL comments only (-- ...) runs the
--workload's query. --mode wraps the statement in EXPLAIN (ANALYZE, TIMING off/on).
One cluster per build is kept for the kernel session: %profkit_clusters lists
them, %profkit_stop [BUILD] stops them (they also stop when the kernel exits).

examples:
  %%profkit --workload nested_loop --scale 0.05
  -- the workload's query: returns its count

  %%profkit --build step3 --collector perf --mode analyze_timing --workload nested_loop
  -- a flamegraph of EXPLAIN ANALYZE (TIMING on) on the step3 build

  %%profkit --collector bpf --mode analyze_timing
  SELECT sum(i) FROM generate_series(1, 100000) i
"""


def make_parser() -> _Parser:
    p = _Parser(
        prog="%%profkit", add_help=True,
        description="Run the SQL in the cell on a PostgreSQL build's cluster under a collector.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="vanilla",
                   help="build preset (vanilla, gprof, step1..step3, coarse_clock, ...); "
                        "built on first use if not cached (default: vanilla)")
    p.add_argument("--collector", choices=COLLECTORS, default="none",
                   help="none: the query's rows; perf: a flamegraph; gprof: call counts "
                        "(needs a profiling build, e.g. --build gprof); ltrace: clock_gettime "
                        "calls; bpf: instrumentation calls per function and plan node; "
                        "callgrind: instructions (default: none)")
    p.add_argument("--mode", choices=MODES, default="plain",
                   help="plain: the SQL as is; analyze_notiming / analyze_timing: wrapped in "
                        "EXPLAIN (ANALYZE, TIMING off/on) (default: plain)")
    p.add_argument("--workload", default=None,
                   help="load a workload first (nested_loop, join_sum, count_star, or a "
                        "workload FILE.toml); reloaded only when the scale changes")
    p.add_argument("--query", default=None,
                   help="one of the workload file's named queries (default: its first)")
    p.add_argument("--scale", type=float, default=0.02,
                   help="workload scale (default: 0.02; the seed is 1.0)")
    p.add_argument("--reps", type=int, default=1, help="repetitions (perf, none)")
    p.add_argument("--top", type=int, default=15, help="rows shown for function tables")
    p.add_argument("--freq", type=int, default=999, help="perf sampling frequency (Hz)")
    return p


USAGE = make_parser().format_help()


# ---------------------------------------------------------------------------
# Clusters kept for the kernel session


@dataclass
class ClusterSession:
    build: Any                      # profkit.pg.build.Build
    cluster: Any                    # profkit.pg.cluster.Cluster
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

    def get(self, build_name: str, progress: Callable[[str], None] | None = None
            ) -> ClusterSession:
        from profkit.pg.build import get_build
        from profkit.pg.cluster import Cluster

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
        from profkit.pg.workloads import check_scale, get_workload

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


REGISTRY = ClusterRegistry()
atexit.register(lambda: REGISTRY.stop())


# ---------------------------------------------------------------------------
# Running a cell


@dataclass
class CellOptions:
    build: str = "vanilla"
    collector: str = "none"
    mode: str = "plain"
    workload: str | None = None
    scale: float = 0.02
    reps: int = 1
    top: int = 15
    freq: int = 999


def parse_options(line: str) -> CellOptions:
    """``%%profkit`` options → CellOptions; raises MagicUsageError / _HelpShown."""
    try:
        argv = shlex.split(line)
    except ValueError as e:
        raise MagicUsageError(f"cannot split the options ({e}): check the quotes") from None
    ns = make_parser().parse_args(argv)
    if ns.reps < 1:
        raise MagicUsageError("--reps must be >= 1")
    if ns.top < 1:
        raise MagicUsageError("--top must be >= 1")
    if ns.query is not None:
        if ns.workload is None:
            raise MagicUsageError("--query picks a query of --workload FILE.toml: give both")
        ns.workload = f"{ns.workload}#{ns.query}"
    del ns.query
    return CellOptions(**vars(ns))


def statement(cell: str, opts: CellOptions) -> str:
    """The SQL to run: the cell (one statement) or the workload's query, with EXPLAIN."""
    from profkit.pg.workloads import EXPLAIN_PREFIX, get_workload

    sql = cell.strip().rstrip(";").strip()
    # IPython refuses a cell magic with an empty body, so a body of comments only
    # ("-- the workload's query") stands for "run the --workload's query".
    if all(not ln.strip() or ln.strip().startswith("--") for ln in sql.splitlines()):
        if opts.workload is None:
            raise MagicUsageError("the cell has no SQL: write a statement, or give "
                                  "--workload W to run that workload's query")
        sql = get_workload(opts.workload).select_sql
    if opts.mode != "plain":
        if sql.lower().startswith("explain"):
            raise MagicUsageError(f"--mode {opts.mode} adds EXPLAIN itself: write the bare "
                                  "query in the cell, or use --mode plain")
        sql = EXPLAIN_PREFIX[opts.mode] + sql
    return sql


def _rows_frame(cur: Any) -> pd.DataFrame:
    if cur.description is None:
        return pd.DataFrame({"status": [cur.statusmessage]})
    cols = [d.name for d in cur.description]
    return pd.DataFrame(cur.fetchall(), columns=cols)


def _magic_run_dir(opts: CellOptions) -> Path:
    from profkit.lab.notebook import new_run_dir

    return new_run_dir(f"magic-{opts.collector}-{opts.build.replace('+', '_')}")


def run_cell(line: str, cell: str, registry: ClusterRegistry | None = None,
             say: Callable[[str], None] | None = None) -> Any:
    """Parse *line*, run *cell*, return what to display (raises on errors).

    The return value is a DataFrame (query rows, or a table of counts), or a
    :class:`~profkit.render.flamegraph.FlameGraph` for ``--collector perf``.
    """
    from profkit.pg.build import resolve_spec
    from profkit.pg.workloads import check_args

    opts = parse_options(line)
    reg = registry if registry is not None else REGISTRY
    note = say or (lambda m: None)
    # everything that can be checked is checked before a build or a cluster start
    check_args(opts.workload, scale=opts.scale, reps=opts.reps, mode=opts.mode)
    resolve_spec(opts.build)
    if opts.collector == "gprof":
        _require_profiling_build(opts.build)
    sql = statement(cell, opts)
    s = reg.get(opts.build, progress=note)
    if opts.workload is not None and reg.ensure_workload(s, opts.workload, opts.scale):
        note(f"loaded {opts.workload} at scale {opts.scale:g} into {opts.build}")
    return COLLECTOR_FUNCS[opts.collector](s, sql, opts, note)


def _require_profiling_build(name: str) -> None:
    from profkit.pg.build import resolve_spec

    spec = resolve_spec(name)
    if "--enable-profiling" not in spec.configure_opts:
        alt = "gprof" if name == "vanilla" else f"{name}+gprof"
        raise MagicUsageError(f"--collector gprof needs a build configured with "
                              f"--enable-profiling; use --build {alt}")


def _timed_rows(conn: Any, sql: str, reps: int) -> tuple[pd.DataFrame, list[float]]:
    times = []
    df = pd.DataFrame()
    for _ in range(reps):
        t0 = time.perf_counter()
        cur = conn.execute(sql)
        df = _rows_frame(cur)
        times.append((time.perf_counter() - t0) * 1000)
    return df, times


def _collect_none(s: ClusterSession, sql: str, opts: CellOptions,
                  say: Callable[[str], None]) -> pd.DataFrame:
    with s.cluster.connect() as conn:
        df, times = _timed_rows(conn, sql, opts.reps)
    df.attrs.update(build=opts.build, mode=opts.mode, client_ms=times)
    say(f"{opts.build}: {len(df)} row(s) in {min(times):.2f} ms"
        + (f" (min of {opts.reps})" if opts.reps > 1 else ""))
    return df


def _collect_perf(s: ClusterSession, sql: str, opts: CellOptions,
                  say: Callable[[str], None]) -> Any:
    from profkit.collect import perf
    from profkit.render.flamegraph import FlameGraph

    with s.cluster.connect() as conn:
        conn.execute(sql)  # warm-up, not recorded: the profile shows the steady state
        rec, _res = perf.record_query(s.cluster, conn, sql, reps=opts.reps, mode=opts.mode,
                                      workload=opts.workload, scale=opts.scale,
                                      freq=opts.freq)
    prof = perf.fold_run(rec.run_dir, binary=s.build.postgres)
    facts = prof.run.subtitle_facts()
    short = perf.sample_shortfall(prof)
    if short is not None:
        # no share off a handful of samples: say why, and how to get enough
        fix = short.message(freq_flag="--freq", repeat_flag="--reps",
                            max_freq=perf.max_sample_rate())
        say(f"{opts.build}: {fix} Run directory {rec.run_dir}")
        facts["samples"] = f"{prof.folding.samples} (too few: shares need >= {short.minimum})"
    else:
        say(f"{opts.build}: {prof.folding.samples} samples, instrumentation "
            f"{prof.instrumentation_share:.1%} of them; run directory {rec.run_dir}")
    return FlameGraph(prof.counts, title=f"{opts.build}: {opts.mode}", provenance=facts)


def _collect_ltrace(s: ClusterSession, sql: str, opts: CellOptions,
                    say: Callable[[str], None]) -> pd.DataFrame:
    from profkit.collect import ltrace
    from profkit.parse.ltrace import parse_ltrace_summary

    out = _magic_run_dir(opts)
    with s.cluster.connect() as conn:
        conn.execute(sql)  # warm-up: catalog lookups are not part of the count
        r = ltrace.count_calls(conn, sql, functions=("clock_gettime",), out_dir=out)
    df = parse_ltrace_summary(r.summary_text, build=opts.build)
    say(f"{opts.build}: ltrace attached in {r.attach_s:.2f} s; the query took "
        f"{r.query_ms:.0f} ms under ltrace; summary in {out}")
    return df


def _collect_bpf(s: ClusterSession, sql: str, opts: CellOptions,
                 say: Callable[[str], None]) -> pd.DataFrame:
    from profkit.collect import bpf

    out = _magic_run_dir(opts)
    with s.cluster.connect() as conn:
        conn.execute(sql)
        res = bpf.probe_query(conn, sql, out_dir=out)
    say(f"{opts.build}: {res.tool} probes on {', '.join(res.attached)}"
        + (f" ({res.fallback_reason})" if res.fallback_reason else "")
        + f"; clock reads outside plan nodes: {res.outside_clock_reads}")
    funcs = res.functions.copy()
    if not res.nodes.empty:
        _display(funcs)
        return res.nodes
    return funcs


def _collect_callgrind(s: ClusterSession, sql: str, opts: CellOptions,
                       say: Callable[[str], None]) -> pd.DataFrame:
    from profkit.collect.callgrind import collect_callgrind_cluster
    from profkit.parse.callgrind import instr_counts_from_session, parse_callgrind_file

    out = _magic_run_dir(opts)
    say(f"{opts.build}: running the statement under callgrind (single-user mode; the "
        "cluster restarts afterwards)")
    session = collect_callgrind_cluster(s.cluster, {opts.mode: sql}, out)
    counts = instr_counts_from_session(session, build=opts.build, workload=opts.workload or "")
    prof = parse_callgrind_file(session.queries[0].out_file, build=opts.build)
    say(f"{opts.build}: {int(counts['instructions'].iloc[0]):,} instructions in "
        f"{counts['scope'].iloc[0]}; profiles in {out}")
    fn = prof.functions.sort_values("self", ascending=False).head(opts.top)
    _display(counts[["build", "mode", "instructions", "scope", "executor_instructions"]])
    return fn.reset_index(drop=True)


def _collect_gprof(s: ClusterSession, sql: str, opts: CellOptions,
                   say: Callable[[str], None]) -> pd.DataFrame:
    from profkit.collect import gprof

    # a fresh backend runs the statement and exits: gmon.out is written at exit
    grun, _res = gprof.collect_gprof(s.cluster, sql, reps=opts.reps, workload=opts.workload,
                                     mode=opts.mode, scale=opts.scale)
    res = gprof.parse_run(grun.run_dir)
    fn = res.functions.sort_values("calls", ascending=False, na_position="last")
    say(f"{opts.build}: gprof call counts of backend {grun.pid}; run directory {grun.run_dir}")
    cols = [c for c in ("function", "calls", "self", "total", "self_share") if c in fn.columns]
    return fn[cols].head(opts.top).reset_index(drop=True)


COLLECTOR_FUNCS: dict[str, Callable[..., Any]] = {
    "none": _collect_none, "perf": _collect_perf, "ltrace": _collect_ltrace,
    "bpf": _collect_bpf, "callgrind": _collect_callgrind, "gprof": _collect_gprof,
}


def _display(obj: Any) -> None:
    try:
        from IPython.display import display
    except ImportError:  # pragma: no cover
        return
    display(obj)


def _say(msg: str) -> None:
    # the cell's own output (stdout), not a progress line: it stays with the cell
    print(f"profkit: {msg}", flush=True)


def _error(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# The magics


def profkit_cell(line: str, cell: str) -> Any:
    try:
        return run_cell(line, cell, say=_say)
    except _HelpShown:
        return None
    except MagicUsageError as e:
        _error(str(e))
    except ProfkitError as e:
        _error(f"profkit: {type(e).__name__}: {e}")
    except Exception as e:
        import psycopg

        if not isinstance(e, psycopg.Error):
            raise  # a bug in profkit: let IPython show the traceback
        # the server's own message (relation does not exist, syntax error...)
        _error(f"profkit: PostgreSQL error: {str(e).strip()}")
    except KeyboardInterrupt:
        _error("profkit: interrupted; tracers were stopped, the clusters keep running "
               "(%profkit_stop stops them)")
    return None


profkit_cell.__doc__ = ("Run the SQL in the cell on a build's cluster under a collector.\n\n"
                        + USAGE)


def profkit_stop(line: str) -> None:
    """Stop the clusters %%profkit started: ``%profkit_stop`` (all) or ``%profkit_stop BUILD``."""
    try:
        stopped = REGISTRY.stop(shlex.split(line) or None)
    except (ProfkitError, ValueError) as e:
        _error(f"profkit: {e}")
        return
    _say(f"stopped {', '.join(stopped) or 'nothing (no clusters were running)'}")


def profkit_clusters(line: str) -> ClusterRegistry:
    """Show the clusters %%profkit keeps running."""
    return REGISTRY


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magic_function(profkit_cell, magic_kind="cell", magic_name="profkit")
    ipython.register_magic_function(profkit_stop, magic_kind="line", magic_name="profkit_stop")
    ipython.register_magic_function(profkit_clusters, magic_kind="line",
                                    magic_name="profkit_clusters")


def unload_ipython_extension(ipython: Any) -> None:
    REGISTRY.stop()
