"""``profkit perf``, ``profkit gprof``, ``profkit callgrind``, ``profkit py-spy``: record,
flamegraph, summary.

Each records into ``profiles/<run_id>/`` (raw artifacts + provenance + parquet tables)
through its collector, renders a flamegraph into ``flamegraphs/`` where the tool gives
stacks (:mod:`profkit.experiments.profile`), and prints a short summary.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from profkit.cli.common import Failed as _Failed
from profkit.cli.common import friendly as _friendly
from profkit.cli.common import say as _say
from profkit.errors import StdoutFailed
from profkit.modes import EXPLAIN_PREFIX

MODES = tuple(EXPLAIN_PREFIX)
F = TypeVar("F", bound=Callable[..., Any])


def _workload_options(f: F) -> F:
    """``--workload`` and ``--query``, as every profiling command takes them."""
    f = click.option("--query", default=None, help="One of the workload file's named "
                     "queries (default: its first).")(f)
    return click.option("--workload", default="nested_loop", show_default=True,
                        help="Seed workload (nested_loop, join_sum, count_star) or a "
                             "workload FILE.toml.")(f)


def _mode_option(default: str) -> Callable[[F], F]:
    """``--mode``, defaulting to *default*."""
    return click.option("--mode", type=click.Choice(MODES), default=default,
                        show_default=True, help="How the query runs: plain SELECT or "
                        "EXPLAIN ANALYZE (TIMING off/on).")


@click.command("perf")
@click.argument("builds", nargs=-1, metavar="[BUILD [BUILD_B]]")
@click.option("--pid", type=int, default=None,
              help="Record this backend of a server profkit did not start, for --seconds.")
@click.option("--dsn", default=None,
              help="Connect here (a server profkit did not start), run the query on that "
                   "connection and record its backend.")
@click.option("--sql", default=None, help="With --dsn: the SELECT to run (else the workload's "
              "query, on the database as it is).")
@click.option("--seconds", type=float, default=10.0, show_default=True,
              help="With --pid: how long to record.")
@_workload_options
@click.option("--scale", type=float, default=0.05, show_default=True,
              help="Workload scale factor.")
@_mode_option("analyze_timing")
@click.option("--freq", type=int, default=999, show_default=True, help="Samples per second.")
@click.option("--dwarf", is_flag=True, help="--call-graph dwarf instead of frame pointers.")
@click.option("--reps", type=int, default=1, show_default=True,
              help="Run the query this many times while recording (with two builds: in "
                   "each recording).")
@click.option("--recordings", type=int, default=None, metavar="N",
              help="With two builds: recordings per build, interleaved, each on a fresh "
                   "cluster and backend (default 4).")
@click.option("--no-align", is_flag=True,
              help="With two builds: keep the executor's wrapper frames inside stacks "
                   "(default: dropped so plan nodes line up).")
@click.option("--seed", type=int, default=None,
              help="With two builds: the seed of the recording order (default: random).")
@click.option("--no-stat", is_flag=True, help="Skip perf stat.")
@click.option("--top", "top_n", type=int, default=10, show_default=True,
              help="Functions printed (by self share).")
@click.option("--out", default=None, help="Flamegraph directory (default: flamegraphs/).")
@_friendly
def perf_cmd(builds: tuple[str, ...], pid: int | None, dsn: str | None, sql: str | None,
             seconds: float, workload: str, query: str | None, scale: float, mode: str,
             freq: int, dwarf: bool, reps: int, recordings: int | None, no_align: bool,
             seed: int | None, no_stat: bool, top_n: int, out: str | None) -> None:
    """Record a backend running a workload's query with perf; flamegraph + top functions.

    BUILD: a profkit build (its own throwaway cluster); or --pid / --dsn: a backend of a
    server profkit did not start (nothing on it is changed).

    BUILD BUILD_B: a differential from repeated recordings (--recordings N per build,
    interleaved, each on its own cluster and backend), compared in time per execution: a
    frame is coloured only where the bootstrap interval of its change excludes 0
    (red dearer in BUILD_B, blue cheaper, grey otherwise). The same build twice is an
    A/A check."""
    from profkit.experiments.attach import perf_attached_run
    from profkit.experiments.profile import perf_diff_run, perf_run
    from profkit.pg.workloads import workload_spec

    call_graph = "dwarf" if dwarf else "fp"
    if len(builds) > 2:
        raise _Failed(f"{len(builds)} builds: give one BUILD, or two (BUILD BUILD_B) for a "
                      "differential")
    two = len(builds) == 2
    if not two and (recordings is not None or no_align or seed is not None):
        raise _Failed("--recordings, --no-align and --seed go with two builds (BUILD BUILD_B)")
    if two:
        if pid is not None or dsn is not None:
            raise _Failed("a differential records builds profkit starts: give two builds, "
                          "not --pid/--dsn")
        if dwarf:
            raise _Failed("a differential records frame-pointer call graphs: drop --dwarf")
        res = perf_diff_run(builds[0], builds[1], workload_spec(workload, query),
                            scale=scale, mode=mode, recordings=recordings, executions=reps,
                            freq=freq, align=not no_align, order_seed=seed, out=out,
                            progress=_say)
        click.echo(res.console(top=top_n))
        return
    build = builds[0] if builds else None
    if pid is not None or dsn is not None:
        if build:
            raise _Failed("give BUILD (a cluster profkit starts) or --pid/--dsn, not both")
        run = perf_attached_run(pid=pid, dsn=dsn, sql=sql, workload=workload, query=query,
                                mode=mode, seconds=seconds, reps=reps, freq=freq,
                                call_graph=call_graph, stat=not no_stat, top=top_n, out=out,
                                progress=_say)
    elif not build:
        raise _Failed("give BUILD (vanilla, step3, your named build…) or --pid PID / --dsn DSN")
    else:
        run = perf_run(build, workload_spec(workload, query), scale=scale, mode=mode,
                       reps=reps, freq=freq, call_graph=call_graph, stat=not no_stat,
                       top=top_n, out=out, progress=_say)
    for w in run.warnings:
        click.echo(w, err=True)
    click.echo(run.console())


# --------------------------------------------------------------------------- gprof

@click.command("gprof")
@click.argument("build")
@_workload_options
@click.option("--scale", type=float, default=0.05, show_default=True,
              help="Workload scale factor.")
@_mode_option("analyze_notiming")
@click.option("--reps", type=int, default=1, show_default=True,
              help="Executions of the query in the profiled backend.")
@click.option("--top", "top_n", type=int, default=15, show_default=True,
              help="Functions printed (by self time).")
@_friendly
def gprof_cmd(build: str, workload: str, query: str | None, scale: float, mode: str, reps: int,
              top_n: int) -> None:
    """Run a query in one backend of a -pg build (BUILD vanilla → gprof, step3 →
    step3+gprof); print gprof's flat profile top and the instrumentation call counts
    next to what the plan predicts."""
    from profkit.experiments.profile import gprof_run
    from profkit.pg.workloads import workload_spec

    click.echo(gprof_run(build, workload_spec(workload, query), scale=scale, mode=mode,
                         reps=reps, top=top_n, progress=_say).console())


# --------------------------------------------------------------------------- callgrind

@click.command("callgrind")
@click.argument("build")
@_workload_options
@click.option("--scale", type=float, default=0.01, show_default=True,
              help="Workload scale factor (callgrind runs the query some 50 times slower).")
@_mode_option("analyze_notiming")
@click.option("--top", "top_n", type=click.IntRange(min=1), default=15, show_default=True,
              help="Functions printed (by self instructions).")
@_friendly
def callgrind_cmd(build: str, workload: str, query: str | None, scale: float, mode: str,
                  top_n: int) -> None:
    """Count one execution of a query under callgrind in a single-user backend of BUILD
    (any build: no -pg twin needed): its instructions, the top functions by self
    instructions, the instrumentation functions' exact calls next to what the plan
    predicts, and their callers (calls per caller). The raw profile is kept for
    callgrind_annotate, kcachegrind and `profkit parse callgrind`."""
    from profkit.experiments.profile import callgrind_run
    from profkit.pg.workloads import workload_spec

    click.echo(callgrind_run(build, workload_spec(workload, query), scale=scale, mode=mode,
                             top=top_n, progress=_say).console())


# --------------------------------------------------------------------------- py-spy

@click.command("py-spy", context_settings={"ignore_unknown_options": True})
@click.option("--pid", type=int, default=None, help="Python process to sample.")
@click.option("--duration", type=float, default=10.0, show_default=True,
              help="Seconds to sample a --pid.")
@click.option("--rate", type=int, default=100, show_default=True,
              help="Samples per second.")
@click.option("--native", is_flag=True, help="Include C frames (--native).")
@click.option("--idle", is_flag=True, help="Keep idle samples.")
@click.option("--label", default=None, help="Name of the run and flamegraph.")
@click.option("--out", default=None, help="Flamegraph directory (default: flamegraphs/).")
@click.option("--top", "top_n", type=int, default=10, show_default=True,
              help="Functions printed (by self share).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@_friendly
def pyspy_cmd(pid: int | None, duration: float, rate: int, native: bool, idle: bool,
              label: str | None, out: str | None, top_n: int, command: tuple[str, ...]) -> None:
    """Sample a Python process (--pid PID) or command (-- python script.py) with py-spy;
    flamegraph + top functions."""
    from profkit.experiments.profile import pyspy_run

    if (pid is None) == (not command):
        raise _Failed("give either --pid PID or a command after --")
    click.echo(pyspy_run(pid=pid, command=command, duration=duration, rate=rate,
                         native=native, idle=idle, label=label, top=top_n, out=out).console())


# --------------------------------------------------------------------------- record-script

@click.command("record-script")
@click.option("-o", "--output", default=None, metavar="FILE",
              help="Write the script here (mode 0755; into FILE/pk-record.sh when FILE is a "
                   "folder) instead of standard output.")
@_friendly
def record_script_cmd(output: str | None) -> None:
    """Write pk-record.sh, the capture script for a server without profkit (plain sh and
    perf): copy it there, record a backend or one query, bring the tarball back to
    `profkit import`. Its usage: `sh pk-record.sh --help`."""
    import os
    import sys

    from profkit.paths import RECORD_SCRIPT

    data = RECORD_SCRIPT.read_bytes()
    if output is None:
        out = sys.stdout.buffer
        try:
            out.write(data)
            out.flush()
        except OSError as e:
            raise StdoutFailed(e) from None
        return
    dest = Path(output)
    if dest.is_dir():
        dest = dest / RECORD_SCRIPT.name
    if not dest.parent.is_dir():
        raise OSError(2, "No such file or directory (create the folder first)", str(dest.parent))
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        tmp.chmod(0o755)
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)
    click.echo(str(dest))
    _say(f"copy it to the server and run it there, e.g. `sh {dest.name} --query-file q.sql "
         f"--repeat 20 -- 'dbname=…'`; then `profkit import` the .tar.gz it writes")


# --------------------------------------------------------------------------- import

@click.command("import")
@click.argument("tarball", type=click.Path(dir_okay=False))
@click.option("--out", default=None, help="Profiles folder (default: profiles/).")
@click.option("--flamegraphs", default=None, help="Flamegraph directory (default: flamegraphs/).")
@click.option("--top", "top_n", type=int, default=10, show_default=True,
              help="Functions printed (by self share).")
@_friendly
def import_cmd(tarball: str, out: str | None, flamegraphs: str | None, top_n: int) -> None:
    """Turn a pk-record.sh capture (a .tar.gz; the script: `profkit record-script`) into a
    perf run: tables, folded stacks, flamegraph and provenance under profiles/, like a run
    profkit recorded."""
    from profkit.experiments.profile import import_run

    run = import_run(tarball, base=out, flamegraphs=flamegraphs, top=top_n, progress=_say)
    for w in run.warnings:
        click.echo(w, err=True)
    click.echo(run.console())
