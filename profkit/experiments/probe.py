"""The probe experiments: clock reads per query (ltrace, bcc) and per plan node (eBPF),
each beside the plan's prediction; and the cost of one clock read per source.

:func:`clock_calls` and :func:`probe_nodes` take a psycopg connection, so notebooks
call them on a cluster of their own; :func:`clock_cost` needs no cluster. The
``profkit clock-cost|clock-calls|probe`` commands are thin front doors onto these.
Each writes its raw artifacts and tables under ``profiles/<run_id>/``.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import psycopg

from profkit import rundir
from profkit.analyze import predict
from profkit.collect import bpf, clock, ltrace
from profkit.errors import ProbeError
from profkit.modes import MODES, explain_prefix
from profkit.parse.ltrace import parse_ltrace_summary
from profkit.pg.build import get_build
from profkit.pg.workloads import get_workload, workload_spec

EXPLAIN = {m: explain_prefix(m, "json") for m in MODES}


def write_parquet(df: pd.DataFrame, path: Path) -> None:
    """Parquet, with object columns (dicts) JSON-encoded so pyarrow accepts them."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object and out[c].map(lambda v: isinstance(v, (dict, list))).any():
            out[c] = out[c].map(lambda v: json.dumps(v, default=str))
    out.to_parquet(path, index=False)


def select_sql(workload: str | None, sql: str | None,
               query: str | None = None) -> tuple[str, str]:
    if bool(workload) == bool(sql):
        raise ProbeError("give a workload name (join_sum, nested_loop, count_star), a workload "
                         "FILE.toml, or --sql")
    if sql:
        if query:
            raise ProbeError("--query picks a query of a workload file: give --workload too, "
                             "or --sql alone")
        return "sql", sql.strip().rstrip(";")
    assert workload is not None
    spec = workload_spec(workload, query)
    return spec, get_workload(spec).select_sql


def _sql_failed(e: Exception, sql: str) -> ProbeError:
    diag = getattr(e, "diag", None)
    primary = getattr(diag, "message_primary", None) or str(e).strip().splitlines()[0]
    short = " ".join(sql.split())
    short = short if len(short) <= 100 else short[:97] + "..."
    return ProbeError(f"the query failed: {primary} (SQL: {short}); check it with "
                      f"`profkit cluster psql NAME`")


def check_query(conn: Any, select_sql: str) -> None:
    """Plan *select_sql* (EXPLAIN, not run) so a typo or a missing table is one clear
    error before anything is probed or written."""
    try:
        conn.execute("EXPLAIN " + select_sql).fetchall()
    except psycopg.Error as e:
        raise _sql_failed(e, select_sql) from None


def _baseline(conn: Any, select_sql: str) -> tuple[Any, float]:
    """EXPLAIN (ANALYZE, TIMING OFF) once: rows and loops for predictions, time for the guard."""
    try:
        plan = conn.execute(EXPLAIN["analyze_notiming"] + select_sql).fetchone()[0]
    except psycopg.Error as e:
        raise _sql_failed(e, select_sql) from None
    return plan, float(plan[0].get("Execution Time") or 0.0)


def clock_calls(conn: Any, select_sql: str, *, modes: Sequence[str] = ("analyze_timing",),
                methods: Sequence[str] = ("ltrace", "bcc"), force: bool = False,
                out_dir: Path | None = None, run_id: str = "") -> pd.DataFrame:
    """clock_gettime calls per mode and method, beside the prediction.

    One row per (mode, method): measured, predicted (for that method's view:
    ltrace does not see calls from extension modules), and the difference.
    """
    bad = [m for m in modes if m not in MODES] + [m for m in methods
                                                 if m not in ("ltrace", "bcc", "bpftrace")]
    if bad:
        raise ProbeError(f"unknown modes/methods {bad}")
    plan, query_ms = _baseline(conn, select_sql)
    if out_dir is not None:
        (out_dir / "plan_notiming.json").write_text(json.dumps(plan, indent=1))
    rows = []
    for mode in modes:
        pr = predict.predict(plan, predict.context_from_conn(conn, mode))
        sql = EXPLAIN[mode] + select_sql
        hits = bpf.estimate_probe_hits(pr.nodes, ["clock_gettime"], per_node=False,
                                       constants=pr.totals["clock_reads"]
                                       - pr.totals["clock_reads_nodes"])
        for method in methods:
            d = (out_dir / mode / method) if out_dir is not None else None
            if method == "ltrace":
                bpf.guard(hits, query_ms, method="ltrace", force=force)
                df, run = ltrace_counts(conn, sql, out_dir=d, run_id=run_id)
                got = df.set_index("function")["calls"].get("clock_gettime", 0)
                measured, predicted, ms = int(got), pr.totals["clock_reads_ltrace"], run.query_ms
            else:
                bpf.guard(hits, query_ms, force=force)
                res = bpf.probe_query(conn, sql, tool=method, functions=["clock_gettime"],
                                      per_node=False, out_dir=d)
                measured, predicted, ms = (res.calls("clock_gettime") or 0,
                                           pr.totals["clock_reads"], res.query_ms)
            rows.append({"run_id": run_id, "mode": mode, "method": method,
                         "measured": measured, "predicted": predicted,
                         "difference": measured - predicted, "exact": pr.totals["exact"],
                         # 2 per row returned through ExecProcNode, and everything else
                         # (per-loop NULL calls, shutdown, EXPLAIN, pgss): see predict.py
                         "predicted_row_reads": pr.totals["rows_term"],
                         "predicted_other_reads": predicted - pr.totals["rows_term"],
                         "probed_query_ms": ms, "unprobed_query_ms": query_ms})
    out = pd.DataFrame(rows)
    if out_dir is not None:
        write_parquet(out, out_dir / "clock_calls.parquet")
    return out


