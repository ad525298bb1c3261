"""The ``profkit`` command line.  Library errors become one-line messages and exit code 2."""
from __future__ import annotations

import logging
import os
import sys

import click
from rich.console import Console

from profkit.cli_common import friendly
from profkit.cli_common import say as _say

console = Console(stderr=True)



@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log every external command.")
def main(verbose: bool) -> None:
    """profkit: profile PostgreSQL's executor instrumentation (EXPLAIN ANALYZE overhead)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(name)s: %(message)s")



@main.command()
@click.argument("presets", nargs=-1)
@click.option("--source", default=None,
              help="debian:postgresql-18 (default), debian:postgresql-19, git:/path, "
                   "tarball:/path.tar.bz2 (the patches of its major version are used)")
@click.option("--list", "list_", is_flag=True, help="List presets and cached builds.")
@friendly
def build(presets: tuple[str, ...], source: str | None, list_: bool) -> None:
    """Build PostgreSQL variants (cached; an unchanged build is never rebuilt).

    A preset prefixed pg19/ (pg19/vanilla, pg19/step5) is built from PostgreSQL 19:
    $PROFKIT_PG19_SOURCE if set (e.g. tarball:../shared/pg-sources/postgresql-19beta1.tar.bz2),
    else debian:postgresql-19 (Debian's experimental suite).  The prefix works wherever a
    build is named (bench --builds, cluster start, regress)."""
    from profkit.pg.build import get_build, list_builds
    from profkit.pg.build import presets as all_presets

    if list_ or not presets:
        for name, spec in all_presets().items():
            click.echo(f"{name:24s} {spec.description}")
        click.echo("\ncached builds:")
        for b in list_builds():
            click.echo(f"  {b.name:22s} {b.version:8s} {b.key[:12]} {b.dir}")
        return
    for p in presets:
        with console.status(f"building {p}"):
            b = get_build(p, source=source, progress=_say)
        click.echo(f"{b.name}\t{b.version}\t{b.prefix}")


@main.group()
def cluster() -> None:
    """Start, stop and connect to throwaway clusters."""


@cluster.command("start")
@click.argument("build_name")
@click.option("--name", default=None, help="Cluster name (default: the build's name).")
@click.option("--port", type=int, default=None)
@click.option("--tcp", is_flag=True, help="Also listen on 127.0.0.1.")
@friendly
def cluster_start(build_name: str, name: str | None, port: int | None, tcp: bool) -> None:
    from profkit.pg.build import get_build
    from profkit.pg.cluster import start_detached

    b = get_build(build_name, progress=_say)
    info = start_detached(b, name=name, port=port, tcp=tcp)
    click.echo(f"cluster {info.name} running: pid {info.pid}, socket {info.socket_dir}, "
               f"port {info.port}\n  psql: profkit cluster psql {info.name}")


@cluster.command("stop")
@click.argument("name")
@click.option("--keep", is_flag=True, help="Keep the data directory.")
@friendly
def cluster_stop(name: str, keep: bool) -> None:
    from profkit.pg.cluster import stop_detached

    stop_detached(name, remove=not keep)
    click.echo(f"cluster {name} stopped")


@cluster.command("psql", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("psql_args", nargs=-1, type=click.UNPROCESSED)
@friendly
def cluster_psql(name: str, psql_args: tuple[str, ...]) -> None:
    from profkit.pg.cluster import DB_USER, detached_info

    info = detached_info(name)
    psql = os.path.join(info.build_dir, "install", "bin", "psql")
    os.execv(psql, [psql, "-h", info.socket_dir, "-p", str(info.port), "-U", DB_USER,
                    "postgres", *psql_args])


@main.command()
@click.argument("workload")
@click.option("--cluster", "cluster_name", required=True, help="A cluster started with "
              "`profkit cluster start`.")
@click.option("--scale", type=float, default=1.0, show_default=True)
@friendly
def load(workload: str, cluster_name: str, scale: float) -> None:
    """Load a seed workload (nested_loop, join_sum, count_star) into a running cluster."""
    import psycopg

    from profkit.pg.cluster import DB_USER, detached_info
    from profkit.pg.workloads import check_scale, get_workload

    wl = get_workload(workload)
    check_scale(scale)
    info = detached_info(cluster_name)
    with console.status(f"loading {workload} at scale {scale}"):
        with psycopg.connect(host=info.socket_dir, port=info.port, user=DB_USER,
                             dbname="postgres", autocommit=True) as conn:
            wl.load(conn, scale)
    click.echo(f"{workload} loaded at scale {scale}: {wl.sizes(scale)}")


@main.command()
@click.argument("builds", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every preset of the patch library.")
@friendly
def regress(builds: tuple[str, ...], all_: bool) -> None:
    """Run PostgreSQL's regression suite (make check) on builds; print a result table."""
    from profkit.patches import PRESETS
    from profkit.pg.build import get_build
    from profkit.pg.regress import regress as run_regress

    names = list(PRESETS) if all_ else list(builds)
    if not names:
        raise click.UsageError("name builds or pass --all")
    failed = 0
    for n in names:
        b = get_build(n, progress=_say)
        with console.status(f"make check on {n}"):
            r = run_regress(b)
        failed += not r.passed
        status = "ok" if r.passed else "FAILED"
        click.echo(f"{n:16s} {status:7s} tests={r.tests:4d} failed={r.failed:3d} "
                   f"{r.seconds:6.0f} s  log={r.log}" + (f" diffs={r.diffs}" if r.diffs else ""))
    if failed:
        sys.exit(1)


def _attach_optional() -> None:
    """Attach command groups defined in other modules when present."""
    import importlib

    for mod, names in (("profkit.cli_parse", ("parse_group", "flamegraph_cmd")),
                       ("profkit.cli_probe", ("clock_cost_cmd", "clock_calls_cmd", "probe_cmd")),
                       ("profkit.cli_bench", ("bench_cmd", "reproduce_cmd")),
                       ("profkit.cli_observers", ("observers_cmd", "correction_cmd")),
                       ("profkit.cli_profile", ("perf_cmd", "gprof_cmd", "pyspy_cmd",
                                                "check_cmd")),
                       ("profkit.cli_variants", ("timing_accuracy_cmd",))):
        try:
            m = importlib.import_module(mod)
        except ImportError as e:
            if e.name != mod:
                raise
            continue
        for n in names:
            cmd = getattr(m, n, None)
            if cmd is not None:
                main.add_command(cmd)


_attach_optional()

if __name__ == "__main__":
    main()
