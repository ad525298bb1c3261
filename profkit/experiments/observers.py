"""The observer-effect experiment: the query unobserved and under each profiler, timed alike.

Two experiments on what observing a query costs (the second is
:mod:`profkit.experiments.correction`), each
writing ``profiles/<run_id>/`` through :mod:`profkit.rundir` and timing every execution
with :func:`profkit.experiments.harness.timed_execute`:

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
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from profkit import tables
from profkit.analyze import observers as A
from profkit.analyze import predict as P
from profkit.collect.artifacts import server_settings
from profkit.rundir import RowWriter, RunDir, open_run
from profkit.errors import ProbeError, ProfkitError
from profkit.experiments import harness
from profkit.parse.explain import execution_ms
from profkit.progress import ProgressFn
from profkit.render import markdown as render_md
from profkit.pg.workloads import Workload, get_workload
from profkit.collect import bpf, callgrind as cg, ltrace as lt, perf
from profkit.collect.bpf import DEFAULT_COST_NS
from profkit.parse.ltrace import parse_ltrace_summary
from profkit.pg.cluster import Cluster
from profkit.machine import loadavg, uptime
from profkit.processes import run
from profkit.rundir import load_run

if TYPE_CHECKING:
    import psycopg

    from profkit.pg.build import Build


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
_PERF_RE = re.compile(r"^perf-(\d+)$")
TIMINGS_CSV = "observer_timings.csv"
TIMINGS_COLUMNS: tuple[str, ...] = tuple(tables.SCHEMAS["observer_timings"])


def parse_method(name: str) -> tuple[str, str]:
    """CLI method name -> (method, variant); ``perf-N`` takes any frequency."""
    if name in METHODS:
        return METHODS[name]
    m = _PERF_RE.match(name)
    if m and int(m.group(1)) > 0:
        return "perf", f"{int(m.group(1))}Hz"
    raise ProbeError(f"unknown observer {name!r}; known: {', '.join(METHODS)} (or perf-FREQ)")


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
    """What one observers run does per cell (the session does the rest): the unobserved
    and the observed execution of a query, each a row of ``observer_timings.csv``."""

    def __init__(self, wl: Workload, scale: float, modes: Sequence[str],
                 specs: Sequence[tuple[str, str]], rd: RunDir, session: harness.Session,
                 progress: ProgressFn | None) -> None:
        self.wl = wl
        self.scale = scale
        self.modes = list(modes)
        self.specs = list(specs)
        self.rd = rd
        self.session = session
        self.say = progress or (lambda _m: None)
        self.rows: list[dict[str, Any]] = []
        self.writer: RowWriter | None = None
        self.order = 0
        self.target: harness.Target | None = None
        self.expected = wl.expected_rows(scale)
        self.guard: dict[tuple[str, str, str], tuple[int | None, float]] = {}
        self.notes: list[str] = []

    @property
    def conn(self) -> psycopg.Connection:
        assert self.target is not None and self.target.conn is not None
        return self.target.conn

    def sql(self, mode: str) -> str:
        return self.wl.query(mode)

    def keep(self, row: dict[str, Any]) -> None:
        """A row of observer_timings: in memory and on disk (fsync'd) at once."""
        self.order += 1
        self.rows.append(row)
        if self.writer is not None:
            self.writer.write(row)

    def failed(self, e: harness.ExecFailed, when: str) -> ProfkitError:
        """An execution's failure as one error: an observer's own as it is, else the
        session's report (a crash, with its server log) and what was kept."""
        if isinstance(e.err, ProfkitError):
            return e.err
        _crashed, what = self.session.failure(e, when)
        return ProbeError(f"{what}. The {len(self.rows)} executions measured before are "
                          f"kept in {self.rd.file(TIMINGS_CSV)}")

    # -- one execution ---------------------------------------------------------
    def execute(self, mode: str, rep: int, method: str, variant: str,
                observe: Callable[[Callable[[], Any]], tuple[int | None, str]] | None,
                baseline_order: int | None) -> dict[str, Any]:
        t = self.target
        assert t is not None
        # the plain query's server time is its pg_stat_statements delta; EXPLAIN's is its
        # own Execution Time (the utility statement's pgss time includes planning)
        plain = mode == "plain"
        what = f"{mode} under {method} {variant}".rstrip()
        try:
            m = self.session.execute(t, self.sql(mode), what=what,
                                     key=mode if plain else None, observe=observe)
        except harness.ExecFailed as e:
            raise self.failed(e, f"repetition {rep}") from e.err
        hits: int | None = None
        kind = ""
        if observe is not None:
            hits, kind = m.observed
        server = (m.server_ms if m.pgss_calls == 1 else math.nan) if plain \
            else execution_ms(m.rows)
        if mode == "plain" and self.expected is not None:
            got = harness.first_value(m.rows)
            if got != self.expected:
                raise ProbeError(f"the plain {self.wl.name} query returned {got!r} under "
                                 f"{method} {variant}, expected {self.expected}")
        est_hits, est_ms = self.guard.get((method, variant, mode), (None, math.nan))
        row = {"run_id": self.rd.run_id, "workload": self.wl.name, "scale": self.scale,
               "mode": mode, "method": method, "variant": variant, "rep": rep,
               "order": self.order, "baseline_order": baseline_order,
               "client_ms": m.client_ms, "server_ms": server, "hits": hits,
               "hits_kind": kind or None, "guard_hits": est_hits, "guard_estimate_ms": est_ms,
               "cpu_ms": m.cpu_ms, "runq_ms": m.runq_ms}
        self.keep(row)
        return row

    # -- observers -------------------------------------------------------------
    def observer(self, method: str, variant: str, mode: str, rep: int
                 ) -> Callable[[Callable[[], Any]], tuple[int | None, str]]:
        d = self.rd.path / f"{method}-{variant}".replace(" ", "_") / f"{mode}-r{rep}"
        conn = self.conn
        t = self.target
        assert t is not None
        if method == "ltrace":
            def obs(go: Callable[[], Any]) -> tuple[int | None, str]:

                run = lt.count_calls(conn, runner=go, functions=("clock_gettime",), out_dir=d)
                df = parse_ltrace_summary(run.summary_text)
                calls = df.set_index("function")["calls"].get("clock_gettime", 0)
                return int(calls if not pd.isna(calls) else 0), "clock_gettime calls"
            return obs
        if method in ("bcc", "bpftrace"):
            per_node = variant == "per_node"

            def obs(go: Callable[[], Any]) -> tuple[int | None, str]:

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

                d.parent.mkdir(parents=True, exist_ok=True)
                with open_run("perf", base=d.parent, run_id=d.name, workload=self.wl.name,
                              mode=mode, scale=self.scale) as run:
                    rec, _ = perf.record_pid(t.backend_pid, go, run=run,
                                             freq=freq, call_graph="fp", stat=False,
                                             binary=t.build.postgres)
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

    total = 0
    for fn in res.attached:
        n = res.calls(fn) or 0
        total += n
        if bpf.HANDLERS.get(fn, ("", False))[1]:
            total += n  # its uretprobe pops the node stack
    return total


def _count_perf_samples(data: Path) -> int:
    """Samples in a perf.data: one ``perf script -F period`` line each."""

    cp = run([perf.perf_path(), "--buildid-dir", str(perf.buildid_dir()), "script",
              "-F", "period", "-i", str(data)], timeout=300, check=False, what="perf script")
    if cp.returncode != 0:
        raise ProbeError(f"perf script could not read {data}: {cp.stderr.strip()[-300:]}")
    return sum(1 for line in cp.stdout.splitlines() if line.strip())


def measure_observers(target: Cluster | Build | str = "vanilla", *,
                      workload: str = "join_sum", scale: float = 0.02,
                      modes: Sequence[str] = DEFAULT_MODES,
                      methods: Sequence[str] = DEFAULT_METHODS, reps: int = 5,
                      expensive_reps: int = 2, expensive_ms: float = 2000.0,
                      warmup: int = 2, load: bool = True, force: bool = False,
                      max_probe_s: float = 300.0, seed: int = 0, dbname: str = "postgres",
                      base: str | os.PathLike[str] | None = None, run_id: str | None = None,
                      progress: ProgressFn | None = None) -> ObserverResult:
    """Time *workload*'s query unobserved and under each observer; write profiles/<run_id>/.

    *target*: a build (a preset name or a Build: the session starts its cluster, loads
    the workload and stops it), or a running cluster of the caller's (a notebook's; the
    workload is loaded unless ``load=False``). The session of
    :mod:`profkit.experiments.harness` runs the cells; each one is an unobserved and an
    observed execution. Returns the per-execution table, the slowdown table and the
    guard check. Callgrind stops and restarts the postmaster (connections are reopened).
    A failure keeps the timings measured so far (``observer_timings.csv``, a row written
    as each execution ends).
    """
    wl = get_workload(workload)
    bad = [m for m in modes if m not in ("plain", "analyze_notiming", "analyze_timing")]
    if bad:
        raise ProbeError(f"unknown modes {bad}; use plain, analyze_notiming, analyze_timing")
    if reps < 1 or expensive_reps < 1:
        raise ProbeError("reps and expensive_reps must be >= 1")
    specs = list(dict.fromkeys(parse_method(m) for m in methods))
    build = harness.target_build(target, progress)
    la0 = tuple(loadavg())
    with open_run("observers", build=build, workload=workload, base=base,
                  run_id=run_id, tools=("perf", "ltrace", "bpftrace", "valgrind"),
                  scale=scale, modes=list(modes), methods=[f"{m} {v}" for m, v in specs],
                  reps=reps, expensive_reps=expensive_reps, loadavg_before=list(la0)) as rd:
        notes = _observe(rd, target if isinstance(target, Cluster) else build, wl, scale,
                         modes, specs, load=load, warmup=warmup, force=force,
                         max_probe_s=max_probe_s, reps=reps, expensive_reps=expensive_reps,
                         expensive_ms=expensive_ms, seed=seed, dbname=dbname,
                         progress=progress)
        rd.update(loadavg_after=list(loadavg()), uptime=uptime(), notes=notes)
    return summarize_observers(rd.path)


def _observe(rd: RunDir, target: Cluster | Build, wl: Workload, scale: float,
             modes: Sequence[str], specs: Sequence[tuple[str, str]], *, load: bool,
             warmup: int, force: bool, max_probe_s: float, reps: int, expensive_reps: int,
             expensive_ms: float, seed: int, dbname: str, progress: ProgressFn | None
             ) -> list[str]:
    """The observers run's body (inside its run's lifecycle): the session's cells, then
    callgrind on the last backend's cluster. Returns the run's notes."""
    workload = wl.name
    own = not isinstance(target, Cluster)

    def prepare(t: harness.Target) -> None:
        r.target = t
        rd.update(backend_pid=t.backend_pid, settings=server_settings(r.conn))
        if load or own:
            r.say(f"loading {workload} at scale {scale}")
            wl.load(r.conn, scale)
        try:
            for mode in modes:
                if mode == "plain":  # finds the statement's pg_stat_statements entry
                    session.execute(t, r.sql(mode), what=mode, key=mode)
                for _ in range(max(warmup, 0)):
                    session.execute(t, r.sql(mode), what=mode)
        except harness.ExecFailed as e:
            raise r.failed(e, "the warm-up") from e.err
        rd.update(predicted=r.estimate(force, max_probe_s * 1000))

    session = harness.Session.single(
        target, name="observers", log_dir=rd.path / "logs",
        options=harness.SessionOptions(dbname=dbname), prepare=prepare, say=progress)
    r = _ObserverRun(wl, scale, modes, specs, rd, session, progress)
    live = [s for s in specs if s[0] != "callgrind"]

    def reps_for(method: str, variant: str, mode: str) -> int:
        est = r.guard.get((method, variant, mode), (None, 0.0))[1]
        return expensive_reps if est > expensive_ms else reps

    def cell(t: harness.Target, c: tuple[str, tuple[str, str]], rep: int, slot: int,
             order: int) -> None:
        # every observed execution follows an unobserved one of the same query
        mode, (method, variant) = c
        base_row = r.execute(mode, rep, A.UNOBSERVED, "", None, None)
        row = r.execute(mode, rep, method, variant,
                        r.observer(method, variant, mode, rep), base_row["order"])
        r.say(f"rep {rep} {mode}: unobserved {base_row['client_ms']:.1f} ms, "
              f"{method} {variant} {row['client_ms']:.1f} ms (hits {row['hits']})")

    def after(targets: list[harness.Target]) -> None:
        if ("callgrind", "single execution") not in specs:
            return
        t = targets[0]
        r.say("callgrind (the postmaster is stopped meanwhile)")
        session.disconnect(t)
        callgrind = cg.collect_callgrind_cluster(t.cluster, {m: r.sql(m) for m in modes},
                                                 rd.path / "callgrind", dbname=dbname)
        session.connect(t)
        for q in callgrind.queries:
            r.keep({"run_id": rd.run_id, "workload": wl.name, "scale": scale,
                    "mode": q.mode, "method": "callgrind",
                    "variant": "single execution", "rep": 1, "order": r.order,
                    "baseline_order": None, "client_ms": q.seconds * 1000,
                    "server_ms": math.nan, "hits": None, "hits_kind": None,
                    "guard_hits": None, "guard_estimate_ms": math.nan,
                    "cpu_ms": math.nan, "runq_ms": math.nan})
        r.notes.append("callgrind: wall time of the statement in a single-user backend "
                       "under valgrind (dump times), one execution after a warm-up")

    cells = [(mode, spec) for mode in modes for spec in live]
    group = harness.Group("observers", cells, seed, run=cell, warm=None,
                          include=lambda rep, c: rep <= reps_for(*c[1], c[0]))
    rd.add_artifact(TIMINGS_CSV, "one row per execution (observer_timings), written as "
                    "each one ends")
    try:
        with rd.rows(TIMINGS_CSV, TIMINGS_COLUMNS) as r.writer:
            session.run(reps, [group], after=after)
    finally:
        rd.update(executions_kept=len(r.rows))
    _timings_frame(r.rows).to_parquet(rd.file("observer_timings.parquet"), index=False)
    rd.add_artifact("observer_timings.parquet", "observer_timings table")
    return r.notes


def summarize_observers(run_dir: str | os.PathLike[str]) -> ObserverResult:
    """Tables and markdown of an observers run, from its directory alone.

    Reads ``observer_timings.csv`` and ``provenance.json`` (written by
    :func:`measure_observers`), writes slowdown.csv, guard_check.csv,
    hit_costs.csv and slowdown.md, and returns them.  A run can so be
    summarised again later (e.g. after the guard's defaults change).
    """

    rd = load_run(run_dir)
    try:
        timings = pd.read_csv(rd.file("observer_timings.csv"))
    except FileNotFoundError:
        raise ProbeError(f"{rd.path} has no observer_timings.csv: not an observers run, or it "
                         "failed before the first execution") from None
    timings = _timings_frame(timings.to_dict("records"))
    slow = A.slowdown_table(timings)
    guard = A.guard_verdict(slow)
    costs = A.hit_costs(slow, DEFAULT_COST_NS, runs=timings)
    slow.to_csv(rd.file("slowdown.csv"), index=False)
    guard.to_csv(rd.file("guard_check.csv"), index=False)
    costs.to_csv(rd.file("hit_costs.csv"), index=False)
    p = rd.provenance
    la0 = tuple(p.get("loadavg_before") or (math.nan,) * 3)
    la1 = tuple(p.get("loadavg_after") or (math.nan,) * 3)
    predicted = p.get("predicted") or {}
    md = render_md.observers_markdown(slow, guard, costs, workload=str(p.get("workload")),
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
