"""``profkit clock-cost``, ``profkit clock-calls``, ``profkit probe``: front doors onto
:mod:`profkit.experiments.probe`."""
from __future__ import annotations

from pathlib import Path

import click

from profkit.cli.common import Failed, emit_json, json_option
from profkit.cli.common import friendly as _friendly
from profkit.pg.modes import MODES



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
@click.option("--pid", type=int, default=None,
              help="Instead: count the clock reads of this running backend for --seconds "
                   "(whatever it runs; no query of ours, no prediction).")
@click.option("--seconds", type=float, default=10.0, show_default=True,
              help="With --pid: how long each method counts (stops early if it exits).")
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
                    pid: int | None, seconds: float, sql: str | None,
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

    if pid is not None:
        if cluster_name or dsn or workload or workload_opt or sql or query:
            raise Failed("--pid counts what the backend runs for --seconds: give it alone "
                         "(to run a query, use --dsn DSN with --sql or --workload)")
        _clock_calls_pid(pid, seconds, methods, out, as_json)
        return
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


def _clock_calls_pid(pid: int, seconds: float, methods: tuple[str, ...], out: str | None,
                     as_json: bool) -> None:
    """clock-calls --pid: each method counts the backend's clock_gettime calls for *seconds*
    (one window after the other: the counts describe different moments)."""
    import time

    import pandas as pd

    from profkit.collect import bpf
    from profkit.collect import ltrace as lt
    from profkit.experiments.attach import binary_report, check_backend
    from profkit.experiments.probe import new_run_dir, write_parquet
    from profkit.parse.ltrace import parse_ltrace_summary

    if seconds <= 0:
        raise Failed(f"--seconds must be > 0, got {seconds:g}")
    rep = binary_report(check_backend(pid))
    click.echo(f"binary: {rep.describe()}", err=True)
    run_id, d = new_run_dir("clock-calls", out, workload=f"pid {pid}", tools=("ltrace",),
                            target={"pid": pid, "binary": str(rep.path),
                                    "binary_level": rep.level, "seconds": seconds})

    def wait() -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and Path(f"/proc/{pid}").exists():
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))

    rows = []
    for method in methods:
        if method == "ltrace":
            click.echo("ltrace: each traced call costs ~100 µs in the backend while attached",
                       err=True)
            run = lt.count_calls(None, pid=pid, runner=wait, out_dir=d / "ltrace")
            df = parse_ltrace_summary(run.summary_text, run_id=run_id)
            calls = int(df.set_index("function")["calls"].get("clock_gettime", 0))
            ms = run.query_ms
        else:
            res = bpf.probe_query(None, pid=pid, runner=wait, functions=["clock_gettime"],
                                  per_node=False, tool=method, out_dir=d / method)
            calls, ms = res.calls("clock_gettime") or 0, res.query_ms
        rows.append({"run_id": run_id, "pid": pid, "method": method, "measured": calls,
                     "seconds": round(ms / 1000, 3), "per_second": calls / max(ms / 1000, 1e-9)})
    table = pd.DataFrame(rows)
    write_parquet(table, d / "clock_calls.parquet")
    if as_json:
        emit_json({"run_dir": str(d), "run_id": run_id, "pid": pid, "binary_level": rep.level,
                   "clock_calls": table.drop(columns=["run_id"])})
        return
    click.echo(table.drop(columns=["run_id"]).to_string(index=False,
                                                         float_format=lambda v: f"{v:.1f}"))
    click.echo(f"written to {d}")


@click.command("probe")
@click.argument("workload", required=False)
@click.option("--cluster", "cluster_name", default=None,
              help="A cluster started with `profkit cluster start` (workload loaded).")
@click.option("--dsn", default=None,
              help="Instead of --cluster: a server profkit did not start. EXPLAIN (ANALYZE, "
                   "FORMAT JSON) per node always; uprobe counts where the binary and root "
                   "allow. Nothing on the server is changed.")
@click.option("--pid", type=int, default=None,
              help="Instead: count Instr* and clock_gettime calls of this backend for "
                   "--seconds (no EXPLAIN: the backend runs what its client sends).")
@click.option("--seconds", type=float, default=10.0, show_default=True,
              help="With --pid: how long to count (stops early if the backend exits).")
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
def probe_cmd(workload: str | None, cluster_name: str | None, dsn: str | None,
              pid: int | None, seconds: float, sql: str | None,
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

    if sum(x is not None for x in (cluster_name, dsn, pid)) != 1:
        raise Failed("give one of --cluster NAME (a profkit cluster), --dsn DSN (any server) "
                     "or --pid PID (a running backend)")
    if cluster_name is None:
        _probe_attached(workload, workload_opt, sql, query, dsn, pid, seconds, mode, tool,
                        force, out, as_json)
        return
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


def _probe_attached(workload: str | None, workload_opt: str | None, sql: str | None,
                    query: str | None, dsn: str | None, pid: int | None, seconds: float,
                    mode: str, tool: str, force: bool, out: str | None,
                    as_json: bool) -> None:
    """probe --dsn / --pid (see :func:`profkit.experiments.attach.probe_attached`)."""
    from profkit.experiments.attach import _redact, check_backend, connect_dsn, probe_attached
    from profkit.experiments.probe import new_run_dir, select_sql, write_parquet

    if pid is not None:
        if workload or workload_opt or sql or query:
            raise Failed("--pid counts what the backend runs for --seconds; to run a query "
                         "use --dsn DSN with --sql or --workload")
        name, select = f"pid {pid}", None
    else:
        name, select = select_sql(_one_workload(workload, workload_opt), sql, query)
    def say(message: str) -> None:
        click.echo(message, err=True)

    # a DSN that does not connect or a pid that is no backend: one line, no run directory
    if dsn is not None:
        connect_dsn(dsn).close()
    else:
        assert pid is not None
        check_backend(pid)
    run_id, d = new_run_dir("probe", out, workload=name, sql=select, mode=mode,
                            tools=("bpftrace",),
                            target={"pid": pid, "dsn": _redact(dsn) if dsn else None})
    res = probe_attached(dsn=dsn, sql=select, pid=pid, seconds=seconds, mode=mode, tool=tool,
                         force=force, out_dir=d, run_id=run_id, query=name, progress=say)
    if len(res.nodes):
        write_parquet(res.nodes, d / "plan_nodes.parquet")
    write_parquet(res.functions, d / "functions.parquet")
    import json

    (d / "attached.json").write_text(json.dumps(
        {"pid": res.pid, "level": res.level, "allowed": res.allowed, "notes": res.notes,
         "tool": res.tool, "query_ms": res.query_ms, "plan": res.plan}, indent=1,
        default=str))
    cols = ["node_id", "node_type", "parent_id", "rows", "loops", "exec_calls_predicted",
            "exec_calls_measured", "clock_calls_predicted", "clock_calls_measured", "exact"]
    nodes = res.nodes[[c for c in cols if c in res.nodes]] if len(res.nodes) else res.nodes
    if as_json:
        emit_json({"run_dir": str(d), "run_id": run_id, "query": name, "sql": select,
                   "mode": res.mode, "pid": res.pid, "binary_level": res.level,
                   "allowed": res.allowed, "notes": res.notes, "tool": res.tool,
                   "query_ms": res.query_ms, "nodes": nodes, "functions": res.functions})
        return
    click.echo(f"backend {res.pid}: {res.allowed}")
    for n in res.notes:
        click.echo(f"note: {n}")
    if len(nodes):
        click.echo(nodes.to_string(index=False))
    click.echo(res.functions.to_string(index=False, na_rep="-"))
    click.echo(f"written to {d}")
