"""``profkit cluster start|stop|psql`` and ``profkit load``: throwaway clusters by hand."""
from __future__ import annotations

import os
import sys

import click

from profkit.cli.common import err_console, friendly, say


@click.group("cluster")
def cluster() -> None:
    """Start, stop and connect to throwaway clusters."""


@cluster.command("start")
@click.argument("build_name")
@click.option("--name", default=None, help="Cluster name (default: the build's name).")
@click.option("--port", type=int, default=None,
              help="Port number (default: a free one); with a private socket directory.")
@click.option("--tcp", is_flag=True, help="Also listen on 127.0.0.1.")
@friendly
def cluster_start(build_name: str, name: str | None, port: int | None, tcp: bool) -> None:
    """Start a throwaway cluster of BUILD_NAME (built if needed) that outlives this
    command; its socket and port are printed. Stop it with `profkit cluster stop`."""
    from profkit.pg.build import get_build
    from profkit.pg.cluster import start_detached

    b = get_build(build_name, progress=say)
    info = start_detached(b, name=name, port=port, tcp=tcp)
    click.echo(f"cluster {info.name} running: pid {info.pid}, socket {info.socket_dir}, "
               f"port {info.port}\n  psql: profkit cluster psql {info.name}")


@cluster.command("stop")
@click.argument("name")
@click.option("--keep", is_flag=True, help="Keep the data directory.")
@friendly
def cluster_stop(name: str, keep: bool) -> None:
    """Stop cluster NAME (started with `profkit cluster start`) and remove its data."""
    from profkit.pg.cluster import stop_detached

    stop_detached(name, remove=not keep)
    click.echo(f"cluster {name} stopped")


@cluster.command("psql", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("psql_args", nargs=-1, type=click.UNPROCESSED)
@friendly
def cluster_psql(name: str, psql_args: tuple[str, ...]) -> None:
    """Open the build's own psql on cluster NAME; PSQL_ARGS go to psql (after `--`)."""
    from profkit.pg.cluster import psql_command

    argv, env = psql_command(name, psql_args)
    sys.stdout.flush()
    os.execve(argv[0], argv, env)


@click.command("load")
@click.argument("workload")
@click.option("--cluster", "cluster_name", required=True, help="A cluster started with "
              "`profkit cluster start`.")
@click.option("--scale", type=float, default=1.0, show_default=True,
              help="Workload scale factor (table sizes; see the workload's description).")
@friendly
def load(workload: str, cluster_name: str, scale: float) -> None:
    """Load a seed workload (nested_loop, join_sum, count_star) into a running cluster."""
    from profkit.pg.cluster import connect_detached
    from profkit.pg.workloads import check_scale, get_workload

    wl = get_workload(workload)
    check_scale(scale)
    with err_console.status(f"loading {workload} at scale {scale}"):
        with connect_detached(cluster_name) as conn:
            wl.load(conn, scale)
    click.echo(f"{workload} loaded at scale {scale}: {wl.sizes(scale)}")
