"""CLI: ``profkit clock-cost``, ``profkit clock-calls``, ``profkit probe``.

Standalone click objects (``clock_cost_cmd``, ``clock_calls_cmd``, ``probe_cmd``)
that :mod:`profkit.cli` attaches to the main group.  The work is done by the
plain functions :func:`clock_calls` and :func:`probe_nodes`, which notebooks
can call with a psycopg connection of their own.

Each command writes its raw artifacts and tables under ``profiles/<run_id>/``.
"""
from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
import pandas as pd

from profkit import paths
from profkit.cli_common import friendly as _friendly
from profkit.errors import ProbeError

F = TypeVar("F", bound=Callable[..., Any])
MODES = ("plain", "analyze_notiming", "analyze_timing")
EXPLAIN = {
    "plain": "",
    "analyze_notiming": "EXPLAIN (ANALYZE TRUE, TIMING FALSE, BUFFERS FALSE, FORMAT JSON) ",
    "analyze_timing": "EXPLAIN (ANALYZE TRUE, TIMING TRUE, BUFFERS FALSE, FORMAT JSON) ",
}




def _run_dir(kind: str, out: str | None) -> tuple[str, Path]:
    run_id = f"{kind}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    d = Path(out) if out else paths.profiles_dir() / run_id
    d.mkdir(parents=True, exist_ok=True)
    return run_id, d


