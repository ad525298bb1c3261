"""Run the observer-effect measurements and the correction check on a real cluster.

Two experiments of issue 6, each writing ``profiles/<run_id>/``:

:func:`measure_observers`
    One workload at one scale; for each mode (EXPLAIN ANALYZE TIMING TRUE and
    the plain query by default) the query's wall time unobserved and observed by
    ltrace (``-c -e clock_gettime``), bcc uprobes (clock_gettime count only;
    the full per-node probe set), bpftrace (clock_gettime count), ``perf record
    -g`` at 99 / 999 / 4999 Hz, and callgrind (one execution in a single-user
    backend).  Every observed execution is preceded by an unobserved one of the
    same query on the same backend, and the methods run in a shuffled order in
    each repetition, so drift of a loaded machine lands on both sides.  Cheap
    methods run ``reps`` times, expensive ones (the cost guard's estimate above
    ``expensive_ms``) ``expensive_reps`` times, callgrind once (it stops the
    postmaster, so it runs last).  The existing collectors attach and detach
    (stop) every tracer; this module only times around them.
:func:`measure_correction`
    For each seed workload, plain / TIMING OFF / TIMING ON interleaved (shuffled
    per repetition), the clock's cost per read from the micro-benchmark (before
    and after the timings, same run) and the predicted reads and Instr* calls
    per execution; then :func:`profkit.analyze.observers.correction_summary`.

Times: ``client_ms`` is the client's wall time of the statement (send to last
row); ``server_ms`` is EXPLAIN's "Execution Time" for EXPLAIN ANALYZE and
pg_stat_statements' ``total_exec_time`` delta for the plain query (ExecutorRun
+ ExecutorFinish; EXPLAIN also counts ExecutorStart/End, well under a ms here).
Under callgrind only the wall time of the statement is known.
"""
from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from profkit.procfs import schedstat
from profkit import tables
from profkit.analyze import observers as A
from profkit.analyze import predict as P
from profkit.collect.artifacts import server_settings
from profkit.rundir import RunDir, new_run
from profkit.errors import ProbeError, ProfkitError
from profkit.pg.workloads import SEED_QUERY_NAMES, Workload, get_workload

if TYPE_CHECKING:
    import psycopg

    from profkit.pg.cluster import Cluster

Progress = Callable[[str], None]

# CLI name -> (method, variant)
METHODS: dict[str, tuple[str, str]] = {
    "ltrace": ("ltrace", "clock_gettime"),
    "bcc-clock": ("bcc", "clock_gettime"),
    "bcc-nodes": ("bcc", "per_node"),
    "bpftrace-clock": ("bpftrace", "clock_gettime"),
    "bpftrace-nodes": ("bpftrace", "per_node"),
    "perf-99": ("perf", "99Hz"),
    "perf-999": ("perf", "999Hz"),
    "perf-4999": ("perf", "4999Hz"),
    "callgrind": ("callgrind", "single execution"),
}
DEFAULT_METHODS: tuple[str, ...] = ("perf-99", "perf-999", "perf-4999", "bcc-clock",
                                    "bcc-nodes", "bpftrace-clock", "ltrace", "callgrind")
DEFAULT_MODES: tuple[str, ...] = ("analyze_timing", "plain")
DEFAULT_CORRECTION_WORKLOADS: dict[str, float] = {"nested_loop": 0.05, "join_sum": 0.5,
                                                  "count_star": 0.1}
_PERF_RE = re.compile(r"^perf-(\d+)$")
_EXEC_TIME = re.compile(r"Execution Time: ([0-9.]+) ms")


def parse_method(name: str) -> tuple[str, str]:
    """CLI method name -> (method, variant); ``perf-N`` takes any frequency."""
    if name in METHODS:
        return METHODS[name]
    m = _PERF_RE.match(name)
    if m and int(m.group(1)) > 0:
        return "perf", f"{int(m.group(1))}Hz"
    raise ProbeError(f"unknown observer {name!r}; known: {', '.join(METHODS)} (or perf-FREQ)")


def loadavg() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:
        return (math.nan, math.nan, math.nan)


def _loadavg_text(la: Sequence[float]) -> str:
    return " ".join(f"{x:.2f}" for x in la)


# ---------------------------------------------------------------------------
# Executing one statement, timed on both sides


