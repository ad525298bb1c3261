"""``profkit export RUN --format pprof|speedscope|collapsed [-o FILE]``.

A thin front door to :func:`profkit.export.export_run`: RUN is a run directory, a run
id under profiles/, ``latest``, or a folded-stacks file.
"""
from __future__ import annotations

import sys
from pathlib import Path

import click

from profkit.cli.common import Failed as _Failed
from profkit.errors import StdoutFailed
from profkit.cli.common import friendly as _friendly
from profkit.cli.common import say as _say

FORMATS = ("pprof", "speedscope", "collapsed")


@click.command("export")
@click.argument("runs", nargs=-1, required=True, metavar="RUN...")
@click.option("-f", "--format", "fmt", type=click.Choice(FORMATS), required=True,
              help="pprof: gzipped profile.proto (go tool pprof, Grafana Pyroscope, Parca); "
                   "speedscope: speedscope's JSON file format; collapsed: folded stacks "
                   "(FlameGraph's stackcollapse format).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write here instead of standard output.")
@click.option("--unit", default=None,
              help="What a stack's count is, for a folded file (samples, instructions, "
                   "period, nanoseconds...; a run says it itself). Default: samples.")
@click.option("--freq", type=float, default=None,
              help="Sampling frequency in Hz, for a folded file of perf samples: pprof then "
                   "adds CPU nanoseconds (samples x 1e9 / freq).")
@click.option("--binary", default=None,
              help="The profiled program's path: the module of frames whose module the "
                   "stacks do not name (a run says it itself).")
@_friendly
def export_cmd(runs: tuple[str, ...], fmt: str, output: str | None, unit: str | None, freq: float | None,
               binary: str | None) -> None:
    """Export a run's stacks (RUN: a run directory, a run id under profiles/, `latest`,
    or a folded-stacks file) in a format other tools read: pprof for Pyroscope, Parca and
    `go tool pprof`; speedscope; collapsed folded stacks. Several RUNs make one file:
    pprof samples labelled by build and mode, a speedscope profile per run."""
    from profkit.export import export_run
    from profkit.export.source import load_source

    if freq is not None and not (freq > 0 and freq < float("inf")):
        raise _Failed(f"--freq must be a positive number of samples per second, got {freq:g}")
    if output is None and fmt == "pprof" and sys.stdout.isatty():
        raise _Failed("a pprof file is binary: give -o FILE, or redirect standard output")
    srcs = [load_source(r).require_stacks() for r in runs]
    data = export_run(srcs, fmt, unit=unit, freq_hz=freq, binary=binary)
    if output:
        Path(output).write_bytes(data)
    else:
        try:
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except OSError as e:
            raise StdoutFailed(e) from None
    for src in srcs:
        total = sum(src.counts.values())
        _say(f"{fmt}: {len(src.counts):,} stacks, {total:,.0f} {unit or src.facts.unit} "
             f"from {src.origin}")
    if output:
        _say(f"wrote {output} ({len(data):,} bytes)")
