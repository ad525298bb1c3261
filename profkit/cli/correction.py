"""CLI: ``profkit correction`` — TIMING ON corrected for the clock reads, against plain.

The work is :func:`profkit.experiments.correction.measure_correction` on a build
(``--build``, default vanilla): its session starts a throwaway cluster, loads the
workloads, measures and stops it; the run (csv, markdown, provenance.json) is written
under ``profiles/<run_id>/``. Notebooks can call it with a Cluster of their own.
"""
from __future__ import annotations

import click

from profkit.cli.common import friendly as _friendly
from profkit.cli.common import say as _progress
from profkit.cli.common import min_kept_option


def _fmt(v: float) -> str:
    return f"{v:.2f}"


def _parse_workloads(items: tuple[str, ...]) -> dict[str, float] | None:
    if not items:
        return None
    out: dict[str, float] = {}
    for it in items:
        name, sep, scale = it.partition("=")
        if not sep:
            raise click.BadParameter(f"{it!r}: use NAME=SCALE, e.g. join_sum=0.5")
        try:
            out[name.strip()] = float(scale)
        except ValueError:
            raise click.BadParameter(f"{it!r}: scale {scale!r} is not a number") from None
    return out


@click.command("correction")
@click.option("--workload", "workloads", multiple=True,
              help="NAME=SCALE (repeatable). Default: nested_loop=0.05 join_sum=0.5 "
                   "count_star=0.1.")
@click.option("--build", "build_name", default="vanilla", show_default=True,
              help="Build (preset) measured.")
@click.option("--reps", type=int, default=7, show_default=True,
              help="Interleaved repetitions per workload and mode.")
@click.option("--metric", type=click.Choice(["cpu_kept_ms", "cpu_ms", "server_ms", "client_ms"]),
              default="cpu_kept_ms", show_default=True,
              help="cpu_kept_ms: the backend's CPU time (robust to other processes' load), "
                   "the executions a slow vCPU disturbed left out (as profkit bench does); "
                   "cpu_ms: all of them.")
@min_kept_option("(workload, mode)")
@click.option("--top", type=int, default=4, show_default=True,
              help="Nodes per workload in the per-node table.")
@click.option("--out", default=None, help="Parent directory of the run (default profiles/).")
@_friendly
def correction_cmd(workloads: tuple[str, ...], build_name: str, reps: int, metric: str,
                   min_kept: int | str, top: int, out: str | None) -> None:
    """TIMING ON minus clock reads × cost per read, against the plain query's time."""
    from profkit.experiments.correction import measure_correction
    from profkit.pg.workloads import check_args, check_count
    from profkit.render.correction import COSTS_SHOW, NODES_SHOW, correction_shown

    wls = _parse_workloads(workloads)
    for name, sc in (wls or {}).items():
        check_args(name, scale=sc)
    check_args(reps=reps)
    check_count(top, "--top")
    res = measure_correction(build_name, workloads=wls, reps=reps, metric=metric, top=top,
                             base=out, progress=_progress, min_kept=min_kept)
    la0 = " ".join(f"{x:.2f}" for x in res.loadavg_before)
    la1 = " ".join(f"{x:.2f}" for x in res.loadavg_after)
    click.echo(f"metric {metric}; load average before {la0}, after {la1}")
    click.echo(res.vcpu_note)
    if res.extra_note:
        click.echo(res.extra_note)
    click.echo(correction_shown(res.summary).to_string(index=False, float_format=_fmt))
    click.echo("\ncosts:")
    click.echo(res.summary[COSTS_SHOW].to_string(index=False, float_format=_fmt))
    click.echo("\ntop nodes:")
    click.echo(res.nodes[NODES_SHOW].to_string(index=False, float_format=_fmt))
    click.echo(f"written to {res.run_dir}")