class _Pgss:
    """pg_stat_statements' total_exec_time of one statement, as a delta per execution."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.qids: dict[str, int] = {}

    def _snapshot(self) -> dict[int, int]:
        rows = self.conn.execute("SELECT queryid, calls, query FROM pg_stat_statements(true)",
                                 prepare=False).fetchall()
        out: dict[int, int] = {}
        for qid, calls, text in rows:
            if qid is not None and not (text and "pg_stat_statements" in text):
                out[int(qid)] = out.get(int(qid), 0) + int(calls)
        return out

    def identify(self, key: str, execute: Callable[[], Any]) -> None:
        """Run *execute* once and find the statement it added (must be unique)."""
        before = self._snapshot()
        execute()
        grown = [q for q, c in self._snapshot().items() if c - before.get(q, 0) == 1]
        if len(grown) != 1:
            raise ProbeError(f"could not find the {key} statement in pg_stat_statements "
                             f"({len(grown)} statements ran once): is the extension loaded "
                             "(shared_preload_libraries) and the cluster private?")
        self.qids[key] = grown[0]

    def read(self, key: str) -> tuple[int, float]:
        row = self.conn.execute(
            "SELECT coalesce(sum(calls), 0)::int8, coalesce(sum(total_exec_time), 0)::float8 "
            f"FROM pg_stat_statements(false) WHERE queryid = {int(self.qids[key])}",
            prepare=False).fetchone()
        assert row is not None
        return int(row[0]), float(row[1])




@dataclass
class _Box:
    """What a runner saw: its own wall time, the backend's CPU and run-queue time, the rows."""

    ms: float = math.nan
    cpu_ms: float = math.nan
    runq_ms: float = math.nan
    rows: list[tuple[Any, ...]] = field(default_factory=list)


def _runner(conn: psycopg.Connection, sql: str) -> tuple[Callable[[], Any], _Box]:
    """A callable running *sql* once, timing it from the client and in the backend.

    The backend's CPU time (schedstat) counts what an in-process observer costs
    (uprobe handlers, perf's sampling interrupts run in the backend's context)
    without the time the backend waits for a CPU on a loaded machine; ltrace's
    own work happens in the ltrace process and shows only in the wall time.
    """
    box = _Box()
    pid = int(conn.info.backend_pid)

    def go() -> list[tuple[Any, ...]]:
        s0 = schedstat(pid)
        t0 = time.perf_counter_ns()
        cur = conn.execute(sql, prepare=False)
        rows = cur.fetchall() if cur.description is not None else []
        box.ms = (time.perf_counter_ns() - t0) / 1e6
        s1 = schedstat(pid)
        if s0 is not None and s1 is not None:
            box.cpu_ms = (s1[0] - s0[0]) / 1e6
            box.runq_ms = (s1[1] - s0[1]) / 1e6
        box.rows = rows
        return rows

    return go, box


def explain_execution_ms(rows: Sequence[tuple[Any, ...]]) -> float:
    """EXPLAIN's Execution Time (ms) from its text or JSON output; NaN if absent.

    Input:  ``[("Aggregate  (cost=...) (actual time=...)",), ..., ("Execution Time: 12.3 ms",)]``
    Output: ``12.3``
    """
    for r in rows:
        v = r[0] if r else None
        if isinstance(v, list) and v and isinstance(v[0], dict):
            t = v[0].get("Execution Time")
            if t is not None:
                return float(t)
        m = _EXEC_TIME.search(str(v))
        if m:
            return float(m.group(1))
    return math.nan


# ---------------------------------------------------------------------------
# Observer effect of the observers


@dataclass(frozen=True)
class ObserverResult:
    run_id: str
    run_dir: Path
    timings: pd.DataFrame          # observer_timings
    slowdown: pd.DataFrame         # analyze.observers.slowdown_table
    guard: pd.DataFrame            # analyze.observers.guard_verdict
    hit_costs: pd.DataFrame        # analyze.observers.hit_costs (guard's terms)
    predicted: dict[str, dict[str, int]]
    loadavg_before: tuple[float, float, float]
    loadavg_after: tuple[float, float, float]
    notes: tuple[str, ...] = ()


