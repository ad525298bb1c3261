"""``profkit clock-cost``, ``profkit clock-calls``, ``profkit probe``: front doors onto
:mod:`profkit.experiments.probe`."""
from __future__ import annotations

from typing import Any

import click

from profkit.cli.common import Failed, emit_json, json_option
from profkit.cli.common import friendly as _friendly
from profkit.modes import MODES



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
    from profkit.experiments.probe import select_sql
    from profkit.experiments.probe_runs import clock_calls_pid_run, clock_calls_run

    if pid is not None:
        if cluster_name or dsn or workload or workload_opt or sql or query:
            raise Failed("--pid counts what the backend runs for --seconds: give it alone "
                         "(to run a query, use --dsn DSN with --sql or --workload)")
        if seconds <= 0:
            raise Failed(f"--seconds must be > 0, got {seconds:g}")
        run = clock_calls_pid_run(pid, seconds, methods, out, progress=_err)
    else:
        if (cluster_name is None) == (dsn is None):
            # the workload is checked first: its error is the more useful one
            select_sql(_one_workload(workload, workload_opt), sql, query)
            raise Failed("give --cluster NAME (a profkit cluster) or --dsn DSN (any server)")
        run = clock_calls_run(_one_workload(workload, workload_opt), sql, query,
                              cluster=cluster_name, dsn=dsn, modes=modes, methods=methods,
                              force=force, out=out, progress=_err)
    _show(run, as_json)


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
    from profkit.experiments.probe_runs import probe_run

    if sum(x is not None for x in (cluster_name, dsn, pid)) != 1:
        raise Failed("give one of --cluster NAME (a profkit cluster), --dsn DSN (any server) "
                     "or --pid PID (a running backend)")
    if pid is not None and (workload or workload_opt or sql or query):
        raise Failed("--pid counts what the backend runs for --seconds; to run a query "
                     "use --dsn DSN with --sql or --workload")
    run = probe_run(_one_workload(workload, workload_opt), sql, query, cluster=cluster_name,
                    dsn=dsn, pid=pid, seconds=seconds, mode=mode, tool=tool, force=force,
                    out=out, progress=_err)
    _show(run, as_json)


def _err(message: str) -> None:
    click.echo(message, err=True)


def _show(run: Any, as_json: bool) -> None:
    """A ProbeRun: its JSON document, or its text."""
    if as_json:
        emit_json(run.doc)
    else:
        click.echo(run.console())
