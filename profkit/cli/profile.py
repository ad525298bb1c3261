"""``profkit perf``, ``profkit gprof``, ``profkit py-spy``: record, flamegraph, summary.

Each records into ``profiles/<run_id>/`` (raw artifacts + provenance + parquet tables)
through its collector, renders a flamegraph into ``flamegraphs/`` where the tool gives
stacks (:mod:`profkit.experiments.profile`), and prints a short summary.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from profkit.cli.common import Failed as _Failed
from profkit.cli.common import friendly as _friendly
from profkit.cli.common import say as _say
from profkit.pg.modes import EXPLAIN_PREFIX

MODES = tuple(EXPLAIN_PREFIX)


def _fmt_table(df: Any) -> str:
    return df.to_string(index=False) if len(df) else "(no rows)"


# --------------------------------------------------------------------------- perf


def _shortfall(prof: Any, *, freq_flag: str, repeat_flag: str | None,
               here: bool = True) -> bool:
    """Say (on stderr, before the tables) when *prof* has too few samples for its shares
    to mean something, and how to get more; True when it did. *here*: recorded on this
    machine (its perf_event_max_sample_rate bounds the -F suggested)."""
    from profkit.collect.perf import max_sample_rate, sample_shortfall

    short = sample_shortfall(prof)
    if short is None:
        return False
    click.echo("warning: " + short.message(freq_flag=freq_flag, repeat_flag=repeat_flag,
                                           max_freq=max_sample_rate() if here else None),
               err=True)
    return True


def _echo_top(prof: Any, top_n: int) -> None:
    """The profile's top functions by self samples, shares as percentages."""
    top = prof.top(top_n)[["function", "self", "self_share", "total_share"]]
    click.echo(f"top {top_n} functions by self samples:")
    click.echo(_fmt_table(top.assign(self_share=top["self_share"].map("{:.1%}".format),
                                     total_share=top["total_share"].map("{:.1%}".format))))

@click.command("perf")
@click.argument("build", required=False)
@click.option("--pid", type=int, default=None,
              help="Record this backend of a server profkit did not start, for --seconds.")
@click.option("--dsn", default=None,
              help="Connect here (a server profkit did not start), run the query on that "
                   "connection and record its backend.")
@click.option("--sql", default=None, help="With --dsn: the SELECT to run (else the workload's "
              "query, on the database as it is).")
@click.option("--seconds", type=float, default=10.0, show_default=True,
              help="With --pid: how long to record.")
@click.option("--workload", default="nested_loop", show_default=True,
              help="Seed workload (nested_loop, join_sum, count_star) or a workload FILE.toml.")
@click.option("--query", default=None, help="One of the workload file's named queries "
              "(default: its first).")
@click.option("--scale", type=float, default=0.05, show_default=True,
              help="Workload scale factor.")
@click.option("--mode", type=click.Choice(MODES), default="analyze_timing", show_default=True,
              help="How the query runs: plain SELECT or EXPLAIN ANALYZE (TIMING off/on).")
@click.option("--freq", type=int, default=999, show_default=True, help="Samples per second.")
@click.option("--dwarf", is_flag=True, help="--call-graph dwarf instead of frame pointers.")
@click.option("--reps", type=int, default=1, show_default=True,
              help="Run the query this many times while recording.")
@click.option("--no-stat", is_flag=True, help="Skip perf stat.")
@click.option("--top", "top_n", type=int, default=10, show_default=True,
              help="Functions printed (by self share).")