class _ObserverRun:
    def __init__(self, cluster: Cluster, wl: Workload, scale: float, modes: Sequence[str],
                 specs: Sequence[tuple[str, str]], rd: RunDir, progress: Progress | None,
                 dbname: str = "postgres") -> None:
        self.cluster = cluster
        self.dbname = dbname
        self.wl = wl
        self.scale = scale
        self.modes = list(modes)
        self.specs = list(specs)
        self.rd = rd
        self.say = progress or (lambda _m: None)
        self.rows: list[dict[str, Any]] = []
        self.order = 0
        self.conn: psycopg.Connection | None = None
        self.pgss: _Pgss | None = None
        self.expected = wl.expected_rows(scale)
        self.guard: dict[tuple[str, str, str], tuple[int | None, float]] = {}
        self.notes: list[str] = []

    # -- connection ------------------------------------------------------------
    def connect(self) -> psycopg.Connection:
        self.conn = self.cluster.connect(prepare_threshold=None, dbname=self.dbname)
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.pgss = _Pgss(self.conn)
        return self.conn

    def sql(self, mode: str) -> str:
        return self.wl.query(mode)

    # -- one execution ---------------------------------------------------------
    def execute(self, mode: str, rep: int, method: str, variant: str,
                observe: Callable[[Callable[[], Any]], tuple[int | None, str]] | None,
                baseline_order: int | None) -> dict[str, Any]:
        assert self.conn is not None and self.pgss is not None
        go, box = _runner(self.conn, self.sql(mode))
        before = self.pgss.read(mode) if mode == "plain" else None
        hits: int | None = None
        kind = ""
        if observe is None:
            go()
        else:
            hits, kind = observe(go)
        server = math.nan
        if before is not None:
            after = self.pgss.read(mode)
            if after[0] - before[0] == 1:
                server = after[1] - before[1]
        else:
            server = explain_execution_ms(box.rows)
        if mode == "plain" and self.expected is not None:
            got = box.rows[0][0] if box.rows and box.rows[0] else None
            if got != self.expected:
                raise ProbeError(f"the plain {self.wl.name} query returned {got!r} under "
                                 f"{method} {variant}, expected {self.expected}")
        est_hits, est_ms = self.guard.get((method, variant, mode), (None, math.nan))
        row = {"run_id": self.rd.run_id, "workload": self.wl.name, "scale": self.scale,
               "mode": mode, "method": method, "variant": variant, "rep": rep,
               "order": self.order, "baseline_order": baseline_order,
               "client_ms": box.ms, "server_ms": server, "hits": hits,
               "hits_kind": kind or None, "guard_hits": est_hits, "guard_estimate_ms": est_ms,
               "cpu_ms": box.cpu_ms, "runq_ms": box.runq_ms}
        self.order += 1
        self.rows.append(row)
        return row

    # -- observers -------------------------------------------------------------
    def observer(self, method: str, variant: str, mode: str, rep: int
                 ) -> Callable[[Callable[[], Any]], tuple[int | None, str]]:
        d = self.rd.path / f"{method}-{variant}".replace(" ", "_") / f"{mode}-r{rep}"
        assert self.conn is not None
        conn = self.conn
        if method == "ltrace":
            def obs(go: Callable[[], Any]) -> tuple[int | None, str]:
                from profkit.collect import ltrace as lt
                from profkit.parse.ltrace import parse_ltrace_summary

                run = lt.count_calls(conn, runner=go, functions=("clock_gettime",), out_dir=d)
                df = parse_ltrace_summary(run.summary_text)
                calls = df.set_index("function")["calls"].get("clock_gettime", 0)
                return int(calls if not pd.isna(calls) else 0), "clock_gettime calls"
            return obs
        if method in ("bcc", "bpftrace"):
            per_node = variant == "per_node"

            def obs(go: Callable[[], Any]) -> tuple[int | None, str]:
                from profkit.collect import bpf

                fns = ((*bpf.BINARY_FUNCTIONS, *bpf.LIBC_FUNCTIONS) if per_node
                       else ("clock_gettime",))
                res = bpf.probe_query(conn, runner=go, functions=fns, per_node=per_node,
                                      tool=method, out_dir=d)
                if res.tool != method:
                    raise ProbeError(f"asked for {method}, {res.tool} ran: {res.fallback_reason}")
                if not per_node:
                    return res.calls("clock_gettime") or 0, "clock_gettime calls"
                return _uprobe_hits(res), "uprobe hits"
            return obs
        if method == "perf":
            freq = int(variant[:-2])

            def obs(go: Callable[[], Any]) -> tuple[int | None, str]:
                from profkit.collect import perf

                d.parent.mkdir(parents=True, exist_ok=True)
                run = new_run("perf", base=d.parent, run_id=d.name, workload=self.wl.name,
                              mode=mode, scale=self.scale)
                rec, _ = perf.record_pid(self.cluster.backend_pid(conn), go, run=run,
                                         freq=freq, call_graph="fp", stat=False,
                                         binary=self.cluster.build.postgres)
                run.finish(status="ok")
                samples = rec.samples
                if samples is None:
                    # perf prints "(N samples)" only when N > 0 (and not always): count
                    samples = _count_perf_samples(Path(rec.perf_data))
                return samples, "samples"
            return obs
        raise ProbeError(f"no observer {method}")

    # -- guard -----------------------------------------------------------------
    def estimate(self, force: bool, max_ms: float) -> dict[str, dict[str, int]]:
        """Predicted hits and the guard's cost per (method, variant, mode), before attaching."""
        from profkit.collect import bpf

        assert self.conn is not None
        plan = self.conn.execute(self.wl.query("analyze_notiming", fmt="json"),
                                 prepare=False).fetchone()[0]
        (self.rd.path / "plan_notiming.json").write_text(json.dumps(plan, indent=1))
        predicted: dict[str, dict[str, int]] = {}
        refused = []
        for mode in self.modes:
            pr = P.predict(plan, P.context_from_conn(self.conn, mode))
            const = pr.totals["clock_reads"] - pr.totals["clock_reads_nodes"]
            predicted[mode] = {k: int(v) for k, v in pr.totals.items() if not isinstance(v, bool)}
            for method, variant in self.specs:
                if method == "ltrace":
                    hits: int | None = pr.totals["clock_reads_ltrace"]
                    est = bpf.probe_cost_ms(int(hits), "ltrace")
                elif method in ("bcc", "bpftrace"):
                    per_node = variant == "per_node"
                    fns = ((*bpf.BINARY_FUNCTIONS, *bpf.LIBC_FUNCTIONS) if per_node
                           else ("clock_gettime",))
                    est_map = bpf.estimate_probe_hits(pr.nodes, fns, per_node=per_node,
                                                      constants=const)
                    if mode == "plain":
                        # not instrumented: no Instr*/ExecProcNodeInstr calls, the clock
                        # only through pg_stat_statements (const)
                        est_map = {f: (const if f == "clock_gettime" else
                                       v if f in ("ExecProcNodeFirst", "MultiExecProcNode",
                                                  "ExecShutdownNode_walker") else 0)
                                   for f, v in est_map.items()}
                    hits = sum(est_map.values())
                    est = bpf.probe_cost_ms(est_map, "uprobe")
                else:
                    continue
                self.guard[(method, variant, mode)] = (hits, est)
                if est > max_ms and not force:
                    refused.append(f"{method} {variant} on {mode}: ~{est / 1000:.0f} s "
                                   f"({hits:,} hits)")
        if refused:
            raise ProbeError("the cost guard estimates these observers would take longer than "
                             f"{max_ms / 1000:.0f} s per execution: {'; '.join(refused)}. Use a "
                             "smaller scale, drop those methods, or pass --force.")
        return predicted


