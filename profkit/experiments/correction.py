"""The correction check: EXPLAIN ANALYZE's TIMING ON minus clock reads × cost per read,
against the plain query (the second observer-effect experiment).

For each seed workload, plain / TIMING OFF / TIMING ON interleaved (shuffled per
repetition by :func:`profkit.experiments.harness.interleave`, each execution timed by
:func:`profkit.experiments.harness.timed_execute`), the clock's cost per read from the
micro-benchmark (before and after the timings, same run) and the predicted reads and
Instr* calls per execution; then :func:`profkit.analyze.observers.correction_summary`.
Written to ``profiles/<run_id>/`` through :mod:`profkit.rundir`.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from profkit import tables
from profkit.analyze import observers as A
from profkit.analyze import predict as P
from profkit.analyze import stats
from profkit.collect import clock, vcpu
from profkit.collect.artifacts import server_settings
from profkit.errors import ProbeError
from profkit.experiments import harness
from profkit.machine import loadavg
from profkit.machine import uptime as _uptime
from profkit.parse.explain import execution_ms
from profkit.modes import query_name
from profkit.pg.workloads import get_workload
from profkit.progress import ProgressFn
from profkit.render import markdown as render_md
from profkit.render.bench_report import extra_reps_note
from profkit.pg.cluster import Cluster
from profkit.rundir import RowWriter, RunDir, open_run

if TYPE_CHECKING:
    from profkit.pg.build import Build

TIMINGS_CSV = "timings.csv"
TIMINGS_COLUMNS: tuple[str, ...] = ("run_id", "build", "workload", "query", "mode", "rep",
                                    "order", "client_ms", "server_ms", "cpu_ms", "runq_ms",
                                    "calib_before_ms", "calib_after_ms", "scale",
                                    # what disturbed the backend (collect.vcpu), as bench
                                    # and timing-accuracy record it
                                    *vcpu.DELTA_COLUMNS)
DEFAULT_CORRECTION_WORKLOADS: dict[str, float] = {"nested_loop": 0.05, "join_sum": 0.5,
                                                  "count_star": 0.1}


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
    #: the slow-vCPU rule's account of the run (VcpuSpeed.describe()), as profkit bench's
    vcpu_note: str = ""
    #: the repetitions run because the vCPU rule left a cell short ("" when none ran)
    extra_note: str = ""


def measure_correction(target: Cluster | Build | str = "vanilla", *,
                       workloads: Mapping[str, float] | None = None, reps: int = 7,
                       warmup: int = 1, metric: str | None = None, top: int = 4,
                       calibrate: bool = True, pin_cpu: int | str | None = "auto",
                       clock_loops: int = 200_000, clock_repeats: int = 9, seed: int = 0,
                       dbname: str = "postgres",
                       base: str | os.PathLike[str] | None = None, run_id: str | None = None,
                       progress: ProgressFn | None = None,
                       min_kept: int | str | None = "auto") -> CorrectionResult:
    """How close TIMING ON minus the predicted clock reads × cost comes to plain.

    *target*: a build (a preset name or a Build: the session of
    :mod:`profkit.experiments.harness` starts its cluster and stops it), or a running
    cluster of the caller's. Loads each workload at its scale, runs plain / TIMING OFF /
    TIMING ON interleaved (*reps* repetitions, order shuffled within each; a row of
    ``timings.csv`` written as each execution ends), measures CLOCK_MONOTONIC's ns per
    read before and after, and tabulates.

    As ``profkit bench`` does: the backend is pinned to *pin_cpu* (``"auto"``: the last
    CPU, when there are two or more; None: not pinned) and, with *calibrate*, the vCPU
    calibration runs just before and after every execution; *metric* (default
    ``cpu_kept_ms`` when calibrating, else ``cpu_ms``) ``cpu_kept_ms`` leaves out the
    executions the slow-vCPU rule rejects (:func:`profkit.analyze.stats.vcpu_adjust`);
    a (workload, mode) the rule left with fewer than *min_kept* repetitions gets extra
    repetitions of every cell, at most *reps* (``"auto"``: half of *reps*, rounded up; 0
    or None: never; :class:`profkit.experiments.harness.SessionOptions`).
    """
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
    metric = metric or ("cpu_kept_ms" if calibrate else "cpu_ms")
    if metric not in A.CORRECTION_METRICS:
        raise ProbeError(f"metric must be one of {', '.join(A.CORRECTION_METRICS)}, "
                         f"not {metric!r}")
    if metric == "cpu_kept_ms" and not calibrate:
        raise ProbeError("metric cpu_kept_ms needs the vCPU calibration (calibrate=True)")
    pin = vcpu.resolve_pin(pin_cpu, ProbeError)
    keep = harness.resolve_min_kept(min_kept, reps, ProbeError)
    build = harness.target_build(target, progress)
    la0 = tuple(loadavg())
    with open_run("correction", build=build, base=base, run_id=run_id,
                  workloads=wls, reps=reps, metric=metric, loadavg_before=list(la0),
                  pin_cpu=pin, vcpu_calibration=vcpu.calibration_facts(calibrate)) as rd:
        return _correct(rd, target if isinstance(target, Cluster) else build, wls,
                        reps=reps, warmup=warmup, metric=metric, top=top,
                        pin=pin, calibrate=calibrate, min_kept=keep,
                        clock_loops=clock_loops, clock_repeats=clock_repeats, seed=seed,
                        dbname=dbname, say=say, la0=la0)


def _correct(rd: RunDir, target: Cluster | Build, wls: Mapping[str, float], *, reps: int,
             warmup: int, metric: str, top: int, pin: int | None, calibrate: bool,
             min_kept: int, clock_loops: int, clock_repeats: int,
             seed: int, dbname: str, say: ProgressFn, la0: tuple[float, float, float]
             ) -> CorrectionResult:
    """The correction run's body (inside its run's lifecycle)."""
    rows: list[dict[str, Any]] = []
    plans_on: dict[str, list[Any]] = {w: [] for w in wls}
    plan_off: dict[str, Any] = {}
    costs: list[pd.DataFrame] = []

    def prepare(t: harness.Target) -> None:
        assert t.conn is not None
        rd.update(settings=server_settings(t.conn), backend_pid=t.backend_pid)
        for name, sc in wls.items():
            say(f"loading {name} at scale {sc}")
            get_workload(name).load(t.conn, sc)
        say("clock micro-benchmark (before)")
        costs.append(clock.measure_clocks(["clock_monotonic"], loops=clock_loops,
                                          repeats=clock_repeats, run_id=rd.run_id))

    session = harness.Session.single(
        target, name="correction", log_dir=rd.path / "logs",
        options=harness.SessionOptions(dbname=dbname, pin_cpu=pin, calibrate=calibrate,
                                       min_kept=min_kept),
        prepare=prepare, say=say)

    def execute(t: harness.Target, name: str, mode: str, when: str = "the warm-up"
                ) -> tuple[harness.Timed, float, Any]:
        try:
            return _execute(t, name, mode)
        except harness.ExecFailed as e:
            _crashed, what = session.failure(e, when)
            raise ProbeError(f"{what}. The {len(rows)} executions measured before are kept "
                             f"in {rd.file(TIMINGS_CSV)}") from e.err

    def _execute(t: harness.Target, name: str, mode: str
                 ) -> tuple[harness.Timed, float, Any]:
        wl = get_workload(name)
        sql = wl.query(mode, fmt="json" if mode != "plain" else None)
        if mode == "plain":
            m = session.execute(t, sql, what=f"{name} {mode}", key=name)
            server = m.server_ms if m.pgss_calls == 1 else math.nan
            exp = wl.expected_rows(wls[name])
            got = harness.first_value(m.rows)
            if exp is not None and got != exp:
                raise ProbeError(f"{name} returned {got!r}, expected {exp}")
            return m, server, None
        m = session.execute(t, sql, what=f"{name} {mode}")
        return m, execution_ms(m.rows), m.rows[0][0]

    cells = [(w, m) for w in wls for m in A.CORRECTION_MODES]

    def cell(t: harness.Target, c: tuple[str, str], rep: int, slot: int, order: int) -> None:
        name, mode = c
        box, s, plan = execute(t, name, mode, f"repetition {rep} of {reps}")
        if mode == "analyze_timing":
            plans_on[name].append(plan)
        elif mode == "analyze_notiming":
            plan_off[name] = plan
        row = {"run_id": rd.run_id, "build": t.build.name,
               "workload": name, "query": query_name(mode), "mode": mode,
               "rep": rep, "order": order, "client_ms": box.client_ms, "server_ms": s,
               "cpu_ms": box.cpu_ms, "runq_ms": box.runq_ms,
               "calib_before_ms": box.calib_before_ms, "calib_after_ms": box.calib_after_ms,
               "scale": wls[name], **box.counters}
        rows.append(row)
        assert writer is not None
        writer.write(row)
        if slot == len(cells) - 1:
            say(f"{harness.rep_text(rep, reps)} done")

    writer: RowWriter | None = None
    facts_box: list[pd.DataFrame] = []
    node_frames: list[pd.DataFrame] = []

    def after(targets: list[harness.Target]) -> None:
        conn = targets[0].conn
        assert conn is not None
        say("clock micro-benchmark (after)")
        costs.append(clock.measure_clocks(["clock_monotonic"], loops=clock_loops,
                                          repeats=clock_repeats, run_id=rd.run_id))
        both = pd.concat(costs)
        # A tight loop preempted by other processes' work only gets slower: on a
        # loaded machine the fastest of many short repeats (200k reads, a few ms,
        # shorter than a time slice) is the clock's cost; the median is kept beside it.
        ns_micro = float(both["ns_per_call_min"].min())
        ns_micro_median = float(both["ns_per_call"].median())
        facts_rows = []
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
        facts_box.append(pd.DataFrame(facts_rows))
    rd.add_artifact(TIMINGS_CSV, "one row per execution (timings table), written as each "
                    "one ends")
    try:
        # every cell once before the repetitions: the plain statement's first execution
        # finds its pg_stat_statements entry
        group = harness.Group("correction", cells, seed, run=cell,
                              warm=lambda t, c: execute(t, *c), warmup=warmup)
        with rd.rows(TIMINGS_CSV, TIMINGS_COLUMNS) as writer:
            session.run(reps, [group], after=after)
        facts = facts_box[0]
    finally:
        rd.update(executions_kept=len(rows), extra_repetitions=session.extra_facts())
    timings = tables.validate(pd.DataFrame(rows, columns=list(TIMINGS_COLUMNS)), "timings")
    summary = A.correction_summary(timings, facts, metric=metric)
    others = {m: A.correction_summary(timings, facts, metric=m)
              for m in A.CORRECTION_METRICS
              if m != metric and (calibrate or m != "cpu_kept_ms")}
    vcpu_note = stats.vcpu_adjust(timings)[1].describe() if calibrate else \
        "no vCPU calibration (calibrate=False)"
    extra_note = extra_reps_note({"extra_repetitions": session.extra_facts()})
    rd.update(vcpu=vcpu_note)
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
    cost = pd.concat([costs[0].assign(when="before"), costs[-1].assign(when="after")],
                     ignore_index=True)
    la1 = tuple(loadavg())
    uptime = _uptime()
    timings.to_parquet(rd.file("timings.parquet"), index=False)
    summary.to_csv(rd.file("correction.csv"), index=False)
    pd.concat([summary, *others.values()], ignore_index=True).to_csv(
        rd.file("correction_all_metrics.csv"), index=False)
    nodes_all.to_csv(rd.file("correction_nodes.csv"), index=False)
    facts.to_csv(rd.file("facts.csv"), index=False)
    cost.drop(columns=["histogram"]).to_csv(rd.file("clock_cost.csv"), index=False)
    rd.file("correction.md").write_text(render_md.correction_markdown(
        summary, nodes_all, run_id=rd.run_id, metric=metric, la0=la0, la1=la1, uptime=uptime,
        others=others, vcpu_note=" ".join(x for x in (vcpu_note, extra_note) if x)))
    for name, what in (("timings.parquet", "timings table"),
                       ("correction.csv", f"corrected vs plain per workload ({metric})"),
                       ("correction_all_metrics.csv", "the same for each metric the run has, "
                        "a row per workload and metric"),
                       ("correction_nodes.csv", "top nodes, corrected"),
                       ("facts.csv", "predicted reads and Instr calls, micro-benchmark cost"),
                       ("clock_cost.csv", "CLOCK_MONOTONIC ns/read before and after"),
                       ("correction.md", "the tables as markdown, with load average")):
        rd.add_artifact(name, what)
    rd.update(loadavg_after=list(la1), uptime=uptime,
              ns_per_read_micro=float(facts["ns_per_read_micro"].iloc[0]))
    return CorrectionResult(rd.run_id, rd.path, timings, summary, nodes_all, cost, facts,
                            la0, la1, others, vcpu_note, extra_note)