@click.option("--out", default=None, help="Flamegraph directory (default: flamegraphs/).")
@_friendly
def perf_cmd(build: str | None, pid: int | None, dsn: str | None, sql: str | None,
             seconds: float, workload: str, query: str | None, scale: float, mode: str,
             freq: int, dwarf: bool, reps: int, no_stat: bool, top_n: int,
             out: str | None) -> None:
    """Record a backend running a workload's query with perf; flamegraph + top functions.

    BUILD: a profkit build (its own throwaway cluster); or --pid / --dsn: a backend of a
    server profkit did not start (nothing on it is changed)."""
    from profkit.experiments.profile import perf_profile
    from profkit.experiments.profile import flamegraph_dir, flamegraph_for
    from profkit.pg.workloads import workload_label, workload_spec

    if pid is not None or dsn is not None:
        if build:
            raise _Failed("give BUILD (a cluster profkit starts) or --pid/--dsn, not both")
        _perf_attached(pid, dsn, sql, seconds, workload, query, mode, freq, dwarf, reps,
                       no_stat, top_n, out)
        return
    if not build:
        raise _Failed("give BUILD (vanilla, step3, your named build…) or --pid PID / --dsn DSN")
    workload = workload_spec(workload, query)
    label = workload_label(workload)

    prof = perf_profile(build, workload, scale=scale, mode=mode, reps=reps, freq=freq,
                            call_graph="dwarf" if dwarf else "fp", stat=not no_stat,
                            progress=_say, fix_flags=None)
    qname = prof.run.provenance.get("query_name") or mode
    svg = flamegraph_for(prof.counts, prof.run,
                         flamegraph_dir(out) / f"perf-{build}-{label}-{mode}.svg",
                         title=f"{build}: {label} {qname} (perf)")
    click.echo(f"run {prof.run.run_id}: {prof.folding.samples} samples "
               f"({', '.join(prof.folding.events)})")
    short = _shortfall(prof, freq_flag="--freq", repeat_flag="--reps")
    _echo_top(prof, top_n)
    if short:
        # one percentage is what gets quoted: not off a handful of samples
        click.echo(f"instrumentation share (self): withheld ({prof.folding.samples} samples)")
    else:
        click.echo(f"instrumentation share (self): {prof.instrumentation_share:.1%}")
    if prof.stat is not None and len(prof.stat):
        st = prof.stat[prof.stat["supported"]][["event", "value", "unit"]]
        click.echo("perf stat: " + ", ".join(f"{r.event}={r.value:g}{r.unit and ' ' + r.unit}"
                                             for r in st.itertuples()))
    click.echo(f"artifacts: {prof.run.path}")
    click.echo(f"flamegraph: {svg}")


def _perf_attached(pid: int | None, dsn: str | None, sql: str | None, seconds: float,
                   workload: str, query: str | None, mode: str, freq: int, dwarf: bool,
                   reps: int, no_stat: bool, top_n: int, out: str | None) -> None:
    from profkit.experiments.attach import perf_attached
    from profkit.experiments.profile import flamegraph_dir, flamegraph_for
    from profkit.pg.workloads import get_workload, workload_spec

    spec = None
    if dsn is not None and not sql:
        spec = workload_spec(workload, query)
        sql = get_workload(spec).select_sql
    full = EXPLAIN_PREFIX[mode] + sql.strip().rstrip(";") if sql else None
    prof, rep = perf_attached(pid=pid, dsn=dsn, sql=full, seconds=seconds, reps=reps,
                              freq=freq, call_graph="dwarf" if dwarf else "fp",
                              stat=not no_stat, workload=spec, mode=mode if dsn else None,
                              progress=_say)
    target = f"pid{prof.run.get('target.pid')}"
    svg = flamegraph_for(prof.counts, prof.run,
                         flamegraph_dir(out) / f"perf-{target}-{prof.run.run_id}.svg",
                         title=f"{rep.version or 'PostgreSQL'}: backend "
                               f"{prof.run.get('target.pid')} (perf)")
    click.echo(f"binary: {rep.describe()}")
    click.echo(f"run {prof.run.run_id}: {prof.folding.samples} samples")
    _shortfall(prof, freq_flag="--freq",
               repeat_flag="--reps" if dsn is not None else "--dsn DSN --reps N")
    _echo_top(prof, top_n)
    click.echo(f"artifacts: {prof.run.path}")
    click.echo(f"flamegraph: {svg}")