def _uprobe_hits(res: Any) -> int:
    """All probe hits of a per-node bcc/bpftrace run: entries, plus returns where popped."""
    from profkit.collect import bpf

    total = 0
    for fn in res.attached:
        n = res.calls(fn) or 0
        total += n
        if bpf.HANDLERS.get(fn, ("", False))[1]:
            total += n  # its uretprobe pops the node stack
    return total


def _count_perf_samples(data: Path) -> int:
    """Samples in a perf.data: one ``perf script -F period`` line each."""
    from profkit.collect import perf
    from profkit.run import run

    cp = run([perf.perf_path(), "--buildid-dir", str(perf.buildid_dir()), "script",
              "-F", "period", "-i", str(data)], timeout=300, check=False, what="perf script")
    if cp.returncode != 0:
        raise ProbeError(f"perf script could not read {data}: {cp.stderr.strip()[-300:]}")
    return sum(1 for line in cp.stdout.splitlines() if line.strip())


def _callgrind(cluster: Cluster, queries: Mapping[str, str], out_dir: Path,
               dbname: str = "postgres") -> Any:
    """One callgrind session (warm-up + one execution per mode).

    The postmaster is paused for it (single-user mode needs the data directory)
    and resumed after; open connections die and must be reopened.
    """
    from profkit.collect import callgrind as cg

    return cg.collect_callgrind_cluster(cluster, queries, out_dir, dbname=dbname)


def measure_observers(cluster: Cluster, *, workload: str = "join_sum", scale: float = 0.02,
                      modes: Sequence[str] = DEFAULT_MODES,
                      methods: Sequence[str] = DEFAULT_METHODS, reps: int = 5,
                      expensive_reps: int = 2, expensive_ms: float = 2000.0,
                      warmup: int = 2, load: bool = True, force: bool = False,
                      max_probe_s: float = 300.0, seed: int = 0, dbname: str = "postgres",
                      base: str | os.PathLike[str] | None = None, run_id: str | None = None,
                      progress: Progress | None = None) -> ObserverResult:
    """Time *workload*'s query unobserved and under each observer; write profiles/<run_id>/.

    The cluster must be running; the workload is loaded unless ``load=False``.
    Returns the per-execution table, the slowdown table and the guard check.
    Callgrind stops and restarts the postmaster (connections are reopened).
    A failure keeps the timings measured so far (``observer_timings.csv``).
    """
    wl = get_workload(workload)
    bad = [m for m in modes if m not in ("plain", "analyze_notiming", "analyze_timing")]
    if bad:
        raise ProbeError(f"unknown modes {bad}; use plain, analyze_notiming, analyze_timing")
    if reps < 1 or expensive_reps < 1:
        raise ProbeError("reps and expensive_reps must be >= 1")
    specs = list(dict.fromkeys(parse_method(m) for m in methods))
    la0 = loadavg()
    rd = new_run("observers", build=cluster.build, workload=workload, base=base,
                 run_id=run_id, tools=("perf", "ltrace", "bpftrace", "valgrind"),
                 scale=scale, modes=list(modes), methods=[f"{m} {v}" for m, v in specs],
                 reps=reps, expensive_reps=expensive_reps, loadavg_before=list(la0))
    r = _ObserverRun(cluster, wl, scale, modes, specs, rd, progress, dbname)
    try:
        conn = r.connect()
        rd.update(backend_pid=cluster.backend_pid(conn), settings=server_settings(conn))
        if load:
            r.say(f"loading {workload} at scale {scale}")
            wl.load(conn, scale)
        for mode in modes:
            go, _ = _runner(conn, r.sql(mode))
            if mode == "plain":
                assert r.pgss is not None
                r.pgss.identify(mode, go)
            for _ in range(max(warmup, 0)):
                go()
        predicted = r.estimate(force, max_probe_s * 1000)
        rd.update(predicted=predicted)
        rng = random.Random(seed)
        live = [s for s in specs if s[0] != "callgrind"]

        def reps_for(method: str, variant: str, mode: str) -> int:
            est = r.guard.get((method, variant, mode), (None, 0.0))[1]
            return expensive_reps if est > expensive_ms else reps

        for rep in range(1, reps + 1):
            for mode in modes:
                todo = [s for s in live if rep <= reps_for(*s, mode)]
                rng.shuffle(todo)
                for method, variant in todo:
                    base_row = r.execute(mode, rep, A.UNOBSERVED, "", None, None)
                    row = r.execute(mode, rep, method, variant,
                                    r.observer(method, variant, mode, rep), base_row["order"])
                    r.say(f"rep {rep} {mode}: unobserved {base_row['client_ms']:.1f} ms, "
                          f"{method} {variant} {row['client_ms']:.1f} ms "
                          f"(hits {row['hits']})")
        if ("callgrind", "single execution") in specs:
            r.say("callgrind (the postmaster is stopped meanwhile)")
            conn.close()
            d = rd.path / "callgrind"
            session = _callgrind(cluster, {m: r.sql(m) for m in modes}, d, dbname)
            r.connect()
            for q in session.queries:
                r.rows.append({"run_id": rd.run_id, "workload": wl.name, "scale": scale,
                               "mode": q.mode, "method": "callgrind",
                               "variant": "single execution", "rep": 1, "order": r.order,
                               "baseline_order": None, "client_ms": q.seconds * 1000,
                               "server_ms": math.nan, "hits": None, "hits_kind": None,
                               "guard_hits": None, "guard_estimate_ms": math.nan,
                               "cpu_ms": math.nan, "runq_ms": math.nan})
                r.order += 1
            r.notes.append("callgrind: wall time of the statement in a single-user backend "
                           "under valgrind (dump times), one execution after a warm-up")
    except BaseException as e:
        rd.finish(status="failed", error=f"{type(e).__name__}: {e}",
                  executions_kept=len(r.rows))
        raise
    finally:
        timings = _timings_frame(r.rows)
        timings.to_csv(rd.file("observer_timings.csv"), index=False)
        rd.add_artifact("observer_timings.csv", "one row per execution (observer_timings)")
        if r.conn is not None and not r.conn.closed:
            r.conn.close()
    timings.to_parquet(rd.file("observer_timings.parquet"), index=False)
    rd.add_artifact("observer_timings.parquet", "observer_timings table")
    rd.finish(status="ok", loadavg_after=list(loadavg()), uptime=_uptime(), notes=r.notes)
    return summarize_observers(rd.path)


