"""How accurate per-node shares from samples are, against independent yardsticks.

For each query (the three seed workloads and queries of our own with a sort, a hash
aggregate, a hash join, parallel workers and two synthetic ones), per plan node, the
share of the query's executor time:

- **marker**: the node_marker build with ``track_executor_node`` on, sampled with bcc at
  ``--frequency`` Hz (:func:`profkit.experiments.nodetime_marker.run_marker`): exact
  attribution, the share's error is the sampling error only;
- **stack**: the stack method (``profkit nodetime``: perf call stacks matched to the plan,
  :func:`profkit.experiments.nodetime.nodetime_on_conn`) on vanilla, sampled as long;
- yardstick **(a)**: EXPLAIN (ANALYZE, TIMING TRUE) on the tsc_clock build minus the
  calibrated cost of its own clock reads
  (:func:`profkit.analyze.timing_accuracy.corrected_times`, the cost per read taken in
  situ as (TIMING TRUE − TIMING FALSE execution time) / reads, as the timing-accuracy
  experiment does), the mean of ``--reps`` executions; exclusive time = inclusive minus the
  children's, negative values (a parallel Gather) counted as 0;
- yardstick **(b)**: synthetic queries whose dominant node's work is known by
  construction: the same query with and without that node's work (an md5() filter; an
  ORDER BY), the difference in backend CPU time over the full query's time is a lower
  bound of the node's exclusive share;
- beside them, as the frontier's other points: EXPLAIN ANALYZE TIMING TRUE's own shares
  on vanilla (clock_gettime), on tsc_clock uncorrected, and on sampled_timing, against
  yardstick (a).

Cost of each method: the backend's CPU time (``/proc/PID/schedstat``) of the plain query
against vanilla's plain query (node_marker: setting on and the sampler attached), the
median of the repetitions, taken under load on a shared 2-vCPU VM; and the instruction
figures of ``benchmarks/results/nodetime_cost.csv`` and ``headline.csv`` (callgrind)
beside them.

Goals: every node with ≥ 5 % of the time within ±2 percentage points of yardstick (a);
overhead ≤ 2 %.

Usage::

    .venv/bin/python benchmarks/nodetime_accuracy.py            # writes results/nodetime_accuracy.*
    .venv/bin/python benchmarks/nodetime_accuracy.py --reps 5 --seconds 3 --queries sort,hashagg
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MD_NAME = "nodetime_accuracy.md"
CSV_NAME = "nodetime_accuracy.csv"
PNG_NAME = "nodetime_accuracy.png"
MIN_SHARE = 0.05
#: sorts and hashes in memory: a spill to temp files would put I/O waits (wall time, not
#: CPU time) into EXPLAIN's yardstick
CLUSTER_SETTINGS = {"work_mem": "64MB", "max_worker_processes": "8",
                    "max_parallel_workers": "4"}
GOAL_PP = 2.0
GOAL_OVERHEAD_PCT = 2.0

PARALLEL = {"max_parallel_workers_per_gather": "2", "parallel_setup_cost": "0",
            "parallel_tuple_cost": "0", "min_parallel_table_scan_size": "0"}
SEED_SCALES = {"nested_loop": 0.02, "join_sum": 0.2, "count_star": 0.1}
OWN_SETUP = [
    "DROP TABLE IF EXISTS acc_t, acc_u",
    "CREATE TABLE acc_t AS SELECT g AS a, ((g::bigint * 7919) % 100000)::int AS b FROM "
    "generate_series(1, 300000) g",
    "CREATE TABLE acc_u AS SELECT g * 3 AS a, g % 97 AS c FROM generate_series(1, 100000) g",
    "VACUUM ANALYZE acc_t, acc_u",
]


@dataclass(frozen=True)
class Query:
    name: str
    sql: str
    settings: dict[str, str] = field(default_factory=dict)
    #: yardstick (b): (node type, the same query without that node's work)
    knockout: tuple[str, str] | None = None
    parallel: bool = False


def queries() -> list[Query]:
    from profkit.pg.workloads import get_workload

    out = [Query(w, get_workload(w).query("plain")) for w in SEED_SCALES]
    out += [
        Query("sort", "SELECT count(*) FROM (SELECT a FROM acc_t ORDER BY b DESC, a OFFSET 0) s",
              knockout=("Sort", "SELECT count(*) FROM (SELECT a FROM acc_t OFFSET 0) s")),
        Query("hashagg", "SELECT count(*), sum(n) FROM (SELECT b % 5000 AS k, count(*) AS n "
                         "FROM acc_t GROUP BY 1) s"),
        Query("hashjoin", "SELECT count(*), sum(u.c) FROM acc_t t JOIN acc_u u ON t.a = u.a"),
        Query("md5_scan", "SELECT count(*) FROM acc_t WHERE md5(a::text) LIKE '%ab%'",
              knockout=("Seq Scan", "SELECT count(*) FROM acc_t WHERE a::text LIKE '%ab%'")),
        Query("parallel", "SELECT count(*) FROM acc_t WHERE md5(a::text) < '8'",
              settings=PARALLEL, parallel=True),
    ]
    return out


Say = Callable[[str], None]


def cpu_ms(pid: int) -> float:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e6


def _set(conn: Any, settings: dict[str, str]) -> None:
    conn.execute("RESET ALL")
    for k, v in settings.items():
        conn.execute(f"SET {k} = '{v}'")


def timed(conn: Any, sql: str) -> tuple[float, Any]:
    pid = int(conn.info.backend_pid)
    c0 = cpu_ms(pid)
    rows = conn.execute(sql).fetchall()
    return cpu_ms(pid) - c0, rows


# ---------------------------------------------------------------------------
# EXPLAIN-based shares


def explain_frame(plan_json: Any) -> pd.DataFrame:
    """One EXPLAIN (ANALYZE, FORMAT JSON) plan in pre-order: node_id, parent_id, node_type,
    rows, loops, inclusive_ms, exclusive_ms."""
    from profkit.analyze import timing_accuracy as ta
    from profkit.experiments.nodetime_marker import plan_shape

    shape = plan_shape(plan_json)
    df = pd.DataFrame({"node_id": [n.node_id for n in shape],
                       "parent_id": pd.array([n.parent_id for n in shape], dtype="Int64"),
                       "node_type": [n.node_type for n in shape],
                       "rows": [n.rows for n in shape], "loops": [n.loops for n in shape],
                       ta.INCLUSIVE: [n.inclusive_ms for n in shape]})
    df[ta.EXCLUSIVE] = ta._exclusive(df)
    return df


def shares_of(frames: Sequence[pd.DataFrame]) -> dict[int, float]:
    """Mean exclusive time per node over executions, negatives as 0, as shares."""
    from profkit.analyze.timing_accuracy import EXCLUSIVE

    excl = pd.concat([f[["node_id", EXCLUSIVE]] for f in frames]).groupby("node_id")[
        EXCLUSIVE].mean().clip(lower=0.0)
    tot = float(excl.sum())
    return {int(k): float(v) / tot for k, v in excl.items()} if tot > 0 else {}


def corrected(frames: Sequence[pd.DataFrame], ns_per_read: float) -> list[pd.DataFrame]:
    from profkit.analyze.timing_accuracy import corrected_times

    return [corrected_times(f, ns_per_read) for f in frames]


def reads_of(frame: pd.DataFrame) -> float:
    from profkit.analyze.timing_accuracy import instr_calls_per_node

    return 2.0 * float(instr_calls_per_node(frame).sum())


# ---------------------------------------------------------------------------
# the run


@dataclass
class Arm:
    name: str
    build: str
    conn: Any = None


def load_everything(conn: Any) -> None:
    from profkit.pg.workloads import get_workload

    for w, s in SEED_SCALES.items():
        get_workload(w).load(conn, s)
    for stmt in OWN_SETUP:
        conn.execute(stmt)


def explain_sql(sql: str, timing: bool) -> str:
    return (f"EXPLAIN (ANALYZE, TIMING {'TRUE' if timing else 'FALSE'}, BUFFERS FALSE, "
            f"FORMAT JSON) {sql}")


def measure_query(q: Query, arms: dict[str, Arm], reps: int, seconds: float, frequency: int,
                  say: Say) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Per node of *q*: every method's share and the yardsticks; and the cost figures."""
    from profkit.experiments import nodetime_marker as exp

    plans: dict[str, list[pd.DataFrame]] = {"vanilla": [], "tsc_clock": [],
                                            "tsc_clock_false": [], "sampled_timing": []}
    cpu: dict[str, list[float]] = {k: [] for k in ("vanilla plain", "vanilla timing",
                                                  "tsc_clock plain", "tsc_clock timing",
                                                  "tsc_clock notiming", "sampled_timing plain",
                                                  "sampled_timing timing", "knockout full",
                                                  "knockout without")}
    exec_ms: dict[str, list[float]] = {"tsc true": [], "tsc false": []}
    for a in arms.values():
        _set(a.conn, q.settings)
        a.conn.execute(q.sql).fetchall()  # warm-up
    for _rep in range(reps):
        for arm in ("vanilla", "tsc_clock", "sampled_timing"):
            c = arms[arm].conn
            t, _ = timed(c, q.sql)
            cpu[f"{arm} plain"].append(t)
            t, rows = timed(c, explain_sql(q.sql, True))
            cpu[f"{arm} timing"].append(t)
            plans[arm].append(explain_frame(rows[0][0]))
            if arm == "tsc_clock":
                exec_ms["tsc true"].append(float(rows[0][0][0]["Execution Time"]))
                t, rows = timed(c, explain_sql(q.sql, False))
                cpu["tsc_clock notiming"].append(t)
                exec_ms["tsc false"].append(float(rows[0][0][0]["Execution Time"]))
        if q.knockout is not None:
            c = arms["vanilla"].conn
            cpu["knockout full"].append(timed(c, q.sql)[0])
            cpu["knockout without"].append(timed(c, q.knockout[1])[0])
    # yardstick (a): tsc_clock minus its clock reads, cost per read in situ
    reads = reads_of(plans["tsc_clock"][0])
    d_ms = statistics.median(exec_ms["tsc true"]) - statistics.median(exec_ms["tsc false"])
    ns_per_read = max(0.0, d_ms * 1e6 / reads) if reads else 0.0
    yard = shares_of(corrected(plans["tsc_clock"], ns_per_read))
    van = shares_of(plans["vanilla"])
    tsc_raw = shares_of(plans["tsc_clock"])
    samp = shares_of(plans["sampled_timing"])
    # the marker
    mc = arms["node_marker"].conn
    _set(mc, q.settings)
    m_cpu = [timed(mc, q.sql)[0] for _ in range(max(3, reps // 2))]
    r = exp.run_marker(mc, q.sql, frequency=frequency, min_seconds=seconds)
    mk = {int(k): float(v) for k, v in zip(r.nodes["node_id"], r.nodes["exclusive_share"],
                                          strict=True)}
    # the stack method (profkit nodetime) on vanilla, the same sampling length
    stk, st_info = stack_shares(arms["vanilla"].conn, q.sql, seconds)
    ref = plans["tsc_clock"][0]
    rows_out = []
    for nid, ntype in zip(ref["node_id"], ref["node_type"], strict=True):
        rows_out.append({
            "query": q.name, "node_id": int(nid), "node_type": ntype,
            "marker": mk.get(int(nid), 0.0), "stack": stk.get(int(nid), math.nan),
            "yardstick_a": yard.get(int(nid), math.nan),
            "vanilla_timing": van.get(int(nid), math.nan),
            "tsc_timing_raw": tsc_raw.get(int(nid), math.nan),
            "sampled_timing": samp.get(int(nid), math.nan),
            "marker_samples": float(r.nodes.loc[r.nodes["node_id"] == nid, "samples"].iloc[0]),
        })
    df = pd.DataFrame(rows_out)
    if [str(t) for t in r.nodes["node_type"]] != [str(t) for t in df["node_type"]]:
        say(f"{q.name}: the marker's plan differs from tsc_clock's: "
            f"{list(r.nodes['node_type'])} vs {list(df['node_type'])}")
    if st_info["node_types"] != [str(t) for t in df["node_type"]]:
        say(f"{q.name}: the stack method's plan differs from tsc_clock's: "
            f"{st_info['node_types']} vs {list(df['node_type'])}")
    info: dict[str, Any] = {
        "query": q.name, "ns_per_read": ns_per_read, "reads": reads,
        "stack_samples": st_info["samples"], "stack_ambiguous": st_info["ambiguous"],
        "stack_outside_share": st_info["outside_share"],
        "marker_executions": r.executions, "marker_seconds": r.seconds,
        "marker_samples": int(r.samples.total), "marker_outside_share": r.outside_share,
        "marker_worker_samples": sum(r.samples.worker_node_samples.values()),
        "marker_cpu_setting_on_ms": statistics.median(m_cpu),
        **{f"cpu {k}": statistics.median(v) if v else math.nan for k, v in cpu.items()},
    }
    if q.knockout is not None:
        full, without = info["cpu knockout full"], info["cpu knockout without"]
        info["knockout_node"] = q.knockout[0]
        info["knockout_lower_bound"] = max(0.0, (full - without) / full) if full else math.nan
    return df, info


STACK_FREQ = 999  # profkit nodetime's default


def stack_shares(conn: Any, sql: str, seconds: float) -> tuple[dict[int, float], dict[str, Any]]:
    """Exclusive share per node by the stack method (:func:`profkit.experiments.nodetime.
    nodetime_on_conn`, perf at its default frequency) on the vanilla backend behind *conn*,
    for about *seconds* of its CPU time; the run folder is thrown away."""
    import tempfile

    from profkit.experiments.nodetime import nodetime_on_conn

    with tempfile.TemporaryDirectory(prefix="nodetime-acc-") as td:
        r = nodetime_on_conn(conn, sql, freq=STACK_FREQ, min_samples=int(seconds * STACK_FREQ),
                             max_seconds=max(30.0, 6 * seconds), base=td)
    d = r.df
    return ({int(k): float(v) for k, v in zip(d["node_id"], d["exclusive_share"], strict=True)},
            {"samples": r.executor_samples, "ambiguous": float(d["ambiguous_samples"].sum()),
             "outside_share": r.outside_executor_share,
             "node_types": [str(t) for t in d["node_type"]]})


def perf_overhead(conn: Any, sql: str, reps: int) -> tuple[float, float]:
    """Median backend CPU time of *sql* on *conn* (ms) without and with ``perf record -F
    999 -g`` attached to its backend (what the stack method records), interleaved in
    blocks; perf is stopped by pid."""
    import os
    import signal
    import subprocess
    import tempfile

    pid = int(conn.info.backend_pid)
    bare: list[float] = []
    sampled: list[float] = []
    with tempfile.TemporaryDirectory(prefix="nodetime-acc-perf-") as td:
        for _ in range(reps):
            bare.append(timed(conn, sql)[0])
            p = subprocess.Popen(["perf", "record", "-q", "-F", str(STACK_FREQ), "-g", "-p",
                                  str(pid), "-o", os.path.join(td, "perf.data")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                time.sleep(0.3)  # attached before the query starts
                sampled.append(timed(conn, sql)[0])
            finally:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    return statistics.median(bare), statistics.median(sampled)


def sampling_overhead(conn: Any, sql: str, reps: int, frequency: int) -> tuple[float, float]:
    """Median backend CPU time of *sql* on the node_marker cluster with the setting on,
    without and with the sampler attached (ms), interleaved."""
    from profkit.collect import node_marker as nm

    pid = int(conn.info.backend_pid)
    conn.execute("SET track_executor_node = on")
    bare: list[float] = []
    sampled: list[float] = []

    def run_sampled() -> None:
        for _ in range(reps):
            sampled.append(timed(conn, sql)[0])

    for _ in range(reps):
        bare.append(timed(conn, sql)[0])
    nm.record_node_samples(pid, run_sampled, frequency=frequency)
    return statistics.median(bare), statistics.median(sampled)


def run(query_names: Sequence[str] | None, reps: int, seconds: float, frequency: int,
        say: Say) -> tuple[pd.DataFrame, pd.DataFrame]:
    from profkit.pg.build import get_build
    from profkit.pg.cluster import Cluster

    qs = [q for q in queries() if query_names is None or q.name in query_names]
    arms = {n: Arm(n, n) for n in ("vanilla", "tsc_clock", "sampled_timing", "node_marker")}
    clusters = []
    try:
        for a in arms.values():
            b = get_build(a.build, progress=say)
            cl = Cluster(b, name=f"nodetime-acc-{a.name}",
                         settings=CLUSTER_SETTINGS)
            cl.start()
            clusters.append(cl)
            a.conn = cl.connect()
            say(f"{a.name}: loading")
            load_everything(a.conn)
        frames, infos = [], []
        failed: list[str] = []
        for q in qs:
            say(f"{q.name}: {reps} repetitions on each build, then the marker ({seconds:g} s)")
            try:
                df, info = measure_query(q, arms, reps, seconds, frequency, say)
            except Exception as e:  # noqa: BLE001 - one query's failure is reported, not fatal
                say(f"{q.name}: FAILED: {type(e).__name__}: {e}")
                failed.append(f"{q.name}: {type(e).__name__}: {e}")
                continue
            frames.append(df)
            infos.append(info)
        # sampling's own cost, on the longest seed query
        bare, sampled = sampling_overhead(arms["node_marker"].conn, qs[0].sql, reps, frequency)
        infos.append({"query": "_sampler", "cpu bare": bare, "cpu sampled": sampled})
        bare, sampled = perf_overhead(arms["vanilla"].conn, qs[0].sql, reps)
        infos.append({"query": "_perf", "cpu bare": bare, "cpu sampled": sampled})
        for f in failed:
            infos.append({"query": "_failed", "error": f})
    finally:
        for a in arms.values():
            if a.conn is not None:
                a.conn.close()
        for cl in clusters:
            cl.stop()
    return pd.concat(frames, ignore_index=True), pd.DataFrame(infos)


# ---------------------------------------------------------------------------
# report

METHODS = {"marker": "marker (node_marker + bcc)", "stack": "stack (profkit nodetime)",
           "vanilla_timing": "TIMING TRUE, clock_gettime (vanilla)",
           "tsc_timing_raw": "TIMING TRUE, TSC (tsc_clock, uncorrected)",
           "sampled_timing": "sampled_timing (EXPLAIN, 1 in 100)"}


def errors(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for m in METHODS:
        df[f"err_{m}_pp"] = (df[m] - df["yardstick_a"]) * 100
    return df


def frontier(df: pd.DataFrame, info: pd.DataFrame, cost_csv: Path, headline_csv: Path
             ) -> pd.DataFrame:
    """Per method: max and mean |error| (pp) over nodes with ≥ 5 % of yardstick (a), the
    CPU-time overhead over vanilla's plain query measured here (under load), and the
    instruction overhead from the committed callgrind results."""
    big = df[df["yardstick_a"] >= MIN_SHARE]
    q = info[~info["query"].str.startswith("_")]
    par = set(df.loc[df["query"] == "parallel", "query"])

    def cpu_over(col: str) -> float:
        vals = [(r[col] - r["cpu vanilla plain"]) / r["cpu vanilla plain"] * 100
                for _i, r in q.iterrows() if r["query"] not in par and r["cpu vanilla plain"] > 0]
        return statistics.median(vals) if vals else math.nan

    instr: dict[str, float] = {}
    if cost_csv.exists():
        c = pd.read_csv(cost_csv, dtype={"pg_major": str})
        c = c[(c["pg_major"] == "18") & (c["mode"] == "plain") & (c["arm"] == "node_marker on")]
        if not c.empty:
            instr["marker"] = float(c["vs_vanilla_plain_pct"].median())
    if headline_csv.exists():
        h = pd.read_csv(headline_csv, dtype={"pg_major": str})
        h = h[(h["pg_major"] == "18") & (h["compiler"] == "gcc")
              & (h["mode"] == "analyze_timing_buffers")]
        for m, b in (("vanilla_timing", "vanilla"), ("tsc_timing_raw", "tsc_clock"),
                     ("sampled_timing", "sampled_timing")):
            s = h[h["build"] == b]["vs_vanilla_plain_pct"]
            if not s.empty:
                instr[m] = float(s.median())
    samp = info[info["query"] == "_sampler"]
    sampler_pct = math.nan
    if not samp.empty and samp["cpu bare"].iloc[0] > 0:
        sampler_pct = float((samp["cpu sampled"].iloc[0] - samp["cpu bare"].iloc[0])
                            / samp["cpu bare"].iloc[0] * 100)
    perf = info[info["query"] == "_perf"]
    perf_pct = math.nan
    if not perf.empty and perf["cpu bare"].iloc[0] > 0:
        perf_pct = float((perf["cpu sampled"].iloc[0] - perf["cpu bare"].iloc[0])
                         / perf["cpu bare"].iloc[0] * 100)
    rows = []
    for m, label in METHODS.items():
        e = big[f"err_{m}_pp"].abs()
        cpu_col = {"marker": "marker_cpu_setting_on_ms", "vanilla_timing": "cpu vanilla timing",
                   "tsc_timing_raw": "cpu tsc_clock timing",
                   "sampled_timing": "cpu sampled_timing timing"}.get(m)
        rows.append({"method": label, "key": m,
                     "nodes": int(e.notna().sum()),
                     "max_abs_err_pp": float(e.max()) if e.notna().any() else math.nan,
                     "mean_abs_err_pp": float(e.mean()) if e.notna().any() else math.nan,
                     "within_2pp": int((e <= GOAL_PP).sum()),
                     "cpu_overhead_pct": (perf_pct if m == "stack" else
                                          cpu_over(cpu_col) if cpu_col else math.nan),
                     "instr_overhead_pct": instr.get(m, math.nan),
                     "sampler_cpu_pct": sampler_pct if m == "marker" else math.nan})
    return pd.DataFrame(rows)


def fmtf(v: float, spec: str = "+.2f", unit: str = "") -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else \
        f"{format(v, spec)}{unit}"


def markdown(df: pd.DataFrame, info: pd.DataFrame, front: pd.DataFrame, meta: dict) -> str:
    out = ["# Per-node shares from samples: accuracy against yardsticks", "",
           f"Generated by `benchmarks/nodetime_accuracy.py` on {meta['when']} "
           f"({meta['reps']} repetitions per build, the marker sampled for ≥ "
           f"{meta['seconds']:g} s at {meta['frequency']} Hz). Times taken on a 2-vCPU VM at a "
           f"1-minute load average of {meta['load'][0]:.2f} at the start and "
           f"{meta['load'][1]:.2f} at the end (the run's own four clusters count in it); "
           "yardstick (a) is EXPLAIN's wall time, the samples are CPU time.", "",
           "Shares are of the executor's time (exclusive: a node's own time). Yardstick (a): "
           "EXPLAIN ANALYZE TIMING TRUE on tsc_clock minus its clock reads (ns per read "
           "in situ, per query below). stack: " + meta["stack_note"], ""]
    out += ["## Accuracy-versus-cost frontier", "",
            "| method | nodes ≥ 5 % | within ±2 pp | max abs err (pp) | mean abs err (pp) | "
            "CPU overhead (median; A/A on this VM spans several points) | "
            "instructions (callgrind) |",
            "|---|---|---|---|---|---|---|"]
    for r in front.itertuples():
        cpu = fmtf(r.cpu_overhead_pct, "+.1f", " %")
        if r.key == "marker" and not math.isnan(r.sampler_cpu_pct):
            cpu = f"setting on {cpu}; the sampler {r.sampler_cpu_pct:+.1f} %"
        out.append(f"| {r.method} | {r.nodes} | {r.within_2pp} | {fmtf(r.max_abs_err_pp, '.2f')}"
                   f" | {fmtf(r.mean_abs_err_pp, '.2f')} | {cpu} | "
                   f"{fmtf(r.instr_overhead_pct, '+.2f', ' %')} |")
    out += ["", "TIMING TRUE's instruction figures are the headline matrix's default EXPLAIN "
            "ANALYZE (callgrind leaves out clock_gettime's kernel work: they understate its "
            "cost); the marker's is the plain query with the setting on "
            "(`nodetime_cost.csv`).", ""]
    out += ["## Per node (shares in %, errors in percentage points against (a))", "",
            "| query | node | type | (a) | marker | err | stack | err | vanilla TT | err | "
            "tsc raw | err | sampled_timing | err | marker samples |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        flag = " **" if r.yardstick_a >= MIN_SHARE and abs(r.err_marker_pp) > GOAL_PP else ""
        out.append(
            f"| {r.query} | {r.node_id} | {r.node_type} | {r.yardstick_a * 100:.1f} | "
            f"{r.marker * 100:.1f} | {r.err_marker_pp:+.1f}{flag} | "
            f"{fmtf(r.stack * 100, '.1f')} | {fmtf(r.err_stack_pp, '+.1f')} | "
            f"{r.vanilla_timing * 100:.1f} | "
            f"{r.err_vanilla_timing_pp:+.1f} | {r.tsc_timing_raw * 100:.1f} | "
            f"{r.err_tsc_timing_raw_pp:+.1f} | {r.sampled_timing * 100:.1f} | "
            f"{r.err_sampled_timing_pp:+.1f} | {int(r.marker_samples)} |")
    out += ["", "\\*\\* a node with ≥ 5 % of the time whose marker share misses (a) by more "
            "than 2 pp.", ""]
    big = df[df["yardstick_a"] >= MIN_SHARE]
    gap = ((big["marker"] - big["stack"]) * 100).abs().dropna()
    if not gap.empty:
        out += ["The two sampling methods against each other (no yardstick: the marker is "
                "exact attribution, the stack method infers the node from call stacks): on "
                f"the {len(gap)} nodes with ≥ 5 % of (a), |marker − stack| ≤ 2 pp on "
                f"{int((gap <= GOAL_PP).sum())}, at most {gap.max():.2f} pp.", ""]
    kn = info[info.get("knockout_node", pd.Series(dtype=object)).notna()] \
        if "knockout_node" in info else pd.DataFrame()
    if not kn.empty:
        out += ["## Yardstick (b): synthetic queries, the dominant node's work removed", "",
                "| query | node | lower bound of its share (CPU, vanilla) | marker | (a) |",
                "|---|---|---|---|---|"]
        for r in kn.itertuples():
            sel = df[(df["query"] == r.query) & (df["node_type"] == r.knockout_node)]
            mk = sel["marker"].max() if not sel.empty else math.nan
            ya = sel["yardstick_a"].max() if not sel.empty else math.nan
            out.append(f"| {r.query} | {r.knockout_node} | ≥ {r.knockout_lower_bound * 100:.1f} % "
                       f"| {mk * 100:.1f} % | {ya * 100:.1f} % |")
        out.append("")
    out += ["## Per query", "",
            "| query | ns per clock read (tsc, in situ) | marker executions | marker samples | "
            "outside the executor | worker samples | stack samples (ambiguous) | "
            "plain CPU ms (vanilla) |",
            "|---|---|---|---|---|---|---|---|"]
    for r in info[~info["query"].str.startswith("_")].to_dict("records"):
        out.append(f"| {r['query']} | {r['ns_per_read']:.1f} | {int(r['marker_executions'])} | "
                   f"{int(r['marker_samples'])} | {r['marker_outside_share'] * 100:.1f} % | "
                   f"{int(r['marker_worker_samples'])} | {r['stack_samples']:.0f} "
                   f"({r['stack_ambiguous']:.0f}) | {r['cpu vanilla plain']:.1f} |")
    if "error" in info:
        out.append("")
        for e in info["error"].dropna():
            out.append(f"- not measured: {e}")
    out += ["", f"Goals: every node with ≥ 5 % within ±{GOAL_PP:g} pp of (a): marker "
            f"{meta['goal_accuracy']}; stack {meta['goal_accuracy_stack']}; overhead ≤ "
            f"{GOAL_OVERHEAD_PCT:g} %: marker {meta['goal_overhead']}; stack "
            f"{meta['goal_overhead_stack']}.", ""]
    return "\n".join(out)


def plot(front: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in front.itertuples():
        x = r.instr_overhead_pct if not math.isnan(r.instr_overhead_pct) else r.cpu_overhead_pct
        if math.isnan(x) or math.isnan(r.max_abs_err_pp):
            continue
        ax.scatter([x], [r.max_abs_err_pp], s=60)
        ax.annotate(r.method, (x, r.max_abs_err_pp), textcoords="offset points",
                    xytext=(5, 5), fontsize=8)
    ax.axhline(GOAL_PP, ls="--", lw=0.8, color="grey")
    ax.axvline(GOAL_OVERHEAD_PCT, ls="--", lw=0.8, color="grey")
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("overhead over vanilla's plain query, % (instructions, callgrind)")
    ax.set_ylabel("max |share error| over nodes ≥ 5 %, pp (vs TSC − reads)")
    ax.set_title("Per-node time: accuracy versus cost")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def stack_note() -> str:
    return (f"profkit nodetime's perf call stacks at {STACK_FREQ} Hz on vanilla, as long as the "
            "marker samples; its cost is perf record -g attached to the backend (CPU time "
            "of the first query with and without perf), and it changes no instruction of "
            "PostgreSQL's.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--frequency", type=int, default=1999)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    names = [s.strip() for s in args.queries.split(",")] if args.queries else None
    known = {q.name for q in queries()}
    if names and set(names) - known:
        raise SystemExit(f"nodetime_accuracy.py: unknown queries {sorted(set(names) - known)}; "
                         f"known: {', '.join(sorted(known))}")

    def say(s: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {s}", flush=True)

    load0 = os.getloadavg()[0]
    df, info = run(names, args.reps, args.seconds, args.frequency, say)
    df = errors(df)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    front = frontier(df, info, out / "nodetime_cost.csv", out / "headline.csv")
    big = df[df["yardstick_a"] >= MIN_SHARE]
    miss = big[big["err_marker_pp"].abs() > GOAL_PP]
    st = front[front["key"] == "stack"].iloc[0]
    n_st = int(big["err_stack_pp"].notna().sum())
    miss_st = int((big["err_stack_pp"].abs() > GOAL_PP).sum())
    mk = front[front["key"] == "marker"].iloc[0]
    over = [(v, what) for v, what in ((mk["instr_overhead_pct"], "instructions"),
                                      (mk["cpu_overhead_pct"], "CPU time"))
            if not math.isnan(v)]
    meta = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "reps": args.reps,
            "seconds": args.seconds, "frequency": args.frequency, "stack_note": stack_note(),
            "goal_accuracy": ("met" if miss.empty else
                              f"missed on {len(miss)} of {len(big)} nodes ("
                              + ", ".join(f"{r.query} {r.node_id} {r.node_type} "
                                          f"{r.err_marker_pp:+.1f} pp"
                                          for r in miss.itertuples()) + ")"),
            "load": (load0, os.getloadavg()[0]),
            "goal_accuracy_stack": ("met" if n_st and not miss_st else
                                    f"missed on {miss_st} of {n_st} nodes"),
            # one median of --reps CPU times: A/A intervals on this VM are several points
            # wide, so a CPU-time figure cannot say met or missed at 2 %
            "goal_overhead_stack": (f"{st['cpu_overhead_pct']:+.2f} % CPU time with perf attached "
                                    f"(a median of {args.reps} executions: not resolvable at "
                                    "2 % on this VM, neither met nor missed)"
                                    if not math.isnan(st["cpu_overhead_pct"]) else "not measured"),
            "goal_overhead": ((f"{'met' if over[0][0] <= GOAL_OVERHEAD_PCT else 'missed'}: "
                               f"{over[0][0]:+.2f} % (instructions)")
                              if over and over[0][1] == "instructions" else
                              f"{over[0][0]:+.2f} % CPU time (not resolvable at 2 %)" if over
                              else "not measured")}
    df.to_csv(out / CSV_NAME, index=False)
    info.to_csv(out / "nodetime_accuracy_queries.csv", index=False)
    text = markdown(df, info, front, meta)
    (out / MD_NAME).write_text(text)
    plot(front, out / PNG_NAME)
    print(text)
    print(f"wrote {out / MD_NAME}, {out / CSV_NAME}, {out / PNG_NAME}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
