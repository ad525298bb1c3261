"""``profkit nodetime``: time per plan node from on-CPU samples, by call stack (no clock
reads in the backend): a front door onto :mod:`profkit.experiments.nodetime`."""
from __future__ import annotations

from typing import Any

import click

from profkit.cli.common import Failed, emit_json, json_option
from profkit.cli.common import friendly as _friendly


@click.command("nodetime")
@click.argument("build", required=False)
@click.option("--cluster", "cluster_name", default=None,
              help="A cluster started with `profkit cluster start` (workload loaded).")
@click.option("--dsn", default=None,
              help="A server profkit did not start: the query runs on this connection and "
                   "its backend is sampled (nothing on the server is changed).")
@click.option("--pid", type=int, default=None,
              help="A backend running a query you did not start: its text from "
                   "pg_stat_activity, its plan from EXPLAIN in another session; sampled "
                   "for --seconds.")
@click.option("--seconds", type=float, default=10.0, show_default=True,
              help="With --pid: how long to sample.")
@click.option("--sql", default=None, help="A SELECT to use instead of a workload.")
@click.option("--workload", default=None, metavar="NAME|FILE.toml",
              help="A seed workload (nested_loop, join_sum, count_star) or a workload file.")
@click.option("--query", default=None, help="One of the workload file's named queries.")
@click.option("--scale", type=float, default=0.05, show_default=True,
              help="With BUILD: the workload's scale factor.")
@click.option("--analyze", is_flag=True,
              help="Also show EXPLAIN ANALYZE's rows and loops (one more, separate run).")
@click.option("--method", type=click.Choice(["stacks", "marker"]), default="stacks",
              show_default=True,
              help="stacks: each sample's call stack names its node (any build). marker: "
                   "the node a node_marker build publishes, read by bcc (exact; no "
                   "flamegraph; BUILD, --cluster or --dsn of such a build).")
@click.option("--with-stacks", "with_stacks", is_flag=True,
              help="With --method marker: record call stacks (perf) during the same "
                   "executions and show the stack method's table of them too.")
@click.option("--freq", type=int, default=999, show_default=True, help="Samples per second.")
@click.option("--min-samples", type=int, default=None,
              help="Run the query until about this many samples (default: profkit's "
                   "minimum for a share, 100, x10).")
@click.option("--reps", type=int, default=None,
              help="Run the query exactly this many times (instead of --min-samples).")
@click.option("--against", default=None, metavar="BUILD",
              help="With BUILD: run the same on this build first; --flamegraph is then the "
                   "differential (red: dearer in BUILD).")
@click.option("--flamegraph", "flamegraph_path", default=None, metavar="OUT.svg",
              help="Write the node-rooted flamegraph here.")
@click.option("--out", default=None, help="Run directory, new or empty "
              "(default profiles/<run_id>).")
@json_option
@_friendly
def nodetime_cmd(build: str | None, cluster_name: str | None, dsn: str | None,
                 pid: int | None, seconds: float, sql: str | None, workload: str | None,
                 query: str | None, scale: float, analyze: bool, method: str,
                 with_stacks: bool, freq: int,
                 min_samples: int | None, reps: int | None, against: str | None,
                 flamegraph_path: str | None, out: str | None, as_json: bool) -> None:
    """Time per plan node from perf samples by call stack (~1 % overhead, no clock reads).

    Give BUILD (a throwaway cluster of that build, workload loaded), --cluster NAME,
    --dsn DSN, or --pid PID."""
    from profkit.experiments.nodetime import (
        nodetime_build,
        nodetime_diff,
        nodetime_pid,
        nodetime_target,
        workload_name,
    )

    targets = sum(x is not None for x in (build, cluster_name, dsn, pid))
    if pid is not None and (build or workload or sql or query or against):
        raise Failed("--pid samples what the backend runs for --seconds: give it alone "
                     "(--cluster/--dsn only name the server for the side session)")
    if pid is None and targets != 1:
        raise Failed("give one of BUILD (vanilla, step3…), --cluster NAME, --dsn DSN or "
                     "--pid PID")
    if pid is None and bool(workload) == bool(sql):
        raise Failed("give the query: --workload NAME|FILE.toml (with --query) or --sql")
    if against and not build:
        raise Failed("--against BUILD compares two builds: give BUILD too")
    if against and not flamegraph_path:
        raise Failed("--against draws a differential flamegraph: give --flamegraph OUT.svg")
    if method == "marker" and (pid is not None or flamegraph_path or against or analyze):
        raise Failed("--method marker runs the query itself on a node_marker server and "
                     "draws no flamegraph: drop --pid, --flamegraph, --against and "
                     "--analyze (its table has rows and loops already)")
    if with_stacks and method != "marker":
        raise Failed("--with-stacks records call stacks beside the node marker: add "
                     "--method marker (the stack method records them anyway)")
    if seconds <= 0 or freq <= 0:
        raise Failed("--seconds and --freq must be > 0")
    spec = workload_name(workload, query) if workload else None
    kw: dict[str, Any] = {"freq": freq, "out": out, "progress": _err}
    if pid is not None:
        res = nodetime_pid(pid, seconds=seconds, cluster=cluster_name, dsn=dsn,
                           flamegraph=flamegraph_path, **kw)
    else:
        kw.update(analyze=analyze, reps=reps, method=method)
        if with_stacks:
            kw["stacks"] = True
        if min_samples is not None:
            kw["min_samples"] = min_samples
        elif reps is None:
            kw["min_samples"] = 1000
        if build:
            before = None
            if against:
                before = nodetime_build(against, spec, sql=sql, scale=scale,
                                        **{**kw, "out": None})
            res = nodetime_build(build, spec, sql=sql, scale=scale,
                                 flamegraph=None if against else flamegraph_path, **kw)
            if before is not None:
                res.flamegraph = nodetime_diff(before, res, flamegraph_path,  # type: ignore[arg-type]
                                               title=f"{against} → {build}: time per plan node")
        else:
            res = nodetime_target(cluster=cluster_name, dsn=dsn, workload=spec, sql=sql,
                                  flamegraph=flamegraph_path, **kw)
    for w in res.warnings:
        click.echo(w, err=True)
    if as_json:
        emit_json(res.doc())
    else:
        click.echo(res.console())


def _err(message: str) -> None:
    click.echo(message, err=True)