def summarize_observers(run_dir: str | os.PathLike[str]) -> ObserverResult:
    """Tables and markdown of an observers run, from its directory alone.

    Reads ``observer_timings.csv`` and ``provenance.json`` (written by
    :func:`measure_observers`), writes slowdown.csv, guard_check.csv,
    hit_costs.csv and slowdown.md, and returns them.  A run can so be
    summarised again later (e.g. after the guard's defaults change).
    """
    from profkit.rundir import load_run
    from profkit.collect.bpf import DEFAULT_COST_NS

    rd = load_run(run_dir)
    try:
        timings = pd.read_csv(rd.file("observer_timings.csv"))
    except FileNotFoundError:
        raise ProbeError(f"{rd.path} has no observer_timings.csv: not an observers run, or it "
                         "failed before the first execution") from None
    timings = _timings_frame(timings.to_dict("records"))
    slow = A.slowdown_table(timings)
    guard = A.guard_verdict(slow)
    costs = A.hit_costs(slow, DEFAULT_COST_NS)
    slow.to_csv(rd.file("slowdown.csv"), index=False)
    guard.to_csv(rd.file("guard_check.csv"), index=False)
    costs.to_csv(rd.file("hit_costs.csv"), index=False)
    p = rd.provenance
    la0 = tuple(p.get("loadavg_before") or (math.nan,) * 3)
    la1 = tuple(p.get("loadavg_after") or (math.nan,) * 3)
    predicted = p.get("predicted") or {}
    md = observers_markdown(slow, guard, costs, workload=str(p.get("workload")),
                            scale=float(p.get("scale") or math.nan), run_id=rd.run_id,
                            la0=la0, la1=la1, uptime=str(p.get("uptime") or ""),
                            predicted=predicted, notes=p.get("notes") or ())
    rd.file("slowdown.md").write_text(md)
    for name, what in (("slowdown.csv", "slowdown per method (analyze.observers)"),
                       ("guard_check.csv", "measured ns/hit vs the cost guard's defaults"),
                       ("hit_costs.csv", "ns per hit by probe kind vs bpf.DEFAULT_COST_NS"),
                       ("slowdown.md", "the tables as markdown, with load average")):
        rd.add_artifact(name, what)
    return ObserverResult(rd.run_id, rd.path, timings, slow, guard, costs, predicted,
                          la0, la1, tuple(p.get("notes") or ()))  # type: ignore[arg-type]


def _timings_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    if not rows:
        return tables.empty("observer_timings")
    return tables.validate(pd.DataFrame(rows), "observer_timings")


