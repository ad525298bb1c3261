"""``profkit clock-cost``, ``profkit clock-calls``, ``profkit probe``: front doors onto
:mod:`profkit.experiments.probe`."""
from __future__ import annotations

import click

from profkit.cli.common import Failed, emit_json, json_option
from profkit.cli.common import friendly as _friendly
from profkit.pg.workloads import MODES



@click.command("clock-cost")
@click.option("--loops", type=int, default=10_000_000, show_default=True,
              help="Clock reads per source per repeat.")
@click.option("--repeats", type=int, default=3, show_default=True,
              help="Repeats per source (min, median and max are reported).")
@click.option("--sources", default=None,
              help="Comma-separated subset (default: monotonic, coarse, raw, TSC variants).")
@click.option("--build", "build_name", default=None,
              help="Also run this build's pg_test_timing (-d 1).")
@click.option("--out", default=None,
              help="Run directory, new or empty (default profiles/<run_id>).")
@json_option
@_friendly
def clock_cost_cmd(loops: int, repeats: int, sources: str | None, build_name: str | None,
                   out: str | None, as_json: bool) -> None:
    """Measure ns per clock read (clock_gettime variants, RDTSC/RDTSCP) on this machine."""
    from profkit.experiments.probe import clock_cost

    src = [s.strip() for s in sources.split(",")] if sources else None
    cost, df, d = clock_cost(loops=loops, repeats=repeats, sources=src, build_name=build_name,
                             out=out)
    info = df.attrs["clock_info"]
    cols = ["source", "ns_per_call", "ns_per_call_min", "ns_per_call_max", "ns_per_loop"]
    if as_json:
        emit_json({"run_dir": str(d), "clock_info": info, "cost": cost[cols],
                   "skipped": list(df.attrs.get("skipped") or [])})
        return
    click.echo(f"clocksource {info['current_clocksource']} (available: "
               f"{' '.join(info['available_clocksources'])}); invariant TSC: "
               f"{'yes' if info['invariant_tsc'] else 'no'}; CPU {info['cpu_model']}")
    click.echo(cost[cols].to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    if df.attrs.get("skipped"):
        click.echo(f"skipped (not available here): {', '.join(df.attrs['skipped'])}")
    click.echo(f"written to {d}")


def _one_workload(arg: str | None, opt: str | None) -> str | None:
    if arg and opt:
        raise Failed("give the workload once: as the argument or as --workload")
    return arg or opt


@click.command("clock-calls")
@click.argument("workload", required=False)
@click.option("--cluster", "cluster_name", default=None,
              help="A cluster started with `profkit cluster start` (workload loaded).")
@click.option("--dsn", default=None,
              help="Instead of --cluster: a server profkit did not start (nothing on it is "
                   "changed; the query runs on this connection, its backend is probed).")
@click.option("--sql", default=None, help="A SELECT to use instead of a workload.")
@click.option("--workload", "workload_opt", default=None, metavar="NAME|FILE.toml",
              help="The workload (instead of the WORKLOAD argument): a seed or a TOML file.")
@click.option("--query", default=None, help="One of the workload file's named queries.")
@click.option("--mode", "modes", multiple=True, type=click.Choice(MODES),
              default=("analyze_timing",), show_default=True,
              help="How the query runs (repeatable): plain SELECT or EXPLAIN ANALYZE.")
@click.option("--method", "methods", multiple=True,
              type=click.Choice(["ltrace", "bcc", "bpftrace"]), default=("ltrace", "bcc"),
              show_default=True, help="Tools that count the calls (repeatable).")
@click.option("--force", is_flag=True, help="Probe even if the cost guard refuses.")
@click.option("--out", default=None,
              help="Run directory, new or empty (default profiles/<run_id>).")
@json_option
@_friendly
def clock_calls_cmd(workload: str | None, cluster_name: str | None, dsn: str | None,
                    sql: str | None,
                    workload_opt: str | None, query: str | None,
                    modes: tuple[str, ...], methods: tuple[str, ...], force: bool,
                    out: str | None, as_json: bool) -> None:
    """Count clock_gettime calls of a query (ltrace, bcc) beside the prediction."""
    from profkit.experiments.probe import (
        check_query,
        clock_calls,
        connect,
        new_run_dir,
        select_sql,
    )

    name, select = select_sql(_one_workload(workload, workload_opt), sql, query)
    if (cluster_name is None) == (dsn is None):
        raise Failed("give --cluster NAME (a profkit cluster) or --dsn DSN (any server)")
    target: dict = {}
    if dsn is not None:
        from profkit.experiments.attach import binary_report, check_backend, connect_dsn

        conn = connect_dsn(dsn)
        pid = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        rep = binary_report(check_backend(pid))
        click.echo(f"binary: {rep.describe()}", err=True)
        target = {"target": {"pid": pid, "binary": str(rep.path), "binary_level": rep.level,
                             "binary_report": rep.describe(), "version": rep.version}}
    else:
        assert cluster_name is not None
        conn = connect(cluster_name)
    with conn:
        check_query(conn, select)
        run_id, d = new_run_dir("clock-calls", out, workload=name, sql=select,
                                tools=("ltrace", "bpftrace"), **target)
        df = clock_calls(conn, select, modes=modes, methods=methods, force=force, out_dir=d,
                         run_id=run_id)
    if as_json:
        emit_json({"run_dir": str(d), "run_id": run_id, "query": name, "sql": select,
                   "clock_calls": df.drop(columns=["run_id"])})
        return
    click.echo(df.drop(columns=["run_id"]).to_string(index=False,
                                                      float_format=lambda v: f"{v:.1f}"))
    click.echo("ltrace cannot see calls from extension modules (pg_stat_statements: 2 per "
               "EXPLAIN); the predictions account for it.")
    click.echo(f"written to {d}")


@click.command("probe")
@click.argument("workload", required=False)
@click.option("--cluster", "cluster_name", required=True,
              help="A cluster started with `profkit cluster start` (workload loaded).")
@click.option("--sql", default=None, help="A SELECT to use instead of a workload.")
@click.option("--workload", "workload_opt", default=None, metavar="NAME|FILE.toml",
              help="The workload (instead of the WORKLOAD argument): a seed or a TOML file.")
@click.option("--query", default=None, help="One of the workload file's named queries.")
@click.option("--mode", default="analyze_timing", show_default=True,
              type=click.Choice(["analyze_timing", "analyze_notiming"]),
              help="EXPLAIN ANALYZE with TIMING on or off.")
@click.option("--tool", default="auto", show_default=True,
              type=click.Choice(["auto", "bcc", "bpftrace"]),
              help="eBPF front end (auto: bcc, else bpftrace).")
@click.option("--force", is_flag=True, help="Probe even if the cost guard refuses.")
@click.option("--out", default=None,
              help="Run directory, new or empty (default profiles/<run_id>).")
@json_option
@_friendly
def probe_cmd(workload: str | None, cluster_name: str, sql: str | None,
              workload_opt: str | None, query: str | None, mode: str, tool: str,
              force: bool, out: str | None, as_json: bool) -> None:
    """Per plan node: measured ExecProcNode calls and clock reads vs the prediction (eBPF)."""
    from profkit.experiments.probe import (
        check_query,
        connect,
        new_run_dir,
        probe_nodes,
        select_sql,
    )

    name, select = select_sql(_one_workload(workload, workload_opt), sql, query)
    with connect(cluster_name) as conn:
        check_query(conn, select)
        run_id, d = new_run_dir("probe", out, workload=name, sql=select, mode=mode,
                                tools=("bpftrace",))
        table, res = probe_nodes(conn, select, mode=mode, tool=tool, force=force, out_dir=d,
                                 run_id=run_id, query=name)
    if res.fallback_reason:
        click.echo(res.fallback_reason, err=True)
    cols = ["node_id", "node_type", "parent_id", "rows", "loops", "exec_calls_predicted",
            "exec_calls_measured", "clock_calls_predicted", "clock_calls_measured", "exact"]
    if as_json:
        emit_json({"run_dir": str(d), "run_id": run_id, "query": name, "sql": select,
                   "mode": mode, "tool": res.tool, "query_ms": res.query_ms,
                   "outside_clock_reads": res.outside_clock_reads,
                   "fallback_reason": res.fallback_reason,
                   "nodes": table[[c for c in cols if c in table]],
                   "functions": res.functions[["function", "calls"]]})
        return
    click.echo(table[[c for c in cols if c in table]].to_string(index=False))
    click.echo(res.functions[["function", "calls"]].to_string(index=False))
    click.echo(f"clock reads outside any node: {res.outside_clock_reads}; tool {res.tool}; "
               f"probed query {res.query_ms:.1f} ms")
    click.echo(f"written to {d}")