def _write(df: pd.DataFrame, path: Path) -> None:
    """Parquet, with object columns (dicts) JSON-encoded so pyarrow accepts them."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object and out[c].map(lambda v: isinstance(v, (dict, list))).any():
            out[c] = out[c].map(lambda v: json.dumps(v, default=str))
    out.to_parquet(path, index=False)


def _connect(cluster: str) -> Any:
    import psycopg

    from profkit.pg.cluster import DB_USER, detached_info

    info = detached_info(cluster)
    try:
        return psycopg.connect(host=info.socket_dir, port=info.port, user=DB_USER,
                               dbname="postgres", autocommit=True)
    except psycopg.OperationalError as e:
        raise ProbeError(f"cannot connect to cluster {cluster!r}: {e}") from None


def _select_sql(workload: str | None, sql: str | None) -> tuple[str, str]:
    if bool(workload) == bool(sql):
        raise ProbeError("give a workload name (join_sum, nested_loop, count_star) or --sql")
    if sql:
        return "sql", sql.strip().rstrip(";")
    from profkit.pg.workloads import get_workload

    assert workload is not None
    return workload, get_workload(workload).select_sql


def _baseline(conn: Any, select_sql: str) -> tuple[Any, float]:
    """EXPLAIN (ANALYZE, TIMING OFF) once: rows and loops for predictions, time for the guard."""
    plan = conn.execute(EXPLAIN["analyze_notiming"] + select_sql).fetchone()[0]
    return plan, float(plan[0].get("Execution Time") or 0.0)


# ---------------------------------------------------------------------------
# Library-level entry points (used by the commands and by notebooks)


def clock_calls(conn: Any, select_sql: str, *, modes: Sequence[str] = ("analyze_timing",),
                methods: Sequence[str] = ("ltrace", "bcc"), force: bool = False,
                out_dir: Path | None = None, run_id: str = "") -> pd.DataFrame:
    """clock_gettime calls per mode and method, beside the prediction.

    One row per (mode, method): measured, predicted (for that method's view:
    ltrace does not see calls from extension modules), and the difference.
    """
    from profkit.analyze import predict as P
    from profkit.collect import bpf
    from profkit.collect import ltrace as lt
    from profkit.parse.ltrace import parse_ltrace_summary

    bad = [m for m in modes if m not in MODES] + [m for m in methods
                                                 if m not in ("ltrace", "bcc", "bpftrace")]
    if bad:
        raise ProbeError(f"unknown modes/methods {bad}")
    plan, query_ms = _baseline(conn, select_sql)
    if out_dir is not None:
        (out_dir / "plan_notiming.json").write_text(json.dumps(plan, indent=1))
    rows = []
    for mode in modes:
        pr = P.predict(plan, P.context_from_conn(conn, mode))
        sql = EXPLAIN[mode] + select_sql
        hits = bpf.estimate_probe_hits(pr.nodes, ["clock_gettime"], per_node=False,
                                       constants=pr.totals["clock_reads"]
                                       - pr.totals["clock_reads_nodes"])
        for method in methods:
            d = (out_dir / mode / method) if out_dir is not None else None
            if method == "ltrace":
                bpf.guard(hits, query_ms, method="ltrace", force=force)
                run = lt.count_calls(conn, sql, out_dir=d)
                df = parse_ltrace_summary(run.summary_text, run_id=run_id)
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
        _write(out, out_dir / "clock_calls.parquet")
    return out


def probe_nodes(conn: Any, select_sql: str, *, mode: str = "analyze_timing",
                tool: str = "auto", force: bool = False, out_dir: Path | None = None,
                run_id: str = "", build: str = "", query: str = "") -> tuple[pd.DataFrame, Any]:
    """Per-node measured calls beside the prediction (``plan_nodes``) and the ProbeResult.

    The prediction uses the plan printed by the probed EXPLAIN itself, so rows
    and loops are those of the run that was measured.
    """
    from profkit.analyze import predict as P
    from profkit.collect import bpf

    if mode not in ("analyze_notiming", "analyze_timing"):
        raise ProbeError("per-node probing needs an EXPLAIN ANALYZE mode "
                         "(analyze_timing or analyze_notiming)")
    plan, query_ms = _baseline(conn, select_sql)
    pr0 = P.predict(plan, P.context_from_conn(conn, mode))
    fns = list(bpf.BINARY_FUNCTIONS) + list(bpf.LIBC_FUNCTIONS)
    bpf.guard(bpf.estimate_probe_hits(pr0.nodes, fns), query_ms, force=force)
    res = bpf.probe_query(conn, EXPLAIN[mode] + select_sql, tool=tool, out_dir=out_dir)
    probed_plan = res.query_result[0][0]
    pr = P.predict(probed_plan, P.context_from_conn(conn, mode))
    table = P.plan_nodes_table(pr, run_id=run_id, build=build, query=query or select_sql,
                               measured=res.nodes)
    if out_dir is not None:
        (out_dir / "plan.json").write_text(json.dumps(probed_plan, indent=1))
        _write(table, out_dir / "plan_nodes.parquet")
        _write(res.functions, out_dir / "functions.parquet")
    return table, res


# ---------------------------------------------------------------------------
# Commands


@click.command("clock-cost")
@click.option("--loops", type=int, default=10_000_000, show_default=True,
              help="Clock reads per source per repeat.")
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option("--sources", default=None,
              help="Comma-separated subset (default: monotonic, coarse, raw, TSC variants).")
@click.option("--build", "build_name", default=None,
              help="Also run this build's pg_test_timing (-d 1).")
@click.option("--out", default=None, help="Output directory (default profiles/<run_id>).")
@_friendly
def clock_cost_cmd(loops: int, repeats: int, sources: str | None, build_name: str | None,
                   out: str | None) -> None:
    """Measure ns per clock read (clock_gettime variants, RDTSC/RDTSCP) on this machine."""
    from profkit.collect import clock

    run_id, d = _run_dir("clock-cost", out)
    src = [s.strip() for s in sources.split(",")] if sources else None
    df = clock.measure_clocks(src, loops=loops, repeats=repeats, run_id=run_id)
    frames = [df]
    if build_name:
        from profkit.pg.build import get_build

        text = clock.run_pg_test_timing(get_build(build_name).bindir, 1)
        (d / "pg_test_timing.txt").write_text(text)
        frames.append(clock.pg_test_timing_cost(clock.parse_pg_test_timing(text), run_id))
    cost = clock.combine(frames)
    _write(cost, d / "clock_cost.parquet")
    _write(clock.histogram_long(cost), d / "clock_histogram.parquet")
    info = df.attrs["clock_info"]
    (d / "clock_info.json").write_text(json.dumps(info, indent=1))
    click.echo(f"clocksource {info['current_clocksource']} (available: "
               f"{' '.join(info['available_clocksources'])}); invariant TSC: "
               f"{'yes' if info['invariant_tsc'] else 'no'}; CPU {info['cpu_model']}")
    cols = ["source", "ns_per_call", "ns_per_call_min", "ns_per_call_max", "ns_per_loop"]
    click.echo(cost[cols].to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    if df.attrs.get("skipped"):
        click.echo(f"skipped (not available here): {', '.join(df.attrs['skipped'])}")
    click.echo(f"written to {d}")


@click.command("clock-calls")
@click.argument("workload", required=False)
@click.option("--cluster", "cluster_name", required=True,
              help="A cluster started with `profkit cluster start` (workload loaded).")
@click.option("--sql", default=None, help="A SELECT to use instead of a workload.")
@click.option("--mode", "modes", multiple=True, type=click.Choice(MODES),
              default=("analyze_timing",), show_default=True)
@click.option("--method", "methods", multiple=True,
              type=click.Choice(["ltrace", "bcc", "bpftrace"]), default=("ltrace", "bcc"),
              show_default=True)
@click.option("--force", is_flag=True, help="Probe even if the cost guard refuses.")
@click.option("--out", default=None)
@_friendly
def clock_calls_cmd(workload: str | None, cluster_name: str, sql: str | None,
                    modes: tuple[str, ...], methods: tuple[str, ...], force: bool,
                    out: str | None) -> None:
    """Count clock_gettime calls of a query (ltrace, bcc) beside the prediction."""
    name, select = _select_sql(workload, sql)
    run_id, d = _run_dir(f"clock-calls-{name}", out)
    with _connect(cluster_name) as conn:
        df = clock_calls(conn, select, modes=modes, methods=methods, force=force, out_dir=d,
                         run_id=run_id)
    click.echo(df.drop(columns=["run_id"]).to_string(index=False,
                                                      float_format=lambda v: f"{v:.1f}"))
    click.echo("ltrace cannot see calls from extension modules (pg_stat_statements: 2 per "
               "EXPLAIN); the predictions account for it.")
    click.echo(f"written to {d}")


@click.command("probe")
@click.argument("workload", required=False)
@click.option("--cluster", "cluster_name", required=True)
@click.option("--sql", default=None, help="A SELECT to use instead of a workload.")
@click.option("--mode", default="analyze_timing", show_default=True,
              type=click.Choice(["analyze_timing", "analyze_notiming"]))
@click.option("--tool", default="auto", show_default=True,
              type=click.Choice(["auto", "bcc", "bpftrace"]))
@click.option("--force", is_flag=True, help="Probe even if the cost guard refuses.")
@click.option("--out", default=None)
@_friendly
def probe_cmd(workload: str | None, cluster_name: str, sql: str | None, mode: str, tool: str,
              force: bool, out: str | None) -> None:
    """Per plan node: measured ExecProcNode calls and clock reads vs the prediction (eBPF)."""
    name, select = _select_sql(workload, sql)
    run_id, d = _run_dir(f"probe-{name}", out)
    with _connect(cluster_name) as conn:
        table, res = probe_nodes(conn, select, mode=mode, tool=tool, force=force, out_dir=d,
                                 run_id=run_id, query=name)
    if res.fallback_reason:
        click.echo(res.fallback_reason, err=True)
    cols = ["node_id", "node_type", "parent_id", "rows", "loops", "exec_calls_predicted",
            "exec_calls_measured", "clock_calls_predicted", "clock_calls_measured", "exact"]
    click.echo(table[[c for c in cols if c in table]].to_string(index=False))
    click.echo(res.functions[["function", "calls"]].to_string(index=False))
    click.echo(f"clock reads outside any node: {res.outside_clock_reads}; tool {res.tool}; "
               f"probed query {res.query_ms:.1f} ms")
    click.echo(f"written to {d}")