def _uptime() -> str:
    exe = shutil.which("uptime")
    if exe is None:
        return "load average: " + _loadavg_text(loadavg())
    from profkit.run import run

    try:
        return run([exe], timeout=10, check=False).stdout.strip()
    except ProfkitError:
        return "load average: " + _loadavg_text(loadavg())


SLOWDOWN_SHOW = ["mode", "method", "variant", "reps", "median_ms", "slowdown_x",
                 "paired_slowdown_x", "server_slowdown_x", "cpu_slowdown_x", "hits",
                 "ns_per_hit", "ns_per_hit_cpu"]


def observers_markdown(slow: pd.DataFrame, guard: pd.DataFrame, costs: pd.DataFrame, *,
                       workload: str, scale: float,
                       run_id: str, la0: Sequence[float], la1: Sequence[float], uptime: str,
                       predicted: Mapping[str, Mapping[str, int]],
                       notes: Sequence[str] = ()) -> str:
    fmt = {"median_ms": "{:.1f}", "slowdown_x": "{:.2f}", "paired_slowdown_x": "{:.2f}",
           "server_slowdown_x": "{:.2f}", "hits": "{:,.0f}", "ns_per_hit": "{:,.0f}",
           "guard_ns_per_hit": "{:,.0f}", "guard_ratio": "{:.2f}", "cpu_slowdown_x": "{:.2f}",
           "ns_per_hit_cpu": "{:,.0f}"}
    lines = [f"# Observer effect of the observers: {workload} at scale {scale}", "",
             f"run `{run_id}`; load average before {_loadavg_text(la0)}, after "
             f"{_loadavg_text(la1)} (`uptime`: {uptime})", "",
             "slowdown_x = median observed / median unobserved client time; paired = median "
             "of per-pair ratios (each observed run follows an unobserved one); ns_per_hit = "
             "(observed − unobserved) / hits (perf: per sample), from the client's wall time; "
             "cpu_* from the backend's CPU time (/proc/PID/schedstat: robust to the load of "
             "other processes, but blind to ltrace's own work); guard_ns_per_hit = what "
             "profkit.collect.bpf's cost guard assumes for that probe mix.", "",
             A.markdown_table(slow[SLOWDOWN_SHOW], fmt), "",
             "## Cost guard check", "", A.markdown_table(guard, fmt), "",
             "Per probe kind (profkit.collect.bpf.DEFAULT_COST_NS keys; uprobe = a function of "
             "the postgres binary, derived from the per-node probe minus its clock hits):", "",
             A.markdown_table(costs, {**fmt, "ns_per_hit_wall": "{:,.0f}",
                                      "default_ns": "{:,.0f}", "ratio": "{:.2f}"}), "",
             "## Predicted clock reads per execution", ""]
    for mode, t in predicted.items():
        lines.append(f"- {mode}: clock_reads {t.get('clock_reads', 0):,} (ltrace-visible "
                     f"{t.get('clock_reads_ltrace', 0):,}), ExecProcNodeInstr "
                     f"{t.get('exec_proc_node_instr', 0):,}")
    lines += ["", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# Correction vs plain


@dataclass(frozen=True)
class CorrectionResult:
    run_id: str
    run_dir: Path
    timings: pd.DataFrame        # timings table (+ explain_ms)
    summary: pd.DataFrame        # analyze.observers.correction_summary
    nodes: pd.DataFrame          # per workload, top nodes corrected
    clock_cost: pd.DataFrame     # clock_cost rows (before, after)
    facts: pd.DataFrame
    loadavg_before: tuple[float, float, float]
    loadavg_after: tuple[float, float, float]
    other_metrics: dict[str, pd.DataFrame] = field(default_factory=dict)


def measure_correction(cluster: Cluster, *,
                       workloads: Mapping[str, float] | None = None, reps: int = 7,
                       warmup: int = 1, metric: str = "cpu_ms", top: int = 4,
                       clock_loops: int = 200_000, clock_repeats: int = 9, seed: int = 0,
                       dbname: str = "postgres",
                       base: str | os.PathLike[str] | None = None, run_id: str | None = None,
                       progress: Progress | None = None) -> CorrectionResult:
    """How close TIMING ON minus the predicted clock reads × cost comes to plain.

    Loads each workload at its scale into *cluster*, runs plain / TIMING OFF /
    TIMING ON interleaved (*reps* repetitions, order shuffled within each),
    measures CLOCK_MONOTONIC's ns per read before and after, and tabulates.
    """
    from profkit.collect import clock

    say = progress or (lambda _m: None)
    wls = dict(workloads or DEFAULT_CORRECTION_WORKLOADS)
    if not wls:
        raise ProbeError("no workloads given")
    for name, sc in wls.items():
        get_workload(name)
        if not (isinstance(sc, (int, float)) and sc > 0):
            raise ProbeError(f"scale of {name} must be > 0, got {sc!r}")
    if reps < 2:
        raise ProbeError("reps must be >= 2 (the in-situ check splits odd and even reps)")
    la0 = loadavg()
    rd = new_run("correction", build=cluster.build, base=base, run_id=run_id,
                 workloads=wls, reps=reps, metric=metric, loadavg_before=list(la0))
    conn = cluster.connect(prepare_threshold=None, dbname=dbname)
    rows: list[dict[str, Any]] = []
    plans_on: dict[str, list[Any]] = {w: [] for w in wls}
    plan_off: dict[str, Any] = {}
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        rd.update(settings=server_settings(conn), backend_pid=cluster.backend_pid(conn))
        pgss = _Pgss(conn)
        for name, sc in wls.items():
            say(f"loading {name} at scale {sc}")
            get_workload(name).load(conn, sc)
        say("clock micro-benchmark (before)")
        cost_before = clock.measure_clocks(["clock_monotonic"], loops=clock_loops,
                                           repeats=clock_repeats, run_id=rd.run_id)

        def execute(name: str, mode: str) -> tuple[_Box, float, Any]:
            wl = get_workload(name)
            sql = wl.query(mode, fmt="json" if mode != "plain" else None)
            go, box = _runner(conn, sql)
            if mode == "plain":
                before = pgss.read(name)
                go()
                after = pgss.read(name)
                server = after[1] - before[1] if after[0] - before[0] == 1 else math.nan
                exp = wl.expected_rows(wls[name])
                got = box.rows[0][0] if box.rows and box.rows[0] else None
                if exp is not None and got != exp:
                    raise ProbeError(f"{name} returned {got!r}, expected {exp}")
                return box, server, None
            go()
            plan = box.rows[0][0]
            return box, explain_execution_ms(box.rows), plan

        for name in wls:
            pgss.identify(name, _runner(conn, get_workload(name).query("plain"))[0])
            for _ in range(max(warmup, 0)):
                for mode in A.CORRECTION_MODES:
                    execute(name, mode)
        rng = random.Random(seed)
        order = 0
        for rep in range(1, reps + 1):
            cells = [(w, m) for w in wls for m in A.CORRECTION_MODES]
            rng.shuffle(cells)
            for name, mode in cells:
                box, s, plan = execute(name, mode)
                if mode == "analyze_timing":
                    plans_on[name].append(plan)
                elif mode == "analyze_notiming":
                    plan_off[name] = plan
                rows.append({"run_id": rd.run_id, "build": cluster.build.name,
                             "workload": name, "query": SEED_QUERY_NAMES[mode], "mode": mode,
                             "rep": rep, "order": order, "client_ms": box.ms, "server_ms": s,
                             "cpu_ms": box.cpu_ms, "runq_ms": box.runq_ms,
                             "scale": wls[name]})
                order += 1
            say(f"rep {rep}/{reps} done")
        say("clock micro-benchmark (after)")
        cost_after = clock.measure_clocks(["clock_monotonic"], loops=clock_loops,
                                          repeats=clock_repeats, run_id=rd.run_id)
        both = pd.concat([cost_before, cost_after])
        # A tight loop preempted by other processes' work only gets slower: on a
        # loaded machine the fastest of many short repeats (200k reads, a few ms,
        # shorter than a time slice) is the clock's cost; the median is kept beside it.
        ns_micro = float(both["ns_per_call_min"].min())
        ns_micro_median = float(both["ns_per_call"].median())
        facts_rows = []
        node_frames = []
        for name in wls:
            ctx = P.context_from_conn(conn, "analyze_timing")
            pr = P.predict(plan_off[name], ctx)
            facts_rows.append({"workload": name, "scale": wls[name],
                               "clock_reads": pr.totals["clock_reads"],
                               "instr_calls": pr.totals["instr_start_node"],
                               "clock_reads_nodes": pr.totals["clock_reads_nodes"],
                               "prediction_exact": pr.totals["exact"],
                               "ns_per_read_micro": ns_micro,
                               "ns_per_read_micro_median": ns_micro_median})
            plans_dir = rd.path / "plans"
            plans_dir.mkdir(exist_ok=True)
            (plans_dir / f"{name}-analyze_notiming.json").write_text(
                json.dumps(plan_off[name], indent=1))
            (plans_dir / f"{name}-analyze_timing.json").write_text(
                json.dumps(plans_on[name], indent=1))
        facts = pd.DataFrame(facts_rows)
    except BaseException as e:
        rd.finish(status="failed", error=f"{type(e).__name__}: {e}", executions_kept=len(rows))
        raise
    finally:
        timings = (tables.validate(pd.DataFrame(rows), "timings") if rows
                   else tables.empty("timings"))
        timings.to_csv(rd.file("timings.csv"), index=False)
        rd.add_artifact("timings.csv", "one row per execution (timings table)")
        conn.close()
    summary = A.correction_summary(timings, facts, metric=metric)
    others = {m: A.correction_summary(timings, facts, metric=m)
              for m in A.CORRECTION_METRICS if m != metric}
    for name in wls:
        s = summary.set_index("workload").loc[name]
        pr_on = P.predict(plans_on[name][0], P.PredictContext(mode="analyze_timing"))
        nodes = A.node_correction(
            A.median_node_times(plans_on[name]), pr_on.nodes,
            costs={"micro": (float(s["ns_per_read_micro"]), float(s["row_cost_ns"])),
                   "in_situ": (float(s["ns_per_read_in_situ"]), float(s["row_cost_ns"]))},
            top=top)
        nodes.insert(0, "workload", name)
        node_frames.append(nodes)
    nodes_all = pd.concat(node_frames, ignore_index=True)
    cost = pd.concat([cost_before.assign(when="before"), cost_after.assign(when="after")],
                     ignore_index=True)
    la1 = loadavg()
    uptime = _uptime()
    timings.to_parquet(rd.file("timings.parquet"), index=False)
    summary.to_csv(rd.file("correction.csv"), index=False)
    pd.concat([summary, *others.values()], ignore_index=True).to_csv(
        rd.file("correction_all_metrics.csv"), index=False)
    nodes_all.to_csv(rd.file("correction_nodes.csv"), index=False)
    facts.to_csv(rd.file("facts.csv"), index=False)
    cost.drop(columns=["histogram"]).to_csv(rd.file("clock_cost.csv"), index=False)
    rd.file("correction.md").write_text(correction_markdown(
        summary, nodes_all, run_id=rd.run_id, metric=metric, la0=la0, la1=la1, uptime=uptime,
        others=others))
    for name, what in (("timings.parquet", "timings table"),
                       ("correction.csv", f"corrected vs plain per workload ({metric})"),
                       ("correction_all_metrics.csv", "the same for cpu_ms, server_ms, client_ms"),
                       ("correction_nodes.csv", "top nodes, corrected"),
                       ("facts.csv", "predicted reads and Instr calls, micro-benchmark cost"),
                       ("clock_cost.csv", "CLOCK_MONOTONIC ns/read before and after"),
                       ("correction.md", "the tables as markdown, with load average")):
        rd.add_artifact(name, what)
    rd.finish(status="ok", loadavg_after=list(la1), uptime=uptime,
              ns_per_read_micro=float(facts["ns_per_read_micro"].iloc[0]))
    return CorrectionResult(rd.run_id, rd.path, timings, summary, nodes_all, cost, facts,
                            la0, la1, others)


CORRECTION_SHOW = ["workload", "scale", "plain_ms", "timing_on_ms", "corrected_micro_ms",
                   "corrected_micro_ratio", "corrected_in_situ_split_ms", "plain_split_ms",
                   "corrected_in_situ_split_ratio", "corrected_in_situ_xval_ms",
                   "corrected_in_situ_xval_ratio"]
COSTS_SHOW = ["workload", "notiming_ms", "clock_reads", "instr_calls", "ns_per_read_micro",
              "ns_per_read_in_situ", "ns_per_read_in_situ_xval", "row_cost_ns",
              "corrected_clock_only_micro_ms"]
NODES_SHOW = ["workload", "node_id", "node_type", "rows", "loops", "clock_reads", "total_ms",
              "self_ms", "corrected_self_micro_ms", "corrected_self_in_situ_ms",
              "corrected_total_micro_ms", "corrected_total_in_situ_ms"]


def correction_markdown(summary: pd.DataFrame, nodes: pd.DataFrame, *, run_id: str,
                        metric: str, la0: Sequence[float], la1: Sequence[float],
                        uptime: str, others: Mapping[str, pd.DataFrame] | None = None) -> str:
    fmt = {"scale": "{:g}", "clock_reads": "{:,.0f}", "instr_calls": "{:,.0f}",
           "ns_per_read_micro": "{:.1f}", "ns_per_read_in_situ": "{:.1f}",
           "ns_per_read_in_situ_xval": "{:.1f}", "row_cost_ns": "{:.1f}",
           "rows": "{:,.0f}", "loops": "{:,.0f}"}
    return "\n".join([
        "# EXPLAIN ANALYZE corrected for the clock vs the plain query", "",
        f"run `{run_id}`; metric {metric} (cpu_ms: the backend's CPU time from "
        "/proc/PID/schedstat; server_ms: EXPLAIN's Execution Time / pg_stat_statements; "
        f"client_ms: wall time at the client); load average before {_loadavg_text(la0)}, after "
        f"{_loadavg_text(la1)} (`uptime`: {uptime})", "",
        "corrected = TIMING ON − clock reads × ns/read − Instr calls × row cost; ratios are "
        "corrected / plain. micro: ns/read from the CLOCK_MONOTONIC micro-benchmark, row cost "
        "from (TIMING OFF − plain) of the same workload. in_situ_split: in-situ costs from "
        "the odd repetitions applied to the even ones (compare with plain_split_ms). "
        "in_situ_xval: the other workloads' median in-situ costs.", "",
        A.markdown_table(summary[CORRECTION_SHOW], fmt), "", "## Costs", "",
        A.markdown_table(summary[COSTS_SHOW], fmt), "",
        *[part for m, df in (others or {}).items()
          for part in (f"## The same with {m}", "", A.markdown_table(df[CORRECTION_SHOW], fmt),
                       "")],
        "## Top nodes (by measured self time; EXPLAIN's own node times)", "",
        A.markdown_table(nodes[NODES_SHOW], fmt), ""])