def ltrace_counts(conn: Any, sql: str | None, *, out_dir: Path | None = None,
                  functions: Sequence[str] = ("clock_gettime",), build: str = "",
                  run_id: str = "", **attach: Any) -> tuple[pd.DataFrame, Any]:
    """ltrace's count of *functions* while *conn* runs *sql* (or, with ``pid=`` and
    ``runner=``, while the runner waits): (the summary as a table, the ltrace run)."""
    run = ltrace.count_calls(conn, sql, functions=tuple(functions), out_dir=out_dir, **attach)
    return parse_ltrace_summary(run.summary_text, build=build, run_id=run_id), run


def probe_statement(conn: Any, sql: str, *, out_dir: Path | None = None) -> Any:
    """Instrumentation calls per function and per plan node (eBPF) while *conn* runs
    *sql*, as it is (no cost guard, no prediction): a notebook cell's bpf collector."""
    return bpf.probe_query(conn, sql, out_dir=out_dir)


def probe_nodes(conn: Any, select_sql: str, *, mode: str = "analyze_timing",
                tool: str = "auto", force: bool = False, out_dir: Path | None = None,
                run_id: str = "", build: str = "", query: str = "") -> tuple[pd.DataFrame, Any]:
    """Per-node measured calls beside the prediction (``plan_nodes``) and the ProbeResult.

    The prediction uses the plan printed by the probed EXPLAIN itself, so rows
    and loops are those of the run that was measured.
    """
    if mode not in ("analyze_notiming", "analyze_timing"):
        raise ProbeError("per-node probing needs an EXPLAIN ANALYZE mode "
                         "(analyze_timing or analyze_notiming)")
    plan, query_ms = _baseline(conn, select_sql)
    pr0 = predict.predict(plan, predict.context_from_conn(conn, mode))
    fns = list(bpf.BINARY_FUNCTIONS) + list(bpf.LIBC_FUNCTIONS)
    bpf.guard(bpf.estimate_probe_hits(pr0.nodes, fns), query_ms, force=force)
    res = bpf.probe_query(conn, EXPLAIN[mode] + select_sql, tool=tool, out_dir=out_dir)
    probed_plan = res.query_result[0][0]
    pr = predict.predict(probed_plan, predict.context_from_conn(conn, mode))
    table = predict.plan_nodes_table(pr, run_id=run_id, build=build, query=query or select_sql,
                               measured=res.nodes)
    if out_dir is not None:
        (out_dir / "plan.json").write_text(json.dumps(probed_plan, indent=1))
        write_parquet(table, out_dir / "plan_nodes.parquet")
        write_parquet(res.functions, out_dir / "functions.parquet")
    return table, res




def clock_cost(*, loops: int, repeats: int, sources: Sequence[str] | None = None,
               build_name: str | None = None, out: str | None = None
               ) -> tuple[pd.DataFrame, pd.DataFrame, Path]:
    """ns per clock read per source (+ the build's pg_test_timing), written to a run dir.

    Returns (cost, the raw measurement with its ``attrs``, the run directory).
    """
    with rundir.open_run("clock-cost", path=out, tools=("gcc",)) as rd:
        run_id, d = rd.run_id, rd.path
        df = clock.measure_clocks(list(sources) if sources else None, loops=loops,
                                  repeats=repeats, run_id=run_id)
        frames = [df]
        if build_name:
            text = clock.run_pg_test_timing(get_build(build_name).bindir, 1)
            (d / "pg_test_timing.txt").write_text(text)
            frames.append(clock.pg_test_timing_cost(clock.parse_pg_test_timing(text), run_id))
        cost = clock.combine(frames)
        write_parquet(cost, d / "clock_cost.parquet")
        write_parquet(clock.histogram_long(cost), d / "clock_histogram.parquet")
        (d / "clock_info.json").write_text(json.dumps(df.attrs["clock_info"], indent=1))
    return cost, df, d