# --------------------------------------------------------------------------- gprof

@click.command("gprof")
@click.argument("build")
@click.option("--workload", default="nested_loop", show_default=True,
              help="Seed workload (nested_loop, join_sum, count_star) or a workload FILE.toml.")
@click.option("--query", default=None, help="One of the workload file's named queries "
              "(default: its first).")
@click.option("--scale", type=float, default=0.05, show_default=True,
              help="Workload scale factor.")
@click.option("--mode", type=click.Choice(MODES), default="analyze_notiming",
              show_default=True,
              help="How the query runs: plain SELECT or EXPLAIN ANALYZE (TIMING off/on).")
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
    from profkit.experiments.profile import gprof_profile_with_prediction
    from profkit.experiments.profile import instrumentation_calls

    from profkit.pg.workloads import workload_spec

    workload = workload_spec(workload, query)
    res, pred = gprof_profile_with_prediction(build, workload, scale=scale, mode=mode,
                                                 reps=reps, progress=_say)
    click.echo(f"run {res.run.run_id}: gprof of backend {res.run.get('backend_pid')}")
    click.echo(f"flat profile, top {top_n}:")
    click.echo(_fmt_table(res.top(top_n)))
    table, notes = instrumentation_calls(res, pred, reps)
    click.echo("instrumentation calls (predicted from the plan's rows and loops):")
    click.echo(_fmt_table(table))
    for n in notes:
        click.echo(f"note: {n}")
    click.echo(f"artifacts: {res.run.path}")


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
    from profkit.collect import pyspy
    from profkit.experiments.profile import flamegraph_dir, flamegraph_for

    if (pid is None) == (not command):
        raise _Failed("give either --pid PID or a command after --")
    if pid is not None:
        rec, _ = pyspy.record_pid(pid, duration=duration, rate=rate, native=native, idle=idle,
                                  label=label)
    else:
        rec = pyspy.record_command(list(command), rate=rate, native=native, idle=idle,
                                   label=label)
    prof = pyspy.fold_run(rec.run_dir)
    name = label or (f"pid{pid}" if pid is not None else Path(command[-1]).stem)
    svg = flamegraph_for(prof.counts, prof.run, flamegraph_dir(out) / f"py-spy-{name}.svg",
                         title=f"py-spy: {name}")
    click.echo(f"run {prof.run.run_id}: {rec.samples} samples")
    click.echo(_fmt_table(prof.top(top_n)))
    click.echo(f"artifacts: {prof.run.path}")
    click.echo(f"flamegraph: {svg}")




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
            from profkit.cli.common import StdoutFailed

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
    from profkit.experiments.profile import import_capture

    prof, svg = import_capture(tarball, base=out, flamegraphs=flamegraphs, progress=_say)
    cap = prof.run.provenance.get("capture", {})
    click.echo(f"run {prof.run.run_id}: {prof.folding.samples} samples of pid "
               f"{cap.get('pid')} on {cap.get('hostname')} ({cap.get('postgres_version')}, "
               f"clocksource {cap.get('clocksource')})")
    if cap.get("what") == "query":
        n = int(cap.get("repeat") or 1)
        ms = [float(t) for t in str(cap.get("query_ms") or "").split()]
        took = f" in {sum(ms):.1f} ms (psql's timing)" if ms else ""
        click.echo(f"query: ran {n} time{'s' if n != 1 else ''} in one session{took}, "
                   f"recorded at {cap.get('freq')} Hz")
    _shortfall(prof, freq_flag="-F", repeat_flag=(
        "pk-record.sh --repeat" if cap.get("what") == "query"
        else "pk-record.sh --query-file FILE --repeat N"), here=False)
    _echo_top(prof, top_n)
    click.echo(f"artifacts: {prof.run.path}")
    click.echo(f"flamegraph: {svg}")
